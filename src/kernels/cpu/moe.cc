// Mixture-of-experts on the CPU: softmax top-k routing, then each expert's SwiGLU FFN over the
// tokens routed to it (gathered into one matrix, so the FFN is two sgemm calls), weighted and
// scattered back.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/numeric.h"
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

void DequantizeFp8Blocks(const uint8_t* w, const float* scale, int64_t n, int64_t k, float* out) {
  float lut[256];
  for (int b = 0; b < 256; ++b) lut[b] = ToFloat(fp8e4m3::FromBits(static_cast<uint8_t>(b)));
  const int64_t groups = (k + kFp8Block - 1) / kFp8Block;
  for (int64_t r = 0; r < n; ++r) {
    const float* s = scale + (r / kFp8Block) * groups;
    for (int64_t i = 0; i < k; ++i) out[r * k + i] = lut[w[r * k + i]] * s[i / kFp8Block];
  }
}

namespace {
// rows [N, K] f32 in place -> e4m3(rows / s) * s per row and group of 128 (QuantizeFp8Groups).
void RoundThroughFp8(const TensorView& rows) {
  const int64_t n = rows.dim(0), k = rows.dim(1), groups = (k + kFp8Block - 1) / kFp8Block;
  std::vector<uint8_t> q(n * k);
  std::vector<float> s(n * groups);
  QuantizeFp8Groups(rows, q.data(), s.data());
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i)
      rows.ptr<float>()[r * k + i] = ToFloat(fp8e4m3::FromBits(q[r * k + i])) * s[r * groups + i / kFp8Block];
}
}  // namespace

void MoeExpertsFp8(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                   const TensorView& w_gate_up, const TensorView& gu_scale, const TensorView& w_down,
                   const TensorView& d_scale, const TensorView& out, bool quantize_activations) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1), k = topk_ids.dim(1);
  const int64_t experts = w_gate_up.dim(0), inter = w_down.dim(2);
  const int64_t h_blocks = (hidden + kFp8Block - 1) / kFp8Block, i_blocks = (inter + kFp8Block - 1) / kFp8Block;
  COROLLA_CHECK(x.dtype == DType::kF32 && out.dtype == DType::kF32 && w_gate_up.dtype == DType::kF8E4M3 &&
                w_down.dtype == DType::kF8E4M3 && gu_scale.dtype == DType::kF32 && d_scale.dtype == DType::kF32 &&
                w_gate_up.is_contiguous() && w_down.is_contiguous() && gu_scale.is_contiguous() &&
                d_scale.is_contiguous() && w_gate_up.dim(1) == 2 * inter && w_gate_up.dim(2) == hidden &&
                w_down.dim(0) == experts && w_down.dim(1) == hidden && out.dim(0) == tokens && out.dim(1) == hidden &&
                gu_scale.rank() == 3 && gu_scale.dim(0) == experts && gu_scale.dim(1) == 2 * i_blocks &&
                gu_scale.dim(2) == h_blocks && d_scale.rank() == 3 && d_scale.dim(0) == experts &&
                d_scale.dim(1) == h_blocks && d_scale.dim(2) == i_blocks)
      << "moe fp8 x " << x.ToString() << " gate_up " << w_gate_up.ToString() << " gu_scale " << gu_scale.ToString()
      << " down " << w_down.ToString() << " d_scale " << d_scale.ToString() << " out " << out.ToString();

  std::vector<std::vector<int64_t>> routed(experts);
  const int32_t* ids = topk_ids.ptr<int32_t>();
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t s = 0; s < k; ++s) {
      const int32_t e = ids[t * topk_ids.strides[0] + s];
      if (e >= 0 && e < experts) routed[e].push_back(t * k + s);
    }
  for (int64_t t = 0; t < tokens; ++t) std::fill_n(out.ptr<float>() + t * out.strides[0], hidden, 0.0f);

  Tensor wgu = Tensor::Empty(DType::kF32, {2 * inter, hidden});
  Tensor wd = Tensor::Empty(DType::kF32, {hidden, inter});
  for (int64_t e = 0; e < experts; ++e) {
    const int64_t n = static_cast<int64_t>(routed[e].size());
    if (n == 0) continue;
    // Gate rows, then up rows, each half with its own scale blocks.
    const uint8_t* gu = w_gate_up.ptr<uint8_t>() + e * 2 * inter * hidden;
    const float* gus = gu_scale.ptr<float>() + e * 2 * i_blocks * h_blocks;
    DequantizeFp8Blocks(gu, gus, inter, hidden, wgu.ptr<float>());
    DequantizeFp8Blocks(gu + inter * hidden, gus + i_blocks * h_blocks, inter, hidden,
                        wgu.ptr<float>() + inter * hidden);
    DequantizeFp8Blocks(w_down.ptr<uint8_t>() + e * hidden * inter, d_scale.ptr<float>() + e * h_blocks * i_blocks,
                        hidden, inter, wd.ptr<float>());
    Tensor xe = Tensor::Empty(DType::kF32, {n, hidden});
    for (int64_t i = 0; i < n; ++i)
      std::copy_n(x.ptr<float>() + (routed[e][i] / k) * x.strides[0], hidden, xe.ptr<float>() + i * hidden);
    if (quantize_activations) RoundThroughFp8(xe);
    Tensor gate_up = Tensor::Empty(DType::kF32, {n, 2 * inter});
    Tensor act = Tensor::Empty(DType::kF32, {n, inter});
    Tensor ye = Tensor::Empty(DType::kF32, {n, hidden});
    Linear(xe, wgu, gate_up);
    SiluMul(gate_up, act);
    if (quantize_activations) {  // as CUDA: act is written bf16 (the activation dtype), then quantised
      for (int64_t i = 0; i < n * inter; ++i) act.ptr<float>()[i] = ToFloat(ToBf16(act.ptr<float>()[i]));
      RoundThroughFp8(act);
    }
    Linear(act, wd, ye);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t t = routed[e][i] / k, s = routed[e][i] % k;
      const float weight = topk_weights.ptr<float>()[t * topk_weights.strides[0] + s];
      float* o = out.ptr<float>() + t * out.strides[0];
      const float* y = ye.ptr<float>() + i * hidden;
      for (int64_t j = 0; j < hidden; ++j) o[j] += weight * y[j];
    }
  }
}

}  // namespace corolla::cpu
