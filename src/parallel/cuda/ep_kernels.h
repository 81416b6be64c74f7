// Expert-parallel kernels on the CUDA backend's stream (CUDA builds only; no CUDA types here).
// The DP-EP steps are the device twins of the CPU loops in parallel/expert_parallel.cc, which
// validates the tensors before calling them.
#pragma once

#include "kernels/backend.h"
#include "parallel/ep_row_layout.h"

namespace corolla {

// ids [T, K] i32 (row stride ids.strides[0]) += delta, on `backend`'s stream.
void ShiftExpertIdsCuda(Backend& backend, const TensorView& ids, int delta);

// PlanEpRoutes / PackEpRows / CombineEpRows on the device (see parallel/expert_parallel.h).
void EpPlanCuda(Backend& backend, const TensorView& topk_ids, int experts_per_rank, const TensorView& map,
                const TensorView& counts);
void EpPackCuda(Backend& backend, const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                const TensorView& map, const TensorView& counts, int capacity, int experts_per_rank,
                const EpRowLayout& layout, const TensorView& send);
void EpCombineCuda(Backend& backend, const TensorView& back, const TensorView& map, const TensorView& counts,
                   int capacity, const TensorView& out);

}  // namespace corolla
