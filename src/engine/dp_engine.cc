#include "engine/dp_engine.h"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "base/logging.h"

namespace corolla {
namespace {

// While no rank has work, rounds (without forwards) run this often unless something arrives:
// they keep the followers' all-gather from waiting forever and find a dead rank.
constexpr auto kIdlePoll = std::chrono::milliseconds(100);

// --- blobs ---------------------------------------------------------------------------------
// A round's blob: [u8 has control][control][report], little-endian host values (the ranks are
// one binary on one kind of host). Counts are u32, strings and id lists length-prefixed.

class BlobWriter {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    out_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void PutIds(const std::vector<int32_t>& ids) {
    Put<uint32_t>(static_cast<uint32_t>(ids.size()));
    out_.append(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t));
  }
  void PutString(const std::string& s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Reads what BlobWriter wrote; past the end it yields zeros and remembers the overrun.
class BlobReader {
 public:
  explicit BlobReader(const std::string& s) : s_(s) {}
  template <typename T>
  T Get() {
    T v{};
    if (pos_ + sizeof(T) > s_.size()) {
      ok_ = false;
      return v;
    }
    std::memcpy(&v, s_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  // A count of items of at least `item_bytes` each that the rest of the blob can hold.
  uint32_t GetCount(size_t item_bytes) {
    uint32_t n = Get<uint32_t>();
    if (static_cast<uint64_t>(n) * item_bytes > s_.size() - std::min(pos_, s_.size())) {
      ok_ = false;
      return 0;
    }
    return n;
  }
  std::vector<int32_t> GetIds() {
    uint32_t n = GetCount(sizeof(int32_t));
    std::vector<int32_t> ids(n);
    if (n > 0) std::memcpy(ids.data(), s_.data() + pos_, n * sizeof(int32_t));
    pos_ += n * sizeof(int32_t);
    return ids;
  }
  std::string GetString() {
    uint32_t n = GetCount(1);
    std::string s = s_.substr(std::min(pos_, s_.size()), n);
    pos_ += n;
    return s;
  }
  bool done() const { return ok_ && pos_ == s_.size(); }

 private:
  const std::string& s_;
  size_t pos_ = 0;
  bool ok_ = true;
};

void PutRequest(BlobWriter& w, const GenerationRequest& r) {
  w.PutIds(r.prompt);
  w.Put<float>(r.sampling.temperature);
  w.Put<int32_t>(r.sampling.top_k);
  w.Put<float>(r.sampling.top_p);
  w.Put<float>(r.sampling.min_p);
  w.Put<uint64_t>(r.sampling.seed);
  w.Put<int32_t>(r.max_tokens);
  w.PutIds(r.stop_token_ids);
  w.Put<uint8_t>(r.ignore_eos);
  w.Put<float>(r.penalties.presence);
  w.Put<float>(r.penalties.frequency);
  w.Put<float>(r.penalties.repetition);
  w.Put<int32_t>(r.num_logprobs);
}

GenerationRequest GetRequest(BlobReader& r) {
  GenerationRequest g;
  g.prompt = r.GetIds();
  g.sampling.temperature = r.Get<float>();
  g.sampling.top_k = r.Get<int32_t>();
  g.sampling.top_p = r.Get<float>();
  g.sampling.min_p = r.Get<float>();
  g.sampling.seed = r.Get<uint64_t>();
  g.max_tokens = r.Get<int32_t>();
  g.stop_token_ids = r.GetIds();
  g.ignore_eos = r.Get<uint8_t>() != 0;
  g.penalties.presence = r.Get<float>();
  g.penalties.frequency = r.Get<float>();
  g.penalties.repetition = r.Get<float>();
  g.num_logprobs = r.Get<int32_t>();
  return g;
}

void PutControl(BlobWriter& w, const DpControl& c) {
  w.Put<uint8_t>(c.stop);
  w.Put<uint32_t>(static_cast<uint32_t>(c.assignments.size()));
  for (const DpControl::Assignment& a : c.assignments) {
    w.Put<uint64_t>(a.request_id);
    w.Put<int32_t>(a.rank);
    w.Put<uint64_t>(a.leader);
    PutRequest(w, a.request);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(c.cancels.size()));
  for (const auto& [id, rank] : c.cancels) {
    w.Put<uint64_t>(id);
    w.Put<int32_t>(rank);
  }
}

DpControl GetControl(BlobReader& r) {
  DpControl c;
  c.stop = r.Get<uint8_t>() != 0;
  for (uint32_t i = 0, n = r.GetCount(20); i < n; ++i) {
    DpControl::Assignment a;
    a.request_id = r.Get<uint64_t>();
    a.rank = r.Get<int32_t>();
    a.leader = r.Get<uint64_t>();
    a.request = GetRequest(r);
    c.assignments.push_back(std::move(a));
  }
  for (uint32_t i = 0, n = r.GetCount(12); i < n; ++i) {
    uint64_t id = r.Get<uint64_t>();
    int rank = r.Get<int32_t>();
    c.cancels.emplace_back(id, rank);
  }
  return c;
}

void PutReport(BlobWriter& w, const DpReport& p) {
  w.Put<uint8_t>(p.busy);
  w.Put<int32_t>(p.next_step_tokens);
  const EngineStats& s = p.stats;
  for (int v : {s.num_running, s.num_waiting, s.num_kv_blocks, s.num_used_kv_blocks, s.block_size}) w.Put<int32_t>(v);
  for (int64_t v : {s.prefix_cache_queries, s.prefix_cache_hits, s.num_preemptions, s.num_steps}) w.Put<int64_t>(v);
  w.Put<uint32_t>(static_cast<uint32_t>(p.outputs.size()));
  for (const auto& [id, o] : p.outputs) {
    w.Put<uint64_t>(id);
    w.Put<int32_t>(static_cast<int32_t>(o.finish_reason));
    w.Put<int32_t>(o.num_prompt_tokens);
    w.Put<int32_t>(o.num_cached_prompt_tokens);
    w.Put<uint32_t>(static_cast<uint32_t>(o.tokens.size()));
    for (size_t i = 0; i < o.tokens.size(); ++i) {
      w.Put<int32_t>(o.tokens[i]);
      w.Put<float>(i < o.logprobs.size() ? o.logprobs[i] : 0.0f);
      const std::vector<TokenLogprob> none;
      const std::vector<TokenLogprob>& top = i < o.top_logprobs.size() ? o.top_logprobs[i] : none;
      w.Put<uint32_t>(static_cast<uint32_t>(top.size()));
      for (const TokenLogprob& t : top) {
        w.Put<int32_t>(t.token);
        w.Put<float>(t.logprob);
      }
    }
  }
  w.Put<uint32_t>(static_cast<uint32_t>(p.rejected.size()));
  for (const auto& [id, message] : p.rejected) {
    w.Put<uint64_t>(id);
    w.PutString(message);
  }
}

DpReport GetReport(BlobReader& r) {
  DpReport p;
  p.busy = r.Get<uint8_t>() != 0;
  p.next_step_tokens = r.Get<int32_t>();
  EngineStats& s = p.stats;
  for (int* v : {&s.num_running, &s.num_waiting, &s.num_kv_blocks, &s.num_used_kv_blocks, &s.block_size})
    *v = r.Get<int32_t>();
  for (int64_t* v : {&s.prefix_cache_queries, &s.prefix_cache_hits, &s.num_preemptions, &s.num_steps})
    *v = r.Get<int64_t>();
  for (uint32_t i = 0, n = r.GetCount(24); i < n; ++i) {
    uint64_t id = r.Get<uint64_t>();
    RequestOutput o;
    int32_t reason = r.Get<int32_t>();
    o.finish_reason = reason >= 0 && reason <= static_cast<int32_t>(FinishReason::kAbort) ? static_cast<FinishReason>(reason)
                                                                                         : FinishReason::kAbort;
    o.num_prompt_tokens = r.Get<int32_t>();
    o.num_cached_prompt_tokens = r.Get<int32_t>();
    for (uint32_t t = 0, num_tokens = r.GetCount(12); t < num_tokens; ++t) {
      o.tokens.push_back(r.Get<int32_t>());
      o.logprobs.push_back(r.Get<float>());
      std::vector<TokenLogprob>& top = o.top_logprobs.emplace_back();
      for (uint32_t k = 0, num_top = r.GetCount(8); k < num_top; ++k) {
        TokenLogprob t_lp;
        t_lp.token = r.Get<int32_t>();
        t_lp.logprob = r.Get<float>();
        top.push_back(t_lp);
      }
    }
    p.outputs.emplace_back(id, std::move(o));
  }
  for (uint32_t i = 0, n = r.GetCount(12); i < n; ++i) {
    uint64_t id = r.Get<uint64_t>();
    p.rejected.emplace_back(id, r.GetString());
  }
  return p;
}

}  // namespace

void RunEmptyForward(Model& model, Device device, bool ep_fixed_capacity) {
  const TensorView none(nullptr, DType::kI32, {0}, device);
  ForwardBatch batch;
  batch.ep_fixed_capacity = ep_fixed_capacity;
  batch.token_ids = none;
  batch.positions = none;
  batch.logits_rows = none;
  batch.attention.query_start = TensorView(nullptr, DType::kI32, {1}, device);
  batch.attention.seq_lens = none;
  batch.attention.slot_mapping = none;
  const TensorView logits(nullptr, DType::kF32, {0, model.config().vocab_size}, device);
  model.Forward(batch, {}, logits);
}

// --- DpRankEngine ----------------------------------------------------------------------------

Result<std::unique_ptr<DpRankEngine>> DpRankEngine::Create(Model& model, Backend& backend, const EngineOptions& options,
                                                           int dp_rank, bool collective, int fixed_capacity) {
  // Every decode graph bucket (up to kMaxCollectiveBatch rows) must fit the fixed exchange.
  COROLLA_CHECK(fixed_capacity == 0 || fixed_capacity >= DecodeGraphs::kMaxCollectiveBatch)
      << "fixed capacity " << fixed_capacity << " is below the decode graphs' largest batch "
      << DecodeGraphs::kMaxCollectiveBatch;
  std::unique_ptr<DpRankEngine> rank(new DpRankEngine(model, backend, dp_rank, collective, fixed_capacity));
  EngineOptions o = options;
  o.collective_forwards = o.collective_forwards || collective;
  ASSIGN_OR_RETURN(rank->engine_, Engine::Create(rank->counting_, backend, o));
  return rank;
}

std::string DpRankEngine::MakeBlob(const DpControl* control) {
  BlobWriter w;
  w.Put<uint8_t>(control != nullptr);
  if (control) PutControl(w, *control);
  DpReport& p = pending_;
  p.busy = engine_->HasUnfinished() || num_parked_ > 0;
  // Parked requests may be let in before the step (a cancelled leader): count on a prefill.
  p.next_step_tokens = num_parked_ > 0 ? engine_->options().max_batch_tokens : engine_->EstimateNextStepTokens();
  p.stats.num_running = engine_->num_running();
  p.stats.num_waiting = engine_->num_waiting() + num_parked_;
  p.stats.num_kv_blocks = engine_->num_kv_blocks();
  p.stats.num_used_kv_blocks = engine_->num_used_blocks();
  p.stats.block_size = engine_->options().block_size;
  p.stats.prefix_cache_queries = engine_->prefix_cache_queries();
  p.stats.prefix_cache_hits = engine_->prefix_cache_hits();
  p.stats.num_preemptions = engine_->num_preemptions();
  p.stats.num_steps = engine_->num_steps();
  PutReport(w, p);
  pending_ = DpReport();
  return w.Take();
}

Result<DpRound> DpRankEngine::RunRound(const std::vector<std::string>& blobs) {
  DpRound round;
  for (size_t r = 0; r < blobs.size(); ++r) {
    BlobReader reader(blobs[r]);
    const bool has_control = reader.Get<uint8_t>() != 0;
    if (has_control != (r == 0)) return Internal("DP rank " + std::to_string(r) + "'s blob " + (has_control ? "has" : "lacks") + " rank 0's control");
    if (has_control) round.control = GetControl(reader);
    round.reports.push_back(GetReport(reader));
    if (!reader.done()) return Internal("DP rank " + std::to_string(r) + "'s blob of " + std::to_string(blobs[r].size()) + " bytes does not parse");
  }
  if (round.control.stop) return round;
  for (const auto& [id, rank] : round.control.cancels)
    if (rank == dp_rank_) Cancel(id);
  bool work = !round.control.assignments.empty();
  for (DpControl::Assignment& a : round.control.assignments)
    if (a.rank == dp_rank_) Add(a);  // a copy: the round keeps what it said
  for (const DpReport& p : round.reports) work = work || p.busy;
  if (!work) return round;
  round.stepped = true;
  // The fixed-capacity exchange when no request arrives (its prefill would not fit) and every
  // rank expects at most its capacity of tokens; the engines enforce the limit (an estimate may
  // miss a preempted sequence readmitted within the step).
  round.fixed_capacity = fixed_capacity_ > 0 && round.control.assignments.empty();
  for (const DpReport& p : round.reports)
    round.fixed_capacity = round.fixed_capacity && p.next_step_tokens <= fixed_capacity_;
  ++num_rounds_stepped_;
  num_fixed_rounds_ += round.fixed_capacity;
  Step(round.fixed_capacity);
  return round;
}

void DpRankEngine::Add(DpControl::Assignment a) {
  // A follower waits for its leader's prompt to be computed, unless the leader is gone.
  if (a.leader != 0 && active_.count(a.leader) && engine_->options().enable_prefix_caching) {
    parked_[a.leader].push_back({a.request_id, std::move(a.request)});
    ++num_parked_;
    return;
  }
  AddToEngine(a.request_id, std::move(a.request));
}

void DpRankEngine::AddToEngine(uint64_t id, GenerationRequest request) {
  const int num_prompt = static_cast<int>(request.prompt.size());
  Result<int64_t> seq = engine_->AddRequest(std::move(request));
  if (!seq.ok()) {
    pending_.rejected.emplace_back(id, seq.status().ToString());
    Unpark(id);
    return;
  }
  active_[id] = {*seq, num_prompt};
  request_of_seq_[*seq] = id;
}

void DpRankEngine::Unpark(uint64_t leader) {
  auto it = parked_.find(leader);
  if (it == parked_.end()) return;
  std::vector<Parked> followers = std::move(it->second);
  parked_.erase(it);
  num_parked_ -= static_cast<int>(followers.size());
  for (Parked& p : followers) AddToEngine(p.id, std::move(p.request));
}

void DpRankEngine::Cancel(uint64_t id) {
  if (auto it = active_.find(id); it != active_.end()) {
    engine_->Abort(it->second.seq_id);
    request_of_seq_.erase(it->second.seq_id);
    active_.erase(it);
    Unpark(id);
    return;
  }
  for (auto& [leader, followers] : parked_) {  // a parked follower
    auto it = std::find_if(followers.begin(), followers.end(), [&](const Parked& p) { return p.id == id; });
    if (it == followers.end()) continue;
    followers.erase(it);
    --num_parked_;
    return;
  }
}

void DpRankEngine::Step(bool fixed_capacity) {
  const int64_t before = counting_.num_forwards(), steps_before = engine_->num_steps();
  std::vector<StepOutput> outputs;
  if (collective_) engine_->SetCollectiveStep(fixed_capacity, fixed_capacity_);
  if (engine_->HasUnfinished()) outputs = engine_->Step();
  const int64_t ran = counting_.num_forwards() - before;
  // Under DP-EP a second forward would meet the other ranks' next step: they would deadlock.
  COROLLA_CHECK(ran <= 1 || !collective_) << "an engine step ran " << ran << " forwards; DP-EP needs one per round";
  // A replayed decode graph is a launched step without a Model::Forward: it joined the round.
  const bool launched = ran > 0 || engine_->num_steps() > steps_before;
  if (!launched && collective_) RunEmptyForward(counting_, backend_.device(), fixed_capacity);
  for (StepOutput& o : outputs) {
    auto rit = request_of_seq_.find(o.seq_id);
    if (rit == request_of_seq_.end()) continue;
    const uint64_t id = rit->second;
    Active& a = active_.at(id);
    RequestOutput out;
    out.tokens.push_back(o.token);
    out.logprobs.push_back(o.logprob);
    out.top_logprobs.push_back(std::move(o.top_logprobs));
    out.finish_reason = o.finish_reason;
    out.num_prompt_tokens = a.num_prompt_tokens;
    if (const Sequence* s = engine_->Find(o.seq_id)) out.num_cached_prompt_tokens = s->num_cached_prompt_tokens;
    pending_.outputs.emplace_back(id, std::move(out));
    if (o.finish_reason != FinishReason::kNone) {
      active_.erase(id);
      request_of_seq_.erase(rit);
    }
    Unpark(id);  // its first token means its prompt is computed and in the prefix cache
  }
  engine_->DiscardFinished();
}

Status RunDpFollower(DpRankEngine& rank, const DpAllGather& all_gather) {
  for (;;) {
    ASSIGN_OR_RETURN(std::vector<std::string> blobs, all_gather(rank.MakeBlob(nullptr)));
    ASSIGN_OR_RETURN(DpRound round, rank.RunRound(blobs));
    if (round.control.stop) return Status::Ok();
  }
}

// --- DataParallelEngine ----------------------------------------------------------------------

DataParallelEngine::DataParallelEngine(std::unique_ptr<DpRankEngine> local, DpAllGather all_gather, int num_ranks,
                                       int max_model_len, AsyncEngineOptions options,
                                       std::function<void(const Status&)> on_failure)
    : local_(std::move(local)), all_gather_(std::move(all_gather)), num_ranks_(num_ranks),
      max_model_len_(max_model_len), options_(options), on_failure_(std::move(on_failure)),
      load_(num_ranks, 0), num_assigned_(num_ranks, 0) {
  stats_.num_kv_blocks = local_->engine().num_kv_blocks() * num_ranks;  // until the first reports
  stats_.block_size = local_->engine().options().block_size;
  StartStepThread([this] { Loop(); });
}

DataParallelEngine::~DataParallelEngine() { Shutdown(); }

Result<std::vector<uint64_t>> DataParallelEngine::SubmitAll(std::vector<GenerationRequest> requests,
                                                            std::vector<OutputCallback> callbacks) {
  COROLLA_CHECK(!requests.empty() && requests.size() == callbacks.size());
  for (const auto& r : requests) {
    // Rank 0's engine checks as any rank's would, but each rank may hold a different length
    // (its KV cache): the smallest one bounds every request.
    if (static_cast<int>(r.prompt.size()) >= max_model_len_)
      return OutOfRange("the prompt has " + std::to_string(r.prompt.size()) + " tokens; the maximum context is " +
                        std::to_string(max_model_len_) + " tokens including at least one generated token");
    RETURN_IF_ERROR(local_->engine().Validate(r));
  }
  const int n = static_cast<int>(requests.size());
  std::lock_guard<std::mutex> lock(mu_);
  if (!status_.ok()) return Status(StatusCode::kCancelled, "the data-parallel ranks failed: " + status_.message());
  if (stopping_) return Status(StatusCode::kCancelled, "the server is shutting down");
  if (stats_.num_waiting + n > options_.max_waiting)
    return ResourceExhausted("the queue is full (" + std::to_string(stats_.num_waiting) + " requests waiting); retry later");
  Submission sub;
  for (int i = 0; i < n; ++i) sub.ids.push_back(next_id_++);
  sub.requests = std::move(requests);
  sub.callbacks = std::move(callbacks);
  std::vector<uint64_t> ids = sub.ids;
  incoming_.push_back(std::move(sub));
  num_incoming_ += n;
  stats_.num_waiting += n;
  cv_.notify_one();
  return ids;
}

Status DataParallelEngine::status() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

void DataParallelEngine::AbortRequest(uint64_t request_id, DpControl* control) {
  auto it = active_.find(request_id);
  if (it == active_.end()) return;
  if (control) control->cancels.emplace_back(request_id, it->second.rank);
  RequestOutput out;
  out.finish_reason = FinishReason::kAbort;
  out.num_prompt_tokens = it->second.num_prompt_tokens;
  outputs_.Deliver(request_id, it->second.callback, std::move(out));
  active_.erase(it);
}

void DataParallelEngine::Fail(const Status& status) {
  LOG(ERROR) << "data-parallel serving stopped: " << status.ToString();
  std::vector<uint64_t> ids;
  for (const auto& [id, a] : active_) ids.push_back(id);
  for (uint64_t id : ids) AbortRequest(id, nullptr);
  std::vector<Submission> incoming;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    incoming.swap(incoming_);
    num_incoming_ = 0;
  }
  for (Submission& s : incoming)  // accepted but never sent: they end too
    for (size_t i = 0; i < s.ids.size(); ++i) {
      RequestOutput out;
      out.finish_reason = FinishReason::kAbort;
      out.num_prompt_tokens = static_cast<int>(s.requests[i].prompt.size());
      outputs_.Deliver(s.ids[i], std::make_shared<OutputCallback>(std::move(s.callbacks[i])), std::move(out));
    }
  if (on_failure_) on_failure_(status);
}

void DataParallelEngine::PublishStats(const DpRound& round) {
  EngineStats s;
  for (const DpReport& p : round.reports) {
    s.num_running += p.stats.num_running;
    s.num_waiting += p.stats.num_waiting;
    s.num_kv_blocks += p.stats.num_kv_blocks;
    s.num_used_kv_blocks += p.stats.num_used_kv_blocks;
    s.prefix_cache_queries += p.stats.prefix_cache_queries;
    s.prefix_cache_hits += p.stats.prefix_cache_hits;
    s.num_preemptions += p.stats.num_preemptions;
    s.num_steps += p.stats.num_steps;
  }
  s.block_size = local_->engine().options().block_size;
  s.steps = local_->engine().step_metrics();
  // The reports were made before this round's requests reached their ranks.
  s.num_waiting += static_cast<int>(round.control.assignments.size());
  std::lock_guard<std::mutex> lock(mu_);
  s.num_waiting += num_incoming_;
  stats_ = s;
}

void DataParallelEngine::Loop() {
  bool idle = false;  // the last round found no work on any rank
  for (;;) {
    std::vector<Submission> incoming;
    std::vector<uint64_t> cancels, ended;
    bool stopping = false, past_deadline = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto news = [&] { return stopping_ || !incoming_.empty() || !cancels_.empty() || !ended_by_callback_.empty(); };
      // Nothing to do anywhere: hold the next round back (the followers wait inside it).
      if (idle) cv_.wait_for(lock, kIdlePoll, news);
      incoming.swap(incoming_);
      num_incoming_ = 0;
      cancels.swap(cancels_);
      ended.swap(ended_by_callback_);
      stopping = stopping_;
      past_deadline = stopping_ && std::chrono::steady_clock::now() >= drain_deadline_;
    }
    DpControl control;
    for (Submission& sub : incoming) {
      // The least loaded rank, ties to the lowest; the n choices go together (its prefix cache).
      const int rank = static_cast<int>(std::min_element(load_.begin(), load_.end()) - load_.begin());
      load_[rank] += static_cast<int>(sub.ids.size());
      num_assigned_[rank] += static_cast<int64_t>(sub.ids.size());
      for (size_t i = 0; i < sub.ids.size(); ++i) {
        const int num_prompt = static_cast<int>(sub.requests[i].prompt.size());
        active_[sub.ids[i]] = {rank, std::make_shared<OutputCallback>(std::move(sub.callbacks[i])), num_prompt};
        control.assignments.push_back({sub.ids[i], rank, i > 0 ? sub.ids[0] : 0, std::move(sub.requests[i])});
      }
    }
    for (uint64_t id : ended) {  // silently: the callback wants nothing more
      if (auto it = active_.find(id); it != active_.end()) {
        control.cancels.emplace_back(id, it->second.rank);
        active_.erase(it);
      }
      outputs_.Forget(id);
    }
    for (uint64_t id : cancels) AbortRequest(id, &control);
    if (past_deadline) {
      std::vector<uint64_t> ids;
      for (const auto& [id, a] : active_) ids.push_back(id);
      for (uint64_t id : ids) AbortRequest(id, &control);
    }
    control.stop = stopping && active_.empty();

    Result<std::vector<std::string>> blobs = all_gather_(local_->MakeBlob(&control));
    if (!blobs.ok()) return Fail(blobs.status().WithContext("DP round"));
    if (static_cast<int>(blobs->size()) != num_ranks_)
      return Fail(Internal("DP round: " + std::to_string(blobs->size()) + " blobs from " + std::to_string(num_ranks_) + " ranks"));
    Result<DpRound> round = local_->RunRound(*blobs);
    if (!round.ok()) return Fail(round.status());

    for (int r = 0; r < num_ranks_; ++r) {
      DpReport& p = round->reports[r];
      load_[r] = p.stats.num_running + p.stats.num_waiting;
      for (auto& [id, out] : p.outputs) {
        auto it = active_.find(id);
        if (it == active_.end()) continue;  // cancelled or aborted meanwhile
        const bool last = out.finish_reason != FinishReason::kNone;
        outputs_.Deliver(id, it->second.callback, std::move(out));
        if (last) active_.erase(it);
      }
      for (const auto& [id, message] : p.rejected) {  // validated on rank 0, so not expected
        LOG(WARNING) << "request " << id << " rejected by DP rank " << r << ": " << message;
        AbortRequest(id, nullptr);
      }
    }
    for (const DpControl::Assignment& a : round->control.assignments) ++load_[a.rank];
    PublishStats(*round);
    if (control.stop) {
      std::string counts;
      for (int64_t n : num_assigned_) counts += (counts.empty() ? "" : ", ") + std::to_string(n);
      LOG(INFO) << "data-parallel ranks stopped; requests per rank: " << counts << "; fixed-capacity rounds: "
                << local_->num_fixed_rounds() << " of " << local_->num_rounds_stepped();
      return;
    }
    idle = !round->stepped;
  }
}

}  // namespace corolla
