// The grouped FP8 GEMMs of MoeExpertsFp8 for prefill-like groups (128-row tiles) on Hopper's
// wgmma, weights through TMA: same contract, device-side schedule and epilogues as moe_fp8.cu's
// mma.sync kernel (GroupedFp8MmaKernel), chosen by its launchers when Tuning().moe_fp8_wgmma is
// on; the pipeline and barrier protocol of grouped_gemm_wgmma.cu (the bf16 kernel).
//
// Tile: 128 rows of one expert x kBN weight rows (Tuning().moe_fp8_wgmma_tile_n: 128 or 256),
// over all of K in 128-wide k-blocks (128 e4m3 = one 128-byte swizzle row = one scale block of
// both operands). GateUp: kBN / 2 gate rows n0.. and the matching up rows N + n0.. (each half
// inside one 128-row scale block: n0 % (kBN / 2) == 0); Down: kBN rows n0.. of W_down (one or
// two scale blocks; columns past N masked).
//
// Scale promotion (DeepGEMM's): per k-block and n128 half of the tile, each consumer warpgroup
// runs its 4 k32 wgmmas (m64n128k32 e4m3) into a fresh f32 fragment tmp, waits for them, and
// adds tmp * a_scale[row][kb] * w_scale[block][kb] into acc (kBN 128: 64 + 64 f32 registers;
// kBN 256: 128 + 64, with setmaxnreg 232 for the consumers and 40 for the producer). The two
// consumer warpgroups alternate on the tensor cores, so one's promotion overlaps the other's
// wgmmas. The scales come from global (L1/L2-resident), loaded before the full-barrier wait.
//
// Warp specialisation, 384 threads: warpgroups 0 and 1 consume (tile rows 0-63 / 64-127),
// warpgroup 2 produces. Per k-block stage (ring of 6 x 32 KB at kBN 128, 4 x 48 KB at 256):
// - B [kBN][128] e4m3: kBN / 64 TMA boxes (128 K-bytes x 64 rows, 128-byte swizzle) over the
//   weight tensor map [E * N_w, K] (uint8), issued by producer thread 0 with expect_tx on
//   full[stage] (K past the end: zero fill);
// - A [128][128] e4m3: gathered rows (GateUp: xq[perm_token[r]], Down: actq[r]) as 16-byte
//   cp.async chunks in the swizzled layout; rows past the expert's end and chunks past K are
//   zero-filled; signalled kLag steps later after cp.async.wait_group + fence.proxy.async (as
//   the bf16 kernel), full count 128 + 1.
// The consumers release a stage (one arrival per consumer warp, empty count 8) right after their
// wait for its last wgmmas; the producer runs ahead across tiles.
#include <algorithm>
#include <atomic>

#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm_schedule.cuh"
#include "kernels/cuda/moe_fp8.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/tuning.h"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

using grouped::Locate;
using grouped::ScanTiles;
using grouped::Schedule;
using grouped::TileCoord;

constexpr int kBM = 128, kBK = 128;  // kBK e4m3 = 128 bytes
constexpr int kGroup = static_cast<int>(kFp8Block);
constexpr int kLag = 2;  // producer: steps between issuing a k-block's A copies and signalling them
constexpr int kBoxRows = 64;  // TMA box: 128 bytes of K x 64 weight rows
constexpr int kConsumers = 2;
constexpr int kThreads = 128 * (kConsumers + 1);
constexpr int kProducerThreads = 128;
constexpr int kARowsPerPass = kProducerThreads / 8;  // 8 threads copy the 8 chunks of a row
constexpr int kAPasses = kBM / kARowsPerPass;
constexpr uint32_t kABytes = kBM * kBK;
static_assert(kBK == kGroup, "a k-block is one scale block and one 128-byte swizzle row");
static_assert(kARowsPerPass % 8 == 0, "a thread's swizzle (row % 8) is the same in every pass");

// The tile width: 128 (acc 64 + tmp 64 registers, 6 stages of 32 KB) or 256 (two n128 halves in
// turn through one tmp: acc 128 + tmp 64 registers, which needs setmaxnreg: consumers 232,
// producer 40; 4 stages of 48 KB).
template <int kBN_>
struct Cfg {
  static constexpr int kBN = kBN_, kStages = kBN == 128 ? 6 : 4;
  static constexpr int kHalves = kBN / 128;  // m64n128k32 wgmma groups per k32 step
  static constexpr int kBoxes = kBN / kBoxRows;
  static constexpr uint32_t kBBytes = kBN * kBK, kStageBytes = kABytes + kBBytes;
  static constexpr uint32_t kPipeBytes = kStages * kStageBytes;
  static constexpr bool kSetMaxRegs = kBN == 256;
  static_assert(kBN == 128 || kBN == 256, "tile width");
  static_assert(kABytes % 1024 == 0 && kStageBytes % 1024 == 0 && (kBoxRows * 128) % 1024 == 0,
                "swizzled tiles stay 1024-aligned");
  // Consumers at step j need full[j], signalled once the producer has issued j + kLag, which
  // needs empty[j + kLag - kStages]: released by the consumers at step j + kLag - kStages (< j).
  static_assert(kLag >= 1 && kLag <= kStages - 1, "deadlock-free lag of the A signal");
};

template <int kBN>
size_t SmemBytes(int experts) {
  return 1024 + Cfg<kBN>::kPipeBytes + 2 * Cfg<kBN>::kStages * sizeof(uint64_t) +
         2 * sizeof(int32_t) * (experts + 1);
}

struct Fp8WgmmaParams {
  CUtensorMap w_map;  // weights [E * N_w, K] e4m3 (uint8): box 128 x kBoxRows, 128-byte swizzle
  const uint8_t* a;   // GateUp: xq [T, K], row perm_token[r]; Down: actq [TK, K], row r
  int64_t a_stride;
  const float* a_scale;       // [rows of a, k_groups]
  const int32_t* perm_token;  // GateUp only
  const float* w_scale;       // [E, scale_rows, k_groups]: GateUp scale_rows = 2 n_blocks
  void* out;                  // GateUp: act [TK, N] bf16; Down: y [TK, N] f32, or bf16 (out_bf16)
  const int32_t* offsets;     // [E + 1]
  int experts, n, k, n_blocks, k_groups;
  bool out_bf16;   // Down: y in bf16
  bool snake;      // Tuning().moe_gemm_snake: grouped::RoundTile's order
  bool skip_idle;  // Tuning().moe_gemm_wgmma_skip_idle
};

template <int kBN, bool kGateUp>
__device__ __forceinline__ void Produce(const Fp8WgmmaParams& p, const Schedule& sch, int num_tiles,
                                        int k_blocks, uint32_t pipe, uint32_t full,
                                        uint32_t empty) {
  using C = Cfg<kBN>;
  constexpr int kStages = C::kStages;
  constexpr int kNPerTile = kGateUp ? kBN / 2 : kBN;
  const int t = threadIdx.x - kConsumers * 128;
  const int chunk = t % 8, row0 = t / 8;  // this thread's A rows: row0 + i kARowsPerPass
  int step = 0;                           // k-blocks issued so far (over all tiles)
  for (int rnd = 0, tile; (tile = grouped::RoundTile(rnd, p.snake)) < num_tiles; ++rnd) {
    const TileCoord tc = Locate<kBM, kNPerTile>(sch, tile);
    const uint8_t* a_row[kAPasses];  // null: past the expert's rows (zero fill)
#pragma unroll
    for (int i = 0; i < kAPasses; ++i) {
      const int r = row0 + i * kARowsPerPass;
      a_row[i] = nullptr;
      if (r < tc.rows) {
        const int64_t src = kGateUp ? p.perm_token[tc.row_begin + r] : tc.row_begin + r;
        a_row[i] = p.a + src * p.a_stride + chunk * 16;
      }
    }
    // Box b's first weight row. GateUp: the first half of the boxes gate rows n0.., the second
    // the up rows N + n0.. of expert e's [2N, K]; Down: rows n0 + 64 b of [N, K] (past N: masked
    // in the epilogue; past the last expert: zero fill).
    const int b_row0 = tc.expert * (kGateUp ? 2 * p.n : p.n) + tc.n0;
    for (int kb = 0; kb < k_blocks; ++kb, ++step) {
      const int stage = step % kStages;
      if (step >= kStages) wgmma::MbarWait(empty + 8 * stage, ((step / kStages) - 1) & 1);
      const uint32_t sa = pipe + stage * C::kStageBytes, sb = sa + kABytes, bar = full + 8 * stage;
      if (t == 0) {
        wgmma::MbarArriveExpectTx(bar, C::kBBytes);
#pragma unroll
        for (int b = 0; b < C::kBoxes; ++b) {
          constexpr int kHalfBoxes = C::kBoxes / 2;
          const int row = kGateUp
                              ? b_row0 + (b >= kHalfBoxes ? p.n : 0) + kBoxRows * (b % kHalfBoxes)
                              : b_row0 + kBoxRows * b;
          wgmma::TmaLoad2d(sb + b * kBoxRows * 128, &p.w_map, kb * kBK, row, bar);
        }
      }
      const bool k_ok = kb * kBK + chunk * 16 < p.k;  // K % 16 == 0: a chunk is all in or out
#pragma unroll
      for (int i = 0; i < kAPasses; ++i) {
        const bool ok = k_ok && a_row[i] != nullptr;
        wgmma::CpAsync16(sa + wgmma::Sw128(row0 + i * kARowsPerPass, chunk),
                         ok ? a_row[i] + kb * kBK : p.a, ok);
      }
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

template <int kBN, bool kGateUp>
__device__ __forceinline__ void Consume(const Fp8WgmmaParams& p, const Schedule& sch, int num_tiles,
                                        int k_blocks, uint32_t pipe, uint32_t full,
                                        uint32_t empty) {
  using C = Cfg<kBN>;
  constexpr int kStages = C::kStages;
  constexpr int kNPerTile = kGateUp ? kBN / 2 : kBN;
  constexpr int kJ = kBN / 8;  // n8 column groups of the fragment
  const int wg = threadIdx.x / 128, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
  // acc[64 hh + 4 j + 2 h + i]: row h, column 128 hh + 8 j + 2 (lane % 4) + i (the m64nN fragment
  // layout); tmp: one n128 half's product of a k-block (the first k32 step overwrites it).
  float acc[kBN / 2], tmp[64];
#pragma unroll
  for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) tmp[i] = 0.f;
  int step = 0;
  for (int rnd = 0, tile; (tile = grouped::RoundTile(rnd, p.snake)) < num_tiles; ++rnd) {
    const TileCoord tc = Locate<kBM, kNPerTile>(sch, tile);
    // A tile of at most 64 rows leaves consumer 1 without rows: it only waits for and frees the
    // stages (Tuning().moe_gemm_wgmma_skip_idle, as the bf16 kernel); its acc stays zero.
    if (p.skip_idle && wg * 64 >= tc.rows) {
      for (int kb = 0; kb < k_blocks; ++kb, ++step) {
        const int stage = step % kStages;
        wgmma::MbarWait(full + 8 * stage, (step / kStages) & 1);
        __syncwarp();
        if (lane == 0) wgmma::MbarArrive(empty + 8 * stage);
      }
      continue;
    }
    // Scale rows of this thread's two fragment rows (rows past the expert's are computed from
    // zeros and never written: any valid scale) and of the tile's one or two weight blocks.
    const float* as[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wg * 64 + warp * 16 + lane / 4 + 8 * h;
      const int src = r >= tc.rows ? 0
                      : kGateUp    ? p.perm_token[tc.row_begin + r]
                                   : tc.row_begin + r;
      as[h] = p.a_scale + static_cast<int64_t>(src) * p.k_groups;
    }
    // ws0: the scale row of the gate half / of columns n0..n0 + 127; ws1: of the up half / of
    // columns n0 + 128.. (Down at kBN 256; clamped: past N they are masked) / ws0.
    const int blk = tc.n0 / kGroup;
    const float* ws0 =
        p.w_scale +
        static_cast<int64_t>(tc.expert * (kGateUp ? 2 : 1) * p.n_blocks + blk) * p.k_groups;
    const float* ws1 = kGateUp      ? ws0 + static_cast<int64_t>(p.n_blocks) * p.k_groups
                       : kBN == 256 ? ws0 + (blk + 1 < p.n_blocks ? p.k_groups : 0)
                                    : ws0;
    for (int kb = 0; kb < k_blocks; ++kb, ++step) {
      const int stage = step % kStages;
      const float sa0 = __ldg(as[0] + kb), sa1 = __ldg(as[1] + kb);
      const float sw0 = __ldg(ws0 + kb), sw1 = __ldg(ws1 + kb);
      wgmma::MbarWait(full + 8 * stage, (step / kStages) & 1);
      const uint32_t sa = pipe + stage * C::kStageBytes;
      const uint64_t desc_a = wgmma::SmemDescSw128(sa + wg * 64 * 128);  // this warpgroup's rows
      const float s00 = sa0 * sw0, s10 = sa1 * sw0, s01 = sa0 * sw1, s11 = sa1 * sw1;
#pragma unroll
      for (int hh = 0; hh < C::kHalves; ++hh) {
        const uint64_t desc_b = wgmma::SmemDescSw128(sa + kABytes + hh * 128 * 128);
        __syncwarp();  // converged after the divergent barrier spin and epilogue (.aligned below)
#pragma unroll
        for (int i = 0; i < 64; ++i) wgmma::FenceOperand(tmp[i]);
        wgmma::Fence();
#pragma unroll
        for (int ks = 0; ks < kBK / 32; ++ks)
          wgmma::MmaM64N128K32E4m3(tmp, wgmma::DescAdvance(desc_a, 32 * ks),
                                   wgmma::DescAdvance(desc_b, 32 * ks), ks > 0);
        wgmma::Commit();
        wgmma::Wait<0>();
#pragma unroll
        for (int i = 0; i < 64; ++i) wgmma::FenceOperand(tmp[i]);
        // This warp is done with the stage.
        if (hh == C::kHalves - 1 && lane == 0) wgmma::MbarArrive(empty + 8 * stage);
          // tmp[4 j + 2 h + i]: row h, column 128 hh + 8 j + 2 (lane % 4) + i. Its scale block: kBN
          // 128: GateUp j < 8 gate (ws0), else up (ws1), Down ws0; kBN 256: half hh's (ws0, ws1).
#pragma unroll
        for (int j = 0; j < 16; ++j) {
          const bool second = kBN == 128 ? kGateUp && j >= 8 : hh == 1;
          const float s0 = second ? s01 : s00, s1 = second ? s11 : s10;
          float* a = acc + 64 * hh + 4 * j;
          a[0] = fmaf(tmp[4 * j + 0], s0, a[0]);
          a[1] = fmaf(tmp[4 * j + 1], s0, a[1]);
          a[2] = fmaf(tmp[4 * j + 2], s1, a[2]);
          a[3] = fmaf(tmp[4 * j + 3], s1, a[3]);
        }
      }
    }

    // Epilogue from registers: acc[4 j + 2 h + i] is tile row 64 wg + 16 warp + lane / 4 + 8 h,
    // column 8 j + 2 (lane % 4) + i of the kBN (GateUp: j < kJ / 2 gate, j + kJ / 2 the matching
    // up). Down's bf16 y leaves 16 bytes a lane (StoreFragmentBf16's quad transpose).
    if (!kGateUp && p.out_bf16) {
      StoreFragmentBf16<kJ>(static_cast<bf16_t*>(p.out) + static_cast<int64_t>(tc.row_begin) * p.n,
                            p.n, tc.rows, wg * 64 + warp * 16 + lane / 4, tc.n0, [&](int j, int h) {
                              return __floats2bfloat162_rn(acc[4 * j + 2 * h],
                                                           acc[4 * j + 2 * h + 1]);
                            });
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wg * 64 + warp * 16 + lane / 4 + 8 * h;
        if (r >= tc.rows) continue;
        const int64_t out_row = static_cast<int64_t>(tc.row_begin + r) * p.n;
        if constexpr (kGateUp) {
          bf16_t* out = static_cast<bf16_t*>(p.out) + out_row;
#pragma unroll
          for (int j = 0; j < kJ / 2; ++j) {
            const int col = tc.n0 + 8 * j + 2 * (lane % 4);  // N % 64 == 0: < N at kBN 128
            if (kBN > 128 && col >= p.n) continue;
            const float g0 = acc[4 * j + 2 * h], g1 = acc[4 * j + 2 * h + 1];
            const float u0 = acc[4 * (j + kJ / 2) + 2 * h], u1 = acc[4 * (j + kJ / 2) + 2 * h + 1];
            *reinterpret_cast<__nv_bfloat162*>(out + col) =
                __floats2bfloat162_rn(g0 / (1.f + expf(-g0)) * u0, g1 / (1.f + expf(-g1)) * u1);
          }
        } else {
          float* out = static_cast<float*>(p.out) + out_row;
#pragma unroll
          for (int j = 0; j < kJ; ++j) {
            const int col = tc.n0 + 8 * j + 2 * (lane % 4);
            if (col >= p.n) continue;
            *reinterpret_cast<float2*>(out + col) =
                make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
          }
        }
      }
    }
#pragma unroll
    for (int i = 0; i < kBN / 2; ++i) acc[i] = 0.f;
  }
}

template <int kBN, bool kGateUp>
__global__ void __launch_bounds__(kThreads, 1)
    GroupedFp8WgmmaKernel(const __grid_constant__ Fp8WgmmaParams p) {
  using C = Cfg<kBN>;
  constexpr int kStages = C::kStages, kPipeBytes = C::kPipeBytes;
  constexpr int kNPerTile = kGateUp ? kBN / 2 : kBN;
  extern __shared__ __align__(16) unsigned char fp8_wgmma_smem[];
  const uint32_t base = wgmma::SmemAddr(fp8_wgmma_smem);
  const uint32_t pad = ((base + 1023) & ~1023u) - base;
  const uint32_t pipe = base + pad;
  const uint32_t full = pipe + kPipeBytes, empty = full + 8 * kStages;  // [kStages] each
  int32_t* s_offsets =
      reinterpret_cast<int32_t*>(fp8_wgmma_smem + pad + kPipeBytes + 16 * kStages);  // [E + 1]
  int32_t* s_tile_start = s_offsets + p.experts + 1;                                 // [E + 1]

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
  const int k_blocks = (p.k + kBK - 1) / kBK;
  if (threadIdx.x >= kConsumers * 128) {
    if constexpr (C::kSetMaxRegs) wgmma::SetMaxRegsDec<40>();
    Produce<kBN, kGateUp>(p, sch, num_tiles, k_blocks, pipe, full, empty);
  } else {
    if constexpr (C::kSetMaxRegs) wgmma::SetMaxRegsInc<232>();
    Consume<kBN, kGateUp>(p, sch, num_tiles, k_blocks, pipe, full, empty);
  }
}

// One 64 x N x 128 e4m3 tile through the raw wrappers: A by cp.async into the swizzled layout,
// B by N / 64 TMA boxes, 4 k32 wgmmas, c = a b^T (f32) from the fragment layout.
template <int kN>
__global__ void __launch_bounds__(128, 1)
    Fp8WgmmaProbeKernel(const __grid_constant__ CUtensorMap b_map, const uint8_t* a, float* c) {
  extern __shared__ __align__(16) unsigned char fp8_probe_smem[];
  const uint32_t base = wgmma::SmemAddr(fp8_probe_smem);
  const uint32_t sa = (base + 1023) & ~1023u, sb = sa + 64 * 128, bar = sb + kN * 128;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  if (t == 0) {
    wgmma::MbarInit(bar, 1);
    wgmma::MbarInitFence();
  }
  __syncthreads();
  if (t == 0) {
    wgmma::MbarArriveExpectTx(bar, kN * 128);
    for (int b = 0; b < kN / kBoxRows; ++b)
      wgmma::TmaLoad2d(sb + b * kBoxRows * 128, &b_map, 0, b * kBoxRows, bar);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = t / 8 + 16 * i, chunk = t % 8;
    wgmma::CpAsync16(sa + wgmma::Sw128(r, chunk), a + r * 128 + chunk * 16, true);
  }
  wgmma::CpAsyncCommit();
  wgmma::CpAsyncWait<0>();
  wgmma::FenceProxyAsync();
  __syncthreads();
  wgmma::MbarWait(bar, 0);
  float acc[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) acc[i] = 0.f;
  const uint64_t desc_a = wgmma::SmemDescSw128(sa), desc_b = wgmma::SmemDescSw128(sb);
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) wgmma::FenceOperand(acc[i]);
  wgmma::Fence();
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    if constexpr (kN == 256)
      wgmma::MmaM64N256K32E4m3(acc, wgmma::DescAdvance(desc_a, 32 * ks),
                               wgmma::DescAdvance(desc_b, 32 * ks), ks > 0);
    else
      wgmma::MmaM64N128K32E4m3(acc, wgmma::DescAdvance(desc_a, 32 * ks),
                               wgmma::DescAdvance(desc_b, 32 * ks), ks > 0);
  }
  wgmma::Commit();
  wgmma::Wait<0>();
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) wgmma::FenceOperand(acc[i]);
#pragma unroll
  for (int j = 0; j < kN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * warp + lane / 4 + 8 * h, col = 8 * j + 2 * (lane % 4);
      c[row * kN + col] = acc[4 * j + 2 * h];
      c[row * kN + col + 1] = acc[4 * j + 2 * h + 1];
    }
}

// ---- host -------------------------------------------------------------------------------------
// The tensor map of a row-major e4m3 matrix [rows, k] (k % 16 == 0, 16-byte aligned): box 128
// bytes x kBoxRows rows, 128-byte swizzle, out-of-bounds boxes zero-filled. Cached
// (tensor_map.h).
CUtensorMap WeightMapFp8(const void* w, int64_t rows, int64_t k) {
  return TensorMap2dSw128(w, CU_TENSOR_MAP_DATA_TYPE_UINT8, rows, k, k, kBK, kBoxRows,
                          "grouped fp8 wgmma");
}

template <class Kernel>
void SetAttributesOnce(Kernel kernel, std::atomic<uint64_t>& set, int device, int max_smem) {
  const uint64_t device_bit = uint64_t{1} << (device % 64);
  if (set.load(std::memory_order_acquire) & device_bit) return;
  COROLLA_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
  set.fetch_or(device_bit, std::memory_order_acq_rel);
}

template <int kBN, bool kGateUp>
void LaunchFp8Wgmma(const Fp8WgmmaParams& p, int64_t rows, cudaStream_t s) {
  const auto kernel = GroupedFp8WgmmaKernel<kBN, kGateUp>;
  int device = 0, sms = 0, max_smem = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  COROLLA_CUDA_CHECK(
      cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t smem = SmemBytes<kBN>(p.experts);
  COROLLA_CHECK(smem <= static_cast<size_t>(max_smem))
      << "grouped fp8 wgmma: " << p.experts << " experts need " << smem
      << " bytes of shared memory, the device has " << max_smem;
  static std::atomic<uint64_t> attrs_set{0};
  SetAttributesOnce(kernel, attrs_set, device, max_smem);
  constexpr int kNPerTile = kGateUp ? kBN / 2 : kBN;
  const int64_t tile_bound = (CeilDiv(rows, kBM) + std::min<int64_t>(p.experts, rows)) *
                             static_cast<int64_t>(CeilDiv(p.n, kNPerTile));
  const int grid = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(tile_bound, sms)));
  kernel<<<grid, kThreads, smem, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool GroupedFp8WgmmaFits(int64_t n, int64_t k, int experts) {
  if (n % 64 != 0 || k % 16 != 0 || n <= 0 || k <= 0) return false;
  int device = 0, major = 0, max_smem = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  COROLLA_CUDA_CHECK(
      cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return major == 9 && std::max(SmemBytes<128>(experts), SmemBytes<256>(experts)) <=
                           static_cast<size_t>(max_smem);
}

void GroupedFp8WgmmaGateUp(const uint8_t* xq, const float* xs, int64_t tokens_stride,
                           const int32_t* perm_token, const int32_t* offsets,
                           const TensorView& w_gate_up, const TensorView& gu_scale,
                           const TensorView& act, cudaStream_t s) {
  const int64_t rows = act.dim(0), experts = w_gate_up.dim(0), inter = act.dim(1),
                hidden = w_gate_up.dim(2);
  if (rows == 0) return;
  Fp8WgmmaParams p;
  p.w_map = WeightMapFp8(w_gate_up.data, experts * 2 * inter, hidden);
  p.a = xq;
  p.a_stride = tokens_stride;
  p.a_scale = xs;
  p.perm_token = perm_token;
  p.w_scale = gu_scale.ptr<float>();
  p.out = act.data;
  p.offsets = offsets;
  p.experts = static_cast<int>(experts);
  p.n = static_cast<int>(inter);
  p.k = static_cast<int>(hidden);
  p.n_blocks = static_cast<int>(CeilDiv(inter, kGroup));
  p.k_groups = static_cast<int>(CeilDiv(hidden, kGroup));
  p.out_bf16 = false;  // act is always bf16
  p.snake = Tuning().moe_gemm_snake;
  p.skip_idle = Tuning().moe_gemm_wgmma_skip_idle;
  if (Tuning().moe_fp8_wgmma_tile_n == 256)
    LaunchFp8Wgmma<256, true>(p, rows, s);
  else
    LaunchFp8Wgmma<128, true>(p, rows, s);
}

void GroupedFp8WgmmaDown(const uint8_t* actq, const float* act_scale, const int32_t* offsets,
                         const TensorView& w_down, const TensorView& d_scale, const TensorView& y,
                         cudaStream_t s) {
  const int64_t rows = y.dim(0), experts = w_down.dim(0), hidden = y.dim(1), inter = w_down.dim(2);
  if (rows == 0) return;
  Fp8WgmmaParams p;
  p.w_map = WeightMapFp8(w_down.data, experts * hidden, inter);
  p.a = actq;
  p.a_stride = inter;
  p.a_scale = act_scale;
  p.perm_token = nullptr;
  p.w_scale = d_scale.ptr<float>();
  p.out = y.data;
  p.offsets = offsets;
  p.experts = static_cast<int>(experts);
  p.n = static_cast<int>(hidden);
  p.k = static_cast<int>(inter);
  p.n_blocks = static_cast<int>(CeilDiv(hidden, kGroup));
  p.k_groups = static_cast<int>(CeilDiv(inter, kGroup));
  p.out_bf16 = y.dtype == DType::kBF16;
  p.snake = Tuning().moe_gemm_snake;
  p.skip_idle = Tuning().moe_gemm_wgmma_skip_idle;
  if (Tuning().moe_fp8_wgmma_tile_n == 256)
    LaunchFp8Wgmma<256, false>(p, rows, s);
  else
    LaunchFp8Wgmma<128, false>(p, rows, s);
}

void Fp8WgmmaTileProbe(const TensorView& a, const TensorView& b, const TensorView& c,
                       cudaStream_t s) {
  const int64_t n = b.rank() == 2 ? b.dim(0) : 0;
  COROLLA_CHECK(a.dtype == DType::kF8E4M3 && b.dtype == DType::kF8E4M3 && c.dtype == DType::kF32 &&
                a.rank() == 2 && a.dim(0) == 64 && a.dim(1) == 128 && a.is_contiguous() &&
                (n == 128 || n == 256) && b.dim(1) == 128 && b.is_contiguous() && c.rank() == 2 &&
                c.dim(0) == 64 && c.dim(1) == n && c.is_contiguous() &&
                reinterpret_cast<uintptr_t>(a.data) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(b.data) % 16 == 0)
      << "fp8 wgmma tile probe: a " << a.ToString() << " b " << b.ToString() << " c "
      << c.ToString();
  const CUtensorMap map = WeightMapFp8(b.data, n, 128);
  const size_t smem = 1024 + 64 * 128 + n * 128 + 8;
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  if (n == 256) {
    static std::atomic<uint64_t> attrs_set{0};
    SetAttributesOnce(Fp8WgmmaProbeKernel<256>, attrs_set, device, static_cast<int>(smem));
    Fp8WgmmaProbeKernel<256><<<1, 128, smem, s>>>(map, a.ptr<uint8_t>(), c.ptr<float>());
  } else {
    static std::atomic<uint64_t> attrs_set{0};
    SetAttributesOnce(Fp8WgmmaProbeKernel<128>, attrs_set, device, static_cast<int>(smem));
    Fp8WgmmaProbeKernel<128><<<1, 128, smem, s>>>(map, a.ptr<uint8_t>(), c.ptr<float>());
  }
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace corolla::cuda
