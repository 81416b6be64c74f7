// The accuracy cost of keeping the hybrids' recurrent state in bf16 (--linear-state-dtype bf16),
// on the CPU against the Hugging Face golden logits of the qwen3.5-moe-hybrid fixture. The state
// is rounded once per chunk (when written back), so one prefill is unaffected and decoding token
// by token, which rounds after every token, is the worst case; the numbers are in BENCHMARKS.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "engine/model_runner.h"
#include "model/safetensors.h"

namespace corolla {
namespace {

const char kModel[] = "tests/data/models/qwen3.5-moe-hybrid";
const char kGolden[] = "tests/data/golden/qwen3.5-moe-hybrid.safetensors";

// The bounds, max over positions of max_j |logit - ref| / max_j |ref| (measured: BENCHMARKS.md).
constexpr double kF32Tolerance = 1e-4;  // as the golden test's
constexpr double kBf16Tolerance =
    5e-3;  // token by token, the worst case: 2.2e-3 measured at 130 tokens

// Logits [L, V] (host f32) of `ids` fed in steps of `chunk` tokens through a cache whose
// recurrent state is `state_dtype`.
Tensor ChunkedLogits(Model& model, Backend& backend, const std::vector<int32_t>& ids, int chunk,
                     DType state_dtype) {
  const int bs = 16, n = static_cast<int>(ids.size());
  const int64_t vocab = model.config().vocab_size;
  KvCache kv(backend, model.kv_cache_spec(), (n + bs - 1) / bs, bs,
             model.state_spec().WithRecurrentDtype(state_dtype), 1);
  ModelRunner runner(model, backend, kv, DecodeGraphMode::kOff);
  Sequence s;
  s.tokens = ids;
  s.num_prompt_tokens = n;
  for (int b = 0; b < kv.num_blocks(); ++b) s.block_table.push_back(b);
  s.state_slot = kv.AllocateStateSlot();
  Tensor all = Tensor::Empty(DType::kF32, {n, vocab});
  while (s.num_uncomputed() > 0) {
    ScheduledChunk c{&s, std::min(chunk, s.num_uncomputed())};
    Tensor logits = LogitsToHost(backend, runner.Execute({&c, 1}, /*all_logits=*/true));
    std::memcpy(all.ptr<float>() + s.num_computed_tokens * vocab, logits.ptr<float>(),
                c.num_tokens * vocab * sizeof(float));
    s.num_computed_tokens += c.num_tokens;
  }
  return all;
}

struct Errors {
  double max = 0, mean = 0;  // over positions, of max_j |a - ref| / max_j |ref| per position
};

Errors Compare(const Tensor& a, const TensorView& ref) {
  const int64_t rows = ref.dim(0), vocab = ref.dim(1);
  Errors e;
  for (int64_t p = 0; p < rows; ++p) {
    double err = 0, scale = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      const float r = ref.ptr<float>()[p * vocab + j];
      err = std::max(err, static_cast<double>(std::fabs(a.ptr<float>()[p * vocab + j] - r)));
      scale = std::max(scale, static_cast<double>(std::fabs(r)));
    }
    e.max = std::max(e.max, err / scale);
    e.mean += err / scale / rows;
  }
  return e;
}

class LinearStateDtype : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend();
    auto model = LoadModel(kModel, *backend_);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model_ = std::move(model).value();
    auto golden = SafetensorsFile::Open(kGolden);
    ASSERT_TRUE(golden.ok()) << golden.status().ToString();
    golden_ = std::move(golden).value();
  }
  TensorView Golden(const std::string& name) { return golden_->View(*golden_->Find(name)); }
  std::vector<int32_t> Ids(int k) {
    TensorView v = Golden("ids_" + std::to_string(k));
    return std::vector<int32_t>(v.ptr<int32_t>(), v.ptr<int32_t>() + v.numel());
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<SafetensorsFile> golden_;
};

// Decoding token by token with an f32 state stays at the golden bound; with a bf16 state within
// kBf16Tolerance. Prints the table of BENCHMARKS.md (and chunks of 16 for comparison).
TEST_F(LinearStateDtype, Bf16StateCostAgainstTheReference) {
  std::printf("%-8s %5s | %-21s | %-21s | %-21s\n", "", "", "f32 state, chunk 1",
              "bf16 state, chunk 1", "bf16 state, chunk 16");
  std::printf("%-8s %5s | %10s %10s | %10s %10s | %10s %10s\n", "sequence", "len", "max", "mean",
              "max", "mean", "max", "mean");
  for (int k = 0; k < 5; ++k) {
    const std::vector<int32_t> ids = Ids(k);
    const TensorView ref = Golden("logits_" + std::to_string(k));
    const Errors f32 = Compare(ChunkedLogits(*model_, *backend_, ids, 1, DType::kF32), ref);
    const Errors bf16 = Compare(ChunkedLogits(*model_, *backend_, ids, 1, DType::kBF16), ref);
    const Errors bf16_16 = Compare(ChunkedLogits(*model_, *backend_, ids, 16, DType::kBF16), ref);
    std::printf("logits_%d %5zu | %10.2e %10.2e | %10.2e %10.2e | %10.2e %10.2e\n", k, ids.size(),
                f32.max, f32.mean, bf16.max, bf16.mean, bf16_16.max, bf16_16.mean);
    EXPECT_LT(f32.max, kF32Tolerance) << "logits_" << k;
    EXPECT_LT(bf16.max, kBf16Tolerance) << "logits_" << k;
    EXPECT_LT(bf16_16.max, kBf16Tolerance) << "logits_" << k;
  }
}

// The state is rounded only where a chunk ends, so the logits of one prefill do not depend on
// its dtype at all.
TEST_F(LinearStateDtype, OnePrefillIsUnaffected) {
  const std::vector<int32_t> ids = Ids(4);
  const int n = static_cast<int>(ids.size());
  Tensor f32 = ChunkedLogits(*model_, *backend_, ids, n, DType::kF32);
  Tensor bf16 = ChunkedLogits(*model_, *backend_, ids, n, DType::kBF16);
  EXPECT_EQ(0, std::memcmp(f32.view().data, bf16.view().data, f32.view().nbytes()));
}

}  // namespace
}  // namespace corolla
