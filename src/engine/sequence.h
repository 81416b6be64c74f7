// Sequence: one request's tokens and its place in the KV cache. Its tokens are the prompt then
// what was generated; the first num_computed_tokens of them have K/V in the cache (in the blocks
// of block_table), or are being computed by a launched step. A step computes the rest, or a chunk
// of it; when a step reaches the end, the logits of the last token give the next token. Under
// async scheduling that token may still be on the device (num_pending) when the next step is
// launched: the sequence's length counts it, `tokens` does not yet. Owned and mutated by the
// engine's step thread.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/sampling.h"

namespace corolla {

enum class FinishReason { kNone, kStop, kLength, kAbort };
const char* FinishReasonName(FinishReason reason);  // "stop", "length", "abort"

// Logit penalties as OpenAI and vLLM define them, applied before temperature and the filters:
//   repetition (HF/CTRL): every token seen in the prompt or the output has its logit divided
//     by `repetition` when positive, multiplied when negative (1: off);
//   frequency: logit -= frequency * (times the token was generated);
//   presence:  logit -= presence if the token was generated at all.
struct PenaltyParams {
  float presence = 0.0f;
  float frequency = 0.0f;
  float repetition = 1.0f;

  bool enabled() const { return presence != 0.0f || frequency != 0.0f || repetition != 1.0f; }
};

// One candidate token and its log-probability (log-softmax of the raw logits).
struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0.0f;
};

struct Sequence {
  int64_t id = 0;
  std::vector<int32_t> tokens;
  int num_prompt_tokens = 0;
  int num_computed_tokens = 0;
  // Tokens sampled by launched steps that the host has not appended to `tokens` yet (async
  // scheduling: 0 or 1 between steps, 2 for a moment inside one); the last launched step
  // sampled the newest in row last_sampled_row of its ids.
  int num_pending = 0;
  int last_sampled_row = -1;
  std::vector<int32_t> block_table;
  int state_slot = -1;  // hybrid models: the slot of its linear-attention states

  SamplingParams sampling;
  PenaltyParams penalties;
  int num_logprobs = -1;  // <0: none; 0: the sampled token's; k: also the top k
  int max_tokens = 16;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  FinishReason finish_reason = FinishReason::kNone;

  // Prefix cache: hashes of the full blocks of `tokens` computed so far (content-only, so they
  // survive preemption), and how many leading blocks of block_table are registered or shared.
  std::vector<uint64_t> block_hashes;
  int num_committed_blocks = 0;
  int num_cached_prompt_tokens = 0;  // prompt tokens served by the prefix cache at admission

  int num_tokens() const { return static_cast<int>(tokens.size()); }  // on the host
  int length() const { return num_tokens() + num_pending; }            // including pending tokens
  int num_generated() const { return num_tokens() - num_prompt_tokens; }
  int num_uncomputed() const { return length() - num_computed_tokens; }
  bool finished() const { return finish_reason != FinishReason::kNone; }
};

}  // namespace corolla
