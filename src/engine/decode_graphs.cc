#include "engine/decode_graphs.h"

#include <algorithm>

#include "base/logging.h"
#include "engine/model_runner.h"

namespace corolla {

DecodeGraphs::DecodeGraphs(Model& model, Backend& backend, KvCache& kv_cache,
                           TensorView sampled_ids, bool capture, int max_batch)
    : model_(model),
      backend_(backend),
      kv_cache_(kv_cache),
      sampled_ids_(sampled_ids),
      capture_(capture),
      max_blocks_per_seq_(MaxBlocksPerSeq(model.config().max_position_embeddings,
                                          kv_cache.block_size(), kv_cache.num_blocks())),
      max_batch_(std::max(1, max_batch)) {
  // A step samples at most one row a sequence of sampled_ids; CaptureAll runs its own sizes.
  const int rows = std::max(BatchBucket(std::min<int64_t>(max_batch_, sampled_ids.numel())),
                            kMaxCollectiveBatch);
  logits_ = backend_.Empty(DType::kF32, {rows, model_.config().vocab_size});
}

int DecodeGraphs::MaxBlocksPerSeq(int max_position_embeddings, int block_size, int num_blocks) {
  return std::min(num_blocks, (max_position_embeddings + block_size - 1) / block_size);
}

int DecodeGraphs::BatchBucket(int batch) {
  if (batch <= 16) return std::max(batch, 1);
  return batch <= 64 ? (batch + 7) / 8 * 8 : (batch + 31) / 32 * 32;
}

bool DecodeGraphs::CanRun(std::span<const ScheduledChunk> chunks, bool all_logits) const {
  const int n = static_cast<int>(chunks.size());
  if (n == 0 || n > (frozen_ ? kMaxCollectiveBatch : max_batch_) || BatchBucket(n) > logits_.dim(0))
    return false;
  for (const auto& c : chunks) {
    const Sequence& s = *c.seq;
    if (c.num_tokens != 1 || static_cast<int>(s.block_table.size()) > max_blocks_per_seq_) return false;
    if (!all_logits && s.num_computed_tokens + 1 != s.length()) return false;
  }
  return !(frozen_ && capture_) || graphs_.count(Key(chunks)) > 0;
}

int DecodeGraphs::ClampContext(int context) const {
  return std::min(context, max_blocks_per_seq_ * kv_cache_.block_size());
}

std::pair<int, int> DecodeGraphs::Key(std::span<const ScheduledChunk> chunks) const {
  int max_seq_len = 1;
  for (const auto& c : chunks) max_seq_len = std::max(max_seq_len, c.seq->num_computed_tokens + 1);
  return {BatchBucket(static_cast<int>(chunks.size())), ClampContext(ContextBucket(max_seq_len))};
}

int DecodeGraphs::ContextBucket(int max_seq_len) {
  int context = kMinContext;
  while (context < max_seq_len) context *= 2;
  return context;
}

bool DecodeGraphs::Capture(Bucket& bucket, std::pair<int, int> key) {
  Upload(bucket, {});
  // Holds nothing of this call's frame: a backend may keep fn (a test's stands in for a graph).
  auto graph =
      backend_.CaptureGraph([this, &bucket, context = key.second] { Forward(bucket, context); });
  if (!graph.ok()) {
    LOG(WARNING) << "decode graph (batch " << key.first << ", context " << key.second
                 << ") not captured, its steps run eagerly: " << graph.status().ToString();
    uncaptured_.insert(key);
    return false;
  }
  graphs_.emplace(key, std::move(*graph));
  return true;
}

int DecodeGraphs::CaptureAll(int max_context) {
  int num_forwards = 0;
  for (int rows = 1; rows <= kMaxCollectiveBatch; ++rows) {
    Bucket& bucket = GetBucket(rows);
    for (int context = kMinContext;; context *= 2) {
      const std::pair<int, int> key(rows, ClampContext(context));
      if (capture_ && graphs_.count(key) == 0) {
        // Its warm-up is the one forward that runs. Every rank must replay the same graphs.
        COROLLA_CHECK(Capture(bucket, key))
            << "DP-EP start-up: a decode graph failed to capture (the warning above says why); "
               "lower --gpu-memory-utilization, or --ep-capacity 0 runs without graphs";
      } else {
        Upload(bucket, {});
        Forward(bucket, key.second);
      }
      ++num_forwards;
      if (context >= max_context) break;
    }
  }
  frozen_ = true;
  return num_forwards;
}

bool DecodeGraphs::CaptureNext(int max_context) {
  if (!capture_ || frozen_ || warmed_) return false;
  const int max_rows = std::min<int>(
      BatchBucket(std::min<int64_t>(max_batch_, sampled_ids_.numel())), logits_.dim(0));
  for (int rows = 1; rows <= max_rows; rows = BatchBucket(rows + 1)) {
    for (int context = kMinContext;; context *= 2) {
      const std::pair<int, int> key(rows, ClampContext(context));
      if (!graphs_.count(key) && !uncaptured_.count(key)) {
        // A failed capture (out of device memory, most likely) ends the warm-up: the rest would
        // take more memory still. Steps capture their own buckets later, or run eagerly.
        if (Capture(GetBucket(rows), key)) return true;
        warmed_ = true;
        return false;
      }
      if (context >= max_context) break;
    }
  }
  warmed_ = true;
  return false;
}

DecodeGraphs::Bucket& DecodeGraphs::GetBucket(int rows) {
  auto it = buckets_.find(rows);
  if (it != buckets_.end()) return it->second;
  Bucket& b = buckets_[rows];
  b.layout = {rows, max_blocks_per_seq_, sampled_ids_.numel()};
  b.host.assign(b.layout.upload_size(), 0);
  for (int i = 0; i <= rows; ++i) b.host[b.layout.query_start() + i] = i;
  for (int i = 0; i < rows; ++i) b.host[b.layout.logits_rows() + i] = i;
  b.meta = backend_.Empty(DType::kI32, {b.layout.size()});
  b.logits = logits_.view().Slice(0, rows);
  return b;
}

void DecodeGraphs::Upload(Bucket& bucket, std::span<const ScheduledChunk> chunks) {
  const Layout& l = bucket.layout;
  const int bs = kv_cache_.block_size();
  int32_t* h = bucket.host.data();
  for (int64_t b = 0; b < l.rows; ++b) {
    if (b < static_cast<int64_t>(chunks.size())) {
      const Sequence& s = *chunks[b].seq;
      const int p = s.num_computed_tokens, row = chunks[b].sampled_row;
      COROLLA_CHECK(row < 0 ? p < s.num_tokens() : p == s.num_tokens() && row < l.num_sampled)
          << "sequence " << s.id << ": decode at " << p << " of " << s.num_tokens() << " host tokens, sampled row "
          << row;
      h[l.host_tokens() + b] = row < 0 ? s.tokens[p] : 0;
      h[l.token_source() + b] = static_cast<int32_t>(row < 0 ? b : l.rows + row);
      h[l.positions() + b] = p;
      h[l.seq_lens() + b] = p + 1;
      h[l.slots() + b] = s.block_table[p / bs] * bs + p % bs;
      h[l.state_slots() + b] = s.state_slot;
      std::copy(s.block_table.begin(), s.block_table.end(), h + l.tables() + b * l.max_blocks);
    } else {
      h[l.host_tokens() + b] = 0;
      h[l.token_source() + b] = static_cast<int32_t>(b);
      h[l.positions() + b] = 0;
      h[l.seq_lens() + b] = 1;
      h[l.slots() + b] = -1;
      h[l.state_slots() + b] = -1;
      h[l.tables() + b * l.max_blocks] = 0;
    }
  }
  backend_.CopyFromHost(h, bucket.meta.view().Slice(0, l.upload_size()));
}

void DecodeGraphs::Forward(Bucket& bucket, int max_seq_len) {
  const Layout& l = bucket.layout;
  const TensorView meta = bucket.meta;
  auto part = [&](int64_t offset, int64_t n) { return meta.Slice(offset, offset + n); };
  // Input ids: [host ids | previous step's sampled ids] gathered by token_source.
  const int64_t num_sources = l.rows + l.num_sampled;
  backend_.Copy(sampled_ids_.Reshape({l.num_sampled, 1}),
                part(l.sampled(), l.num_sampled).Reshape({l.num_sampled, 1}));
  backend_.GatherRows(part(l.host_tokens(), num_sources).Reshape({num_sources, 1}),
                      part(l.token_source(), l.rows),
                      part(l.tokens(), l.rows).Reshape({l.rows, 1}));
  ForwardBatch batch;
  batch.token_ids = part(l.tokens(), l.rows);
  batch.positions = part(l.positions(), l.rows);
  batch.attention = {part(l.query_start(), l.rows + 1),
                     part(l.seq_lens(), l.rows),
                     part(l.tables(), l.rows * l.max_blocks).Reshape({l.rows, l.max_blocks}),
                     part(l.slots(), l.rows),
                     /*max_q_len=*/1,
                     max_seq_len};
  batch.logits_rows = part(l.logits_rows(), l.rows);
  // DP-EP replays only CaptureAll's graphs (at most kMaxCollectiveBatch rows), in fixed-capacity
  // steps; other runners have no exchange.
  batch.ep_fixed_capacity = true;
  if (kv_cache_.has_state()) {
    batch.state_slots = part(l.state_slots(), l.rows);
    batch.linear_states = kv_cache_.state_views();
  }
  model_.Forward(batch, kv_cache_.views(), bucket.logits);
}

Tensor DecodeGraphs::Run(std::span<const ScheduledChunk> chunks) {
  const int num_seqs = static_cast<int>(chunks.size());
  const std::pair<int, int> key = Key(chunks);
  Bucket& bucket = GetBucket(key.first);
  if (!capture_) {
    Upload(bucket, chunks);
    Forward(bucket, key.second);
  } else {
    auto it = graphs_.find(key);
    if (it == graphs_.end() && !uncaptured_.count(key)) {
      COROLLA_CHECK(!frozen_) << "decode graph (batch " << key.first << ", context " << key.second
                              << ") was not captured at start-up";
      if (Capture(bucket, key)) it = graphs_.find(key);
    }
    Upload(bucket, chunks);
    if (it != graphs_.end())
      it->second->Replay();
    else
      Forward(bucket, key.second);  // its capture failed: the same forward, eagerly
  }
  std::shared_ptr<void> owner = std::make_shared<Tensor>(logits_);
  return Tensor::Adopt(bucket.logits.Slice(0, num_seqs), std::move(owner));
}

}  // namespace corolla
