// The DP-EP exchange over NVLink on NCCL's device API: a second EpExchange (see
// parallel/expert_parallel.h) for groups whose ranks are all load/store-reachable. Fixed
// capacity, one kernel launch per Dispatch and per Combine, no host synchronisation (CUDA-graph
// capturable), NVLink multicast never used. No CUDA or NCCL type leaks out of this header.
//
// Each rank's symmetric window holds [ranks senders][capacity rows] dispatched rows in the
// EpRowLayout (MoeExperts runs straight on views of them), [ranks experts' ranks][capacity rows]
// [H] partial outputs coming back, and per (sender, block) row ranges. Block b of every rank's
// kernels takes the b-th contiguous share of its tokens, and LSA barrier b pairs it with block b
// of each peer: dispatch packs each token's row once per destination rank straight into that
// rank's window (rows in token order, as AllToAllEpExchange's capacity blocks), with the block's
// row range; the receiver pads the unused rows (ids -1). Combine sends each received row's
// expert output back into its sender's window (block b returns what sender block b sent, so
// after barrier b the sender's block b has all partials of its tokens) and sums them in rank
// order in f32 with one rounding: the same bits as AllToAllEpExchange given the same expert
// outputs. Reuse needs no extra barrier: a rank's next dispatch waits (barrier) for every peer's
// dispatch, which starts after that peer's combine, which follows its experts.
#pragma once

#include <memory>

#include "parallel/expert_parallel.h"

namespace corolla {

struct NvlEpExchangeConfig {
  EpExchangeConfig exchange;  // capacity > 0 required
  int64_t hidden = 0;         // H of the activations (bf16, H % 8 == 0)
  int64_t top_k = 0;          // K of the routing (at most 32)
};

// Collective over `comm` (an NCCL communicator of at most 8 ranks, all on NVLink): allocates
// and registers the window. Unsupported otherwise (callers keep MakeAllToAllEpExchange).
Result<std::unique_ptr<EpExchange>> MakeNvlEpExchange(Backend& backend, Communicator& comm,
                                                      const NvlEpExchangeConfig& config);

}  // namespace corolla
