// The gated delta rule's two CUDA kernels share one parameter block: the recurrent kernel
// (linear_attention.cu, token by token: decode and short chunks) and the chunked WY/UT kernel
// on tensor cores (gated_delta_chunked.cu, long prefill chunks). linear_attention.cu's
// GatedDeltaRule validates the tensors and launches one or both; each kernel takes the sequences
// whose chunk length lies in [min_tokens, max_tokens) and leaves the others to the other one.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/common.cuh"

namespace corolla::cuda {

struct DeltaRuleParams {
  const bf16_t* q;  // [T, Hk, Dk] rows
  int64_t q_token_stride, q_head_stride;
  const bf16_t* k;
  int64_t k_token_stride, k_head_stride;
  const bf16_t* v;  // [T, Hv, Dv] rows
  int64_t v_token_stride, v_head_stride;
  const bf16_t* a;  // [T, Hv]
  int64_t a_stride;
  const bf16_t* b;
  int64_t b_stride;
  const float* a_log;
  const float* dt_bias;
  void* state;  // [slots, Hv, Dk, Dv] of StateT
  int64_t num_slots;
  const int32_t* slots;
  const int32_t* query_start;
  const int32_t* seq_lens;
  bf16_t* out;
  int64_t out_token_stride, out_head_stride;
  int hv, group, dv;
  float scale;
  int min_tokens, max_tokens;  // this launch's sequences: min_tokens <= chunk length < max_tokens
};

// Tokens per chunk of the chunked kernel and the value columns one of its CTAs owns.
inline constexpr int kDeltaChunkTokens = 64;
inline constexpr int kDeltaChunkCols = 32;

// True when the chunked kernel covers this layout: Dk in {32, 64, 128}, Dv a multiple of
// kDeltaChunkCols, q/k/v rows 16-byte aligned, out rows 4-byte aligned (bf16 pairs).
bool GatedDeltaChunkedSupports(int dk, const DeltaRuleParams& p);
// Enqueues the chunked kernel on grid (Dv / kDeltaChunkCols, Hv, num_seqs) for the sequences of
// p in [p.min_tokens, p.max_tokens); the caller checked GatedDeltaChunkedSupports.
void LaunchGatedDeltaChunked(const DeltaRuleParams& p, int dk, bool bf16_state, int num_seqs, cudaStream_t s);

}  // namespace corolla::cuda
