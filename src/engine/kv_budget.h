// Sizing the KV cache from a fraction of the device's memory, like vLLM's
// --gpu-memory-utilization: this instance may use fraction × total memory; what is in use when
// it is measured (the loaded weights, other processes) and an estimate of one step's
// activations are taken off, and the rest holds KV blocks. Call after the weights are loaded.
// Stateless; the backend's thread.
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.h"
#include "model/config.h"

namespace corolla {

struct KvBudget {
  int64_t total_bytes = 0;          // device memory
  int64_t used_bytes = 0;           // in use at measurement (weights, other processes)
  int64_t activation_bytes = 0;     // reserved for one step's activations (an estimate)
  int64_t graph_bytes = 0;  // reserved for the decode graphs (an estimate; 0 without graphs)
  int64_t kv_cache_bytes = 0;       // what the KV cache may take
  // "KV cache 12.3 GiB = 0.9 × 80.0 GiB − 40.1 GiB in use − 1.2 GiB activations − 0.4 GiB decode
  // graphs"
  std::string ToString() const;
};

// Estimated peak activation bytes of one step of up to max_batch_tokens tokens and max_num_seqs
// sampled rows (hidden-state buffers, MoE intermediates, float32 logits), plus a fixed slack.
int64_t EstimateActivationBytes(const ModelConfig& config, int max_batch_tokens, int max_num_seqs);

// Estimated device memory of the decode graphs a serving engine captures (DecodeGraphs: a graph
// per batch bucket up to max_num_seqs and context bucket up to max_model_len), which the driver
// takes beside the allocator's pools. Measured on an H200 (Qwen3-30B-A3B, session 33): 198
// graphs of 48 layers took 336 MiB, ~36 KiB a layer a graph; this counts 40.
int64_t EstimateDecodeGraphBytes(const ModelConfig& config, int max_num_seqs, int max_model_len);

// max_model_len: the engine's longest sequence (0: the model's). The decode graphs' estimate is
// reserved where the backend captures graphs.
// Errors: a fraction outside (0, 1]; a backend that does not report its memory (Unsupported);
// nothing left for the KV cache (ResourceExhausted, naming the numbers).
Result<KvBudget> KvBudgetForUtilization(Backend& backend, const ModelConfig& config,
                                        double fraction, int max_batch_tokens, int max_num_seqs,
                                        int max_model_len = 0);

// The KV cache bytes an engine gets: by KvBudgetForUtilization when `fraction` > 0 (logging the
// budget), else `fixed_bytes`; also `fixed_bytes`, with a warning, where the backend does not
// report its memory. Shared by `corolla serve` and `bench serve --in-process`, so both size alike.
Result<int64_t> ResolveKvCacheBytes(Backend& backend, const ModelConfig& config, double fraction,
                                    int64_t fixed_bytes, int max_batch_tokens, int max_num_seqs,
                                    int max_model_len);

}  // namespace corolla
