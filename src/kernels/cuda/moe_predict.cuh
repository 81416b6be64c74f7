// Device side of the batch-1 MoE routing prediction (Tuning().moe_predict; moe_decode.h has the
// buffer's layout): one warp's top k of the predicted logits, for gate/up's L2 prefetch. Shared by
// the staged o_proj GEMV (gemv_staged.cuh), which computes the logits, and the norm-router
// (router_norm.cu), which picks them in mode 2.
#pragma once

#include <cstdint>

#include "kernels/cuda/moe_decode.h"

namespace corolla::cuda {

// The order of f32 values as unsigned keys (larger float, larger key).
__device__ __forceinline__ unsigned OrderedKey(float v) {
  const unsigned u = __float_as_uint(v);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}

// Lane i < top_k writes the i-th largest of logits[0, experts) (experts <=
// kMoePredictionMaxExperts) to picks[i]: keys of the logit's order above 127 - e, so that REDUX
// max finds a pick and its expert at once (softmax keeps the logits' order; lower ids first in a
// tie at 2^-16 of the logit). The whole warp calls it; logits are read through L2.
__device__ __forceinline__ void PickPredictedTopK(const float* logits, int experts, int top_k, int32_t* picks,
                                                  int lane) {
  constexpr int kPer = kMoePredictionMaxExperts / 32;
  unsigned key[kPer];
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = lane + 32 * j;
    key[j] = e < experts ? (OrderedKey(__ldcg(logits + e)) & ~0x7Fu) | (127u - e) : 0u;
  }
  int pick = -1;
  for (int i = 0; i < top_k; ++i) {
    unsigned m = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) m = max(m, key[j]);
    const unsigned best = __reduce_max_sync(0xffffffffu, m);
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      if (key[j] == best) key[j] = 0;
    if (lane == i) pick = 127 - static_cast<int>(best & 0x7Fu);
  }
  if (lane < top_k) picks[lane] = pick;
}

}  // namespace corolla::cuda
