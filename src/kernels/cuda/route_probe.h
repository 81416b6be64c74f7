// What one warp's routing of one token costs (CudaPerf.RouteTokenPicks): RouteTokenRegs<4> over
// E <= 128 logits in shared memory, as the cluster norm-router's CTA 0 runs it after its barrier
// (1.9 us at batch 1 in session 41's timeline), timed by clock64 around the call: the scores
// alone and the whole routing, each with the scores divided by their sum (DDIV) or through
// DivideByReciprocal; and a check of DivideByReciprocal's bits against the division.
#pragma once

#include <cstdint>
#include <vector>

namespace corolla::cuda {

struct RouteProbe {
  std::vector<int32_t> ids;     // [sets, top_k] (modes 2-4)
  std::vector<float> weights;   // [sets, top_k]
  std::vector<int64_t> cycles;  // [sets] clock64 cycles of one call
};

// mode 0 / 1: ScoreKeys<4> with DDIV / DivideByReciprocal; 2 / 3: RouteTokenRegs<4> the same
// two ways; 4: RouteTokenByLogits<4>. logits: [sets, experts], experts <= 128, renormalised
// top_k picks. One warp walks the sets one after another.
RouteProbe RunRouteProbe(const std::vector<float>& logits, int sets, int experts, int top_k, int mode);

// Of n pseudo-random pairs (a float in (0, 1], b a double in [1, 128]), how many
// DivideByReciprocal(a, b, 1 / b) differs from a / b in (any bit).
int64_t DivideByReciprocalMismatches(int64_t n, uint64_t seed);

}  // namespace corolla::cuda
