// Expert parallelism, TP-EP variant (prefill layout): every rank of the EP group holds the same
// (replicated) tokens and the experts [first, first + num_local) of each MoE layer. A rank
// routes all tokens, keeps the (token, slot) pairs of its own experts, combines them locally,
// and one all-reduce over the group sums the ranks' partial outputs.
#pragma once

#include "kernels/backend.h"

namespace corolla {

// topk_ids [T, K] i32 += -first_expert in place, on the backend's device and stream: ids of this
// rank's experts become local indices in [0, num_local), the others fall outside it and
// Backend::MoeExperts skips them.
void ToLocalExpertIds(Backend& backend, const TensorView& topk_ids, int first_expert);

}  // namespace corolla
