// Expert-parallel kernels on the CUDA backend's stream (CUDA builds only; no CUDA types here).
#pragma once

#include "kernels/backend.h"

namespace corolla {

// ids [T, K] i32 (row stride ids.strides[0]) += delta, on `backend`'s stream.
void ShiftExpertIdsCuda(Backend& backend, const TensorView& ids, int delta);

}  // namespace corolla
