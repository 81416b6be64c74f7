#include "engine/model_runner.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "base/numeric.h"
#include "kernels/cpu/sampling.h"

namespace corolla {

ModelRunner::ModelRunner(Model& model, Backend& backend, KvCache& kv_cache, DecodeGraphMode graph_mode,
                         int max_num_seqs, bool collective)
    : model_(model),
      backend_(backend),
      kv_cache_(kv_cache),
      sampled_ids_(backend.Empty(DType::kI32, {std::max(1, max_num_seqs)})),
      collective_(collective) {
  const bool capture = graph_mode != DecodeGraphMode::kBucketsEager;
  bool on = graph_mode != DecodeGraphMode::kOff && (backend.supports_graphs() || !capture) &&
            model.config().mla.kv_lora_rank == 0;
  if (graph_mode == DecodeGraphMode::kAuto) {
    const char* env = std::getenv("COROLLA_CUDA_GRAPHS");
    on = on && !(env != nullptr && std::strcmp(env, "0") == 0);
  }
  // COROLLA_DECODE_GRAPH_MAX_BATCH: the most sequences a step replays a graph for.
  int max_batch = DecodeGraphs::kMaxBatch;
  if (const char* env = std::getenv("COROLLA_DECODE_GRAPH_MAX_BATCH");
      env != nullptr && *env != '\0')
    max_batch = std::max(1, std::atoi(env));
  if (on)
    graphs_ =
        std::make_unique<DecodeGraphs>(model, backend, kv_cache, sampled_ids_, capture, max_batch);
}

ModelRunner::~ModelRunner() = default;

Tensor ModelRunner::ToDevice(const std::vector<int32_t>& host, Shape shape) {
  Tensor t = backend_.Empty(DType::kI32, shape);
  if (!host.empty()) backend_.CopyFromHost(host.data(), t);
  return t;
}

Tensor ModelRunner::InputIds(const std::vector<int32_t>& host, const std::vector<int32_t>& source,
                             int num_sampled) {
  const int64_t n = static_cast<int64_t>(host.size());
  if (num_sampled == 0) return ToDevice(host, {n});
  // [n + num_sampled, 1]: the host's ids, then the previous step's sampled ids behind them.
  Tensor all = backend_.Empty(DType::kI32, {n + num_sampled, 1});
  backend_.CopyFromHost(host.data(), all.view().Slice(0, n));
  backend_.Copy(sampled_ids_.view().Slice(0, num_sampled).Reshape({num_sampled, 1}),
                all.view().Slice(n, n + num_sampled));
  Tensor d_source = ToDevice(source, {n});
  Tensor ids = backend_.Empty(DType::kI32, {n, 1});
  backend_.GatherRows(all, d_source, ids);
  return ids.Reshaped({n});
}

Tensor ModelRunner::Execute(std::span<const ScheduledChunk> chunks, bool all_logits) {
  // Collective: a graph's exchanges are the fixed-capacity ones, which every rank must take.
  const bool graphs_usable = !collective_ || (captured_ && fixed_step_);
  last_graph_ = graphs_ && graphs_usable && graphs_->CanRun(chunks, all_logits);
  if (last_graph_) return graphs_->Run(chunks);
  const int bs = kv_cache_.block_size();
  const int num_seqs = static_cast<int>(chunks.size());
  int max_blocks = 1, max_q_len = 0, max_seq_len = 0;
  for (const auto& c : chunks) max_blocks = std::max(max_blocks, static_cast<int>(c.seq->block_table.size()));

  std::vector<int32_t> token_ids, id_source, positions, slot_mapping, logits_rows;
  std::vector<int32_t> query_start{0}, seq_lens, block_tables(static_cast<size_t>(num_seqs) * max_blocks, 0);
  int num_sampled = 0;  // rows of the previous step's ids that this step reads
  for (int b = 0; b < num_seqs; ++b) {
    const Sequence& s = *chunks[b].seq;
    const int begin = s.num_computed_tokens, end = begin + chunks[b].num_tokens;
    COROLLA_CHECK(chunks[b].num_tokens > 0 && end <= s.length() &&
                  static_cast<int>(s.block_table.size()) * bs >= end)
        << "sequence " << s.id << ": chunk [" << begin << ", " << end << ") with "
        << s.block_table.size() << " blocks";
    const int row = chunks[b].sampled_row;
    COROLLA_CHECK(row < 0 ? end <= s.num_tokens()
                          : chunks[b].num_tokens == 1 && begin == s.num_tokens() &&
                                row < sampled_ids_.dim(0))
        << "sequence " << s.id << ": chunk [" << begin << ", " << end << ") of " << s.num_tokens()
        << " host tokens, sampled row " << row;
    for (int p = begin; p < end; ++p) {
      if (row < 0) {
        token_ids.push_back(s.tokens[p]);
        id_source.push_back(static_cast<int32_t>(id_source.size()));
      } else {  // the previous step's token: gathered on the device below
        token_ids.push_back(0);
        id_source.push_back(-1 - row);
        num_sampled = std::max(num_sampled, row + 1);
      }
      positions.push_back(p);
      slot_mapping.push_back(s.block_table[p / bs] * bs + p % bs);
      if (all_logits || (p == end - 1 && end == s.length()))
        logits_rows.push_back(static_cast<int32_t>(token_ids.size()) - 1);
    }
    query_start.push_back(static_cast<int32_t>(token_ids.size()));
    seq_lens.push_back(end);
    std::copy(s.block_table.begin(), s.block_table.end(), block_tables.begin() + b * max_blocks);
    max_q_len = std::max(max_q_len, chunks[b].num_tokens);
    max_seq_len = std::max(max_seq_len, end);
  }
  const int64_t num_tokens = static_cast<int64_t>(token_ids.size());
  const int64_t num_rows = static_cast<int64_t>(logits_rows.size());

  for (int32_t& src : id_source)
    if (src < 0) src = static_cast<int32_t>(num_tokens) - 1 - src;  // row r -> num_tokens + r
  Tensor d_tokens = InputIds(token_ids, id_source, num_sampled);
  Tensor d_positions = ToDevice(positions, {num_tokens});
  Tensor d_query_start = ToDevice(query_start, {num_seqs + 1});
  Tensor d_seq_lens = ToDevice(seq_lens, {num_seqs});
  Tensor d_tables = ToDevice(block_tables, {num_seqs, max_blocks});
  Tensor d_slots = ToDevice(slot_mapping, {num_tokens});
  Tensor d_rows = ToDevice(logits_rows, {num_rows});

  ForwardBatch batch;
  batch.token_ids = d_tokens;
  batch.positions = d_positions;
  batch.attention = {d_query_start, d_seq_lens, d_tables, d_slots, max_q_len, max_seq_len};
  // Decodes are scheduled before new prompts (Engine::Schedule): the leading one-token chunks.
  while (batch.attention.num_decode_seqs < num_seqs &&
         chunks[batch.attention.num_decode_seqs].num_tokens == 1)
    ++batch.attention.num_decode_seqs;
  batch.logits_rows = d_rows;
  batch.ep_fixed_capacity = collective_ && fixed_step_;
  Tensor d_state_slots;
  if (kv_cache_.has_state()) {
    std::vector<int32_t> state_slots;
    for (const auto& c : chunks) {
      COROLLA_CHECK(c.seq->state_slot >= 0) << "sequence " << c.seq->id << " has no state slot";
      state_slots.push_back(c.seq->state_slot);
    }
    d_state_slots = ToDevice(state_slots, {num_seqs});
    batch.state_slots = d_state_slots;
    batch.linear_states = kv_cache_.state_views();
  }
  Tensor logits = backend_.Empty(DType::kF32, {num_rows, model_.config().vocab_size});
  if (num_tokens > 0) model_.Forward(batch, kv_cache_.views(), logits);
  return logits;
}

void ApplyPenalties(const Sequence& s, float* logits, int64_t vocab) {
  const PenaltyParams& p = s.penalties;
  if (!p.enabled()) return;
  std::unordered_map<int32_t, int> output_counts;
  for (int i = s.num_prompt_tokens; i < s.num_tokens(); ++i) ++output_counts[s.tokens[i]];
  if (p.repetition != 1.0f) {
    std::unordered_set<int32_t> seen(s.tokens.begin(), s.tokens.end());
    for (int32_t t : seen) {
      if (t < 0 || t >= vocab) continue;
      logits[t] = logits[t] > 0 ? logits[t] / p.repetition : logits[t] * p.repetition;
    }
  }
  for (const auto& [t, count] : output_counts) {
    if (t < 0 || t >= vocab) continue;
    logits[t] -= p.frequency * static_cast<float>(count) + p.presence;
  }
}

std::vector<TokenLogprob> TopLogprobs(const float* logprobs, int64_t vocab, int k) {
  k = static_cast<int>(std::min<int64_t>(k, vocab));
  std::vector<int32_t> ids(vocab);
  std::iota(ids.begin(), ids.end(), 0);
  auto before = [&](int32_t a, int32_t b) {
    return logprobs[a] > logprobs[b] || (logprobs[a] == logprobs[b] && a < b);
  };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), before);
  std::vector<TokenLogprob> top(k);
  for (int i = 0; i < k; ++i) top[i] = {ids[i], logprobs[ids[i]]};
  return top;
}

LaunchedStep ModelRunner::Launch(std::span<const ScheduledChunk> chunks) {
  Tensor logits = Execute(chunks, /*all_logits=*/false);
  LaunchedStep step;
  step.graph = last_graph_;
  step.row_of_chunk.assign(chunks.size(), -1);
  std::vector<SamplingParams> params;
  std::vector<uint64_t> steps;
  std::vector<int> chunk_of_row;
  bool needs_host = false;
  for (int i = 0; i < static_cast<int>(chunks.size()); ++i) {
    const Sequence& s = *chunks[i].seq;
    if (s.num_computed_tokens + chunks[i].num_tokens != s.length()) continue;
    step.row_of_chunk[i] = static_cast<int>(params.size());
    params.push_back(s.sampling);
    // The request's draw counter: tokens generated before this one, pending ones included.
    steps.push_back(static_cast<uint64_t>(s.num_generated() + s.num_pending));
    chunk_of_row.push_back(i);
    needs_host |= s.penalties.enabled() || s.num_logprobs >= 0;
  }
  const int64_t num_rows = static_cast<int64_t>(params.size());
  if (num_rows == 0) return step;
  COROLLA_CHECK(num_rows <= sampled_ids_.dim(0))
      << num_rows << " sequences sample in one step; the runner holds ids for " << sampled_ids_.dim(0);
  const TensorView ids = sampled_ids_.view().Slice(0, num_rows);
  if (!needs_host) {
    step.ids = backend_.SampleAsync(logits, params.data(), steps.data(), ids);
    return step;
  }
  // Penalties and logprobs run on the host; the CPU sampler is the CUDA sampler's twin, so a
  // row's token does not depend on which path it took.
  std::vector<int32_t> sampled(num_rows);
  step.host_sampled.resize(chunks.size());
  const int64_t vocab = model_.config().vocab_size;
  Tensor host = LogitsToHost(backend_, logits);
  float* rows = host.ptr<float>();
  std::vector<std::vector<float>> logprobs(num_rows);
  for (int64_t r = 0; r < num_rows; ++r) {
    const Sequence& s = *chunks[chunk_of_row[r]].seq;
    COROLLA_CHECK(s.num_pending == 0 || !s.penalties.enabled())
        << "sequence " << s.id << ": penalties need its last token on the host";
    float* row = rows + r * vocab;
    if (s.num_logprobs >= 0) {  // of the raw logits, as vLLM reports by default
      logprobs[r].resize(vocab);
      cpu::LogSoftmax(row, vocab, logprobs[r].data());
    }
    ApplyPenalties(s, row, vocab);
  }
  cpu::SampleBatch(rows, num_rows, vocab, params.data(), steps.data(), sampled.data());
  for (int64_t r = 0; r < num_rows; ++r) {
    const Sequence& s = *chunks[chunk_of_row[r]].seq;
    SampledToken& st = step.host_sampled[chunk_of_row[r]];
    st.token = sampled[r];
    if (s.num_logprobs < 0) continue;
    st.logprob = logprobs[r][sampled[r]];
    if (s.num_logprobs > 0) st.top_logprobs = TopLogprobs(logprobs[r].data(), vocab, s.num_logprobs);
  }
  backend_.CopyFromHost(sampled.data(), ids);  // where a next step's chunks would read them
  return step;
}

std::vector<SampledToken> ModelRunner::Collect(LaunchedStep& step) {
  if (!step.host_sampled.empty()) return std::move(step.host_sampled);
  std::vector<SampledToken> out(step.row_of_chunk.size());
  if (!step.ids) return out;  // nothing sampled
  const int32_t* ids = step.ids->Wait();
  for (size_t i = 0; i < out.size(); ++i)
    if (step.row_of_chunk[i] >= 0) out[i].token = ids[step.row_of_chunk[i]];
  return out;
}

Tensor LogitsToHost(Backend& backend, const Tensor& logits) {
  Tensor host = Tensor::Empty(logits.dtype(), logits.shape());
  backend.CopyToHost(logits, host.view().data);
  if (logits.dtype() == DType::kF32) return host;
  Tensor f32 = Tensor::Empty(DType::kF32, logits.shape());
  COROLLA_CHECK(logits.dtype() == DType::kBF16) << "logits dtype " << DTypeName(logits.dtype());
  const bf16* src = host.ptr<bf16>();
  for (int64_t i = 0; i < host.numel(); ++i) f32.ptr<float>()[i] = ToFloat(src[i]);
  return f32;
}

}  // namespace corolla

namespace corolla {

Status CheckTokenIds(const ModelConfig& config, std::span<const int32_t> ids) {
  if (static_cast<int64_t>(ids.size()) > config.max_position_embeddings)
    return OutOfRange(std::to_string(ids.size()) + " tokens exceed the model's max_position_embeddings (" +
                      std::to_string(config.max_position_embeddings) + ")");
  for (size_t i = 0; i < ids.size(); ++i)
    if (ids[i] < 0 || ids[i] >= config.vocab_size)
      return OutOfRange("token id " + std::to_string(ids[i]) + " at position " + std::to_string(i) +
                        " is outside the vocabulary [0, " + std::to_string(config.vocab_size) + ")");
  return Status::Ok();
}

Result<Tensor> ComputeLogits(Model& model, Backend& backend, const std::vector<int32_t>& ids) {
  const ModelConfig& config = model.config();
  if (ids.empty()) return InvalidArgument("no token ids");
  RETURN_IF_ERROR(CheckTokenIds(config, ids));
  constexpr int kBlockSize = 16;
  const int num_blocks = static_cast<int>((ids.size() + kBlockSize - 1) / kBlockSize);
  KvCache kv(backend, model.kv_cache_spec(), num_blocks, kBlockSize, model.state_spec(), 1);
  ModelRunner runner(model, backend, kv);
  Sequence s;
  s.tokens = ids;
  s.num_prompt_tokens = s.num_tokens();
  for (int b = 0; b < num_blocks; ++b) s.block_table.push_back(b);
  s.state_slot = kv.AllocateStateSlot();
  ScheduledChunk chunk{&s, s.num_tokens()};
  Tensor logits = runner.Execute({&chunk, 1}, /*all_logits=*/true);
  return LogitsToHost(backend, logits);
}

}  // namespace corolla
