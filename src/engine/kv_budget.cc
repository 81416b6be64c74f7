#include "engine/kv_budget.h"

#include <algorithm>
#include <cstdio>

#include "base/logging.h"
#include "engine/decode_graphs.h"

namespace corolla {

namespace {

std::string GiB(int64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return b;
}

}  // namespace

std::string KvBudget::ToString() const {
  double fraction =
      total_bytes
          ? static_cast<double>(kv_cache_bytes + used_bytes + activation_bytes + graph_bytes) /
                total_bytes
          : 0;
  char b[64];
  std::snprintf(b, sizeof(b), "%.3g", fraction);
  return "KV cache " + GiB(kv_cache_bytes) + " = " + b + " x " + GiB(total_bytes) + " - " +
         GiB(used_bytes) + " in use - " + GiB(activation_bytes) + " activations" +
         (graph_bytes > 0 ? " - " + GiB(graph_bytes) + " decode graphs" : "");
}

int64_t EstimateActivationBytes(const ModelConfig& config, int max_batch_tokens, int max_num_seqs) {
  // Per token: a few hidden-sized buffers (residual, normed, attention in/out, q/k/v) and the
  // widest MLP/MoE intermediate (gate and up of every routed expert of the token); per sampled
  // row: its logits and their softmax, and the GPU sampler's scratch over the vocabulary (the
  // full sort's keys, ids and prefix sums, double-buffered: 24 bytes an entry; rows without a
  // top_k take 16). Four bytes each covers float32 and bf16 alike.
  const int64_t t = max_batch_tokens;
  const int64_t width = 2 * std::max<int64_t>(config.intermediate_size,
                                              int64_t{config.num_experts_per_token} * config.moe_intermediate_size);
  const int64_t per_token = 16 * int64_t{config.hidden_size} + 2 * width;
  const int64_t per_row = (2 + 6) * int64_t{config.vocab_size};
  constexpr int64_t kSlack = int64_t{256} << 20;  // library workspaces, allocator rounding
  return 4 * (t * per_token + int64_t{max_num_seqs} * per_row) + kSlack;
}

int64_t EstimateDecodeGraphBytes(const ModelConfig& config, int max_num_seqs, int max_model_len) {
  constexpr int64_t kBytesPerLayer = int64_t{40} << 10;
  const int max_batch = std::min(std::max(max_num_seqs, 1), DecodeGraphs::kMaxBatch);
  int64_t batch_buckets = 0;
  for (int rows = 1; rows <= max_batch; rows = DecodeGraphs::BatchBucket(rows + 1)) ++batch_buckets;
  int64_t context_buckets = 1;
  for (int context = DecodeGraphs::kMinContext; context < max_model_len; context *= 2)
    ++context_buckets;
  return batch_buckets * context_buckets * config.num_layers * kBytesPerLayer;
}

Result<KvBudget> KvBudgetForUtilization(Backend& backend, const ModelConfig& config,
                                        double fraction, int max_batch_tokens, int max_num_seqs,
                                        int max_model_len) {
  if (!(fraction > 0 && fraction <= 1))
    return InvalidArgument("the memory utilization must be in (0, 1], got " + std::to_string(fraction));
  ASSIGN_OR_RETURN(Backend::MemoryInfo memory, backend.QueryMemory());
  KvBudget b;
  b.total_bytes = memory.total_bytes;
  b.used_bytes = memory.total_bytes - memory.free_bytes;
  b.activation_bytes = EstimateActivationBytes(config, max_batch_tokens, max_num_seqs);
  if (backend.supports_graphs())
    b.graph_bytes = EstimateDecodeGraphBytes(
        config, max_num_seqs, max_model_len > 0 ? max_model_len : config.max_position_embeddings);
  b.kv_cache_bytes = static_cast<int64_t>(fraction * static_cast<double>(b.total_bytes)) -
                     b.used_bytes - b.activation_bytes - b.graph_bytes;
  if (b.kv_cache_bytes <= 0)
    return ResourceExhausted(
        "no memory left for the KV cache: " + std::to_string(fraction) + " x " +
        GiB(b.total_bytes) + " is less than the " + GiB(b.used_bytes) + " in use plus " +
        GiB(b.activation_bytes) + " for activations and " + GiB(b.graph_bytes) +
        " for decode graphs; raise the utilization or lower --max-batch-tokens");
  return b;
}

Result<int64_t> ResolveKvCacheBytes(Backend& backend, const ModelConfig& config, double fraction,
                                    int64_t fixed_bytes, int max_batch_tokens, int max_num_seqs,
                                    int max_model_len) {
  if (fraction <= 0) return fixed_bytes;
  Result<KvBudget> budget = KvBudgetForUtilization(backend, config, fraction, max_batch_tokens,
                                                   max_num_seqs, max_model_len);
  if (budget.ok()) {
    LOG(INFO) << "--gpu-memory-utilization " << fraction << ": " << budget->ToString();
    return budget->kv_cache_bytes;
  }
  if (budget.status().code() != StatusCode::kUnsupported) return budget.status();
  LOG(WARNING) << budget.status().message() << "; sizing the KV cache by --kv-cache-memory";
  return fixed_bytes;
}

}  // namespace corolla
