// Async scheduling (EngineOptions::async_scheduling): the engine launches step N+1 before it
// takes step N's tokens, and N+1 reads them on the device. What a client sees must not change:
// greedy and seeded tokens equal synchronous steps, stops and max_tokens are exact (a token
// computed after a sequence ended never comes out), preemption and cancellation free every
// block, penalties and logprobs fall back to synchronous steps, and hybrid models snapshot their
// states at block boundaries reached while decoding.
#include <gtest/gtest.h>

#include <map>

#include "engine/demo_chats.h"
#include "engine/engine.h"
#include "engine/model_runner.h"

namespace corolla {
namespace {

using Results = std::vector<std::pair<std::vector<int32_t>, FinishReason>>;

class AsyncSchedulingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend();
    model_ = LoadModel("tests/data/models/qwen3-moe", *backend_).value();
  }
  std::unique_ptr<Engine> MakeEngine(EngineOptions o, bool async) {
    o.async_scheduling = async;
    return Engine::Create(*model_, *backend_, o).value();
  }
  // Generate with async scheduling on and off; expects both to give the same results.
  Results OnEqualsOff(const std::vector<GenerationRequest>& requests, EngineOptions o = {}) {
    auto on = MakeEngine(o, true);
    Results async = on->Generate(requests).value();
    EXPECT_GT(on->num_async_steps(), 0);
    EXPECT_EQ(on->num_used_blocks(), 0);
    auto off = MakeEngine(o, false);
    Results sync = off->Generate(requests).value();
    EXPECT_EQ(off->num_async_steps(), 0);
    EXPECT_EQ(sync.size(), async.size());
    for (size_t i = 0; i < sync.size() && i < async.size(); ++i) {
      EXPECT_EQ(async[i].first, sync[i].first) << "request " << i;
      EXPECT_EQ(async[i].second, sync[i].second) << "request " << i;
    }
    return async;
  }
  static GenerationRequest Request(int first, int len, int max_tokens, float temperature = 0, uint64_t seed = 0) {
    GenerationRequest r;
    for (int i = 0; i < len; ++i) r.prompt.push_back((first + 37 * i) % 1024);
    r.max_tokens = max_tokens;
    r.sampling.temperature = temperature;
    r.sampling.seed = seed;
    return r;
  }
  // Requests that end at different steps, some on a stop token, prompts long enough to be
  // prefilled in chunks beside the others' decodes.
  std::vector<GenerationRequest> MixedRequests() {
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < 10; ++i) requests.push_back(Request(11 * i + 3, 4 + 9 * i, 3 + 4 * i));
    // Stop on a token that the free run produces early.
    GenerationRequest r = Request(5, 17, 30);
    std::vector<int32_t> free_run = MakeEngine({}, false)->Generate({r}).value()[0].first;
    r.stop_token_ids = {free_run[3]};
    requests.push_back(r);
    return requests;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

TEST(AsyncScheduling, DemoChatsEqualSyncAndGolden) {
  auto backend = MakeCpuBackend();
  const std::string dir = "models/corolla-demo";
  auto model = LoadModel(dir, *backend);
  ASSERT_TRUE(model.ok()) << model.status().ToString();
  auto chats = LoadDemoChats(dir, (*model)->config());
  ASSERT_TRUE(chats.ok()) << chats.status().ToString();
  Results by_mode[2];
  for (bool async : {false, true}) {
    EngineOptions o;
    o.async_scheduling = async;
    auto engine = Engine::Create(**model, *backend, o).value();
    by_mode[async] = engine->Generate(chats->requests).value();
    EXPECT_EQ(engine->num_async_steps() > 0, async);
    EXPECT_EQ(engine->num_used_blocks(), 0);
  }
  for (size_t i = 0; i < chats->requests.size(); ++i) {
    EXPECT_EQ(by_mode[1][i].first, by_mode[0][i].first) << "chat " << i;
    EXPECT_EQ(by_mode[1][i].first, chats->expected[i]) << "chat " << i;
    EXPECT_EQ(by_mode[1][i].second, FinishReason::kStop) << "chat " << i;
  }
}

TEST_F(AsyncSchedulingTest, MixedBatchesEqualSync) {
  OnEqualsOff(MixedRequests());
  EngineOptions chunked;
  chunked.max_batch_tokens = 24;  // prefill chunks share steps with decodes
  chunked.block_size = 4;
  Results out = OnEqualsOff(MixedRequests(), chunked);
  EXPECT_EQ(out.back().second, FinishReason::kStop);
}

TEST_F(AsyncSchedulingTest, SeededSamplingEqualsSync) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r = Request(7 * i + 1, 6 + 5 * i, 8 + 3 * i, 0.7f + 0.1f * i, 100 + i);
    r.sampling.top_k = i % 2 ? 20 : 0;
    r.sampling.top_p = i % 3 ? 0.9f : 1.0f;
    requests.push_back(r);
  }
  OnEqualsOff(requests);
}

// Driving Step by hand: every sequence gets exactly its tokens (max_tokens of them, or up to its
// first stop token), one final output, and nothing after it.
TEST_F(AsyncSchedulingTest, StopsAndMaxTokensAreExact) {
  std::vector<GenerationRequest> requests = MixedRequests();
  Results expected = MakeEngine({}, false)->Generate(requests).value();
  auto engine = MakeEngine({}, true);
  std::map<int64_t, size_t> index;
  for (size_t i = 0; i < requests.size(); ++i) index[engine->AddRequest(requests[i]).value()] = i;
  std::vector<std::vector<int32_t>> tokens(requests.size());
  std::vector<int> finals(requests.size(), 0);
  while (engine->HasUnfinished()) {
    for (const StepOutput& o : engine->Step()) {
      size_t i = index.at(o.seq_id);
      EXPECT_EQ(finals[i], 0) << "request " << i << ": a token after its final output";
      tokens[i].push_back(o.token);
      if (o.finish_reason != FinishReason::kNone) {
        ++finals[i];
        EXPECT_EQ(o.finish_reason, expected[i].second) << "request " << i;
      }
    }
  }
  EXPECT_TRUE(engine->Step().empty());  // takes the last launched step: its tokens are dropped
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(tokens[i], expected[i].first) << "request " << i;
    EXPECT_EQ(finals[i], 1) << "request " << i;
  }
  EXPECT_EQ(expected.back().second, FinishReason::kStop);
  EXPECT_LE(tokens.back().size(), 4u);  // at the stop token, the 4th or earlier
  EXPECT_EQ(engine->num_used_blocks(), 0);
}

TEST_F(AsyncSchedulingTest, PreemptionUnderTinyKvBudgetGivesTheSameTokens) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 6; ++i) requests.push_back(Request(11 * i + 1, 20 + 9 * i, 24));
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : requests) alone.push_back(MakeEngine({}, false)->Generate({r}).value()[0].first);
  EngineOptions tight;
  tight.block_size = 4;
  tight.num_kv_blocks = 40;  // 160 slots for six sequences of up to 89 tokens
  tight.max_model_len = 128;
  tight.max_batch_tokens = 32;
  auto engine = MakeEngine(tight, true);
  Results out = engine->Generate(requests).value();
  EXPECT_GT(engine->num_preemptions(), 0);
  EXPECT_GT(engine->num_async_steps(), 0);
  EXPECT_EQ(engine->num_free_blocks(), 40);
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(out[i].first, alone[i]) << "request " << i;
    EXPECT_EQ(out[i].second, FinishReason::kLength);
  }
}

TEST_F(AsyncSchedulingTest, HybridPreemptionGivesTheSameTokens) {
  model_ = LoadModel("tests/data/models/qwen3.5-moe-hybrid", *backend_).value();
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 5; ++i) requests.push_back(Request(13 * i + 2, 15 + 11 * i, 16));
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : requests) alone.push_back(MakeEngine({}, false)->Generate({r}).value()[0].first);
  EngineOptions tight;
  tight.block_size = 4;
  tight.num_kv_blocks = 24;
  tight.max_model_len = 96;
  tight.max_batch_tokens = 24;
  tight.max_num_seqs = 3;  // state slots are reused across requests
  auto engine = MakeEngine(tight, true);
  Results out = engine->Generate(requests).value();
  EXPECT_GT(engine->num_preemptions(), 0);
  EXPECT_GT(engine->num_async_steps(), 0);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(out[i].first, alone[i]) << "request " << i;
}

// Abort while the sequence is in a launched step: its blocks are free at once, its pending
// token never comes out, and the others finish as they would have.
TEST_F(AsyncSchedulingTest, AbortInFlightFreesBlocksAndDropsItsToken) {
  std::vector<GenerationRequest> requests = {Request(1, 40, 30), Request(2, 25, 12), Request(3, 9, 20)};
  Results expected = MakeEngine({}, false)->Generate({requests[1], requests[2]}).value();
  auto engine = MakeEngine({}, true);
  std::vector<int64_t> ids;
  for (const auto& r : requests) ids.push_back(engine->AddRequest(r).value());
  std::map<int64_t, std::vector<int32_t>> tokens;
  auto step = [&] {
    for (const StepOutput& o : engine->Step()) tokens[o.seq_id].push_back(o.token);
  };
  for (int i = 0; i < 4; ++i) step();
  const size_t num_before_abort = tokens[ids[0]].size();
  const int used = engine->num_used_blocks();
  engine->Abort(ids[0]);
  EXPECT_LT(engine->num_used_blocks(), used);
  while (engine->HasUnfinished()) step();
  EXPECT_EQ(tokens[ids[0]].size(), num_before_abort) << "a token of the aborted request";
  EXPECT_EQ(engine->num_used_blocks(), 0);
  EXPECT_EQ(tokens[ids[1]], expected[0].first);
  EXPECT_EQ(tokens[ids[2]], expected[1].first);

  // Everything aborted with a step in flight: nothing left, nothing comes out.
  auto idle = MakeEngine({}, true);
  int64_t a = idle->AddRequest(Request(4, 30, 50)).value(), b = idle->AddRequest(Request(5, 20, 50)).value();
  for (int i = 0; i < 3; ++i) idle->Step();
  idle->Abort(a);
  idle->Abort(b);
  EXPECT_EQ(idle->num_used_blocks(), 0);
  EXPECT_FALSE(idle->HasUnfinished());
  EXPECT_TRUE(idle->Step().empty());
}

// A request with penalties or logprobs makes steps synchronous while it runs; the others keep
// their tokens, and the steps after it overlap again.
TEST_F(AsyncSchedulingTest, PenaltiesAndLogprobsFallBackToSyncSteps) {
  std::vector<GenerationRequest> requests = {Request(1, 12, 40), Request(2, 10, 8), Request(3, 7, 8)};
  requests[1].penalties.repetition = 1.3f;
  requests[1].penalties.frequency = 0.5f;
  requests[2].num_logprobs = 3;
  Results out = OnEqualsOff(requests);  // the long plain request decodes on after the others
  std::vector<GenerationRequest> plain = {requests[0]};
  EXPECT_EQ(out[0].first, MakeEngine({}, true)->Generate(plain).value()[0].first);
}

// Hybrid models snapshot their linear-attention states at the block boundaries that decoding
// reaches, though the boundary's token reaches the host a step later: a follow-up turn whose
// prompt holds the answer hits as many blocks as with synchronous steps, and decodes the same.
TEST_F(AsyncSchedulingTest, HybridDecodeSnapshotsServeTheNextTurn) {
  model_ = LoadModel("tests/data/models/qwen3.5-moe-hybrid", *backend_).value();
  EngineOptions o;
  o.block_size = 8;
  GenerationRequest first = Request(9, 13, 30);
  int64_t hits[2] = {0, 0};
  std::vector<int32_t> answers[2];
  for (bool async : {false, true}) {
    auto engine = MakeEngine(o, async);
    std::vector<int32_t> answer = engine->Generate({first}).value()[0].first;
    GenerationRequest next = first;
    next.prompt.insert(next.prompt.end(), answer.begin(), answer.end());
    for (int t : {5, 6, 7}) next.prompt.push_back(t);
    next.max_tokens = 10;
    int64_t before = engine->prefix_cache_hits();
    answers[async] = engine->Generate({next}).value()[0].first;
    hits[async] = engine->prefix_cache_hits() - before;
  }
  EXPECT_EQ(hits[1], hits[0]);
  EXPECT_GE(hits[1], 40);  // 13 + 30 + 3 tokens: blocks up to 40 (the answer's boundaries too)
  EXPECT_EQ(answers[1], answers[0]);
}

// A decode step whose input ids are partly still on the device (the previous step's sampled
// ids, in rows out of batch order) equals the same step fed from the host, through the eager
// path and through a decode-graph bucket (run eagerly: the CPU captures no graphs; a full
// bucket, as the CPU's KV write takes no padding rows).
TEST_F(AsyncSchedulingTest, DecodeInputsGatheredOnTheDevice) {
  const int bs = 16, num_seqs = 5;
  const int64_t vocab = model_->config().vocab_size;
  const std::vector<int> order = {3, 0, 1, 4};  // sequence 1's token is on the host already
  for (DecodeGraphMode mode : {DecodeGraphMode::kOff, DecodeGraphMode::kBucketsEager}) {
    KvCache kv(*backend_, model_->kv_cache_spec(), 64, bs);
    ModelRunner runner(*model_, *backend_, kv, mode, /*max_num_seqs=*/8);
    EXPECT_EQ(runner.decode_graphs() != nullptr, mode == DecodeGraphMode::kBucketsEager);
    std::vector<Sequence> seqs(num_seqs);
    std::vector<ScheduledChunk> prefill;
    for (int i = 0; i < num_seqs; ++i) {
      Sequence& s = seqs[i];
      for (int j = 0; j < 9 + 13 * i; ++j) s.tokens.push_back((7 * i + 31 * j + 1) % 1024);
      s.num_prompt_tokens = s.num_tokens();
      for (int b = 0; b < 8; ++b) s.block_table.push_back(63 - (i * 8 + b));
      s.sampling.temperature = 0;
      prefill.push_back({&s, s.num_tokens()});
    }
    LaunchedStep launched = runner.Launch(prefill);
    std::vector<SampledToken> sampled = runner.Collect(launched);
    for (auto& s : seqs) {
      s.num_computed_tokens = s.num_tokens();
      s.num_pending = 1;  // as the engine counts it until it appends the token
    }
    seqs[1].tokens.push_back(sampled[1].token);
    seqs[1].num_pending = 0;
    std::vector<ScheduledChunk> mixed;
    for (int i : order) mixed.push_back({&seqs[i], 1, seqs[i].num_pending ? launched.row_of_chunk[i] : -1});
    Tensor device_fed = LogitsToHost(*backend_, runner.Execute(mixed, false));
    for (int i : order) {
      if (seqs[i].num_pending == 0) continue;
      seqs[i].tokens.push_back(sampled[i].token);
      seqs[i].num_pending = 0;
    }
    std::vector<ScheduledChunk> on_host;
    for (int i : order) on_host.push_back({&seqs[i], 1});
    Tensor host_fed = LogitsToHost(*backend_, runner.Execute(on_host, false));
    ASSERT_EQ(device_fed.shape(), host_fed.shape());
    for (int64_t k = 0; k < static_cast<int64_t>(order.size()) * vocab; ++k)
      ASSERT_EQ(device_fed.ptr<float>()[k], host_fed.ptr<float>()[k]) << "mode " << static_cast<int>(mode) << " " << k;
  }
}

}  // namespace
}  // namespace corolla
