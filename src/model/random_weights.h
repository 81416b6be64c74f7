// Random weights of a real model shape, for benchmarks that need no checkpoint
// (`corolla bench decode|prefill --config CONFIG.json --random-weights`). Every weight is drawn
// uniform bf16 of checkpoint-like scale (std 0.02; norm weights near 1) from one host buffer
// that each tensor views at its own offset, then loaded through the model's ordinary loader.
#pragma once

#include <cstdint>
#include <memory>

#include "model/model.h"

namespace corolla {

// Loads a model of `config`'s architecture (Qwen3 / Qwen3-MoE / Qwen3.5 and Qwen3-Next hybrids /
// DeepSeek-V3) with random weights onto `backend`; DeepSeek-V3 in bf16, or with its projections
// block-scaled FP8 when the config's quantization is fp8 and native FP8 is requested
// (NativeFp8Requested: --fp8 native / COROLLA_FP8=native). The weights depend on the
// seed only, so the ranks of a shard load parts of one and the same model.
Result<std::unique_ptr<Model>> LoadModelRandom(const ModelConfig& config, Backend& backend, uint64_t seed,
                                               const ModelShard& shard = {});

}  // namespace corolla
