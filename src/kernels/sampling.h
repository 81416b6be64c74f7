// Token sampling from logits: greedy, temperature, top-k, top-p, min-p, per-request seed.
// Randomness is counter-based (Philox4x32-10 keyed by the request's seed, counter = the
// request's step), so a request's output depends only on its seed and its own logits, never on
// what else shares the batch, and the CUDA sampler can reproduce the CPU one draw for draw.
#pragma once

#include <cstdint>

#include "tensor/tensor.h"

namespace corolla {

struct SamplingParams {
  float temperature = 1.0f;  // 0: greedy (argmax; ties go to the lowest id)
  int top_k = 0;             // 0 or <0: disabled
  float top_p = 1.0f;        // 1: disabled
  float min_p = 0.0f;        // 0: disabled
  uint64_t seed = 0;

  bool is_greedy() const { return temperature <= 0.0f; }
};

// Philox4x32-10: four 32-bit random words for (key, counter).
void Philox4x32(uint64_t key, uint64_t counter_hi, uint64_t counter_lo, uint32_t out[4]);
// A float uniform in [0, 1) drawn from (seed, step): the one draw a sampler step uses.
float UniformFromSeed(uint64_t seed, uint64_t step);

}  // namespace corolla
