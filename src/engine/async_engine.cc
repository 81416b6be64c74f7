#include "engine/async_engine.h"

#include "base/logging.h"

namespace corolla {

OutputDispatcher::OutputDispatcher(std::function<void(uint64_t)> on_ended) : on_ended_(std::move(on_ended)) {
  thread_ = std::thread([this] { Loop(); });
}

OutputDispatcher::~OutputDispatcher() { Close(); }

void OutputDispatcher::Deliver(uint64_t request_id, std::shared_ptr<OutputCallback> callback, RequestOutput output) {
  std::lock_guard<std::mutex> lock(mu_);
  deliveries_.push_back({request_id, std::move(callback), std::move(output)});
  cv_.notify_one();
}

void OutputDispatcher::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

void OutputDispatcher::Loop() {
  for (;;) {
    std::deque<Delivery> batch;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return closed_ || !deliveries_.empty(); });
      if (deliveries_.empty()) return;  // closed and drained
      batch.swap(deliveries_);
    }
    for (Delivery& d : batch) {
      const bool last = d.output.finish_reason != FinishReason::kNone;
      if (!d.callback) {  // the step thread has dropped a request its callback ended
        ended_.erase(d.request_id);
        continue;
      }
      if (ended_.count(d.request_id)) continue;
      if (!(*d.callback)(d.output) && !last) {
        ended_.insert(d.request_id);
        on_ended_(d.request_id);
      }
    }
  }
}

StepThreadEngine::StepThreadEngine()
    : outputs_([this](uint64_t id) {
        std::lock_guard<std::mutex> lock(mu_);
        ended_by_callback_.push_back(id);
        cv_.notify_one();
      }) {}

void StepThreadEngine::Cancel(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(request_id);
  cv_.notify_one();
}

void StepThreadEngine::Shutdown(std::chrono::milliseconds drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      drain_deadline_ = std::chrono::steady_clock::now() + drain;
    }
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
  outputs_.Close();  // after every output is delivered
}

EngineStats StepThreadEngine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine, AsyncEngineOptions options)
    : engine_(std::move(engine)), options_(options), max_model_len_(engine_->max_model_len()) {
  stats_.num_kv_blocks = engine_->num_kv_blocks();
  stats_.block_size = engine_->options().block_size;
  StartStepThread([this] { Loop(); });
}

AsyncEngine::~AsyncEngine() { Shutdown(); }

Result<uint64_t> ServingEngine::Submit(GenerationRequest request, OutputCallback callback) {
  std::vector<GenerationRequest> requests;
  requests.push_back(std::move(request));
  std::vector<OutputCallback> callbacks;
  callbacks.push_back(std::move(callback));
  ASSIGN_OR_RETURN(std::vector<uint64_t> ids, SubmitAll(std::move(requests), std::move(callbacks)));
  return ids[0];
}

Result<std::vector<uint64_t>> AsyncEngine::SubmitAll(std::vector<GenerationRequest> requests,
                                                     std::vector<OutputCallback> callbacks) {
  COROLLA_CHECK(!requests.empty() && requests.size() == callbacks.size());
  for (const auto& r : requests) RETURN_IF_ERROR(engine_->Validate(r));
  const int n = static_cast<int>(requests.size());
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return Status(StatusCode::kCancelled, "the server is shutting down");
  if (stats_.num_waiting + n > options_.max_waiting)
    return ResourceExhausted("the queue is full (" + std::to_string(stats_.num_waiting) +
                             " requests waiting); retry later");
  std::vector<uint64_t> ids;
  for (int i = 0; i < n; ++i) {
    uint64_t id = next_id_++;
    ids.push_back(id);
    incoming_.push_back({id, std::move(requests[i]), std::move(callbacks[i]), i > 0 ? ids[0] : 0});
  }
  stats_.num_waiting += n;
  cv_.notify_one();
  return ids;
}

void AsyncEngine::AddToEngine(uint64_t id, GenerationRequest request) {
  Active& a = active_.at(id);
  Result<int64_t> seq = engine_->AddRequest(std::move(request));
  if (!seq.ok()) {  // validated in Submit, so this is not expected; still end it cleanly
    LOG(WARNING) << "request " << id << " rejected by the engine: " << seq.status().ToString();
    AbortRequest(id);
    return;
  }
  a.seq_id = *seq;
  request_of_seq_[*seq] = id;
}

void AsyncEngine::Unpark(uint64_t leader) {
  auto it = parked_.find(leader);
  if (it == parked_.end()) return;
  std::vector<Parked> followers = std::move(it->second);
  parked_.erase(it);
  num_parked_ -= static_cast<int>(followers.size());
  for (Parked& p : followers)
    if (active_.count(p.id)) AddToEngine(p.id, std::move(p.request));  // else cancelled meanwhile
}

void AsyncEngine::PublishStats(int num_incoming) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.num_running = engine_->num_running();
  stats_.num_waiting = engine_->num_waiting() + num_parked_ + num_incoming + static_cast<int>(incoming_.size());
  stats_.num_used_kv_blocks = engine_->num_used_blocks();
  stats_.prefix_cache_queries = engine_->prefix_cache_queries();
  stats_.prefix_cache_hits = engine_->prefix_cache_hits();
  stats_.num_preemptions = engine_->num_preemptions();
  stats_.steps = engine_->step_metrics();
}

void AsyncEngine::AbortRequest(uint64_t request_id) {
  auto it = active_.find(request_id);
  if (it == active_.end()) return;
  if (it->second.seq_id >= 0) engine_->Abort(it->second.seq_id);
  RequestOutput out;
  out.finish_reason = FinishReason::kAbort;
  out.num_prompt_tokens = it->second.num_prompt_tokens;
  outputs_.Deliver(request_id, it->second.callback, std::move(out));
  request_of_seq_.erase(it->second.seq_id);
  active_.erase(it);
}

void AsyncEngine::AbortAll() {
  std::vector<uint64_t> ids;
  for (const auto& [id, a] : active_) ids.push_back(id);
  for (uint64_t id : ids) AbortRequest(id);
  parked_.clear();
  num_parked_ = 0;
}

void AsyncEngine::Loop() {
  for (;;) {
    std::vector<Submission> incoming;
    std::vector<uint64_t> cancels, ended;
    bool stopping = false, past_deadline = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] {
        return stopping_ || !incoming_.empty() || !cancels_.empty() || !ended_by_callback_.empty() || !active_.empty();
      };
      // Idle: capture decode graphs ahead of use, one at a time, so that a request arriving now
      // waits for at most one capture instead of its step capturing later.
      while (warming_ && !ready()) {
        lock.unlock();
        const auto start = std::chrono::steady_clock::now();
        warming_ = engine_->WarmDecodeGraph();
        if (warming_) {
          ++warm_graphs_;
          warm_seconds_ +=
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        } else if (warm_graphs_ > 0) {
          LOG(INFO) << "decode graphs: " << warm_graphs_ << " captured while idle in "
                    << warm_seconds_ << " s";
        }
        lock.lock();
      }
      cv_.wait(lock, ready);
      incoming.swap(incoming_);
      cancels.swap(cancels_);
      ended.swap(ended_by_callback_);
      stopping = stopping_;
      past_deadline = stopping_ && std::chrono::steady_clock::now() >= drain_deadline_;
    }
    for (Submission& sub : incoming) {
      int num_prompt = static_cast<int>(sub.request.prompt.size());
      active_[sub.id] = {-1, std::make_shared<OutputCallback>(std::move(sub.callback)), num_prompt};
      // A follower waits for its leader's prompt to be computed, unless the leader is gone.
      if (sub.leader != 0 && active_.count(sub.leader) && engine_->options().enable_prefix_caching) {
        parked_[sub.leader].push_back({sub.id, std::move(sub.request)});
        ++num_parked_;
      } else {
        AddToEngine(sub.id, std::move(sub.request));
      }
    }
    for (uint64_t id : ended) {  // silently: the callback wants nothing more
      if (auto it = active_.find(id); it != active_.end()) {
        if (it->second.seq_id >= 0) engine_->Abort(it->second.seq_id);
        request_of_seq_.erase(it->second.seq_id);
        active_.erase(it);
        Unpark(id);
      }
      outputs_.Forget(id);
    }
    for (uint64_t id : cancels) {
      if (!active_.count(id)) continue;
      AbortRequest(id);
      Unpark(id);
    }
    if (past_deadline) AbortAll();
    if (stopping && active_.empty()) {
      PublishStats(0);
      break;
    }
    if (engine_->HasUnfinished()) {
      std::vector<StepOutput> outputs = engine_->Step();
      // One output per sequence per step; deliver in step order.
      for (StepOutput& o : outputs) {
        auto rit = request_of_seq_.find(o.seq_id);
        if (rit == request_of_seq_.end()) continue;
        auto ait = active_.find(rit->second);
        RequestOutput out;
        out.tokens.push_back(o.token);
        out.logprobs.push_back(o.logprob);
        out.top_logprobs.push_back(std::move(o.top_logprobs));
        out.finish_reason = o.finish_reason;
        out.num_prompt_tokens = ait->second.num_prompt_tokens;
        if (const Sequence* s = engine_->Find(o.seq_id)) out.num_cached_prompt_tokens = s->num_cached_prompt_tokens;
        const uint64_t request_id = rit->second;
        outputs_.Deliver(request_id, ait->second.callback, std::move(out));
        if (o.finish_reason != FinishReason::kNone) {
          active_.erase(ait);
          request_of_seq_.erase(rit);
        }
        // Its first token means its prompt is computed and in the prefix cache.
        Unpark(request_id);
      }
      engine_->DiscardFinished();
      {
        std::lock_guard<std::mutex> lock(mu_);
        stats_.num_steps = engine_->num_steps();
      }
    }
    PublishStats(0);
  }
}

}  // namespace corolla
