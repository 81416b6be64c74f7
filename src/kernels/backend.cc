// Defaults of the optional Backend operations: a backend that lacks them says so through
// supports_*() before a model uses them; reaching one of these is a bug in that check.
// SampleAsync's default is complete, only synchronous: it serves the CPU backend.
#include "kernels/backend.h"

namespace corolla {
namespace {
[[noreturn]] void Missing(const Backend& backend, const char* op) {
  COROLLA_CHECK(false) << op << " is not implemented on the " << backend.name() << " backend";
  __builtin_unreachable();
}

// Ids that were on the host before SampleAsync returned.
class ReadyIds final : public Backend::PendingIds {
 public:
  explicit ReadyIds(std::vector<int32_t> ids) : ids_(std::move(ids)) {}
  const int32_t* Wait() override { return ids_.data(); }

 private:
  std::vector<int32_t> ids_;
};
}  // namespace

std::unique_ptr<Backend::PendingIds> Backend::SampleAsync(const TensorView& logits, const SamplingParams* params,
                                                          const uint64_t* steps, const TensorView& ids) {
  COROLLA_CHECK(ids.dtype == DType::kI32 && ids.numel() == logits.dim(0) && ids.is_contiguous())
      << "sample ids " << ids.ToString() << " for logits " << logits.ToString();
  std::vector<int32_t> host(logits.dim(0));
  Sample(logits, params, steps, host.data());
  CopyFromHost(host.data(), ids);
  return std::make_unique<ReadyIds>(std::move(host));
}

void Backend::SigmoidMul(const TensorView&, const TensorView&) { Missing(*this, "SigmoidMul"); }
void Backend::LinearFp8(const TensorView&, const TensorView&, const TensorView&, const TensorView&) {
  Missing(*this, "LinearFp8");
}
void Backend::MoeExpertsFp8(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                            const TensorView&, const TensorView&, const TensorView&, const TensorView&) {
  Missing(*this, "MoeExpertsFp8");
}
void Backend::CausalConv1d(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                           const AttentionBatch&, const TensorView&) {
  Missing(*this, "CausalConv1d");
}
void Backend::GatedDeltaRule(const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                             const TensorView&, const TensorView&, const TensorView&, const TensorView&,
                             const TensorView&, const AttentionBatch&, const TensorView&) {
  Missing(*this, "GatedDeltaRule");
}
void Backend::GatedRmsNorm(const TensorView&, const TensorView&, const TensorView&, float, const TensorView&) {
  Missing(*this, "GatedRmsNorm");
}

void Backend::QkNormRopeKvWrite(const TensorView& q, const TensorView& k, const TensorView& v,
                                const TensorView& q_norm_w, const TensorView& k_norm_w, float eps,
                                const TensorView& positions, const RopeParams& rope, const KvCacheView& cache,
                                const AttentionBatch& batch) {
  HeadRmsNorm(q, q_norm_w, eps);
  HeadRmsNorm(k, k_norm_w, eps);
  Rope(q, k, positions, rope);
  KvWrite(k, v, cache, batch);
}

void Backend::MoeRouter(const TensorView& x, const TensorView& w_router, const MoeRouting& routing,
                        const TensorView& topk_ids, const TensorView& topk_weights) {
  Tensor logits = Empty(DType::kF32, {x.dim(0), w_router.dim(0)});  // [T, E]
  Linear(x, w_router, logits);
  MoeRoute(logits, routing, topk_ids, topk_weights);
}

}  // namespace corolla
