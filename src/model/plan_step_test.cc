// What a model's Forward tells the backend ahead of its ops. Backend::PlanStep: the step's shape
// before its layers run (the CUDA backend sizes the MoE grouped GEMM's tiles from it), for a
// prompt chunk and for a decode step alike, once a forward. Backend::HintMoeRouting: before each
// MoE layer's attention, that layer's router and norm and the residual the routing will start
// from (the CUDA backend's batch-1 o_proj predicts the experts from it).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/profiling_backend.h"
#include "model/model.h"
#include "model/model_test_util.h"

namespace corolla {
namespace {

// The CPU backend, recording each PlanStep's (max_q_len, tokens) and each HintMoeRouting.
class PlanRecordingCpu final : public ProfilingBackend {
 public:
  PlanRecordingCpu() : ProfilingBackend(MakeCpuBackend()) {}
  void PlanStep(const AttentionBatch& batch, int64_t tokens) override {
    plans.emplace_back(batch.max_q_len, tokens);
    ProfilingBackend::PlanStep(batch, tokens);
  }
  void HintMoeRouting(const TensorView& norm_w, const TensorView& sum, const TensorView& router,
                      const TensorView& gate_up, const TensorView& down, int top_k) override {
    hints.push_back({norm_w, sum, router, gate_up, down, top_k, attentions});
    ProfilingBackend::HintMoeRouting(norm_w, sum, router, gate_up, down, top_k);
  }
  void QkNormRopeAttentionProj(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& q_norm_w,
                               const TensorView& k_norm_w, float eps, const TensorView& positions,
                               const RopeParams& rope, const KvCacheView& cache, const AttentionBatch& batch,
                               float scale, const TensorView& attn, const TensorView& w_o,
                               const TensorView& out) override {
    ++attentions;
    ProfilingBackend::QkNormRopeAttentionProj(q, k, v, q_norm_w, k_norm_w, eps, positions, rope, cache, batch, scale,
                                              attn, w_o, out);
  }
  struct Hint {
    TensorView norm_w, sum, router, gate_up, down;
    int top_k;
    int attentions_before;
  };
  std::vector<std::pair<int, int64_t>> plans;
  std::vector<Hint> hints;
  int attentions = 0;
};

// A prompt chunk of `prompt` tokens, then one decode token after it, from fresh caches.
void PrefillThenDecode(Model& model, int prompt) {
  const TestCaches kv = MakeTestCaches(model, prompt + 1);
  auto step = [&](int first, int count) {
    Tensor ids = Tensor::Empty(DType::kI32, {count}), pos = Tensor::Empty(DType::kI32, {count});
    Tensor qstart = Tensor::Empty(DType::kI32, {2}), lens = Tensor::Empty(DType::kI32, {1});
    Tensor table = Tensor::Zeros(DType::kI32, {1, 1}), slots = Tensor::Empty(DType::kI32, {count});
    Tensor rows = Tensor::Empty(DType::kI32, {1});
    for (int i = 0; i < count; ++i) {
      ids.ptr<int32_t>()[i] = 31 * (first + i) + 5;
      pos.ptr<int32_t>()[i] = slots.ptr<int32_t>()[i] = first + i;
    }
    rows.ptr<int32_t>()[0] = count - 1;
    qstart.ptr<int32_t>()[0] = 0;
    qstart.ptr<int32_t>()[1] = count;
    lens.ptr<int32_t>()[0] = first + count;
    ForwardBatch batch{ids, pos, {qstart, lens, table, slots, count, first + count}, rows};
    Tensor logits = Tensor::Empty(DType::kF32, {1, model.config().vocab_size});
    model.Forward(batch, kv.views, logits);
  };
  step(0, prompt);
  step(prompt, 1);
}

// PlanStep: once a forward, before its layers. HintMoeRouting, Qwen3-MoE (every layer MoE): a
// hint a layer a forward, just before that layer's attention, with its router [E, H] and
// post-attention norm [H], the step's residual [T, H] and the top k; one router a layer.
// DeepSeek-V3 (sigmoid routing with a bias: its top k is not the logits') none.
TEST(PlanStep, EachForwardPlansItsStepAndHintsItsMoeRouting) {
  for (const std::string name : {"qwen3-moe", "deepseek-v3"}) {
    SCOPED_TRACE(name);
    PlanRecordingCpu backend;
    auto model = LoadModel("tests/data/models/" + name, backend);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    PrefillThenDecode(**model, 6);
    const std::vector<std::pair<int, int64_t>> want{{6, 6}, {1, 1}};
    EXPECT_EQ(backend.plans, want);
    const ModelConfig& c = (*model)->config();
    if (name == "deepseek-v3") {
      EXPECT_TRUE(backend.hints.empty());
      continue;
    }
    ASSERT_EQ(static_cast<int>(backend.hints.size()), 2 * c.num_layers);
    EXPECT_EQ(backend.attentions, 2 * c.num_layers);
    for (int i = 0; i < static_cast<int>(backend.hints.size()); ++i) {
      const PlanRecordingCpu::Hint& h = backend.hints[i];
      const int layer = i % c.num_layers;
      const int64_t tokens = i < c.num_layers ? 6 : 1;
      EXPECT_EQ(h.attentions_before, i) << "hint " << i << " is not just before its layer's attention";
      EXPECT_EQ(h.router.shape, (Shape{c.num_experts, c.hidden_size})) << "layer " << layer;
      EXPECT_EQ(h.norm_w.shape, (Shape{c.hidden_size})) << "layer " << layer;
      EXPECT_EQ(h.sum.shape, (Shape{tokens, c.hidden_size})) << "layer " << layer;
      EXPECT_EQ(h.top_k, c.num_experts_per_token);
      const int64_t inter = c.moe_intermediate_size;
      EXPECT_EQ(h.gate_up.shape, (Shape{c.num_experts, 2 * inter, c.hidden_size})) << "layer " << layer;
      EXPECT_EQ(h.down.shape, (Shape{c.num_experts, c.hidden_size, inter})) << "layer " << layer;
      EXPECT_EQ(h.gate_up.data, backend.hints[layer].gate_up.data);
      // one router a layer, the same one in both forwards
      EXPECT_EQ(h.router.data, backend.hints[layer].router.data);
      if (i > 0 && layer > 0) {
        EXPECT_NE(h.router.data, backend.hints[i - 1].router.data);
      }
    }
  }
}

}  // namespace
}  // namespace corolla
