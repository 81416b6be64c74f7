// Defaults of the optional Backend operations: a backend that lacks them says so through
// supports_*() before a model uses them; reaching one of these is a bug in that check.
#include "kernels/backend.h"

namespace corolla {
namespace {
[[noreturn]] void Missing(const Backend& backend, const char* op) {
  COROLLA_CHECK(false) << op << " is not implemented on the " << backend.name() << " backend";
  __builtin_unreachable();
}
}  // namespace

void Backend::SigmoidMul(const TensorView&, const TensorView&) { Missing(*this, "SigmoidMul"); }
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

}  // namespace corolla
