// Backend::PlanStep: a model's Forward tells the backend the step's shape before its layers run
// (the CUDA backend sizes the MoE grouped GEMM's tiles from it), for a prompt chunk and for a
// decode step alike, once a forward.
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

// The CPU backend, recording each PlanStep's (max_q_len, tokens).
class PlanRecordingCpu final : public ProfilingBackend {
 public:
  PlanRecordingCpu() : ProfilingBackend(MakeCpuBackend()) {}
  void PlanStep(const AttentionBatch& batch, int64_t tokens) override {
    plans.emplace_back(batch.max_q_len, tokens);
    ProfilingBackend::PlanStep(batch, tokens);
  }
  std::vector<std::pair<int, int64_t>> plans;
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

TEST(PlanStep, EachForwardPlansItsStep) {
  for (const std::string name : {"qwen3-moe", "deepseek-v3"}) {
    SCOPED_TRACE(name);
    PlanRecordingCpu backend;
    auto model = LoadModel("tests/data/models/" + name, backend);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    PrefillThenDecode(**model, 6);
    const std::vector<std::pair<int, int64_t>> want{{6, 6}, {1, 1}};
    EXPECT_EQ(backend.plans, want);
  }
}

}  // namespace
}  // namespace corolla
