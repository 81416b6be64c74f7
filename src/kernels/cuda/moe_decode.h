// The experts of a few tokens without a permutation (moe_decode.cu): MoeExperts takes this
// path when tokens * top_k <= Tuning().moe_pair_gemv_max_pairs.
#pragma once

#include <cuda_runtime.h>

#include "kernels/cuda/allocator.h"
#include "tensor/tensor.h"

namespace corolla::cuda {

// Same contract as MoeExperts (ops.h), tensors already validated by it. Two launches:
//   1. gate_up: one CTA per (token-expert pair, slice of I): act[p] = silu(gate x) * up x (f32);
//   2. down + combine: one CTA per (token, slice of H): out[t] = sum_k w[t,k] W_down[e] act[p].
// A pair's expert weights are read once per pair, so an expert picked by two tokens is read
// twice: worth it only while pairs are few (no count/scan/permute launches, no y round trip).
// With `residual` (the slot-wise down kernel only: Tuning().moe_pair_down_slots) the down
// kernel also adds its output into it: residual = bf16(residual + out), RmsNorm's rounding.
void MoeExpertsPairGemv(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                        const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out,
                        CachingAllocator& alloc, cudaStream_t s, const TensorView* residual = nullptr);

// Tuning().moe_predict (with moe_prefetch_previous): the stream's batch-1 routing prediction,
// kMoePredictionInts ints: the predicted ids at [0, 16), the predicting launch's tag at
// [kMoePredictionTag], the down kernel's count of picks and of picks predicted at
// [kMoePredictionHits, +2), the predicted logits (floats) at [kMoePredictionLogits, +128) and
// their CTAs' arrival counter at kMoePredictionArrivals (zero between launches). Null where the
// stream's scratch cannot be had.
// NextMoePredictionTag: the tag of the predicting launch being issued on s (never 0; o_proj's,
// gemv.cu), written beside the picks; the MoE launched next on s prefetches them where it has
// one (the picks are complete by then: the norm-router between waits on o_proj).
constexpr int kMoePredictionTag = 32, kMoePredictionHits = 40, kMoePredictionLogits = 64,
              kMoePredictionArrivals = 192, kMoePredictionInts = 256, kMoePredictionMaxExperts = 128;
int32_t* MoePredictedPicks(cudaStream_t s);
int NextMoePredictionTag(cudaStream_t s);
// Tuning().moe_prefetch_qkv: the top_k picks of the batch-1 MoE over `w_gate_up` in the last
// forward on s (the down kernel records them; zeros before the first), or null.
const int32_t* MoePreviousPicks(const void* w_gate_up, int top_k, cudaStream_t s);

// The same two launches over block-scaled e4m3 weights (Backend::MoeExpertsFp8, weight-only
// regime): 16-byte loads of 16 e4m3 weights, converted in registers, times x (bf16) or act
// (f32); each 16-column chunk lies in one 128-column block, whose scale multiplies the chunk's
// dot product. Validated by MoeExpertsFp8 (moe_fp8.cu); H and I multiples of 16.
void MoeExpertsPairGemvFp8(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                           const TensorView& w_gate_up, const TensorView& gu_scale, const TensorView& w_down,
                           const TensorView& d_scale, const TensorView& out, CachingAllocator& alloc,
                           cudaStream_t s);

}  // namespace corolla::cuda
