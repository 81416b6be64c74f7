// One token's routing by one warp, shared by MoeRoute (moe.cu) and the fused router (router.cu):
// softmax (sum in double, as the CPU twin) or sigmoid scores, optional selection bias, top-k with
// ties to the lower expert id, group-limited selection (DeepSeek: the topk_groups best groups by
// the sum of their two best scores), renormalisation and scaling. Device code only.
#pragma once

#include "kernels/cuda/common.cuh"

namespace corolla::cuda {

constexpr int kMaxTopK = 32;  // RouteToken keeps pick i in lane i

struct RouteParams {
  const float* logits;
  int64_t logits_stride;
  const float* bias;  // [E] selection bias (DeepSeek), or null
  int32_t* topk_ids;
  int64_t ids_stride;
  float* topk_weights;
  int64_t weights_stride;
  int64_t tokens;
  int experts, top_k;
  bool renormalize, sigmoid;
  float scaling_factor;
  int num_groups, topk_groups;
  uint64_t* timeline = nullptr;  // timeline.h (MoeRoute's launch)
  bool by_logits = false;        // Tuning().route_by_logits: RouteTokenByLogits where it applies
};

// a / b rounded to nearest as the division rounds it, given r = 1 / b (itself a division): q =
// a r, the remainder a - q b exact through an FMA, and one correction by r (Markstein's
// theorem). Where one b divides many a this replaces each DDIV sequence (~100-250 cycles) with
// three FP64 operations; CudaPerf.RouteTokenPicks checks the bits against the division.
__device__ __forceinline__ double DivideByReciprocal(double a, double b, double r) {
  const double q = a * r;
  return fma(fma(-q, b, a), r, q);
}

// RouteTokenRegs' scores as keys, key[j] for expert lane + 32 j: a score's bits + 1 (scores are
// >= +0, so the bits order them), 0 for none; false where a score is NaN.
template <int kPer, bool kRecipDiv = true>
__device__ __forceinline__ bool ScoreKeys(const RouteParams& p, const float* logit, int lane,
                                          uint32_t (&key)[kPer]) {
  float v[kPer];
  float mx = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = lane + 32 * j;
    v[j] = e < p.experts ? logit[e] : -INFINITY;
    mx = fmaxf(mx, v[j]);
  }
  mx = WarpMax(mx);
  double sum = 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (lane + 32 * j < p.experts) {
      v[j] = expf(v[j] - mx);
      sum += v[j];
    }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  bool nan = false;
  const double r = kRecipDiv ? 1.0 / sum : 0.0;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    key[j] = 0;
    if (lane + 32 * j < p.experts) {
      const float prob =
          static_cast<float>(kRecipDiv ? DivideByReciprocal(v[j], sum, r) : v[j] / sum);
      nan |= prob != prob;
      key[j] = __float_as_uint(prob) + 1;
    }
  }
  return !__any_sync(0xffffffffu, nan);
}

// One pick of the warp's keys (RouteTokenRegs, RouteTokenByLogits; key[j] for expert lane + 32 j,
// 0 for none): the largest (its value to every lane in top), ties to the lower id, taken (zeroed)
// in its owner's registers. Two dependent warp reductions; returns the expert id.
template <int kPer>
__device__ __forceinline__ int TakeLargestKey(uint32_t (&key)[kPer], int lane, uint32_t& top) {
  uint32_t best = 0;
  int best_j = 0;
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (key[j] > best) {  // strict: the lower id of this lane's ties
      best = key[j];
      best_j = j;
    }
  top = __reduce_max_sync(0xffffffffu, best);
  const uint32_t id = __reduce_min_sync(0xffffffffu, best == top ? lane + 32 * best_j : 0xffffffffu);
#pragma unroll
  for (int j = 0; j < kPer; ++j)
    if (lane == static_cast<int>(id % 32) && j == best_j) key[j] = 0;  // taken
  return static_cast<int>(id);
}

// RouteToken's common case in registers: softmax scores, no selection bias, one group, E <= 32
// kPer. Lane l holds experts l + 32 j; the sum runs in RouteToken's order, so the scores are the
// same bits, and each pick is two warp reductions (the largest score, then the lowest id holding
// it: ties to the lower id, as RouteToken). The serial shared-memory scans of RouteToken took
// ~5 us a token on an H200 (timeline.h). False, having written nothing, when a score is NaN
// (RouteToken's rules decide those). kRecipDiv: the scores' divisions by their sum through
// DivideByReciprocal (the same bits; CudaPerf.RouteTokenPicks times both).
template <int kPer, bool kRecipDiv = true>
__device__ __forceinline__ bool RouteTokenRegs(const RouteParams& p, int64_t t, const float* logit,
                                               int lane) {
  uint32_t key[kPer];  // 0 once taken
  if (!ScoreKeys<kPer, kRecipDiv>(p, logit, lane, key)) return false;
  double norm = 0.0;
  int my_id = 0;
  float my_weight = 0.0f;
  for (int i = 0; i < p.top_k; ++i) {
    uint32_t top;
    const int id = TakeLargestKey(key, lane, top);
    const float pb = __uint_as_float(top - 1);  // (the owner's key: no shuffle)
    if (lane == i) {
      my_id = id;
      my_weight = pb;
    }
    norm += pb;
  }
  if (lane < p.top_k) {
    const float weight = p.renormalize ? static_cast<float>(my_weight / norm) : my_weight;
    p.topk_ids[t * p.ids_stride + lane] = my_id;
    p.topk_weights[t * p.weights_stride + lane] = weight * p.scaling_factor;
  }
  return true;
}

// RouteToken's renormalised softmax ranked by the logits themselves (p.by_logits): softmax keeps
// their order, so the picks are the k largest logits (ties to the lower id) and weight i is
// exp(l_i - l_0) / (the sum of those over the picks), in f32: the scores of the other experts,
// and their double sum, cancel in the renormalisation. RouteTokenRegs' probe split its 2772
// cycles (E 128, top 8) into ~1357 for every expert's score and ~1415 for the picks; this keeps
// only the picks and k exponentials. Its weights are within a few f32 ulps of RouteTokenRegs',
// and two logits whose scores round to the same f32 rank by the logit here, by the lower id
// there (HF's topk on the f32 scores leaves such ties unordered). False, having written
// nothing, where a logit is NaN or the largest is infinite.
template <int kPer>
__device__ __forceinline__ bool RouteTokenByLogits(const RouteParams& p, int64_t t, const float* logit,
                                                   int lane) {
  uint32_t key[kPer];  // the logit's OrderedKey (>= 0x007FFFFF), 0 for none or once taken
  bool nan = false;
#pragma unroll
  for (int j = 0; j < kPer; ++j) {
    const int e = lane + 32 * j;
    const float v = e < p.experts ? logit[e] : 0.0f;
    nan |= v != v;
    key[j] = e < p.experts ? OrderedKey(v) : 0u;
  }
  if (__any_sync(0xffffffffu, nan)) return false;
  int my_id = 0;
  for (int i = 0; i < p.top_k; ++i) {
    uint32_t top;
    const int id = TakeLargestKey(key, lane, top);
    if (lane == i) my_id = id;
  }
  const float l = lane < p.top_k ? logit[my_id] : 0.0f, l0 = __shfl_sync(0xffffffffu, l, 0);
  if (isinf(l0)) return false;  // (an infinite largest logit: RouteToken's rules, as RouteTokenRegs)
  const float e = lane < p.top_k ? expf(l - l0) : 0.0f;
  const float sum = WarpSum(e);
  if (lane < p.top_k) {
    p.topk_ids[t * p.ids_stride + lane] = my_id;
    p.topk_weights[t * p.weights_stride + lane] = e / sum * p.scaling_factor;
  }
  return true;
}

// Routes token t (writes its top_k ids and weights) with the calling warp. logit: [E] (global or
// shared memory); probs, choice [E] and group_score [num_groups]: this warp's shared scratch.
__device__ __forceinline__ void RouteToken(const RouteParams& p, int64_t t, const float* logit, float* probs,
                                           float* choice, float* group_score, int lane) {
  if (p.by_logits && p.renormalize && !p.sigmoid && p.bias == nullptr && p.num_groups == 1 &&
      (p.experts <= 128 ? RouteTokenByLogits<4>(p, t, logit, lane)
                        : p.experts <= 512 && RouteTokenByLogits<16>(p, t, logit, lane)))
    return;
  if (!p.sigmoid && p.bias == nullptr && p.num_groups == 1 &&
      (p.experts <= 128 ? RouteTokenRegs<4>(p, t, logit, lane)
                        : p.experts <= 512 && RouteTokenRegs<16>(p, t, logit, lane)))
    return;
  if (p.sigmoid) {
    for (int e = lane; e < p.experts; e += 32) probs[e] = 1.0f / (1.0f + expf(-logit[e]));
  } else {
    float mx = -INFINITY;
    for (int e = lane; e < p.experts; e += 32) mx = fmaxf(mx, logit[e]);
    mx = WarpMax(mx);
    double sum = 0.0;
    for (int e = lane; e < p.experts; e += 32) {
      const float v = expf(logit[e] - mx);
      probs[e] = v;
      sum += v;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (int e = lane; e < p.experts; e += 32) probs[e] = static_cast<float>(probs[e] / sum);
  }
  for (int e = lane; e < p.experts; e += 32) choice[e] = p.bias ? probs[e] + p.bias[e] : probs[e];
  __syncwarp();
  if (p.num_groups > 1) {
    // A group's score: its best plus its second best (the same comparisons as the CPU twin).
    const int per_group = p.experts / p.num_groups;
    for (int g = lane; g < p.num_groups; g += 32) {
      const float* c = choice + g * per_group;
      float best = -INFINITY, second = -INFINITY;
      for (int i = 0; i < per_group; ++i) {
        if (c[i] > best) {
          second = best;
          best = c[i];
        } else if (c[i] > second) {
          second = c[i];
        }
      }
      group_score[g] = per_group > 1 ? best + second : best;
    }
    __syncwarp();
    // Lane 0 picks the topk_groups best groups (ties to the lower index); experts of the other
    // groups then score 0, as the reference masks them.
    unsigned long long picked = 0;
    if (lane == 0) {
      for (int i = 0; i < p.topk_groups; ++i) {
        int best_g = -1;
        for (int g = 0; g < p.num_groups; ++g)
          if (!((picked >> g) & 1ull) && (best_g < 0 || group_score[g] > group_score[best_g])) best_g = g;
        picked |= 1ull << best_g;
      }
    }
    picked = __shfl_sync(0xffffffffu, picked, 0);
    for (int e = lane; e < p.experts; e += 32)
      if (!((picked >> (e / per_group)) & 1ull)) choice[e] = 0.0f;
    __syncwarp();
  }
  // Lane i keeps the i-th pick (top_k <= kMaxTopK, checked by the host) and writes it at the end:
  // no global store and read-back inside the loop.
  double norm = 0.0;
  int my_id = 0;
  float my_weight = 0.0f;
  for (int i = 0; i < p.top_k; ++i) {
    float best = -INFINITY;
    int best_id = 0x7fffffff;
    for (int e = lane; e < p.experts; e += 32) {
      const float v = choice[e];
      if (v > best || best_id == 0x7fffffff) {  // ascending e: ties keep the lower id (NaN: the first)
        best = v;
        best_id = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oi = __shfl_xor_sync(0xffffffffu, best_id, o);
      if (ob > best || (ob == best && oi < best_id)) {
        best = ob;
        best_id = oi;
      }
    }
    // Lane 0's pick for every lane: with NaN scores the butterfly need not agree. Lane 0's id
    // is always valid (it takes expert 0 unconditionally and only ever swaps for a valid one),
    // so nothing reads past probs.
    best_id = __shfl_sync(0xffffffffu, best_id, 0);
    __syncwarp();
    const float pb = probs[best_id];
    if (lane == 0) choice[best_id] = -INFINITY;  // taken (NaN-free: only valid ids are chosen)
    if (lane == i) {
      my_id = best_id;
      my_weight = pb;
    }
    norm += pb;
    __syncwarp();
  }
  if (p.sigmoid) norm += 1e-20;
  if (lane < p.top_k) {
    const float weight = p.renormalize ? static_cast<float>(my_weight / norm) : my_weight;
    p.topk_ids[t * p.ids_stride + lane] = my_id;
    p.topk_weights[t * p.weights_stride + lane] = weight * p.scaling_factor;
  }
}

}  // namespace corolla::cuda
