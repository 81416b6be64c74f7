// Decode graphs captured ahead of use while the engine is idle (Engine::WarmDecodeGraph, the
// AsyncEngine's idle loop): the warm-up order, no capture left to a request's steps, and tokens
// equal to the eager engine's. The CPU captures no graphs, so a backend stands in for CUDA's: its
// "graph" keeps the captured function and runs it again on each replay (the function reads the
// bucket's buffers then, as a replayed graph's kernels do).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "engine/async_engine.h"
#include "engine/engine.h"
#include "kernels/profiling_backend.h"

namespace corolla {
namespace {

class ReplayingBackend : public ProfilingBackend {
 public:
  explicit ReplayingBackend(std::unique_ptr<Backend> inner) : ProfilingBackend(std::move(inner)) {}
  bool supports_graphs() const override { return true; }
  Result<std::unique_ptr<Graph>> CaptureGraph(const std::function<void()>& fn) override {
    fn();  // the warm-up run, as CUDA's capture makes one
    if (fail_from >= 0 && captures >= fail_from) {  // as CUDA's graph instantiation out of memory
      ++failures;
      return ResourceExhausted("CUDA graph capture: out of memory");
    }
    ++captures;
    return std::unique_ptr<Graph>(std::make_unique<FnGraph>(fn, &replays));
  }
  std::atomic<int> captures{0}, replays{0}, failures{0};
  int fail_from = -1;  // captures after this many fail (-1: none)

 private:
  class FnGraph : public Graph {
   public:
    FnGraph(std::function<void()> fn, std::atomic<int>* replays) : fn_(std::move(fn)), replays_(replays) {}
    void Replay() override {
      ++*replays_;
      fn_();
    }

   private:
    std::function<void()> fn_;
    std::atomic<int>* replays_;
  };
};

class GraphWarmupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    backend_ = std::make_unique<ReplayingBackend>(MakeCpuBackend());
    model_ = LoadModel("tests/data/models/qwen3-moe", *backend_).value();
  }
  // Batch buckets 1-4 (max_num_seqs) over context buckets 256 and 512 (max_model_len 300).
  static EngineOptions Options(bool warm, DecodeGraphMode graphs = DecodeGraphMode::kAuto) {
    EngineOptions o;
    o.max_num_seqs = 4;
    o.max_model_len = 300;
    o.warm_decode_graphs = warm;
    o.decode_graphs = graphs;
    return o;
  }
  static constexpr int kWarmGraphs = 4 * 2;
  static std::vector<GenerationRequest> Requests() {
    std::vector<GenerationRequest> requests;
    for (int i = 0; i < 3; ++i) {
      GenerationRequest r;
      for (int j = 0; j < 5 + 7 * i; ++j) r.prompt.push_back((13 * i + 29 * j + 3) % 1024);
      r.max_tokens = 6 + i;
      r.sampling.temperature = 0;
      requests.push_back(r);
    }
    return requests;
  }
  std::unique_ptr<ReplayingBackend> backend_;
  std::unique_ptr<Model> model_;
};

TEST_F(GraphWarmupTest, IdleEngineCapturesEveryBucketOnceThenRequestsOnlyReplay) {
  auto eager = Engine::Create(*model_, *backend_, Options(false, DecodeGraphMode::kOff)).value();
  const auto expected = eager->Generate(Requests()).value();
  ASSERT_EQ(backend_->captures, 0);

  auto engine = Engine::Create(*model_, *backend_, Options(true)).value();
  int warmed = 0;
  while (engine->WarmDecodeGraph()) ASSERT_LE(++warmed, 100) << "the warm-up does not end";
  EXPECT_EQ(warmed, kWarmGraphs);
  EXPECT_EQ(backend_->captures, kWarmGraphs);
  EXPECT_FALSE(engine->WarmDecodeGraph());  // and stays done

  engine->set_record_steps(true);
  const auto got = engine->Generate(Requests()).value();
  EXPECT_EQ(backend_->captures, kWarmGraphs) << "a step captured a graph the warm-up should have";
  EXPECT_GT(backend_->replays, 0);
  int graph_steps = 0;
  for (const StepRecord& r : engine->TakeStepRecords()) graph_steps += r.graph;
  EXPECT_GT(graph_steps, 0);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, expected[i].first) << "request " << i;
    EXPECT_EQ(got[i].second, expected[i].second) << "request " << i;
  }
  EXPECT_EQ(engine->num_used_blocks(), 0);
}

TEST_F(GraphWarmupTest, NothingToWarmWhenOffOrEager) {
  for (EngineOptions o : {Options(false), Options(true, DecodeGraphMode::kOff),
                          Options(true, DecodeGraphMode::kBucketsEager)}) {
    auto engine = Engine::Create(*model_, *backend_, o).value();
    EXPECT_FALSE(engine->WarmDecodeGraph());
  }
  EXPECT_EQ(backend_->captures, 0);
}

TEST_F(GraphWarmupTest, WarmUpWaitsWhileARequestIsInTheEngine) {
  auto engine = Engine::Create(*model_, *backend_, Options(true)).value();
  ASSERT_TRUE(engine->AddRequest(Requests()[0]).ok());
  EXPECT_TRUE(engine->WarmDecodeGraph());  // more to do later, nothing now
  EXPECT_EQ(backend_->captures, 0);
  while (engine->HasUnfinished()) engine->Step();
  while (engine->WarmDecodeGraph()) {
  }
  EXPECT_EQ(backend_->captures, kWarmGraphs);  // the request's step captured (1, 256) itself
}

// A capture that fails (on CUDA: no memory left for the graph) is no crash: the warm-up ends
// there, each bucket whose capture failed runs its steps eagerly without trying again, and the
// tokens stay the eager engine's.
TEST_F(GraphWarmupTest, FailedCaptureEndsTheWarmUpAndItsBucketRunsEagerly) {
  auto eager = Engine::Create(*model_, *backend_, Options(false, DecodeGraphMode::kOff)).value();
  const auto expected = eager->Generate(Requests()).value();
  backend_->fail_from = 3;  // the warm-up's fourth graph, (2 rows, context 512), on
  auto engine = Engine::Create(*model_, *backend_, Options(true)).value();
  int warmed = 0;
  while (engine->WarmDecodeGraph()) ASSERT_LE(++warmed, 100) << "the warm-up does not end";
  EXPECT_EQ(warmed, 3);
  EXPECT_EQ(backend_->captures, 3);
  EXPECT_EQ(backend_->failures, 1);
  EXPECT_FALSE(engine->WarmDecodeGraph());

  engine->set_record_steps(true);
  for (int round = 0; round < 2; ++round) {
    const int failures_before = backend_->failures;
    const auto got = engine->Generate(Requests()).value();
    ASSERT_EQ(got.size(), expected.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_EQ(got[i].first, expected[i].first) << "round " << round << " request " << i;
    // The first round's steps try each bucket not yet tried once; the second tries none.
    if (round == 1) {
      EXPECT_EQ(backend_->failures, failures_before);
    }
  }
  EXPECT_GT(backend_->failures, 1) << "the requests' steps needed buckets past the warm-up's";
  EXPECT_EQ(backend_->captures, 3);
  EXPECT_EQ(engine->num_used_blocks(), 0);
}

// The serving loop warms while idle; a request submitted during the warm-up still gets the eager
// engine's tokens, and the warm-up finishes after it.
TEST_F(GraphWarmupTest, AsyncEngineWarmsWhileIdle) {
  auto eager = Engine::Create(*model_, *backend_, Options(false, DecodeGraphMode::kOff)).value();
  const auto expected = eager->Generate(Requests()).value();
  AsyncEngine server(Engine::Create(*model_, *backend_, Options(true)).value(), {});
  for (int round = 0; round < 2; ++round) {
    std::vector<std::vector<int32_t>> tokens(expected.size());
    std::vector<std::promise<void>> done(expected.size());
    for (size_t i = 0; i < expected.size(); ++i) {
      ASSERT_TRUE(server
                      .Submit(Requests()[i],
                              [&, i](const RequestOutput& out) {
                                tokens[i].insert(tokens[i].end(), out.tokens.begin(), out.tokens.end());
                                if (out.finish_reason != FinishReason::kNone) done[i].set_value();
                                return true;
                              })
                      .ok());
    }
    for (auto& d : done) ASSERT_EQ(d.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
    for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(tokens[i], expected[i].first) << "round " << round << " request " << i;
    if (round == 0) {  // let the warm-up finish, then run again on replays alone
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (backend_->captures < kWarmGraphs && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ASSERT_EQ(backend_->captures, kWarmGraphs);
    }
  }
  EXPECT_EQ(backend_->captures, kWarmGraphs);
  server.Shutdown();
}

}  // namespace
}  // namespace corolla
