// The CPU engine against the Hugging Face reference: golden logits of the qwen3-dense and
// qwen3-moe fixtures, prefill/decode consistency through the paged cache, mixed batches, greedy
// continuation, and the demo model's chat goldens.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "engine/demo_chats.h"
#include "engine/engine.h"
#include "engine/model_runner.h"
#include "model/config.h"
#include "model/deepseek_v3.h"
#include "model/qwen3_next_fixture.h"
#include "model/safetensors.h"

namespace corolla {
namespace {

std::vector<int32_t> ToIds(const TensorView& v) {
  return std::vector<int32_t>(v.ptr<int32_t>(), v.ptr<int32_t>() + v.numel());
}

// max_j |a - b| / max_j |b| over one row.
double RowError(const float* a, const float* b, int64_t n) {
  double err = 0, scale = 0;
  for (int64_t j = 0; j < n; ++j) {
    err = std::max(err, static_cast<double>(std::fabs(a[j] - b[j])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[j])));
  }
  return err / scale;
}

class GoldenTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = "tests/data/models/" + GetParam();
    backend_ = MakeCpuBackend();
    auto model = LoadModel(dir_, *backend_);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    model_ = std::move(model).value();
    auto golden = SafetensorsFile::Open("tests/data/golden/" + GetParam() + ".safetensors");
    ASSERT_TRUE(golden.ok()) << golden.status().ToString();
    golden_ = std::move(golden).value();
  }
  TensorView Golden(const std::string& name) {
    const SafetensorsEntry* e = golden_->Find(name);
    COROLLA_CHECK(e != nullptr) << name;
    return golden_->View(*e);
  }
  std::vector<int32_t> Ids(int k) { return ToIds(Golden("ids_" + std::to_string(k))); }
  int64_t vocab() const { return model_->config().vocab_size; }
  // Splitting a sequence differently changes only the GEMM shapes, hence the rounding. The
  // hybrid's recurrent state and per-head norms amplify that rounding at a few positions
  // (measured: 1.2e-5 at one position of 130 decoding token by token, while one prefill is
  // within 6e-7 of the reference everywhere), so it gets a wider bound: the GEMMs' rounding
  // depends on the kernels OpenBLAS picks for the CPU (4.7e-5 at position 8 of the 1-token
  // chunks on an AVX-512 Xeon, session 49), and 1e-4 is the fixtures' bound against the reference.
  double ConsistencyTolerance() const { return model_->state_spec().num_layers > 0 ? 1e-4 : 1e-5; }

  std::string dir_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<SafetensorsFile> golden_;
};

TEST_P(GoldenTest, LogitsMatchReferenceAtEveryPosition) {
  for (int k = 0; k < 5; ++k) {
    std::vector<int32_t> ids = Ids(k);
    auto logits = ComputeLogits(*model_, *backend_, ids);
    ASSERT_TRUE(logits.ok()) << logits.status().ToString();
    TensorView ref = Golden("logits_" + std::to_string(k));
    ASSERT_EQ(logits->shape(), ref.shape);
    double worst = 0;
    for (int64_t p = 0; p < ref.dim(0); ++p) {
      double e = RowError(logits->ptr<float>() + p * vocab(), ref.ptr<float>() + p * vocab(), vocab());
      EXPECT_LT(e, 1e-4) << "sequence " << k << " position " << p;
      worst = std::max(worst, e);
    }
    RecordProperty("max_error_" + std::to_string(k), std::to_string(worst));
    std::printf("%s logits_%d: max error %.2e of max|ref|\n", GetParam().c_str(), k, worst);
  }
}

// Feeding a sequence token by token (decode through the paged cache) equals one prefill, and a
// prefill in uneven chunks equals it too.
TEST_P(GoldenTest, DecodeAndChunkedPrefillEqualOnePrefill) {
  std::vector<int32_t> ids = Ids(4);  // 130 tokens: crosses several 16-token blocks
  auto full = ComputeLogits(*model_, *backend_, ids);
  ASSERT_TRUE(full.ok());
  for (int chunk : {1, 7, 64}) {
    const int bs = 16;
    KvCache kv(*backend_, model_->kv_cache_spec(), (static_cast<int>(ids.size()) + bs - 1) / bs + 3, bs,
               model_->state_spec(), 2);
    ModelRunner runner(*model_, *backend_, kv);
    Sequence s;
    s.tokens = ids;
    s.num_prompt_tokens = s.num_tokens();
    // Blocks in a scrambled order, so the block table matters.
    for (int b = kv.num_blocks() - 1; b >= 0; --b) s.block_table.push_back(b);
    kv.AllocateStateSlot();  // hybrid models: use slot 1, not the first
    s.state_slot = kv.AllocateStateSlot();
    while (s.num_computed_tokens < s.num_tokens()) {
      int n = std::min(chunk, s.num_uncomputed());
      ScheduledChunk c{&s, n};
      Tensor logits = LogitsToHost(*backend_, runner.Execute({&c, 1}, /*all_logits=*/true));
      for (int i = 0; i < n; ++i) {
        int p = s.num_computed_tokens + i;
        double e = RowError(logits.ptr<float>() + i * vocab(), full->ptr<float>() + p * vocab(), vocab());
        ASSERT_LT(e, ConsistencyTolerance()) << "chunk " << chunk << " position " << p;
      }
      s.num_computed_tokens += n;
    }
  }
}

// One flat batch of all five sequences, mixing decode steps and prefill chunks, equals each alone.
TEST_P(GoldenTest, MixedBatchEqualsEachAlone) {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<Tensor> alone;
  for (int k = 0; k < 5; ++k) {
    seqs.push_back(Ids(k));
    alone.push_back(ComputeLogits(*model_, *backend_, seqs.back()).value());
  }
  const int bs = 16;
  KvCache kv(*backend_, model_->kv_cache_spec(), 64, bs, model_->state_spec(), 5);
  ModelRunner runner(*model_, *backend_, kv);
  std::vector<Sequence> s(5);
  int next_block = 0;
  for (int k = 0; k < 5; ++k) {
    s[k].tokens = seqs[k];
    s[k].num_prompt_tokens = s[k].num_tokens();
    int blocks = (s[k].num_tokens() + bs - 1) / bs;
    for (int b = 0; b < blocks; ++b) s[k].block_table.push_back(next_block++);
    s[k].state_slot = 4 - k;
  }
  // Step sizes per sequence: some decode one token per step, others take chunks.
  const int step_size[5] = {1, 1, 3, 16, 50};
  for (;;) {
    std::vector<ScheduledChunk> chunks;
    for (int k = 0; k < 5; ++k)
      if (s[k].num_uncomputed() > 0) chunks.push_back({&s[k], std::min(step_size[k], s[k].num_uncomputed())});
    if (chunks.empty()) break;
    Tensor logits = LogitsToHost(*backend_, runner.Execute(chunks, /*all_logits=*/true));
    int row = 0;
    for (const auto& c : chunks) {
      int k = static_cast<int>(c.seq - s.data());
      for (int i = 0; i < c.num_tokens; ++i, ++row) {
        int p = c.seq->num_computed_tokens + i;
        double e = RowError(logits.ptr<float>() + row * vocab(), alone[k].ptr<float>() + p * vocab(), vocab());
        ASSERT_LT(e, ConsistencyTolerance()) << "sequence " << k << " position " << p;
      }
    }
    for (const auto& c : chunks) c.seq->num_computed_tokens += c.num_tokens;
  }
}

TEST_P(GoldenTest, GreedyContinuationMatchesReference) {
  std::vector<int32_t> prompt = ToIds(Golden("greedy_prompt"));
  std::vector<int32_t> expected = ToIds(Golden("greedy_tokens"));
  TensorView margins = Golden("greedy_margins");
  EngineOptions options;
  options.block_size = 4;  // many block boundaries
  auto engine = Engine::Create(*model_, *backend_, options);
  ASSERT_TRUE(engine.ok());
  GenerationRequest r;
  r.prompt = prompt;
  r.sampling.temperature = 0;
  r.max_tokens = static_cast<int>(expected.size());
  auto out = (*engine)->Generate({r});
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  const std::vector<int32_t>& got = (*out)[0].first;
  ASSERT_EQ(got.size(), expected.size());
  int compared = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(got[i], expected[i]) << "step " << i;
    ++compared;
    if (margins.ptr<float>()[i] < 1e-2f) break;  // a near-tie: two correct engines may differ after
  }
  EXPECT_GE(compared, 1);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest,
                         ::testing::Values("qwen3-dense", "qwen3-moe", "qwen3.5-moe-hybrid", "deepseek-v3",
                                           "deepseek-v3-fp8"));

// MLA: attention over the latent with absorbed up-projections equals the decompressed
// multi-head form, for prefill chunks of every size.
TEST(DeepseekMla, AbsorbedEqualsDecompressed) {
  for (std::string name : {"deepseek-v3", "deepseek-v3-fp8"}) {
    auto backend = MakeCpuBackend();
    auto model = LoadModel("tests/data/models/" + name, *backend).value();
    auto golden = SafetensorsFile::Open("tests/data/golden/" + name + ".safetensors").value();
    std::vector<int32_t> ids = ToIds(golden->View(*golden->Find("ids_3")));
    SetMlaMode(*model, MlaMode::kDecompressed);
    Tensor decompressed = ComputeLogits(*model, *backend, ids).value();
    SetMlaMode(*model, MlaMode::kAbsorbed);
    Tensor absorbed = ComputeLogits(*model, *backend, ids).value();
    const int64_t vocab = model->config().vocab_size;
    for (size_t p = 0; p < ids.size(); ++p)
      ASSERT_LT(RowError(absorbed.ptr<float>() + p * vocab, decompressed.ptr<float>() + p * vocab, vocab), 1e-5)
          << name << " position " << p;
  }
}

// Qwen3-Next stores the Gated DeltaNet projections fused per key head (in_proj_qkvz,
// in_proj_ba). The same weights written in that layout must give the same logits.
TEST(Qwen3Next, FusedProjectionLayoutEqualsQwen35) {
  namespace fs = std::filesystem;
  const std::string src = "tests/data/models/qwen3.5-moe-hybrid";
  const fs::path dir = fs::temp_directory_path() / ("corolla_qwen3_next_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  Status written = WriteQwen3NextFixture(src, dir.string());
  ASSERT_TRUE(written.ok()) << written.ToString();

  auto backend = MakeCpuBackend();
  auto qwen35 = LoadModel(src, *backend).value();
  auto next = LoadModel(dir.string(), *backend);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  std::vector<int32_t> ids{5, 900, 17, 3, 256, 1000, 42, 7, 77};
  Tensor a = ComputeLogits(*qwen35, *backend, ids).value();
  Tensor b = ComputeLogits(**next, *backend, ids).value();
  EXPECT_EQ(0, std::memcmp(a.view().data, b.view().data, a.view().nbytes()));
  fs::remove_all(dir);
}

TEST(DemoModel, GreedyChatsReproduceReferenceExactly) {
  auto backend = MakeCpuBackend();
  const std::string dir = "models/corolla-demo";
  auto model = LoadModel(dir, *backend);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto chats = LoadDemoChats(dir, (*model)->config());
  ASSERT_TRUE(chats.ok()) << chats.status().ToString();
  auto engine = Engine::Create(**model, *backend, EngineOptions{});
  ASSERT_TRUE(engine.ok());
  // All conversations at once: continuous batching must not change greedy results.
  auto out = (*engine)->Generate(chats->requests);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  for (size_t i = 0; i < chats->requests.size(); ++i) {
    EXPECT_EQ((*out)[i].first, chats->expected[i]) << "chat " << i;
    EXPECT_EQ((*out)[i].second, FinishReason::kStop) << "chat " << i;
  }
}

}  // namespace
}  // namespace corolla
