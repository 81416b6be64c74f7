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
  const int64_t tokens = router_logits.dim(0), experts = router_logits.dim(1);
  const int k = routing.top_k, groups = routing.num_groups;
  COROLLA_CHECK(k >= 1 && k <= experts && topk_ids.dim(1) == k && topk_weights.dim(1) == k &&
                groups >= 1 && experts % groups == 0 && routing.topk_groups <= groups);
  const float* bias = routing.correction_bias.data ? routing.correction_bias.ptr<float>() : nullptr;
  COROLLA_CHECK(!bias || routing.correction_bias.numel() == experts);
  const int64_t per_group = experts / groups;
  std::vector<float> probs(experts), choice(experts), group_score(groups);
  std::vector<int32_t> order(experts), group_order(groups);
  // Highest first; ties to the lower index.
  auto by = [](const std::vector<float>& v) {
    return [&v](int32_t a, int32_t b) { return v[a] != v[b] ? v[a] > v[b] : a < b; };
  };
  for (int64_t t = 0; t < tokens; ++t) {
    const float* logit = router_logits.ptr<float>() + t * router_logits.strides[0];
    if (routing.sigmoid) {
      for (int64_t e = 0; e < experts; ++e) probs[e] = 1.0f / (1.0f + std::exp(-logit[e]));
    } else {
      float max_logit = *std::max_element(logit, logit + experts);
      double sum = 0;
      for (int64_t e = 0; e < experts; ++e) sum += probs[e] = std::exp(logit[e] - max_logit);
      for (int64_t e = 0; e < experts; ++e) probs[e] = static_cast<float>(probs[e] / sum);
    }
    // Selection scores: biased for DeepSeek; limited to the best groups (others score 0, as
    // the reference masks them).
    for (int64_t e = 0; e < experts; ++e) choice[e] = bias ? probs[e] + bias[e] : probs[e];
    if (groups > 1) {
      for (int g = 0; g < groups; ++g) {
        const float* c = choice.data() + g * per_group;
        float best = -INFINITY, second = -INFINITY;
        for (int64_t i = 0; i < per_group; ++i) {
          if (c[i] > best) {
            second = best;
            best = c[i];
          } else if (c[i] > second) {
            second = c[i];
          }
        }
        group_score[g] = per_group > 1 ? best + second : best;
      }
      std::iota(group_order.begin(), group_order.end(), 0);
      std::partial_sort(group_order.begin(), group_order.begin() + routing.topk_groups, group_order.end(),
                        by(group_score));
      std::vector<bool> keep(groups, false);
      for (int i = 0; i < routing.topk_groups; ++i) keep[group_order[i]] = true;
      for (int64_t e = 0; e < experts; ++e)
        if (!keep[e / per_group]) choice[e] = 0.0f;
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), by(choice));
    double norm = 0;
    for (int i = 0; i < k; ++i) norm += probs[order[i]];
    if (routing.sigmoid) norm += 1e-20;
    int32_t* ids = topk_ids.ptr<int32_t>() + t * topk_ids.strides[0];
    float* w = topk_weights.ptr<float>() + t * topk_weights.strides[0];
    for (int i = 0; i < k; ++i) {
      ids[i] = order[i];
      float weight = routing.renormalize ? static_cast<float>(probs[order[i]] / norm) : probs[order[i]];
      w[i] = weight * routing.scaling_factor;
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
      if (e < 0 || e >= experts) continue;  // another rank's expert (expert parallelism)
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
