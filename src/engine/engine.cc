#include "engine/engine.h"

#include <algorithm>
#include <unordered_map>

namespace corolla {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone: return "none";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
  }
  return "?";
}

Result<std::unique_ptr<Engine>> Engine::Create(Model& model, Backend& backend, EngineOptions options) {
  const ModelConfig& config = model.config();
  int max_model_len = options.max_model_len > 0 ? options.max_model_len : config.max_position_embeddings;
  if (max_model_len > config.max_position_embeddings)
    return InvalidArgument("max model length " + std::to_string(max_model_len) +
                           " exceeds the model's max_position_embeddings (" +
                           std::to_string(config.max_position_embeddings) + ")");
  if (options.block_size <= 0) return InvalidArgument("block size must be positive");
  if (options.linear_state_dtype != DType::kF32 && options.linear_state_dtype != DType::kBF16)
    return InvalidArgument(std::string("linear-attention state dtype ") + DTypeName(options.linear_state_dtype) +
                           ": f32 or bf16");
  int num_blocks = options.num_kv_blocks;
  if (num_blocks <= 0) {
    int64_t per_block = KvCache::BytesPerBlock(model.kv_cache_spec(), options.block_size,
                                               backend.activation_dtype());
    num_blocks = static_cast<int>(std::min<int64_t>(options.kv_cache_bytes / per_block, INT32_MAX));
  }
  // A single request must fit: otherwise it could never finish.
  int min_blocks = (max_model_len + options.block_size - 1) / options.block_size;
  if (num_blocks < min_blocks) {
    if (options.num_kv_blocks > 0)
      return ResourceExhausted("KV cache of " + std::to_string(num_blocks) + " blocks cannot hold one sequence of " +
                               std::to_string(max_model_len) + " tokens; lower the max model length or add memory");
    max_model_len = num_blocks * options.block_size;
    if (max_model_len <= 0) return ResourceExhausted("KV cache memory too small for one block");
  }
  if (options.max_batch_tokens <= 0 || options.max_num_seqs <= 0)
    return InvalidArgument("max batch tokens and max sequences must be positive");
  return std::unique_ptr<Engine>(new Engine(model, backend, options, num_blocks, max_model_len));
}

Engine::Engine(Model& model, Backend& backend, EngineOptions options, int num_blocks, int max_model_len)
    : model_(model),
      backend_(backend),
      options_(options),
      max_model_len_(max_model_len),
      // Hybrid models keep one state slot per running sequence (+1 spare), and for the prefix
      // cache, snapshots of the states at block boundaries.
      kv_cache_(backend, model.kv_cache_spec(), num_blocks, options.block_size,
                model.state_spec().WithRecurrentDtype(options.linear_state_dtype),
                model.state_spec().num_layers > 0 ? options.max_num_seqs + 1 + NumSnapshots(options) : 0),
      pool_(num_blocks, options.enable_prefix_caching &&
                            (model.state_spec().num_layers == 0 || NumSnapshots(options) > 0)),
      runner_(model, backend, kv_cache_, options.decode_graphs, options.max_num_seqs, options.collective_forwards) {
  if (kv_cache_.has_state() && pool_.prefix_caching())
    snapshots_ = std::make_unique<StateSnapshots>(backend, kv_cache_, NumSnapshots(options));
}

Engine::~Engine() {
  if (in_flight_) runner_.Collect(in_flight_->launched);  // its copies land before buffers go
}

int Engine::NumSnapshots(const EngineOptions& options) {
  if (!options.enable_prefix_caching) return 0;
  return options.num_state_snapshots >= 0 ? options.num_state_snapshots : 2 * options.max_num_seqs;
}

int Engine::ChunkSize(const Sequence& s, int budget) const {
  int n = std::min(s.num_uncomputed(), budget);
  if (!snapshots_) return n;
  // Hybrid prefix caching snapshots states where a step ends on a block boundary: end chunks
  // there, and stop at the last boundary a later identical prompt can hit.
  const int bs = options_.block_size, start = s.num_computed_tokens;
  const int last_hit_boundary = (s.length() - 1) / bs * bs;
  if (start < last_hit_boundary && start + n > last_hit_boundary) return last_hit_boundary - start;
  if (start + n < s.length()) {
    int aligned = (start + n) / bs * bs - start;
    if (aligned > 0) return aligned;
  }
  return n;
}

Status Engine::Validate(const GenerationRequest& request) const {
  const int vocab = model_.config().vocab_size;
  if (request.prompt.empty()) return InvalidArgument("the prompt is empty");
  for (size_t i = 0; i < request.prompt.size(); ++i) {
    if (request.prompt[i] < 0 || request.prompt[i] >= vocab)
      return OutOfRange("token id " + std::to_string(request.prompt[i]) + " at position " + std::to_string(i) +
                        " is outside the vocabulary [0, " + std::to_string(vocab) + ")");
  }
  if (static_cast<int>(request.prompt.size()) >= max_model_len_)
    return OutOfRange("the prompt has " + std::to_string(request.prompt.size()) +
                      " tokens; the maximum context is " + std::to_string(max_model_len_) +
                      " tokens including at least one generated token");
  if (request.max_tokens <= 0) return InvalidArgument("max_tokens must be positive");
  if (request.num_logprobs > vocab)
    return OutOfRange("at most " + std::to_string(vocab) + " top logprobs can be requested");
  return Status::Ok();
}

Result<int64_t> Engine::AddRequest(GenerationRequest request) {
  RETURN_IF_ERROR(Validate(request));
  auto s = std::make_shared<Sequence>();
  s->id = next_id_++;
  s->tokens = std::move(request.prompt);
  s->num_prompt_tokens = s->num_tokens();
  s->sampling = request.sampling;
  s->max_tokens = request.max_tokens;
  s->stop_token_ids = std::move(request.stop_token_ids);
  s->ignore_eos = request.ignore_eos;
  s->penalties = request.penalties;
  s->num_logprobs = request.num_logprobs;
  int64_t id = s->id;
  num_host_sampling_ += SamplesOnHost(*s);
  waiting_.push_back(std::move(s));
  return id;
}

const Sequence* Engine::Find(int64_t seq_id) const {
  for (const auto& s : running_) if (s->id == seq_id) return s.get();
  for (const auto& s : waiting_) if (s->id == seq_id) return s.get();
  for (const auto& s : finished_) if (s->id == seq_id) return s.get();
  return nullptr;
}

void Engine::Abort(int64_t seq_id) {
  auto match = [&](const std::shared_ptr<Sequence>& s) { return s->id == seq_id; };
  auto end = [&](Sequence& s) {
    Release(s);
    s.finish_reason = FinishReason::kAbort;  // a step in flight drops its token
    num_host_sampling_ -= SamplesOnHost(s);
  };
  if (auto it = std::find_if(running_.begin(), running_.end(), match); it != running_.end()) {
    end(**it);
    running_.erase(it);
  }
  if (auto it = std::find_if(waiting_.begin(), waiting_.end(), match); it != waiting_.end()) {
    end(**it);
    waiting_.erase(it);
  }
}

bool Engine::ReachesLengthLimit(const Sequence& s) const {
  return s.num_pending > 0 && (s.num_generated() + s.num_pending >= s.max_tokens || s.length() >= max_model_len_);
}

int Engine::BlocksNeeded(const Sequence& s, int num_new_tokens) const {
  int total = s.num_computed_tokens + num_new_tokens;
  int needed = (total + options_.block_size - 1) / options_.block_size;
  return std::max(0, needed - static_cast<int>(s.block_table.size()));
}

bool Engine::Reserve(Sequence& s, int num_new_tokens) {
  int n = BlocksNeeded(s, num_new_tokens);
  if (!pool_.CanAllocate(n)) return false;
  std::vector<int32_t> blocks = pool_.Allocate(n);
  s.block_table.insert(s.block_table.end(), blocks.begin(), blocks.end());
  return true;
}

void Engine::Release(Sequence& s) {
  // Tail blocks first, so the prefix cache evicts a sequence's end before its shared start.
  std::vector<int32_t> reversed(s.block_table.rbegin(), s.block_table.rend());
  pool_.Free(reversed);
  s.block_table.clear();
  s.num_committed_blocks = 0;
  kv_cache_.FreeStateSlot(s.state_slot);
  s.state_slot = -1;
}

uint64_t Engine::BlockHashOf(Sequence& s, int block_idx) {
  const int bs = options_.block_size;
  while (static_cast<int>(s.block_hashes.size()) <= block_idx) {
    int i = static_cast<int>(s.block_hashes.size());
    COROLLA_CHECK((i + 1) * bs <= s.num_tokens()) << "hash of a partial block";
    uint64_t parent = i > 0 ? s.block_hashes[i - 1] : 0;
    s.block_hashes.push_back(BlockHash(parent, std::span<const int32_t>(s.tokens.data() + i * bs, bs)));
  }
  return s.block_hashes[block_idx];
}

int Engine::MatchPrefix(Sequence& s) {
  if (!pool_.prefix_caching() || !s.block_table.empty() || s.num_computed_tokens != 0) return 0;
  const int bs = options_.block_size;
  const int max_blocks = (s.num_tokens() - 1) / bs;
  for (int i = 0; i < max_blocks; ++i) {
    uint64_t parent = i > 0 ? BlockHashOf(s, i - 1) : 0;
    std::optional<int32_t> block =
        pool_.FindCached(BlockHashOf(s, i), parent, std::span<const int32_t>(s.tokens.data() + i * bs, bs));
    if (!block) break;
    pool_.Share(*block);
    s.block_table.push_back(*block);
  }
  if (snapshots_) {
    // The linear layers resume only where a snapshot of their states exists.
    int usable = static_cast<int>(s.block_table.size());
    while (usable > 0 && !snapshots_->Has(BlockHashOf(s, usable - 1))) --usable;
    std::vector<int32_t> unusable(s.block_table.begin() + usable, s.block_table.end());
    pool_.Free(unusable);
    s.block_table.resize(usable);
    if (usable > 0) COROLLA_CHECK(snapshots_->Restore(BlockHashOf(s, usable - 1), s.state_slot));
  }
  s.num_committed_blocks = static_cast<int>(s.block_table.size());
  s.num_computed_tokens = s.num_committed_blocks * bs;
  return s.num_computed_tokens;
}

void Engine::CommitFullBlocks(Sequence& s) {
  if (!pool_.prefix_caching()) return;
  const int bs = options_.block_size;
  // Blocks whose K/V is computed (or enqueued: later readers are ordered after it) and whose
  // tokens the host knows; none after Release.
  const int num_full = std::min(std::min(s.num_computed_tokens, s.num_tokens()) / bs,
                                static_cast<int>(s.block_table.size()));
  for (int i = s.num_committed_blocks; i < num_full; ++i) {
    uint64_t parent = i > 0 ? BlockHashOf(s, i - 1) : 0;
    pool_.Register(s.block_table[i], BlockHashOf(s, i), parent,
                   std::span<const int32_t>(s.tokens.data() + i * bs, bs));
  }
  s.num_committed_blocks = std::max(s.num_committed_blocks, num_full);
}

void Engine::Preempt(Sequence& s) {
  // Recompute later: the K/V is dropped (its full blocks stay in the prefix cache), the tokens
  // (prompt + generated so far) are kept.
  Release(s);
  s.num_computed_tokens = 0;
  ++num_preemptions_;
}

int Engine::EstimateNextStepTokens() const {
  int64_t tokens = 0;
  for (const auto& s : running_) tokens += s->num_uncomputed();
  for (const auto& s : waiting_) tokens += s->length();
  return static_cast<int>(std::min<int64_t>(tokens, options_.max_batch_tokens));
}

Engine::Batch Engine::Schedule() {
  Batch batch;
  int budget = options_.max_batch_tokens;
  if (step_token_limit_ > 0) budget = std::min(budget, step_token_limit_);
  auto add = [&](const std::shared_ptr<Sequence>& s, int n) {
    ScheduledChunk chunk{s.get(), n};
    if (s->num_pending > 0) chunk.sampled_row = s->last_sampled_row;  // its input is on the device
    batch.chunks.push_back(chunk);
    batch.seqs.push_back(s);
    budget -= n;
  };

  // 1. Running sequences, oldest first: decodes take one token, unfinished prefills a chunk.
  //    When blocks run out, the newest running sequence goes back to the waiting queue. One
  //    whose token in flight ends it by length needs no further batch.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    Sequence& s = *running_[i];
    if (ReachesLengthLimit(s)) continue;
    int n = ChunkSize(s, budget);
    while (!Reserve(s, n)) {
      Sequence& victim = *running_.back();
      Preempt(victim);
      waiting_.push_front(std::move(running_.back()));
      running_.pop_back();
      if (&victim == &s) break;
    }
    if (i >= running_.size()) break;  // s itself was preempted
    add(running_[i], n);
  }

  // 2. Waiting sequences in arrival order while the budget, sequence and block limits allow.
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int>(running_.size()) < options_.max_num_seqs) {
    Sequence& s = *waiting_.front();
    if (s.num_pending > 0) break;  // preempted while its last token was in flight: next batch
    if (kv_cache_.has_state() && s.state_slot < 0) s.state_slot = kv_cache_.AllocateStateSlot();
    if (kv_cache_.has_state() && s.state_slot < 0) break;
    int cached = MatchPrefix(s);
    int n = ChunkSize(s, budget);
    if (!Reserve(s, n)) {
      Release(s);  // the shared blocks stay cached for the next attempt
      s.num_computed_tokens = 0;
      break;
    }
    prefix_cache_queries_ += s.num_tokens();
    prefix_cache_hits_ += cached;
    if (s.num_generated() == 0) s.num_cached_prompt_tokens = cached;
    add(waiting_.front(), n);
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
  return batch;
}

void Engine::Launch(Batch& batch) {
  batch.launch_time = std::chrono::steady_clock::now();
  batch.launched = runner_.Launch(batch.chunks);
  ++num_steps_;
  const int bs = options_.block_size;
  for (size_t i = 0; i < batch.chunks.size(); ++i) {
    Sequence& s = *batch.chunks[i].seq;
    s.num_computed_tokens += batch.chunks[i].num_tokens;
    batch.ends.push_back(s.num_computed_tokens);
    if (const int row = batch.launched.row_of_chunk[i]; row >= 0) {
      ++s.num_pending;
      s.last_sampled_row = row;
    }
    // Hybrid prefix caching: the states at a block boundary, copied before the next batch moves
    // them on; filed under the block's hash now, or when its last token reaches the host.
    int captured = -1;
    if (snapshots_ && s.num_computed_tokens % bs == 0) {
      if (s.num_computed_tokens <= s.num_tokens())
        snapshots_->Save(BlockHashOf(s, s.num_computed_tokens / bs - 1), s.state_slot);
      else
        captured = snapshots_->Capture(s.state_slot);
    }
    batch.snapshot_slots.push_back(captured);
  }
}

StepMetrics::StepMetrics()
    : decode_seconds({0.0005, 0.001, 0.002, 0.003, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025,
                      0.03,   0.04,  0.05,  0.075, 0.1,   0.15,  0.2,   0.3,  0.5,   1,    2.5}),
      mixed_seconds(decode_seconds.bounds()),
      tokens({1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384}) {}

void Engine::RecordStep(const Batch& batch) {
  const auto now = std::chrono::steady_clock::now();
  StepRecord r;
  r.graph = batch.launched.graph;
  r.seconds =
      std::chrono::duration<double>(now - std::max(batch.launch_time, last_finish_time_)).count();
  for (size_t i = 0; i < batch.chunks.size(); ++i) {
    const ScheduledChunk& c = batch.chunks[i];
    if (c.num_tokens == 1 && batch.ends[i] > c.seq->num_prompt_tokens)
      ++r.decode_rows;
    else
      r.prefill_tokens += c.num_tokens;
  }
  (r.prefill_tokens > 0 ? step_metrics_.mixed_seconds : step_metrics_.decode_seconds)
      .Observe(r.seconds);
  step_metrics_.tokens.Observe(r.decode_rows + r.prefill_tokens);
  if (record_steps_) step_records_.push_back(r);
  last_finish_time_ = now;
}

std::vector<StepOutput> Engine::Finish(Batch& batch) {
  std::vector<SampledToken> sampled = runner_.Collect(batch.launched);
  RecordStep(batch);
  std::vector<StepOutput> outputs;
  const int bs = options_.block_size;
  for (size_t i = 0; i < batch.chunks.size(); ++i) {
    Sequence& s = *batch.chunks[i].seq;
    if (batch.launched.row_of_chunk[i] >= 0) {
      --s.num_pending;
      // A sequence that ended after this batch was launched (stopped by the batch before, or
      // aborted) drops the token.
      if (!s.finished()) {
        s.tokens.push_back(sampled[i].token);
        CheckStop(s);
        outputs.push_back({s.id, sampled[i].token, s.finish_reason, sampled[i].logprob,
                           std::move(sampled[i].top_logprobs)});
      }
    }
    CommitFullBlocks(s);
    if (const int captured = batch.snapshot_slots[i]; captured >= 0) {
      if (batch.ends[i] <= s.num_tokens())
        snapshots_->Publish(captured, BlockHashOf(s, batch.ends[i] / bs - 1));
      else
        snapshots_->Discard(captured);  // its last token was dropped
    }
  }
  // Move finished sequences out, freeing their blocks; one preempted while its last token was
  // in flight may finish in the waiting queue.
  auto retire = [&](auto& queue) {
    for (auto it = queue.begin(); it != queue.end();) {
      if (!(*it)->finished()) {
        ++it;
        continue;
      }
      Release(**it);
      num_host_sampling_ -= SamplesOnHost(**it);
      finished_.push_back(std::move(*it));
      it = queue.erase(it);
    }
  };
  retire(running_);
  retire(waiting_);
  return outputs;
}

void Engine::CheckStop(Sequence& s) {
  int32_t last = s.tokens.back();
  if (!s.ignore_eos &&
      std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), last) != s.stop_token_ids.end()) {
    s.finish_reason = FinishReason::kStop;
  } else if (s.num_generated() >= s.max_tokens || s.num_tokens() >= max_model_len_) {
    s.finish_reason = FinishReason::kLength;
  }
}

std::vector<StepOutput> Engine::Step() {
  std::vector<StepOutput> outputs;
  auto finish = [&](Batch& batch) {
    std::vector<StepOutput> more = Finish(batch);
    outputs.insert(outputs.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  };
  auto take_in_flight = [&] {
    Batch previous = std::move(*in_flight_);
    in_flight_.reset();
    finish(previous);
  };
  // Synchronous steps: when asked for, and while a request samples on the host (penalties read
  // every earlier token; the logits go to the host anyway).
  const bool sync = !options_.async_scheduling || num_host_sampling_ > 0;
  if (sync && in_flight_) take_in_flight();
  Batch batch = Schedule();
  if (batch.chunks.empty()) {
    if (in_flight_) take_in_flight();
    return outputs;
  }
  Launch(batch);
  if (sync) {
    finish(batch);
    return outputs;
  }
  // This batch runs on the device while the host takes the previous batch's tokens.
  if (in_flight_) {
    ++num_async_steps_;
    take_in_flight();
  }
  in_flight_ = std::move(batch);
  return outputs;
}

bool Engine::WarmDecodeGraph() {
  if (!options_.warm_decode_graphs) return false;
  if (HasUnfinished()) return true;
  if (in_flight_) {
    Batch previous = std::move(*in_flight_);
    in_flight_.reset();
    const std::vector<StepOutput> dropped = Finish(previous);
    COROLLA_CHECK(dropped.empty())
        << "a step of ended sequences produced " << dropped.size() << " outputs";
  }
  return runner_.WarmDecodeGraph(max_model_len_);
}

Result<std::vector<std::pair<std::vector<int32_t>, FinishReason>>> Engine::Generate(
    std::vector<GenerationRequest> requests) {
  std::vector<int64_t> ids;
  for (auto& r : requests) {
    Result<int64_t> id = AddRequest(std::move(r));
    if (!id.ok()) {
      for (int64_t added : ids) Abort(added);
      return id.status();
    }
    ids.push_back(*id);
  }
  while (HasUnfinished()) Step();
  std::vector<std::pair<std::vector<int32_t>, FinishReason>> results;
  for (int64_t id : ids) {
    auto it = std::find_if(finished_.begin(), finished_.end(), [&](const auto& s) { return s->id == id; });
    COROLLA_CHECK(it != finished_.end()) << "sequence " << id << " did not finish";
    const Sequence& s = **it;
    results.push_back({std::vector<int32_t>(s.tokens.begin() + s.num_prompt_tokens, s.tokens.end()),
                       s.finish_reason});
    finished_.erase(it);
  }
  return results;
}

}  // namespace corolla
