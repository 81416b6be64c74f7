// ResidualStream: the pre-norm residual stream every supported decoder shares. It holds the
// running sum of the stream, the normed input of the next block (x) and the buffer a block
// writes its output to (y), all [T, H] in the backend's activation dtype, for one forward.
// Blocks read x and write y; Add folds y into the sum and norms it into x for the next block.
#pragma once

#include "kernels/backend.h"
#include "model/model.h"

namespace corolla {

class ResidualStream {
 public:
  // Embeds the batch's tokens and norms them with the first block's input norm.
  ResidualStream(Backend& backend, const ForwardBatch& batch, const Tensor& embed, int64_t hidden, float eps,
                 const Tensor& first_norm);

  const TensorView& x() const { return x_.view(); }  // [T, H] input of the next block
  const TensorView& y() const { return y_.view(); }  // [T, H] output of the block that ran
  const TensorView& sum() const { return sum_.view(); }  // [T, H] the running sum
  float eps() const { return eps_; }  // of the norms
  // sum += y; x = rmsnorm(sum) * norm.
  void Add(const Tensor& norm);
  // logits [N, V] = lm_head x[batch.logits_rows].
  void Logits(const ForwardBatch& batch, const Tensor& lm_head, const TensorView& logits);

 private:
  Backend& backend_;
  float eps_;
  Tensor sum_, x_, y_;
};

}  // namespace corolla
