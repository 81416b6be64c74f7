// Qwen3Model's folded residual (Backend::folds_moe_residual): where a backend takes it, a MoE
// layer's output is added into the residual stream by the experts op (MoeExpertsResidual) and
// the next layer's qkv projection only norms the sum (NormLinear). The CPU backend's defaults
// for the two run the same f32 arithmetic as MoeExperts + RmsNormLinear, so through a backend
// that takes the fold, the qwen3-moe fixture must give the unfolded forward's logits bit for bit,
// at a prefill of five tokens and at a decode step after it, with both fused ops recorded.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/profiling_backend.h"
#include "model/model.h"
#include "model/model_test_util.h"

namespace corolla {
namespace {

// The CPU backend, taking the fold.
class FoldingCpu final : public ProfilingBackend {
 public:
  FoldingCpu() : ProfilingBackend(MakeCpuBackend()) {}
  bool folds_moe_residual(int64_t) const override { return true; }
};

// Logits of a five-token prompt, then of one decode token after it, from fresh caches.
std::vector<float> PrefillThenDecode(Model& model) {
  const TestCaches kv = MakeTestCaches(model, 8);
  std::vector<float> out;
  auto step = [&](int first, int count) {
    Tensor ids = Tensor::Empty(DType::kI32, {count}), pos = Tensor::Empty(DType::kI32, {count});
    Tensor qstart = Tensor::Empty(DType::kI32, {2}), lens = Tensor::Empty(DType::kI32, {1});
    Tensor table = Tensor::Zeros(DType::kI32, {1, 1}), slots = Tensor::Empty(DType::kI32, {count});
    Tensor rows = Tensor::Empty(DType::kI32, {count});
    for (int i = 0; i < count; ++i) {
      ids.ptr<int32_t>()[i] = 100 * (first + i) + 7;
      pos.ptr<int32_t>()[i] = slots.ptr<int32_t>()[i] = first + i;
      rows.ptr<int32_t>()[i] = i;
    }
    qstart.ptr<int32_t>()[0] = 0;
    qstart.ptr<int32_t>()[1] = count;
    lens.ptr<int32_t>()[0] = first + count;
    ForwardBatch batch{ids, pos, {qstart, lens, table, slots, count, first + count}, rows};
    Tensor logits = Tensor::Empty(DType::kF32, {count, model.config().vocab_size});
    model.Forward(batch, kv.views, logits);
    out.insert(out.end(), logits.ptr<float>(), logits.ptr<float>() + logits.numel());
  };
  step(0, 5);
  step(5, 1);
  return out;
}

TEST(ResidualFold, GivesTheUnfoldedLogits) {
  auto plain = MakeCpuBackend();
  FoldingCpu folding;
  auto model = LoadModel("tests/data/models/qwen3-moe", *plain);
  auto folded_model = LoadModel("tests/data/models/qwen3-moe", folding);
  ASSERT_TRUE(model.ok() && folded_model.ok());
  const std::vector<float> ref = PrefillThenDecode(**model);
  auto clock = MakeHostOpClock(folding);
  folding.StartRecording(clock.get());
  const std::vector<float> got = PrefillThenDecode(**folded_model);
  const std::vector<std::string> labels = folding.StopRecording();
  EXPECT_EQ(got, ref);
  auto count = [&](const std::string& op) {
    return std::count_if(labels.begin(), labels.end(), [&](const std::string& l) { return l.rfind(op, 0) == 0; });
  };
  // Three layers, two forwards: the first two MoE layers fold into the next layer's norm.
  EXPECT_EQ(count("MoeExperts+residual"), 4);
  EXPECT_EQ(count("NormLinear "), 4);
  EXPECT_EQ(count("RmsNormLinear"), 0);
}

}  // namespace
}  // namespace corolla
