// Prefix caching (hits give the same tokens and logprobs as a cold run, and are counted; LRU
// eviction), logit penalties and logprobs.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/block_pool.h"
#include "engine/engine.h"
#include "engine/model_runner.h"

namespace corolla {
namespace {

TEST(BlockPoolPrefixCache, RegisterShareAndEvictLeastRecentlyFreed) {
  BlockPool pool(3);
  std::vector<int32_t> toks_a{1, 2}, toks_b{3, 4};
  uint64_t ha = BlockHash(0, toks_a), hb = BlockHash(ha, toks_b);
  EXPECT_NE(ha, hb);
  std::vector<int32_t> blocks = pool.Allocate(2);
  EXPECT_TRUE(pool.Register(blocks[0], ha, 0, toks_a));
  EXPECT_TRUE(pool.Register(blocks[1], hb, ha, toks_b));
  EXPECT_FALSE(pool.Register(blocks[1], hb, ha, toks_b));  // already registered
  pool.Free(std::vector<int32_t>{blocks[1], blocks[0]});   // b freed first: evicted first
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.num_cached_free(), 2);
  ASSERT_EQ(pool.FindCached(ha, 0, toks_a), blocks[0]);
  EXPECT_FALSE(pool.FindCached(ha, 0, toks_b).has_value());  // content is verified
  pool.Share(blocks[0]);
  EXPECT_EQ(pool.ref_count(blocks[0]), 1);
  EXPECT_EQ(pool.num_free(), 2);
  // One uncached block, then the LRU cached one (b) is evicted.
  std::vector<int32_t> more = pool.Allocate(2);
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_FALSE(pool.FindCached(hb, ha, toks_b).has_value());
  EXPECT_TRUE(pool.FindCached(ha, 0, toks_a).has_value());
  pool.Free(more);
  pool.Free(std::vector<int32_t>{blocks[0]});
  EXPECT_EQ(pool.num_free(), 3);
}

class PrefixCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend();
    model_ = LoadModel("tests/data/models/qwen3-moe", *backend_).value();
  }
  std::unique_ptr<Engine> MakeEngine(EngineOptions o = {}) { return Engine::Create(*model_, *backend_, o).value(); }
  static GenerationRequest Request(std::vector<int32_t> prompt, int max_tokens, int num_logprobs = -1) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.num_logprobs = num_logprobs;
    return r;
  }
  static std::vector<int32_t> Prompt(int first, int len) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back((first + 53 * i) % 1024);
    return p;
  }
  // Runs one request step by step, collecting tokens and top-20 logprobs.
  static std::pair<std::vector<int32_t>, std::vector<StepOutput>> Run(Engine& e, GenerationRequest r) {
    int64_t id = e.AddRequest(std::move(r)).value();
    std::vector<int32_t> tokens;
    std::vector<StepOutput> outs;
    while (e.HasUnfinished()) {
      for (auto& o : e.Step()) {
        if (o.seq_id != id) continue;
        tokens.push_back(o.token);
        outs.push_back(o);
      }
    }
    e.DiscardFinished();
    return {tokens, outs};
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_F(PrefixCacheTest, HitGivesTheSameTokensAndLogprobsAsAColdRun) {
  EngineOptions o;
  o.block_size = 4;
  std::vector<int32_t> shared = Prompt(7, 37);
  std::vector<int32_t> prompt_b = shared;
  for (int32_t t : Prompt(300, 6)) prompt_b.push_back(t);

  EngineOptions cold_options = o;
  cold_options.enable_prefix_caching = false;
  auto cold = MakeEngine(cold_options);
  auto [cold_tokens, cold_outs] = Run(*cold, Request(prompt_b, 12, 20));
  EXPECT_EQ(cold->prefix_cache_hits(), 0);

  auto warm = MakeEngine(o);
  Run(*warm, Request(shared, 3));
  EXPECT_EQ(warm->prefix_cache_hits(), 0);
  auto [warm_tokens, warm_outs] = Run(*warm, Request(prompt_b, 12, 20));
  EXPECT_EQ(warm->prefix_cache_hits(), 36);  // the 9 full blocks of the shared prompt
  EXPECT_EQ(warm_tokens, cold_tokens);
  ASSERT_EQ(warm_outs.size(), cold_outs.size());
  for (size_t i = 0; i < warm_outs.size(); ++i) {
    EXPECT_NEAR(warm_outs[i].logprob, cold_outs[i].logprob, 1e-5) << "step " << i;
    ASSERT_EQ(warm_outs[i].top_logprobs.size(), 20u);
    for (size_t k = 0; k < 20; ++k) {
      EXPECT_EQ(warm_outs[i].top_logprobs[k].token, cold_outs[i].top_logprobs[k].token);
      EXPECT_NEAR(warm_outs[i].top_logprobs[k].logprob, cold_outs[i].top_logprobs[k].logprob, 1e-5);
    }
  }
  // The same prompt again hits everything but its last token's block.
  auto [again, unused] = Run(*warm, Request(prompt_b, 12));
  EXPECT_EQ(again, cold_tokens);
  EXPECT_EQ(warm->prefix_cache_hits(), 36 + 40);
  EXPECT_EQ(warm->num_used_blocks(), 0);
}

TEST_F(PrefixCacheTest, SharedPrefixesInOneBatchAndUnderPressure) {
  std::vector<GenerationRequest> requests;
  std::vector<int32_t> system = Prompt(11, 24);
  for (int i = 0; i < 6; ++i) {
    std::vector<int32_t> p = system;
    for (int32_t t : Prompt(100 + i, 5 + 3 * i)) p.push_back(t);
    requests.push_back(Request(p, 20));
  }
  EngineOptions plain;
  plain.enable_prefix_caching = false;
  auto expected = MakeEngine(plain)->Generate(requests).value();
  EngineOptions tight;
  tight.block_size = 4;
  tight.num_kv_blocks = 30;
  tight.max_model_len = 64;
  tight.max_batch_tokens = 24;
  auto engine = MakeEngine(tight);
  auto first = engine->Generate({requests[0]}).value();
  auto got = engine->Generate(requests).value();
  EXPECT_GT(engine->prefix_cache_hits(), 0);
  EXPECT_EQ(engine->num_free_blocks(), 30);
  EXPECT_EQ(first[0].first, expected[0].first);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[i].first, expected[i].first) << "request " << i;
}

TEST(Penalties, FollowVllmDefinitions) {
  Sequence s;
  s.tokens = {0, 1, 2, 2, 3};  // prompt {0, 1}, output {2, 2, 3}
  s.num_prompt_tokens = 2;
  s.penalties.repetition = 2.0f;
  s.penalties.frequency = 0.5f;
  s.penalties.presence = 0.25f;
  std::vector<float> logits{1.0f, -1.0f, 4.0f, -2.0f, 3.0f};
  ApplyPenalties(s, logits.data(), 5);
  EXPECT_FLOAT_EQ(logits[0], 0.5f);                 // prompt: repetition only
  EXPECT_FLOAT_EQ(logits[1], -2.0f);
  EXPECT_FLOAT_EQ(logits[2], 2.0f - 1.0f - 0.25f);  // twice in the output
  EXPECT_FLOAT_EQ(logits[3], -4.0f - 0.5f - 0.25f);
  EXPECT_FLOAT_EQ(logits[4], 3.0f);                 // unseen
}

TEST_F(PrefixCacheTest, LogprobsAreLogSoftmaxOfRawLogitsAndPenaltiesChangeTokens) {
  auto engine = MakeEngine();
  GenerationRequest r = Request(Prompt(3, 10), 16, 5);
  auto [tokens, outs] = Run(*engine, r);
  for (const StepOutput& o : outs) {
    ASSERT_EQ(o.top_logprobs.size(), 5u);
    EXPECT_EQ(o.top_logprobs[0].token, o.token);  // greedy picks the most likely
    EXPECT_FLOAT_EQ(o.top_logprobs[0].logprob, o.logprob);
    EXPECT_LE(o.logprob, 0.0f);
    for (int k = 1; k < 5; ++k) EXPECT_LE(o.top_logprobs[k].logprob, o.top_logprobs[k - 1].logprob);
  }
  GenerationRequest penalised = Request(Prompt(3, 10), 16);
  penalised.penalties.frequency = 2.0f;
  penalised.penalties.repetition = 1.5f;
  auto [other, unused] = Run(*engine, penalised);
  EXPECT_NE(other, tokens);
  // A generated token never repeats under a huge presence penalty.
  GenerationRequest presence = Request(Prompt(3, 10), 16);
  presence.penalties.presence = 1e4f;
  auto [distinct, unused2] = Run(*engine, presence);
  std::vector<int32_t> sorted = distinct;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end());
}

}  // namespace
}  // namespace corolla
