// AsyncEngine: the Engine on a step thread of its own, for servers. Any thread may Submit a
// request with a callback, Cancel it, read Stats, or Shut the loop down; the step thread drains
// submissions and cancellations at step boundaries, runs Engine::Step, and hands each request
// its new tokens as they are produced. Every accepted request gets exactly one final output
// (finish_reason != kNone: stop, length, or abort after Cancel/Shutdown) unless its callback
// ended it first by returning false, so none is lost.
// With async scheduling (EngineOptions) the step thread takes step N's tokens while the device
// runs step N+1, so outputs trail the device by one step and cost it no idle time.
// Callbacks run on an output thread of their own, one at a time and each request's in order,
// so what they do (detokenizing, formatting, writing to sockets) overlaps the next step instead
// of delaying it. They must not call back into Submit/Shutdown (Cancel is fine). A callback that
// returns false is called no more; the step thread drops its request at the next boundary.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "engine/engine.h"

namespace corolla {

struct AsyncEngineOptions {
  int max_waiting = 1024;  // queued requests (not yet running) beyond which Submit refuses
};

// New tokens of one request since its previous output (one per step in practice).
struct RequestOutput {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;                         // per token, when asked for
  std::vector<std::vector<TokenLogprob>> top_logprobs;  // per token, when asked for the top k
  FinishReason finish_reason = FinishReason::kNone;    // set on the last output only
  int num_prompt_tokens = 0;
  int num_cached_prompt_tokens = 0;  // served by the prefix cache
};
// Returns false to end the request at once (e.g. a stop string matched): the engine aborts it
// and calls it no more.
using OutputCallback = std::function<bool(const RequestOutput&)>;

struct EngineStats {
  int num_running = 0;
  int num_waiting = 0;  // including submissions the step thread has not picked up yet
  int num_kv_blocks = 0;
  int num_used_kv_blocks = 0;
  int block_size = 0;
  int64_t prefix_cache_queries = 0;  // tokens
  int64_t prefix_cache_hits = 0;     // tokens
  int64_t num_preemptions = 0;
  int64_t num_steps = 0;  // batches launched
  // This process's engine's steps (data parallel: this rank's; the ranks step in lockstep).
  StepMetrics steps;
  double kv_usage() const { return num_kv_blocks ? static_cast<double>(num_used_kv_blocks) / num_kv_blocks : 0.0; }
};

// What a server drives: requests in, outputs to callbacks, with the contract above. AsyncEngine
// is the one-process implementation; DataParallelEngine (engine/dp_engine.h) spreads requests
// over the engines of data-parallel ranks. Thread-safe.
class ServingEngine {
 public:
  virtual ~ServingEngine() = default;

  // Validates and queues a request; returns its id. Errors: the request's own (InvalidArgument,
  // OutOfRange), ResourceExhausted when the waiting queue is full, Cancelled after Shutdown.
  Result<uint64_t> Submit(GenerationRequest request, OutputCallback callback);
  // Queues requests that share one prompt (the n choices of one API request), all or none;
  // returns their ids in order. The first computes the prompt; the others join the batch once
  // it has, so their prompt comes from the prefix cache and is computed once (without prefix
  // caching they all start at once). Each ends with its own final output; Cancel each id.
  virtual Result<std::vector<uint64_t>> SubmitAll(std::vector<GenerationRequest> requests,
                                                  std::vector<OutputCallback> callbacks) = 0;
  // Ends a request at the next step boundary, freeing its blocks; its callback gets a final
  // kAbort output. Unknown or finished ids are ignored.
  virtual void Cancel(uint64_t request_id) = 0;
  // Stops accepting, lets in-flight requests run for up to `drain`, aborts the rest, and joins
  // the step thread. Idempotent.
  virtual void Shutdown(std::chrono::milliseconds drain = std::chrono::milliseconds(0)) = 0;

  virtual EngineStats Stats() const = 0;
  virtual int max_model_len() const = 0;
};

// The output thread of a serving engine: callbacks run there, in order, off the step thread.
// A callback that returns false on a non-final output (its client went away) ends its request:
// the dispatcher drops its later outputs and calls on_ended(request_id) (on the output thread)
// so that the step thread can abort it; once the step thread has dropped it, Forget lets the
// dispatcher forget it too.
class OutputDispatcher {
 public:
  explicit OutputDispatcher(std::function<void(uint64_t)> on_ended);
  ~OutputDispatcher();  // Close()
  OutputDispatcher(const OutputDispatcher&) = delete;
  OutputDispatcher& operator=(const OutputDispatcher&) = delete;

  void Deliver(uint64_t request_id, std::shared_ptr<OutputCallback> callback, RequestOutput output);
  void Forget(uint64_t request_id) { Deliver(request_id, nullptr, {}); }
  // Delivers everything queued, then joins the thread. Idempotent.
  void Close();

 private:
  struct Delivery {
    uint64_t request_id;
    std::shared_ptr<OutputCallback> callback;  // null: forget the request
    RequestOutput output;
  };
  void Loop();

  const std::function<void(uint64_t)> on_ended_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Delivery> deliveries_;     // guarded by mu_
  bool closed_ = false;                 // guarded by mu_
  std::unordered_set<uint64_t> ended_;  // output thread only: callbacks that returned false
  std::thread thread_;
};

// What AsyncEngine and DataParallelEngine share: a step thread that other threads reach through
// mu_ / cv_ (cancels, requests whose callback ended them, the stop and its drain deadline), the
// stats it publishes, and the output thread. A subclass starts the step thread last in its
// constructor (StartStepThread) and calls Shutdown first in its destructor, while the members
// the step thread uses still exist.
class StepThreadEngine : public ServingEngine {
 public:
  ~StepThreadEngine() override { Shutdown(); }
  void Cancel(uint64_t request_id) override;
  // Stops accepting, lets the step thread run in-flight requests for up to `drain` (it aborts
  // the rest), joins it, then delivers the outputs left. Idempotent.
  void Shutdown(std::chrono::milliseconds drain = std::chrono::milliseconds(0)) override;
  EngineStats Stats() const override;

 protected:
  StepThreadEngine();
  void StartStepThread(std::function<void()> loop) { thread_ = std::thread(std::move(loop)); }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<uint64_t> cancels_;            // guarded by mu_
  std::vector<uint64_t> ended_by_callback_;  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
  std::chrono::steady_clock::time_point drain_deadline_;  // guarded by mu_
  EngineStats stats_;                        // guarded by mu_
  uint64_t next_id_ = 1;                     // guarded by mu_
  OutputDispatcher outputs_;                 // after the members its callback uses

 private:
  std::thread thread_;
};

class AsyncEngine final : public StepThreadEngine {
 public:
  AsyncEngine(std::unique_ptr<Engine> engine, AsyncEngineOptions options);
  ~AsyncEngine() override;  // Shutdown with no drain time
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  Result<std::vector<uint64_t>> SubmitAll(std::vector<GenerationRequest> requests,
                                          std::vector<OutputCallback> callbacks) override;
  int max_model_len() const override { return max_model_len_; }

 private:
  struct Submission {
    uint64_t id;
    GenerationRequest request;
    OutputCallback callback;
    uint64_t leader = 0;  // nonzero: joins once this request's prompt is computed
  };
  struct Active {
    int64_t seq_id;  // -1 while parked behind its leader
    std::shared_ptr<OutputCallback> callback;
    int num_prompt_tokens;
  };
  struct Parked {
    uint64_t id;
    GenerationRequest request;
  };
  void Loop();
  // Ends a request with a final kAbort output, wherever it is.
  void AbortRequest(uint64_t request_id);
  void AbortAll();
  void AddToEngine(uint64_t id, GenerationRequest request);
  // Lets the requests parked behind `leader` into the engine.
  void Unpark(uint64_t leader);
  void PublishStats(int num_incoming);

  std::unique_ptr<Engine> engine_;  // touched by the step thread only (Validate: any thread)
  bool warming_ = true;  // step thread: Engine::WarmDecodeGraph has graphs left to capture
  int warm_graphs_ = 0;  // step thread: graphs it captured, and the seconds that took
  double warm_seconds_ = 0;
  const AsyncEngineOptions options_;
  const int max_model_len_;

  std::vector<Submission> incoming_;  // guarded by mu_

  // Step thread only.
  std::unordered_map<uint64_t, Active> active_;
  std::unordered_map<int64_t, uint64_t> request_of_seq_;
  std::unordered_map<uint64_t, std::vector<Parked>> parked_;  // by leader
  int num_parked_ = 0;

};

}  // namespace corolla
