// CudaBackend: the Backend on one CUDA device (sm_90a). bf16 activations and KV cache, fp32
// accumulation; router logits and weights f32. Owns one non-blocking stream (every op is
// enqueued there, none synchronises the host except CopyToHost, Sample and Synchronize), a
// caching allocator shared with every Tensor it hands out (so tensors may outlive it), and the
// cuBLASLt state. Used by one thread at a time, as every Backend.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/allocator.h"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pinned_host.h"

namespace corolla::cuda {

class CudaBackend final : public Backend {
 public:
  static Result<std::unique_ptr<Backend>> Create(int device_idx);
  ~CudaBackend() override;

  Device device() const override { return Device::kCuda; }
  std::string name() const override { return "cuda"; }
  DType activation_dtype() const override { return DType::kBF16; }

  Tensor Empty(DType dtype, Shape shape) override;
  Tensor LoadWeight(const TensorView& host_src) override { return LoadWeightConcat({host_src}); }
  Tensor LoadWeightConcat(const std::vector<TensorView>& host_srcs) override;
  void CopyToHost(const TensorView& src, void* dst) override;
  // The source may be reused once this returns. Small copies go through pinned staging, so
  // the host does not wait for the stream (pageable ones may).
  void CopyFromHost(const void* src, const TensorView& dst) override;
  void Synchronize() override;
  // cudaMemGetInfo: memory held in the allocator's cache counts as used.
  Result<MemoryInfo> QueryMemory() override;

  void Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) override;
  void RmsNorm(const TensorView& x, const TensorView& w, float eps, const TensorView& out,
               const TensorView* residual) override;
  void HeadRmsNorm(const TensorView& x, const TensorView& w, float eps) override;
  void Rope(const TensorView& q, const TensorView& k, const TensorView& positions,
            const RopeParams& params) override;
  void QkNormRopeKvWrite(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_norm_w,
                         const TensorView& k_norm_w, float eps, const TensorView& positions, const RopeParams& rope,
                         const KvCacheView& cache, const AttentionBatch& batch) override;
  void QkNormRopeAttention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_norm_w,
                           const TensorView& k_norm_w, float eps, const TensorView& positions, const RopeParams& rope,
                           const KvCacheView& cache, const AttentionBatch& batch, float scale,
                           const TensorView& out) override;
  void QkNormRopeAttentionProj(const TensorView& q, const TensorView& k, const TensorView& v,
                               const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                               const TensorView& positions, const RopeParams& rope, const KvCacheView& cache,
                               const AttentionBatch& batch, float scale, const TensorView& attn, const TensorView& w_o,
                               const TensorView& out) override;
  bool fuses_qk_norm_rope_attention(const AttentionBatch& batch) const override;
  void Linear(const TensorView& x, const TensorView& w, const TensorView& out) override;
  // One strided-batched cuBLASLt matmul (one Linear per b where it has no algorithm).
  void BatchedLinear(const TensorView& x, const TensorView& w, const TensorView& out) override;
  void SiluMul(const TensorView& gate_up, const TensorView& out) override;
  void GatherRows(const TensorView& x, const TensorView& rows, const TensorView& out) override;
  void Copy(const TensorView& src, const TensorView& dst) override;
  void Add(const TensorView& x, const TensorView& y) override;
  void KvWrite(const TensorView& k, const TensorView& v, const KvCacheView& cache,
               const AttentionBatch& batch) override;
  void Attention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
                 float scale, const TensorView& out) override;
  void MoeRoute(const TensorView& router_logits, const MoeRouting& routing,
                const TensorView& topk_ids, const TensorView& topk_weights) override;
  void MoeExperts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                  const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out) override;
  bool supports_linear_attention() const override { return true; }
  void SigmoidMul(const TensorView& x, const TensorView& gate) override;
  void CausalConv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                    const TensorView& state_slots, const AttentionBatch& batch, const TensorView& out) override;
  void GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& a,
                      const TensorView& b, const TensorView& a_log, const TensorView& dt_bias,
                      const TensorView& state, const TensorView& state_slots, const AttentionBatch& batch,
                      const TensorView& out) override;
  void GatedRmsNorm(const TensorView& x, const TensorView& z, const TensorView& w, float eps,
                    const TensorView& out) override;
  void Sample(const TensorView& logits, const SamplingParams* params, const uint64_t* steps,
              int32_t* out_ids) override;
  // Ids copied to pinned memory behind an event: nothing here waits for the device.
  std::unique_ptr<PendingIds> SampleAsync(const TensorView& logits, const SamplingParams* params,
                                          const uint64_t* steps, const TensorView& ids) override;

  bool supports_graphs() const override { return true; }
  // Warm-up and capture with the allocator's graph pool on (relaxed capture mode).
  Result<std::unique_ptr<Graph>> CaptureGraph(const std::function<void()>& fn) override;
  void MoeRouter(const TensorView& x, const TensorView& w_router, const MoeRouting& routing,
                 const TensorView& topk_ids, const TensorView& topk_weights) override;
  // A second non-blocking stream, forked from and joined to the main one by events (legal in a
  // capture). While fn() runs, stream_ is the side stream and the cuBLASLt objects are the
  // side's own (their workspaces must not be shared by concurrent GEMMs); the allocator defers
  // frees from the fork to the join. Made on first use (a stream, two events, two workspaces).
  void RunOnSideStream(const std::function<void()>& fn) override;
  void JoinSideStream() override;

  // cuBLASLt block scaling for the weights it takes (fp8_gemm.h); the SIMT kernel for the rest.
  bool supports_linear_fp8(int64_t n, int64_t k) const override { return Fp8Linear::LtTakes(n, k); }
  void LinearFp8(const TensorView& x, const TensorView& w, const TensorView& w_scale, const TensorView& out) override;
  // FP8 routed experts (moe_fp8.h): weight-only pair GEMVs for a few pairs, grouped FP8 GEMMs above.
  bool supports_moe_fp8(int64_t hidden, int64_t inter) const override;
  void MoeExpertsFp8(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                     const TensorView& w_gate_up, const TensorView& gu_scale, const TensorView& w_down,
                     const TensorView& d_scale, const TensorView& out) override;

  // Every layer in one persistent launch where decode_stack.cu covers the shapes.
  bool DecodeMoeStack(const MoeDecoderStack& stack, const AttentionBatch& batch, const TensorView& positions,
                      const TensorView& sum, const TensorView& x) override;
  // One row: the staged GEMV with the norm folded in (gemv.cu), where it applies.
  void RmsNormLinear(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum,
                     const TensorView& x, const TensorView& w, const TensorView& out) override;
  // One token with Tuning().moe_residual_fold: the down kernel adds the experts' output into the
  // stream (moe_decode.cu) and the next qkv GEMV norms the sum as it stages it (gemv.cu).
  bool folds_moe_residual(int64_t tokens) const override;
  void MoeExpertsResidual(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                          const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out,
                          const TensorView& sum) override;
  void NormLinear(const TensorView& norm_w, float eps, const TensorView& sum, const TensorView& x, const TensorView& w,
                  const TensorView& out) override;
  // Notes whether one prompt chunk holds at least half the step's tokens; MoeExperts then takes
  // the prompt's tile heights (GroupedGemmTileRows).
  void PlanStep(const AttentionBatch& batch, int64_t tokens) override;
  // One token: the cluster norm-router or the staged router with the norm folded in (router.cu),
  // where one is on and applies.
  void RmsNormMoeRouter(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum,
                        const TensorView& x, const TensorView& w_router, const MoeRouting& routing,
                        const TensorView& topk_ids, const TensorView& topk_weights) override;
  // Kept for the next QkNormRopeAttentionProj's o_proj (LinearGemv's MoeRouteHint, which predicts
  // where Tuning().moe_predict is on) at one token; any attention op drops it.
  void HintMoeRouting(const TensorView& norm_w, const TensorView& sum, const TensorView& router,
                      const TensorView& gate_up, const TensorView& down, int top_k) override;

  cudaStream_t stream() const { return stream_; }
  Fp8Linear& fp8_linear() { return *fp8_linear_; }
  const CachingAllocator& allocator() const { return *alloc_; }

 private:
  CudaBackend(int device_idx, cudaStream_t stream);
  // RopeInvFreq(params) on the device, uploaded once per distinct set.
  const float* RopeFreqs(const RopeParams& params);

  const int device_idx_;
  cudaStream_t stream_;
  std::shared_ptr<CachingAllocator> alloc_;
  std::unique_ptr<LtLinear> linear_;
  std::unique_ptr<Fp8Linear> fp8_linear_;
  // The side stream and its GEMM state (swapped with stream_, linear_, fp8_linear_ inside
  // RunOnSideStream); null until first used.
  cudaStream_t side_stream_ = nullptr;
  cudaEvent_t fork_event_ = nullptr, join_event_ = nullptr;
  std::unique_ptr<LtLinear> side_linear_;
  std::unique_ptr<Fp8Linear> side_fp8_linear_;
  bool on_side_ = false;       // inside RunOnSideStream's fn()
  bool side_unjoined_ = false;  // RunOnSideStream ran; JoinSideStream has not
  // RopeParams' fields (all of them: what RopeInvFreq reads is a subset) -> RopeInvFreq on the
  // device, so a forward looks frequencies up without recomputing them each layer.
  using RopeKey = std::tuple<int, float, bool, float, int, float, float, float>;
  struct RopeTable {
    std::vector<float> host;  // the upload's source: alive as long as a captured graph may copy it
    Tensor device;
  };
  std::map<RopeKey, RopeTable> rope_freqs_;
  unsigned* decode_sync_ = nullptr;  // DecodeMoeStack's grid counters (zero between launches)
  bool prompt_step_ = false;         // PlanStep: a prompt chunk holds most of the step's tokens
  std::optional<cuda::MoeRouteHint> route_hint_;  // HintMoeRouting's, until an attention op
  HostStaging staging_;                              // pinned ring for CopyFromHost
  std::shared_ptr<HostIdsPool> host_ids_;            // SampleAsync's pinned buffers
};

}  // namespace corolla::cuda
