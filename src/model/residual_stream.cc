#include "model/residual_stream.h"

namespace corolla {

ResidualStream::ResidualStream(Backend& backend, const ForwardBatch& batch, const Tensor& embed, int64_t hidden,
                               float eps, const Tensor& first_norm)
    : backend_(backend), eps_(eps) {
  const int64_t tokens = batch.token_ids.numel();
  const DType act = backend.activation_dtype();
  sum_ = backend.Empty(act, {tokens, hidden});
  x_ = backend.Empty(act, {tokens, hidden});
  y_ = backend.Empty(act, {tokens, hidden});
  backend.Embedding(batch.token_ids, embed, sum_);
  backend.RmsNorm(sum_, first_norm, eps_, x_, nullptr);
}

void ResidualStream::Add(const Tensor& norm) { backend_.RmsNorm(y_, norm, eps_, x_, &sum_.view()); }

void ResidualStream::Logits(const ForwardBatch& batch, const Tensor& lm_head, const TensorView& logits) {
  const int64_t rows = batch.logits_rows.numel();
  Tensor selected = backend_.Empty(backend_.activation_dtype(), {rows, x_.dim(1)});  // [N, H]
  backend_.GatherRows(x_, batch.logits_rows, selected);
  backend_.Linear(selected, lm_head, logits);
}

}  // namespace corolla
