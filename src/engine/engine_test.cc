// The engine's scheduling: block accounting, preemption by recompute under KV pressure,
// per-request seeds independent of batch composition, stop conditions, and request validation.
#include "engine/engine.h"

#include <gtest/gtest.h>

#include "engine/block_pool.h"
#include "engine/decode_graphs.h"
#include "kernels/profiling_backend.h"

namespace corolla {
namespace {

TEST(BlockPool, AllocatesFreesAndCounts) {
  BlockPool pool(4);
  EXPECT_TRUE(pool.CanAllocate(4));
  EXPECT_FALSE(pool.CanAllocate(5));
  std::vector<int32_t> a = pool.Allocate(3);
  EXPECT_EQ(pool.num_free(), 1);
  std::sort(a.begin(), a.end());
  EXPECT_EQ(std::adjacent_find(a.begin(), a.end()), a.end());  // distinct
  pool.Free(a);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.ref_count(a[0]), 0);
}

// The buckets decode graphs are captured for (and `bench decode --plan-bucket` plans on): every
// batch size (no padding rows), contexts in powers of two.
TEST(DecodeGraphs, Buckets) {
  EXPECT_EQ(DecodeGraphs::BatchBucket(1), 1);
  EXPECT_EQ(DecodeGraphs::BatchBucket(3), 3);
  EXPECT_EQ(DecodeGraphs::BatchBucket(16), 16);
  EXPECT_EQ(DecodeGraphs::BatchBucket(17), 24);
  EXPECT_EQ(DecodeGraphs::BatchBucket(64), 64);
  EXPECT_EQ(DecodeGraphs::BatchBucket(65), 96);
  EXPECT_EQ(DecodeGraphs::BatchBucket(250), DecodeGraphs::kMaxBatch);
  EXPECT_EQ(DecodeGraphs::ContextBucket(1), DecodeGraphs::kMinContext);
  EXPECT_EQ(DecodeGraphs::ContextBucket(256), 256);
  EXPECT_EQ(DecodeGraphs::ContextBucket(257), 512);
  EXPECT_EQ(DecodeGraphs::ContextBucket(1025), 2048);
  EXPECT_EQ(DecodeGraphs::ContextBucket(8192), 8192);
  // Buckets stop at the model's length (40960 keys for Qwen3's 40960 positions), or the pool's.
  EXPECT_EQ(DecodeGraphs::MaxBlocksPerSeq(40960, 16, 1 << 20), 2560);
  EXPECT_EQ(DecodeGraphs::MaxBlocksPerSeq(40961, 16, 1 << 20), 2561);
  EXPECT_EQ(DecodeGraphs::MaxBlocksPerSeq(40960, 16, 100), 100);
}

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend();
    model_ = LoadModel("tests/data/models/qwen3-moe", *backend_).value();
  }
  std::unique_ptr<Engine> MakeEngine(EngineOptions o) { return Engine::Create(*model_, *backend_, o).value(); }
  static GenerationRequest Request(int first_id, int len, int max_tokens, float temperature = 0, uint64_t seed = 0) {
    GenerationRequest r;
    for (int i = 0; i < len; ++i) r.prompt.push_back((first_id + 37 * i) % 1024);
    r.max_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    return r;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

// The CPU backend, recording each forward's attention hints (PlanStep sees the step's batch).
class HintRecordingCpu final : public ProfilingBackend {
 public:
  HintRecordingCpu() : ProfilingBackend(MakeCpuBackend()) {}
  struct Hint {
    int64_t seqs;
    int max_q_len, num_decode_seqs;
  };
  void PlanStep(const AttentionBatch& batch, int64_t tokens) override {
    hints.push_back({batch.seq_lens.numel(), batch.max_q_len, batch.num_decode_seqs});
    ProfilingBackend::PlanStep(batch, tokens);
  }
  std::vector<Hint> hints;
};

// The runner tells the attention how many leading sequences decode (one query token each): all
// of a decode step's, and in a step that also prefills, the decodes scheduled ahead of the new
// prompt (a kernel may give those rows to its decode path). The step records count them alike.
TEST_F(EngineTest, StepsTellTheAttentionTheirLeadingDecodes) {
  HintRecordingCpu backend;
  auto model = LoadModel("tests/data/models/qwen3-moe", backend).value();
  EngineOptions o;
  o.async_scheduling = false;
  auto engine = Engine::Create(*model, backend, o).value();
  engine->set_record_steps(true);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine->AddRequest(Request(5 * i + 2, 6 + i, 8)).ok());
  engine->Step();  // the three prompts
  engine->Step();  // three decodes
  ASSERT_TRUE(engine->AddRequest(Request(99, 40, 4)).ok());
  engine->Step();  // three decodes and the new prompt
  ASSERT_EQ(backend.hints.size(), 3u);
  EXPECT_EQ(backend.hints[0].seqs, 3);
  EXPECT_EQ(backend.hints[0].num_decode_seqs, 0);
  EXPECT_EQ(backend.hints[1].seqs, 3);
  EXPECT_EQ(backend.hints[1].max_q_len, 1);
  EXPECT_EQ(backend.hints[1].num_decode_seqs, 3);
  EXPECT_EQ(backend.hints[2].seqs, 4);
  EXPECT_EQ(backend.hints[2].max_q_len, 40);
  EXPECT_EQ(backend.hints[2].num_decode_seqs, 3);
  const std::vector<StepRecord> steps = engine->TakeStepRecords();
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0].decode_rows, 0);
  EXPECT_EQ(steps[0].prefill_tokens, 6 + 7 + 8);
  EXPECT_EQ(steps[1].decode_rows, 3);
  EXPECT_EQ(steps[1].prefill_tokens, 0);
  EXPECT_EQ(steps[2].decode_rows, 3);
  EXPECT_EQ(steps[2].prefill_tokens, 40);
  const StepMetrics& m = engine->step_metrics();
  EXPECT_EQ(m.mixed_seconds.count(), 2u);
  EXPECT_EQ(m.decode_seconds.count(), 1u);
  EXPECT_DOUBLE_EQ(m.tokens.sum(), 6 + 7 + 8 + 3 + 3 + 40);
}

TEST_F(EngineTest, PreemptionUnderKvPressureGivesTheSameTokens) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(Request(11 * i + 1, 20 + 9 * i, 24));
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : requests) alone.push_back(MakeEngine({})->Generate({r}).value()[0].first);

  EngineOptions tight;
  tight.block_size = 4;
  tight.num_kv_blocks = 40;  // 160 slots for six sequences of up to 89 tokens
  tight.max_model_len = 128;
  tight.max_batch_tokens = 32;  // prefill in chunks too
  auto engine = MakeEngine(tight);
  auto out = engine->Generate(requests).value();
  EXPECT_GT(engine->num_preemptions(), 0);
  EXPECT_EQ(engine->num_free_blocks(), 40);  // everything returned
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(out[i].first, alone[i]) << "request " << i;
    EXPECT_EQ(out[i].second, FinishReason::kLength);
  }
}

// The hybrid model's per-sequence states survive batching, chunked prefill, preemption and
// slot reuse: every request decodes as it would alone.
TEST_F(EngineTest, HybridStatesUnderPreemptionGiveTheSameTokens) {
  model_ = LoadModel("tests/data/models/qwen3.5-moe-hybrid", *backend_).value();
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 5; ++i) requests.push_back(Request(13 * i + 2, 15 + 11 * i, 16));
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : requests) alone.push_back(MakeEngine({})->Generate({r}).value()[0].first);
  EngineOptions tight;
  tight.block_size = 4;
  tight.num_kv_blocks = 24;  // 96 slots for the one attention layer of five sequences up to 75
  tight.max_model_len = 96;
  tight.max_batch_tokens = 24;
  tight.max_num_seqs = 3;  // state slots are reused across requests
  auto engine = MakeEngine(tight);
  auto out = engine->Generate(requests).value();
  EXPECT_GT(engine->num_preemptions(), 0);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(out[i].first, alone[i]) << "request " << i;
}

TEST_F(EngineTest, SeededSamplingIgnoresBatchComposition) {
  auto a = MakeEngine({})->Generate({Request(5, 9, 20, 1.0f, 42)}).value()[0].first;
  auto b = MakeEngine({})->Generate({Request(5, 9, 20, 1.0f, 42)}).value()[0].first;
  EXPECT_EQ(a, b);
  auto batch = MakeEngine({})->Generate({Request(7, 30, 12, 0.8f, 1), Request(5, 9, 20, 1.0f, 42),
                                         Request(9, 3, 5, 1.2f, 2)}).value();
  EXPECT_EQ(batch[1].first, a);
  auto other_seed = MakeEngine({})->Generate({Request(5, 9, 20, 1.0f, 43)}).value()[0].first;
  EXPECT_NE(other_seed, a);
}

TEST_F(EngineTest, StopsAtStopTokensUnlessIgnored) {
  GenerationRequest r = Request(3, 10, 30);
  auto free_run = MakeEngine({})->Generate({r}).value()[0].first;
  ASSERT_EQ(free_run.size(), 30u);
  r.stop_token_ids = {free_run[4]};
  auto stopped = MakeEngine({})->Generate({r}).value()[0];
  size_t first = std::find(free_run.begin(), free_run.end(), free_run[4]) - free_run.begin();
  EXPECT_EQ(stopped.first.size(), first + 1);
  EXPECT_EQ(stopped.second, FinishReason::kStop);
  r.ignore_eos = true;
  EXPECT_EQ(MakeEngine({})->Generate({r}).value()[0].first, free_run);
}

TEST_F(EngineTest, ContextLimitEndsWithLength) {
  EngineOptions o;
  o.max_model_len = 16;
  auto out = MakeEngine(o)->Generate({Request(1, 10, 100)}).value()[0];
  EXPECT_EQ(out.first.size(), 6u);
  EXPECT_EQ(out.second, FinishReason::kLength);
}

TEST_F(EngineTest, RejectsBadRequests) {
  auto engine = MakeEngine({});
  GenerationRequest r = Request(1, 4, 4);
  r.prompt[2] = 1024;
  auto id = engine->AddRequest(r);
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("token id 1024 at position 2 is outside the vocabulary"), std::string::npos);
  r.prompt[2] = -1;
  EXPECT_FALSE(engine->AddRequest(r).ok());
  auto too_long = engine->AddRequest(Request(1, 4096, 4));
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.status().code(), StatusCode::kOutOfRange);
  EXPECT_FALSE(engine->AddRequest(Request(1, 0, 4)).ok());
  EXPECT_FALSE(engine->AddRequest(Request(1, 4, 0)).ok());
  EXPECT_FALSE(engine->HasUnfinished());
  EngineOptions huge;
  huge.max_model_len = 1 << 20;
  EXPECT_FALSE(Engine::Create(*model_, *backend_, huge).ok());
}

TEST_F(EngineTest, AbortFreesBlocks) {
  auto engine = MakeEngine({});
  int64_t id = engine->AddRequest(Request(1, 40, 100)).value();
  engine->Step();
  EXPECT_LT(engine->num_free_blocks(), engine->num_kv_blocks());
  engine->Abort(id);
  EXPECT_EQ(engine->num_free_blocks(), engine->num_kv_blocks());
  EXPECT_FALSE(engine->HasUnfinished());
}

}  // namespace
}  // namespace corolla
