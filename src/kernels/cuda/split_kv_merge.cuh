// The merge of split-KV attention partials, shared by the decode paths that split a sequence's
// keys over CTAs (attention.cu's SIMT and mma kernels, mla_decode.cu). Each split s of a (token,
// head) row wrote its unnormalised output o_s [kD] and (m_s, l_s): its running maximum (log2
// domain) and denominator; an empty split has m_s = -inf.
#pragma once

#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/split_keys.h"

namespace corolla::cuda {

// acc += wt * o where the split was seen (wt != 0 in the merges that form the weights first):
// an empty split's o was never written, so it is selected out, never multiplied.
__device__ __forceinline__ void AddWeighted(float4& acc, float wt, bool seen, const float4& o) {
  acc.x += seen ? wt * o.x : 0.f;
  acc.y += seen ? wt * o.y : 0.f;
  acc.z += seen ? wt * o.z : 0.f;
  acc.w += seen ? wt * o.w : 0.f;
}

struct SplitMergeParams {
  const float* part_o;   // [rows, num_splits, kD]
  const float* part_ml;  // [rows, num_splits, 2]
  bf16_t* out;           // row (token t, head h) at t * out_token_stride + h * out_head_stride
  int64_t out_token_stride, out_head_stride;
  int64_t rows;  // T * Hq
  int q_heads, num_splits;
};

// out[row] = sum_s 2^(m_s - M) o_s / sum_s 2^(m_s - M) l_s over the splits; one warp per
// (token, head) row, lane owning dims lane + 32 c.
template <int kD>
__global__ void SplitKvMergeKernel(const __grid_constant__ SplitMergeParams p) {
  constexpr int kPerLane = kD / 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= p.rows) return;
  const float* ml = p.part_ml + row * p.num_splits * 2;
  float mx = -INFINITY;
  for (int s = 0; s < p.num_splits; ++s) mx = fmaxf(mx, ml[2 * s]);
  float acc[kPerLane] = {}, l = 0.f;
  for (int s = 0; s < p.num_splits; ++s) {
    if (ml[2 * s] == -INFINITY) continue;
    const float w = exp2f(ml[2 * s] - mx);
    l += w * ml[2 * s + 1];
    const float* o = p.part_o + (row * p.num_splits + s) * kD;
#pragma unroll
    for (int c = 0; c < kPerLane; ++c) acc[c] = fmaf(w, o[lane + 32 * c], acc[c]);
  }
  const int64_t tok = row / p.q_heads, head = row % p.q_heads;
  bf16_t* dst = p.out + tok * p.out_token_stride + head * p.out_head_stride;
  const float inv = 1.f / l;
#pragma unroll
  for (int c = 0; c < kPerLane; ++c) dst[lane + 32 * c] = __float2bfloat16(acc[c] * inv);
}

// Arrival counters of the merges fused into the split kernels (the last split CTA of a row
// group to arrive merges, then re-arms its counter; the decode kernel's wide merge counts its
// departures in the second half): kMaxSplitKvMergeCounters ints per stream,
// zeroed in stream order on the stream's first use, left zero by every launch, so kernels of one
// stream share them (each reads them only after its GridDependencyWait). Null when that first
// use would be inside a stream capture (the zeroing would only run at replay): that launch
// merges with SplitKvMergeKernel. Defined in attention_mma.cu (a stream_scratch.h slot).
constexpr int kMaxSplitKvMergeCounters = 4096;
int* SplitKvMergeCounters(cudaStream_t s);

template <int kD>
void LaunchSplitKvMerge(const SplitMergeParams& p, cudaStream_t s) {
  SplitKvMergeKernel<kD><<<CeilDiv(p.rows, 4), 128, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace corolla::cuda
