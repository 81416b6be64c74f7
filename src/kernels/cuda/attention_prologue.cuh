// One head of Qwen3's attention prologue in one warp (per-head RMSNorm, neox rotary over the whole
// head), shared by the prologue kernel (attention_prologue.cu) and the decode attention that
// folds it in (attention_decode.cu), so both write the same bits. Lane l holds elements
// [l D/32, (l + 1) D/32) of the head; the rotary partner of an element (i +- D/2) sits in lane
// l ^ 16. The normalised values stay in f32 into the rotation.
#pragma once

#include "kernels/cuda/common.cuh"

namespace corolla::cuda {

// The prologue folded into the decode attention (QkNormRopeAttention, attention_decode.cu): the
// raw k / v rows of the step's tokens ([T, Hk, D] views), the norm weights (bf16 or f32), the
// rotation (device inv_freq [D / 2]) and the cache slots the new k / v go to.
struct DecodePrologue {
  const bf16_t* k;
  int64_t k_token_stride, k_head_stride;
  const bf16_t* v;
  int64_t v_token_stride, v_head_stride;
  const void* q_w;
  const void* k_w;
  bool q_w_f32, k_w_f32;
  float eps;
  const int32_t* positions;
  const float* inv_freq;
  float attention_factor;
  const int32_t* slots;  // [T]; outside [0, num_slots): a padding token, nothing written
  int64_t num_slots;
};

template <int kN>
struct alignas(2 * kN) BfVec {
  bf16_t v[kN];
};

__device__ __forceinline__ float WeightAt(const void* w, bool f32, int i) {
  return f32 ? static_cast<const float*>(w)[i] : __bfloat162float(static_cast<const bf16_t*>(w)[i]);
}

// The rotation of this lane's D/32 elements at position pos: cos and +-sin (the first half's
// partner enters negated), both times attention_factor. The angle in fp32, as the CPU twin.
template <int kD>
struct LaneRope {
  float cs[kD / 32], sn[kD / 32];
};

template <int kD>
__device__ __forceinline__ LaneRope<kD> MakeLaneRope(float pos, const float* inv_freq, float attention_factor,
                                                     int lane) {
  constexpr int kPer = kD / 32, kHalf = kD / 2;
  LaneRope<kD> r;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    sincosf(pos * inv_freq[(lane * kPer + i) % kHalf], &r.sn[i], &r.cs[i]);
    r.cs[i] *= attention_factor;
    r.sn[i] *= lane < 16 ? -attention_factor : attention_factor;
  }
  return r;
}

// The same bits with half the sincosf: lanes l and l ^ 16 rotate by the same D/32 angles (element
// i and its partner i + D/2), so each computes half of them and takes the rest from its partner.
// Fewer instructions (a prefill prologue, issue-bound, was mostly sincosf) but a longer chain (the
// shuffles after the sincosf): MakeLaneRope where few tokens make latency the cost (the batch-1
// decode step was ~0.01 ms slower with this one). Every lane of the warp must call it.
template <int kD>
__device__ __forceinline__ LaneRope<kD> MakeLaneRopeShared(float pos, const float* inv_freq, float attention_factor,
                                                           int lane) {
  constexpr int kPer = kD / 32, kHalf = kD / 2, kMine = kPer / 2;
  static_assert(kPer % 2 == 0, "D a multiple of 64");
  // This lane computes angles [first, first + kMine) of its elements; lane l ^ 16 the others.
  const int first = lane < 16 ? 0 : kMine;
  LaneRope<kD> r;
#pragma unroll
  for (int i = 0; i < kMine; ++i) {
    float s_mine, c_mine;
    sincosf(pos * inv_freq[(lane * kPer + first + i) % kHalf], &s_mine, &c_mine);
    const float s_other = __shfl_xor_sync(0xffffffffu, s_mine, 16);
    const float c_other = __shfl_xor_sync(0xffffffffu, c_mine, 16);
    r.sn[i] = lane < 16 ? s_mine : s_other;
    r.cs[i] = lane < 16 ? c_mine : c_other;
    r.sn[kMine + i] = lane < 16 ? s_other : s_mine;
    r.cs[kMine + i] = lane < 16 ? c_other : c_mine;
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    r.cs[i] *= attention_factor;
    r.sn[i] *= lane < 16 ? -attention_factor : attention_factor;
  }
  return r;
}

// The lane's D/32 norm weights (elements [lane D/32, (lane + 1) D/32)) as floats.
template <int kD>
__device__ __forceinline__ void LaneNormWeights(const void* w, bool w_f32, int lane, float (&out)[kD / 32]) {
#pragma unroll
  for (int i = 0; i < kD / 32; ++i) out[i] = WeightAt(w, w_f32, lane * (kD / 32) + i);
}

// rope(rmsnorm(in) * w) of one head, w the lane's norm weights (LaneNormWeights): every lane of
// the warp calls it (warp sum, partner shuffle). The multiply-adds are spelled out, so every
// kernel that inlines it rounds the same way.
template <int kD>
__device__ __forceinline__ BfVec<kD / 32> NormRopeHead(const BfVec<kD / 32>& in, const float (&w)[kD / 32], float eps,
                                                       const LaneRope<kD>& rope) {
  constexpr int kPer = kD / 32;
  float a[kPer];
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    a[i] = __bfloat162float(in.v[i]);
    ss = __fmaf_rn(a[i], a[i], ss);
  }
  ss = WarpSum(ss);
  const float inv = rsqrtf(ss / kD + eps);
#pragma unroll
  for (int i = 0; i < kPer; ++i) a[i] = w[i] * (a[i] * inv);
  BfVec<kPer> out;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const float partner = __shfl_xor_sync(0xffffffffu, a[i], 16);
    out.v[i] = __float2bfloat16(__fmaf_rn(a[i], rope.cs[i], __fmul_rn(partner, rope.sn[i])));
  }
  return out;
}
// The same with the weights read from w (bf16, or f32 with w_f32).
template <int kD>
__device__ __forceinline__ BfVec<kD / 32> NormRopeHead(const BfVec<kD / 32>& in, const void* w, bool w_f32, float eps,
                                                       const LaneRope<kD>& rope, int lane) {
  float wl[kD / 32];
  LaneNormWeights<kD>(w, w_f32, lane, wl);
  return NormRopeHead<kD>(in, wl, eps, rope);
}

}  // namespace corolla::cuda
