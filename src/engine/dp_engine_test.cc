// Data-parallel serving in one process: two ranks as threads, each with its own model and
// engine, exchanging their round blobs through an in-memory all-gather. Outputs equal one
// engine's; every round runs one forward on every rank while any has work (lockstep, what DP-EP
// needs); the n choices of a request, cancellation, shutdown (followers stop) and a failed
// exchange (requests aborted, new ones refused).
#include "engine/dp_engine.h"

#include <gtest/gtest.h>

#include <future>
#include <semaphore>

namespace corolla {
namespace {

// An all-gather among `n` threads: each call returns once every rank has called. Between two
// calls a rank holds the turn, so that the ranks' steps run one at a time: the CPU kernels share
// one thread pool, which takes one caller at a time.
class ThreadAllGather {
 public:
  explicit ThreadAllGather(int n) : n_(n), slots_(n), holds_turn_(n, false) {}
  DpAllGather For(int rank) {
    return [this, rank](const std::string& blob) {
      Leave(rank);
      Result<std::vector<std::string>> all = Gather(rank, blob);
      if (all.ok()) {
        turn_.acquire();
        holds_turn_[rank] = true;
      }
      return all;
    };
  }
  // Gives back the turn of a rank that has stopped calling (after its last round); any thread.
  void Leave(int rank) {
    if (holds_turn_[rank]) turn_.release();
    holds_turn_[rank] = false;
  }
  // From now on every call fails (a rank died).
  void Break() {
    std::lock_guard<std::mutex> lock(mu_);
    broken_ = true;
    cv_.notify_all();
  }

 private:
  Result<std::vector<std::string>> Gather(int rank, const std::string& blob) {
    std::unique_lock<std::mutex> lock(mu_);
    if (broken_) return Internal("the exchange is broken");
    const uint64_t generation = generation_;
    slots_[rank] = blob;
    if (++arrived_ == n_) {
      result_ = slots_;
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return result_;
    }
    cv_.wait(lock, [&] { return generation_ != generation || broken_; });
    if (generation_ == generation) return Internal("the exchange is broken");
    return result_;  // the next round cannot complete without this rank, so it is still this one's
  }

  const int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> slots_, result_;
  std::binary_semaphore turn_{1};
  std::vector<char> holds_turn_;  // each rank's entry: its thread's, or any after it has stopped
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool broken_ = false;
};

// Counts forwards and records each one's tokens and exchange (what a DP-EP model's collectives
// depend on); a forward of no tokens (a rank's empty one) does nothing, as a model without
// expert exchanges has nothing to join.
class LockstepModel final : public Model {
 public:
  struct Call {
    int64_t tokens;
    bool fixed_capacity;  // ForwardBatch::ep_fixed_capacity
  };
  explicit LockstepModel(Model& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  KvCacheSpec kv_cache_spec() const override { return inner_.kv_cache_spec(); }
  StateSpec state_spec() const override { return inner_.state_spec(); }
  void Forward(const ForwardBatch& batch, std::span<const KvCacheView> kv_caches, const TensorView& logits) override {
    ++num_forwards;
    calls.push_back({batch.token_ids.dim(0), batch.ep_fixed_capacity});  // one thread per rank
    if (batch.token_ids.dim(0) > 0) inner_.Forward(batch, kv_caches, logits);
  }
  std::atomic<int64_t> num_forwards{0};
  std::vector<Call> calls;  // read once the rank's thread has stopped

 private:
  Model& inner_;
};

struct Collected {
  std::mutex mu;
  std::vector<int32_t> tokens;
  FinishReason reason = FinishReason::kNone;
  int num_finals = 0;
  std::promise<void> done;
};

OutputCallback Collect(std::shared_ptr<Collected> c) {
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

GenerationRequest Request(int first, int len, int max_tokens) {
  GenerationRequest r;
  for (int i = 0; i < len; ++i) r.prompt.push_back((first + 31 * i) % 1024);
  r.max_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

bool Wait(Collected& c, int seconds = 30) {
  return c.done.get_future().wait_for(std::chrono::seconds(seconds)) == std::future_status::ready;
}

class DataParallelEngineTest : public ::testing::Test {
 protected:
  static constexpr int kRanks = 2;
  void SetUp() override {
    for (int r = 0; r < kRanks; ++r) {
      backends_.push_back(MakeCpuBackend());
      models_.push_back(LoadModel("tests/data/models/qwen3-moe", *backends_.back()).value());
      lockstep_.push_back(std::make_unique<LockstepModel>(*models_.back()));
    }
  }
  // fixed_capacity > 0: each rank captures its decode graphs (here: runs the padded buckets once,
  // with EngineOptions::decode_graphs kBucketsEager) before the rounds, as `corolla serve` does.
  void Start(EngineOptions o = {}, AsyncEngineOptions a = {}, int fixed_capacity = 0) {
    o.async_scheduling = false;
    for (int r = 1; r < kRanks; ++r) {
      followers_.push_back(
          DpRankEngine::Create(*lockstep_[r], *backends_[r], o, r, /*collective=*/true, fixed_capacity).value());
      DpRankEngine* rank = followers_.back().get();
      if (fixed_capacity > 0) num_startup_forwards_[r] = rank->CaptureDecodeGraphs(rank->engine().max_model_len());
      follower_threads_.emplace_back([this, rank, r] {
        follower_status_[r] = RunDpFollower(*rank, exchange_.For(r));
        exchange_.Leave(r);
      });
    }
    auto local = DpRankEngine::Create(*lockstep_[0], *backends_[0], o, 0, /*collective=*/true, fixed_capacity).value();
    const int max_model_len = local->engine().max_model_len();
    if (fixed_capacity > 0) num_startup_forwards_[0] = local->CaptureDecodeGraphs(max_model_len);
    engine_ = std::make_unique<DataParallelEngine>(std::move(local), exchange_.For(0), kRanks, max_model_len, a,
                                                   [this](const Status& s) { failures_.push_back(s.ToString()); });
  }
  void StopAll() {
    engine_->Shutdown(std::chrono::seconds(10));
    exchange_.Leave(0);  // the step thread ended with its last round
    for (std::thread& t : follower_threads_) t.join();
    follower_threads_.clear();
  }
  void TearDown() override {
    if (engine_) engine_->Shutdown();
    exchange_.Leave(0);
    exchange_.Break();
    for (std::thread& t : follower_threads_) t.join();
  }

  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<Model>> models_;
  std::vector<std::unique_ptr<LockstepModel>> lockstep_;
  ThreadAllGather exchange_{kRanks};
  std::vector<std::unique_ptr<DpRankEngine>> followers_;
  std::vector<std::thread> follower_threads_;
  Status follower_status_[kRanks];
  int num_startup_forwards_[kRanks] = {};
  std::unique_ptr<DataParallelEngine> engine_;
  std::vector<std::string> failures_;
};

TEST_F(DataParallelEngineTest, OutputsEqualOneEngineAndEveryRankStepsInLockstep) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 9; ++i) requests.push_back(Request(i * 7 + 1, 3 + i % 5 * 4, 3 + i % 4 * 3));
  auto expected = Engine::Create(*models_[0], *backends_[0], {}).value()->Generate(requests).value();
  Start();
  std::vector<std::shared_ptr<Collected>> got;
  for (const GenerationRequest& r : requests) {
    got.push_back(std::make_shared<Collected>());
    ASSERT_TRUE(engine_->Submit(r, Collect(got.back())).ok());
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(Wait(*got[i])) << i;
    EXPECT_EQ(got[i]->tokens, expected[i].first) << i;
    EXPECT_EQ(got[i]->reason, FinishReason::kLength);
    EXPECT_EQ(got[i]->num_finals, 1);
  }
  StopAll();
  EXPECT_TRUE(follower_status_[1].ok()) << follower_status_[1].ToString();
  EXPECT_GT(followers_[0]->engine().num_steps(), 0) << "rank 1 got no work";
  // One forward per round on every rank (empty ones where a rank had nothing).
  EXPECT_EQ(lockstep_[0]->num_forwards.load(), lockstep_[1]->num_forwards.load());
  EXPECT_TRUE(failures_.empty());
}

// DP-EP serving with a fixed capacity: the start-up captures are the same forwards on every
// rank; afterwards every round's forwards take the same exchange on every rank (eager steps,
// bucket runs and empty forwards alike), a fixed-capacity round never brings more tokens than
// the capacity, rounds with prefills take the sized exchange, and the outputs equal one engine's.
TEST_F(DataParallelEngineTest, FixedCapacityRoundsAndStartUpGraphsMatchAcrossRanks) {
  constexpr int kCapacity = DecodeGraphs::kMaxCollectiveBatch;
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 7; ++i) requests.push_back(Request(i * 11 + 2, 3 + i * 5, 4 + i % 3 * 3));  // prompts 3..33
  auto expected = Engine::Create(*models_[0], *backends_[0], {}).value()->Generate(requests).value();
  EngineOptions o;
  o.decode_graphs = DecodeGraphMode::kBucketsEager;
  Start(o, {}, kCapacity);
  ASSERT_GT(num_startup_forwards_[0], 0);
  EXPECT_EQ(num_startup_forwards_[0], num_startup_forwards_[1]);
  std::vector<std::shared_ptr<Collected>> got;
  for (size_t i = 0; i < requests.size(); ++i) {
    got.push_back(std::make_shared<Collected>());
    ASSERT_TRUE(engine_->Submit(requests[i], Collect(got.back())).ok());
    if (i == 3) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a later arrival mid-decode
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(Wait(*got[i])) << i;
    EXPECT_EQ(got[i]->tokens, expected[i].first) << i;
  }
  StopAll();
  EXPECT_TRUE(follower_status_[1].ok()) << follower_status_[1].ToString();
  const std::vector<LockstepModel::Call>& a = lockstep_[0]->calls;
  const std::vector<LockstepModel::Call>& b = lockstep_[1]->calls;
  ASSERT_EQ(a.size(), b.size());
  int num_fixed = 0, num_sized = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].fixed_capacity, b[i].fixed_capacity) << "forward " << i;
    if (static_cast<int>(i) < num_startup_forwards_[0]) {
      EXPECT_TRUE(a[i].fixed_capacity && a[i].tokens > 0 && a[i].tokens <= kCapacity) << "start-up forward " << i;
      continue;
    }
    for (const LockstepModel::Call* c : {&a[i], &b[i]}) {
      if (c->fixed_capacity) {
        EXPECT_LE(c->tokens, kCapacity) << "forward " << i;
      }
    }
    ++(a[i].fixed_capacity ? num_fixed : num_sized);
  }
  EXPECT_GT(num_fixed, 0) << "no decode round took the fixed-capacity exchange";
  EXPECT_GT(num_sized, 0) << "no prefill round took the sized exchange";
  EXPECT_TRUE(failures_.empty());
}

// A fixed-capacity step schedules at most the capacity's tokens (a prefill goes on in chunks)
// and says so to the model; a sized one takes the usual budget.
TEST_F(DataParallelEngineTest, AFixedCapacityStepSchedulesAtMostItsTokens) {
  EngineOptions o;
  o.async_scheduling = false;
  o.collective_forwards = true;
  auto engine = Engine::Create(*lockstep_[0], *backends_[0], o).value();
  ASSERT_TRUE(engine->AddRequest(Request(1, 40, 3)).ok());
  EXPECT_EQ(engine->EstimateNextStepTokens(), 40);
  const std::vector<LockstepModel::Call>& calls = lockstep_[0]->calls;
  engine->SetCollectiveStep(/*fixed=*/true, 16);
  for (int64_t want : {16, 16, 8}) {
    engine->Step();
    ASSERT_FALSE(calls.empty());
    EXPECT_EQ(calls.back().tokens, want);
    EXPECT_TRUE(calls.back().fixed_capacity);
  }
  EXPECT_EQ(engine->EstimateNextStepTokens(), 1);  // decoding now
  engine->SetCollectiveStep(/*fixed=*/false, 16);
  engine->Step();
  EXPECT_EQ(calls.back().tokens, 1);
  EXPECT_FALSE(calls.back().fixed_capacity);
}

TEST_F(DataParallelEngineTest, ChoicesOfOneRequestShareARankAndEachEnds) {
  GenerationRequest r = Request(5, 37, 6);
  auto expected = Engine::Create(*models_[0], *backends_[0], {}).value()->Generate({r}).value();
  Start();
  std::vector<std::shared_ptr<Collected>> got;
  std::vector<OutputCallback> callbacks;
  for (int i = 0; i < 3; ++i) {
    got.push_back(std::make_shared<Collected>());
    callbacks.push_back(Collect(got.back()));
  }
  ASSERT_TRUE(engine_->SubmitAll({r, r, r}, std::move(callbacks)).ok());
  for (auto& c : got) {
    ASSERT_TRUE(Wait(*c));
    EXPECT_EQ(c->tokens, expected[0].first);
    EXPECT_EQ(c->num_finals, 1);
  }
  EXPECT_GT(engine_->Stats().prefix_cache_hits, 0) << "the followers recomputed the shared prompt";
  StopAll();
}

TEST_F(DataParallelEngineTest, CancelEndsARequestAndFreesItsBlocks) {
  Start();
  auto c = std::make_shared<Collected>();
  std::promise<void> first;
  std::atomic<bool> seen{false};
  uint64_t id = engine_->Submit(Request(3, 8, 3000), [&, c, inner = Collect(c)](const RequestOutput& out) {
                           if (!seen.exchange(true)) first.set_value();
                           return inner(out);
                         }).value();
  ASSERT_EQ(first.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  engine_->Cancel(id);
  ASSERT_TRUE(Wait(*c));
  EXPECT_EQ(c->reason, FinishReason::kAbort);
  EXPECT_LT(c->tokens.size(), 3000u);
  bool idle = false;
  for (int i = 0; i < 2000 && !idle; ++i) {
    EngineStats s = engine_->Stats();
    idle = s.num_running == 0 && s.num_waiting == 0 && s.num_used_kv_blocks == 0;
    if (!idle) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(idle);
  StopAll();
  EXPECT_TRUE(follower_status_[1].ok());
}

TEST_F(DataParallelEngineTest, AFailedExchangeAbortsEverythingAndRefusesMore) {
  Start();
  auto c = std::make_shared<Collected>();
  std::promise<void> first;
  std::atomic<bool> seen{false};
  ASSERT_TRUE(engine_->Submit(Request(3, 8, 3000), [&, c, inner = Collect(c)](const RequestOutput& out) {
                       if (!seen.exchange(true)) first.set_value();
                       return inner(out);
                     }).ok());
  ASSERT_EQ(first.get_future().wait_for(std::chrono::seconds(30)), std::future_status::ready);
  exchange_.Break();
  ASSERT_TRUE(Wait(*c));
  EXPECT_EQ(c->reason, FinishReason::kAbort);
  for (int i = 0; i < 1000 && engine_->status().ok(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_FALSE(engine_->status().ok());
  Result<uint64_t> refused = engine_->Submit(Request(1, 4, 4), [](const RequestOutput&) { return true; });
  EXPECT_EQ(refused.status().code(), StatusCode::kCancelled);
  engine_->Shutdown();
  exchange_.Leave(0);
  for (std::thread& t : follower_threads_) t.join();
  follower_threads_.clear();
  EXPECT_FALSE(follower_status_[1].ok());
  EXPECT_EQ(failures_.size(), 1u);
}

TEST_F(DataParallelEngineTest, TooLongPromptsAreRefusedAtSubmit) {
  EngineOptions o;
  o.max_model_len = 64;
  Start(o);
  Result<uint64_t> r = engine_->Submit(Request(1, 64, 4), [](const RequestOutput&) { return true; });
  EXPECT_EQ(r.status().code(), StatusCode::kOutOfRange);
  StopAll();
}

}  // namespace
}  // namespace corolla
