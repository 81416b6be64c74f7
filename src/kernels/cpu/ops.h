// CPU reference implementations of the Backend operations (float32 activations and weights).
// They are the correctness oracle for every CUDA kernel: CUDA tests call these on the same
// inputs. All inputs and outputs are host float32 views unless stated; rows may be strided
// (strides[0]), the innermost dimension is contiguous. Multithreaded through
// ThreadPool::Default(); each call is synchronous.
#pragma once

#include "kernels/backend.h"

namespace corolla::cpu {

void Embedding(const TensorView& ids, const TensorView& table, const TensorView& out);
void RmsNorm(const TensorView& x, const TensorView& w, float eps, const TensorView& out,
             const TensorView* residual);
void HeadRmsNorm(const TensorView& x, const TensorView& w, float eps);
void Rope(const TensorView& q, const TensorView& k, const TensorView& positions,
          const RopeParams& params);
void Linear(const TensorView& x, const TensorView& w, const TensorView& out);
// Backend::LinearFp8: w [N, K] e4m3, w_scale [ceil(N/128), ceil(K/128)] f32 (rows may be strided).
void LinearFp8(const TensorView& x, const TensorView& w, const TensorView& w_scale, const TensorView& out);
// The activation quantisation of LinearFp8: x [T, K] f32 -> q [T, K] e4m3 bits (contiguous) and
// scales [T, ceil(K/128)] (contiguous), per row and group of 128 columns.
void QuantizeFp8Groups(const TensorView& x, uint8_t* q, float* scales);
// One Linear per b: x [T, B, K], w [B, N, K] (each w[b] contiguous), out [T, B, N].
void BatchedLinear(const TensorView& x, const TensorView& w, const TensorView& out);
void SiluMul(const TensorView& gate_up, const TensorView& out);
void GatherRows(const TensorView& x, const TensorView& rows, const TensorView& out);
void Copy(const TensorView& src, const TensorView& dst);
void Add(const TensorView& x, const TensorView& y);
void KvWrite(const TensorView& k, const TensorView& v, const KvCacheView& cache,
             const AttentionBatch& batch);
void Attention(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
               float scale, const TensorView& out);
void MoeRoute(const TensorView& router_logits, const MoeRouting& routing,
              const TensorView& topk_ids, const TensorView& topk_weights);
void MoeExperts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out);
// Backend::MoeExpertsFp8 (layouts there): each used expert's weights dequantised to f32, then
// MoeExperts' loop. quantize_activations: x and the SiLU-mul output are first rounded through
// QuantizeFp8Groups (e4m3 times the group scale, the regime of CUDA's grouped FP8 GEMM; act
// rounded to bf16 first, as CUDA writes it); else
// they are used as they are (weight-only, the CPU backend's and CUDA's decode regime).
void MoeExpertsFp8(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                   const TensorView& w_gate_up, const TensorView& gu_scale, const TensorView& w_down,
                   const TensorView& d_scale, const TensorView& out, bool quantize_activations = false);
// Dequantises one block-scaled e4m3 matrix w [N, K] with scales [ceil(N/128), ceil(K/128)]
// (contiguous) into out [N, K] f32: out = w * scale of its 128 x 128 block.
void DequantizeFp8Blocks(const uint8_t* w, const float* scale, int64_t n, int64_t k, float* out);

// Gated DeltaNet and gated attention (linear_attention.cc).
void SigmoidMul(const TensorView& x, const TensorView& gate);
void CausalConv1d(const TensorView& x, const TensorView& weight, const TensorView& conv_state,
                  const TensorView& state_slots, const AttentionBatch& batch, const TensorView& out);
void GatedDeltaRule(const TensorView& q, const TensorView& k, const TensorView& v, const TensorView& a,
                    const TensorView& b, const TensorView& a_log, const TensorView& dt_bias,
                    const TensorView& state, const TensorView& state_slots, const AttentionBatch& batch,
                    const TensorView& out);
void GatedRmsNorm(const TensorView& x, const TensorView& z, const TensorView& w, float eps, const TensorView& out);

}  // namespace corolla::cpu
