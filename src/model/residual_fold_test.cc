// Qwen3Model's folded residual (Backend::folds_moe_residual): where a backend takes it, a MoE
// layer's output is added into the residual stream by the experts op (MoeExpertsResidual) and
// the next layer's qkv projection only norms the sum (NormLinear). The CPU backend's defaults
// for the two run the same f32 arithmetic as MoeExperts + RmsNormLinear, so through a backend
// that takes the fold, the qwen3-moe fixture must give the unfolded forward's logits bit for bit,
// at a prefill of five tokens and at a decode step after it, with both fused ops recorded. Where
// a backend also issues ops ahead (Backend::issues_ahead), the model issues the next layer's qkv
// projection before the MoE block that completes its sum and o_proj before the attention, and
// awaits each where it ran: the defaults, which run each op at its await, give the same logits
// bit for bit.
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

// The CPU backend, taking the fold, issuing the next qkv projection ahead of it and o_proj ahead
// of the attention (the defaults: each op runs at its await), counting the issues and awaits.
class AheadCpu final : public ProfilingBackend {
 public:
  AheadCpu() : ProfilingBackend(MakeCpuBackend()) {}
  bool folds_moe_residual(int64_t) const override { return true; }
  bool issues_ahead(AheadOp, int64_t) const override { return true; }
  void NormLinearAhead(const TensorView& norm_w, float eps, const TensorView& sum, const TensorView& x,
                       const TensorView& w, const TensorView& out) override {
    ++issued;
    ProfilingBackend::NormLinearAhead(norm_w, eps, sum, x, w, out);
  }
  void LinearAhead(const TensorView& x, const TensorView& w, const TensorView& out) override {
    ++issued;
    ProfilingBackend::LinearAhead(x, w, out);
  }
  void AwaitAhead() override {
    ++awaited;
    ProfilingBackend::AwaitAhead();
  }
  int issued = 0, awaited = 0;
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

// Checks that the qwen3-moe fixture through `be` gives the plain CPU backend's logits bit for bit
// (PrefillThenDecode); returns how many ops of `be` were recorded under each of `ops` (labels
// starting with it).
std::vector<int64_t> ExpectPlainLogits(ProfilingBackend& be, const std::vector<std::string>& ops) {
  auto plain = MakeCpuBackend();
  auto model = LoadModel("tests/data/models/qwen3-moe", *plain);
  auto be_model = LoadModel("tests/data/models/qwen3-moe", be);
  EXPECT_TRUE(model.ok() && be_model.ok());
  if (!model.ok() || !be_model.ok()) return std::vector<int64_t>(ops.size(), -1);
  const std::vector<float> ref = PrefillThenDecode(**model);
  auto clock = MakeHostOpClock(be);
  be.StartRecording(clock.get());
  const std::vector<float> got = PrefillThenDecode(**be_model);
  const std::vector<std::string> labels = be.StopRecording();
  EXPECT_EQ(got, ref);
  std::vector<int64_t> counts;
  for (const std::string& op : ops)
    counts.push_back(
        std::count_if(labels.begin(), labels.end(), [&](const std::string& l) { return l.rfind(op, 0) == 0; }));
  return counts;
}

TEST(ResidualFold, GivesTheUnfoldedLogits) {
  FoldingCpu folding;
  // Three layers, two forwards: the first two MoE layers fold into the next layer's norm.
  EXPECT_EQ(ExpectPlainLogits(folding, {"MoeExperts+residual", "NormLinear ", "RmsNormLinear"}),
            (std::vector<int64_t>{4, 4, 0}));
}

TEST(AheadOps, GiveThePlainLogits) {
  AheadCpu ahead;
  // Three layers, two forwards: layers 1 and 2's qkv projections issued ahead of the MoE before
  // and every layer's o_proj ahead of its attention, each run at its await.
  FoldingCpu folding;
  const int64_t linears = ExpectPlainLogits(folding, {"Linear "})[0];  // o_proj's among them
  EXPECT_EQ(ExpectPlainLogits(ahead, {"MoeExperts+residual", "NormLinear ", "Linear "}),
            (std::vector<int64_t>{4, 4, linears}));
  EXPECT_EQ(ahead.issued, 10);
  EXPECT_EQ(ahead.awaited, 10);
}

}  // namespace
}  // namespace corolla
