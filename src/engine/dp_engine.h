// Data-parallel serving (`corolla serve --dp D`): one server over D ranks, each with its own
// Engine (sequences, KV cache) and, under DP-EP, a share of the experts, so that every forward
// is collective. The ranks run rounds in lockstep. Each round, one all-gather (host blobs over
// the TcpStore) carries rank 0's control (new requests and the rank each is assigned to,
// cancellations, stop) to every rank and every rank's report (its outputs of the last step,
// requests it rejected, its load) back; then every rank steps its engine once, or runs an empty
// forward when it has nothing to do while another rank has. When no rank has work, rank 0 holds
// the next round back until something arrives (or 100 ms pass: an idle round, no forwards) and
// the others wait inside the all-gather.
//   DpRankEngine: one rank's side of a round (every rank, rank 0 included). One thread.
//   DataParallelEngine: rank 0's ServingEngine, what the server drives; its step thread runs the
//     rounds, its output thread the callbacks (as AsyncEngine's). Thread-safe.
//   RunDpFollower: the rounds of ranks 1..D-1, on their main thread, until rank 0 says stop.
#pragma once

#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/async_engine.h"
#include "engine/engine.h"

namespace corolla {

// A Model that forwards to another and counts its forwards, so that a caller can tell whether
// an engine step ran one.
class CountingModel final : public Model {
 public:
  explicit CountingModel(Model& inner) : inner_(inner) {}
  const ModelConfig& config() const override { return inner_.config(); }
  KvCacheSpec kv_cache_spec() const override { return inner_.kv_cache_spec(); }
  StateSpec state_spec() const override { return inner_.state_spec(); }
  void Forward(const ForwardBatch& batch, std::span<const KvCacheView> kv_caches, const TensorView& logits) override {
    ++num_forwards_;
    inner_.Forward(batch, kv_caches, logits);
  }
  int64_t num_forwards() const { return num_forwards_; }

 private:
  Model& inner_;
  int64_t num_forwards_ = 0;
};

// One forward of no tokens on `device`: under DP-EP it joins every MoE layer's exchanges
// (through the fixed-capacity exchange when `ep_fixed_capacity`, as the other ranks' forwards).
void RunEmptyForward(Model& model, Device device, bool ep_fixed_capacity = false);

// Every DP rank's blob, indexed by DP rank; collective over the DP ranks.
using DpAllGather = std::function<Result<std::vector<std::string>>(const std::string& blob)>;

// Rank 0's orders for one round.
struct DpControl {
  struct Assignment {
    uint64_t request_id = 0;
    int rank = 0;
    uint64_t leader = 0;  // nonzero: one of n choices; waits until the leader's prompt is computed
    GenerationRequest request;
  };
  std::vector<Assignment> assignments;
  std::vector<std::pair<uint64_t, int>> cancels;  // request id, rank
  bool stop = false;                              // the last round: every rank returns
};

// One rank's report of a round: what happened since its previous report.
struct DpReport {
  bool busy = false;  // unfinished requests after its last step
  int next_step_tokens = 0;  // an estimate from above of its next step's tokens (Engine::EstimateNextStepTokens)
  EngineStats stats;
  std::vector<std::pair<uint64_t, RequestOutput>> outputs;  // by request id, in step order
  std::vector<std::pair<uint64_t, std::string>> rejected;   // request id, the engine's error
};

struct DpRound {
  DpControl control;
  std::vector<DpReport> reports;  // by DP rank
  bool stepped = false;           // the ranks ran a step (some rank had work)
  bool fixed_capacity = false;    // ... through the fixed-capacity exchange (see DpRankEngine)
};

class DpRankEngine {
 public:
  // An engine over `model` (kept by the caller, like `backend`). `collective`: every forward is
  // collective (DP-EP), so a rank without work runs an empty one when another rank steps.
  // `fixed_capacity` > 0 (collective, a model with both exchanges: ModelShard::ep_capacity and
  // ep_sized_fallback; at least DecodeGraphs::kMaxCollectiveBatch): a round in which no request
  // arrives and every rank's report estimates at most that many tokens steps through the
  // fixed-capacity exchange, each engine limited to that many tokens, and pure decode steps may
  // replay the graphs CaptureDecodeGraphs made; other rounds step eagerly through the sized
  // exchange. Every rank decides alike from the same blobs, so the ranks' forwards of a round
  // always take the same exchange.
  static Result<std::unique_ptr<DpRankEngine>> Create(Model& model, Backend& backend, const EngineOptions& options,
                                                      int dp_rank, bool collective, int fixed_capacity = 0);

  // Collective start-up, before the first round, on every rank with the same max_context (the
  // agreed max model length): Engine::CaptureDecodeGraphs. Returns the forwards it ran.
  int CaptureDecodeGraphs(int max_context) { return engine_->CaptureDecodeGraphs(max_context); }
  // Rounds in which this rank stepped (or ran an empty forward), and those of them through the
  // fixed-capacity exchange.
  int64_t num_rounds_stepped() const { return num_rounds_stepped_; }
  int64_t num_fixed_rounds() const { return num_fixed_rounds_; }

  int dp_rank() const { return dp_rank_; }
  // Any thread may call Validate / max_model_len on it (Engine::Validate reads immutable state).
  const Engine& engine() const { return *engine_; }

  // This rank's blob of the next round: `control` (rank 0; others pass null) and its report,
  // which takes the outputs and rejections gathered since the last blob.
  std::string MakeBlob(const DpControl* control);
  // One round from every rank's blob (indexed by DP rank): applies rank 0's control to this
  // rank (its cancellations, then its new requests), then, when any rank has work, steps this
  // rank's engine once (or runs an empty forward). Returns what the blobs said. Errors: a blob
  // that does not parse (the ranks would fall out of step: the caller must stop).
  Result<DpRound> RunRound(const std::vector<std::string>& blobs);

 private:
  struct Parked {
    uint64_t id;
    GenerationRequest request;
  };
  struct Active {
    int64_t seq_id;
    int num_prompt_tokens;
  };
  DpRankEngine(Model& model, Backend& backend, int dp_rank, bool collective, int fixed_capacity)
      : counting_(model), backend_(backend), dp_rank_(dp_rank), collective_(collective),
        fixed_capacity_(collective ? fixed_capacity : 0) {}
  void Add(DpControl::Assignment assignment);
  void AddToEngine(uint64_t id, GenerationRequest request);
  void Cancel(uint64_t id);
  void Unpark(uint64_t leader);  // lets the requests parked behind `leader` into the engine
  void Step(bool fixed_capacity);

  CountingModel counting_;
  Backend& backend_;
  const int dp_rank_;
  const bool collective_;
  const int fixed_capacity_;
  std::unique_ptr<Engine> engine_;
  std::unordered_map<uint64_t, Active> active_;  // in the engine, by request id
  std::unordered_map<int64_t, uint64_t> request_of_seq_;
  std::unordered_map<uint64_t, std::vector<Parked>> parked_;  // by leader
  int num_parked_ = 0;
  DpReport pending_;  // outputs and rejections for the next blob
  int64_t num_rounds_stepped_ = 0, num_fixed_rounds_ = 0;
};

// Rank 0's side: the server submits here; requests go to the least loaded rank (fewest running
// + waiting sequences, ties to the lowest rank; the n choices of one request to the same rank,
// for its prefix cache) and come back as outputs with AsyncEngine's contract.
class DataParallelEngine final : public StepThreadEngine {
 public:
  // `local`: rank 0's engine. `all_gather`: the rounds' exchange with the followers (used by the
  // step thread only). `max_model_len`: the smallest of the ranks' (a request must fit on any).
  // `on_failure` (may be empty): called on the step thread when a round fails (a rank died): every
  // request is aborted, new ones are refused, and status() tells why.
  DataParallelEngine(std::unique_ptr<DpRankEngine> local, DpAllGather all_gather, int num_ranks, int max_model_len,
                     AsyncEngineOptions options, std::function<void(const Status&)> on_failure = {});
  ~DataParallelEngine() override;  // Shutdown with no drain time
  DataParallelEngine(const DataParallelEngine&) = delete;
  DataParallelEngine& operator=(const DataParallelEngine&) = delete;

  Result<std::vector<uint64_t>> SubmitAll(std::vector<GenerationRequest> requests,
                                          std::vector<OutputCallback> callbacks) override;
  // (Shutdown also ends the followers: the step thread's last round tells every rank to stop.)
  int max_model_len() const override { return max_model_len_; }
  Status status() const;

 private:
  struct Submission {
    std::vector<uint64_t> ids;
    std::vector<GenerationRequest> requests;
    std::vector<OutputCallback> callbacks;
  };
  struct Active {
    int rank;
    std::shared_ptr<OutputCallback> callback;
    int num_prompt_tokens;
  };
  void Loop();
  // Ends a request with a final kAbort output; `control` (if given) cancels it on its rank.
  void AbortRequest(uint64_t request_id, DpControl* control);
  void Fail(const Status& status);
  void PublishStats(const DpRound& round);

  std::unique_ptr<DpRankEngine> local_;
  const DpAllGather all_gather_;
  const int num_ranks_;
  const int max_model_len_;
  const AsyncEngineOptions options_;
  const std::function<void(const Status&)> on_failure_;

  std::vector<Submission> incoming_;          // guarded by mu_
  int num_incoming_ = 0;                      // requests in incoming_; guarded by mu_
  Status status_;                             // guarded by mu_

  // Step thread only.
  std::unordered_map<uint64_t, Active> active_;
  std::vector<int> load_;  // per rank: running + waiting at its last report, + assigned since
  std::vector<int64_t> num_assigned_;  // per rank: requests it was given

};

// Ranks 1..D-1: runs rounds with `rank`'s engine until rank 0's control says stop. Errors: the
// exchange failed (rank 0 is gone) or a blob did not parse.
Status RunDpFollower(DpRankEngine& rank, const DpAllGather& all_gather);

}  // namespace corolla
