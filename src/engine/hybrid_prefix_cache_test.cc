// Prefix caching of hybrid models: a hit restores the linear-attention states snapshotted at
// the matched block boundary together with the attention layers' K/V, and gives the tokens and
// logprobs of a cold run, for short prompts as well as long ones.
#include <gtest/gtest.h>

#include <cmath>

#include "engine/engine.h"

namespace corolla {
namespace {

class HybridPrefixCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend();
    model_ = LoadModel("tests/data/models/qwen3.5-moe-hybrid", *backend_).value();
  }
  std::unique_ptr<Engine> MakeEngine(EngineOptions o = {}) { return Engine::Create(*model_, *backend_, o).value(); }
  static GenerationRequest Request(std::vector<int32_t> prompt, int max_tokens) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.num_logprobs = 5;
    return r;
  }
  static std::vector<int32_t> Prompt(int first, int len) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back((first + 71 * i) % 1024);
    return p;
  }
  static std::vector<StepOutput> Run(Engine& e, GenerationRequest r) {
    int64_t id = e.AddRequest(std::move(r)).value();
    std::vector<StepOutput> outs;
    while (e.HasUnfinished())
      for (auto& o : e.Step())
        if (o.seq_id == id) outs.push_back(o);
    e.DiscardFinished();
    return outs;
  }
  static void ExpectSame(const std::vector<StepOutput>& a, const std::vector<StepOutput>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].token, b[i].token) << what << " step " << i;
      EXPECT_NEAR(a[i].logprob, b[i].logprob, 1e-5) << what << " step " << i;
      ASSERT_EQ(a[i].top_logprobs.size(), b[i].top_logprobs.size());
      for (size_t k = 0; k < a[i].top_logprobs.size(); ++k)
        EXPECT_NEAR(a[i].top_logprobs[k].logprob, b[i].top_logprobs[k].logprob, 1e-5) << what << " step " << i;
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_F(HybridPrefixCacheTest, RepeatedPromptsHitAndMatchColdRuns) {
  EngineOptions options;
  options.block_size = 8;
  for (int len : {9, 20, 37, 70}) {  // from one full block up
    std::vector<int32_t> prompt = Prompt(len, len);
    auto cold = Run(*MakeEngine(options), Request(prompt, 12));
    auto engine = MakeEngine(options);
    Run(*engine, Request(prompt, 12));
    int64_t hits_before = engine->prefix_cache_hits();
    auto warm = Run(*engine, Request(prompt, 12));
    EXPECT_EQ(engine->prefix_cache_hits() - hits_before, (len - 1) / 8 * 8) << "prompt of " << len;
    ExpectSame(cold, warm, "repeated prompt");
  }
}

TEST_F(HybridPrefixCacheTest, SharedPrefixWithOtherSuffixes) {
  EngineOptions options;
  options.block_size = 8;
  options.max_batch_tokens = 12;  // chunked prefill: chunks end on block boundaries
  std::vector<int32_t> system = Prompt(3, 27);
  auto engine = MakeEngine(options);
  Run(*engine, Request(system, 4));
  for (int i = 0; i < 3; ++i) {
    std::vector<int32_t> prompt = system;
    for (int t : Prompt(100 + i, 5 + 7 * i)) prompt.push_back(t);
    int64_t hits_before = engine->prefix_cache_hits();
    auto warm = Run(*engine, Request(prompt, 8));
    EXPECT_GE(engine->prefix_cache_hits() - hits_before, 24) << "suffix " << i;
    auto cold = Run(*MakeEngine(options), Request(prompt, 8));
    ExpectSame(cold, warm, "shared prefix");
  }
}

TEST_F(HybridPrefixCacheTest, NoSnapshotsNoHits) {
  EngineOptions options;
  options.block_size = 8;
  options.num_state_snapshots = 0;
  auto engine = MakeEngine(options);
  std::vector<int32_t> prompt = Prompt(5, 40);
  auto first = Run(*engine, Request(prompt, 6));
  auto second = Run(*engine, Request(prompt, 6));
  EXPECT_EQ(engine->prefix_cache_hits(), 0);
  ExpectSame(first, second, "no snapshots");
}

}  // namespace
}  // namespace corolla
