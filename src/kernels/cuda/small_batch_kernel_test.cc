// Kernels for decode-sized batches against their CPU twins, and their speed against the
// general paths: the few-token MoE path (moe_decode.cu) against permute + grouped GEMV, and
// the few-row Linear (gemv.cu) against cuBLASLt, on Qwen3-30B-A3B shapes.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
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
  int mode;  // 0 random, 1 every token on expert 3, 2 some ids outside [0, E) (expert parallelism),
             // 3 every token among the first 2k experts (a prompt's rows crowding onto few experts)
};

// Routing of `c`: distinct experts per token (mode 1 puts expert 3 first), weights in [0.05, 1].
void RandomRouting(const PairCase& c, std::vector<int32_t>* ids, std::vector<float>* w) {
  ids->assign(c.tokens * c.k, 0);
  w->assign(c.tokens * c.k, 0.f);
  for (int64_t i = 0; i < c.tokens; ++i) {
    std::vector<int32_t> all(c.experts);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), c.mode == 3 ? all.begin() + std::min(c.experts, 2 * c.k) : all.end(), Rng());
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

// Every pair-kernel shape on each case (one CPU reference a case): down by slots (4 or 8 rows a
// CTA) or by rows, gate/up 2 or 4 outputs a warp, the former also with x in shared memory for one
// wave (Tuning().moe_pair_down_rows / moe_pair_gate_up_rows / moe_pair_gate_up_one_wave).
TEST_F(CudaKernelTest, MoeExpertsPairGemv) {
  const cuda::KernelTuning defaults = cuda::Tuning();
  struct Kernels { bool slots; int down_rows, gate_up_rows; bool one_wave; };
  const Kernels shapes[] = {{true, 8, 2, false}, {true, 4, 4, false}, {false, 8, 2, false}, {true, 8, 2, true}};
  for (PairCase c : {PairCase{1, 128, 8, 2048, 768, 0}, PairCase{2, 24, 8, 2048, 768, 0},
                     PairCase{4, 24, 8, 2048, 768, 1}, PairCase{1, 8, 2, 128, 64, 0}, PairCase{3, 16, 4, 136, 72, 0},
                     PairCase{1, 512, 10, 512, 128, 0}, PairCase{2, 24, 8, 2048, 768, 2},
                     PairCase{5, 8, 2, 256, 200, 1}, PairCase{1, 4, 1, 8, 8, 0}, PairCase{7, 16, 2, 1000, 1032, 2},
                     // 16 and 22 tokens on few experts (each expert read by many pairs)
                     PairCase{16, 24, 8, 2048, 768, 1}, PairCase{22, 40, 8, 1024, 768, 0},
                     // crowded (many pairs an expert); H 7168; foreign ids
                     PairCase{12, 32, 8, 2048, 768, 3}, PairCase{32, 16, 8, 256, 64, 3},
                     PairCase{3, 12, 4, 7168, 256, 3}, PairCase{9, 20, 6, 512, 136, 2}}) {
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
    const std::vector<float> want(cout.ptr<float>(), cout.ptr<float>() + t * h);
    Tensor gx = Upload(gpu(), x, {t, h}, DType::kBF16);
    Tensor ggu = gpu().LoadWeight(cgu), gd = gpu().LoadWeight(cd);
    Tensor gids = UploadI32(gpu(), ids, {t, c.k}), gw = Upload(gpu(), w, {t, c.k}, DType::kF32);
    Tensor gout = gpu().Empty(DType::kBF16, {t, h});
    for (const Kernels& sh : shapes) {
      Poison(gpu(), gout);
      cuda::Tuning().moe_pair_gemv_max_pairs = int64_t{1} << 40;
      cuda::Tuning().moe_pair_down_slots = sh.slots;
      cuda::Tuning().moe_pair_down_rows = sh.down_rows;
      cuda::Tuning().moe_pair_gate_up_rows = sh.gate_up_rows;
      cuda::Tuning().moe_pair_gate_up_one_wave = sh.one_wave;
      gpu().MoeExperts(gx, gids, gw, ggu, gd, gout);
      cuda::Tuning() = defaults;
      const double e = RelError(Download(gpu(), gout), want);
      const std::string shape =
          "T" + std::to_string(t) + " E" + std::to_string(c.experts) + " k" + std::to_string(c.k) + " H" +
          std::to_string(h) + " I" + std::to_string(inter) +
          (c.mode == 1   ? " one-expert"
           : c.mode == 2 ? " ep-foreign-ids"
           : c.mode == 3 ? " crowded"
                         : "") +
          (sh.slots ? " down-slots" + std::to_string(sh.down_rows) : " down-rows") + " gate-up" +
          std::to_string(sh.gate_up_rows) + (sh.one_wave ? " one-wave" : "");
      Record("MoeExperts.pair_gemv", shape, e, kBf16Tol);
      EXPECT_LT(e, kBf16Tol) << shape;
    }
  }
}

// Backend::MoeExpertsResidual: with Tuning().moe_residual_fold the pair path's down kernel adds
// its rows into sum; without it the default runs MoeExperts, then Add. Either way out within
// kBf16Tol of the CPU's MoeExperts and sum exactly bf16(sum + out) of the GPU's own out (RmsNorm's
// rounding of its residual add).
TEST_F(CudaKernelTest, MoeExpertsResidual) {
  const TuningRestore restore;
  for (PairCase c : {PairCase{1, 128, 8, 2048, 768, 0}, PairCase{3, 16, 4, 136, 72, 0}, PairCase{2, 24, 8, 2048, 768, 2}})
    for (bool fold : {true, false}) {
      const int64_t t = c.tokens, h = c.hidden, inter = c.inter;
      auto x = RandomBf16(t * h);
      auto wgu = RandomBf16(int64_t{c.experts} * 2 * inter * h, 1.f / std::sqrt(float(h)));
      auto wd = RandomBf16(int64_t{c.experts} * h * inter, 1.f / std::sqrt(float(inter)));
      const auto sum0 = RandomBf16(t * h, 4.f);
      std::vector<int32_t> ids;
      std::vector<float> w;
      RandomRouting(c, &ids, &w);
      Tensor cx = HostF32(x, {t, h}), cgu = HostF32(wgu, {c.experts, 2 * inter, h});
      Tensor cd = HostF32(wd, {c.experts, h, inter});
      Tensor cids = HostI32(ids, {t, c.k}), cw = HostF32(w, {t, c.k}), cout = Tensor::Empty(DType::kF32, {t, h});
      cpu::MoeExperts(cx, cids, cw, cgu, cd, cout);
      Tensor gx = Upload(gpu(), x, {t, h}, DType::kBF16), gsum = Upload(gpu(), sum0, {t, h}, DType::kBF16);
      Tensor ggu = gpu().LoadWeight(cgu), gd = gpu().LoadWeight(cd);
      Tensor gids = UploadI32(gpu(), ids, {t, c.k}), gw = Upload(gpu(), w, {t, c.k}, DType::kF32);
      Tensor gout = gpu().Empty(DType::kBF16, {t, h});
      Poison(gpu(), gout);
      cuda::Tuning().moe_residual_fold = fold;
      gpu().MoeExpertsResidual(gx, gids, gw, ggu, gd, gout, gsum);
      const std::vector<float> out = Download(gpu(), gout), sum = Download(gpu(), gsum);
      const std::string shape = "T" + std::to_string(t) + " E" + std::to_string(c.experts) + " k" +
                                std::to_string(c.k) + " H" + std::to_string(h) + (fold ? " folded" : " unfolded");
      const double e = RelError(out, std::vector<float>(cout.ptr<float>(), cout.ptr<float>() + t * h));
      Record("MoeExpertsResidual.out", shape, e, kBf16Tol);
      EXPECT_LT(e, kBf16Tol) << shape;
      int64_t wrong = 0;
      for (int64_t i = 0; i < t * h; ++i) wrong += sum[i] != ToFloat(ToBf16(out[i] + sum0[i]));
      EXPECT_EQ(wrong, 0) << shape << ": sum != bf16(sum + out)";
    }
}

// Qwen3-30B-A3B experts (E 128, k 8, H 2048, I 768) at decode batch sizes, routed at random and
// crowded (every token among the first 16 experts, as a prompt's rows crowd): the pair path (a
// GEMV a pair) against the permuted ones (the grouped GEMMs; the weight streams of
// moe_skinny.cu); bandwidth counts the distinct experts' weights.
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
  std::printf("moe decode path: routing | tokens | distinct experts | pair us (TB/s) | grouped GEMMs | streams\n");
  for (int mode : {0, 3})
    for (int64_t t : {1, 2, 4, 8, 12, 16, 22, 24, 32, 48, 64, 128}) {
      if (mode == 3 && t > 32) continue;
      std::vector<int32_t> ids;
      std::vector<float> w;
      RandomRouting({t, experts, k, h, inter, mode}, &ids, &w);
      const double distinct = static_cast<double>(std::set<int32_t>(ids.begin(), ids.end()).size());
      const double bytes = distinct * 3.0 * inter * h * 2.0;
      Tensor x = Upload(*gpu, RandomBf16(t * h), {t, h}, DType::kBF16);
      Tensor gids = UploadI32(*gpu, ids, {t, k}), gw = Upload(*gpu, w, {t, k}, DType::kF32);
      Tensor out = gpu->Empty(DType::kBF16, {t, h});
      auto run = [&] { gpu->MoeExperts(x, gids, gw, wgu, wd, out); };
      cuda::Tuning().moe_pair_gemv_max_pairs = int64_t{1} << 40;
      const double pair_us = TimeUs(stream, run, 50);
      cuda::Tuning().moe_pair_gemv_max_pairs = 0;
      cuda::Tuning().moe_skinny_max_pairs = 0;
      const double grouped_us = TimeUs(stream, run, 50);
      cuda::Tuning().moe_skinny_max_pairs = int64_t{1} << 40;
      const double skinny_us = TimeUs(stream, run, 50);
      cuda::Tuning().moe_skinny_max_pairs = defaults.moe_skinny_max_pairs;
      auto tbs = [&](double us) { return bytes / (us * 1e-6) / 1e12; };
      std::printf("moe decode path: %7s | %6lld | %5.0f | %8.1f (%.2f) | %8.1f (%.2f) | %8.1f (%.2f)\n",
                  mode == 0 ? "random" : "crowded", static_cast<long long>(t), distinct, pair_us, tbs(pair_us),
                  grouped_us, tbs(grouped_us), skinny_us, tbs(skinny_us));
      const std::string shape = std::string(mode == 0 ? "T" : "crowded T") + std::to_string(t);
      Record("Perf.moe_pair_us", shape, pair_us, 0);
      Record("Perf.moe_grouped_us", shape, grouped_us, 0);
      Record("Perf.moe_skinny_us", shape, skinny_us, 0);
    }
  cuda::Tuning() = defaults;
}

// The batch-1 MoE experts as a decode step meets them: 48 layers of Qwen3-30B-A3B experts (58 GB),
// each layer's call with its own random top-8, back to back (PDL overlaps as in the step), against
// the same calls on one layer's weights (the address range of one layer), on experts 0..7 of each
// layer (48 MB of contiguous gate/up rows a layer), and a one-row streaming GEMV over the same
// bytes of each layer (no routing, contiguous, its first loads before its wait): which of the
// expert kernels' shape, the spread of the experts over the address space, or a launch's fill and
// drain holds the step's MoE at ~3.6 TB/s.
TEST(CudaPerf, MoeDecodeAcrossLayers) {
  Backend* gpu = Gpu();
  if (gpu == nullptr) GTEST_SKIP() << "no CUDA device";
  const int experts = 128, k = 8, layers = 48;
  const int64_t h = 2048, inter = 768;
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);
  const double need = layers * experts * 3.0 * inter * h * 2 + (1 << 30);
  if (free_bytes < need)
    GTEST_SKIP() << "needs " << need / 1e9 << " GB of device memory, " << free_bytes / 1e9 << " free";
  cudaStream_t stream = dynamic_cast<cuda::CudaBackend&>(*gpu).stream();
  Tensor block = Upload(*gpu, RandomBf16(int64_t{32} << 20, 0.02f), {int64_t{32} << 20}, DType::kBF16);
  auto fill = [&](const Tensor& t) {  // the 64 MB random block, tiled
    const int64_t bytes = t.view().nbytes(), chunk = block.view().nbytes();
    for (int64_t off = 0; off < bytes; off += chunk)
      cudaMemcpyAsync(static_cast<char*>(t.view().data) + off, block.view().data, std::min(chunk, bytes - off),
                      cudaMemcpyDeviceToDevice, stream);
  };
  std::vector<Tensor> wgu, wd;
  for (int l = 0; l < layers; ++l) {
    wgu.push_back(gpu->Empty(DType::kBF16, {experts, 2 * inter, h}));
    wd.push_back(gpu->Empty(DType::kBF16, {experts, h, inter}));
    fill(wgu.back());
    fill(wd.back());
  }
  std::vector<Tensor> ids_random, ids_first;
  Tensor wts;
  for (int l = 0; l < layers; ++l) {
    std::vector<int32_t> ids;
    std::vector<float> w;
    RandomRouting({1, experts, k, h, inter, 0}, &ids, &w);
    ids_random.push_back(UploadI32(*gpu, ids, {1, k}));
    if (l == 0) wts = Upload(*gpu, w, {1, k}, DType::kF32);
    std::iota(ids.begin(), ids.end(), 0);
    ids_first.push_back(UploadI32(*gpu, ids, {1, k}));
  }
  Tensor x = Upload(*gpu, RandomBf16(h), {1, h}, DType::kBF16);
  Tensor out = gpu->Empty(DType::kBF16, {1, h});
  const double layer_bytes = k * 3.0 * inter * h * 2.0;
  Tensor dense_out = gpu->Empty(DType::kBF16, {1, 3 * k * inter});
  auto dense = [&](int l) {  // the first 24 experts' gate/up rows as one [3 k I, H] matrix
    TensorView w(wgu[l].view().data, DType::kBF16, {3 * k * inter, h}, Device::kCuda);
    gpu->Linear(x, w, dense_out);
  };
  const cuda::KernelTuning defaults = cuda::Tuning();
  auto report = [&](const char* name, const std::function<void(int)>& call) {
    const double us = TimeUs(stream, [&] { for (int l = 0; l < layers; ++l) call(l); }, 5) / layers;
    std::printf("moe across layers: %-44s %6.2f us a layer, %.2f TB/s\n", name, us, layer_bytes / (us * 1e-6) / 1e12);
    Record("Perf.moe_across_layers_us", name, us, 0);
  };
  report("48 layers, random experts", [&](int l) { gpu->MoeExperts(x, ids_random[l], wts, wgu[l], wd[l], out); });
  report("one layer, random experts", [&](int l) { gpu->MoeExperts(x, ids_random[l], wts, wgu[0], wd[0], out); });
  report("48 layers, experts 0..7", [&](int l) { gpu->MoeExperts(x, ids_first[l], wts, wgu[l], wd[l], out); });
  cuda::Tuning().moe_pair_gate_up_rows = 4;  // 384 CTAs: one wave
  report("48 layers, random, gate/up 4 outputs a warp",
         [&](int l) { gpu->MoeExperts(x, ids_random[l], wts, wgu[l], wd[l], out); });
  cuda::Tuning() = defaults;
  report("48 layers, streaming GEMV of the same bytes", dense);
  const double copy_us = TimeUs(stream, [&] { gpu->Copy(wgu[1], wgu[2]); }, 3);
  std::printf("moe across layers: copy of one layer's gate/up (805 MB): %.2f TB/s (read + write)\n",
              2.0 * wgu[1].view().nbytes() / (copy_us * 1e-6) / 1e12);
}

// The first `cols` columns of a [rows, C] view (rows keep their stride).
TensorView FirstCols(const TensorView& v, int64_t cols) {
  TensorView r = v;
  r.shape = Shape{v.dim(0), cols};
  return r;
}

// A Linear case of the GEMV tests: W [n, k], out in `out`'s dtype, x's / out's rows x_pad / out_pad
// columns longer than k / n (strided views).
struct LinearCase {
  int64_t n, k;
  DType out;
  int64_t x_pad, out_pad;
};
constexpr LinearCase kLinearCases[] = {
    {5120, 2048, DType::kBF16, 0, 0}, {128, 2048, DType::kF32, 0, 0},
    {2048, 4096, DType::kBF16, 8, 3}, {72, 136, DType::kF32, 0, 0},
    {3, 8, DType::kBF16, 16, 1},      {1001, 264, DType::kBF16, 0, 0},
    {9240, 512, DType::kF32, 0, 0},   {39600, 16, DType::kF32, 0, 0}};

// m fresh rows of x and a fresh W on the GPU, and the CPU's x W^T [m, n].
struct LinearProblem {
  Tensor gx, gw;
  std::vector<float> want;
};
LinearProblem MakeLinearProblem(Backend& gpu, const LinearCase& c, int64_t m) {
  const int64_t xw = c.k + c.x_pad;
  auto x = RandomBf16(m * xw), w = RandomBf16(c.n * c.k, 1.f / std::sqrt(float(c.k)));
  Tensor cx_full = HostF32(x, {m, xw}), cw = HostF32(w, {c.n, c.k});
  Tensor cout = Tensor::Empty(DType::kF32, {m, c.n});
  cpu::Linear(FirstCols(cx_full.view(), c.k), cw, cout);
  return {Upload(gpu, x, {m, xw}, DType::kBF16), gpu.LoadWeight(cw),
          std::vector<float>(cout.ptr<float>(), cout.ptr<float>() + m * c.n)};
}

// gpu.Linear into a poisoned out of rows n + out_pad long: every row whole in `rows`, and the
// first n columns of each returned.
std::vector<float> LinearOnGpu(Backend& gpu, const LinearCase& c, const LinearProblem& p,
                             std::vector<float>& rows) {
  const int64_t m = p.gx.dim(0), ow = c.n + c.out_pad;
  Tensor gout = gpu.Empty(c.out, {m, ow});
  Poison(gpu, gout);
  gpu.Linear(FirstCols(p.gx.view(), c.k), p.gw, FirstCols(gout.view(), c.n));
  rows = Download(gpu, gout);
  std::vector<float> got;
  for (int64_t i = 0; i < m; ++i)
    got.insert(got.end(), rows.begin() + i * ow, rows.begin() + i * ow + c.n);
  return got;
}

std::string LinearShape(const LinearCase& c, int64_t m) {
  return "M" + std::to_string(m) + " N" + std::to_string(c.n) + " K" + std::to_string(c.k) +
         (c.out == DType::kF32 ? " f32-out" : "") + (c.x_pad || c.out_pad ? " strided" : "");
}

// The GEMV against the CPU over 1..8 rows of x; at one row both the staged kernel (where a CTA's
// slice fits in shared memory; all its copies at once, or 2 or 5 in flight) and the streaming
// one. On 132 SMs the staged shapes give its warps 1 to 19 rows each (N 9240 x K 512: 70 rows a
// CTA, groups of 4 and a single; N 39600 x K 16: 300 rows, 18-19 a warp); N 16384 x K 2048 is
// too large to stage (the streaming kernel runs either way).
TEST_F(CudaKernelTest, LinearGemv) {
  const cuda::KernelTuning defaults = cuda::Tuning();
  cuda::Tuning().linear_gemv_max_rows = 8;
  std::vector<LinearCase> cases(std::begin(kLinearCases), std::end(kLinearCases));
  cases.push_back({16384, 2048, DType::kBF16, 0, 0});
  cases.push_back({8448, 1024, DType::kBF16, 0, 0});
  for (const LinearCase& c : cases) {
    for (int64_t m = 1; m <= 8; ++m) {
      const LinearProblem p = MakeLinearProblem(gpu(), c, m);
      for (int depth : {-1, 0, 2, 5}) {  // -1: streaming; else staged, copies in flight a CTA
        if (m > 1 && depth != 0) continue;  // the staged kernel takes one row only
        cuda::Tuning().gemv_staged = depth >= 0;
        cuda::Tuning().gemv_staged_depth = std::max(depth, 0);
        std::vector<float> rows;
        const double e = RelError(LinearOnGpu(gpu(), c, p, rows), p.want);
        const std::string shape =
            LinearShape(c, m) + (m > 1        ? ""
                                 : depth < 0  ? " streaming"
                                 : depth == 0 ? " staged"
                                              : " staged depth " + std::to_string(depth));
        Record("Linear.gemv", shape, e, kBf16Tol);
        EXPECT_LT(e, kBf16Tol) << shape;
      }
    }
  }
  cuda::Tuning() = defaults;
}

// The tensor-core weight stream (gemm_skinny.cu) against the CPU over 2..16 rows of x (one and
// two tiles of 8 rows, partial tiles), the GEMV test's shapes and the LM head's: K split over 1-8
// warps (K 8 to 4096), N not a multiple of 16, strided x and out, bf16 and f32 out. Each case must
// launch it, and leave out's padding columns poisoned.
TEST_F(CudaKernelTest, LinearSkinny) {
  const TuningRestore restore;
  cuda::Tuning().linear_gemv_max_rows = 1;
  cuda::Tuning().linear_mma_max_rows = 16;
  std::vector<LinearCase> cases(std::begin(kLinearCases), std::end(kLinearCases));
  cases.push_back({151936, 2048, DType::kF32, 0, 0});
  for (const LinearCase& c : cases) {
    for (int64_t m : {2, 3, 4, 5, 8, 9, 12, 16}) {
      if (c.n > 100000 && m != 8) continue;  // the LM head's shape: one size
      const LinearProblem p = MakeLinearProblem(gpu(), c, m);
      const int64_t before = cuda::LinearSkinnyLaunches();
      std::vector<float> rows;
      const double e = RelError(LinearOnGpu(gpu(), c, p, rows), p.want);
      const std::string shape = LinearShape(c, m);
      Record("Linear.skinny", shape, e, kBf16Tol);
      EXPECT_LT(e, kBf16Tol) << shape;
      EXPECT_EQ(cuda::LinearSkinnyLaunches(), before + 1)
          << shape << ": the tensor-core path did not run";
      bool kept = true;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = c.n; j < c.n + c.out_pad; ++j)
          kept = kept && std::isnan(rows[i * (c.n + c.out_pad) + j]);
      EXPECT_TRUE(kept) << shape << ": wrote past N";
    }
  }
}

// RmsNormLinear of one row: the staged GEMV with the norm folded in against the same GPU's RmsNorm
// + Linear from the same sum and y: sum + y equal bits, x within a bf16 unit (1 / rms is summed in
// another order), out within kBf16Tol of the unfused one; a second fused launch, its copies three
// at a time a CTA (gemv_staged_depth_norm), gives the same bits (the re-armed arrival counter).
// Norm weights bf16 and f32; K 2048 / 4096 / 136 / 8 (one 16-byte chunk a thread up to 4096), N
// from 5120 (39 rows a CTA) down to 3.
TEST_F(CudaKernelTest, RmsNormLinearStaged) {
  const TuningRestore restore;
  struct Case { int64_t n, k; bool norm_f32; DType out; };
  for (Case c : {Case{5120, 2048, false, DType::kBF16}, Case{1024, 4096, true, DType::kBF16},
                 Case{128, 2048, false, DType::kF32}, Case{72, 136, true, DType::kBF16}, Case{3, 8, false, DType::kBF16}}) {
    const auto y = RandomBf16(c.k), sum = RandomBf16(c.k, 4.f), w = RandomBf16(c.n * c.k, 1.f / std::sqrt(float(c.k)));
    std::vector<float> norm = RandomBf16(c.k, 0.5f);
    for (float& v : norm) v += 1.f;
    Tensor gw = gpu().LoadWeight(HostF32(w, {c.n, c.k}));
    Tensor gnorm = Upload(gpu(), norm, {c.k}, c.norm_f32 ? DType::kF32 : DType::kBF16);
    struct Out { std::vector<float> sum, x, out; };
    auto run = [&](bool fused) {
      cuda::Tuning().gemv_staged_norm = fused;
      Tensor gy = Upload(gpu(), y, {1, c.k}, DType::kBF16), gsum = Upload(gpu(), sum, {1, c.k}, DType::kBF16);
      Tensor gx = gpu().Empty(DType::kBF16, {1, c.k}), gout = gpu().Empty(c.out, {1, c.n});
      Poison(gpu(), gx);
      Poison(gpu(), gout);
      gpu().RmsNormLinear(gy, gnorm, 1e-6f, gsum, gx, gw, gout);
      return Out{Download(gpu(), gsum), Download(gpu(), gx), Download(gpu(), gout)};
    };
    const Out ref = run(false), got = run(true);
    cuda::Tuning().gemv_staged_depth_norm = 3;  // the second launch (and NormLinear's) paced
    const Out again = run(true);
    const std::string shape = "N" + std::to_string(c.n) + " K" + std::to_string(c.k) + (c.norm_f32 ? " f32-norm" : "") +
                              (c.out == DType::kF32 ? " f32-out" : "");
    EXPECT_EQ(got.sum, ref.sum) << shape;
    double x_err = 0;
    for (int64_t i = 0; i < c.k; ++i)
      x_err = std::max<double>(x_err, std::fabs(got.x[i] - ref.x[i]) / std::max(1e-3f, std::fabs(ref.x[i])));
    Record("RmsNormLinear.x", shape, x_err, 1.0 / 128);
    EXPECT_LE(x_err, 1.0 / 128) << shape;  // one bf16 unit
    const double e = RelError(got.out, ref.out);
    Record("RmsNormLinear.out", shape, e, kBf16Tol);
    EXPECT_LT(e, kBf16Tol) << shape;
    EXPECT_EQ(again.sum, got.sum) << shape << " (second launch)";
    EXPECT_EQ(again.x, got.x) << shape << " (second launch)";
    EXPECT_EQ(again.out, got.out) << shape << " (second launch)";
    // NormLinear (the sum already added, as after MoeExpertsResidual): the staged GEMV norms the
    // unfused path's sum as it stages x; sum stays as it was.
    Tensor gsum = Upload(gpu(), ref.sum, {1, c.k}, DType::kBF16);
    Tensor gx = gpu().Empty(DType::kBF16, {1, c.k}), gout = gpu().Empty(c.out, {1, c.n});
    Poison(gpu(), gx);
    Poison(gpu(), gout);
    gpu().NormLinear(gnorm, 1e-6f, gsum, gx, gw, gout);
    const Out norm_only{Download(gpu(), gsum), Download(gpu(), gx), Download(gpu(), gout)};
    EXPECT_EQ(norm_only.sum, ref.sum) << shape << " (NormLinear)";
    double nx_err = 0;
    for (int64_t i = 0; i < c.k; ++i)
      nx_err = std::max<double>(nx_err, std::fabs(norm_only.x[i] - ref.x[i]) / std::max(1e-3f, std::fabs(ref.x[i])));
    EXPECT_LE(nx_err, 1.0 / 128) << shape << " (NormLinear)";
    const double ne = RelError(norm_only.out, ref.out);
    Record("NormLinear.out", shape, ne, kBf16Tol);
    EXPECT_LT(ne, kBf16Tol) << shape << " (NormLinear)";
  }
}

// RmsNormMoeRouter, each fused path (the staged router with the norm folded in, one token; the
// cluster norm-router at 8 and 16 CTAs, at 16 also with its rows in registers, 1 / 2 / 5 / 8
// tokens) against the same GPU's RmsNorm + MoeRouter from the same sum and y. sum + y must be
// equal bits (the same bf16 rounding); x within a bf16 unit for the staged router (1 / rms summed
// in another order), equal bits for the cluster (RmsNorm's order); ids equal except where two
// experts' logits (from the unfused x, on the CPU) are within 2e-3; weights of equal ids within
// 2e-3; the cluster's ids and weights equal bits at one token where the unfused router GEMV is
// staged at one row a CTA (E <= the SMs: the same dot order; more tokens take the tensor-core
// Linear, another order). Norm weights bf16 and f32 (Qwen3.5's), E 128 / 512 / 256 (DeepSeek
// routing) / 64, H 2048 / 1024 / 512 / 4096 / 136. A second fused launch gives the same bits
// (the staged router's re-armed counter). Modes as run() below names them.
void CheckRmsNormMoeRouterFused(std::initializer_list<int> modes) {
  auto gpu = []() -> Backend& { return *Gpu(); };
  const TuningRestore restore;
  int device = 0, sms = 0, max_smem = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
            cudaSuccess);
  cudaStream_t stream = dynamic_cast<cuda::CudaBackend&>(gpu()).stream();
  cuda::Tuning().cluster_norm_router_max_tokens = 8;
  struct Case { int experts, k; int64_t hidden; bool norm_f32; int groups, topk_groups; bool sigmoid, bias; };
  for (Case c : {Case{128, 8, 2048, false, 1, 1, false, false}, Case{512, 10, 1024, true, 1, 1, false, false},
                 Case{256, 8, 512, false, 8, 4, true, true}, Case{128, 8, 4096, false, 1, 1, false, false},
                 Case{64, 4, 136, true, 1, 1, false, false}, Case{100, 6, 2048, false, 1, 1, false, false}}) {
    for (int64_t tokens : {1, 2, 5, 8}) {
      const int64_t e = c.experts, h = c.hidden;
      const auto y = RandomBf16(tokens * h), sum = RandomBf16(tokens * h, 4.f),
                 w = RandomBf16(e * h, 3.f / std::sqrt(float(h)));
      std::vector<float> norm = RandomBf16(h, 0.5f);
      for (float& v : norm) v += 1.f;
      const auto bias = RandomBf16(e, 0.1f);
      MoeRouting r;
      r.top_k = c.k;
      r.sigmoid = c.sigmoid;
      r.num_groups = c.groups;
      r.topk_groups = c.topk_groups;
      r.scaling_factor = c.sigmoid ? 2.5f : 1.0f;
      Tensor gw = gpu().LoadWeight(HostF32(w, {e, h}));
      Tensor gnorm = Upload(gpu(), norm, {h}, c.norm_f32 ? DType::kF32 : DType::kBF16);
      Tensor gb = Upload(gpu(), bias, {e}, DType::kF32);
      if (c.bias) r.correction_bias = gb.view();
      struct Out {
        std::vector<float> sum, x, weights;
        std::vector<int32_t> ids;
      };
      // Register rows where a warp has at most one row of at most 2048 (RmsNorm's block size: a
      // thread a 16-byte chunk).
      auto regs = [&](int mode) {
        return mode >= 17 && (e + 15) / 16 <= std::max<int64_t>(1, (h / 8 + 31) / 32) && h <= 2048;
      };
      // The cluster's shared memory (router_norm.cu): its rows unless in registers, each token's
      // x and h (with register rows: one token's at one, none past one), the routing scratch; 8
      // CTAs at H 4096 and 8 tokens do not fit.
      auto fits = [&](int mode) {
        if (mode < 8) return true;
        const int64_t ctas = mode == 8 ? 8 : 16, rows = regs(mode) ? 0 : (e + ctas - 1) / ctas;
        const int64_t staged = regs(mode) ? (tokens > 1 ? 0 : 1) : tokens;
        const int64_t bytes = 256 + 2 * staged * ((2 * h + 127) / 128 * 128) + rows * h * 2 +
                              4 * tokens * (3 * e + c.groups);
        return bytes <= max_smem - 1024;
      };
      // mode 0: unfused; 1: staged router; 8 / 16: the cluster norm-router; 17: 16 with register
      // rows; 18: 17 with the logits pushed by st.async at one token (router_norm.cu's kAsync);
      // 19: 17 routing by the logits (RouteTokenByLogits: weights within 1e-6, not the bits).
      auto run = [&](int mode) {
        cuda::Tuning().staged_router_norm = mode == 1;
        cuda::Tuning().cluster_norm_router = mode >= 8 ? std::min(mode, 16) : 0;
        cuda::Tuning().cluster_norm_router_regs = mode >= 17;
        cuda::Tuning().cluster_norm_router_async = mode == 18;
        cuda::Tuning().route_by_logits = mode == 19;
        Tensor gy = Upload(gpu(), y, {tokens, h}, DType::kBF16),
               gsum = Upload(gpu(), sum, {tokens, h}, DType::kBF16);
        Tensor gx = gpu().Empty(DType::kBF16, {tokens, h});
        Tensor gids = gpu().Empty(DType::kI32, {tokens, c.k}),
               gwt = gpu().Empty(DType::kF32, {tokens, c.k});
        Poison(gpu(), gx);
        Poison(gpu(), gwt);
        if (mode == 0) {
          gpu().RmsNormMoeRouter(gy, gnorm, 1e-6f, gsum, gx, gw, r, gids, gwt);
        } else {  // the fused kernel itself: it must take every case that fits shared memory
          EXPECT_EQ(cuda::RmsNormMoeRouter(gy, gnorm, 1e-6f, gsum, gx, gw, r, gids, gwt, stream),
                    fits(mode));
        }
        return Out{Download(gpu(), gsum), Download(gpu(), gx), Download(gpu(), gwt),
                   DownloadI32(gpu(), gids)};
      };
      const Out ref = run(0);
      Tensor logits = Tensor::Empty(DType::kF32, {tokens, e});
      cpu::Linear(HostF32(ref.x, {tokens, h}).view(), HostF32(w, {e, h}), logits);
      auto score = [&](int64_t token, int32_t id) {
        if (id < 0 || id >= e) return -INFINITY;
        const float l = logits.ptr<float>()[token * e + id];
        const float s = c.sigmoid ? 1.f / (1.f + std::exp(-l)) : l;
        return c.bias ? s + bias[id] : s;
      };
      Out regs_out;
      for (int mode : modes) {
        if (mode == 1 && tokens > 1) continue;  // the staged router takes one token
        const int64_t reg_launches = cuda::ClusterNormRouterRegLaunches();
        const Out got = run(mode), again = run(mode);
        EXPECT_EQ(cuda::ClusterNormRouterRegLaunches() - reg_launches, regs(mode) ? 2 : 0)
            << "E" << e << " H" << h;
        if (!fits(mode)) continue;
        const std::string shape = std::string(mode == 1    ? "staged"
                                              : mode == 17 ? "cluster16 regs"
                                              : mode == 18 ? "cluster16 regs async"
                                              : mode == 19 ? "cluster16 regs by-logits"
                                                           : "cluster" + std::to_string(mode)) +
                                  " T" + std::to_string(tokens) + " E" + std::to_string(e) + " k" +
                                  std::to_string(c.k) + " H" + std::to_string(h) +
                                  (c.norm_f32 ? " f32-norm" : "") +
                                  (c.groups > 1 ? " grouped sigmoid bias" : "");
        EXPECT_EQ(got.sum, ref.sum) << shape;
        double x_err = 0;
        for (int64_t i = 0; i < tokens * h; ++i)
          x_err = std::max<double>(
              x_err, std::fabs(got.x[i] - ref.x[i]) / std::max(1e-3f, std::fabs(ref.x[i])));
        Record("RmsNormMoeRouter.x", shape, x_err, 1.0 / 128);
        EXPECT_LE(x_err, 1.0 / 128) << shape;  // one bf16 unit
        int mismatches = 0;
        double w_err = 0;
        for (int64_t j = 0; j < tokens * c.k; ++j) {
          if (got.ids[j] != ref.ids[j]) {
            const int64_t token = j / c.k;
            if (!(std::fabs(score(token, got.ids[j]) - score(token, ref.ids[j])) < 2e-3f))
              ++mismatches;
          } else {
            w_err =
                std::max(w_err, static_cast<double>(std::fabs(got.weights[j] - ref.weights[j])));
          }
        }
        Record("RmsNormMoeRouter.id_mismatches", shape, mismatches, 0);
        Record("RmsNormMoeRouter.weights", shape, w_err, 2e-3);
        EXPECT_EQ(mismatches, 0) << shape;
        EXPECT_LE(w_err, 2e-3) << shape;
        if (mode >= 8) {
          EXPECT_EQ(got.x, ref.x) << shape;
          if (e <= sms && tokens == 1 && mode != 19) {
            EXPECT_EQ(got.ids, ref.ids) << shape;
            EXPECT_EQ(got.weights, ref.weights) << shape;
          }
        }
        EXPECT_EQ(again.sum, got.sum) << shape << " (second launch)";
        EXPECT_EQ(again.x, got.x) << shape << " (second launch)";
        EXPECT_EQ(again.ids, got.ids) << shape << " (second launch)";
        EXPECT_EQ(again.weights, got.weights) << shape << " (second launch)";
        if (mode == 17) regs_out = got;
        if (mode == 19 && got.ids == ref.ids) {  // (a different pick moves the sum)
          EXPECT_LE(w_err, 1e-6) << shape;
        }
        if (mode == 18 && regs(mode) && !regs_out.ids.empty()) {  // the cluster barrier's bits
          EXPECT_EQ(got.sum, regs_out.sum) << shape;
          EXPECT_EQ(got.x, regs_out.x) << shape;
          EXPECT_EQ(got.ids, regs_out.ids) << shape;
          EXPECT_EQ(got.weights, regs_out.weights) << shape;
        }
      }
    }
  }
}

TEST_F(CudaKernelTest, RmsNormMoeRouterFused) { CheckRmsNormMoeRouterFused({1, 8, 16, 17, 19}); }

// The st.async exchange (Tuning().cluster_norm_router_async) on its own: equal bits to mode 17's
// cluster barrier. Apart so that a hang there (session 57's first form) leaves the other forms'
// results.
TEST_F(CudaKernelTest, RmsNormMoeRouterFusedAsync) { CheckRmsNormMoeRouterFused({17, 18}); }

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
  std::printf(
      "linear small batch: name | M | gemv us (TB/s) | staged us (TB/s; M 1, where it fits) | "
      "cublasLt us (TB/s) | "
      "mma us (TB/s; M > 1)\n");
  for (Shape2 sh : {Shape2{"qkv", 5120, 2048, DType::kBF16}, Shape2{"o_proj", 2048, 4096, DType::kBF16},
                    Shape2{"router", 128, 2048, DType::kF32}, Shape2{"lm_head", 151936, 2048, DType::kF32}}) {
    Tensor w = Upload(*gpu, RandomBf16(sh.n * sh.k, 0.02f), {sh.n, sh.k}, DType::kBF16);
    for (int64_t m : {1, 2, 4, 8, 16}) {
      Tensor x = Upload(*gpu, RandomBf16(m * sh.k), {m, sh.k}, DType::kBF16);
      Tensor out = gpu->Empty(sh.out, {m, sh.n});
      auto run = [&] { gpu->Linear(x, w, out); };
      cuda::Tuning().linear_mma_max_rows = 0;
      cuda::Tuning().linear_gemv_max_rows = 8;
      cuda::Tuning().gemv_staged = false;
      const double gemv_us = m <= 8 ? TimeUs(stream, run, 50) : 0.0;
      cuda::Tuning().gemv_staged = true;
      const double staged_us = m == 1 ? TimeUs(stream, run, 50) : 0.0;
      cuda::Tuning().linear_gemv_max_rows = 0;
      const double lt_us = TimeUs(stream, run, 50);
      cuda::Tuning().linear_gemv_max_rows = 1;
      cuda::Tuning().linear_mma_max_rows = 16;
      const double mma_us = m > 1 ? TimeUs(stream, run, 50) : 0.0;
      const double bytes = 2.0 * sh.n * sh.k;
      auto tbs = [&](double us) { return us > 0 ? bytes / (us * 1e-6) / 1e12 : 0.0; };
      std::printf(
          "linear small batch: %-8s | %lld | %8.1f (%.2f) | %8.1f (%.2f) | %8.1f (%.2f) | %8.1f "
          "(%.2f)\n",
          sh.name, static_cast<long long>(m), gemv_us, tbs(gemv_us), staged_us, tbs(staged_us),
          lt_us, tbs(lt_us), mma_us, tbs(mma_us));
      if (m > 1)
        Record(std::string("Perf.linear_mma_us.") + sh.name, "M" + std::to_string(m), mma_us, 0);
      if (m == 1) Record(std::string("Perf.linear_gemv_staged_us.") + sh.name, "M1", staged_us, 0);
      if (m <= 8)
        Record(std::string("Perf.linear_gemv_us.") + sh.name, "M" + std::to_string(m), gemv_us, 0);
      Record(std::string("Perf.linear_cublaslt_us.") + sh.name, "M" + std::to_string(m), lt_us, 0);
    }
  }
  cuda::Tuning() = defaults;
}


// MoeRouter (router GEMV + routing in one launch, router.cu) against the CPU backend's default
// (Linear into f32 logits, then MoeRoute), over 1..8 tokens (9 and 12 take the unfused path on
// the GPU too), Qwen3 (E 128, k 8), Qwen3.5 (E 512, k 10), DeepSeek routing (sigmoid, bias,
// groups, scaling) and small shapes; E 24 is not a multiple of 16 (unfused). Ids must match
// except where the CPU's probabilities of the two ids are within 1e-5 (the GEMV sums in another
// order); weights f32 within kF32Tol.
TEST_F(CudaKernelTest, MoeRouterFused) {
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  const TuningRestore restore;
  cuda::Tuning().fused_router_max_tokens = 8;  // off by default (tuning.h)
  struct Case { int experts, k; int64_t hidden; int groups, topk_groups; bool sigmoid, bias, renorm; };
  for (Case c : {Case{128, 8, 2048, 1, 1, false, false, true}, Case{512, 10, 1024, 1, 1, false, false, true},
                 Case{256, 8, 512, 8, 4, true, true, true}, Case{64, 4, 136, 1, 1, false, false, false},
                 Case{16, 2, 8, 1, 1, false, false, true}, Case{24, 2, 64, 1, 1, false, false, true}})
    for (int64_t t : {1, 2, 3, 5, 8, 9, 12}) {
      const int64_t e = c.experts, h = c.hidden;
      auto x = RandomBf16(t * h), w = RandomBf16(e * h, 3.f / std::sqrt(float(h)));
      auto bias = RandomBf16(e, 0.1f);
      MoeRouting r;
      r.top_k = c.k;
      r.renormalize = c.renorm;
      r.sigmoid = c.sigmoid;
      r.num_groups = c.groups;
      r.topk_groups = c.topk_groups;
      r.scaling_factor = c.sigmoid ? 2.5f : 1.0f;
      Tensor cx = HostF32(x, {t, h}), cw = HostF32(w, {e, h}), cb = HostF32(bias, {e});
      Tensor cids = Tensor::Empty(DType::kI32, {t, c.k}), cwt = Tensor::Empty(DType::kF32, {t, c.k});
      Tensor clogits = Tensor::Empty(DType::kF32, {t, e});
      if (c.bias) r.correction_bias = cb;
      cpu->MoeRouter(cx, cw, r, cids, cwt);
      cpu::Linear(cx, cw, clogits);  // the probabilities, for judging near ties
      Tensor gx = Upload(gpu(), x, {t, h}, DType::kBF16), gw = gpu().LoadWeight(cw);
      Tensor gb = Upload(gpu(), bias, {e}, DType::kF32);
      // One token also takes the staged router (a warp per row, the last warp routes).
      for (bool staged : {false, true}) {
        if (staged && t != 1) break;
        cuda::Tuning().staged_router = staged;
        Tensor gids = gpu().Empty(DType::kI32, {t, c.k}), gwt = gpu().Empty(DType::kF32, {t, c.k});
        Poison(gpu(), gwt);
        std::vector<int32_t> minus(t * c.k, -7);
        gpu().CopyFromHost(minus.data(), gids);
        r.correction_bias = c.bias ? gb.view() : TensorView();
        gpu().MoeRouter(gx, gw, r, gids, gwt);
        const std::vector<int32_t> ids = DownloadI32(gpu(), gids);
        int mismatches = 0;
        for (int64_t i = 0; i < t; ++i) {
          const float* lg = clogits.ptr<float>() + i * e;
          auto score = [&](int32_t id) {  // the selection score's order: logits order the softmax too
            if (id < 0 || id >= e) return -INFINITY;
            const float s = c.sigmoid ? 1.f / (1.f + std::exp(-lg[id])) : lg[id];
            return c.bias ? s + bias[id] : s;
          };
          for (int j = 0; j < c.k; ++j) {
            const int32_t want = cids.ptr<int32_t>()[i * c.k + j], got = ids[i * c.k + j];
            if (got != want && !(std::fabs(score(got) - score(want)) < 1e-5f)) ++mismatches;
          }
        }
        const double err =
            RelError(Download(gpu(), gwt), std::vector<float>(cwt.ptr<float>(), cwt.ptr<float>() + t * c.k));
        const std::string shape = "T" + std::to_string(t) + " E" + std::to_string(e) + " k" + std::to_string(c.k) + " H" +
                                  std::to_string(h) + (c.groups > 1 ? " grouped" : "") + (c.sigmoid ? " sigmoid" : "") +
                                  (c.bias ? " bias" : "") + (c.renorm ? "" : " no-renorm") +
                                  (staged ? " staged" : t > 8 || e % 16 != 0 ? " (unfused)" : "");
        Record("MoeRouter.weights", shape, err, kF32Tol);
        Record("MoeRouter.id_mismatches", shape, mismatches, 0);
        EXPECT_EQ(mismatches, 0) << shape;
        EXPECT_LT(err, kF32Tol) << shape;
        if (staged) {  // a second launch: the last warp re-armed the stream's arrival counter
          const std::vector<float> weights = Download(gpu(), gwt);
          Poison(gpu(), gwt);
          gpu().CopyFromHost(minus.data(), gids);
          gpu().MoeRouter(gx, gw, r, gids, gwt);
          EXPECT_EQ(DownloadI32(gpu(), gids), ids) << shape << " (second launch)";
          EXPECT_EQ(Download(gpu(), gwt), weights) << shape << " (second launch)";
        }
      }
    }
}

// Qwen3-30B-A3B batch-1..8 decode ops, new against old, each timed over 50 back-to-back calls
// (so consecutive launches overlap as a decode step's do under programmatic dependent launch),
// with the bytes each must read against the HBM copy rate measured here ("decode ops:" lines):
//   GEMV (qkv 5120x2048, o_proj 2048x4096, router 128x2048 f32-out, 1536x2048): PDL on vs off
//   (off is the pre-PDL launch; the kernel itself is the new pipelined one);
//   router: MoeRouter fused vs Linear + MoeRoute;
//   attention (Hq 32, Hk 4, D 128, ctx 1024 / 8192): fused split merge + PDL vs separate merge
//   launch without PDL.
TEST(CudaPerf, DecodeSmallBatchOps) {
  Backend* gpu = Gpu();
  if (gpu == nullptr) GTEST_SKIP() << "no CUDA device";
  cudaStream_t stream = dynamic_cast<cuda::CudaBackend&>(*gpu).stream();
  const cuda::KernelTuning defaults = cuda::Tuning();
  double copy_tbps = 0;
  {
    Tensor a = gpu->Empty(DType::kBF16, {int64_t{1} << 29}), b = gpu->Empty(DType::kBF16, {int64_t{1} << 29});
    const double us = TimeUs(stream, [&] {
      cudaMemcpyAsync(b.view().data, a.view().data, size_t{1} << 30, cudaMemcpyDeviceToDevice, stream);
    }, 10);
    copy_tbps = 2.0 * (size_t{1} << 30) / (us * 1e-6) / 1e12;
  }
  std::printf("decode ops: HBM copy %.2f TB/s (read + write); fractions below are of it\n", copy_tbps);
  auto frac = [&](double bytes, double us) { return bytes / (us * 1e-6) / 1e12 / copy_tbps; };

  struct GemvShape { const char* name; int64_t n, k; DType out; };
  std::printf("decode ops: gemv | M | PDL on us (of copy) | PDL off us (of copy)\n");
  for (GemvShape sh : {GemvShape{"qkv", 5120, 2048, DType::kBF16}, GemvShape{"o_proj", 2048, 4096, DType::kBF16},
                       GemvShape{"router", 128, 2048, DType::kF32}, GemvShape{"1536x2048", 1536, 2048, DType::kBF16}}) {
    Tensor w = Upload(*gpu, RandomBf16(sh.n * sh.k, 0.02f), {sh.n, sh.k}, DType::kBF16);
    for (int64_t m : {1, 2}) {
      Tensor x = Upload(*gpu, RandomBf16(m * sh.k), {m, sh.k}, DType::kBF16);
      Tensor out = gpu->Empty(sh.out, {m, sh.n});
      auto run = [&] { gpu->Linear(x, w, out); };
      cuda::Tuning().pdl = true;
      const double on = TimeUs(stream, run, 50);
      cuda::Tuning().pdl = false;
      const double off = TimeUs(stream, run, 50);
      const double bytes = 2.0 * sh.n * sh.k;
      std::printf("decode ops: gemv %-9s | %lld | %7.2f (%.0f%%) | %7.2f (%.0f%%)\n", sh.name, static_cast<long long>(m),
                  on, 100 * frac(bytes, on), off, 100 * frac(bytes, off));
      Record(std::string("Perf.gemv_pdl_us.") + sh.name, "M" + std::to_string(m), on, 0);
      Record(std::string("Perf.gemv_nopdl_us.") + sh.name, "M" + std::to_string(m), off, 0);
    }
  }
  cuda::Tuning() = defaults;

  {
    const int64_t e = 128, h = 2048;
    const int k = 8;
    Tensor w = Upload(*gpu, RandomBf16(e * h, 0.02f), {e, h}, DType::kBF16);
    std::printf("decode ops: router | T | fused us (of copy) | Linear + MoeRoute us (of copy)\n");
    for (int64_t t : {1, 2, 4, 8}) {
      Tensor x = Upload(*gpu, RandomBf16(t * h), {t, h}, DType::kBF16);
      Tensor ids = gpu->Empty(DType::kI32, {t, k}), wt = gpu->Empty(DType::kF32, {t, k});
      MoeRouting r;
      r.top_k = k;
      auto run = [&] { gpu->MoeRouter(x, w, r, ids, wt); };
      cuda::Tuning().fused_router_max_tokens = 8;
      const double fused = TimeUs(stream, run, 50);
      cuda::Tuning().fused_router_max_tokens = 0;
      const double old = TimeUs(stream, run, 50);
      const double bytes = 2.0 * e * h;
      std::printf("decode ops: router | %lld | %7.2f (%.0f%%) | %7.2f (%.0f%%)\n", static_cast<long long>(t), fused,
                  100 * frac(bytes, fused), old, 100 * frac(bytes, old));
      Record("Perf.router_fused_us", "T" + std::to_string(t), fused, 0);
      Record("Perf.router_unfused_us", "T" + std::to_string(t), old, 0);
    }
    cuda::Tuning() = defaults;
  }

  {
    const int64_t hq = 32, hk = 4, d = 128, bs = 16;
    std::printf("decode ops: attention | B | ctx | fused merge + PDL us (of copy) | separate merge, no PDL us (of copy)\n");
    for (int64_t ctx : {1024, 8192})
      for (int64_t b : {1, 2, 8}) {
        const int64_t blocks_per_seq = (ctx + bs - 1) / bs, num_blocks = b * blocks_per_seq;
        Tensor q = Upload(*gpu, RandomBf16(b * hq * d), {b, hq, d}, DType::kBF16);
        Tensor kc = gpu->Empty(DType::kBF16, {num_blocks, hk, bs, d}), vc = gpu->Empty(DType::kBF16, {num_blocks, hk, bs, d});
        cudaMemsetAsync(kc.view().data, 0, kc.view().nbytes(), stream);  // zeros: the time does not depend on values
        cudaMemsetAsync(vc.view().data, 0, vc.view().nbytes(), stream);
        std::vector<int32_t> qs(b + 1), sl(b, static_cast<int32_t>(ctx)), tab(b * blocks_per_seq);
        std::iota(qs.begin(), qs.end(), 0);
        std::iota(tab.begin(), tab.end(), 0);
        Tensor gqs = UploadI32(*gpu, qs, {b + 1}), gsl = UploadI32(*gpu, sl, {b});
        Tensor gtab = UploadI32(*gpu, tab, {b, blocks_per_seq}), gslot = UploadI32(*gpu, std::vector<int32_t>(b, 0), {b});
        Tensor out = gpu->Empty(DType::kBF16, {b, hq, d});
        AttentionBatch batch{gqs, gsl, gtab, gslot, 1, static_cast<int>(ctx)};
        auto run = [&] { gpu->Attention(q, KvCacheView{kc, vc}, batch, 0.088f, out); };
        cuda::Tuning().attention_fused_merge = true;
        cuda::Tuning().pdl = true;
        const double fused = TimeUs(stream, run, 50);
        cuda::Tuning().attention_fused_merge = false;
        cuda::Tuning().pdl = false;
        const double old = TimeUs(stream, run, 50);
        const double bytes = 2.0 * b * ctx * hk * d * 2;  // K and V
        std::printf("decode ops: attention | %lld | %lld | %7.2f (%.0f%%) | %7.2f (%.0f%%)\n", static_cast<long long>(b),
                    static_cast<long long>(ctx), fused, 100 * frac(bytes, fused), old, 100 * frac(bytes, old));
        const std::string shape = "B" + std::to_string(b) + " ctx" + std::to_string(ctx);
        Record("Perf.attention_fused_merge_us", shape, fused, 0);
        Record("Perf.attention_separate_merge_us", shape, old, 0);
        cuda::Tuning() = defaults;
      }
  }
}

}  // namespace
}  // namespace corolla::cuda_test
