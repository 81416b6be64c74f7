// Grouped GEMMs of MoeExperts on bf16 tensor cores: mma.sync.m16n8k16 with fp32 accumulation,
// ldmatrix fragment loads, a kStages-deep cp.async shared-memory pipeline.
//
// Work. Rows of expert e are [offsets[e], offsets[e + 1]) of the permuted order. A tile is kBM
// rows of one expert times kBN rows of that expert's weight W [N_w, K] (row-major), over all
// of K in 64-wide k-blocks. GateUp: the kBN weight rows of a tile are kBN/2 gate rows n and the
// kBN/2 matching up rows I + n, and every warp holds the gate and up accumulators of the same
// columns, so the epilogue writes silu(g) * u (bf16) from registers. Down writes y in f32, or in
// bf16 as 16-byte stores through a quad transpose of the fragments (common.cuh).
//
// Scheduling: a persistent grid (SMs x resident CTAs, capped by a bound on the tile count). A
// CTA turns offsets into each expert's first m-tile in shared memory (one warp scan over E),
// then takes tiles blockIdx.x, + gridDim.x, ... in (m-tile, n-tile) order, n fastest, so the
// CTAs running together share the A rows of an m-tile and one expert's weights in L2. Why not
// the bound grid with early exit: the tile height differs per launch (the permutation gives
// row offsets only), the count-free bound (TK / kBM + E) x n-tiles is mostly empty CTAs
// at decode sizes (E 512), and one CTA's pipeline runs on across its tiles: the loads of the
// next tile are issued while the last k-blocks of the current one compute.
//
// Shared memory: kStages x ([kBM][64] A + [kBN][64] B) bf16, 128-byte rows whose 16-byte
// chunk c sits at chunk c ^ (row % 8). An ldmatrix phase reads one chunk of 8 consecutive rows
// and a cp.async phase (8 threads) writes the 8 chunks of one row: both touch 8 distinct
// 16-byte bank groups, so neither conflicts. Loads past the expert's rows, past N or past K
// are cp.async zero-fills (K and N are multiples of 8, so a 16-byte chunk is all in or out).
#include <algorithm>
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_gemm_schedule.cuh"
#include "kernels/cuda/ops.h"

namespace corolla::cuda {
namespace {

// ---- the one table of tile configurations ---------------------------------------------------
template <int kBM_, int kBN_, int kWarpsM_, int kWarpsN_, int kStages_, int kMinBlocks_>
struct GemmConfig {
  static constexpr int kBM = kBM_, kBN = kBN_, kBK = 64, kStages = kStages_;
  static constexpr int kWarpsM = kWarpsM_, kWarpsN = kWarpsN_, kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kMinBlocks = kMinBlocks_;  // __launch_bounds__: resident CTAs per SM
  static constexpr int kWM = kBM / kWarpsM, kWN = kBN / kWarpsN;  // warp tile
  static constexpr int kMT = kWM / 16, kNT = kWN / 8;             // m16 x n8 mma tiles per warp
  static constexpr int kRowBytes = kBK * 2;
  static constexpr int kStageBytes = (kBM + kBN) * kRowBytes;
  static constexpr int kPipeBytes = kStages * kStageBytes;
  // One pass of 16-byte cp.async chunks (8 per row) over the CTA covers kRowsPerPass rows.
  static constexpr int kRowsPerPass = kThreads / 8;
  static constexpr int kAPasses = (kBM + kRowsPerPass - 1) / kRowsPerPass,
                       kBPasses = kBN / kRowsPerPass;
  static_assert(kWM % 16 == 0 && kWN % 32 == 0,
                "warp tile: whole m16 tiles, gate/up halves of whole ldmatrix pairs");
  static_assert(kBN % (2 * kRowsPerPass) == 0,
                "the gate and up halves of B fill whole load passes");
  static_assert(kRowsPerPass % 8 == 0, "a thread's swizzle (row % 8) is the same in every pass");
};
// Decode-like groups (a few rows per expert): the weights are the bytes; two CTAs per SM keep
// 6 stages (~100 KB) of weight loads in flight. Mid-size groups: 64-row tiles. Prefill-like:
// 128 x 256 tiles, warp tile 64 x 64 (the least shared-memory traffic per mma of the three).
using SmallTiles = GemmConfig<32, 128, 2, 4, 4, 2>;   // 80 KB pipeline
using MediumTiles = GemmConfig<64, 128, 2, 4, 4, 2>;  // 96 KB
using LargeTiles = GemmConfig<128, 256, 2, 4, 4, 1>;  // 192 KB

struct GemmParams {
  const bf16_t* a;  // GateUp: x [T, K], row perm_token[r]; Down: act [TK, K], row r
  int64_t a_stride;
  const int32_t* perm_token;  // GateUp only
  const bf16_t* w;         // [E, N_w, K]: GateUp N_w = 2N (gate rows, then up rows); Down N_w = N
  void* out;               // GateUp: act [TK, N] bf16; Down: y [TK, N] f32, or bf16 (out_bf16)
  const int32_t* offsets;  // [E + 1]
  int experts, n, k;
  bool out_bf16;  // Down: y in bf16
};

// ---- PTX wrappers (the loads and swizzle in grouped_gemm_schedule.cuh) ---------------------
// d += a b: a 16x16 row-major, b 16x8 "col" (its columns are rows of W: k contiguous), f32 d.
// Registers only, so not volatile: the compiler may interleave it with the next ldmatrix.
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2]) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
// ---- tile schedule (grouped_gemm_schedule.cuh) ------------------------------------------------
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

// ---- loads ----------------------------------------------------------------------------------
// Thread t copies 16-byte chunk t % 8 of tile rows t / 8 + i kRowsPerPass (i < passes), the
// same rows in every k-block of a tile: their global row pointers are set once per tile. The
// next tile's coordinates and gathered A rows (perm_token) are fetched a whole tile ahead, so
// switching tiles inside the pipeline waits on no global load.
template <class Cfg, bool kGateUp>
struct TileLoader {
  // This thread's chunk of each A / B row it copies; null: zero fill.
  const bf16_t* a_row[Cfg::kAPasses];
  const bf16_t* b_row[Cfg::kBPasses];
  TileCoord next;               // the tile Seek moves to
  int next_src[Cfg::kAPasses];  // its A source rows (-1: past the expert's rows)

  template <int kNPerTile>
  __device__ __forceinline__ void Prefetch(const GemmParams& p, const Schedule& sch, int tile) {
    next = Locate<Cfg::kBM, kNPerTile>(sch, tile);
#pragma unroll
    for (int i = 0; i < Cfg::kAPasses; ++i) {
      const int r = threadIdx.x / 8 + i * Cfg::kRowsPerPass;
      next_src[i] = r >= next.rows ? -1
                    : kGateUp      ? p.perm_token[next.row_begin + r]
                                   : next.row_begin + r;
    }
  }

  __device__ __forceinline__ void Seek(const GemmParams& p) {
    const int chunk = threadIdx.x % 8, row0 = threadIdx.x / 8;
#pragma unroll
    for (int i = 0; i < Cfg::kAPasses; ++i)
      a_row[i] = next_src[i] < 0 ? nullptr
                                 : p.a + static_cast<int64_t>(next_src[i]) * p.a_stride + chunk * 8;
    const bf16_t* w = p.w + static_cast<int64_t>(next.expert) * (kGateUp ? 2 : 1) * p.n * p.k;
#pragma unroll
    for (int i = 0; i < Cfg::kBPasses; ++i) {
      const int j = row0 + i * Cfg::kRowsPerPass;  // B tile row
      // GateUp: rows [0, kBN/2) are gate rows n0 + j, the rest the up rows N + n0 + j - kBN/2.
      const bool up = kGateUp && i >= Cfg::kBPasses / 2;
      const int n = next.n0 + (up ? j - Cfg::kBN / 2 : j);
      b_row[i] = n < p.n ? w + static_cast<int64_t>(up ? p.n + n : n) * p.k + chunk * 8 : nullptr;
    }
  }

  // Copies k-block kb of the current tile into the stage at shared address `stage`.
  __device__ __forceinline__ void Load(const GemmParams& p, uint32_t stage, int kb) const {
    const int chunk = threadIdx.x % 8, row0 = threadIdx.x / 8;
    const int k = kb * Cfg::kBK;
    const bool k_ok = k + chunk * 8 < p.k;
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
      CpAsync16(stage_b + Swizzled(row0 + i * Cfg::kRowsPerPass, chunk), ok ? b_row[i] + k : p.w,
                ok);
    }
  }
};

// ---- the kernel -------------------------------------------------------------------------------
// Smem row of the first weight row of n8-tile nt of warp column wn. GateUp: the warp's kNT / 2
// gate tiles, then its kNT / 2 up tiles, which cover the same output columns.
template <class Cfg, bool kGateUp>
__device__ __forceinline__ int BTileRow(int wn, int nt) {
  if constexpr (kGateUp) {
    constexpr int kHalf = Cfg::kNT / 2;
    return nt < kHalf ? wn * (Cfg::kWN / 2) + 8 * nt
                      : Cfg::kBN / 2 + wn * (Cfg::kWN / 2) + 8 * (nt - kHalf);
  } else {
    return wn * Cfg::kWN + 8 * nt;
  }
}

template <class Cfg, bool kGateUp>
__global__ void __launch_bounds__(Cfg::kThreads, Cfg::kMinBlocks)
    GroupedMmaKernel(const __grid_constant__ GemmParams p) {
  constexpr int kMT = Cfg::kMT, kNT = Cfg::kNT;
  constexpr int kNPerTile = kGateUp ? Cfg::kBN / 2 : Cfg::kBN;  // output columns per tile
  extern __shared__ __align__(128) unsigned char gemm_smem[];
  int32_t* s_offsets = reinterpret_cast<int32_t*>(gemm_smem + Cfg::kPipeBytes);  // [E + 1]
  int32_t* s_tile_start = s_offsets + p.experts + 1;                             // [E + 1]
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  for (int e = threadIdx.x; e <= p.experts; e += Cfg::kThreads) s_offsets[e] = p.offsets[e];
  __syncthreads();
  if (warp == 0) ScanTiles<Cfg::kBM>(s_offsets, s_tile_start, p.experts, lane);
  __syncthreads();
  const Schedule sch{s_offsets, s_tile_start, p.experts, (p.n + kNPerTile - 1) / kNPerTile};
  const int num_tiles = s_tile_start[p.experts] * sch.n_tiles;
  if (static_cast<int>(blockIdx.x) >= num_tiles) return;
  const int k_blocks = (p.k + Cfg::kBK - 1) / Cfg::kBK;
  // This CTA's tiles: blockIdx.x + i gridDim.x < num_tiles.
  const int my_tiles = (num_tiles - 1 - blockIdx.x) / gridDim.x + 1;
  const int total_steps = my_tiles * k_blocks;
  const uint32_t pipe = SmemAddr(gemm_smem);

  // Producer side: (load_tile, load_kb) runs kStages - 1 k-blocks ahead of the math, across
  // tile boundaries.
  TileLoader<Cfg, kGateUp> loader;
  int load_tile = blockIdx.x, load_kb = 0;
  loader.template Prefetch<kNPerTile>(p, sch, load_tile);
  loader.Seek(p);
  if (load_tile + static_cast<int>(gridDim.x) < num_tiles)
    loader.template Prefetch<kNPerTile>(p, sch, load_tile + gridDim.x);
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
    CpAsyncCommit();  // always, so that group i holds step i's copies
  }

  const int wm = warp / Cfg::kWarpsN, wn = warp % Cfg::kWarpsN;
  float acc[kMT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  int tile = blockIdx.x, kb = 0, stage = 0;
  for (int step = 0; step < total_steps; ++step) {
    CpAsyncWait<Cfg::kStages - 2>();  // this thread's copies of step `step` have landed
    __syncthreads();                  // everyone's have; everyone is done with step - 1's stage
    {
      const int next = step + Cfg::kStages - 1;  // refills the stage step - 1 used
      if (next < total_steps) load_next(next % Cfg::kStages);
      CpAsyncCommit();
    }
    const uint32_t sa = pipe + stage * Cfg::kStageBytes, sb = sa + Cfg::kBM * Cfg::kRowBytes;
#pragma unroll
    for (int ks = 0; ks < Cfg::kBK / 16; ++ks) {
      // A fragments (m16 x k16, row-major): matrices 0..3 = (rows 0-7, k 0-7), (rows 8-15,
      // k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15) are exactly a0..a3 of mma.m16n8k16:
      // lane l gives the address of row l % 16, k chunk 2 ks + l / 16.
      uint32_t af[kMT][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
        LdMatrixX4(af[mt], sa + Swizzled(wm * Cfg::kWM + mt * 16 + lane % 16, 2 * ks + lane / 16));
      // B fragments: W is [N][K] row-major, so a non-transposed 8x8 ldmatrix of 8 W rows (n)
      // by 8 k gives lane l the pair k = 2 (l % 4) + {0, 1} of n = l / 4: that is b0 (k 0-7)
      // or b1 (k 8-15) of the "col" operand. One x4 covers n8-tiles nt, nt + 1: matrices
      // (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15); lane l gives
      // row l % 8 + 8 (l / 16), k chunk 2 ks + (l / 8) % 2.
      uint32_t bfrag[kNT][2];
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t r[4];
        LdMatrixX4(r, sb + Swizzled(BTileRow<Cfg, kGateUp>(wn, 2 * np) + lane % 8 + 8 * (lane / 16),
                                    2 * ks + (lane / 8) % 2));
        bfrag[2 * np][0] = r[0];
        bfrag[2 * np][1] = r[1];
        bfrag[2 * np + 1][0] = r[2];
        bfrag[2 * np + 1][1] = r[3];
      }
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) MmaBf16(acc[mt][nt], af[mt], bfrag[nt]);
    }
    if (++stage == Cfg::kStages) stage = 0;
    if (++kb < k_blocks) continue;

    // Epilogue of `tile`, from registers (grouped::MmaEpilogue).
    const TileCoord t = Locate<Cfg::kBM, kNPerTile>(sch, tile);
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
  }
  CpAsyncWait<0>();
}

// ---- host -------------------------------------------------------------------------------------
// Resident CTAs per SM of `kernel` with `smem` dynamic bytes; the last answer is cached per
// kernel (it changes only with E, through the schedule arrays).
int ResidentCtas(const void* kernel, int threads, size_t smem, std::atomic<uint64_t>& cache) {
  const uint64_t cached = cache.load(std::memory_order_relaxed);
  if (cached != 0 && (cached >> 32) == smem) return static_cast<int>(cached & 0xffffffffu);
  int blocks = 0;
  COROLLA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, smem));
  COROLLA_CHECK(blocks > 0) << "grouped gemm: no CTA of " << threads << " threads and " << smem
                            << " bytes of shared memory fits an SM";
  cache.store((static_cast<uint64_t>(smem) << 32) | static_cast<uint32_t>(blocks),
              std::memory_order_relaxed);
  return blocks;
}

template <class Cfg, bool kGateUp>
void Launch(const GemmParams& p, int64_t rows, cudaStream_t s) {
  const auto kernel = GroupedMmaKernel<Cfg, kGateUp>;
  int device = 0, sms = 0, max_smem = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  COROLLA_CUDA_CHECK(
      cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t smem = Cfg::kPipeBytes + 2 * sizeof(int32_t) * (p.experts + 1);
  COROLLA_CHECK(smem <= static_cast<size_t>(max_smem))
      << "grouped gemm: " << p.experts << " experts need " << smem
      << " bytes of shared memory, the device has " << max_smem;
  // Function attributes are per device: set once on each device this process launches on.
  static std::atomic<uint64_t> attrs_set{0};
  const uint64_t device_bit = uint64_t{1} << (device % 64);
  if (!(attrs_set.load(std::memory_order_acquire) & device_bit)) {
    COROLLA_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    COROLLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                            cudaSharedmemCarveoutMaxShared));
    attrs_set.fetch_or(device_bit, std::memory_order_acq_rel);
  }
  static std::atomic<uint64_t> occupancy_cache{0};
  const int per_sm =
      ResidentCtas(reinterpret_cast<const void*>(kernel), Cfg::kThreads, smem, occupancy_cache);
  constexpr int kNPerTile = kGateUp ? Cfg::kBN / 2 : Cfg::kBN;
  // At most ceil(rows / kBM) + min(E, rows) m-tiles (each non-empty expert adds one partial).
  const int64_t tile_bound = (CeilDiv(rows, Cfg::kBM) + std::min<int64_t>(p.experts, rows)) *
                             static_cast<int64_t>(CeilDiv(p.n, kNPerTile));
  const int grid =
      static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(tile_bound, int64_t{sms} * per_sm)));
  kernel<<<grid, Cfg::kThreads, smem, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

template <bool kGateUp>
void LaunchFor(int tile_rows, const GemmParams& p, int64_t rows, cudaStream_t s) {
  switch (tile_rows) {
    case SmallTiles::kBM:
      return Launch<SmallTiles, kGateUp>(p, rows, s);
    case MediumTiles::kBM:
      return Launch<MediumTiles, kGateUp>(p, rows, s);
    case LargeTiles::kBM:
      return Launch<LargeTiles, kGateUp>(p, rows, s);
  }
  COROLLA_CHECK(false) << "grouped gemm: no tile configuration of " << tile_rows
                       << " rows (32, 64, 128)";
}


}  // namespace

int GroupedGemmTileRows(int64_t rows, int experts, bool prompt) {
  if (const int forced = Tuning().moe_gemm_tile_rows) return forced;
  // Rows per expert that has any, if routing spreads them (all experts busy once rows >= E).
  // Above kSmallMaxRows the 64-row groups, which the wgmma kernels take as 128-row tiles
  // (WgmmaTileRows): routing is uneven within a prompt (its tokens' hidden states share their
  // context), and an expert's rows past a small tile cost another pass over its weights. On an
  // H200, Qwen3-30B-A3B prompts of 384 / 512 / 1024 tokens (24 / 32 / 64 rows an expert on
  // average) took 10.2 / 11.5 / 17.1 ms on the 128-row wgmma tiles against 14.4 / 16.3 / 25.8 on
  // the 32- and 64-row mma.sync ones. 16: decode batches spread their rows evenly (one token a
  // sequence), and at batch 256 (16 rows an expert) the 32-row tiles took 25.28 ms a step
  // against 25.64 on the 128-row tiles (batch 32: 16.85 vs 17.17). A prompt's rows (`prompt`)
  // leave the small tiles above 4 rows an expert: prompts of 128 / 256 tokens took 7.6 / 8.9 ms on
  // the 128-row tiles against 8.2 / 11.3 (64 tokens, 4 rows an expert, tied at 7.05).
  constexpr double kSmallMaxRows = 16, kPromptSmallMaxRows = 4;
  const double per_expert =
      static_cast<double>(rows) / std::max<int64_t>(1, std::min<int64_t>(experts, rows));
  const double small_max = prompt ? kPromptSmallMaxRows : kSmallMaxRows;
  return per_expert <= small_max ? SmallTiles::kBM
         : per_expert <= 64      ? MediumTiles::kBM
                                 : LargeTiles::kBM;
}

namespace {
// The wgmma tile height (grouped_gemm_wgmma.cu) for groups that GroupedGemmTileRows gives
// `tile_rows`, 0 for the mma.sync tiles: 128 for 128; for 64 the 128-row tiles (an expert's
// uneven share of rows still fits one tile), or the 64-row ones with moe_gemm_wgmma_tile64 (a
// forced 64 without it stays on mma.sync, which tests compare against).
int WgmmaTileRows(int tile_rows) {
  const KernelTuning& t = Tuning();
  if (!t.moe_gemm_wgmma) return 0;
  if (tile_rows == LargeTiles::kBM) return LargeTiles::kBM;
  if (tile_rows != MediumTiles::kBM) return 0;
  if (t.moe_gemm_wgmma_tile64) return MediumTiles::kBM;
  return t.moe_gemm_tile_rows == 0 ? LargeTiles::kBM : 0;
}
}  // namespace

void GroupedGemmGateUp(const TensorView& x, const int32_t* perm_token, const int32_t* offsets,
                       const TensorView& w_gate_up, const TensorView& act, cudaStream_t s,
                       bool prompt) {
  const int64_t rows = act.dim(0), inter = act.dim(1), hidden = x.dim(1);
  const int64_t x_stride = x.dim(0) > 1 ? x.strides[0] : hidden;
  COROLLA_CHECK(x.dtype == DType::kBF16 && w_gate_up.dtype == DType::kBF16 &&
                act.dtype == DType::kBF16 && x.rank() == 2 && x.strides[1] == 1 &&
                x_stride % 8 == 0 && Aligned16(x.data) && w_gate_up.rank() == 3 &&
                w_gate_up.is_contiguous() && Aligned16(w_gate_up.data) &&
                w_gate_up.dim(1) == 2 * inter && w_gate_up.dim(2) == hidden && act.rank() == 2 &&
                act.is_contiguous() && Aligned16(act.data) && hidden % 8 == 0 && inter % 8 == 0)
      << "grouped gemm gate_up: x " << x.ToString() << " w " << w_gate_up.ToString() << " act "
      << act.ToString();
  if (rows == 0) return;
  GemmParams p{x.ptr<bf16_t>(),
               x_stride,
               perm_token,
               w_gate_up.ptr<bf16_t>(),
               act.data,
               offsets,
               static_cast<int>(w_gate_up.dim(0)),
               static_cast<int>(inter),
               static_cast<int>(hidden),
               false};
  const int tile_rows = GroupedGemmTileRows(rows, p.experts, prompt);
  if (const int wg = WgmmaTileRows(tile_rows);
      wg != 0 && GroupedWgmmaFits(inter, hidden, p.experts))
    return GroupedWgmmaGateUp(wg, x, x_stride, perm_token, offsets, w_gate_up, act, s);
  LaunchFor<true>(tile_rows, p, rows, s);
}

void GroupedGemmDown(const TensorView& act, const int32_t* offsets, const TensorView& w_down,
                     const TensorView& y, cudaStream_t s, bool prompt) {
  const int64_t rows = act.dim(0), inter = act.dim(1), hidden = y.dim(1);
  COROLLA_CHECK(act.dtype == DType::kBF16 && w_down.dtype == DType::kBF16 &&
                (y.dtype == DType::kF32 || y.dtype == DType::kBF16) && act.rank() == 2 &&
                act.is_contiguous() && Aligned16(act.data) && w_down.rank() == 3 &&
                w_down.is_contiguous() && Aligned16(w_down.data) && w_down.dim(1) == hidden &&
                w_down.dim(2) == inter && y.rank() == 2 && y.is_contiguous() && Aligned16(y.data) &&
                y.dim(0) == rows && hidden % 8 == 0 && inter % 8 == 0)
      << "grouped gemm down: act " << act.ToString() << " w " << w_down.ToString() << " y "
      << y.ToString();
  if (rows == 0) return;
  GemmParams p{act.ptr<bf16_t>(),
               inter,
               nullptr,
               w_down.ptr<bf16_t>(),
               y.data,
               offsets,
               static_cast<int>(w_down.dim(0)),
               static_cast<int>(hidden),
               static_cast<int>(inter),
               y.dtype == DType::kBF16};
  const int tile_rows = GroupedGemmTileRows(rows, p.experts, prompt);
  if (const int wg = WgmmaTileRows(tile_rows);
      wg != 0 && GroupedWgmmaFits(hidden, inter, p.experts))
    return GroupedWgmmaDown(wg, act, offsets, w_down, y, s);
  LaunchFor<false>(tile_rows, p, rows, s);
}

}  // namespace corolla::cuda
