// Kernels for decode-sized batches against their CPU twins, and their speed against the
// general paths: the few-token MoE path (moe_decode.cu) against permute + grouped GEMV, and
// the few-row Linear (gemv.cu) against cuBLASLt, on Qwen3-30B-A3B shapes.
#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {
namespace {

struct PairCase {
  int64_t tokens;
  int experts, k;
  int64_t hidden, inter;
  int mode;  // 0 random, 1 every token on expert 3, 2 some ids outside [0, E) (expert parallelism)
};

// Routing of `c`: distinct experts per token (mode 1 puts expert 3 first), weights in [0.05, 1].
void RandomRouting(const PairCase& c, std::vector<int32_t>* ids, std::vector<float>* w) {
  ids->assign(c.tokens * c.k, 0);
  w->assign(c.tokens * c.k, 0.f);
  for (int64_t i = 0; i < c.tokens; ++i) {
    std::vector<int32_t> all(c.experts);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), Rng());
    if (c.mode == 1) std::swap(all[0], *std::find(all.begin(), all.end(), 3));
    for (int s = 0; s < c.k; ++s) {
      (*ids)[i * c.k + s] = all[s];
      (*w)[i * c.k + s] = std::uniform_real_distribution<float>(0.05f, 1.f)(Rng());
    }
    if (c.mode == 2) {  // another rank's experts: below and past this rank's range
      (*ids)[i * c.k] = -1;
      if (c.k > 2) (*ids)[i * c.k + 2] = c.experts + 5;
    }
  }
}

TEST_F(CudaKernelTest, MoeExpertsPairGemv) {
  const int64_t default_pairs = cuda::Tuning().moe_pair_gemv_max_pairs;
  cuda::Tuning().moe_pair_gemv_max_pairs = int64_t{1} << 40;
  for (PairCase c : {PairCase{1, 128, 8, 2048, 768, 0}, PairCase{2, 24, 8, 2048, 768, 0},
                     PairCase{4, 24, 8, 2048, 768, 1}, PairCase{1, 8, 2, 128, 64, 0}, PairCase{3, 16, 4, 136, 72, 0},
                     PairCase{1, 512, 10, 512, 128, 0}, PairCase{2, 24, 8, 2048, 768, 2},
                     PairCase{5, 8, 2, 256, 200, 1}, PairCase{1, 4, 1, 8, 8, 0}, PairCase{7, 16, 2, 1000, 1032, 2}}) {
    const int64_t t = c.tokens, h = c.hidden, inter = c.inter;
    auto x = RandomBf16(t * h);
    auto wgu = RandomBf16(int64_t{c.experts} * 2 * inter * h, 1.f / std::sqrt(float(h)));
    auto wd = RandomBf16(int64_t{c.experts} * h * inter, 1.f / std::sqrt(float(inter)));
    std::vector<int32_t> ids;
    std::vector<float> w;
    RandomRouting(c, &ids, &w);
    Tensor cx = HostF32(x, {t, h}), cgu = HostF32(wgu, {c.experts, 2 * inter, h}), cd = HostF32(wd, {c.experts, h, inter});
    Tensor cids = HostI32(ids, {t, c.k}), cw = HostF32(w, {t, c.k}), cout = Tensor::Empty(DType::kF32, {t, h});
    cpu::MoeExperts(cx, cids, cw, cgu, cd, cout);
    Tensor gx = Upload(gpu(), x, {t, h}, DType::kBF16);
    Tensor ggu = gpu().LoadWeight(cgu), gd = gpu().LoadWeight(cd);
    Tensor gids = UploadI32(gpu(), ids, {t, c.k}), gw = Upload(gpu(), w, {t, c.k}, DType::kF32);
    Tensor gout = gpu().Empty(DType::kBF16, {t, h});
    Poison(gpu(), gout);
    gpu().MoeExperts(gx, gids, gw, ggu, gd, gout);
    const double e = RelError(Download(gpu(), gout), std::vector<float>(cout.ptr<float>(), cout.ptr<float>() + t * h));
    const std::string shape = "T" + std::to_string(t) + " E" + std::to_string(c.experts) + " k" + std::to_string(c.k) +
                              " H" + std::to_string(h) + " I" + std::to_string(inter) +
                              (c.mode == 1 ? " one-expert" : c.mode == 2 ? " ep-foreign-ids" : "");
    Record("MoeExperts.pair_gemv", shape, e, kBf16Tol);
    EXPECT_LT(e, kBf16Tol) << shape;
  }
  cuda::Tuning().moe_pair_gemv_max_pairs = default_pairs;
}

// Qwen3-30B-A3B experts (E 128, k 8, H 2048, I 768) at decode batch sizes: the pair path
// against the permute + grouped GEMV path; bandwidth counts the distinct experts' weights.
TEST(CudaPerf, MoeDecodePairVsPermute) {
  Backend* gpu = Gpu();
  if (gpu == nullptr) GTEST_SKIP() << "no CUDA device";
  const int experts = 128, k = 8;
  const int64_t h = 2048, inter = 768;
  std::vector<float> block = RandomBf16(1 << 20, 0.02f);
  auto tiled = [&](int64_t n) {
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = block[(i * 7919) % block.size()];
    return v;
  };
  Tensor wgu = Upload(*gpu, tiled(experts * 2 * inter * h), {experts, 2 * inter, h}, DType::kBF16);
  Tensor wd = Upload(*gpu, tiled(experts * h * inter), {experts, h, inter}, DType::kBF16);
  cudaStream_t stream = dynamic_cast<cuda::CudaBackend&>(*gpu).stream();
  const cuda::KernelTuning defaults = cuda::Tuning();
  std::printf("moe decode path: tokens | distinct experts | pair us (TB/s) | permute+gemv us (TB/s)\n");
  for (int64_t t : {1, 2, 4, 8}) {
    std::vector<int32_t> ids;
    std::vector<float> w;
    RandomRouting({t, experts, k, h, inter, 0}, &ids, &w);
    const double distinct = static_cast<double>(std::set<int32_t>(ids.begin(), ids.end()).size());
    const double bytes = distinct * 3.0 * inter * h * 2.0;
    Tensor x = Upload(*gpu, RandomBf16(t * h), {t, h}, DType::kBF16);
    Tensor gids = UploadI32(*gpu, ids, {t, k}), gw = Upload(*gpu, w, {t, k}, DType::kF32);
    Tensor out = gpu->Empty(DType::kBF16, {t, h});
    auto run = [&] { gpu->MoeExperts(x, gids, gw, wgu, wd, out); };
    cuda::Tuning().moe_pair_gemv_max_pairs = int64_t{1} << 40;
    const double pair_us = TimeUs(stream, run, 50);
    cuda::Tuning().moe_pair_gemv_max_pairs = 0;
    const double gemv_us = TimeUs(stream, run, 50);
    std::printf("moe decode path: %6lld | %5.0f | %8.1f (%.2f) | %8.1f (%.2f)\n", static_cast<long long>(t), distinct,
                pair_us, bytes / (pair_us * 1e-6) / 1e12, gemv_us, bytes / (gemv_us * 1e-6) / 1e12);
    Record("Perf.moe_pair_us", "T" + std::to_string(t), pair_us, 0);
    Record("Perf.moe_permute_gemv_us", "T" + std::to_string(t), gemv_us, 0);
  }
  cuda::Tuning() = defaults;
}

// The first `cols` columns of a [rows, C] view (rows keep their stride).
TensorView FirstCols(const TensorView& v, int64_t cols) {
  TensorView r = v;
  r.shape = Shape{v.dim(0), cols};
  return r;
}

TEST_F(CudaKernelTest, LinearGemv) {
  const int default_rows = cuda::Tuning().linear_gemv_max_rows;
  cuda::Tuning().linear_gemv_max_rows = 8;
  struct Case {
    int64_t n, k;
    DType out;
    int64_t x_pad, out_pad;  // extra columns of x's / out's rows (strided views)
  };
  for (Case c : {Case{5120, 2048, DType::kBF16, 0, 0}, Case{128, 2048, DType::kF32, 0, 0},
                 Case{2048, 4096, DType::kBF16, 8, 3}, Case{72, 136, DType::kF32, 0, 0}, Case{3, 8, DType::kBF16, 16, 1},
                 Case{1001, 264, DType::kBF16, 0, 0}}) {
    for (int64_t m = 1; m <= 8; ++m) {
      const int64_t xw = c.k + c.x_pad, ow = c.n + c.out_pad;
      auto x = RandomBf16(m * xw), w = RandomBf16(c.n * c.k, 1.f / std::sqrt(float(c.k)));
      Tensor cx_full = HostF32(x, {m, xw}), cw = HostF32(w, {c.n, c.k});
      Tensor cout = Tensor::Empty(DType::kF32, {m, c.n});
      cpu::Linear(FirstCols(cx_full.view(), c.k), cw, cout);
      Tensor gx = Upload(gpu(), x, {m, xw}, DType::kBF16), gw = gpu().LoadWeight(cw);
      Tensor gout = gpu().Empty(c.out, {m, ow});
      Poison(gpu(), gout);
      gpu().Linear(FirstCols(gx.view(), c.k), gw, FirstCols(gout.view(), c.n));
      std::vector<float> got = Download(gpu(), gout), got_n;
      for (int64_t i = 0; i < m; ++i) got_n.insert(got_n.end(), got.begin() + i * ow, got.begin() + i * ow + c.n);
      const double e = RelError(got_n, std::vector<float>(cout.ptr<float>(), cout.ptr<float>() + m * c.n));
      const std::string shape = "M" + std::to_string(m) + " N" + std::to_string(c.n) + " K" + std::to_string(c.k) +
                                (c.out == DType::kF32 ? " f32-out" : "") + (c.x_pad || c.out_pad ? " strided" : "");
      Record("Linear.gemv", shape, e, kBf16Tol);
      EXPECT_LT(e, kBf16Tol) << shape;
    }
  }
  cuda::Tuning().linear_gemv_max_rows = default_rows;
}

// The projections of a Qwen3-30B-A3B decode step at 1-8 rows: GEMV against cuBLASLt.
TEST(CudaPerf, LinearGemvVsCublasLt) {
  Backend* gpu = Gpu();
  if (gpu == nullptr) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream = dynamic_cast<cuda::CudaBackend&>(*gpu).stream();
  const cuda::KernelTuning defaults = cuda::Tuning();
  struct Shape2 {
    const char* name;
    int64_t n, k;
    DType out;
  };
  std::printf("linear small batch: name | M | gemv us (TB/s) | cublasLt us (TB/s)\n");
  for (Shape2 sh : {Shape2{"qkv", 5120, 2048, DType::kBF16}, Shape2{"o_proj", 2048, 4096, DType::kBF16},
                    Shape2{"router", 128, 2048, DType::kF32}, Shape2{"lm_head", 151936, 2048, DType::kF32}}) {
    Tensor w = Upload(*gpu, RandomBf16(sh.n * sh.k, 0.02f), {sh.n, sh.k}, DType::kBF16);
    for (int64_t m : {1, 2, 4, 8}) {
      Tensor x = Upload(*gpu, RandomBf16(m * sh.k), {m, sh.k}, DType::kBF16);
      Tensor out = gpu->Empty(sh.out, {m, sh.n});
      auto run = [&] { gpu->Linear(x, w, out); };
      cuda::Tuning().linear_gemv_max_rows = 8;
      const double gemv_us = TimeUs(stream, run, 50);
      cuda::Tuning().linear_gemv_max_rows = 0;
      const double lt_us = TimeUs(stream, run, 50);
      const double bytes = 2.0 * sh.n * sh.k;
      std::printf("linear small batch: %-8s | %lld | %8.1f (%.2f) | %8.1f (%.2f)\n", sh.name, static_cast<long long>(m),
                  gemv_us, bytes / (gemv_us * 1e-6) / 1e12, lt_us, bytes / (lt_us * 1e-6) / 1e12);
      Record(std::string("Perf.linear_gemv_us.") + sh.name, "M" + std::to_string(m), gemv_us, 0);
      Record(std::string("Perf.linear_cublaslt_us.") + sh.name, "M" + std::to_string(m), lt_us, 0);
    }
  }
  cuda::Tuning() = defaults;
}

}  // namespace
}  // namespace corolla::cuda_test
