// The grouped expert GEMMs of a decode batch as weight streams (moe_skinny.cu): after
// MoePermute, a warp streams 16 rows of one active expert's weights into mma.sync against that
// expert's 1-16 permuted rows (more rows: further passes over the weights), so each chosen
// expert is read once at the stream's rate, where the grouped mma GEMMs (grouped_gemm.cu) stage
// tiles through shared memory and the pair GEMVs (moe_decode.cu) read an expert once a pair.
// MoeExperts takes them for decode rows when Tuning().moe_pair_gemv_max_pairs < tokens * top_k <=
// Tuning().moe_skinny_max_pairs. Internal to the CUDA backend (moe.cu, its tests).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/tensor.h"

namespace corolla::cuda {

// act[r] = bf16(silu(x[perm_token[r]] W_gate[e]^T) * (x[perm_token[r]] W_up[e]^T)) for each row r
// of each active expert e (offsets, active: MoePermutation's, on the device). x [T, H] bf16 (row
// stride a multiple of 8, 16-byte aligned), w_gate_up [E, 2I, H] bf16 contiguous (gate rows
// first), act [TK, I] bf16 contiguous; slots: the grid's expert slots (>= the active experts,
// e.g. min(TK, E)).
void SkinnyExpertsGateUp(const TensorView& x, const int32_t* perm_token, const int32_t* offsets,
                         const int32_t* active, int slots, const TensorView& w_gate_up,
                         const TensorView& act, cudaStream_t s);

// y[r] = act[r] W_down[e]^T for each row r of each active expert e. act [TK, I] bf16
// contiguous, w_down [E, H, I] bf16 contiguous, y [TK, H] f32 or bf16 contiguous.
void SkinnyExpertsDown(const TensorView& act, const int32_t* offsets, const int32_t* active,
                       int slots, const TensorView& w_down, const TensorView& y, cudaStream_t s);

}  // namespace corolla::cuda
