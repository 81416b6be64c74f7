// Qwen3 (dense) and Qwen3-MoE: pre-norm decoder layers of GQA attention with per-head QK
// RMSNorm and neox RoPE, followed by a SwiGLU MLP or a softmax-routed top-k expert layer.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/safetensors.h"

namespace corolla {

// With a TP-EP shard (TP = EP over the same ranks), this rank loads its query heads (KV heads
// split, or replicated when TP exceeds their number), its slice of the dense and shared-expert
// MLP inner dimension, and its experts; row-parallel outputs are all-reduced. With a DP-EP
// shard it loads everything but the other ranks' experts, and the MoE layers exchange tokens.
Result<std::unique_ptr<Model>> LoadQwen3(const ModelConfig& config, const Checkpoint& checkpoint,
                                         Backend& backend, const ModelShard& shard = {});

}  // namespace corolla
