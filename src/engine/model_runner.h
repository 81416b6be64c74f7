// ModelRunner: turns the scheduler's chunks into one flat batch (token ids, positions, block
// tables, slot mapping), runs the model, and samples. Plan on the host, run on the device: the
// metadata is built in host memory and copied to the backend in one place. Pure-decode steps
// may instead replay graphs captured per batch-size bucket (DecodeGraphs). Launch returns
// before the sampled ids reach the host; they stay in a device buffer of the runner, from which
// the next step's chunks may take their input token without the host knowing it. Not
// thread-safe.
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
  // >= 0: the chunk is the one token that the previously launched step sampled for this
  // sequence, in this row of its ids, and that is not on the host yet (seq->num_pending > 0).
  int sampled_row = -1;
};

// The token sampled for one chunk, with its logprob and the top alternatives when asked for.
struct SampledToken {
  int32_t token = -1;
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;  // most likely first, ties by lowest id
};

// A step that ModelRunner::Launch has enqueued; Collect gives its tokens.
struct LaunchedStep {
  std::vector<int> row_of_chunk;             // row of each chunk in the sampled ids; -1 mid-prefill
  std::unique_ptr<Backend::PendingIds> ids;  // sampled on the device, on their way to the host
  std::vector<SampledToken> host_sampled;    // or sampled on the host already: one per chunk
  bool graph = false;                        // the forward ran through DecodeGraphs
};

// Applies s.penalties to one row of logits[vocab] in place (see PenaltyParams).
void ApplyPenalties(const Sequence& s, float* logits, int64_t vocab);
// The k most likely tokens of a log-softmax row, most likely first (ties by lowest id).
std::vector<TokenLogprob> TopLogprobs(const float* logprobs, int64_t vocab, int k);

// Decode steps through graphs: kAuto is on where the backend captures graphs (CUDA) unless
// COROLLA_CUDA_GRAPHS=0, and off for MLA models (their decompressed attention path reads
// metadata on the host). kBucketsEager runs the padded buckets without capturing (on any
// backend), the replay's bit-for-bit reference in tests.
enum class DecodeGraphMode { kAuto, kOff, kOn, kBucketsEager };

class ModelRunner {
 public:
  // max_num_seqs: the most chunks one step may sample (rows of the sampled-ids buffer).
  // collective (DP-EP serving: every forward is collective over the ranks): decode graphs are
  // made only by CaptureDecodeGraphs and replayed only in steps SetFixedCapacityStep allows.
  ModelRunner(Model& model, Backend& backend, KvCache& kv_cache,
              DecodeGraphMode graph_mode = DecodeGraphMode::kAuto, int max_num_seqs = 256,
              bool collective = false);
  ~ModelRunner();

  // Collective runners: whether the next steps' forwards take the fixed-capacity exchange
  // (ForwardBatch::ep_fixed_capacity), which decode graph replays need; every rank sets the same
  // before each step. Off (the default): eager forwards through the sized exchange.
  void SetFixedCapacityStep(bool fixed) { fixed_step_ = fixed; }
  // Collective start-up: DecodeGraphs::CaptureAll (0 forwards when graphs are off).
  // Until it runs, a collective runner runs every step eagerly.
  int CaptureDecodeGraphs(int max_context) {
    captured_ = true;
    return graphs_ ? graphs_->CaptureAll(max_context) : 0;
  }

  // Single-process serving, while no step is in flight: DecodeGraphs::CaptureNext; false when
  // graphs are off or collective, or all are captured.
  bool WarmDecodeGraph(int max_context) {
    return graphs_ && !collective_ && graphs_->CaptureNext(max_context);
  }

  // Runs the chunks and returns float32 logits (backend memory): one row per token of
  // every chunk when `all_logits`, else one row per chunk that reaches the end of its sequence,
  // in chunk order. Does not advance num_computed_tokens (the caller does). Read the logits
  // before the next Execute: a replayed step's live in a buffer the next one reuses.
  Tensor Execute(std::span<const ScheduledChunk> chunks, bool all_logits);

  // Execute, then sample one token for every chunk that reaches the end of its sequence (its
  // length, pending tokens included), without waiting for the device when no row needs the
  // host: penalties and logprobs are computed there, from the logits and from every earlier
  // token, so such a row requires seq->num_pending == 0 and makes the step synchronous.
  // The sampled ids replace the previous step's in the runner's device buffer.
  LaunchedStep Launch(std::span<const ScheduledChunk> chunks);
  // Waits for a launched step's tokens: one result per chunk, token -1 mid-prefill.
  std::vector<SampledToken> Collect(LaunchedStep& step);
  std::vector<SampledToken> ExecuteAndSample(std::span<const ScheduledChunk> chunks) {
    LaunchedStep step = Launch(chunks);
    return Collect(step);
  }

  // Null when decode graphs are off.
  const DecodeGraphs* decode_graphs() const { return graphs_.get(); }

 private:
  Tensor ToDevice(const std::vector<int32_t>& host, Shape shape);
  // Input ids [T] on the device: host ids, with the chunks whose token is still on the device
  // gathered from sampled_ids_ (source[t] = T + row for those, else t).
  Tensor InputIds(const std::vector<int32_t>& host, const std::vector<int32_t>& source, int num_sampled);

  Model& model_;
  Backend& backend_;
  KvCache& kv_cache_;
  Tensor sampled_ids_;  // [max_num_seqs] i32 on the device: the last launched step's ids
  std::unique_ptr<DecodeGraphs> graphs_;
  const bool collective_;
  bool fixed_step_ = false;
  bool captured_ = false;  // CaptureDecodeGraphs ran
  bool last_graph_ = false;  // the last Execute ran through graphs_
};

// Copies logits (any backend) to a host float32 tensor.
Tensor LogitsToHost(Backend& backend, const Tensor& logits);

}  // namespace corolla

namespace corolla {

// Logits [L, vocab] (host float32) of every position of `ids`, from one prefill through a
// KV cache of its own. Errors name ids outside the vocabulary and sequences longer than the
// model's max_position_embeddings. The in-process twin of `corolla logits`.
Result<Tensor> ComputeLogits(Model& model, Backend& backend, const std::vector<int32_t>& ids);
// OutOfRange naming the problem when `ids` are longer than the model's positions or hold an id
// outside its vocabulary.
Status CheckTokenIds(const ModelConfig& config, std::span<const int32_t> ids);

}  // namespace corolla
