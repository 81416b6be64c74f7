#include "engine/async_engine.h"

#include "base/logging.h"

namespace corolla {

AsyncEngine::AsyncEngine(std::unique_ptr<Engine> engine, AsyncEngineOptions options)
    : engine_(std::move(engine)), options_(options), max_model_len_(engine_->max_model_len()) {
  stats_.num_kv_blocks = engine_->num_kv_blocks();
  stats_.block_size = engine_->options().block_size;
  thread_ = std::thread([this] { Loop(); });
}

AsyncEngine::~AsyncEngine() { Shutdown(); }

Result<uint64_t> AsyncEngine::Submit(GenerationRequest request, OutputCallback callback) {
  RETURN_IF_ERROR(engine_->Validate(request));
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_) return Status(StatusCode::kCancelled, "the server is shutting down");
  if (stats_.num_waiting >= options_.max_waiting)
    return ResourceExhausted("the queue is full (" + std::to_string(stats_.num_waiting) +
                             " requests waiting); retry later");
  uint64_t id = next_id_++;
  incoming_.push_back({id, std::move(request), std::move(callback)});
  ++stats_.num_waiting;
  cv_.notify_one();
  return id;
}

void AsyncEngine::Cancel(uint64_t request_id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(request_id);
  cv_.notify_one();
}

void AsyncEngine::Shutdown(std::chrono::milliseconds drain) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      drain_deadline_ = std::chrono::steady_clock::now() + drain;
    }
    cv_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

EngineStats AsyncEngine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void AsyncEngine::PublishStats(int num_incoming) {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.num_running = engine_->num_running();
  stats_.num_waiting = engine_->num_waiting() + num_incoming + static_cast<int>(incoming_.size());
  stats_.num_used_kv_blocks = engine_->num_used_blocks();
  stats_.prefix_cache_queries = engine_->prefix_cache_queries();
  stats_.prefix_cache_hits = engine_->prefix_cache_hits();
  stats_.num_preemptions = engine_->num_preemptions();
}

void AsyncEngine::AbortAll() {
  for (auto& [id, a] : active_) {
    engine_->Abort(a.seq_id);
    RequestOutput out;
    out.finish_reason = FinishReason::kAbort;
    out.num_prompt_tokens = a.num_prompt_tokens;
    a.callback(out);
  }
  active_.clear();
  request_of_seq_.clear();
}

void AsyncEngine::Loop() {
  for (;;) {
    std::vector<Submission> incoming;
    std::vector<uint64_t> cancels;
    bool stopping = false, past_deadline = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !incoming_.empty() || !cancels_.empty() || !active_.empty(); });
      incoming.swap(incoming_);
      cancels.swap(cancels_);
      stopping = stopping_;
      past_deadline = stopping_ && std::chrono::steady_clock::now() >= drain_deadline_;
    }
    for (Submission& sub : incoming) {
      int num_prompt = static_cast<int>(sub.request.prompt.size());
      Result<int64_t> seq = engine_->AddRequest(std::move(sub.request));
      if (!seq.ok()) {  // validated in Submit, so this is not expected; still end it cleanly
        LOG(WARNING) << "request " << sub.id << " rejected by the engine: " << seq.status().ToString();
        RequestOutput out;
        out.finish_reason = FinishReason::kAbort;
        sub.callback(out);
        continue;
      }
      active_[sub.id] = {*seq, std::move(sub.callback), num_prompt};
      request_of_seq_[*seq] = sub.id;
    }
    for (uint64_t id : cancels) {
      auto it = active_.find(id);
      if (it == active_.end()) continue;
      engine_->Abort(it->second.seq_id);
      RequestOutput out;
      out.finish_reason = FinishReason::kAbort;
      out.num_prompt_tokens = it->second.num_prompt_tokens;
      it->second.callback(out);
      request_of_seq_.erase(it->second.seq_id);
      active_.erase(it);
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
        bool keep_going = ait->second.callback(out);
        if (!keep_going && o.finish_reason == FinishReason::kNone) engine_->Abort(o.seq_id);
        if (!keep_going || o.finish_reason != FinishReason::kNone) {
          active_.erase(ait);
          request_of_seq_.erase(rit);
        }
      }
      engine_->DiscardFinished();
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.num_steps;
      }
    }
    PublishStats(0);
  }
}

}  // namespace corolla
