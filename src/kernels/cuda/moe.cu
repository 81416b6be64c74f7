// Mixture of experts on the GPU. MoeRoute: one warp per token (RouteToken, moe_route.cuh: the
// CPU twin's softmax/sigmoid, bias, group-limited top-k, renormalisation and scaling).
// MoeExperts, all on the device with no host synchronisation:
//   1-3. MoePermute (moe_permute.cu): count the pairs per expert, scan into row offsets,
//   place the (token, slot) pairs into expert-contiguous rows,
//   4. grouped GEMM gate_up over the gathered rows with the SiLU-mul epilogue -> act [TK, I],
//   5. grouped GEMM down -> y [TK, H] (f32, or bf16 with Tuning().moe_y_bf16), 6. weighted
//   combine back to token order.
// Steps 4-5 are grouped_gemm.cu's mma.sync GEMMs: a persistent grid schedules its tiles from
// the device-side row offsets (no host read of the counts).
// Decode batches take steps 4-5 as weight streams instead (moe_skinny.cu, TK <=
// Tuning().moe_skinny_max_pairs): each chosen expert read once into mma.sync. The fewest pairs
// skip the permutation (moe_decode.cu, TK <= Tuning().moe_pair_gemv_max_pairs).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm.h"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/moe_permute.h"
#include "kernels/cuda/moe_skinny.h"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/timeline.h"

namespace corolla::cuda {
namespace {

// ---- routing ----------------------------------------------------------------------------
constexpr int kRouteWarps = 4;

__global__ void MoeRouteKernel(const __grid_constant__ RouteParams p) {
  // [kRouteWarps][2 experts + groups]: probs, selection scores, group scores
  extern __shared__ float route_smem[];
  TimelineScope tl(p.timeline);
  GridDependencyWait();  // launched with programmatic dependent launch (pdl.cuh)
  tl.Waited();
  TriggerDependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * kRouteWarps + warp;
  if (t >= p.tokens) return;
  float* probs = route_smem + warp * (2 * p.experts + p.num_groups);
  RouteToken(p, t, p.logits + t * p.logits_stride, probs, probs + p.experts, probs + 2 * p.experts, lane);
}

// ---- combine ----------------------------------------------------------------------------
struct CombineParams {
  const void* y;  // [TK, H] f32, or bf16 (CombineKernel / CombineVecKernel's Y)
  const int32_t* slot_row;
  const float* weights;
  int64_t weights_stride;
  bf16_t* out;
  int64_t out_stride;
  int top_k, hidden;
  uint64_t* timeline = nullptr;  // CombineVecKernel's record (COROLLA_TIMELINE)
};

__device__ __forceinline__ float ToFloat(float v) { return v; }
__device__ __forceinline__ float ToFloat(bf16_t v) { return __bfloat162float(v); }

template <typename Y>
__global__ void CombineKernel(const __grid_constant__ CombineParams p) {
  const int64_t t = blockIdx.x;
  const Y* y = static_cast<const Y*>(p.y);
  for (int c = threadIdx.x; c < p.hidden; c += blockDim.x) {
    float acc = 0.f;
    for (int s = 0; s < p.top_k; ++s) {
      const int row = p.slot_row[t * p.top_k + s];
      if (row >= 0)
        acc += p.weights[t * p.weights_stride + s] *
               ToFloat(y[static_cast<int64_t>(row) * p.hidden + c]);
    }
    p.out[t * p.out_stride + c] = __float2bfloat16(acc);
  }
}

// CombineKernel's sums, bit for bit (the same products added in slot order), 16 bytes of a y row
// a thread (4 columns of f32 y, 8 of bf16): the token's rows and weights read once into shared
// memory, then each slot's 16-byte load of y issued before any of the sums that use them
// (kCombineBatch slots at a time), so that the read of y [TK, H] (prefill's largest stream after
// the weights) runs near the copy rate instead of one dependent scalar load a slot. Needs H a
// multiple of the columns a thread, y 16-byte aligned and the output rows aligned to the columns'
// bf16 (MoeCombine checks and otherwise takes CombineKernel).
constexpr int kCombineBatch = 8;
template <typename Y>
struct CombineVec {
  static constexpr int kCols = 16 / sizeof(Y);
  struct alignas(2 * kCols) Out {
    __nv_bfloat162 h[kCols / 2];
  };
  __device__ static void ToFloats(const uint4& u, float (&f)[kCols]) {
    if constexpr (sizeof(Y) == 4) {
      f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y), f[2] = __uint_as_float(u.z),
      f[3] = __uint_as_float(u.w);
    } else {
      Bf16x8 v;
      memcpy(&v, &u, sizeof(u));
      Unpack8(v, f);
    }
  }
};

template <typename Y>
__global__ void CombineVecKernel(const __grid_constant__ CombineParams p) {
  TimelineScope tl(p.timeline);
  tl.Waited();  // a plain launch: it enters once the kernel before has finished
  using V = CombineVec<Y>;
  constexpr int kCols = V::kCols;
  __shared__ int32_t rows[kMaxTopK];
  __shared__ float weights[kMaxTopK];
  const int64_t t = blockIdx.x;
  if (threadIdx.x < p.top_k) {
    rows[threadIdx.x] = p.slot_row[t * p.top_k + threadIdx.x];
    weights[threadIdx.x] = p.weights[t * p.weights_stride + threadIdx.x];
  }
  __syncthreads();
  const uint4* y = static_cast<const uint4*>(p.y);
  const int64_t row_vecs = p.hidden / kCols;
  for (int c = threadIdx.x; c < row_vecs; c += blockDim.x) {
    float acc[kCols] = {};
    for (int s0 = 0; s0 < p.top_k; s0 += kCombineBatch) {
      uint4 v[kCombineBatch];
#pragma unroll
      for (int u = 0; u < kCombineBatch; ++u) {
        const int s = s0 + u;
        v[u] = s < p.top_k && rows[s] >= 0 ? __ldcs(y + rows[s] * row_vecs + c)
                                           : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kCombineBatch; ++u) {
        const int s = s0 + u;
        if (s >= p.top_k || rows[s] < 0) continue;
        const float w = weights[s];
        float f[kCols];
        V::ToFloats(v[u], f);
#pragma unroll
        for (int i = 0; i < kCols; ++i) acc[i] += w * f[i];
      }
    }
    typename V::Out o;
#pragma unroll
    for (int i = 0; i < kCols / 2; ++i) o.h[i] = __floats2bfloat162_rn(acc[2 * i], acc[2 * i + 1]);
    *reinterpret_cast<typename V::Out*>(p.out + t * p.out_stride + kCols * c) = o;
  }
}

}  // namespace

void MoeRoute(const TensorView& router_logits, const MoeRouting& routing,
              const TensorView& topk_ids, const TensorView& topk_weights, cudaStream_t s) {
  const int64_t tokens = router_logits.dim(0);
  const int experts = static_cast<int>(router_logits.dim(1)), k = routing.top_k;
  COROLLA_CHECK(router_logits.dtype == DType::kF32 && topk_ids.dtype == DType::kI32 &&
                topk_weights.dtype == DType::kF32 && router_logits.strides[1] == 1 &&
                k >= 1 && k <= experts && k <= kMaxTopK && topk_ids.dim(0) == tokens && topk_ids.dim(1) == k &&
                topk_weights.dim(0) == tokens && topk_weights.dim(1) == k)
      << "moe_route logits " << router_logits.ToString() << " ids " << topk_ids.ToString()
      << " weights " << topk_weights.ToString() << " k " << k;
  if (tokens == 0) return;
  COROLLA_CHECK(routing.num_groups >= 1 && routing.num_groups <= 64 && experts % routing.num_groups == 0 &&
                routing.topk_groups >= 1 &&
                routing.topk_groups <= routing.num_groups)
      << "moe_route: " << experts << " experts in " << routing.num_groups << " groups, top " << routing.topk_groups;
  const bool has_bias = routing.correction_bias.data != nullptr && routing.correction_bias.numel() > 0;
  if (has_bias)
    COROLLA_CHECK(routing.correction_bias.dtype == DType::kF32 && routing.correction_bias.numel() == experts &&
                  routing.correction_bias.device == Device::kCuda)
        << "moe_route correction_bias " << routing.correction_bias.ToString();
  RouteParams p{router_logits.ptr<float>(), router_logits.strides[0],
                has_bias ? routing.correction_bias.ptr<float>() : nullptr, topk_ids.ptr<int32_t>(),
                topk_ids.strides[0], topk_weights.ptr<float>(), topk_weights.strides[0], tokens,
                experts, k, routing.renormalize, routing.sigmoid, routing.scaling_factor,
                routing.num_groups, routing.topk_groups};
  const size_t smem = sizeof(float) * kRouteWarps * (2 * experts + routing.num_groups);
  COROLLA_CHECK(smem <= 48 * 1024) << "moe_route: " << experts << " experts exceed shared memory";
  p.by_logits = Tuning().route_by_logits;
  p.timeline = TimelineRecord("MoeRoute", CeilDiv(tokens, kRouteWarps), s);
  LaunchPdl(MoeRouteKernel, dim3(CeilDiv(tokens, kRouteWarps)), dim3(kRouteWarps * 32), smem, s, 1, p);
}

namespace {

void CheckMoeExperts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                     const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  const int k = static_cast<int>(topk_ids.dim(1));
  const int experts = static_cast<int>(w_gate_up.dim(0));
  const int64_t inter = w_down.dim(2);
  COROLLA_CHECK(x.dtype == DType::kBF16 && out.dtype == DType::kBF16 &&
                w_gate_up.dtype == DType::kBF16 && w_down.dtype == DType::kBF16 &&
                topk_ids.dtype == DType::kI32 && topk_weights.dtype == DType::kF32 &&
                w_gate_up.is_contiguous() && w_down.is_contiguous() && x.strides[1] == 1 &&
                out.strides[1] == 1 && topk_ids.strides[1] == 1 && topk_weights.strides[1] == 1 &&
                w_gate_up.dim(1) == 2 * inter && w_gate_up.dim(2) == hidden &&
                w_down.dim(0) == experts && w_down.dim(1) == hidden && out.dim(0) == tokens &&
                out.dim(1) == hidden && topk_weights.dim(1) == k && hidden % 8 == 0 &&
                inter % 8 == 0 && (tokens <= 1 || x.strides[0] % 8 == 0))
      << "moe x " << x.ToString() << " ids " << topk_ids.ToString() << " gate_up "
      << w_gate_up.ToString() << " down " << w_down.ToString() << " out " << out.ToString();
}

}  // namespace

bool MoeExpertsResidual(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                        const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out,
                        const TensorView& sum, CachingAllocator& alloc, cudaStream_t s) {
  CheckMoeExperts(x, topk_ids, topk_weights, w_gate_up, w_down, out);
  COROLLA_CHECK(sum.dtype == DType::kBF16 && sum.shape == out.shape && sum.strides[1] == 1)
      << "moe residual " << sum.ToString() << " out " << out.ToString();
  const int64_t tokens = x.dim(0), pairs = tokens * topk_ids.dim(1);
  if (!Tuning().moe_residual_fold || tokens == 0 || pairs > Tuning().moe_pair_gemv_max_pairs ||
      !Tuning().moe_pair_down_slots)
    return false;
  MoeExpertsPairGemv(x, topk_ids, topk_weights, w_gate_up, w_down, out, alloc, s, &sum);
  return true;
}

void MoeExperts(const TensorView& x, const TensorView& topk_ids, const TensorView& topk_weights,
                const TensorView& w_gate_up, const TensorView& w_down, const TensorView& out,
                CachingAllocator& alloc, cudaStream_t s, bool prompt) {
  CheckMoeExperts(x, topk_ids, topk_weights, w_gate_up, w_down, out);
  const int64_t tokens = x.dim(0), hidden = x.dim(1);
  const int k = static_cast<int>(topk_ids.dim(1));
  const int experts = static_cast<int>(w_gate_up.dim(0));
  const int64_t inter = w_down.dim(2);
  if (tokens == 0) return;
  const int64_t pairs = tokens * k;
  if (pairs <= Tuning().moe_pair_gemv_max_pairs) {  // a few tokens: no permutation (moe_decode.cu)
    MoeExpertsPairGemv(x, topk_ids, topk_weights, w_gate_up, w_down, out, alloc, s);
    return;
  }
  // One scratch block: offsets, active, perm, slot rows, the permutation's scratch | act | y.
  const int64_t meta_ints = 2 * (experts + 1) + 2 * pairs + MoePermuteScratchInts(pairs, experts);
  const int64_t meta_bytes = (meta_ints * 4 + 255) / 256 * 256;
  const int64_t act_bytes = (pairs * inter * 2 + 255) / 256 * 256;
  const bool y_bf16 = Tuning().moe_y_bf16;
  const DType y_dtype = y_bf16 ? DType::kBF16 : DType::kF32;
  ScratchBuffer scratch(alloc, meta_bytes + act_bytes + pairs * hidden * (y_bf16 ? 2 : 4));
  int32_t* meta = scratch.as<int32_t>();
  const MoePermutation st{meta, meta + 2 * (experts + 1), meta + 2 * (experts + 1) + pairs,
                          meta + (experts + 1)};
  bf16_t* act = reinterpret_cast<bf16_t*>(scratch.as<char>() + meta_bytes);
  void* y = scratch.as<char>() + meta_bytes + act_bytes;
  MoePermute(topk_ids.ptr<int32_t>(), topk_ids.strides[0], tokens, k, experts, st,
             meta + 2 * (experts + 1) + 2 * pairs, s);

  const int slots = static_cast<int>(std::min<int64_t>(pairs, experts));
  // The weight streams (moe_skinny.cu) for decode rows; a prompt's rows crowd onto fewer experts,
  // whose further passes over their weights the grouped GEMMs' tall tiles avoid.
  if (pairs <= Tuning().moe_skinny_max_pairs && !prompt) {
    const TensorView act_view(act, DType::kBF16, {pairs, inter}, Device::kCuda, x.device_idx);
    const TensorView y_view(y, y_dtype, {pairs, hidden}, Device::kCuda, x.device_idx);
    SkinnyExpertsGateUp(x, st.perm_token, st.offsets, st.active, slots, w_gate_up, act_view, s);
    SkinnyExpertsDown(act_view, st.offsets, st.active, slots, w_down, y_view, s);
  } else {
    const TensorView act_view(act, DType::kBF16, {pairs, inter}, Device::kCuda, x.device_idx);
    const TensorView y_view(y, y_dtype, {pairs, hidden}, Device::kCuda, x.device_idx);
    GroupedGemmGateUp(x, st.perm_token, st.offsets, w_gate_up, act_view, s, prompt);
    GroupedGemmDown(act_view, st.offsets, w_down, y_view, s, prompt);
  }

  MoeCombine(y, y_dtype, st.slot_row, topk_weights, out, s);
}

void MoeCombine(const void* y, DType y_dtype, const int32_t* slot_row,
                const TensorView& topk_weights, const TensorView& out, cudaStream_t s) {
  COROLLA_CHECK(y_dtype == DType::kF32 || y_dtype == DType::kBF16)
      << "moe_combine: y " << DTypeName(y_dtype);
  const int64_t tokens = out.dim(0), hidden = out.dim(1);
  if (tokens == 0) return;
  CombineParams cp{y, slot_row, topk_weights.ptr<float>(), topk_weights.strides[0],
                   out.ptr<bf16_t>(), tokens > 1 ? out.strides[0] : hidden, static_cast<int>(topk_weights.dim(1)),
                   static_cast<int>(hidden)};
  const bool bf16 = y_dtype == DType::kBF16;
  const int cols = bf16 ? CombineVec<bf16_t>::kCols : CombineVec<float>::kCols;  // a thread's
  const bool vec = Tuning().moe_combine_vec && hidden % cols == 0 && cp.top_k <= kMaxTopK &&
                   reinterpret_cast<uintptr_t>(y) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(cp.out) % (2 * cols) == 0 &&
                   cp.out_stride % cols == 0;
  if (vec) cp.timeline = TimelineRecord("MoeCombine", tokens, s);
  if (vec && bf16)
    CombineVecKernel<bf16_t><<<tokens, 128, 0, s>>>(cp);
  else if (vec)
    CombineVecKernel<float><<<tokens, 128, 0, s>>>(cp);
  else if (bf16)
    CombineKernel<bf16_t><<<tokens, 128, 0, s>>>(cp);
  else
    CombineKernel<float><<<tokens, 128, 0, s>>>(cp);
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace corolla::cuda
