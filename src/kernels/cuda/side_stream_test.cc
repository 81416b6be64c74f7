// Backend::RunOnSideStream / JoinSideStream on CUDA (DP-EP: the shared expert while the tokens
// are exchanged): a SwiGLU MLP on the side stream while the main stream runs other GEMMs equals
// the same ops run one after the other, bit for bit (same kernels, same inputs), eagerly and
// inside a captured graph replayed on fresh inputs; and the allocator keeps blocks freed between
// fork and join out of the other stream's hands. Run once more with COROLLA_CUDA_POISON_EMPTY=1:
// a block handed to the main stream while the side still reads it would then be overwritten
// with NaN by the poisoning memset (and the other way round).
// Filter: --gtest_filter='*SideStream*:*DeferredFrees*'
#include <cstring>

#include "kernels/cuda/allocator.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {
namespace {

struct MlpWeights {
  Tensor gate_up;  // [2I, H]
  Tensor down;     // [H, I]
};

MlpWeights RandomMlp(Backend& be, int64_t hidden, int64_t inter) {
  return {Upload(be, RandomBf16(2 * inter * hidden, 0.05f), {2 * inter, hidden}, DType::kBF16),
          Upload(be, RandomBf16(hidden * inter, 0.05f), {hidden, inter}, DType::kBF16)};
}

// out [T, H] = down(silu(gate) * up) of x [T, H]; its temporaries die when it returns (inside a
// side region: before the join).
void Mlp(Backend& be, const MlpWeights& w, const TensorView& x, const TensorView& out) {
  const int64_t tokens = x.dim(0), inter = w.down.dim(1);
  Tensor gate_up = be.Empty(DType::kBF16, {tokens, 2 * inter});
  Tensor h = be.Empty(DType::kBF16, {tokens, inter});
  be.Linear(x, w.gate_up, gate_up);
  be.SiluMul(gate_up, h);
  be.Linear(h, w.down, out);
}

// What the main stream does meanwhile: a few MLPs whose temporaries have the side's sizes (so a
// block the side still reads would be the first the main stream is handed), summed into out.
void MainWork(Backend& be, const std::vector<MlpWeights>& ws, const TensorView& x, const TensorView& out) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  Mlp(be, ws[0], x, out);
  for (size_t i = 1; i < ws.size(); ++i) {
    Tensor part = be.Empty(DType::kBF16, {tokens, hidden});
    Mlp(be, ws[i], x, part);
    be.Add(out, part);
  }
}

// main + shared, the shared MLP on the side stream (overlap) or after the main work.
void Block(Backend& be, const MlpWeights& shared_w, const std::vector<MlpWeights>& main_w, const TensorView& x,
           const TensorView& out, bool overlap) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  Tensor shared = be.Empty(DType::kBF16, {tokens, hidden});
  if (overlap) {
    be.RunOnSideStream([&] { Mlp(be, shared_w, x, shared); });
    MainWork(be, main_w, x, out);
    be.JoinSideStream();
  } else {
    MainWork(be, main_w, x, out);
    Mlp(be, shared_w, x, shared);
  }
  be.Add(out, shared);
}

size_t NumDiffering(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += std::memcmp(&a[i], &b[i], sizeof(float)) != 0;
  return n;
}

TEST_F(CudaKernelTest, SideStreamEqualsSequential) {
  Backend& be = gpu();
  const int64_t hidden = 1024, inter = 1536;
  const MlpWeights shared_w = RandomMlp(be, hidden, inter);
  std::vector<MlpWeights> main_w;
  for (int i = 0; i < 3; ++i) main_w.push_back(RandomMlp(be, hidden, inter));
  for (int64_t tokens : {1, 7, 64, 300}) {
    const Tensor x = Upload(be, RandomBf16(tokens * hidden), {tokens, hidden}, DType::kBF16);
    Tensor ref = be.Empty(DType::kBF16, {tokens, hidden}), got = be.Empty(DType::kBF16, {tokens, hidden});
    Poison(be, ref);
    Poison(be, got);
    Block(be, shared_w, main_w, x, ref, /*overlap=*/false);
    for (int rep = 0; rep < 5; ++rep) {  // several runs: the race, if any, is timing-dependent
      Block(be, shared_w, main_w, x, got, /*overlap=*/true);
      const std::vector<float> a = Download(be, got), b = Download(be, ref);
      const size_t differing = NumDiffering(a, b);
      EXPECT_EQ(differing, 0u) << "T " << tokens << " run " << rep << ": rel error " << RelError(a, b);
      if (rep == 0) Record("SideStream vs sequential", "T" + std::to_string(tokens), RelError(a, b), 0);
    }
  }
}

TEST_F(CudaKernelTest, SideStreamInsideAGraph) {
  Backend& be = gpu();
  const int64_t hidden = 1024, inter = 1536, tokens = 8;
  const MlpWeights shared_w = RandomMlp(be, hidden, inter);
  std::vector<MlpWeights> main_w;
  for (int i = 0; i < 2; ++i) main_w.push_back(RandomMlp(be, hidden, inter));
  Tensor x = be.Empty(DType::kBF16, {tokens, hidden});
  Tensor out = be.Empty(DType::kBF16, {tokens, hidden}), ref = be.Empty(DType::kBF16, {tokens, hidden});
  auto fill = [&](const TensorView& t) {
    const std::vector<float> v = RandomBf16(t.numel());
    std::vector<bf16> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = ToBf16(v[i]);
    be.CopyFromHost(h.data(), t);
  };
  fill(x);  // the capture's warm-up runs on it
  auto graph = be.CaptureGraph([&] { Block(be, shared_w, main_w, x, out, /*overlap=*/true); });
  ASSERT_TRUE(graph.ok()) << graph.status().ToString();
  for (int rep = 0; rep < 3; ++rep) {  // fresh inputs at the captured address
    fill(x);
    Poison(be, out);
    (*graph)->Replay();
    Block(be, shared_w, main_w, x, ref, /*overlap=*/false);
    const std::vector<float> a = Download(be, out), b = Download(be, ref);
    EXPECT_EQ(NumDiffering(a, b), 0u) << "replay " << rep << ": rel error " << RelError(a, b);
    if (rep == 0) Record("SideStream graph vs seq", "T8", RelError(a, b), 0);
  }
}

TEST(CudaAllocator, DeferredFreesAreNotReusedBeforeTheJoin) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) GTEST_SKIP() << "no CUDA device";
  cuda::CachingAllocator alloc(0);
  void* a = alloc.Allocate(1 << 20);
  alloc.DeferFrees(true);
  alloc.Free(a);
  void* b = alloc.Allocate(1 << 20);  // a is still held back
  EXPECT_NE(a, b);
  alloc.Free(b);
  alloc.DeferFrees(false);
  void* c = alloc.Allocate(1 << 20);  // now both are free again
  EXPECT_TRUE(c == a || c == b);
  void* d = alloc.Allocate(1 << 20);
  EXPECT_TRUE((d == a || d == b) && d != c);
  alloc.Free(c);
  alloc.Free(d);
}

}  // namespace
}  // namespace corolla::cuda_test
