// MoeExperts on the GPU against its CPU twin (cpu::MoeExperts). Every case runs through each
// path: the grouped mma GEMMs of grouped_gemm.cu at each tile height (32, 64, 128 rows), the
// 128-row tiles on wgmma + TMA (grouped_gemm_wgmma.cu; shapes it does not fit fall back to
// mma.sync), the memory-bound decode GEMVs (one-CTA and chunked permute) and the default
// dispatch; "mma tile 64 scalar combine" takes MoeCombine's scalar kernel and must give the
// 16-byte kernel's bits; the "y bf16" paths keep the down GEMM's rows in bf16 as the default
// dispatch does (the other forced paths in f32; the scalar combine bit for bit again). K 768 / 2048
// / 7168 and N 1536 / 2048 cover the wgmma kernel's k-loop and N tails. The sweep: one token to
// 4096 (E 128, k 8, H 2048, I 768), K and N off the tiles (H 136/200, I 72/200), one expert taking
// every row, most experts with zero rows (leading, interleaved, trailing), slots of another rank
// (id -1 or >= E), 512 experts with k 10. Fresh bf16-rounded random inputs, outputs NaN-poisoned
// before each run, ||out - ref|| / ||ref|| < kBf16Tol. CudaKernelTest.WgmmaTileProbe runs one 64 x
// 256 x 64 tile through the raw wgmma/TMA wrappers; CudaKernelTest.GroupedGemmWgmma compares the
// wgmma GEMMs with the mma.sync ones directly. CudaPerf.GroupedGemm times the two grouped GEMMs
// alone and the whole op on Qwen3-30B-A3B shapes ("grouped gemm perf:" lines, tile "128w" = wgmma;
// scripts/bench_grouped_mm_torch.py prints torch's table). Needs a GPU; skips otherwise.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <tuple>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/test_util.h"

namespace corolla::cuda_test {
namespace {

// Expert weights on both backends, built once per (E, H, I) of a sweep: the large shapes take
// seconds to draw.
struct ExpertWeights {
  Tensor cpu_gate_up, cpu_down;  // f32 [E, 2I, H], [E, H, I]
  Tensor gpu_gate_up, gpu_down;  // bf16
};
using WeightCache = std::map<std::tuple<int, int64_t, int64_t>, std::unique_ptr<ExpertWeights>>;
const ExpertWeights& WeightsFor(WeightCache& cache, Backend& gpu, int experts, int64_t hidden,
                                int64_t inter) {
  auto& w = cache[{experts, hidden, inter}];
  if (!w) {
    w = std::make_unique<ExpertWeights>();
    w->cpu_gate_up =
        HostF32(RandomBf16(int64_t{experts} * 2 * inter * hidden, 1.f / std::sqrt(float(hidden))),
                {experts, 2 * inter, hidden});
    w->cpu_down =
        HostF32(RandomBf16(int64_t{experts} * hidden * inter, 1.f / std::sqrt(float(inter))),
                {experts, hidden, inter});
    w->gpu_gate_up = gpu.LoadWeight(w->cpu_gate_up);
    w->gpu_down = gpu.LoadWeight(w->cpu_down);
  }
  return *w;
}

enum class Routing {
  kRandom,      // k distinct random experts per token
  kOneExpert,   // slot 0 of every token is expert 3 (k 1: every row on expert 3)
  kSparse,      // only even experts of the upper half: leading, interleaved and trailing zero rows
  kOtherRanks,  // random, a quarter of the slots -1 or >= E (another rank's expert): skipped
};

struct MoeCase {
  int64_t tokens;
  int experts, k;
  int64_t hidden, inter;
  Routing routing = Routing::kRandom;
};

std::string Name(const MoeCase& c) {
  static const char* kRouting[] = {"", " one-expert", " sparse", " other-ranks"};
  return "T" + std::to_string(c.tokens) + " E" + std::to_string(c.experts) + " k" +
         std::to_string(c.k) + " H" + std::to_string(c.hidden) + " I" + std::to_string(c.inter) +
         kRouting[static_cast<int>(c.routing)];
}

std::vector<int32_t> RouteIds(const MoeCase& c) {
  std::vector<int32_t> ids(c.tokens * c.k);
  std::vector<int32_t> pool(c.experts);
  std::iota(pool.begin(), pool.end(), 0);
  if (c.routing == Routing::kSparse) {
    pool.clear();
    for (int e = c.experts / 2; e < c.experts; e += 2) pool.push_back(e);
  }
  for (int64_t t = 0; t < c.tokens; ++t) {
    std::shuffle(pool.begin(), pool.end(), Rng());
    if (c.routing == Routing::kOneExpert)
      std::swap(pool[0], *std::find(pool.begin(), pool.end(), 3));
    for (int s = 0; s < c.k; ++s) {
      int32_t id = pool[s];
      if (c.routing == Routing::kOtherRanks && Rng()() % 4 == 0)
        id = Rng()() % 2 ? -1 : c.experts + 5;
      ids[t * c.k + s] = id;
    }
  }
  return ids;
}

// The paths MoeExperts can take, each forced through Tuning() (`dispatch`: the defaults).
struct MoePath {
  const char* name = "";
  bool dispatch = false;        // leave the default choice
  int tile_rows = 0;            // mma: forced tile height (0: by rows per expert)
  bool one_cta_permute = true;  // MoePermute's one-CTA kernel where the pairs fit
  bool wgmma = false;           // 128-row tiles on the wgmma kernels
  bool combine_vec = true;      // MoeCombine's 16-byte kernel, else its scalar twin
  bool wgmma_tile64 = false;    // the 64-row wgmma tiles (with wgmma)
  bool prompt = false;          // PlanStep says the tokens are one prompt chunk's
  bool y_bf16 = false;          // the down GEMM's y in bf16 (Tuning().moe_y_bf16)
  bool snake = true;            // Tuning().moe_gemm_snake
  bool skinny = false;          // the weight streams (moe_skinny.cu)
};
const MoePath kMoePaths[] = {
    {.name = "mma tile 32", .tile_rows = 32},
    {.name = "mma tile 64", .tile_rows = 64},
    {.name = "mma tile 64 scalar combine", .tile_rows = 64, .combine_vec = false},
    {.name = "mma tile 128", .tile_rows = 128},
    {.name = "wgmma tile 128", .tile_rows = 128, .wgmma = true},
    {.name = "wgmma tile 64", .tile_rows = 64, .wgmma = true, .wgmma_tile64 = true},
    {.name = "default dispatch", .dispatch = true},
    {.name = "default dispatch, prompt step", .dispatch = true, .prompt = true},
    {.name = "mma tile 32 y bf16", .tile_rows = 32, .y_bf16 = true},
    {.name = "mma tile 64 y bf16", .tile_rows = 64, .y_bf16 = true},
    {.name = "mma tile 64 y bf16 scalar combine",
     .tile_rows = 64,
     .combine_vec = false,
     .y_bf16 = true},
    {.name = "mma tile 128 y bf16", .tile_rows = 128, .y_bf16 = true},
    {.name = "wgmma tile 128 y bf16", .tile_rows = 128, .wgmma = true, .y_bf16 = true},
    {.name = "wgmma tile 64 y bf16",
     .tile_rows = 64,
     .wgmma = true,
     .wgmma_tile64 = true,
     .y_bf16 = true},
    {.name = "wgmma tile 128 straight order", .tile_rows = 128, .wgmma = true, .snake = false},
    {.name = "skinny", .skinny = true},
    {.name = "skinny y bf16", .y_bf16 = true, .skinny = true},
    {.name = "skinny chunked permute", .one_cta_permute = false, .skinny = true},
};
void Apply(const MoePath& path) {
  cuda::KernelTuning& t = cuda::Tuning();
  t = DefaultTuning();
  t.moe_gemm_snake = path.snake;
  if (path.dispatch) return;
  t.moe_pair_gemv_max_pairs = 0;
  t.moe_skinny_max_pairs = path.skinny ? int64_t{1} << 40 : 0;
  t.moe_gemm_tile_rows = path.tile_rows;
  if (!path.one_cta_permute) t.moe_permute_one_cta_max_pairs = 0;
  t.moe_gemm_wgmma = path.wgmma;
  t.moe_combine_vec = path.combine_vec;
  t.moe_gemm_wgmma_tile64 = path.wgmma_tile64;
  t.moe_y_bf16 = path.y_bf16;
}

void RunMoe(Backend& gpu, WeightCache& weights, const MoeCase& c) {
  const int64_t t = c.tokens, h = c.hidden;
  const ExpertWeights& wts = WeightsFor(weights, gpu, c.experts, c.hidden, c.inter);
  auto x = RandomBf16(t * h);
  std::vector<int32_t> ids = RouteIds(c);
  std::vector<float> w(t * c.k);
  for (auto& v : w) v = std::uniform_real_distribution<float>(0.05f, 1.f)(Rng());
  Tensor cx = HostF32(x, {t, h}), cids = HostI32(ids, {t, c.k}), cw = HostF32(w, {t, c.k});
  Tensor cout = Tensor::Empty(DType::kF32, {t, h});
  cpu::MoeExperts(cx, cids, cw, wts.cpu_gate_up, wts.cpu_down, cout);
  const std::vector<float> ref(cout.ptr<float>(), cout.ptr<float>() + t * h);
  Tensor gx = Upload(gpu, x, {t, h}, DType::kBF16);
  Tensor gids = UploadI32(gpu, ids, {t, c.k}), gw = Upload(gpu, w, {t, c.k}, DType::kF32);
  // "mma tile 64" (and its y bf16 twin): the scalar combine must give the same bits.
  std::vector<float> tile64, tile64_bf16;
  for (const MoePath& path : kMoePaths) {
    Apply(path);
    Tensor gout = gpu.Empty(DType::kBF16, {t, h});
    Poison(gpu, gout);
    AttentionBatch step;
    step.max_q_len = path.prompt ? static_cast<int>(t) : 1;
    gpu.PlanStep(step, t);
    gpu.MoeExperts(gx, gids, gw, wts.gpu_gate_up, wts.gpu_down, gout);
    const std::vector<float> got = Download(gpu, gout);
    const double e = RelError(got, ref);
    const std::string shape = Name(c) + " " + path.name;
    Record("MoeExperts", shape, e, kBf16Tol);
    EXPECT_LT(e, kBf16Tol) << shape;
    const std::string name = path.name;
    if (name == "mma tile 64") tile64 = got;
    if (name == "mma tile 64 y bf16") tile64_bf16 = got;
    if (name == "mma tile 64 scalar combine" || name == "mma tile 64 y bf16 scalar combine") {
      const std::vector<float>& vec = path.y_bf16 ? tile64_bf16 : tile64;
      EXPECT_EQ(0, std::memcmp(got.data(), vec.data(), got.size() * sizeof(float)))
          << shape << ": the 16-byte and scalar combines differ";
    }
  }
  cuda::Tuning() = DefaultTuning();
}

TEST_F(CudaKernelTest, MoeExperts) {
  using R = Routing;
  const MoeCase cases[] = {
      // Decode sizes: 1, 2, 3-4, 5-8 and over 8 tokens per expert (the GEMV's passes).
      {1, 8, 2, 128, 64},
      {5, 16, 4, 128, 64},
      {3, 64, 8, 512, 136},
      {6, 8, 2, 256, 64, R::kOneExpert},
      {3, 8, 2, 200, 72, R::kOneExpert},
      {17, 8, 2, 136, 200, R::kOneExpert},
      // Mid sizes, one expert with every token.
      {130, 16, 4, 256, 192},
      {130, 8, 2, 256, 192, R::kOneExpert},
      {200, 4, 1, 128, 64, R::kOneExpert},
      // Qwen3-30B-A3B: decode 1, 64, 256; prefill 1000 (~62 rows per expert), 4096 (~256).
      {1, 128, 8, 2048, 768},
      {64, 128, 8, 2048, 768},
      {256, 128, 8, 2048, 768},
      {1000, 128, 8, 2048, 768},
      {4096, 128, 8, 2048, 768},
      // K and N off the tiles: H (gate_up K, down N) 136 / 200, I (gate_up N, down K) 72 / 200.
      {300, 16, 4, 136, 72},
      {300, 16, 4, 200, 200},
      {1000, 8, 2, 136, 200},
      {700, 8, 2, 200, 72},
      // Every row on one expert (k 1), 1000 and 4096 rows: many m-tiles of one expert.
      {1000, 8, 1, 256, 128, R::kOneExpert},
      {4096, 16, 1, 200, 72, R::kOneExpert},
      // Zero-row experts: only even experts of the upper half; slots of other ranks.
      {500, 64, 4, 256, 128, R::kSparse},
      {40, 128, 8, 256, 128, R::kSparse},
      {600, 32, 4, 136, 72, R::kOtherRanks},
      // wgmma shapes: K 7168 (DeepSeek-V3's hidden) with N 256; K 768 with gate_up N_w 1536
      // and down N 2048 (Down tiles of 256 over N 2048, and N 384 = 1.5 tiles: masked half);
      // E 8..128; rows not a multiple of 128; zero-row experts; one expert with every row.
      {300, 8, 2, 7168, 256},
      {600, 8, 2, 768, 768},
      {1500, 16, 2, 2048, 768},
      {700, 8, 2, 384, 192},
      {2000, 64, 4, 384, 128, R::kSparse},
      {1100, 8, 1, 768, 256, R::kOneExpert},
      {3000, 32, 4, 768, 2048},
      // Qwen3.5-397B-like routing: 512 experts, k 10 (~4 and ~40 rows per expert).
      {200, 512, 10, 512, 128},
      {2048, 512, 10, 512, 128},
  };
  WeightCache weights;
  for (const MoeCase& c : cases) RunMoe(gpu(), weights, c);
}

// MoePermute's one-CTA and chunked paths against the ids:
// expert e's rows are exactly its pairs (offsets from the host's counts, slot_row and perm_token
// inverse to each other), skipped ids get -1, the active list is the experts with rows in id order.
// Outputs poisoned first.
TEST_F(CudaKernelTest, MoePermute) {
  using R = Routing;
  const MoeCase cases[] = {
      {1, 8, 2, 0, 0},
      {100, 128, 8, 0, 0},
      {1024, 128, 8, 0, 0},
      {1025, 128, 8, 0, 0},
      {4096, 128, 8, 0, 0, R::kOneExpert},
      {3000, 64, 4, 0, 0, R::kSparse},
      {9000, 32, 4, 0, 0, R::kOtherRanks},
      {2048, 512, 10, 0, 0},
      {5000, 1024, 2, 0, 0},
      {700, 16, 1, 0, 0, R::kOneExpert},
  };
  cudaStream_t stream = static_cast<cuda::CudaBackend&>(gpu()).stream();
  for (const MoeCase& c : cases) {
    const int64_t pairs = c.tokens * c.k;
    const std::vector<int32_t> ids = RouteIds(c);
    std::vector<int64_t> count(c.experts, 0);
    for (int32_t e : ids)
      if (e >= 0 && e < c.experts) ++count[e];
    Tensor gids = UploadI32(gpu(), ids, {c.tokens, c.k});
    for (const bool one_cta : {true, false}) {
      if (one_cta && pairs > 8192) continue;
      const std::string name = Name(c) + (one_cta ? " one CTA" : " chunked");
      cuda::Tuning() = DefaultTuning();
      cuda::Tuning().moe_permute_one_cta_max_pairs = one_cta ? 8192 : 0;
      Tensor offsets = gpu().Empty(DType::kI32, {c.experts + 1});
      Tensor active = gpu().Empty(DType::kI32, {c.experts + 1});
      Tensor perm = gpu().Empty(DType::kI32, {pairs}), slot = gpu().Empty(DType::kI32, {pairs});
      Tensor scratch = gpu().Empty(
          DType::kI32, {std::max<int64_t>(1, cuda::MoePermuteScratchInts(pairs, c.experts))});
      for (Tensor* t : {&offsets, &active, &perm, &slot, &scratch}) Poison(gpu(), *t);
      cuda::MoePermute(
          gids.ptr<int32_t>(), c.k, c.tokens, c.k, c.experts,
          {offsets.ptr<int32_t>(), perm.ptr<int32_t>(), slot.ptr<int32_t>(), active.ptr<int32_t>()},
          scratch.ptr<int32_t>(), stream);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess) << name;
      const std::vector<int32_t> off = DownloadI32(gpu(), offsets),
                                 act = DownloadI32(gpu(), active);
      const std::vector<int32_t> pt = DownloadI32(gpu(), perm), sr = DownloadI32(gpu(), slot);
      int64_t rows = 0;
      std::vector<int32_t> want_active;
      bool ok = off[0] == 0;
      for (int e = 0; e < c.experts && ok; ++e) {
        ok = off[e + 1] - off[e] == count[e];
        if (count[e] > 0) want_active.push_back(e);
        rows += count[e];
      }
      ASSERT_TRUE(ok) << name << ": offsets differ from the counts";
      EXPECT_EQ(std::vector<int32_t>(act.begin(), act.begin() + want_active.size()), want_active)
          << name;
      EXPECT_EQ(act[c.experts], static_cast<int32_t>(want_active.size())) << name;
      std::vector<char> taken(rows, 0);
      for (int64_t i = 0; i < pairs; ++i) {
        const int32_t e = ids[i];
        if (e < 0 || e >= c.experts) {
          ASSERT_EQ(sr[i], -1) << name << ": skipped pair " << i;
          continue;
        }
        const int32_t r = sr[i];
        ASSERT_TRUE(r >= off[e] && r < off[e + 1])
            << name << ": pair " << i << " of expert " << e << " at row " << r;
        ASSERT_FALSE(taken[r]) << name << ": row " << r << " twice";
        taken[r] = 1;
        ASSERT_EQ(pt[r], i / c.k) << name << ": row " << r;
      }
    }
  }
  cuda::Tuning() = DefaultTuning();
}

// MoePermute's time at prompt sizes (E 128, k 8; random routing, and every token's slot 0 on one
// expert, as a prompt's shared context crowds its routing): one CTA against the chunked kernels,
// replayed in a graph (no launch gaps).
TEST(CudaPerf, MoePermute) {
  if (Gpu() == nullptr) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = *Gpu();
  cudaStream_t stream = static_cast<cuda::CudaBackend&>(gpu).stream();
  for (const Routing routing : {Routing::kRandom, Routing::kOneExpert}) {
    for (const int64_t tokens : {256, 512, 1024, 2048, 8192, 32768}) {
      const MoeCase c{tokens, 128, 8, 0, 0, routing};
      const int64_t pairs = tokens * c.k;
      Tensor gids = UploadI32(gpu, RouteIds(c), {tokens, c.k});
      Tensor meta = gpu.Empty(DType::kI32, {2 * (c.experts + 1) + 2 * pairs +
                                            cuda::MoePermuteScratchInts(pairs, c.experts)});
      int32_t* m = meta.ptr<int32_t>();
      const cuda::MoePermutation out{m, m + 2 * (c.experts + 1), m + 2 * (c.experts + 1) + pairs,
                                     m + c.experts + 1};
      std::printf("moe permute perf: %6lld tokens x 8, E 128%s:", static_cast<long long>(tokens),
                  routing == Routing::kOneExpert ? ", slot 0 on one expert" : "");
      for (const bool one_cta : {true, false}) {
        if (one_cta && pairs > 8192) continue;
        cuda::Tuning() = DefaultTuning();
        cuda::Tuning().moe_permute_one_cta_max_pairs = one_cta ? 8192 : 0;
        const double us = GraphUs(
            stream,
            [&] {
              cuda::MoePermute(gids.ptr<int32_t>(), c.k, tokens, c.k, c.experts, out,
                               m + 2 * (c.experts + 1) + 2 * pairs, stream);
            },
            20);
        std::printf(" %s %.2f us", one_cta ? "one CTA" : "chunked", us);
      }
      std::printf("\n");
    }
  }
  cuda::Tuning() = DefaultTuning();
}

// The tile heights GroupedGemmTileRows picks (Qwen3-30B-A3B's 128 experts, top 8): decode
// batches keep the 32-row tiles up to 16 rows an expert, a prompt's rows only up to 4.
TEST(GroupedGemmPlan, PromptsLeaveTheSmallTilesSooner) {
  cuda::Tuning() = DefaultTuning();
  // tokens, the decode batch's tile rows, the prompt's
  const std::tuple<int64_t, int, int> cases[] = {{8, 32, 32},     {64, 32, 32},  {65, 32, 64},
                                                 {256, 32, 64},   {257, 64, 64}, {1024, 64, 64},
                                                 {1025, 128, 128}};
  for (const auto& [tokens, decode, prompt] : cases) {
    EXPECT_EQ(cuda::GroupedGemmTileRows(tokens * 8, 128, false), decode) << tokens << " tokens";
    EXPECT_EQ(cuda::GroupedGemmTileRows(tokens * 8, 128, true), prompt) << tokens << " tokens";
  }
}

// One 64 x 256 x 64 wgmma tile (A by cp.async in the 128-byte swizzle, B by TMA) against a
// double-precision host product: a descriptor, swizzle or fragment-layout bug shows here alone.
// The first mismatching (row, column) is printed to tell which.
TEST_F(CudaKernelTest, WgmmaTileProbe) {
  cudaStream_t stream = static_cast<cuda::CudaBackend&>(gpu()).stream();
  // Row i of a has a spike at column i (plus noise), so a row or k permutation is visible.
  std::vector<float> a = RandomBf16(64 * 64, 0.25f), b = RandomBf16(256 * 64);
  for (int i = 0; i < 64; ++i) a[i * 64 + i] = 2.f;
  Tensor ga = Upload(gpu(), a, {64, 64}, DType::kBF16),
         gb = Upload(gpu(), b, {256, 64}, DType::kBF16);
  Tensor gc = gpu().Empty(DType::kF32, {64, 256});
  Poison(gpu(), gc);
  cuda::WgmmaTileProbe(ga, gb, gc, stream);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  const std::vector<float> c = Download(gpu(), gc);
  std::vector<float> ref(64 * 256);
  for (int m = 0; m < 64; ++m)
    for (int n = 0; n < 256; ++n) {
      double acc = 0;
      for (int k = 0; k < 64; ++k) acc += double(a[m * 64 + k]) * b[n * 64 + k];
      ref[m * 256 + n] = static_cast<float>(acc);
    }
  const double e = RelError(c, ref);
  Record("WgmmaTileProbe", "64x256x64", e, kF32Tol);
  EXPECT_LT(e, kF32Tol);
  for (int i = 0; i < 64 * 256; ++i)
    if (!(std::fabs(c[i] - ref[i]) <= 1e-3f * (1.f + std::fabs(ref[i])))) {
      ADD_FAILURE() << "first mismatch at row " << i / 256 << " column " << i % 256 << ": got "
                    << c[i] << ", expected " << ref[i];
      break;
    }
}

// The grouped GEMMs alone, wgmma against mma.sync at the same forced tile height (128, 64) on the
// same inputs: act (GateUp) and y (Down) over the rows offsets assign, outputs poisoned before
// each run. Expert counts of every kind: empty (leading, interleaved, trailing), 1 row, 63/64/65,
// 127/128/129, several m-tiles; E 8..128; K/N 2048/768 (Qwen3-30B-A3B), 768/2048, 7168/256,
// 384/128.
TEST_F(CudaKernelTest, GroupedGemmWgmma) {
  cudaStream_t stream = static_cast<cuda::CudaBackend&>(gpu()).stream();
  struct Case {
    int experts;
    int64_t hidden, inter;
  };
  // (E 128 at H 2048 / I 768 runs in MoeExperts against the CPU; here a smaller E 128.)
  for (const Case& c : {Case{8, 2048, 768}, Case{128, 512, 256}, Case{16, 768, 2048},
                        Case{8, 7168, 256}, Case{32, 384, 128}}) {
    std::vector<int32_t> counts(c.experts);
    const int32_t kinds[] = {0, 1, 127, 128, 129, 300, 0, 513, 64, 63, 65};
    for (int e = 0; e < c.experts; ++e) counts[e] = kinds[(e * 7 + c.experts) % 11];
    counts.back() = 0;
    counts[0] = 0;
    std::vector<int32_t> offsets(c.experts + 1, 0);
    for (int e = 0; e < c.experts; ++e) offsets[e + 1] = offsets[e] + counts[e];
    const int64_t rows = offsets.back(), tokens = std::max<int64_t>(1, rows / 3);
    std::vector<int32_t> perm(rows);
    for (auto& v : perm) v = static_cast<int32_t>(Rng()() % tokens);
    Tensor x = Upload(gpu(), RandomBf16(tokens * c.hidden), {tokens, c.hidden}, DType::kBF16);
    Tensor wgu = Upload(
        gpu(),
        RandomBf16(int64_t{c.experts} * 2 * c.inter * c.hidden, 1.f / std::sqrt(float(c.hidden))),
        {c.experts, 2 * c.inter, c.hidden}, DType::kBF16);
    Tensor wd = Upload(
        gpu(), RandomBf16(int64_t{c.experts} * c.hidden * c.inter, 1.f / std::sqrt(float(c.inter))),
        {c.experts, c.hidden, c.inter}, DType::kBF16);
    Tensor act_in = Upload(gpu(), RandomBf16(rows * c.inter), {rows, c.inter}, DType::kBF16);
    Tensor goff = UploadI32(gpu(), offsets, {c.experts + 1}),
           gperm = UploadI32(gpu(), perm, {rows});
    for (int tile : {128, 64}) {
      std::vector<float> act_out[2], y_out[2], y_bf16[2];
      for (int wgmma = 0; wgmma < 2; ++wgmma) {
        cuda::Tuning() = DefaultTuning();
        cuda::Tuning().moe_gemm_tile_rows = tile;
        cuda::Tuning().moe_gemm_wgmma = wgmma != 0;
        cuda::Tuning().moe_gemm_wgmma_tile64 = true;
        Tensor act = gpu().Empty(DType::kBF16, {rows, c.inter});
        Tensor y = gpu().Empty(DType::kF32, {rows, c.hidden});
        Tensor yb = gpu().Empty(DType::kBF16, {rows, c.hidden});
        Poison(gpu(), act);
        Poison(gpu(), y);
        Poison(gpu(), yb);
        cuda::GroupedGemmGateUp(x, gperm.ptr<int32_t>(), goff.ptr<int32_t>(), wgu, act, stream);
        cuda::GroupedGemmDown(act_in, goff.ptr<int32_t>(), wd, y, stream);
        cuda::GroupedGemmDown(act_in, goff.ptr<int32_t>(), wd, yb, stream);
        act_out[wgmma] = Download(gpu(), act);
        y_out[wgmma] = Download(gpu(), y);
        y_bf16[wgmma] = Download(gpu(), yb);
      }
      cuda::Tuning() = DefaultTuning();
      const std::string shape = "tile " + std::to_string(tile) + " E" + std::to_string(c.experts) +
                                " H" + std::to_string(c.hidden) + " I" + std::to_string(c.inter) +
                                " rows " + std::to_string(rows);
      const double e_act = RelError(act_out[1], act_out[0]), e_y = RelError(y_out[1], y_out[0]);
      Record("GroupedGemmWgmma gate_up vs mma", shape, e_act, kBf16Tol);
      Record("GroupedGemmWgmma down vs mma", shape, e_y, kBf16Tol);
      EXPECT_LT(e_act, kBf16Tol) << shape;
      EXPECT_LT(e_y, kBf16Tol) << shape;
      // y in bf16 is each kernel's f32 y rounded, bit for bit: the 16-byte stores of the quad
      // transpose put every value where the f32 pairs went.
      for (int wgmma = 0; wgmma < 2; ++wgmma) {
        int64_t bad = -1;
        for (size_t i = 0; i < y_out[wgmma].size() && bad < 0; ++i)
          if (ToFloat(ToBf16(y_out[wgmma][i])) != y_bf16[wgmma][i]) bad = static_cast<int64_t>(i);
        EXPECT_EQ(bad, -1) << shape << (wgmma ? " wgmma" : " mma") << ": y bf16 at row "
                           << bad / c.hidden << " column " << bad % c.hidden << " is "
                           << (bad < 0 ? 0.f : y_bf16[wgmma][bad]) << ", the f32 y "
                           << (bad < 0 ? 0.f : y_out[wgmma][bad]);
      }
    }
  }
}

// ---- perf ---------------------------------------------------------------------------------------
// A host buffer of n bf16 uniform in [-scale, scale]: a 64k-value random block repeated (fast
// to build for a billion values; the GEMMs do not care).
std::vector<bf16> PatternBf16(int64_t n, float scale) {
  static const std::vector<float> block = RandomBf16(1 << 16);
  std::vector<bf16> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = ToBf16(block[(i * 7919) % block.size()] * scale);
  return v;
}
Tensor DevicePattern(Backend& gpu, Shape shape, float scale) {
  Tensor t = gpu.Empty(DType::kBF16, shape);
  gpu.CopyFromHost(PatternBf16(t.numel(), scale).data(), t);
  return t;
}

// Qwen3-30B-A3B's experts (E 128, H 2048, I 768, k 8), uniform routing with exactly `tpe` rows
// per expert: the gate_up and down GEMMs alone at each tile height and the auto choice, then
// the whole MoeExperts op (default dispatch, and the GEMV and mma paths forced at decode sizes).
// Times are medians of event-timed launches on the backend's stream. Limits: 788 TFLOP/s (bf16
// matmul measured through cuBLASLt, notes/history.md, v2) and 4.28 TB/s (HBM copy); "roof" is the
// time those limits allow for the GEMM's FLOPs or its bytes (weights + activations read and
// written), whichever is larger, over the measured time.
TEST(CudaPerf, GroupedGemm) {
  if (Gpu() == nullptr) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = *Gpu();
  cudaStream_t stream = static_cast<cuda::CudaBackend&>(gpu).stream();
  constexpr double kPeakFlops = 788e12, kPeakBytes = 4.28e12;
  const int experts = 128, k = 8;
  const int64_t hidden = 2048, inter = 768;
  Tensor wgu = DevicePattern(gpu, {experts, 2 * inter, hidden}, 1.f / std::sqrt(float(hidden)));
  Tensor wd = DevicePattern(gpu, {experts, hidden, inter}, 1.f / std::sqrt(float(inter)));
  auto median_us = [&](const std::function<void()>& fn, int reps) {
    return MedianUs(stream, fn, reps);
  };
  std::printf(
      "grouped gemm perf: E %d H %ld I %ld k %d, uniform routing; limits %.0f TFLOP/s, %.2f TB/s\n",
      experts, static_cast<long>(hidden), static_cast<long>(inter), k, kPeakFlops / 1e12,
      kPeakBytes / 1e12);
  std::printf("grouped gemm perf: %5s %6s %6s | %-30s | %-30s\n", "tpe", "tokens", "tile",
              "gate_up us TFLOP/s wGB/s roof", "down us TFLOP/s wGB/s roof");
  for (int64_t tpe : {1, 4, 16, 64, 136, 256, 512, 2048}) {
    const int64_t rows = experts * tpe, tokens = rows / k;
    // Pair i = t k + s goes to expert i % E (k distinct experts per token); the j-th row of
    // expert e is pair j E + e.
    std::vector<int32_t> offsets(experts + 1), perm(rows), ids(rows);
    for (int e = 0; e <= experts; ++e) offsets[e] = static_cast<int32_t>(e * tpe);
    for (int64_t i = 0; i < rows; ++i) ids[i] = static_cast<int32_t>(i % experts);
    for (int e = 0; e < experts; ++e)
      for (int64_t j = 0; j < tpe; ++j)
        perm[e * tpe + j] = static_cast<int32_t>((j * experts + e) / k);
    Tensor goff = UploadI32(gpu, offsets, {experts + 1}), gperm = UploadI32(gpu, perm, {rows});
    Tensor gids = UploadI32(gpu, ids, {tokens, k});
    Tensor gw = Upload(gpu, std::vector<float>(rows, 1.f / k), {tokens, k}, DType::kF32);
    Tensor x = DevicePattern(gpu, {tokens, hidden}, 1.f);
    Tensor act = DevicePattern(gpu, {rows, inter}, 1.f);
    Tensor y = gpu.Empty(DType::kF32, {rows, hidden});
    Tensor out = gpu.Empty(DType::kBF16, {tokens, hidden});
    const double gu_flops = 2.0 * rows * 2 * inter * hidden,
                 down_flops = 2.0 * rows * hidden * inter;
    const double gu_wbytes = 2.0 * experts * 2 * inter * hidden,
                 down_wbytes = 2.0 * experts * hidden * inter;
    const double gu_bytes =
        gu_wbytes + 2.0 * rows * hidden + 2.0 * rows * inter;  // + x rows read, act written
    const double down_bytes = down_wbytes + 2.0 * rows * inter + 4.0 * rows * hidden;
    const int reps = tpe >= 136 ? 10 : 30;
    auto stats = [&](double us, double flops, double wbytes, double bytes) {
      const double roof = std::max(flops / kPeakFlops, bytes / kPeakBytes) * 1e6 / us;
      char buf[96];
      std::snprintf(buf, sizeof(buf), "%8.1f %7.1f %6.0f %4.0f%%", us, flops / us / 1e6,
                    wbytes / us / 1e3, 100 * roof);
      return std::string(buf);
    };
    // The tile the defaults run (as grouped_gemm.cu's WgmmaTileRows): the 64-row groups on the
    // 128-row wgmma tiles unless moe_gemm_wgmma_tile64.
    const cuda::KernelTuning def = DefaultTuning();
    const int auto_rows = cuda::GroupedGemmTileRows(rows, experts);
    const bool auto_wgmma = def.moe_gemm_wgmma && auto_rows >= 64;
    const int auto_tile =
        auto_wgmma && auto_rows == 64 && !def.moe_gemm_wgmma_tile64 ? 128 : auto_rows;
    double mma128_us[2] = {0, 0};  // gate_up, down of the 128-row mma.sync tiles
    for (int variant = 0; variant < 6; ++variant) {
      // 32, 64, 128 on mma.sync, then 128 and 64 on wgmma ("128w", "64w"), then 128 on wgmma in
      // the straight tile order ("128s").
      const int tile = variant == 3 || variant == 5 ? 128 : variant == 4 ? 64 : 32 << variant;
      const bool wgmma = variant >= 3, straight = variant == 5;
      if (straight && tpe < 64) continue;
      Apply({.name = "mma",
             .tile_rows = tile,
             .wgmma = wgmma,
             .wgmma_tile64 = true,
             .snake = !straight});
      const double gu_us = median_us(
          [&] {
            cuda::GroupedGemmGateUp(x, gperm.ptr<int32_t>(), goff.ptr<int32_t>(), wgu, act, stream);
          },
          reps);
      const double down_us =
          median_us([&] { cuda::GroupedGemmDown(act, goff.ptr<int32_t>(), wd, y, stream); }, reps);
      std::printf("grouped gemm perf: %5ld %6ld %4d%s%s | %s | %s\n", static_cast<long>(tpe),
                  static_cast<long>(tokens), tile,
                  straight ? "s"
                  : wgmma  ? "w"
                           : " ",
                  tile == auto_tile && wgmma == auto_wgmma && !straight ? "*" : " ",
                  stats(gu_us, gu_flops, gu_wbytes, gu_bytes).c_str(),
                  stats(down_us, down_flops, down_wbytes, down_bytes).c_str());
      if (tile == 128 && !wgmma) mma128_us[0] = gu_us, mma128_us[1] = down_us;
      if (wgmma && tile == 128 && !straight)
        std::printf(
            "grouped gemm perf: %5ld wgmma vs mma.sync (128-row tiles): gate_up %.2fx (%.0f%% of "
            "%.0f TFLOP/s), down %.2fx (%.0f%%)\n",
            static_cast<long>(tpe), mma128_us[0] / gu_us,
            100 * gu_flops / (gu_us * 1e-6) / kPeakFlops, kPeakFlops / 1e12, mma128_us[1] / down_us,
            100 * down_flops / (down_us * 1e-6) / kPeakFlops);
      const std::string key = "tpe" + std::to_string(tpe) + " tile" + std::to_string(tile) +
                              (straight ? "s"
                               : wgmma  ? "w"
                                        : "");
      Record("Perf.grouped_gemm_gate_up_us", key, gu_us, 0);
      Record("Perf.grouped_gemm_down_us", key, down_us, 0);
    }
    // The whole op (route ids given): permute + both GEMMs (or weight streams) + combine.
    const double op_flops = gu_flops + down_flops, op_wbytes = gu_wbytes + down_wbytes;
    auto op = [&](const MoePath& path) {
      Apply(path);
      const double us = median_us([&] { gpu.MoeExperts(x, gids, gw, wgu, wd, out); }, reps);
      std::printf(
          "grouped gemm perf: %5ld %6ld MoeExperts %-16s %9.1f us %7.1f TFLOP/s %6.0f weight GB/s "
          "(%.0f%% of %.2f TB/s)\n",
          static_cast<long>(tpe), static_cast<long>(tokens), path.name, us, op_flops / us / 1e6,
          op_wbytes / us / 1e3, 100 * op_wbytes * 1e6 / us / kPeakBytes, kPeakBytes / 1e12);
      Record(std::string("Perf.moe_experts_us ") + path.name, "tpe" + std::to_string(tpe), us, 0);
    };
    // The default and the straight order back to back and then once more in the other order:
    // at 512 and 2048 rows an expert the default measured 4-5% slower than the straight order in
    // three calls while the GEMMs alone ran faster in the snake order (session 33), which a
    // clock falling as the GPU heats up over the sweep would also explain.
    op({.name = "default", .dispatch = true});
    if (tpe >= 64) {
      op({.name = "straight order", .dispatch = true, .snake = false});
      op({.name = "straight order again", .dispatch = true, .snake = false});
      op({.name = "default again", .dispatch = true});
    }
    if (tpe >= 512) op({.name = "mma.sync 128", .tile_rows = 128});  // the whole op without wgmma
    if (tpe >= 16 && tpe <= 64) {  // the wgmma tiles where mma.sync's 32/64-row tiles are chosen
      op({.name = "wgmma 64", .tile_rows = 64, .wgmma = true, .wgmma_tile64 = true});
      op({.name = "wgmma 128", .tile_rows = 128, .wgmma = true});
    }
    if (tpe <= 64) {  // the weight streams against the mma tiles chosen by rows
      op({.name = "streams", .skinny = true});
      op({.name = "mma", .tile_rows = 0});
    }
  }
  cuda::Tuning() = DefaultTuning();
}

// The grouped GEMMs on uneven routing like that of Qwen3-30B-A3B's mixed step with random
// weights (`bench prefill --context 1024 --batch 2 --decode-rows 128 --expert-load`: 17408 rows,
// the busiest expert ~830, every expert active): expert e of 128 gets rows in proportion to
// (r + 1)^-0.5 for its rank r = 37 e mod 128 (~820 down to ~73 rows), on the default 128-row wgmma
// tiles in the snake and the straight tile order.
TEST(CudaPerf, GroupedGemmSkewed) {
  if (Gpu() == nullptr) GTEST_SKIP() << "no CUDA device";
  Backend& gpu = *Gpu();
  cudaStream_t stream = static_cast<cuda::CudaBackend&>(gpu).stream();
  constexpr double kPeakFlops = 788e12;
  const int experts = 128;
  const int64_t hidden = 2048, inter = 768, rows = 17408, tokens = rows / 8;
  std::vector<double> weight(experts);
  double sum = 0;
  for (int e = 0; e < experts; ++e) sum += weight[e] = 1.0 / std::sqrt(1.0 + (37 * e) % experts);
  std::vector<int32_t> offsets(experts + 1, 0);
  for (int e = 0; e < experts; ++e)
    offsets[e + 1] = offsets[e] + static_cast<int32_t>(std::lround(rows * weight[e] / sum));
  offsets[experts] = static_cast<int32_t>(rows);  // the rounding's remainder to the last expert
  int64_t busiest = 0;
  for (int e = 0; e < experts; ++e)
    busiest = std::max<int64_t>(busiest, offsets[e + 1] - offsets[e]);
  std::vector<int32_t> perm(rows);
  for (int64_t i = 0; i < rows; ++i) perm[i] = static_cast<int32_t>((i * 7919) % tokens);
  Tensor wgu = DevicePattern(gpu, {experts, 2 * inter, hidden}, 1.f / std::sqrt(float(hidden)));
  Tensor wd = DevicePattern(gpu, {experts, hidden, inter}, 1.f / std::sqrt(float(inter)));
  Tensor goff = UploadI32(gpu, offsets, {experts + 1}), gperm = UploadI32(gpu, perm, {rows});
  Tensor x = DevicePattern(gpu, {tokens, hidden}, 1.f);
  Tensor act = DevicePattern(gpu, {rows, inter}, 1.f);
  Tensor y = gpu.Empty(DType::kBF16, {rows, hidden});
  const double gu_flops = 2.0 * rows * 2 * inter * hidden, down_flops = 2.0 * rows * hidden * inter;
  for (bool snake : {true, false}) {
    Apply({.name = "default", .dispatch = true, .snake = snake});
    const double gu_us = MedianUs(
        stream,
        [&] {
          cuda::GroupedGemmGateUp(x, gperm.ptr<int32_t>(), goff.ptr<int32_t>(), wgu, act, stream,
                                  true);
        },
        10);
    const double down_us = MedianUs(
        stream, [&] { cuda::GroupedGemmDown(act, goff.ptr<int32_t>(), wd, y, stream, true); }, 10);
    std::printf(
        "grouped gemm skewed: %ld rows, busiest expert %ld, %s order: gate_up %.1f us (%.0f%% of "
        "%.0f TFLOP/s), "
        "down %.1f us (%.0f%%)\n",
        static_cast<long>(rows), static_cast<long>(busiest), snake ? "snake" : "straight", gu_us,
        100 * gu_flops / (gu_us * 1e-6) / kPeakFlops, kPeakFlops / 1e12, down_us,
        100 * down_flops / (down_us * 1e-6) / kPeakFlops);
    Record("Perf.grouped_gemm_skewed_us", snake ? "gate_up snake" : "gate_up straight", gu_us, 0);
    Record("Perf.grouped_gemm_skewed_us", snake ? "down snake" : "down straight", down_us, 0);
  }
  cuda::Tuning() = DefaultTuning();
}

}  // namespace
}  // namespace corolla::cuda_test
