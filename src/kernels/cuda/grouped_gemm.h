// The two grouped GEMMs of MoeExperts (grouped_gemm.cu): bf16 mma.sync tiles with fp32
// accumulation over expert-contiguous rows, scheduled on the device from the row offsets (no
// host read of the counts); groups that pick 64- or 128-row tiles run on wgmma + TMA
// (grouped_gemm_wgmma.cu) when Tuning().moe_gemm_wgmma is on and the shapes fit. Internal to the
// CUDA backend (moe.cu, its tests). Launchers enqueue on `s` without synchronising; the only
// state is per-kernel launch attributes set once.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "tensor/tensor.h"

namespace corolla::cuda {

// Rows of expert e are [offsets[e], offsets[e + 1]) of the permuted order; offsets [E + 1] i32
// on the device, non-decreasing, offsets[E] <= the launcher's row count.

// act[r] = silu(x[perm_token[r]] W_gate[e]^T) * (x[perm_token[r]] W_up[e]^T) for each row r of e.
// x [T, H] bf16 (row stride a multiple of 8), perm_token [TK] i32 (device),
// w_gate_up [E, 2I, H] bf16 contiguous (gate rows first), act [TK, I] bf16 contiguous.
// prompt: the rows are mostly one prompt's (GroupedGemmTileRows).
void GroupedGemmGateUp(const TensorView& x, const int32_t* perm_token, const int32_t* offsets,
                       const TensorView& w_gate_up, const TensorView& act, cudaStream_t s,
                       bool prompt = false);

// y[r] = act[r] W_down[e]^T for each row r of e. act [TK, I] bf16 contiguous,
// w_down [E, H, I] bf16 contiguous, y [TK, H] f32 or bf16 contiguous, 16-byte aligned.
void GroupedGemmDown(const TensorView& act, const int32_t* offsets, const TensorView& w_down,
                     const TensorView& y, cudaStream_t s, bool prompt = false);

// The rows of one CTA tile (32, 64 or 128) both launchers use for `rows` permuted rows over
// `experts` experts: Tuning().moe_gemm_tile_rows when set, else chosen by the mean rows per
// expert (decode-like groups, up to 16 rows an expert, or 4 when the rows are mostly one
// prompt's, get the small tile; the 64-row groups run on the 128-row wgmma tiles where those
// fit, see grouped_gemm.cu).
int GroupedGemmTileRows(int64_t rows, int experts, bool prompt = false);

// grouped_gemm_wgmma.cu: the Hopper kernels behind the launchers above for 64- and 128-row
// tiles (tile_rows). Fits: N (GateUp: I; Down: H) % 128 == 0, K % 64 == 0, an sm_90 device, the
// schedule of `experts` in shared memory. The other arguments are those of the launchers,
// already checked by them.
bool GroupedWgmmaFits(int64_t n, int64_t k, int experts);
void GroupedWgmmaGateUp(int tile_rows, const TensorView& x, int64_t x_stride,
                        const int32_t* perm_token, const int32_t* offsets,
                        const TensorView& w_gate_up, const TensorView& act, cudaStream_t s);
void GroupedWgmmaDown(int tile_rows, const TensorView& act, const int32_t* offsets,
                      const TensorView& w_down, const TensorView& y, cudaStream_t s);
// c [64, 256] f32 = a [64, 64] b [256, 64]^T (bf16, contiguous) through one wgmma tile: A by
// cp.async in the swizzled layout, B by TMA. Isolates layout bugs (CudaKernelTest.WgmmaTileProbe).
void WgmmaTileProbe(const TensorView& a, const TensorView& b, const TensorView& c, cudaStream_t s);

}  // namespace corolla::cuda
