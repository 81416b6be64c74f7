// AsyncEngine: the Engine on a step thread of its own, for servers. Any thread may Submit a
// request with a callback, Cancel it, read Stats, or Shut the loop down; the step thread drains
// submissions and cancellations at step boundaries, runs Engine::Step, and hands each request
// its new tokens as they are produced. Every accepted request gets exactly one final output
// (finish_reason != kNone: stop, length, or abort after Cancel/Shutdown) unless its callback
// ended it first by returning false, so none is lost.
// Callbacks run on the step thread, one request's in order; they must be quick and must not
// call back into Submit/Shutdown (Cancel is fine).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
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
  int64_t num_steps = 0;
  double kv_usage() const { return num_kv_blocks ? static_cast<double>(num_used_kv_blocks) / num_kv_blocks : 0.0; }
};

class AsyncEngine {
 public:
  AsyncEngine(std::unique_ptr<Engine> engine, AsyncEngineOptions options);
  ~AsyncEngine();  // Shutdown with no drain time
  AsyncEngine(const AsyncEngine&) = delete;
  AsyncEngine& operator=(const AsyncEngine&) = delete;

  // Validates and queues a request; returns its id. Errors: the request's own (InvalidArgument,
  // OutOfRange), ResourceExhausted when the waiting queue is full, Cancelled after Shutdown.
  Result<uint64_t> Submit(GenerationRequest request, OutputCallback callback);
  // Ends a request at the next step boundary, freeing its blocks; its callback gets a final
  // kAbort output. Unknown or finished ids are ignored.
  void Cancel(uint64_t request_id);
  // Stops accepting, lets in-flight requests run for up to `drain`, aborts the rest, and joins
  // the step thread. Idempotent.
  void Shutdown(std::chrono::milliseconds drain = std::chrono::milliseconds(0));

  EngineStats Stats() const;
  int max_model_len() const { return max_model_len_; }

 private:
  struct Submission {
    uint64_t id;
    GenerationRequest request;
    OutputCallback callback;
  };
  struct Active {
    int64_t seq_id;
    OutputCallback callback;
    int num_prompt_tokens;
  };
  void Loop();
  void AbortAll();
  void PublishStats(int num_incoming);

  std::unique_ptr<Engine> engine_;  // touched by the step thread only (Validate: any thread)
  const AsyncEngineOptions options_;
  const int max_model_len_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Submission> incoming_;  // guarded by mu_
  std::vector<uint64_t> cancels_;     // guarded by mu_
  bool stopping_ = false;             // guarded by mu_
  std::chrono::steady_clock::time_point drain_deadline_;  // guarded by mu_
  EngineStats stats_;                 // guarded by mu_
  uint64_t next_id_ = 1;              // guarded by mu_

  // Step thread only.
  std::unordered_map<uint64_t, Active> active_;
  std::unordered_map<int64_t, uint64_t> request_of_seq_;

  std::thread thread_;
};

}  // namespace corolla
