// Routed experts with block-scaled e4m3 weights (Backend::MoeExpertsFp8) on CUDA (moe_fp8.cu):
// the weight-only pair GEMVs (moe_decode.cu) for a few pairs, else the quantised grouped FP8
// GEMMs. Launchers enqueue on `s` without synchronising; internal to the CUDA backend and tests.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/allocator.h"
#include "tensor/tensor.h"

namespace corolla::cuda {

// Shapes the kernels take: 16-byte rows of e4m3 in both GEMMs.
bool MoeFp8Supports(int64_t hidden, int64_t inter);

// Backend::MoeExpertsFp8 (semantics and layouts: kernels/backend.h). Weight-only regime when
// tokens * k <= Tuning().moe_pair_gemv_max_pairs, else the quantised one.
void MoeExpertsFp8(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                   const TensorView& w_gate_up, const TensorView& gu_scale, const TensorView& w_down,
                   const TensorView& d_scale, const TensorView& out, CachingAllocator& alloc, cudaStream_t s);

// The two grouped GEMMs (rows of expert e: [offsets[e], offsets[e + 1]), offsets [E + 1] on the
// device). GateUp: act [TK, I] bf16 = silu(xq W_gate^T) * (xq W_up^T) over rows perm_token[r] of
// xq [T, H] e4m3 (row stride tokens_stride) with scales xs [T, ceil(H/128)]. Down: y [TK, H] f32
// or bf16 (16-byte aligned) = actq [TK, I] e4m3 (scales [TK, ceil(I/128)]) W_down^T. Weights and
// scales as MoeExpertsFp8's.
void GroupedGemmFp8GateUp(const uint8_t* xq, const float* xs, int64_t tokens_stride, const int32_t* perm_token,
                          const int32_t* offsets, const TensorView& w_gate_up, const TensorView& gu_scale,
                          const TensorView& act, cudaStream_t s);
void GroupedGemmFp8Down(const uint8_t* actq, const float* act_scale, const int32_t* offsets, const TensorView& w_down,
                        const TensorView& d_scale, const TensorView& y, cudaStream_t s);

// moe_fp8_wgmma.cu: the Hopper kernels behind the two launchers above for 128-row tiles
// (Tuning().moe_fp8_wgmma). Fits: N (GateUp: I; Down: H) % 64 == 0, K % 16 == 0, an sm_90
// device, the schedule of `experts` in shared memory. Arguments as the launchers'.
bool GroupedFp8WgmmaFits(int64_t n, int64_t k, int experts);
void GroupedFp8WgmmaGateUp(const uint8_t* xq, const float* xs, int64_t tokens_stride, const int32_t* perm_token,
                           const int32_t* offsets, const TensorView& w_gate_up, const TensorView& gu_scale,
                           const TensorView& act, cudaStream_t s);
void GroupedFp8WgmmaDown(const uint8_t* actq, const float* act_scale, const int32_t* offsets,
                         const TensorView& w_down, const TensorView& d_scale, const TensorView& y, cudaStream_t s);
// c [64, N] f32 = a [64, 128] b [N, 128]^T (e4m3, contiguous; N 128 or 256) through one tile of
// 4 m64nNk32 e4m3 wgmmas: A by cp.async in the swizzled layout, B by TMA
// (CudaKernelTest.Fp8WgmmaTileProbe).
void Fp8WgmmaTileProbe(const TensorView& a, const TensorView& b, const TensorView& c, cudaStream_t s);

}  // namespace corolla::cuda
