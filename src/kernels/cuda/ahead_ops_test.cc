// Backend::NormLinearAhead / LinearAhead / AwaitAhead on CUDA (gemv_ahead.cu): the op issued
// ahead of the kernel that completes its input (an Add on the main stream, as the MoE's folded
// down kernel completes qkv's sum and the attention writes o_proj's x in a decode step) and
// awaited after it, inside a captured graph, equals NormLinear / Linear run after the Add bit
// for bit (x and out: the same staged kernel's split and dots), over Qwen3-30B-A3B's qkv (2048 ->
// 5120) and o_proj (4096 -> 2048) and odd shapes, with 0, 1 and 3 of the split's warps reading
// their rows from global memory, on 4- and 8-warp CTAs, their copies at once or held until the
// await enters; each graph replayed three times on
// fresh inputs (the flags re-arm themselves), and once more captured as the bench captures
// (StreamGraph). Eagerly the op runs at its await (ops.h says why): the same bits again.
// Filter: --gtest_filter='*OpsAhead*'
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/graph_timer.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {
namespace {

struct AheadCase {
  bool norm;  // NormLinearAhead (else LinearAhead)
  int64_t n, k;
};

struct AheadConfig {
  int warps, global_warps;
  bool copy_at_await;
};

void CheckAhead(Backend& be, const AheadCase& c, const AheadConfig& config) {
  cuda::Tuning().ahead_global_warps = config.global_warps;
  cuda::Tuning().ahead_warps = config.warps;
  cuda::Tuning().ahead_copy_at_await = config.copy_at_await;
  const std::string shape = std::string(c.norm ? "NormLinear" : "Linear") + " N" + std::to_string(c.n) + " K" +
                            std::to_string(c.k) + " global warps " + std::to_string(config.global_warps) + " of " +
                            std::to_string(config.warps) + "-warp CTAs" +
                            (config.copy_at_await ? ", copies at the await" : "");
  std::vector<float> norm = RandomBf16(c.k, 0.5f);
  for (float& v : norm) v += 1.f;
  const Tensor gw = be.LoadWeight(HostF32(RandomBf16(c.n * c.k, 1.f / std::sqrt(float(c.k))), {c.n, c.k}));
  const Tensor gnorm = Upload(be, norm, {c.k}, DType::kBF16);
  // NormLinear's input is the sum (x its normed output); Linear's is x.
  Tensor gsum = be.Empty(DType::kBF16, {1, c.k}), gx = be.Empty(DType::kBF16, {1, c.k});
  Tensor gy = be.Empty(DType::kBF16, {1, c.k}), gout = be.Empty(DType::kBF16, {1, c.n});
  const Tensor& input = c.norm ? gsum : gx;
  Tensor saved = be.Empty(DType::kBF16, {1, c.k});  // the input before the step's Add
  auto fill = [&](const TensorView& t, float scale) {
    const std::vector<float> v = RandomBf16(t.numel(), scale);
    std::vector<bf16> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = ToBf16(v[i]);
    be.CopyFromHost(h.data(), t);
  };
  auto fresh = [&] {
    fill(input, 4.f);
    fill(gy, 1.f);
    be.Copy(input, saved);
    if (c.norm) Poison(be, gx);
    Poison(be, gout);
  };
  auto step = [&] {  // issue, complete the input, await
    if (c.norm) be.NormLinearAhead(gnorm, 1e-6f, gsum, gx, gw, gout);
    else be.LinearAhead(gx, gw, gout);
    be.Add(input, gy);
    be.AwaitAhead();
  };
  // The plain op from the same input and y, into fresh tensors.
  auto check = [&](const std::string& what) {
    Tensor in = be.Empty(DType::kBF16, {1, c.k}), x = be.Empty(DType::kBF16, {1, c.k});
    Tensor out = be.Empty(DType::kBF16, {1, c.n});
    be.Copy(saved, in);
    be.Add(in, gy);
    Poison(be, out);
    if (c.norm) {
      Poison(be, x);
      be.NormLinear(gnorm, 1e-6f, in, x, gw, out);
      EXPECT_EQ(Download(be, x), Download(be, gx)) << shape << " " << what;
    } else {
      be.Linear(in, gw, out);
    }
    EXPECT_EQ(Download(be, in), Download(be, input)) << shape << " " << what;
    EXPECT_EQ(Download(be, out), Download(be, gout)) << shape << " " << what;
  };
  fresh();
  const int64_t launches = cuda::AheadLaunches();
  step();  // eager: the op runs at the await
  EXPECT_EQ(cuda::AheadLaunches(), launches) << shape;
  check("eager");
  fresh();  // the capture's warm-up run (eager) reads it
  auto graph = be.CaptureGraph(step);
  ASSERT_TRUE(graph.ok()) << shape << ": " << graph.status().ToString();
  EXPECT_EQ(cuda::AheadLaunches(), launches + 1) << shape << ": the capture issued the op ahead";
  for (int rep = 0; rep < 3; ++rep) {
    fresh();
    (*graph)->Replay();
    check("replay " + std::to_string(rep));
  }
  // The bench's capture (StreamGraph) joins the side stream too.
  std::string error;
  std::unique_ptr<cuda::StreamGraph> bench_graph = cuda::StreamGraph::Capture(be, step, &error);
  ASSERT_NE(bench_graph, nullptr) << shape << ": " << error;
  fresh();
  bench_graph->Replay();
  check("bench graph");
}

TEST_F(CudaKernelTest, OpsAheadEqualThePlainOps) {
  struct Restore {
    ~Restore() { cuda::Tuning() = DefaultTuning(); }
  } restore;
  for (AheadConfig config : {AheadConfig{4, 1, false}, AheadConfig{4, 0, false}, AheadConfig{4, 3, false},
                             AheadConfig{8, 1, false}, AheadConfig{8, 0, false}, AheadConfig{8, 3, false},
                             AheadConfig{4, 1, true}, AheadConfig{8, 0, true}})
    for (AheadCase c : {AheadCase{true, 5120, 2048}, AheadCase{false, 2048, 4096}, AheadCase{true, 1000, 1024},
                        AheadCase{false, 1000, 1032}, AheadCase{true, 72, 136}, AheadCase{true, 3, 8},
                        AheadCase{false, 5, 8}})
      CheckAhead(gpu(), c, config);
}

// Liveness beside the attention: o_proj's op issued before a batch-1 decode attention whose
// splits merge as clusters (Qwen3-30B-A3B: 32 query and 4 KV heads of 128, 1024 keys), as the
// model issues it, and awaited after it. The ahead CTAs hold ~129 KB on 128 SMs until the
// attention completes, and the attention's clusters must find room beside them: at the least
// carveout they found none and the bench trapped (session 50, H100). Bit-equal to the
// attention and Linear run plainly, on 4- and 8-warp CTAs and with the copies held until the
// await enters (after the attention's passes), in graphs replayed three times.
TEST_F(CudaKernelTest, LinearAheadBesideTheClusterAttention) {
  struct Restore {
    ~Restore() { cuda::Tuning() = DefaultTuning(); }
  } restore;
  Backend& be = gpu();
  constexpr int kHk = 4, kHq = 32, kD = 128, kBs = 16, kLen = 1024, kBlocks = kLen / kBs, kN = 2048;
  std::vector<int32_t> table(kBlocks);
  for (int i = 0; i < kBlocks; ++i) table[i] = (i * 37) % kBlocks;  // scrambled physical blocks
  const Shape cshape{kBlocks, kHk, kBs, kD};
  const Tensor kc = Upload(be, RandomBf16(cshape.numel()), cshape, DType::kBF16);
  const Tensor vc = Upload(be, RandomBf16(cshape.numel()), cshape, DType::kBF16);
  const Tensor qstart = UploadI32(be, {0, 1}, {2}), lens = UploadI32(be, {kLen}, {1});
  const Tensor tables = UploadI32(be, table, {1, kBlocks});
  const Tensor slots = UploadI32(be, {table[kBlocks - 1] * kBs + kBs - 1}, {1});
  const AttentionBatch batch{qstart, lens, tables, slots, 1, kLen, 1};
  const KvCacheView cache{kc, vc};
  const float scale = 1.f / std::sqrt(float(kD));
  const Tensor w = be.LoadWeight(HostF32(RandomBf16(int64_t{kN} * kHq * kD, 1.f / 64.f), {kN, kHq * kD}));
  Tensor q = be.Empty(DType::kBF16, {1, kHq, kD}), attn = be.Empty(DType::kBF16, {1, kHq, kD});
  Tensor out = be.Empty(DType::kBF16, {1, kN});
  const Tensor x = attn.Reshaped({1, kHq * kD});
  auto step = [&] {  // as Qwen3Model issues o_proj
    be.LinearAhead(x, w, out);
    be.Attention(q, cache, batch, scale, attn);
    be.AwaitAhead();
  };
  for (const auto& [warps, copy_at_await] : {std::pair{4, false}, std::pair{8, false}, std::pair{4, true}}) {
    cuda::Tuning().ahead_warps = warps;
    cuda::Tuning().ahead_copy_at_await = copy_at_await;
    const std::string what = std::to_string(warps) + "-warp CTAs" + (copy_at_await ? ", copies at the await" : "");
    const Tensor q0 = Upload(be, RandomBf16(kHq * kD, 2.f), {1, kHq, kD}, DType::kBF16);
    be.Copy(q0, q);
    step();  // eager (the op at its await), as a capture's warm-up
    const int64_t launches = cuda::AheadLaunches(), clusters = cuda::AttentionDecodeClusterLaunches();
    auto graph = be.CaptureGraph(step);
    ASSERT_TRUE(graph.ok()) << what << ": " << graph.status().ToString();
    ASSERT_EQ(cuda::AheadLaunches(), launches + 1) << what << ": the capture issued the op ahead";
    ASSERT_GT(cuda::AttentionDecodeClusterLaunches(), clusters) << what << ": the attention ran as clusters";
    for (int rep = 0; rep < 3; ++rep) {
      const Tensor qr = Upload(be, RandomBf16(kHq * kD, 2.f), {1, kHq, kD}, DType::kBF16);
      be.Copy(qr, q);
      Poison(be, attn);
      Poison(be, out);
      (*graph)->Replay();
      Tensor plain_attn = be.Empty(DType::kBF16, {1, kHq, kD}), plain_out = be.Empty(DType::kBF16, {1, kN});
      Poison(be, plain_out);
      be.Attention(q, cache, batch, scale, plain_attn);
      be.Linear(plain_attn.Reshaped({1, kHq * kD}), w, plain_out);
      const std::string label = what + " replay " + std::to_string(rep);
      EXPECT_EQ(Download(be, attn), Download(be, plain_attn)) << label;
      EXPECT_EQ(Download(be, out), Download(be, plain_out)) << label;
    }
  }
}

}  // namespace
}  // namespace corolla::cuda_test
