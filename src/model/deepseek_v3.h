// DeepSeek-V3: multi-head latent attention (MLA) and group-limited sigmoid routing with shared
// experts, after `first_k_dense_replace` dense layers. The KV cache holds one latent per token
// (kv_lora_rank normed dims + the roped key dims); prefill attends in the decompressed
// multi-head form, decode with the up-projections absorbed into the query and the output.
#pragma once

#include <memory>

#include "model/model.h"
#include "model/safetensors.h"

namespace corolla {

// How MLA attends: kAuto decompresses for batches with a prefill chunk and absorbs for pure
// decode batches; the other two force one form (tests compare them).
enum class MlaMode { kAuto, kDecompressed, kAbsorbed };

Result<std::unique_ptr<Model>> LoadDeepseekV3(const ModelConfig& config, const Checkpoint& checkpoint,
                                              Backend& backend);
// Multi-token-prediction modules loaded with the model (0 for other models).
int NumMtpModules(const Model& model);
// Forces the attention form of a model loaded by LoadDeepseekV3.
void SetMlaMode(Model& model, MlaMode mode);

}  // namespace corolla
