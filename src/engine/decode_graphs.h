// DecodeGraphs: the model forward of pure-decode steps (one token per sequence) replayed as
// backend graphs, captured on first use per (batch bucket, context bucket). Every batch size
// 1, 2, 3, ... 16 is its own bucket, then multiples of 8 and of 32 (BatchBucket); each owns a
// persistent device buffer for the step's metadata, which every graph of that bucket reads, and
// all write their logits into one buffer, so a step only copies fresh metadata there and replays.
// A serving engine also captures them ahead of use while it is idle (CaptureNext), so that the
// requests after start-up seldom wait for a capture.
// Under DP-EP (every forward collective over the ranks) the graphs are all captured at start-up by
// CaptureAll, the same list in the same order on every rank, and Run never captures after it.
// Captures and start-up forwards run rows of padding: token 0 at position 0, cache slot -1 (no KV
// write), state slot -1 (no state update), one key read from block 0; their logits are ignored.
// Context buckets (powers of two) fix the attention's host-side plan (max_seq_len) that a graph
// bakes in. A graph begins by gathering its input ids from the uploaded host ids and the runner's
// sampled-ids buffer (the previous step's tokens, which the host may not have yet), so async
// scheduling replays graphs too. Owned by a ModelRunner; not thread-safe.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "engine/kv_cache.h"
#include "engine/sequence.h"
#include "model/model.h"

namespace corolla {

struct ScheduledChunk;

class DecodeGraphs {
 public:
  // Steps of up to max_batch sequences replay graphs (kMaxBatch unless the constructor is told
  // otherwise), larger ones run eagerly. Session 5 found graphs slower at batch 64 (ITL 39.8 ->
  // 45.5 ms), the split-KV plan then sized for the bucket's keys; the attention now takes its
  // split ranges from the device-side lengths and plans the same split count for a 1.1k and a
  // 2048-key bucket at that size. Session 29: steps of 128 / 186 sequences (mean) 1.4-1.9%
  // faster as graphs (Qwen3-30B-A3B, H200).
  static constexpr int kMaxBatch = 256;
  // DP-EP's start-up (CaptureAll) captures batches of up to this many, the rows its fixed-size
  // exchange must hold (--ep-capacity's default and floor); larger steps run eagerly there.
  static constexpr int kMaxCollectiveBatch = 16;
  static constexpr int kMinContext = 256;  // smallest context bucket (tokens)

  // sampled_ids: the runner's device buffer of the last step's sampled ids (one a sequence a step
  // may hold), which must keep its address. capture false: the same padded buckets and buffers,
  // run eagerly (the replay's reference). max_batch: the most sequences a graph step runs.
  DecodeGraphs(Model& model, Backend& backend, KvCache& kv_cache, TensorView sampled_ids,
               bool capture, int max_batch = kMaxBatch);

  // Whether a step of these chunks is pure decode that fits a bucket: every chunk one token
  // that ends its sequence (or all_logits), at most max_batch chunks (kMaxCollectiveBatch
  // after CaptureAll), block tables that fit;
  // after CaptureAll, also that its graph was captured.
  bool CanRun(std::span<const ScheduledChunk> chunks, bool all_logits) const;
  // Collective start-up (DP-EP): for batch buckets 1, 2, 3, ... kMaxCollectiveBatch and context
  // buckets kMinContext, 2 kMinContext, ... up to the first >= max_context, in that order, one
  // forward of padding each (the capture's warm-up; with capture false, the eager bucket run),
  // whatever this rank's KV cache: a context bucket clamped onto one already captured still runs
  // its forward. Every rank passing the same max_context runs the same number of forwards, each
  // with ForwardBatch::ep_fixed_capacity. Afterwards Run never captures. Returns the forwards.
  int CaptureAll(int max_context);
  // Single-process serving, while no step runs: captures the first (batch bucket, context
  // bucket) of the warm-up order not captured yet and returns true, or returns false when every
  // one is (or graphs run eagerly, or after CaptureAll), and from the first capture that fails
  // on (the backend out of memory for graphs, say: the next would need more). The order: batch
  // buckets 1, 2, ... up to max_batch, small first (where a capture's cost weighs most against the
  // step it delays), each over the context buckets kMinContext, 2 kMinContext, ... up to the first
  // >= max_context.
  bool CaptureNext(int max_context);
  // Float32 logits [B, V], one row per chunk: a view of the buffer every bucket writes,
  // overwritten by the next Run.
  Tensor Run(std::span<const ScheduledChunk> chunks);

  int num_graphs() const { return static_cast<int>(graphs_.size()); }
  // The rows a step of `batch` sequences runs with: the batch itself up to 16, then the next
  // multiple of 8 up to 64, then of 32. Buckets of powers of two padded a step of 3 sequences to
  // 4 rows, and a padding row runs the whole model: its token routes to experts that no real row
  // needs, whose weights the step then reads (an MoE layer's bytes are mostly the distinct
  // experts'). Past 16 sequences the real rows read most experts already, and the padding rows
  // share one routing; past 64 coarser buckets keep the captures few (each bucket is a graph a
  // context bucket, captured on first use).
  static int BatchBucket(int batch);
  // The context bucket a step of keys up to max_seq_len is planned on (before the cache's clamp):
  // kMinContext, doubled until it holds them.
  static int ContextBucket(int max_seq_len);
  // The most blocks a sequence can hold: the model's maximum length, or the whole pool if that
  // is smaller. Context buckets stop at this many blocks' keys (`bench decode --plan-bucket` too).
  static int MaxBlocksPerSeq(int max_position_embeddings, int block_size, int num_blocks);

 private:
  // Offsets (i32 elements) into a bucket's one metadata buffer of `rows` rows. The host uploads
  // everything before sampled(); the graph fills sampled() and tokens().
  struct Layout {
    int64_t rows, max_blocks, num_sampled;
    int64_t tokens() const { return 0; }  // gathered input ids
    int64_t positions() const { return rows; }
    int64_t query_start() const { return 2 * rows; }  // rows + 1
    int64_t seq_lens() const { return 3 * rows + 1; }
    int64_t slots() const { return 4 * rows + 1; }
    int64_t logits_rows() const { return 5 * rows + 1; }
    int64_t state_slots() const { return 6 * rows + 1; }
    // Row b's id is [host_tokens() | sampled()][token_source()[b]].
    int64_t token_source() const { return 7 * rows + 1; }
    int64_t tables() const { return 8 * rows + 1; }  // [rows, max_blocks]
    int64_t host_tokens() const { return tables() + rows * max_blocks; }
    int64_t sampled() const { return host_tokens() + rows; }  // right behind host_tokens()
    int64_t upload_size() const { return sampled(); }
    int64_t size() const { return sampled() + num_sampled; }
  };
  struct Bucket {
    Layout layout;
    std::vector<int32_t> host;  // staging, same layout; table entries past a row's end stay valid ids
    Tensor meta;                // device i32 [layout.size()]
    TensorView logits;          // f32 [rows, V]: the first rows of logits_
  };

  Bucket& GetBucket(int rows);
  // The (batch bucket, context bucket) a step of these chunks runs in.
  std::pair<int, int> Key(std::span<const ScheduledChunk> chunks) const;
  int ClampContext(int context) const;
  // Warm-up and capture over padding only: no KV or state of a real sequence is touched. False
  // (with a warning) when the backend could not capture: the key's steps then run eagerly.
  bool Capture(Bucket& bucket, std::pair<int, int> key);
  // Fills the bucket's staging metadata from the chunks (rows past them padded) and uploads it.
  void Upload(Bucket& bucket, std::span<const ScheduledChunk> chunks);
  void Forward(Bucket& bucket, int max_seq_len);

  Model& model_;
  Backend& backend_;
  KvCache& kv_cache_;
  const TensorView sampled_ids_;
  const bool capture_;
  const int max_blocks_per_seq_;
  const int max_batch_;
  // f32 [rows, V] for the largest bucket: one step runs at a time, and its sampler reads the
  // logits before the next step is enqueued (a bucket each: 243 MB for buckets up to 64 rows).
  Tensor logits_;
  bool frozen_ = false;  // CaptureAll ran: no more captures
  bool warmed_ = false;  // CaptureNext found every graph of its order captured, or one failed
  std::map<int, Bucket> buckets_;  // rows -> bucket (node-based: addresses stay)
  std::map<std::pair<int, int>, std::unique_ptr<Backend::Graph>> graphs_;  // (rows, context)
  std::set<std::pair<int, int>> uncaptured_;  // whose capture failed: run eagerly, not retried
};

}  // namespace corolla
