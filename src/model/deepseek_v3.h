// DeepSeek-V3: multi-head latent attention (MLA) and group-limited sigmoid routing with shared
// experts, after `first_k_dense_replace` dense layers. The KV cache holds one latent per token
// (kv_lora_rank normed dims + the roped key dims); prefill attends in the decompressed
// multi-head form, decode with the up-projections absorbed into the query and the output.
// Tensor parallelism (ModelShard): each rank runs its share of the attention heads (q_b, kv_b
// and o_proj split by head, the o_proj outputs all-reduced) over the whole latent, which all
// heads share, so the latent projections and the KV cache are the same on every rank; dense
// MLPs and shared experts are split by intermediate column, routed experts over the same ranks
// (TP-EP), one all-reduce per MLP/MoE block. DP-EP (--dp D --ep D, tp 1): each rank attends to
// its own sequences with all heads and its own latent cache, dense layers and shared experts
// whole; only the routed experts are split (E / D each). Tokens are routed on their own rank
// and go through an EpExchange to their experts' ranks and back; the shared experts run locally
// and are added after the combine. A forward with no tokens joins every MoE layer's exchange.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/safetensors.h"

namespace corolla {

// How MLA attends: kAuto decompresses for batches with a prefill chunk and absorbs for pure
// decode batches; the other two force one form (tests compare them).
enum class MlaMode { kAuto, kDecompressed, kAbsorbed };

// With a shard, only this rank's part of each weight is read (see model/model.h).
Result<std::unique_ptr<Model>> LoadDeepseekV3(const ModelConfig& config, const Checkpoint& checkpoint,
                                              Backend& backend, const ModelShard& shard = {});
// Multi-token-prediction modules loaded with the model (0 for other models).
int NumMtpModules(const Model& model);
// Forces the attention form of a model loaded by LoadDeepseekV3.
void SetMlaMode(Model& model, MlaMode mode);

}  // namespace corolla
