// The CPU gated delta rule's two forms, for the tests and benchmarks that pick one. ops.h's
// GatedDeltaRule takes the chunked (WY) form for a sequence's chunk of at least
// kGatedDeltaChunkedMinTokens tokens and the recurrent form below that (decode, short chunks).
// Both compute the same f32 math from the same state; same thread-safety as ops.h.
#pragma once

#include <cstdint>
#include <limits>

#include "kernels/backend.h"

namespace corolla::cpu {

// Tokens per chunk of the chunked form (the size of its lower-triangular systems).
inline constexpr int64_t kGatedDeltaChunkTokens = 64;
// A sequence's chunk of at least this many tokens takes the chunked form.
inline constexpr int64_t kGatedDeltaChunkedMinTokens = 64;
// Thresholds that force one form: every chunk recurrent, or every chunk (even one token) chunked.
inline constexpr int64_t kGatedDeltaAlwaysRecurrent = std::numeric_limits<int64_t>::max();
inline constexpr int64_t kGatedDeltaAlwaysChunked = 1;

// ops.h's GatedDeltaRule with the threshold given.
void GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& a,
                    const TensorView& b, const TensorView& a_log, const TensorView& dt_bias,
                    const TensorView& state, const TensorView& state_slots, const AttentionBatch& batch,
                    const TensorView& out, int64_t chunked_min_tokens);

}  // namespace corolla::cpu
