// Engine: requests in, tokens out. Continuous batching over a paged KV cache: each Step runs
// one flat batch in which running sequences decode first and prefill chunks fill the rest of
// the token budget; when blocks run out, the newest running sequence is preempted and later
// recomputed. With async scheduling a Step launches its batch, then takes the previous batch's
// tokens from the host side while the device runs the new one (the new batch reads those tokens
// on the device); see Step. Not thread-safe: one thread (the step loop) owns an Engine.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "base/histogram.h"
#include "engine/block_pool.h"
#include "engine/kv_cache.h"
#include "engine/model_runner.h"
#include "engine/sequence.h"
#include "engine/state_snapshots.h"

namespace corolla {

struct EngineOptions {
  int block_size = 16;
  int num_kv_blocks = 0;          // 0: derive from kv_cache_bytes
  int64_t kv_cache_bytes = 256 << 20;
  int max_num_seqs = 64;
  int max_batch_tokens = 2048;    // tokens per step (decode tokens + prefill chunks)
  int max_model_len = 0;          // 0: the model's max_position_embeddings
  bool enable_prefix_caching = true;
  // Hybrid models: linear-attention states kept at block boundaries for prefix-cache hits
  // (-1: two per sequence slot; 0 turns prefix caching off for them).
  int num_state_snapshots = -1;
  // Hybrid models: storage of the linear-attention recurrent state, f32 or bf16 (half the memory
  // and traffic; its accuracy cost is in BENCHMARKS.md). The math stays f32.
  DType linear_state_dtype = DType::kF32;
  // Launch step N+1 before taking step N's tokens on the host (overlapping the host's work with
  // the device's). Steps stay synchronous while a request with penalties or logprobs is in the
  // engine (they sample on the host from every earlier token). On the CPU backend, whose launch
  // runs the forward, it buys nothing and outputs trail by a step (`corolla serve` turns it off
  // there unless asked); it stays on by default so that every test exercises it.
  bool async_scheduling = true;
  // Decode graphs (ModelRunner): kAuto on CUDA; tests may ask kBucketsEager.
  DecodeGraphMode decode_graphs = DecodeGraphMode::kAuto;
  // Whether WarmDecodeGraph captures decode graphs ahead of use (the serving loop calls it while
  // idle); off, each is captured by the first step that needs it.
  bool warm_decode_graphs = true;
  // DP-EP serving: every forward is collective over the ranks (ModelRunner's `collective`):
  // decode graphs only from CaptureDecodeGraphs, steps as SetCollectiveStep says.
  bool collective_forwards = false;
};

// What one step computed and how long it took, as the host saw it (Engine::set_record_steps).
struct StepRecord {
  int decode_rows = 0;     // sequences that computed one generated token
  int prefill_tokens = 0;  // prompt tokens (and a preempted sequence's recomputed ones)
  bool graph = false;      // the forward replayed a decode graph
  // From the later of its launch and the previous step's tokens reaching the host, to its own:
  // the device's time for the step while the host keeps up, as with async scheduling.
  double seconds = 0;
};

// Every step since the engine began, cumulative (what /metrics reports).
struct StepMetrics {
  StepMetrics();
  // StepRecord::seconds of the steps without / with prompt tokens.
  Histogram decode_seconds, mixed_seconds;
  Histogram tokens;  // tokens a step computed (decode rows + prompt tokens)
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;  // usually the model's eos ids
  bool ignore_eos = false;
  PenaltyParams penalties;
  int num_logprobs = -1;  // <0: no logprobs; 0: the sampled token's; k > 0: also the top k
};

// What one step produced for one sequence.
struct StepOutput {
  int64_t seq_id = 0;
  int32_t token = -1;  // the new token
  FinishReason finish_reason = FinishReason::kNone;
  float logprob = 0.0f;                    // when the request asked for logprobs
  std::vector<TokenLogprob> top_logprobs;  // when it asked for the top k
};

class Engine {
 public:
  static Result<std::unique_ptr<Engine>> Create(Model& model, Backend& backend, EngineOptions options);
  ~Engine();  // waits for a step still in flight

  // Checks a request against the model and limits without queueing it. Reads only immutable
  // state, so any thread may call it while the step thread runs.
  Status Validate(const GenerationRequest& request) const;
  // Validates and queues a request; returns its sequence id.
  Result<int64_t> AddRequest(GenerationRequest request);
  // Removes a request wherever it is and frees its blocks (a step in flight that computes it is
  // ordered before any later use of them on the device); its pending token is dropped.
  void Abort(int64_t seq_id);
  // False once every request has ended, though a launched step may still compute their last
  // (dropped) tokens: the next Step or the destructor takes it.
  bool HasUnfinished() const { return !waiting_.empty() || !running_.empty(); }
  // Schedules and launches one batch and returns the tokens that the host has taken since the
  // last Step: synchronously, this batch's; with async scheduling, the previous batch's (taken
  // while this one runs), and a Step with nothing new to launch takes the last batch's. A
  // sequence that ends at batch N has been scheduled into N+1 already: that step's token for
  // it is dropped, never output. Sequences stopped by length are not scheduled again.
  std::vector<StepOutput> Step();

  // While no request is in the engine: takes a step still in flight (whose tokens belong to
  // ended sequences), then captures one decode graph ahead of use (ModelRunner::WarmDecodeGraph).
  // Returns false once there is nothing left to capture (graphs off or collective, every graph
  // of the warm-up order captured, warm_decode_graphs off); with a request in the engine it
  // captures nothing and returns true. The serving loop calls it while idle.
  bool WarmDecodeGraph();

  // Runs requests to completion together; returns each one's generated ids and finish reason.
  Result<std::vector<std::pair<std::vector<int32_t>, FinishReason>>> Generate(
      std::vector<GenerationRequest> requests);

  const EngineOptions& options() const { return options_; }
  int max_model_len() const { return max_model_len_; }
  int num_kv_blocks() const { return pool_.num_blocks(); }
  int num_free_blocks() const { return pool_.num_free(); }
  int num_used_blocks() const { return pool_.num_used(); }
  int num_waiting() const { return static_cast<int>(waiting_.size()); }
  int num_running() const { return static_cast<int>(running_.size()); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Prefix cache counters, in prompt tokens looked up at admission and tokens found cached.
  int64_t prefix_cache_queries() const { return prefix_cache_queries_; }
  int64_t prefix_cache_hits() const { return prefix_cache_hits_; }
  // Forgets finished sequences that Generate would collect (the async loop does not need them).
  void DiscardFinished() { finished_.clear(); }
  int64_t num_steps() const { return num_steps_; }              // batches launched
  int64_t num_async_steps() const { return num_async_steps_; }  // launched before the last was taken
  const Sequence* Find(int64_t seq_id) const;
  // Records every later step (StepRecord) until turned off; TakeStepRecords hands them over.
  void set_record_steps(bool on) { record_steps_ = on; }
  std::vector<StepRecord> TakeStepRecords() { return std::exchange(step_records_, {}); }
  const StepMetrics& step_metrics() const { return step_metrics_; }

  // --- DP-EP (collective_forwards) ---
  // Start-up, on every rank with the same max_context (the ranks' agreed max model length):
  // ModelRunner::CaptureDecodeGraphs. Returns the forwards it ran.
  int CaptureDecodeGraphs(int max_context) { return runner_.CaptureDecodeGraphs(max_context); }
  // What every rank agreed for the next Step. fixed: its forward takes the fixed-capacity
  // exchange (decode graphs may replay) and it schedules at most max_tokens tokens; else an
  // eager forward through the sized exchange, with the usual budget.
  void SetCollectiveStep(bool fixed, int max_tokens) {
    runner_.SetFixedCapacityStep(fixed);
    step_token_limit_ = fixed ? max_tokens : 0;
  }
  // An estimate from above of the tokens the next Step schedules: the running sequences'
  // uncomputed tokens and the waiting ones' lengths, at most max_batch_tokens. (A sequence
  // preempted and readmitted within one Step can exceed it; SetCollectiveStep's limit holds.)
  int EstimateNextStepTokens() const;

 private:
  // One batch: scheduled, then launched, then in flight until Finish takes its tokens.
  struct Batch {
    std::vector<ScheduledChunk> chunks;
    std::vector<std::shared_ptr<Sequence>> seqs;  // the chunks' sequences, alive even if aborted
    std::vector<int> ends;            // each chunk's end (tokens computed after it)
    std::vector<int> snapshot_slots;  // hybrid prefix caching: states captured at a chunk's end
    LaunchedStep launched;
    std::chrono::steady_clock::time_point launch_time;
  };

  Engine(Model& model, Backend& backend, EngineOptions options, int num_blocks, int max_model_len);

  static int NumSnapshots(const EngineOptions& options);
  static bool SamplesOnHost(const Sequence& s) { return s.penalties.enabled() || s.num_logprobs >= 0; }
  // A sequence whose tokens in flight already reach max_tokens or the context limit.
  bool ReachesLengthLimit(const Sequence& s) const;
  // Tokens of `s` to compute this step within `budget`.
  int ChunkSize(const Sequence& s, int budget) const;
  int BlocksNeeded(const Sequence& s, int num_new_tokens) const;
  bool Reserve(Sequence& s, int num_new_tokens);  // allocates blocks if possible
  void Preempt(Sequence& s);
  void Release(Sequence& s);
  // The next batch: its chunks and their sequences.
  Batch Schedule();
  // Launches a scheduled batch: advances num_computed_tokens, counts its pending tokens.
  void Launch(Batch& batch);
  // Takes a launched batch's tokens: appends them, checks stops, moves finished sequences out.
  std::vector<StepOutput> Finish(Batch& batch);
  // Counts the step of a batch whose tokens just reached the host in step_metrics_, and keeps
  // its StepRecord while record_steps_.
  void RecordStep(const Batch& batch);
  void CheckStop(Sequence& s);
  // Prefix cache: shares the cached blocks of s's leading full blocks (leaving at least one
  // token to compute); returns the number of tokens they hold.
  int MatchPrefix(Sequence& s);
  // Registers s's newly computed full blocks in the prefix cache.
  void CommitFullBlocks(Sequence& s);
  uint64_t BlockHashOf(Sequence& s, int block_idx);

  Model& model_;
  Backend& backend_;
  EngineOptions options_;
  int max_model_len_;
  KvCache kv_cache_;
  BlockPool pool_;
  std::unique_ptr<StateSnapshots> snapshots_;  // hybrid models with prefix caching
  ModelRunner runner_;
  int64_t next_id_ = 0;
  int64_t num_preemptions_ = 0;
  int64_t prefix_cache_queries_ = 0;
  int64_t prefix_cache_hits_ = 0;
  int64_t num_steps_ = 0;
  int64_t num_async_steps_ = 0;
  int num_host_sampling_ = 0;  // unfinished sequences with penalties or logprobs
  int step_token_limit_ = 0;   // > 0: SetCollectiveStep's limit on a step's tokens
  // Shared with in_flight_, which keeps a sequence alive until its last step is taken.
  std::deque<std::shared_ptr<Sequence>> waiting_;
  std::vector<std::shared_ptr<Sequence>> running_;   // admission order
  std::vector<std::shared_ptr<Sequence>> finished_;  // until collected by Generate
  std::optional<Batch> in_flight_;
  bool record_steps_ = false;
  std::vector<StepRecord> step_records_;
  StepMetrics step_metrics_;
  std::chrono::steady_clock::time_point last_finish_time_;
};

}  // namespace corolla
