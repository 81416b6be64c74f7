// ModelRunner: turns the scheduler's chunks into one flat batch (token ids, positions, block
// tables, slot mapping), runs the model, and samples. Plan on the host, run on the device: the
// metadata is built in host memory and copied to the backend in one place. Pure-decode steps
// may instead replay graphs captured per batch-size bucket (DecodeGraphs). Not thread-safe.
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "engine/decode_graphs.h"

#include "engine/kv_cache.h"
#include "engine/sequence.h"
#include "model/model.h"

namespace corolla {

// Tokens [seq->num_computed_tokens, + num_tokens) of one sequence; their blocks are allocated.
struct ScheduledChunk {
  Sequence* seq = nullptr;
  int num_tokens = 0;
};

// The token sampled for one chunk, with its logprob and the top alternatives when asked for.
struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;  // most likely first, ties by lowest id
};

// Applies s.penalties to one row of logits[vocab] in place (see PenaltyParams).
void ApplyPenalties(const Sequence& s, float* logits, int64_t vocab);
// The k most likely tokens of a log-softmax row, most likely first (ties by lowest id).
std::vector<TokenLogprob> TopLogprobs(const float* logprobs, int64_t vocab, int k);

// Decode steps through graphs: kAuto is on where the backend captures graphs (CUDA) unless
// COROLLA_CUDA_GRAPHS=0, and off for MLA models (their decompressed attention path reads
// metadata on the host). kBucketsEager runs the padded buckets without capturing, the
// replay's bit-for-bit reference in tests.
enum class DecodeGraphMode { kAuto, kOff, kOn, kBucketsEager };

class ModelRunner {
 public:
  ModelRunner(Model& model, Backend& backend, KvCache& kv_cache,
              DecodeGraphMode graph_mode = DecodeGraphMode::kAuto);
  ~ModelRunner();

  // Runs the chunks and returns float32 logits (backend memory): one row per token of
  // every chunk when `all_logits`, else one row per chunk that reaches the end of its sequence,
  // in chunk order. Does not advance num_computed_tokens (the caller does). Read the logits
  // before the next Execute: a replayed step's live in a buffer the next one reuses.
  Tensor Execute(std::span<const ScheduledChunk> chunks, bool all_logits);

  // Execute, then sample one token for every chunk that reaches the end of its sequence,
  // applying the sequence's penalties and computing its logprobs when it asks for them.
  // Returns one result per chunk; token -1 for chunks in the middle of a prefill.
  std::vector<SampledToken> ExecuteAndSample(std::span<const ScheduledChunk> chunks);

  // Null when decode graphs are off.
  const DecodeGraphs* decode_graphs() const { return graphs_.get(); }

 private:
  Tensor ToDevice(const std::vector<int32_t>& host, Shape shape);

  Model& model_;
  Backend& backend_;
  KvCache& kv_cache_;
  std::unique_ptr<DecodeGraphs> graphs_;
};

// Copies logits (any backend) to a host float32 tensor.
Tensor LogitsToHost(Backend& backend, const Tensor& logits);

}  // namespace corolla

namespace corolla {

// Logits [L, vocab] (host float32) of every position of `ids`, from one prefill through a
// KV cache of its own. Errors name ids outside the vocabulary and sequences longer than the
// model's max_position_embeddings. The in-process twin of `corolla logits`.
Result<Tensor> ComputeLogits(Model& model, Backend& backend, const std::vector<int32_t>& ids);

}  // namespace corolla
