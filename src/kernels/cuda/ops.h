// The host-visible surface of the CUDA kernels: one launcher per Backend op. Each launcher
// validates its tensors in one line, then enqueues on `stream` without synchronising.
// Activations and the KV cache are bf16 (router logits / weights f32, ids i32) unless stated.
// Launchers are thread-compatible: callers serialise use of a stream.
#pragma once

#include <cuda_runtime.h>

#include "kernels/backend.h"
#include "kernels/cuda/allocator.h"

namespace corolla::cuda {

// Scratch device memory for the duration of one op; returned to the allocator at scope end
// (stream order makes the reuse safe).
class ScratchBuffer {
 public:
  ScratchBuffer(CachingAllocator& alloc, size_t bytes)
      : alloc_(alloc), ptr_(bytes ? alloc.Allocate(bytes) : nullptr) {}
  ~ScratchBuffer() { alloc_.Free(ptr_); }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }

 private:
  CachingAllocator& alloc_;
  void* ptr_;
};

// Process-wide choices between kernel variants, read at each launch (tests and benchmarks set
// them to sweep both sides; COROLLA_MOE_DECODE_MAX_PAIRS / COROLLA_ATTN_SPLIT_MIN_CTAS in the
// environment set the defaults). Not synchronised: set them before launching work.
struct KernelTuning {
  // MoeExperts uses the memory-bound GEMV kernels when tokens * top_k <= this.
  int64_t moe_decode_max_pairs = 1024;
  // MoeExperts counts, scans and permutes in one CTA when the batch is small enough.
  bool moe_fused_permute = true;
  // Decode attention splits each sequence's keys across CTAs until the grid has at least this
  // many CTAs (0: never split).
  int attention_split_min_ctas = 264;
};
KernelTuning& Tuning();

// elementwise.cu
void GatherRows(const TensorView& x, const TensorView& rows, const TensorView& out, cudaStream_t s);
void RmsNorm(const TensorView& x, const TensorView& w, float eps, const TensorView& out,
             const TensorView* residual, cudaStream_t s);
void HeadRmsNorm(const TensorView& x, const TensorView& w, float eps, cudaStream_t s);
// inv_freq: device [rotary_dim / 2], RopeInvFreq(params) (the backend caches it per params).
void Rope(const TensorView& q, const TensorView& k, const TensorView& positions,
          const RopeParams& params, const float* inv_freq, cudaStream_t s);
void Copy(const TensorView& src, const TensorView& dst, cudaStream_t s);
void SiluMul(const TensorView& gate_up, const TensorView& out, cudaStream_t s);
void Add(const TensorView& x, const TensorView& y, cudaStream_t s);
void KvWrite(const TensorView& k, const TensorView& v, const KvCacheView& cache,
             const AttentionBatch& batch, cudaStream_t s);

// linear_attention.cu: Gated DeltaNet and the sigmoid gates (semantics: kernels/backend.h).
void SigmoidMul(const TensorView& x, const TensorView& gate, cudaStream_t s);
void CausalConv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                  const TensorView& state_slots, const AttentionBatch& batch, const TensorView& out,
                  cudaStream_t s);
void GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& a,
                    const TensorView& b, const TensorView& a_log, const TensorView& dt_bias,
                    const TensorView& state, const TensorView& state_slots, const AttentionBatch& batch,
                    const TensorView& out, cudaStream_t s);
void GatedRmsNorm(const TensorView& x, const TensorView& z, const TensorView& w, float eps, const TensorView& out,
                  cudaStream_t s);

// attention.cu
void Attention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
               float scale, const TensorView& out, CachingAllocator& alloc, cudaStream_t s);

// moe.cu
void MoeRoute(const TensorView& router_logits, const MoeRouting& routing,
              const TensorView& topk_ids, const TensorView& topk_weights, cudaStream_t s);
void MoeExperts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out,
                CachingAllocator& alloc, cudaStream_t s);

// sampling.cu: one token per row of logits [B, V] (f32 or bf16, contiguous) into out_ids (host).
// Synchronises the stream (the ids are needed on the host).
void Sample(const TensorView& logits, const SamplingParams* params, const uint64_t* steps,
            int32_t* out_ids, CachingAllocator& alloc, cudaStream_t s);

}  // namespace corolla::cuda
