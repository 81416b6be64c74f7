// Qwen3 (dense) and Qwen3-MoE: pre-norm decoder layers of GQA attention with per-head QK
// RMSNorm and neox RoPE, followed by a SwiGLU MLP or a softmax-routed top-k expert layer.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/safetensors.h"

namespace corolla {

Result<std::unique_ptr<Model>> LoadQwen3(const ModelConfig& config, const Checkpoint& checkpoint,
                                         Backend& backend);

}  // namespace corolla
