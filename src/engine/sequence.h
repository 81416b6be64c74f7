// Sequence: one request's tokens and its place in the KV cache. Its tokens are the prompt then
// what was generated; the first num_computed_tokens of them have K/V in the cache (in the blocks
// of block_table). A step computes the rest, or a chunk of it; when a step reaches the end, the
// logits of the last token give the next token. Owned and mutated by the engine's step thread.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/sampling.h"

namespace corolla {

enum class FinishReason { kNone, kStop, kLength, kAbort };
const char* FinishReasonName(FinishReason reason);  // "stop", "length", "abort"

struct Sequence {
  int64_t id = 0;
  std::vector<int32_t> tokens;
  int num_prompt_tokens = 0;
  int num_computed_tokens = 0;
  std::vector<int32_t> block_table;

  SamplingParams sampling;
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  FinishReason finish_reason = FinishReason::kNone;

  int num_tokens() const { return static_cast<int>(tokens.size()); }
  int num_generated() const { return num_tokens() - num_prompt_tokens; }
  int num_uncomputed() const { return num_tokens() - num_computed_tokens; }
  bool finished() const { return finish_reason != FinishReason::kNone; }
};

}  // namespace corolla
