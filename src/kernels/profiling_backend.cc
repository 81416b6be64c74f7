#include "kernels/profiling_backend.h"

#include <algorithm>
#include <chrono>
#include <map>

namespace corolla {
namespace {

class HostOpClock final : public OpClock {
 public:
  explicit HostOpClock(Backend& backend) : backend_(backend) {}
  void Reset() override { marks_.clear(); }
  void Mark() override {
    backend_.Synchronize();
    marks_.push_back(std::chrono::steady_clock::now());
  }
  std::vector<double> IntervalsMs() override {
    std::vector<double> ms;
    for (size_t i = 1; i < marks_.size(); ++i)
      ms.push_back(std::chrono::duration<double, std::milli>(marks_[i] - marks_[i - 1]).count());
    return ms;
  }

 private:
  Backend& backend_;
  std::vector<std::chrono::steady_clock::time_point> marks_;
};

std::string Dims(const TensorView& t) {
  std::string s;
  for (int i = 0; i < t.rank(); ++i) s += (i ? "x" : "") + std::to_string(t.dim(i));
  return s;
}

}  // namespace

std::unique_ptr<OpClock> MakeHostOpClock(Backend& backend) { return std::make_unique<HostOpClock>(backend); }

void ProfilingBackend::StartRecording(OpClock* clock) {
  clock_ = clock;
  labels_.clear();
  clock_->Reset();
}

std::vector<std::string> ProfilingBackend::StopRecording() {
  if (clock_ != nullptr) clock_->Mark();  // the end of the last op
  clock_ = nullptr;
  return std::move(labels_);
}

bool ProfilingBackend::Mark(std::string label) {
  for (const std::string& name : skip_)  // the label, or its first words
    if (label.compare(0, name.size(), name) == 0 && (label.size() == name.size() || label[name.size()] == ' '))
      return false;
  if (clock_ == nullptr) return true;
  clock_->Mark();
  labels_.push_back(std::move(label));
  return true;
}

void ProfilingBackend::CopyFromHost(const void* src, const TensorView& dst) {
  if (!Mark("CopyFromHost")) return;
  inner_->CopyFromHost(src, dst);
}
void ProfilingBackend::Embedding(const TensorView& ids, const TensorView& table, const TensorView& out) {
  if (!Mark("Embedding")) return;
  inner_->Embedding(ids, table, out);
}
void ProfilingBackend::RmsNorm(const TensorView& x, const TensorView& w, float eps, const TensorView& out,
                               const TensorView* residual) {
  if (!Mark(residual ? "RmsNorm+residual" : "RmsNorm")) return;
  inner_->RmsNorm(x, w, eps, out, residual);
}
void ProfilingBackend::HeadRmsNorm(const TensorView& x, const TensorView& w, float eps) {
  if (!Mark("HeadRmsNorm")) return;
  inner_->HeadRmsNorm(x, w, eps);
}
void ProfilingBackend::Rope(const TensorView& q, const TensorView& k, const TensorView& positions,
                            const RopeParams& params) {
  if (!Mark("Rope")) return;
  inner_->Rope(q, k, positions, params);
}
void ProfilingBackend::QkNormRopeKvWrite(const TensorView& q, const TensorView& k, const TensorView& v,
                                         const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                                         const TensorView& positions, const RopeParams& rope,
                                         const KvCacheView& cache, const AttentionBatch& batch) {
  if (!Mark("QkNormRopeKvWrite")) return;
  inner_->QkNormRopeKvWrite(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, cache, batch);
}
void ProfilingBackend::MoeRouter(const TensorView& x, const TensorView& w_router, const MoeRouting& routing,
                                 const TensorView& topk_ids, const TensorView& topk_weights) {
  if (!Mark("MoeRouter")) return;
  inner_->MoeRouter(x, w_router, routing, topk_ids, topk_weights);
}
void ProfilingBackend::RmsNormMoeRouter(const TensorView& y, const TensorView& norm_w, float eps,
                                        const TensorView& sum, const TensorView& x, const TensorView& w_router,
                                        const MoeRouting& routing, const TensorView& topk_ids,
                                        const TensorView& topk_weights) {
  if (!Mark("RmsNormMoeRouter")) return;
  inner_->RmsNormMoeRouter(y, norm_w, eps, sum, x, w_router, routing, topk_ids, topk_weights);
}
void ProfilingBackend::RmsNormLinear(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum,
                                     const TensorView& x, const TensorView& w, const TensorView& out) {
  if (!Mark("RmsNormLinear " + std::to_string(w.dim(1)) + "->" + std::to_string(w.dim(0)) + " " + DTypeName(w.dtype)))
    return;
  inner_->RmsNormLinear(y, norm_w, eps, sum, x, w, out);
}
void ProfilingBackend::MoeExpertsResidual(const TensorView& x, const TensorView& topk_ids,
                                          const TensorView& topk_weights, const TensorView& w_gate_up,
                                          const TensorView& w_down, const TensorView& out, const TensorView& sum) {
  if (!Mark("MoeExperts+residual")) return;
  if (observe_ids_) observe_ids_(topk_ids, static_cast<int>(w_gate_up.dim(0)));
  inner_->MoeExpertsResidual(x, topk_ids, topk_weights, w_gate_up, w_down, out, sum);
}
void ProfilingBackend::NormLinear(const TensorView& norm_w, float eps, const TensorView& sum, const TensorView& x,
                                  const TensorView& w, const TensorView& out) {
  if (!Mark("NormLinear " + std::to_string(w.dim(1)) + "->" + std::to_string(w.dim(0)) + " " + DTypeName(w.dtype)))
    return;
  inner_->NormLinear(norm_w, eps, sum, x, w, out);
}
void ProfilingBackend::QkNormRopeAttention(const TensorView& q, const TensorView& k, const TensorView& v,
                                           const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                                           const TensorView& positions, const RopeParams& rope,
                                           const KvCacheView& cache, const AttentionBatch& batch, float scale,
                                           const TensorView& out) {
  if (!inner_->fuses_qk_norm_rope_attention(batch))  // the two ops under their own labels
    return Backend::QkNormRopeAttention(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, cache, batch, scale, out);
  if (!Mark("QkNormRopeAttention D" + std::to_string(q.dim(2)))) return;
  inner_->QkNormRopeAttention(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, cache, batch, scale, out);
}
void ProfilingBackend::Linear(const TensorView& x, const TensorView& w, const TensorView& out) {
  // Weight shape [N, K] names the projection; rows of every layer add up under one label.
  if (!Mark("Linear " + std::to_string(w.dim(1)) + "->" + std::to_string(w.dim(0)) + " " + DTypeName(w.dtype)))
    return;
  inner_->Linear(x, w, out);
}
void ProfilingBackend::LinearFp8(const TensorView& x, const TensorView& w, const TensorView& w_scale,
                                 const TensorView& out) {
  if (!Mark("LinearFp8 " + std::to_string(w.dim(1)) + "->" + std::to_string(w.dim(0)))) return;
  inner_->LinearFp8(x, w, w_scale, out);
}
void ProfilingBackend::MoeExpertsFp8(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                                     const TensorView& w_gate_up, const TensorView& gu_scale,
                                     const TensorView& w_down, const TensorView& d_scale, const TensorView& out) {
  if (!Mark("MoeExpertsFp8")) return;
  if (observe_ids_) observe_ids_(topk_ids, static_cast<int>(w_gate_up.dim(0)));
  inner_->MoeExpertsFp8(x, topk_ids, topk_weights, w_gate_up, gu_scale, w_down, d_scale, out);
}
bool ProfilingBackend::DecodeMoeStack(const MoeDecoderStack& stack, const AttentionBatch& batch,
                                      const TensorView& positions, const TensorView& sum, const TensorView& x) {
  if (!Mark("DecodeMoeStack")) return true;
  const bool taken = inner_->DecodeMoeStack(stack, batch, positions, sum, x);
  // Declined: the caller's ops follow under their own labels; this mark's interval is ~empty.
  if (!taken && clock_ != nullptr) labels_.back() = std::string("DecodeMoeStack") + kDeclined;
  return taken;
}
void ProfilingBackend::BatchedLinear(const TensorView& x, const TensorView& w, const TensorView& out) {
  // w [B, N, K]: B projections of K -> N (MLA's absorbed per-head GEMMs).
  if (!Mark("BatchedLinear " + std::to_string(w.dim(0)) + "x " + std::to_string(w.dim(2)) + "->" +
       std::to_string(w.dim(1)) + " " + DTypeName(w.dtype)))
    return;
  inner_->BatchedLinear(x, w, out);
}
void ProfilingBackend::SiluMul(const TensorView& gate_up, const TensorView& out) {
  if (!Mark("SiluMul")) return;
  inner_->SiluMul(gate_up, out);
}
void ProfilingBackend::GatherRows(const TensorView& x, const TensorView& rows, const TensorView& out) {
  if (!Mark("GatherRows")) return;
  inner_->GatherRows(x, rows, out);
}
void ProfilingBackend::Copy(const TensorView& src, const TensorView& dst) {
  if (!Mark("Copy " + Dims(src))) return;
  inner_->Copy(src, dst);
}
void ProfilingBackend::Add(const TensorView& x, const TensorView& y) {
  if (!Mark("Add")) return;
  inner_->Add(x, y);
}
void ProfilingBackend::KvWrite(const TensorView& k, const TensorView& v, const KvCacheView& cache,
                               const AttentionBatch& batch) {
  if (!Mark("KvWrite")) return;
  inner_->KvWrite(k, v, cache, batch);
}
void ProfilingBackend::Attention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
                                 float scale, const TensorView& out) {
  // MLA's absorbed form reads one latent tensor as K and V; its decode steps run their own kernel on CUDA.
  const bool latent = cache.k.data == cache.v.data;
  const std::string dims = std::to_string(q.dim(2)) + (out.dim(2) != q.dim(2) ? "/" + std::to_string(out.dim(2)) : "");
  if (!Mark("Attention D" + dims + (latent ? batch.max_q_len == 1 ? " latent decode" : " latent" : ""))) return;
  inner_->Attention(q, cache, batch, scale, out);
}
void ProfilingBackend::MoeRoute(const TensorView& router_logits, const MoeRouting& routing,
                                const TensorView& topk_ids, const TensorView& topk_weights) {
  if (!Mark("MoeRoute")) return;
  inner_->MoeRoute(router_logits, routing, topk_ids, topk_weights);
}
void ProfilingBackend::MoeExperts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                                  const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out) {
  if (!Mark("MoeExperts")) return;
  if (observe_ids_) observe_ids_(topk_ids, static_cast<int>(w_gate_up.dim(0)));
  inner_->MoeExperts(x, topk_ids, topk_weights, w_gate_up, w_down, out);
}
void ProfilingBackend::SigmoidMul(const TensorView& x, const TensorView& gate) {
  if (!Mark("SigmoidMul")) return;
  inner_->SigmoidMul(x, gate);
}
void ProfilingBackend::CausalConv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                                    const TensorView& state_slots, const AttentionBatch& batch,
                                    const TensorView& out) {
  if (!Mark("CausalConv1d")) return;
  inner_->CausalConv1d(x, weight, conv_state, state_slots, batch, out);
}
void ProfilingBackend::GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const TensorView& a, const TensorView& b, const TensorView& a_log,
                                      const TensorView& dt_bias, const TensorView& state,
                                      const TensorView& state_slots, const AttentionBatch& batch,
                                      const TensorView& out) {
  if (!Mark("GatedDeltaRule")) return;
  inner_->GatedDeltaRule(q, k, v, a, b, a_log, dt_bias, state, state_slots, batch, out);
}
void ProfilingBackend::GatedRmsNorm(const TensorView& x, const TensorView& z, const TensorView& w, float eps,
                                    const TensorView& out) {
  if (!Mark("GatedRmsNorm")) return;
  inner_->GatedRmsNorm(x, z, w, eps, out);
}
void ProfilingBackend::Sample(const TensorView& logits, const SamplingParams* params, const uint64_t* steps,
                              int32_t* out_ids) {
  Mark("Sample");
  inner_->Sample(logits, params, steps, out_ids);
}

std::unique_ptr<Backend::PendingIds> ProfilingBackend::SampleAsync(const TensorView& logits,
                                                                    const SamplingParams* params,
                                                                    const uint64_t* steps, const TensorView& ids) {
  Mark("Sample");
  return inner_->SampleAsync(logits, params, steps, ids);
}

std::vector<OpTime> AggregateOpTimes(const std::vector<std::string>& labels, const std::vector<double>& ms) {
  std::map<std::string, OpTime> by_label;
  for (size_t i = 0; i < labels.size() && i < ms.size(); ++i) {
    OpTime& row = by_label[labels[i]];
    row.label = labels[i];
    ++row.calls;
    row.total_ms += ms[i];
  }
  std::vector<OpTime> rows;
  for (auto& [label, row] : by_label) rows.push_back(row);
  std::sort(rows.begin(), rows.end(), [](const OpTime& a, const OpTime& b) { return a.total_ms > b.total_ms; });
  return rows;
}

}  // namespace corolla
