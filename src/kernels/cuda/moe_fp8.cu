// Backend::MoeExpertsFp8 on the GPU: routed experts with block-scaled e4m3 weights.
//   few pairs (tokens x k <= Tuning().moe_pair_gemv_max_pairs): the pair GEMVs of moe_decode.cu
//     over e4m3 weights (weight-only: x bf16, act f32);
//   more: permute (MoePermute), x quantised per token and 128-column group, grouped FP8 GEMM
//     gate_up with the SiLU-mul epilogue (act bf16), act quantised likewise, grouped FP8 GEMM
//     down (y f32), weighted combine.
// The grouped GEMM is grouped_gemm.cu's design (device schedule from the row offsets, persistent
// grid, kStages cp.async ring, 128-byte XOR-swizzled smem rows, ldmatrix) on FP8 tensor cores:
// mma.sync.m16n8k32 e4m3 x e4m3 -> f32. A 128-wide k-block of e4m3 is one 128-byte smem row,
// i.e. exactly one scale group of both operands: its four k32 mma steps accumulate into a
// temporary fragment, then acc += tmp * a_scale[row][kb] * w_scale[n / 128][kb]. The ldmatrix
// addressing is byte-for-byte the bf16 kernel's: an 8x8 b16 matrix is 8 rows of 16 e4m3, and
// lane l receives bytes 4 (l % 4) .. +3 of row l / 4, which is the m16n8k32 e4m3 A/B fragment
// layout (A: a0..a3 = (rows 0-7 | 8-15) x (k 0-15 | 16-31); B: b0, b1 = n l / 4, k 0-15 | 16-31).
// The 128-row tiles run on wgmma + TMA instead (moe_fp8_wgmma.cu) when Tuning().moe_fp8_wgmma is
// on and the shapes fit.
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_gemm_schedule.cuh"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/moe_fp8.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/ops.h"

namespace corolla::cuda {
namespace {

constexpr int kGroup = static_cast<int>(kFp8Block);

// ---- 1 x 128 quantisation ---------------------------------------------------------------------
// q [rows, K] e4m3 and scales [rows, ceil(K/128)] (row-major) from x [rows, K] bf16 (row stride
// ldx): one warp per (row, group), the math of fp8_gemm.cu's QuantizeFp8Kernel and the CPU twin
// (s = max(amax, 1e-4) / 448, IEEE x / s, e4m3 nearest even, saturating).
constexpr int kQuantWarps = 8;

struct QuantFp8Params {
  const bf16_t* x;
  int64_t ldx, rows, k, groups;
  uint8_t* q;
  float* scales;
};

__global__ void __launch_bounds__(kQuantWarps * 32) QuantizeRowsFp8Kernel(const __grid_constant__ QuantFp8Params p) {
  const int lane = threadIdx.x % 32;
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * kQuantWarps + threadIdx.x / 32;
  if (pair >= p.rows * p.groups) return;
  const int64_t t = pair / p.groups, g = pair % p.groups, k0 = g * kGroup;
  float v[kGroup / 32];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kGroup / 32; ++j) {
    const int64_t k = k0 + lane + 32 * j;
    v[j] = k < p.k ? __bfloat162float(p.x[t * p.ldx + k]) : 0.0f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  amax = WarpMax(amax);
  const float s = fmaxf(amax, kFp8MinAmax) / kFp8Max;
#pragma unroll
  for (int j = 0; j < kGroup / 32; ++j) {
    const int64_t k = k0 + lane + 32 * j;
    if (k < p.k) p.q[t * p.k + k] = __nv_cvt_float_to_fp8(v[j] / s, __NV_SATFINITE, __NV_E4M3);
  }
  if (lane == 0) p.scales[t * p.groups + g] = s;
}

void QuantizeRows(const bf16_t* x, int64_t ldx, int64_t rows, int64_t k, uint8_t* q, float* scales, cudaStream_t s) {
  if (rows == 0) return;
  const int64_t groups = CeilDiv(k, kGroup);
  QuantFp8Params p{x, ldx, rows, k, groups, q, scales};
  QuantizeRowsFp8Kernel<<<CeilDiv(rows * groups, kQuantWarps), kQuantWarps * 32, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

// ---- the grouped FP8 GEMM ---------------------------------------------------------------------
template <int kBM_, int kBN_, int kWarpsM_, int kWarpsN_, int kStages_, int kMinBlocks_>
struct Fp8GemmConfig {
  static constexpr int kBM = kBM_, kBN = kBN_, kBK = 128, kStages = kStages_;  // kBK e4m3 = 128 bytes
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = kWarpsN_, kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kMinBlocks = kMinBlocks_;
  static constexpr int kWM = kBM / kWarpsM, kWN = kBN / kWarpsN;
  static constexpr int kMT = kWM / 16, kNT = kWN / 8;
  static constexpr int kRowBytes = kBK;
  static constexpr int kStageBytes = (kBM + kBN) * kRowBytes;
  static constexpr int kPipeBytes = kStages * kStageBytes;
  static constexpr int kRowsPerPass = kThreads / 8;
  static constexpr int kAPasses = (kBM + kRowsPerPass - 1) / kRowsPerPass, kBPasses = kBN / kRowsPerPass;
  static_assert(kWM % 16 == 0 && kWN % 32 == 0, "warp tile: whole m16 tiles, gate/up halves of whole ldmatrix pairs");
  static_assert(kBN % (2 * kRowsPerPass) == 0, "the gate and up halves of B fill whole load passes");
  static_assert(kRowsPerPass % 8 == 0, "a thread's swizzle (row % 8) is the same in every pass");
  static_assert(kBN <= kGroup, "a warp's n8 tiles each lie in one 128-row scale block");
};
// Each k-block needs a second accumulator set (tmp), so warp tiles are half the bf16 kernel's
// at the large size: 64 x 32 (64 + 64 f32 registers).
using Fp8SmallTiles = Fp8GemmConfig<32, 128, 2, 4, 4, 2>;   // 80 KB pipeline
using Fp8MediumTiles = Fp8GemmConfig<64, 128, 2, 4, 4, 1>;  // 96 KB (2 CTAs/SM: 128 registers spill)
using Fp8LargeTiles = Fp8GemmConfig<128, 128, 2, 4, 4, 1>;  // 128 KB

struct Fp8GemmParams {
  const uint8_t* a;  // GateUp: xq [T, K], row perm_token[r]; Down: actq [TK, K], row r (e4m3)
  int64_t a_stride;
  const float* a_scale;       // [rows of a, k_groups]
  const int32_t* perm_token;  // GateUp only
  const uint8_t* w;           // [E, N_w, K] e4m3: GateUp N_w = 2N (gate rows, then up rows)
  const float* w_scale;       // [E, scale_rows, k_groups]: GateUp scale_rows = 2 n_blocks
  void* out;                  // GateUp: act [TK, N] bf16; Down: y [TK, N] f32, or bf16 (out_bf16)
  const int32_t* offsets;     // [E + 1]
  int experts, n, k, n_blocks, k_groups;
  bool out_bf16;  // Down: y in bf16
};

// d += a b: a 16x32 e4m3 row-major, b 32x8 e4m3 "col" (rows of W, k contiguous), f32 d.
__device__ __forceinline__ void MmaFp8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The tile schedule, loads and swizzle of grouped_gemm.cu (grouped_gemm_schedule.cuh).
using grouped::CpAsync16;
using grouped::CpAsyncCommit;
using grouped::CpAsyncWait;
using grouped::LdMatrixX4;
using grouped::Locate;
using grouped::ScanTiles;
using grouped::Schedule;
using grouped::SmemAddr;
using grouped::Swizzled;
using grouped::TileCoord;

// Thread t copies 16-byte chunk t % 8 of tile rows t / 8 + i kRowsPerPass (see grouped_gemm.cu).
template <class Cfg, bool kGateUp>
struct TileLoader {
  const uint8_t* a_row[Cfg::kAPasses];
  const uint8_t* b_row[Cfg::kBPasses];
  TileCoord next;
  int next_src[Cfg::kAPasses];

  template <int kNPerTile>
  __device__ __forceinline__ void Prefetch(const Fp8GemmParams& p, const Schedule& sch, int tile) {
    next = Locate<Cfg::kBM, kNPerTile>(sch, tile);
#pragma unroll
    for (int i = 0; i < Cfg::kAPasses; ++i) {
      const int r = threadIdx.x / 8 + i * Cfg::kRowsPerPass;
      next_src[i] = r >= next.rows ? -1 : kGateUp ? p.perm_token[next.row_begin + r] : next.row_begin + r;
    }
  }

  __device__ __forceinline__ void Seek(const Fp8GemmParams& p) {
    const int chunk = threadIdx.x % 8, row0 = threadIdx.x / 8;
#pragma unroll
    for (int i = 0; i < Cfg::kAPasses; ++i)
      a_row[i] = next_src[i] < 0 ? nullptr : p.a + static_cast<int64_t>(next_src[i]) * p.a_stride + chunk * 16;
    const uint8_t* w = p.w + static_cast<int64_t>(next.expert) * (kGateUp ? 2 : 1) * p.n * p.k;
#pragma unroll
    for (int i = 0; i < Cfg::kBPasses; ++i) {
      const int j = row0 + i * Cfg::kRowsPerPass;
      const bool up = kGateUp && i >= Cfg::kBPasses / 2;
      const int n = next.n0 + (up ? j - Cfg::kBN / 2 : j);
      b_row[i] = n < p.n ? w + static_cast<int64_t>(up ? p.n + n : n) * p.k + chunk * 16 : nullptr;
    }
  }

  __device__ __forceinline__ void Load(const Fp8GemmParams& p, uint32_t stage, int kb) const {
    const int chunk = threadIdx.x % 8, row0 = threadIdx.x / 8;
    const int k = kb * Cfg::kBK;
    const bool k_ok = k + chunk * 16 < p.k;
#pragma unroll
    for (int i = 0; i < Cfg::kAPasses; ++i) {
      const int r = row0 + i * Cfg::kRowsPerPass;
      if constexpr (Cfg::kBM % Cfg::kRowsPerPass != 0)
        if (r >= Cfg::kBM) break;
      const bool ok = k_ok && a_row[i] != nullptr;
      CpAsync16(stage + Swizzled(r, chunk), ok ? a_row[i] + k : p.w, ok);
    }
    const uint32_t stage_b = stage + Cfg::kBM * Cfg::kRowBytes;
#pragma unroll
    for (int i = 0; i < Cfg::kBPasses; ++i) {
      const bool ok = k_ok && b_row[i] != nullptr;
      CpAsync16(stage_b + Swizzled(row0 + i * Cfg::kRowsPerPass, chunk), ok ? b_row[i] + k : p.w, ok);
    }
  }
};

template <class Cfg, bool kGateUp>
__device__ __forceinline__ int BTileRow(int wn, int nt) {
  if constexpr (kGateUp) {
    constexpr int kHalf = Cfg::kNT / 2;
    return nt < kHalf ? wn * (Cfg::kWN / 2) + 8 * nt : Cfg::kBN / 2 + wn * (Cfg::kWN / 2) + 8 * (nt - kHalf);
  } else {
    return wn * Cfg::kWN + 8 * nt;
  }
}

template <class Cfg, bool kGateUp>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    GroupedFp8MmaKernel(const __grid_constant__ Fp8GemmParams p) {
  constexpr int kMT = Cfg::kMT, kNT = Cfg::kNT;
  constexpr int kNPerTile = kGateUp ? Cfg::kBN / 2 : Cfg::kBN;
  extern __shared__ __align__(128) unsigned char fp8_gemm_smem[];
  int32_t* s_offsets = reinterpret_cast<int32_t*>(fp8_gemm_smem + Cfg::kPipeBytes);  // [E + 1]
  int32_t* s_tile_start = s_offsets + p.experts + 1;                                 // [E + 1]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int e = threadIdx.x; e <= p.experts; e += Cfg::kThreads) s_offsets[e] = p.offsets[e];
  __syncthreads();
  if (warp == 0) ScanTiles<Cfg::kBM>(s_offsets, s_tile_start, p.experts, lane);
  __syncthreads();
  const Schedule sch{s_offsets, s_tile_start, p.experts, (p.n + kNPerTile - 1) / kNPerTile};
  const int num_tiles = s_tile_start[p.experts] * sch.n_tiles;
  if (static_cast<int>(blockIdx.x) >= num_tiles) return;
  const int k_blocks = (p.k + Cfg::kBK - 1) / Cfg::kBK;
  const int my_tiles = (num_tiles - 1 - blockIdx.x) / gridDim.x + 1;
  const int total_steps = my_tiles * k_blocks;
  const uint32_t pipe = SmemAddr(fp8_gemm_smem);

  TileLoader<Cfg, kGateUp> loader;
  int load_tile = blockIdx.x, load_kb = 0;
  loader.template Prefetch<kNPerTile>(p, sch, load_tile);
  loader.Seek(p);
  if (load_tile + static_cast<int>(gridDim.x) < num_tiles) loader.template Prefetch<kNPerTile>(p, sch, load_tile + gridDim.x);
  auto load_next = [&](int stage) {
    loader.Load(p, pipe + stage * Cfg::kStageBytes, load_kb);
    if (++load_kb == k_blocks) {
      load_kb = 0;
      load_tile += gridDim.x;
      if (load_tile < num_tiles) {
        loader.Seek(p);
        if (load_tile + static_cast<int>(gridDim.x) < num_tiles)
          loader.template Prefetch<kNPerTile>(p, sch, load_tile + gridDim.x);
      }
    }
  };
#pragma unroll
  for (int s = 0; s < Cfg::kStages - 1; ++s) {
    if (s < total_steps) load_next(s);
    CpAsyncCommit();
  }

  const int wm = warp / Cfg::kWarpsN, wn = warp % Cfg::kWarpsN;
  float acc[kMT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  // Scale rows of the current tile: a_off[mt][h] = (A row of this thread's fragment row) *
  // k_groups, w_off[nt] = (expert's scale row of n8 tile nt) * k_groups.
  int a_off[kMT][2], w_off[kNT];
  TileCoord ct{};
  auto scale_rows = [&](int tile) {
    ct = Locate<Cfg::kBM, kNPerTile>(sch, tile);
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm * Cfg::kWM + mt * 16 + lane / 4 + 8 * h;
        // Rows past the expert's are computed from zeros and never written: any valid scale.
        const int src = r >= ct.rows ? 0 : kGateUp ? p.perm_token[ct.row_begin + r] : ct.row_begin + r;
        a_off[mt][h] = src * p.k_groups;
      }
    const int scale_rows_per_expert = (kGateUp ? 2 : 1) * p.n_blocks;
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) {
      const int j = BTileRow<Cfg, kGateUp>(wn, nt);  // B tile row of the n8 tile's first weight row
      const bool up = kGateUp && j >= Cfg::kBN / 2;
      const int n = min(ct.n0 + (up ? j - Cfg::kBN / 2 : j), p.n - 1);
      w_off[nt] = (ct.expert * scale_rows_per_expert + (up ? p.n_blocks : 0) + n / kGroup) * p.k_groups;
    }
  };

  int tile = blockIdx.x, kb = 0, stage = 0;
  scale_rows(tile);
  for (int step = 0; step < total_steps; ++step) {
    CpAsyncWait<Cfg::kStages - 2>();
    __syncthreads();
    {
      const int next = step + Cfg::kStages - 1;
      if (next < total_steps) load_next(next % Cfg::kStages);
      CpAsyncCommit();
    }
    // This k-block's scales (global, L1/L2-resident), loaded before the mma steps use them.
    float sa[kMT][2], sw[kNT];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h) sa[mt][h] = __ldg(p.a_scale + a_off[mt][h] + kb);
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt) sw[nt] = __ldg(p.w_scale + w_off[nt] + kb);

    float tmp[kMT][kNT][4];
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) tmp[mt][nt][i] = 0.f;
    const uint32_t sa_smem = pipe + stage * Cfg::kStageBytes, sb_smem = sa_smem + Cfg::kBM * Cfg::kRowBytes;
#pragma unroll
    for (int ks = 0; ks < Cfg::kBK / 32; ++ks) {
      // 32 e4m3 of k per step = 2 chunks of 16 bytes: the bf16 kernel's addressing.
      uint32_t af[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        LdMatrixX4(af[mt], sa_smem + Swizzled(wm * Cfg::kWM + mt * 16 + lane % 16, 2 * ks + lane / 16));
      uint32_t bfrag[kNT][2];
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t r[4];
        LdMatrixX4(r, sb_smem + Swizzled(BTileRow<Cfg, kGateUp>(wn, 2 * np) + lane % 8 + 8 * (lane / 16),
                                         2 * ks + (lane / 8) % 2));
        bfrag[2 * np][0] = r[0];
        bfrag[2 * np][1] = r[1];
        bfrag[2 * np + 1][0] = r[2];
        bfrag[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) MmaFp8(tmp[mt][nt], af[mt], bfrag[nt]);
    }
    // Accumulator i of an m16n8 tile: row lane / 4 + 8 (i / 2), column 2 (lane % 4) + i % 2.
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = fmaf(tmp[mt][nt][i], sa[mt][i / 2] * sw[nt], acc[mt][nt][i]);
    if (++stage == Cfg::kStages) stage = 0;
    if (++kb < k_blocks) continue;

    const TileCoord t = ct;
    grouped::MmaEpilogue<kGateUp>(acc, p.out, p.out_bf16, p.n, t, wm * Cfg::kWM,
                                  t.n0 + wn * (kGateUp ? Cfg::kWN / 2 : Cfg::kWN));
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;
    kb = 0;
    tile += gridDim.x;
    if (tile < num_tiles) scale_rows(tile);
  }
  CpAsyncWait<0>();
}

int ResidentCtas(const void* kernel, int threads, size_t smem, std::atomic<uint64_t>& cache) {
  const uint64_t cached = cache.load(std::memory_order_relaxed);
  if (cached != 0 && (cached >> 32) == smem) return static_cast<int>(cached & 0xffffffffu);
  int blocks = 0;
  COROLLA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem));
  COROLLA_CHECK(blocks > 0) << "grouped fp8 gemm: no CTA of " << threads << " threads and " << smem
                            << " bytes of shared memory fits an SM";
  cache.store((static_cast<uint64_t>(smem) << 32) | static_cast<uint32_t>(blocks), std::memory_order_relaxed);
  return blocks;
}

template <class Cfg, bool kGateUp>
void Launch(const Fp8GemmParams& p, int64_t rows, cudaStream_t s) {
  const auto kernel = GroupedFp8MmaKernel<Cfg, kGateUp>;
  int device = 0, sms = 0, max_smem = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t smem = Cfg::kPipeBytes + 2 * sizeof(int32_t) * (p.experts + 1);
  COROLLA_CHECK(smem <= static_cast<size_t>(max_smem))
      << "grouped fp8 gemm: " << p.experts << " experts need " << smem << " bytes of shared memory, the device has "
      << max_smem;
  static std::atomic<uint64_t> attrs_set{0};
  const uint64_t device_bit = uint64_t{1} << (device % 64);
  if (!(attrs_set.load(std::memory_order_acquire) & device_bit)) {
    COROLLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    COROLLA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
    attrs_set.fetch_or(device_bit, std::memory_order_acq_rel);
  }
  static std::atomic<uint64_t> occupancy_cache{0};
  const int per_sm = ResidentCtas(reinterpret_cast<const void*>(kernel), Cfg::kThreads, smem, occupancy_cache);
  constexpr int kNPerTile = kGateUp ? Cfg::kBN / 2 : Cfg::kBN;
  const int64_t tile_bound =
      (CeilDiv(rows, Cfg::kBM) + std::min<int64_t>(p.experts, rows)) * static_cast<int64_t>(CeilDiv(p.n, kNPerTile));
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(tile_bound, int64_t{sms} * per_sm)));
  kernel<<<grid, Cfg::kThreads, smem, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

// Whether the wgmma kernel (128-row tiles) takes a grouped GEMM whose rows GroupedGemmTileRows
// gives `tile_rows`: its 128-row tiles, and also the 64-row ones unless a test forces that
// height: on an H200 (E 256, H 7168, I 2048, 1024 tokens = 32 rows per expert) the wgmma tile
// ran the whole op in 3193 us against 6311 for the mma.sync 64-row tile.
bool TakesWgmma(int tile_rows) {
  if (!Tuning().moe_fp8_wgmma) return false;
  return tile_rows == Fp8LargeTiles::kBM || (tile_rows == Fp8MediumTiles::kBM && Tuning().moe_gemm_tile_rows == 0);
}

template <bool kGateUp>
void LaunchFor(int tile_rows, const Fp8GemmParams& p, int64_t rows, cudaStream_t s) {
  switch (tile_rows) {
    case Fp8SmallTiles::kBM:
      return Launch<Fp8SmallTiles, kGateUp>(p, rows, s);
    case Fp8MediumTiles::kBM:
      return Launch<Fp8MediumTiles, kGateUp>(p, rows, s);
    case Fp8LargeTiles::kBM:
      return Launch<Fp8LargeTiles, kGateUp>(p, rows, s);
  }
  COROLLA_CHECK(false) << "grouped fp8 gemm: no tile configuration of " << tile_rows << " rows (32, 64, 128)";
}

int64_t Round256(int64_t bytes) { return (bytes + 255) / 256 * 256; }

}  // namespace

bool MoeFp8Supports(int64_t hidden, int64_t inter) { return hidden % 16 == 0 && inter % 16 == 0; }

void GroupedGemmFp8GateUp(const uint8_t* xq, const float* xs, int64_t tokens_stride, const int32_t* perm_token,
                          const int32_t* offsets, const TensorView& w_gate_up, const TensorView& gu_scale,
                          const TensorView& act, cudaStream_t s) {
  const int64_t rows = act.dim(0), inter = act.dim(1), hidden = w_gate_up.dim(2);
  if (rows == 0) return;
  Fp8GemmParams p{xq,
                  tokens_stride,
                  xs,
                  perm_token,
                  w_gate_up.ptr<uint8_t>(),
                  gu_scale.ptr<float>(),
                  act.data,
                  offsets,
                  static_cast<int>(w_gate_up.dim(0)),
                  static_cast<int>(inter),
                  static_cast<int>(hidden),
                  CeilDiv(inter, kGroup),
                  CeilDiv(hidden, kGroup),
                  false};
  const int tile_rows = GroupedGemmTileRows(rows, p.experts);
  if (TakesWgmma(tile_rows) && GroupedFp8WgmmaFits(inter, hidden, p.experts))
    return GroupedFp8WgmmaGateUp(xq, xs, tokens_stride, perm_token, offsets, w_gate_up, gu_scale, act, s);
  LaunchFor<true>(tile_rows, p, rows, s);
}

void GroupedGemmFp8Down(const uint8_t* actq, const float* act_scale, const int32_t* offsets, const TensorView& w_down,
                        const TensorView& d_scale, const TensorView& y, cudaStream_t s) {
  const int64_t rows = y.dim(0), hidden = y.dim(1), inter = w_down.dim(2);
  if (rows == 0) return;
  Fp8GemmParams p{actq,
                  inter,
                  act_scale,
                  nullptr,
                  w_down.ptr<uint8_t>(),
                  d_scale.ptr<float>(),
                  y.data,
                  offsets,
                  static_cast<int>(w_down.dim(0)),
                  static_cast<int>(hidden),
                  static_cast<int>(inter),
                  CeilDiv(hidden, kGroup),
                  CeilDiv(inter, kGroup),
                  y.dtype == DType::kBF16};
  const int tile_rows = GroupedGemmTileRows(rows, p.experts);
  if (TakesWgmma(tile_rows) && GroupedFp8WgmmaFits(hidden, inter, p.experts))
    return GroupedFp8WgmmaDown(actq, act_scale, offsets, w_down, d_scale, y, s);
  LaunchFor<false>(tile_rows, p, rows, s);
}

void MoeExpertsFp8(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                   const TensorView& w_gate_up, const TensorView& gu_scale, const TensorView& w_down,
                   const TensorView& d_scale, const TensorView& out, CachingAllocator& alloc, cudaStream_t s) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  const int k = static_cast<int>(topk_ids.dim(1));
  const int experts = static_cast<int>(w_gate_up.dim(0));
  const int64_t inter = w_down.dim(2);
  const int64_t h_groups = CeilDiv(hidden, kGroup), i_groups = CeilDiv(inter, kGroup);
  COROLLA_CHECK(x.dtype == DType::kBF16 && out.dtype == DType::kBF16 && w_gate_up.dtype == DType::kF8E4M3 &&
                w_down.dtype == DType::kF8E4M3 && gu_scale.dtype == DType::kF32 && d_scale.dtype == DType::kF32 &&
                topk_ids.dtype == DType::kI32 && topk_weights.dtype == DType::kF32 && w_gate_up.is_contiguous() &&
                w_down.is_contiguous() && gu_scale.is_contiguous() && d_scale.is_contiguous() &&
                Aligned16(w_gate_up.data) && Aligned16(w_down.data) && x.strides[1] == 1 && out.strides[1] == 1 &&
                topk_ids.strides[1] == 1 && topk_weights.strides[1] == 1 && w_gate_up.rank() == 3 &&
                w_gate_up.dim(1) == 2 * inter && w_gate_up.dim(2) == hidden && w_down.rank() == 3 &&
                w_down.dim(0) == experts && w_down.dim(1) == hidden && gu_scale.rank() == 3 &&
                gu_scale.dim(0) == experts && gu_scale.dim(1) == 2 * i_groups && gu_scale.dim(2) == h_groups &&
                d_scale.rank() == 3 && d_scale.dim(0) == experts && d_scale.dim(1) == h_groups &&
                d_scale.dim(2) == i_groups && out.dim(0) == tokens && out.dim(1) == hidden &&
                topk_ids.dim(0) == tokens && topk_weights.dim(1) == k && MoeFp8Supports(hidden, inter) &&
                experts <= kMoePermuteMaxExperts && Aligned16(x.data) && (tokens <= 1 || x.strides[0] % 8 == 0))
      << "moe fp8 x " << x.ToString() << " ids " << topk_ids.ToString() << " gate_up " << w_gate_up.ToString()
      << " gu_scale " << gu_scale.ToString() << " down " << w_down.ToString() << " d_scale " << d_scale.ToString()
      << " out " << out.ToString();
  if (tokens == 0) return;
  const int64_t pairs = tokens * k;
  if (pairs <= Tuning().moe_pair_gemv_max_pairs) {  // weight-only regime (moe_decode.cu)
    MoeExpertsPairGemvFp8(x, topk_ids, topk_weights, w_gate_up, gu_scale, w_down, d_scale, out, alloc, s);
    return;
  }
  // One scratch block: offsets, perm, slot rows, the permutation's scratch | xq | xs | act bf16 |
  // actq | act scales | y.
  const int64_t meta_bytes = Round256(4 * ((experts + 1) + 2 * pairs + MoePermuteScratchInts(pairs, experts)));
  const int64_t xq_bytes = Round256(tokens * hidden), xs_bytes = Round256(tokens * h_groups * 4);
  const int64_t act_bytes = Round256(pairs * inter * 2), actq_bytes = Round256(pairs * inter);
  const bool y_bf16 = Tuning().moe_y_bf16;
  const int64_t as_bytes = Round256(pairs * i_groups * 4),
                y_bytes = pairs * hidden * (y_bf16 ? 2 : 4);
  ScratchBuffer scratch(alloc, meta_bytes + xq_bytes + xs_bytes + act_bytes + actq_bytes + as_bytes + y_bytes);
  char* base = scratch.as<char>();
  int32_t* offsets = reinterpret_cast<int32_t*>(base);
  int32_t* perm_token = offsets + experts + 1;
  int32_t* slot_row = perm_token + pairs;
  char* cur = base + meta_bytes;
  uint8_t* xq = reinterpret_cast<uint8_t*>(cur);
  cur += xq_bytes;
  float* xs = reinterpret_cast<float*>(cur);
  cur += xs_bytes;
  bf16_t* act = reinterpret_cast<bf16_t*>(cur);
  cur += act_bytes;
  uint8_t* actq = reinterpret_cast<uint8_t*>(cur);
  cur += actq_bytes;
  float* act_scale = reinterpret_cast<float*>(cur);
  cur += as_bytes;
  void* y = cur;

  MoePermute(topk_ids.ptr<int32_t>(), topk_ids.strides[0], tokens, k, experts,
             MoePermutation{offsets, perm_token, slot_row, nullptr}, slot_row + pairs, s);
  QuantizeRows(x.ptr<bf16_t>(), tokens > 1 ? x.strides[0] : hidden, tokens, hidden, xq, xs, s);

  const TensorView act_view(act, DType::kBF16, {pairs, inter}, Device::kCuda, x.device_idx);
  const DType y_dtype = y_bf16 ? DType::kBF16 : DType::kF32;
  const TensorView y_view(y, y_dtype, {pairs, hidden}, Device::kCuda, x.device_idx);
  GroupedGemmFp8GateUp(xq, xs, hidden, perm_token, offsets, w_gate_up, gu_scale, act_view, s);
  // Rows past offsets[E] (skipped ids) hold garbage act; their quantisation is never read.
  QuantizeRows(act, inter, pairs, inter, actq, act_scale, s);
  GroupedGemmFp8Down(actq, act_scale, offsets, w_down, d_scale, y_view, s);

  MoeCombine(y, y_dtype, slot_row, topk_weights, out, s);
}

}  // namespace corolla::cuda
