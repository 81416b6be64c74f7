// The weight stream of the skinny tensor-core kernels: a few rows of x (<= 8 per row tile)
// against 16 rows of W a warp, W's 16-byte loads fed to mma.sync as they arrive (no shared
// memory, no ldmatrix). Used by LinearSkinny (gemm_skinny.cu: the dense projections of 3-16
// rows) and the grouped experts of a decode batch (moe_skinny.cu).
//
// Lane (g = lane / 4, c = lane % 4) loads 16 bytes of its two W rows (the tile's rows g and
// g + 8) at columns 8c..8c+7 of each 32-column block, and 16 bytes of x's row g of each row tile
// at the same columns; those registers are the operands of two mma.sync m16n8k16 as they are:
// physical columns 8c..8c+3 play the mma's k 2c, 2c+1, 2c+8, 2c+9 of the first, 8c+4..8c+7 those
// of the second, the same for W and x, which a dot product does not see. So every byte of W is
// loaded once, 64 contiguous bytes a row a load, the next block while the current one is
// multiplied. acc[t] = {(W row g, x row 8t + 2c), (g, 8t + 2c + 1), (g + 8, 8t + 2c),
// (g + 8, 8t + 2c + 1)} (mma.cuh's Mma16816 layout).
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace corolla::cuda::skinny {

constexpr int kWarps = 8;   // a CTA's warps
constexpr int kBlocks = 4;  // 32-column blocks a lane loads at once (2 x 16 bytes of W each)
constexpr int kStep = 32 * kBlocks;
// Warps wanted on the grid (~16 an SM on 132 SMs) before K is split further over a tile's
// warps: enough 16-byte loads in flight to keep HBM busy.
constexpr int kTargetWarps = 132 * 16;

// A lane's W registers for one step of kStep columns.
struct WBlocks {
  uint4 lo[kBlocks], hi[kBlocks];
};

// The lane's W bytes of columns [k0, k0 + kStep) of rows w_lo / w_hi (already offset by 8c),
// zeros past k_end or where the warp has no tile (`active` false).
__device__ __forceinline__ void LoadW(const bf16_t* w_lo, const bf16_t* w_hi, bool active, int k0,
                                      int k_end, WBlocks& w) {
  const int c = threadIdx.x % 4;
#pragma unroll
  for (int b = 0; b < kBlocks; ++b) {
    const int col = k0 + 32 * b;
    if (active && col + 8 * c < k_end) {  // read once: stream past the caches
      w.lo[b] = __ldcs(reinterpret_cast<const uint4*>(w_lo + col));
      w.hi[b] = __ldcs(reinterpret_cast<const uint4*>(w_hi + col));
    } else {
      w.lo[b] = w.hi[b] = make_uint4(0, 0, 0, 0);
    }
  }
}

// acc += the tile's W [16, k_begin..k_end) x x rows over those columns, w holding the first
// step's W (LoadW at k_begin). has_row(t): whether this lane's x row of row tile t (row g + 8t)
// exists (else it multiplies zeros); x_row(t): that row offset by 8c. Both are called at every
// step, so that the caller's kernel may form them from its parameters instead of holding them
// in registers (LinearSkinny's 2-tile kernel spilled otherwise).
template <int kRowTiles, class HasRow, class XRow>
__device__ __forceinline__ void Stream(WBlocks& w, const bf16_t* w_lo, const bf16_t* w_hi,
                                       bool active, const HasRow& has_row, const XRow& x_row,
                                       int k_begin, int k_end, float (&acc)[kRowTiles][4]) {
  const int c = threadIdx.x % 4;
  for (int k0 = k_begin; active && k0 < k_end; k0 += kStep) {
    uint4 xv[kBlocks][kRowTiles];
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const int col = k0 + 32 * b;
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t)
        xv[b][t] = col + 8 * c < k_end && has_row(t)
                       ? *reinterpret_cast<const uint4*>(x_row(t) + col)
                       : make_uint4(0, 0, 0, 0);
    }
    WBlocks next;
    if (k0 + kStep < k_end) LoadW(w_lo, w_hi, active, k0 + kStep, k_end, next);
#pragma unroll
    for (int b = 0; b < kBlocks; ++b) {
      const uint32_t a0[4] = {w.lo[b].x, w.hi[b].x, w.lo[b].y, w.hi[b].y};
      const uint32_t a1[4] = {w.lo[b].z, w.hi[b].z, w.lo[b].w, w.hi[b].w};
#pragma unroll
      for (int t = 0; t < kRowTiles; ++t) {
        mma::Mma16816(acc[t], a0, xv[b][t].x, xv[b][t].y);
        mma::Mma16816(acc[t], a1, xv[b][t].z, xv[b][t].w);
      }
    }
    w = next;
  }
}

// The warps of a row tile that split K (k_parts consecutive warps, a power of two) sum their
// acc through `partial` in warp order (deterministic, no atomics): every thread of the CTA
// stores its parts (a CTA barrier), then the first warp of each row tile (warp % k_parts == 0)
// reads row tile t's sum with PartsSum.
template <int kRowTiles>
__device__ __forceinline__ void StoreParts(float4 (&partial)[kWarps][kRowTiles][32],
                                           const float (&acc)[kRowTiles][4]) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t)
    partial[warp][t][lane] = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
  __syncthreads();
}
template <int kRowTiles>
__device__ __forceinline__ float4 PartsSum(const float4 (&partial)[kWarps][kRowTiles][32], int t,
                                           int k_parts) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int q = 0; q < k_parts; ++q) {
    const float4 v = partial[warp + q][t][lane];
    s.x += v.x;
    s.y += v.y;
    s.z += v.z;
    s.w += v.w;
  }
  return s;
}

}  // namespace corolla::cuda::skinny
