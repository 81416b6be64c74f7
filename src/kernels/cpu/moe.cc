// Mixture-of-experts on the CPU: softmax top-k routing, then each expert's SwiGLU FFN over the
// tokens routed to it (gathered into one matrix, so the FFN is two sgemm calls), weighted and
// scattered back.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/thread_pool.h"
#include "kernels/cpu/ops.h"

namespace corolla::cpu {

void MoeRoute(const TensorView& router_logits, const MoeRouting& routing,
              const TensorView& topk_ids, const TensorView& topk_weights) {
  COROLLA_CHECK(router_logits.dtype == DType::kF32 && topk_ids.dtype == DType::kI32 &&
                topk_weights.dtype == DType::kF32);
  int64_t tokens = router_logits.dim(0), experts = router_logits.dim(1);
  int k = routing.top_k;
  COROLLA_CHECK(k >= 1 && k <= experts && topk_ids.dim(1) == k && topk_weights.dim(1) == k);
  std::vector<float> probs(experts);
  std::vector<int32_t> order(experts);
  for (int64_t t = 0; t < tokens; ++t) {
    const float* logit = router_logits.ptr<float>() + t * router_logits.strides[0];
    float max_logit = *std::max_element(logit, logit + experts);
    double sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += probs[e] = std::exp(logit[e] - max_logit);
    for (int64_t e = 0; e < experts; ++e) probs[e] = static_cast<float>(probs[e] / sum);
    std::iota(order.begin(), order.end(), 0);
    // Highest probability first; ties to the lower expert id.
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
    });
    float norm = 0;
    for (int i = 0; i < k; ++i) norm += probs[order[i]];
    int32_t* ids = topk_ids.ptr<int32_t>() + t * topk_ids.strides[0];
    float* w = topk_weights.ptr<float>() + t * topk_weights.strides[0];
    for (int i = 0; i < k; ++i) {
      ids[i] = order[i];
      w[i] = routing.renormalize ? probs[order[i]] / norm : probs[order[i]];
    }
  }
}

void MoeExperts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out) {
  int64_t tokens = x.dim(0), hidden = x.dim(1), k = topk_ids.dim(1);
  int64_t experts = w_gate_up.dim(0), inter = w_down.dim(2);
  COROLLA_CHECK(w_gate_up.dim(1) == 2 * inter && w_gate_up.dim(2) == hidden &&
                w_down.dim(0) == experts && w_down.dim(1) == hidden && out.dim(1) == hidden)
      << "moe x " << x.ToString() << " gate_up " << w_gate_up.ToString() << " down "
      << w_down.ToString();

  // Group (token, slot) pairs by expert.
  std::vector<std::vector<int64_t>> routed(experts);
  const int32_t* ids = topk_ids.ptr<int32_t>();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t s = 0; s < k; ++s) {
      int32_t e = ids[t * topk_ids.strides[0] + s];
      COROLLA_CHECK(e >= 0 && e < experts) << "expert id " << e;
      routed[e].push_back(t * k + s);
    }

  for (int64_t t = 0; t < tokens; ++t)
    std::fill_n(out.ptr<float>() + t * out.strides[0], hidden, 0.0f);

  for (int64_t e = 0; e < experts; ++e) {
    int64_t n = static_cast<int64_t>(routed[e].size());
    if (n == 0) continue;
    Tensor xe = Tensor::Empty(DType::kF32, {n, hidden});
    for (int64_t i = 0; i < n; ++i) {
      const float* src = x.ptr<float>() + (routed[e][i] / k) * x.strides[0];
      std::copy_n(src, hidden, xe.ptr<float>() + i * hidden);
    }
    Tensor gate_up = Tensor::Empty(DType::kF32, {n, 2 * inter});
    Tensor act = Tensor::Empty(DType::kF32, {n, inter});
    Tensor ye = Tensor::Empty(DType::kF32, {n, hidden});
    Linear(xe, w_gate_up.Index(e), gate_up);
    SiluMul(gate_up, act);
    Linear(act, w_down.Index(e), ye);
    for (int64_t i = 0; i < n; ++i) {
      int64_t t = routed[e][i] / k, s = routed[e][i] % k;
      float weight = topk_weights.ptr<float>()[t * topk_weights.strides[0] + s];
      float* o = out.ptr<float>() + t * out.strides[0];
      const float* y = ye.ptr<float>() + i * hidden;
      for (int64_t j = 0; j < hidden; ++j) o[j] += weight * y[j];
    }
  }
}

}  // namespace corolla::cpu
