// The grouped GEMMs of MoeExperts for prefill-like groups (64- and 128-row tiles) on Hopper's
// wgmma, weights through TMA: same contract and device-side schedule as grouped_gemm.cu's mma.sync
// kernels (grouped_gemm_schedule.cuh), chosen by its launchers (grouped_gemm.h).
//
// Tile: kBM (64 or 128) rows of one expert x 256 weight rows, over all of K in 64-wide k-blocks.
// GateUp: the 256 weight rows are 128 gate rows n0.. and the 128 matching up rows N + n0.., so a
// consumer thread holds g and u of the same output columns and writes silu(g) * u (bf16) from
// registers. Down: 256 rows n0.. of W_down, y in f32 or bf16 (bf16: 16-byte stores through a quad
// transpose of the fragments; columns past N masked: N % 256 may be 128).
//
// Warp specialisation, 384 threads: warpgroups 0 and 1 are consumers, warpgroup 2 the producer.
// kBM 128: consumer wg takes tile rows 64 wg.. and all 256 weight rows (one m64n256k16 wgmma per
// k16 step, 128 f32 accumulators a thread). kBM 64 (Tuning().moe_gemm_wgmma_tile64: groups of
// 17-64 rows an expert, where the weights dominate): both consumers take the 64 rows, consumer wg
// the weight rows 128 wg.. (one m64n128k16, 64 accumulators); GateUp's stage then holds [gate 64,
// up 64, gate 64, up 64], so that each consumer's 128 rows are 64 gate rows and their up rows. Per
// k-block stage (a kStages-deep ring):
// - B [256][64] bf16: TMA boxes (64 K-columns x 128 rows, or x 64 rows for kBM 64; 128-byte
//   swizzle) over the weight tensor map [E * N_w, K], issued by producer thread 0 with expect_tx
//   on full[stage];
// - A [kBM][64] bf16: gathered rows (GateUp: x[perm_token[r]], Down: act[r]) by the 128
//   producer threads as 16-byte cp.async chunks written in the same swizzled layout (chunk c
//   of row r at c ^ (r % 8)); rows past the expert's end are zero-filled. cp.async writes are
//   generic-proxy writes: each producer thread waits for its copies of step s when it has
//   issued step s + kLag (cp.async.wait_group kLag), fences them to the async proxy, and only
//   then arrives on full[s] (count 128 + 1 for thread 0's expect_tx arrival).
// Consumers wait full[stage], issue 4 wgmmas, commit, and wait until at most one group is in
// flight: the previous k-block's stage is then free (one arrival per consumer warp, after its
// own wait, on empty[stage]: count 8); a consumer of a 128-row tile whose 64 rows all lie past
// the tile's last (Tuning().moe_gemm_wgmma_skip_idle) only waits and frees the stages. The
// producer waits empty[stage] before refilling it and runs ahead across tile boundaries, so the
// next tile's loads overlap this tile's epilogue.
// Persistent grid: one CTA per SM (~200 KB of shared memory), tiles in grouped::RoundTile's order.
// No setmaxnreg: 384 threads x 168 registers fit an SM, and the consumers need ~154 (128 of
// them accumulators).
#include <algorithm>
#include <atomic>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/grouped_gemm_schedule.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/tuning.h"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

using grouped::Locate;
using grouped::ScanTiles;
using grouped::Schedule;
using grouped::TileCoord;

constexpr int kBN = 256, kBK = 64;
constexpr int kLag = 2;  // producer: steps between issuing a k-block's A copies and signalling them
constexpr int kConsumers = 2;  // consumer warpgroups
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kProducerThreads = 128;
constexpr int kARowsPerPass = kProducerThreads / 8;  // 8 threads copy the 8 chunks of a row
constexpr uint32_t kBBytes = kBN * kBK * 2;
static_assert(kBK * 2 == 128, "a k-block is one 128-byte swizzle row");
static_assert(kARowsPerPass % 8 == 0, "a thread's swizzle (row % 8) is the same in every pass");

// The shapes that follow from the tile height.
template <int kBM>
struct Tile {
  static_assert(kBM == 64 || kBM == 128, "wgmma tiles are 64 or 128 rows");
  static constexpr int kStages = kBM == 128 ? 4 : 5;      // ~200 KB of ring either way
  static constexpr int kBoxRows = kBM == 128 ? 128 : 64;  // TMA box: kBK columns x kBoxRows rows
  static constexpr int kBoxes = kBN / kBoxRows;
  static constexpr int kAPasses = kBM / kARowsPerPass;
  // A consumer's weight rows (its wgmma's N) and its accumulators.
  static constexpr int kConsumerN = kBM == 128 ? kBN : kBN / kConsumers;
  static constexpr int kAcc = kConsumerN / 2;
  static constexpr uint32_t kABytes = kBM * kBK * 2;
  static constexpr uint32_t kStageBytes = kABytes + kBBytes;
  static constexpr uint32_t kPipeBytes = kStages * kStageBytes;
  static_assert(kABytes % 1024 == 0 && kStageBytes % 1024 == 0, "swizzled tiles stay 1024-aligned");
  // Consumers at step j need full[j], signalled once the producer has issued j + kLag, which
  // needs empty[j + kLag - kStages]: released by the consumers at step j + kLag - kStages + 1.
  static_assert(kLag >= 1 && kLag <= kStages - 2, "deadlock-free lag of the A signal");
};

// Dynamic shared memory: alignment slack, the stage ring, full/empty barriers, the schedule.
template <int kBM>
size_t SmemBytes(int experts) {
  return 1024 + Tile<kBM>::kPipeBytes + 2 * Tile<kBM>::kStages * sizeof(uint64_t) +
         2 * sizeof(int32_t) * (experts + 1);
}

struct WgmmaParams {
  CUtensorMap w_map;  // weights [E * N_w, K] bf16: box kBK x Tile::kBoxRows, 128-byte swizzle
  const bf16_t* a;    // GateUp: x [T, K], row perm_token[r]; Down: act [TK, K], row r
  int64_t a_stride;
  const int32_t* perm_token;  // GateUp only
  void* out;                  // GateUp: act [TK, N] bf16; Down: y [TK, N] f32, or bf16 (out_bf16)
  const int32_t* offsets;     // [E + 1]
  int experts, n, k;
  bool out_bf16;   // Down: y in bf16
  bool skip_idle;  // Tuning().moe_gemm_wgmma_skip_idle
  bool snake;      // Tuning().moe_gemm_snake: grouped::RoundTile's order
};

template <bool kGateUp, int kBM>
__device__ __forceinline__ void Produce(const WgmmaParams& p, const Schedule& sch, int num_tiles,
                                        int k_blocks, uint32_t pipe, uint32_t full,
                                        uint32_t empty) {
  using T = Tile<kBM>;
  constexpr int kNPerTile = kGateUp ? kBN / 2 : kBN, kAPasses = T::kAPasses;
  constexpr int kStages = T::kStages;
  const int t = threadIdx.x - kConsumers * 128;
  const int chunk = t % 8, row0 = t / 8;  // this thread's A rows: row0 + i kARowsPerPass
  int step = 0;                           // k-blocks issued so far (over all tiles)
  for (int rnd = 0, tile; (tile = grouped::RoundTile(rnd, p.snake)) < num_tiles; ++rnd) {
    const TileCoord tc = Locate<kBM, kNPerTile>(sch, tile);
    const bf16_t* a_row[kAPasses];  // null: past the expert's rows (zero fill)
#pragma unroll
    for (int i = 0; i < kAPasses; ++i) {
      const int r = row0 + i * kARowsPerPass;
      a_row[i] = nullptr;
      if (r < tc.rows) {
        const int64_t src = kGateUp ? p.perm_token[tc.row_begin + r] : tc.row_begin + r;
        a_row[i] = p.a + src * p.a_stride + chunk * 8;
      }
    }
    // The weight rows of box 0; box i starts `box_step` rows on (GateUp with 128-row boxes:
    // gate rows n0.. then up rows N + n0.. of expert e's [2N, K]; with 64-row boxes gate, up,
    // gate + 64, up + 64. Down: rows n0 + i kBoxRows of [N, K]; past N: masked in the
    // epilogue; past the last expert: TMA fills zeros).
    const int b_row0 = tc.expert * (kGateUp ? 2 * p.n : p.n) + tc.n0;
    for (int kb = 0; kb < k_blocks; ++kb, ++step) {
      const int stage = step % kStages;
      // The consumers' (step / kStages - 1)-th release of this stage.
      if (step >= kStages) wgmma::MbarWait(empty + 8 * stage, ((step / kStages) - 1) & 1);
      const uint32_t sa = pipe + stage * T::kStageBytes, sb = sa + T::kABytes,
                     bar = full + 8 * stage;
      if (t == 0) {
        wgmma::MbarArriveExpectTx(bar, kBBytes);
#pragma unroll
        for (int i = 0; i < T::kBoxes; ++i) {
          const int row =
              !kGateUp ? b_row0 + i * T::kBoxRows : b_row0 + (i % 2) * p.n + (i / 2) * T::kBoxRows;
          wgmma::TmaLoad2d(sb + i * T::kBoxRows * 128, &p.w_map, kb * kBK, row, bar);
        }
      }
#pragma unroll
      for (int i = 0; i < kAPasses; ++i)
        wgmma::CpAsync16(sa + wgmma::Sw128(row0 + i * kARowsPerPass, chunk),
                         a_row[i] != nullptr ? a_row[i] + kb * kBK : p.a, a_row[i] != nullptr);
      wgmma::CpAsyncCommit();
      if (step >= kLag) {  // step - kLag's copies have landed: hand them to the async proxy
        wgmma::CpAsyncWait<kLag>();
        wgmma::FenceProxyAsync();
        wgmma::MbarArrive(full + 8 * ((step - kLag) % kStages));
      }
    }
  }
  wgmma::CpAsyncWait<0>();
  wgmma::FenceProxyAsync();
  for (int s = max(0, step - kLag); s < step; ++s) wgmma::MbarArrive(full + 8 * (s % kStages));
}

template <bool kGateUp, int kBM>
__device__ __forceinline__ void Consume(const WgmmaParams& p, const Schedule& sch, int num_tiles,
                                        int k_blocks, uint32_t pipe, uint32_t full,
                                        uint32_t empty) {
  using T = Tile<kBM>;
  constexpr int kNPerTile = kGateUp ? kBN / 2 : kBN, kStages = T::kStages, kAcc = T::kAcc;
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  // This consumer's first tile row and (kBM 64) its weight rows' offset in the stage.
  const int row_off = kBM == 128 ? wg * 64 : 0;
  const uint32_t b_off = kBM == 128 ? 0 : wg * T::kConsumerN * 128;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.f;
  int step = 0;
  for (int rnd = 0, tile; (tile = grouped::RoundTile(rnd, p.snake)) < num_tiles; ++rnd) {
    const TileCoord tc = Locate<kBM, kNPerTile>(sch, tile);
    // kBM 128: a tile of at most 64 rows (an expert's rows past its whole tiles, or all of a
    // small expert's) leaves consumer 1 without rows. It keeps the ring's waits and arrivals but
    // issues no wgmma and stores nothing, so that consumer 0's wgmmas have the tensor cores.
    const bool idle = kBM == 128 && p.skip_idle && row_off >= tc.rows;
    for (int kb = 0; kb < k_blocks; ++kb, ++step) {
      const int stage = step % kStages;
      wgmma::MbarWait(full + 8 * stage, (step / kStages) & 1);
      if (idle) {
        if (kb > 0 && lane == 0) wgmma::MbarArrive(empty + 8 * ((step - 1) % kStages));
        continue;
      }
      const uint32_t sa = pipe + stage * T::kStageBytes;
      const uint64_t desc_a = wgmma::SmemDescSw128(sa + row_off * 128);
      const uint64_t desc_b = wgmma::SmemDescSw128(sa + T::kABytes + b_off);
      __syncwarp();  // converged after the divergent barrier spin and epilogue (.aligned below)
#pragma unroll
      for (int i = 0; i < kAcc; ++i) wgmma::FenceOperand(acc[i]);
      wgmma::Fence();
#pragma unroll
      for (int ks = 0; ks < kBK / 16; ++ks) {
        const uint64_t a = wgmma::DescAdvance(desc_a, 32 * ks),
                       b = wgmma::DescAdvance(desc_b, 32 * ks);
        if constexpr (kBM == 128)
          wgmma::MmaM64N256K16(acc, a, b, kb > 0 || ks > 0);
        else
          wgmma::MmaM64N128K16(acc, a, b, kb > 0 || ks > 0);
      }
      wgmma::Commit();
      wgmma::Wait<1>();  // the previous k-block's wgmmas are done: its stage is free
      if (kb > 0 && lane == 0) wgmma::MbarArrive(empty + 8 * ((step - 1) % kStages));
    }
    wgmma::Wait<0>();
#pragma unroll
    for (int i = 0; i < kAcc; ++i) wgmma::FenceOperand(acc[i]);
    if (lane == 0) wgmma::MbarArrive(empty + 8 * ((step - 1) % kStages));
    if (idle) continue;

    // Epilogue from registers: acc[4 j + 2 h + i] is tile row row_off + 16 warp + lane / 4 + 8 h,
    // column 8 j + 2 (lane % 4) + i of the consumer's kConsumerN weight rows (GateUp: j < kAcc /
    // 8 gate, j + kAcc / 8 the matching up; kBM 64: consumer wg's output columns start at
    // n0 + wg kConsumerN / 2 (GateUp) or n0 + wg kConsumerN (Down)).
    constexpr int kPairs = kAcc / 8;  // GateUp: (gate, up) column pairs of 8
    const int col0 = tc.n0 + (kBM == 128 ? 0 : wg * (kGateUp ? T::kConsumerN / 2 : T::kConsumerN));
    bf16_t* const out_bf16 = static_cast<bf16_t*>(p.out) + static_cast<int64_t>(tc.row_begin) * p.n;
    const int r0 = row_off + warp * 16 + lane / 4;
    if constexpr (kGateUp) {
      // silu(g) * u as bf16 pairs, a quad's four 4-byte stores filling 16 bytes of a row: the
      // quad transpose to 16-byte stores here made prompts slower (1k: 17.4 vs 16.1 ms on an
      // H200), where it made Down's y faster.
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h;
        if (r >= tc.rows) continue;
        bf16_t* out = out_bf16 + static_cast<int64_t>(r) * p.n;
#pragma unroll
        for (int j = 0; j < kPairs; ++j) {
          const int col = col0 + 8 * j + 2 * (lane % 4);  // N % 128 == 0: always < N
          const float g0 = acc[4 * j + 2 * h], g1 = acc[4 * j + 2 * h + 1];
          const float u0 = acc[4 * (j + kPairs) + 2 * h], u1 = acc[4 * (j + kPairs) + 2 * h + 1];
          *reinterpret_cast<__nv_bfloat162*>(out + col) =
              __floats2bfloat162_rn(g0 / (1.f + expf(-g0)) * u0, g1 / (1.f + expf(-g1)) * u1);
        }
      }
    } else if (p.out_bf16) {  // 16 bytes a lane (StoreFragmentBf16's quad transpose)
      StoreFragmentBf16<kAcc / 4>(out_bf16, p.n, tc.rows, r0, col0, [&](int j, int h) {
        return __floats2bfloat162_rn(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
      });
    } else {  // y in f32: a quad's float2 pairs fill a row's 32-byte sectors
      float* const out_f32 = static_cast<float*>(p.out) + static_cast<int64_t>(tc.row_begin) * p.n;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = r0 + 8 * h;
        if (r >= tc.rows) continue;
#pragma unroll
        for (int j = 0; j < kAcc / 4; ++j) {
          const int col = col0 + 8 * j + 2 * (lane % 4);
          if (col >= p.n) continue;
          *reinterpret_cast<float2*>(out_f32 + static_cast<int64_t>(r) * p.n + col) =
              make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
      }
    }
  }
}

template <bool kGateUp, int kBM>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedWgmmaKernel(const __grid_constant__ WgmmaParams p) {
  using T = Tile<kBM>;
  constexpr int kNPerTile = kGateUp ? kBN / 2 : kBN, kStages = T::kStages;
  // Declared 16-byte aligned so that the 1024-byte alignment is computed, not assumed.
  extern __shared__ __align__(16) unsigned char wgmma_smem[];
  const uint32_t base = wgmma::SmemAddr(wgmma_smem);
  const uint32_t pad = ((base + 1023) & ~1023u) - base;
  const uint32_t pipe = base + pad;
  const uint32_t full = pipe + T::kPipeBytes, empty = full + 8 * kStages;  // [kStages] each
  int32_t* s_offsets =
      reinterpret_cast<int32_t*>(wgmma_smem + pad + T::kPipeBytes + 16 * kStages);  // [E + 1]
  int32_t* s_tile_start = s_offsets + p.experts + 1;                                // [E + 1]

  for (int e = threadIdx.x; e <= p.experts; e += kThreads) s_offsets[e] = p.offsets[e];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      wgmma::MbarInit(full + 8 * s, kProducerThreads + 1);
      wgmma::MbarInit(empty + 8 * s, kConsumers * 4);
    }
    wgmma::MbarInitFence();
  }
  if (threadIdx.x == kConsumers * 128) wgmma::TmaPrefetchDescriptor(&p.w_map);
  __syncthreads();
  if (threadIdx.x < 32) ScanTiles<kBM>(s_offsets, s_tile_start, p.experts, threadIdx.x);
  __syncthreads();
  const Schedule sch{s_offsets, s_tile_start, p.experts, (p.n + kNPerTile - 1) / kNPerTile};
  const int num_tiles = s_tile_start[p.experts] * sch.n_tiles;
  const int k_blocks = p.k / kBK;
  if (threadIdx.x >= kConsumers * 128)
    Produce<kGateUp, kBM>(p, sch, num_tiles, k_blocks, pipe, full, empty);
  else
    Consume<kGateUp, kBM>(p, sch, num_tiles, k_blocks, pipe, full, empty);
}

// One 64 x 256 x 64 tile through the raw wrappers: A by cp.async into the swizzled layout, B by
// two TMA boxes, 4 wgmmas, c = a b^T from the fragment layout. CudaKernelTest.WgmmaTileProbe.
__global__ void __launch_bounds__(128, 1)
    WgmmaProbeKernel(const __grid_constant__ CUtensorMap b_map, const bf16_t* a, float* c) {
  extern __shared__ __align__(16) unsigned char probe_smem[];
  const uint32_t base = wgmma::SmemAddr(probe_smem);
  const uint32_t sa = (base + 1023) & ~1023u, sb = sa + 64 * 128, bar = sb + 256 * 128;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  if (t == 0) {
    wgmma::MbarInit(bar, 1);
    wgmma::MbarInitFence();
  }
  __syncthreads();
  if (t == 0) {
    wgmma::MbarArriveExpectTx(bar, 256 * 128);
    wgmma::TmaLoad2d(sb, &b_map, 0, 0, bar);
    wgmma::TmaLoad2d(sb + 128 * 128, &b_map, 0, 128, bar);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = t / 8 + 16 * i, chunk = t % 8;
    wgmma::CpAsync16(sa + wgmma::Sw128(r, chunk), a + r * 64 + chunk * 8, true);
  }
  wgmma::CpAsyncCommit();
  wgmma::CpAsyncWait<0>();
  wgmma::FenceProxyAsync();
  __syncthreads();
  wgmma::MbarWait(bar, 0);
  float acc[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) acc[i] = 0.f;
  const uint64_t desc_a = wgmma::SmemDescSw128(sa), desc_b = wgmma::SmemDescSw128(sb);
#pragma unroll
  for (int i = 0; i < 128; ++i) wgmma::FenceOperand(acc[i]);
  wgmma::Fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
    wgmma::MmaM64N256K16(acc, wgmma::DescAdvance(desc_a, 32 * ks),
                         wgmma::DescAdvance(desc_b, 32 * ks), ks > 0);
  wgmma::Commit();
  wgmma::Wait<0>();
#pragma unroll
  for (int i = 0; i < 128; ++i) wgmma::FenceOperand(acc[i]);
#pragma unroll
  for (int j = 0; j < 32; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * warp + lane / 4 + 8 * h, col = 8 * j + 2 * (lane % 4);
      c[row * 256 + col] = acc[4 * j + 2 * h];
      c[row * 256 + col + 1] = acc[4 * j + 2 * h + 1];
    }
}

// ---- host -------------------------------------------------------------------------------------
// The tensor map of a row-major bf16 matrix [rows, k] (k % 64 == 0, 16-byte aligned): box 64
// columns x box_rows rows, 128-byte swizzle, out-of-bounds boxes zero-filled. Cached
// (tensor_map.h): the maps of the expert weights are built once.
CUtensorMap WeightMap(const void* w, int64_t rows, int64_t k, int box_rows) {
  return TensorMap2dSw128(w, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rows, k, k * 2, kBK, box_rows,
                          "grouped gemm wgmma");
}

// Sets the kernel's shared-memory attributes once per device.
template <class Kernel>
void SetAttributesOnce(Kernel kernel, std::atomic<uint64_t>& set, int device, int max_smem) {
  const uint64_t device_bit = uint64_t{1} << (device % 64);
  if (set.load(std::memory_order_acquire) & device_bit) return;
  COROLLA_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
  set.fetch_or(device_bit, std::memory_order_acq_rel);
}

template <bool kGateUp, int kBM>
void LaunchWgmma(const WgmmaParams& p, int64_t rows, cudaStream_t s) {
  const auto kernel = GroupedWgmmaKernel<kGateUp, kBM>;
  int device = 0, sms = 0, max_smem = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  COROLLA_CUDA_CHECK(
      cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t smem = SmemBytes<kBM>(p.experts);
  COROLLA_CHECK(smem <= static_cast<size_t>(max_smem))
      << "grouped gemm wgmma: " << p.experts << " experts need " << smem
      << " bytes of shared memory, the device has " << max_smem;
  static std::atomic<uint64_t> attrs_set{0};
  SetAttributesOnce(kernel, attrs_set, device, max_smem);
  constexpr int kNPerTile = kGateUp ? kBN / 2 : kBN;
  // At most ceil(rows / kBM) + min(E, rows) m-tiles (each non-empty expert adds one partial).
  const int64_t tile_bound = (CeilDiv(rows, kBM) + std::min<int64_t>(p.experts, rows)) *
                             static_cast<int64_t>(CeilDiv(p.n, kNPerTile));
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(tile_bound, sms)));
  kernel<<<grid, kThreads, smem, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool GroupedWgmmaFits(int64_t n, int64_t k, int experts) {
  if (k % kBK != 0 || n % 128 != 0 || k <= 0 || n <= 0) return false;
  int device = 0, major = 0, max_smem = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  COROLLA_CUDA_CHECK(
      cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return major == 9 &&
         std::max(SmemBytes<64>(experts), SmemBytes<128>(experts)) <= static_cast<size_t>(max_smem);
}

void GroupedWgmmaGateUp(int tile_rows, const TensorView& x, int64_t x_stride,
                        const int32_t* perm_token, const int32_t* offsets,
                        const TensorView& w_gate_up, const TensorView& act, cudaStream_t s) {
  COROLLA_CHECK(tile_rows == 64 || tile_rows == 128)
      << "grouped gemm wgmma: tile rows " << tile_rows;
  const int64_t experts = w_gate_up.dim(0), inter = act.dim(1), hidden = x.dim(1);
  WgmmaParams p;
  p.w_map = WeightMap(w_gate_up.data, experts * 2 * inter, hidden, tile_rows);
  p.a = x.ptr<bf16_t>();
  p.a_stride = x_stride;
  p.perm_token = perm_token;
  p.out = act.data;
  p.offsets = offsets;
  p.experts = static_cast<int>(experts);
  p.n = static_cast<int>(inter);
  p.k = static_cast<int>(hidden);
  p.out_bf16 = false;  // act is always bf16
  p.skip_idle = Tuning().moe_gemm_wgmma_skip_idle;
  p.snake = Tuning().moe_gemm_snake;
  if (tile_rows == 64)
    LaunchWgmma<true, 64>(p, act.dim(0), s);
  else
    LaunchWgmma<true, 128>(p, act.dim(0), s);
}

void GroupedWgmmaDown(int tile_rows, const TensorView& act, const int32_t* offsets,
                      const TensorView& w_down, const TensorView& y, cudaStream_t s) {
  COROLLA_CHECK(tile_rows == 64 || tile_rows == 128)
      << "grouped gemm wgmma: tile rows " << tile_rows;
  const int64_t experts = w_down.dim(0), inter = act.dim(1), hidden = y.dim(1);
  WgmmaParams p;
  p.w_map = WeightMap(w_down.data, experts * hidden, inter, tile_rows);
  p.a = act.ptr<bf16_t>();
  p.a_stride = inter;
  p.perm_token = nullptr;
  p.out = y.data;
  p.offsets = offsets;
  p.experts = static_cast<int>(experts);
  p.n = static_cast<int>(hidden);
  p.k = static_cast<int>(inter);
  p.out_bf16 = y.dtype == DType::kBF16;
  p.skip_idle = Tuning().moe_gemm_wgmma_skip_idle;
  p.snake = Tuning().moe_gemm_snake;
  if (tile_rows == 64)
    LaunchWgmma<false, 64>(p, act.dim(0), s);
  else
    LaunchWgmma<false, 128>(p, act.dim(0), s);
}

void WgmmaTileProbe(const TensorView& a, const TensorView& b, const TensorView& c, cudaStream_t s) {
  COROLLA_CHECK(a.dtype == DType::kBF16 && b.dtype == DType::kBF16 && c.dtype == DType::kF32 &&
                a.rank() == 2 && a.dim(0) == 64 && a.dim(1) == 64 && a.is_contiguous() &&
                b.rank() == 2 && b.dim(0) == 256 && b.dim(1) == 64 && b.is_contiguous() &&
                c.rank() == 2 && c.dim(0) == 64 && c.dim(1) == 256 && c.is_contiguous() &&
                reinterpret_cast<uintptr_t>(a.data) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(b.data) % 16 == 0)
      << "wgmma tile probe: a " << a.ToString() << " b " << b.ToString() << " c " << c.ToString();
  const CUtensorMap map = WeightMap(b.data, 256, 64, 128);
  constexpr size_t kSmem = 1024 + 64 * 128 + 256 * 128 + 8;
  static std::atomic<uint64_t> attrs_set{0};
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  SetAttributesOnce(WgmmaProbeKernel, attrs_set, device, static_cast<int>(kSmem));
  WgmmaProbeKernel<<<1, 128, kSmem, s>>>(map, a.ptr<bf16_t>(), c.ptr<float>());
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace corolla::cuda
