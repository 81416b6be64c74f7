// The step-thread engine: concurrent submissions from many threads, per-token delivery, one
// final output per request, cancellation frees blocks, the queue limit, and shutdown.
#include "engine/async_engine.h"

#include <gtest/gtest.h>

#include <future>

namespace corolla {
namespace {

class AsyncEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = MakeCpuBackend();
    model_ = LoadModel("tests/data/models/qwen3-moe", *backend_).value();
  }
  std::unique_ptr<AsyncEngine> Make(EngineOptions o = {}, AsyncEngineOptions a = {}) {
    return std::make_unique<AsyncEngine>(Engine::Create(*model_, *backend_, o).value(), a);
  }
  static GenerationRequest Request(int first, int len, int max_tokens) {
    GenerationRequest r;
    for (int i = 0; i < len; ++i) r.prompt.push_back((first + 31 * i) % 1024);
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    return r;
  }

  struct Collected {
    std::mutex mu;
    std::vector<int32_t> tokens;
    FinishReason reason = FinishReason::kNone;
    int num_finals = 0;
    std::promise<void> done;
  };
  static OutputCallback Collect(std::shared_ptr<Collected> c) {
    return [c](const RequestOutput& out) {
      std::lock_guard<std::mutex> lock(c->mu);
      c->tokens.insert(c->tokens.end(), out.tokens.begin(), out.tokens.end());
      if (out.finish_reason != FinishReason::kNone) {
        c->reason = out.finish_reason;
        if (++c->num_finals == 1) c->done.set_value();
      }
      return true;
    };
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_F(AsyncEngineTest, ManyThreadsSubmitAndEveryRequestFinishesLikeGenerate) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 24; ++i) requests.push_back(Request(i * 7 + 1, 5 + i % 9, 4 + i % 11));
  auto expected = Engine::Create(*model_, *backend_, {}).value()->Generate(requests).value();
  auto engine = Make();
  std::vector<std::shared_ptr<Collected>> got(requests.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (size_t i = t; i < requests.size(); i += 4) {
        got[i] = std::make_shared<Collected>();
        ASSERT_TRUE(engine->Submit(requests[i], Collect(got[i])).ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < requests.size(); ++i) {
    got[i]->done.get_future().wait();
    std::lock_guard<std::mutex> lock(got[i]->mu);
    EXPECT_EQ(got[i]->tokens, expected[i].first) << i;
    EXPECT_EQ(got[i]->reason, FinishReason::kLength);
  }
  engine->Shutdown();
  EXPECT_EQ(engine->Stats().num_used_kv_blocks, 0);
  for (auto& g : got) EXPECT_EQ(g->num_finals, 1);
}

TEST_F(AsyncEngineTest, CancelFreesBlocksAndEndsWithAbort) {
  auto engine = Make();
  auto c = std::make_shared<Collected>();
  std::promise<void> first_token;
  bool signalled = false;
  auto inner = Collect(c);
  uint64_t id = engine->Submit(Request(1, 40, 1000), [&, inner](const RequestOutput& out) {
    inner(out);
    if (!signalled) {
      signalled = true;
      first_token.set_value();
    }
    return true;
  }).value();
  first_token.get_future().wait();
  engine->Cancel(id);
  c->done.get_future().wait();
  EXPECT_EQ(c->reason, FinishReason::kAbort);
  engine->Cancel(id);  // ignored
  for (int i = 0; i < 100 && engine->Stats().num_used_kv_blocks != 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(engine->Stats().num_used_kv_blocks, 0);
}

TEST_F(AsyncEngineTest, QueueLimitRefusesAndShutdownAbortsTheRest) {
  EngineOptions o;
  o.max_num_seqs = 1;
  AsyncEngineOptions a;
  a.max_waiting = 3;
  auto engine = Make(o, a);
  std::vector<std::shared_ptr<Collected>> accepted;
  int refused = 0;
  for (int i = 0; i < 20; ++i) {
    auto c = std::make_shared<Collected>();
    auto id = engine->Submit(Request(i, 8, 500), Collect(c));
    if (id.ok()) {
      accepted.push_back(c);
    } else {
      EXPECT_EQ(id.status().code(), StatusCode::kResourceExhausted);
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);
  engine->Shutdown(std::chrono::milliseconds(0));
  for (auto& c : accepted) {
    EXPECT_EQ(c->num_finals, 1);
    EXPECT_EQ(c->reason, FinishReason::kAbort);
  }
  EXPECT_EQ(engine->Stats().num_used_kv_blocks, 0);
  EXPECT_EQ(engine->Submit(Request(1, 8, 5), Collect(std::make_shared<Collected>())).status().code(),
            StatusCode::kCancelled);
  auto bad = Request(1, 8, 5);
  bad.prompt[0] = -5;
  EXPECT_EQ(engine->Submit(bad, Collect(std::make_shared<Collected>())).status().code(), StatusCode::kOutOfRange);
}

TEST_F(AsyncEngineTest, CallbackReturningFalseEndsTheRequest) {
  auto engine = Make();
  std::promise<int> calls;
  int n = 0;
  ASSERT_TRUE(engine->Submit(Request(2, 30, 50), [&](const RequestOutput& out) {
    if (++n == 3) calls.set_value(n);
    return n < 3;
  }).ok());
  EXPECT_EQ(calls.get_future().get(), 3);
  engine->Shutdown(std::chrono::seconds(10));
  EXPECT_EQ(n, 3);
  EXPECT_EQ(engine->Stats().num_used_kv_blocks, 0);
}

TEST_F(AsyncEngineTest, ShutdownWithDrainFinishesInFlightRequests) {
  auto engine = Make();
  auto c = std::make_shared<Collected>();
  ASSERT_TRUE(engine->Submit(Request(3, 8, 12), Collect(c)).ok());
  engine->Shutdown(std::chrono::seconds(60));
  EXPECT_EQ(c->reason, FinishReason::kLength);
  EXPECT_EQ(c->tokens.size(), 12u);
}

// Callbacks run beside the step loop: a slow consumer does not hold the steps back, and every
// token still arrives, in order, as Generate would produce it.
TEST_F(AsyncEngineTest, SlowCallbacksOverlapTheSteps) {
  GenerationRequest r = Request(4, 12, 20);
  auto expected = Engine::Create(*model_, *backend_, {}).value()->Generate({r}).value()[0].first;
  auto engine = Make();
  auto c = std::make_shared<Collected>();
  auto inner = Collect(c);
  int64_t steps_seen_by_first_callback = -1;
  ASSERT_TRUE(engine->Submit(r, [&, inner](const RequestOutput& out) {
    if (steps_seen_by_first_callback < 0) {  // blocks until the steps are done (or 10 s)
      for (int i = 0; i < 1000 && engine->Stats().num_steps < 20; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      steps_seen_by_first_callback = engine->Stats().num_steps;
    }
    return inner(out);
  }).ok());
  c->done.get_future().wait();
  EXPECT_EQ(steps_seen_by_first_callback, 20);  // the whole generation ran meanwhile
  std::lock_guard<std::mutex> lock(c->mu);
  EXPECT_EQ(c->tokens, expected);
  EXPECT_EQ(c->reason, FinishReason::kLength);
}

// Async and synchronous steps deliver the same tokens, exactly up to each request's end: its
// max_tokens, a stop token, or a callback that ends it (as a stop string does on the server).
TEST_F(AsyncEngineTest, AsyncAndSyncStepsDeliverTheSameTokens) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 8; ++i) requests.push_back(Request(13 * i + 2, 6 + 5 * i, 5 + 3 * i));
  auto generate = [&](const std::vector<GenerationRequest>& rs) {
    return Engine::Create(*model_, *backend_, {}).value()->Generate(rs).value();
  };
  requests[3].stop_token_ids = {generate({requests[3]})[0].first[2]};
  auto expected = generate(requests);
  constexpr int kEnded = 5, kEndAfter = 3;  // request kEnded's callback ends it at its 3rd token
  for (bool async : {false, true}) {
    EngineOptions o;
    o.async_scheduling = async;
    auto engine = Make(o);
    std::vector<std::shared_ptr<Collected>> got;
    std::vector<int32_t> ended_tokens;
    for (int i = 0; i < static_cast<int>(requests.size()); ++i) {
      got.push_back(std::make_shared<Collected>());
      OutputCallback callback = Collect(got.back());
      if (i == kEnded) {
        callback = [&ended_tokens](const RequestOutput& out) {
          ended_tokens.insert(ended_tokens.end(), out.tokens.begin(), out.tokens.end());
          return static_cast<int>(ended_tokens.size()) < kEndAfter;
        };
      }
      ASSERT_TRUE(engine->Submit(requests[i], callback).ok());
    }
    for (int i = 0; i < static_cast<int>(requests.size()); ++i) {
      if (i == kEnded) continue;
      got[i]->done.get_future().wait();
      std::lock_guard<std::mutex> lock(got[i]->mu);
      EXPECT_EQ(got[i]->tokens, expected[i].first) << "request " << i << (async ? " async" : " sync");
      EXPECT_EQ(got[i]->reason, expected[i].second) << "request " << i;
    }
    engine->Shutdown(std::chrono::seconds(10));
    EXPECT_EQ(ended_tokens, std::vector<int32_t>(expected[kEnded].first.begin(),
                                                 expected[kEnded].first.begin() + kEndAfter));
    EXPECT_EQ(engine->Stats().num_used_kv_blocks, 0);
    for (int i = 0; i < static_cast<int>(requests.size()); ++i) {
      if (i != kEnded) {
        EXPECT_EQ(got[i]->num_finals, 1);
      }
    }
  }
  EXPECT_EQ(expected[3].second, FinishReason::kStop);
}

// SubmitAll (n choices of one prompt): the first computes the prompt, the others join once it is
// cached; each gives what it would alone, and a cancelled follower ends with abort.
TEST_F(AsyncEngineTest, SubmitAllComputesTheSharedPromptOnce) {
  GenerationRequest r = Request(9, 50, 10);  // 3 full blocks of 16 before the last token
  auto expected = Engine::Create(*model_, *backend_, {}).value()->Generate({r}).value()[0].first;
  auto engine = Make();
  std::vector<std::shared_ptr<Collected>> got;
  std::vector<GenerationRequest> requests;
  std::vector<OutputCallback> callbacks;
  for (int i = 0; i < 3; ++i) {
    got.push_back(std::make_shared<Collected>());
    requests.push_back(r);
    callbacks.push_back(Collect(got.back()));
  }
  std::vector<uint64_t> ids = engine->SubmitAll(requests, callbacks).value();
  ASSERT_EQ(ids.size(), 3u);
  for (auto& g : got) {
    g->done.get_future().wait();
    std::lock_guard<std::mutex> lock(g->mu);
    EXPECT_EQ(g->tokens, expected);
  }
  EXPECT_EQ(engine->Stats().prefix_cache_hits, 2 * 48);

  // A follower cancelled while it waits for its leader.
  got.clear();
  callbacks.clear();
  requests.assign(3, Request(11, 40, 30));
  for (int i = 0; i < 3; ++i) {
    got.push_back(std::make_shared<Collected>());
    callbacks.push_back(Collect(got.back()));
  }
  ids = engine->SubmitAll(requests, callbacks).value();
  engine->Cancel(ids[2]);
  for (auto& g : got) g->done.get_future().wait();
  EXPECT_EQ(got[0]->reason, FinishReason::kLength);
  EXPECT_EQ(got[1]->reason, FinishReason::kLength);
  EXPECT_EQ(got[2]->reason, FinishReason::kAbort);
  EXPECT_EQ(got[1]->tokens, got[0]->tokens);
  engine->Shutdown();
  EXPECT_EQ(engine->Stats().num_used_kv_blocks, 0);
  for (auto& g : got) EXPECT_EQ(g->num_finals, 1);

  // All or none against the queue limit.
  AsyncEngineOptions a;
  a.max_waiting = 2;
  auto small = Make({}, a);
  requests.assign(3, Request(1, 8, 2));
  callbacks.assign(3, Collect(std::make_shared<Collected>()));
  EXPECT_EQ(small->SubmitAll(requests, callbacks).status().code(), StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace corolla
