// ProfilingBackend: a Backend that forwards every call to another one and, while recording,
// marks the boundary before each op on an OpClock. The time between two consecutive marks is
// the first op's; `bench decode|prefill --breakdown` aggregates them by label into a per-op
// table of one forward. Labels name the op and, where one op serves several roles (Linear),
// its shape, so the rows of different layers add up. Tests derive from it to change one of the
// inner backend's answers (model/residual_fold_test.cc).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"

namespace corolla {

// Boundaries between ops on the device's timeline. Times between marks must be what the
// device spent, not host gaps: the CUDA clock records events (as graph nodes when the forward
// is captured and replayed); the host clock reads a steady clock after synchronising.
class OpClock {
 public:
  virtual ~OpClock() = default;
  virtual void Reset() = 0;  // forget earlier marks
  virtual void Mark() = 0;   // a boundary at this point of the stream
  // Milliseconds between consecutive marks of the last completed run (waits for the device).
  virtual std::vector<double> IntervalsMs() = 0;
};

// Host steady clock after Synchronize() at each mark: exact for the CPU backend, whose ops
// run on the calling thread.
std::unique_ptr<OpClock> MakeHostOpClock(Backend& backend);

class ProfilingBackend : public Backend {
 public:
  explicit ProfilingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  Backend& inner() { return *inner_; }
  void PlanStep(const AttentionBatch& batch, int64_t tokens) override { inner_->PlanStep(batch, tokens); }
  void HintMoeRouting(const TensorView& norm_w, const TensorView& sum, const TensorView& router,
                      const TensorView& gate_up, const TensorView& down, int top_k) override {
    inner_->HintMoeRouting(norm_w, sum, router, gate_up, down, top_k);
  }

  // Marks before each op (and once more at StopRecording) on `clock` until StopRecording.
  void StartRecording(OpClock* clock);
  // The labels of the recorded ops, one per interval of the clock.
  std::vector<std::string> StopRecording();
  // Ops whose label is one of `names`, or starts with one of them and a space ("Linear" for every
  // Linear, "Linear 4096->2048" for one shape), are not run at all (`bench decode --skip-op`):
  // the step time without them is their marginal cost inside the replayed graph, overlaps
  // included. The results are wrong then; only the timing means anything.
  void SkipOps(std::vector<std::string> names) { skip_ = std::move(names); }
  // Called with each routed-experts op's topk_ids and expert count (MoeExperts, its residual and
  // FP8 forms) before the op runs, until reset with an empty function (`bench prefill
  // --expert-load`).
  using ExpertIdsObserver = std::function<void(const TensorView& topk_ids, int experts)>;
  void ObserveExpertIds(ExpertIdsObserver fn) { observe_ids_ = std::move(fn); }
  // Appended to the recorded label of an op the inner backend declined (DecodeMoeStack: the
  // caller's ops ran instead); skipping such an op would skip what replaced it.
  static constexpr const char* kDeclined = " (declined)";

  Device device() const override { return inner_->device(); }
  std::string name() const override { return inner_->name(); }
  DType activation_dtype() const override { return inner_->activation_dtype(); }
  Tensor Empty(DType dtype, Shape shape) override { return inner_->Empty(dtype, shape); }
  Tensor LoadWeight(const TensorView& src) override { return inner_->LoadWeight(src); }
  Tensor LoadWeightConcat(const std::vector<TensorView>& srcs) override { return inner_->LoadWeightConcat(srcs); }
  void CopyToHost(const TensorView& src, void* dst) override { inner_->CopyToHost(src, dst); }
  void CopyFromHost(const void* src, const TensorView& dst) override;
  void Synchronize() override { inner_->Synchronize(); }
  Result<MemoryInfo> QueryMemory() override { return inner_->QueryMemory(); }

  void Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) override;
  void RmsNorm(const TensorView& x, const TensorView& w, float eps, const TensorView& out,
               const TensorView* residual) override;
  void HeadRmsNorm(const TensorView& x, const TensorView& w, float eps) override;
  void Rope(const TensorView& q, const TensorView& k, const TensorView& positions,
            const RopeParams& params) override;
  void QkNormRopeKvWrite(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_norm_w,
                         const TensorView& k_norm_w, float eps, const TensorView& positions, const RopeParams& rope,
                         const KvCacheView& cache, const AttentionBatch& batch) override;
  void MoeRouter(const TensorView& x, const TensorView& w_router, const MoeRouting& routing,
                 const TensorView& topk_ids, const TensorView& topk_weights) override;
  void Linear(const TensorView& x, const TensorView& w, const TensorView& out) override;
  void BatchedLinear(const TensorView& x, const TensorView& w, const TensorView& out) override;
  void SiluMul(const TensorView& gate_up, const TensorView& out) override;
  void GatherRows(const TensorView& x, const TensorView& rows, const TensorView& out) override;
  void Copy(const TensorView& src, const TensorView& dst) override;
  void Add(const TensorView& x, const TensorView& y) override;
  void KvWrite(const TensorView& k, const TensorView& v, const KvCacheView& cache,
               const AttentionBatch& batch) override;
  void Attention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch, float scale,
                 const TensorView& out) override;
  void MoeRoute(const TensorView& router_logits, const MoeRouting& routing, const TensorView& topk_ids,
                const TensorView& topk_weights) override;
  void MoeExperts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                  const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out) override;
  bool supports_linear_attention() const override { return inner_->supports_linear_attention(); }
  bool fuses_qk_norm_rope_attention(const AttentionBatch& batch) const override {
    return inner_->fuses_qk_norm_rope_attention(batch);
  }
  bool supports_linear_fp8(int64_t n, int64_t k) const override { return inner_->supports_linear_fp8(n, k); }
  void LinearFp8(const TensorView& x, const TensorView& w, const TensorView& w_scale, const TensorView& out) override;
  bool supports_moe_fp8(int64_t hidden, int64_t inter) const override {
    return inner_->supports_moe_fp8(hidden, inter);
  }
  void MoeExpertsFp8(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                     const TensorView& w_gate_up, const TensorView& gu_scale, const TensorView& w_down,
                     const TensorView& d_scale, const TensorView& out) override;
  // Recorded (and skipped) as one op, "DecodeMoeStack"; labelled kDeclined when the inner
  // backend declines (its ops follow under their own labels).
  bool DecodeMoeStack(const MoeDecoderStack& stack, const AttentionBatch& batch, const TensorView& positions,
                      const TensorView& sum, const TensorView& x) override;
  // One op, "RmsNormLinear K->N" (the inner backend's, fused or not).
  void RmsNormLinear(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum,
                     const TensorView& x, const TensorView& w, const TensorView& out) override;
  bool folds_moe_residual(int64_t tokens) const override { return inner_->folds_moe_residual(tokens); }
  // One op each, "MoeExperts+residual" and "NormLinear K->N" (the inner backend's, fused or not).
  void MoeExpertsResidual(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                          const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out,
                          const TensorView& sum) override;
  void NormLinear(const TensorView& norm_w, float eps, const TensorView& sum, const TensorView& x, const TensorView& w,
                  const TensorView& out) override;
  // One op, "RmsNormMoeRouter" (the inner backend's, fused or not).
  void RmsNormMoeRouter(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum,
                        const TensorView& x, const TensorView& w_router, const MoeRouting& routing,
                        const TensorView& topk_ids, const TensorView& topk_weights) override;
  // One op, "QkNormRopeAttention D<d>", where the inner backend may fuse it; otherwise
  // QkNormRopeKvWrite and Attention under their own labels.
  void QkNormRopeAttention(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_norm_w,
                           const TensorView& k_norm_w, float eps, const TensorView& positions, const RopeParams& rope,
                           const KvCacheView& cache, const AttentionBatch& batch, float scale,
                           const TensorView& out) override;
  void SigmoidMul(const TensorView& x, const TensorView& gate) override;
  void CausalConv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                    const TensorView& state_slots, const AttentionBatch& batch, const TensorView& out) override;
  void GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& a,
                      const TensorView& b, const TensorView& a_log, const TensorView& dt_bias,
                      const TensorView& state, const TensorView& state_slots, const AttentionBatch& batch,
                      const TensorView& out) override;
  void GatedRmsNorm(const TensorView& x, const TensorView& z, const TensorView& w, float eps,
                    const TensorView& out) override;
  bool supports_graphs() const override { return inner_->supports_graphs(); }
  Result<std::unique_ptr<Graph>> CaptureGraph(const std::function<void()>& fn) override {
    return inner_->CaptureGraph(fn);
  }
  void Sample(const TensorView& logits, const SamplingParams* params, const uint64_t* steps,
              int32_t* out_ids) override;
  std::unique_ptr<PendingIds> SampleAsync(const TensorView& logits, const SamplingParams* params,
                                          const uint64_t* steps, const TensorView& ids) override;

 private:
  // Marks the boundary before an op (while recording); false when the op is to be skipped.
  bool Mark(std::string label);

  std::unique_ptr<Backend> inner_;
  OpClock* clock_ = nullptr;
  std::vector<std::string> labels_;
  std::vector<std::string> skip_;
  ExpertIdsObserver observe_ids_;
};

// One row per label: calls, total and share of the summed time, sorted by total.
struct OpTime {
  std::string label;
  int calls = 0;
  double total_ms = 0;
};
std::vector<OpTime> AggregateOpTimes(const std::vector<std::string>& labels, const std::vector<double>& ms);

}  // namespace corolla
