// The MoE router of a few tokens in one launch (Backend::MoeRouter): router logits
// x [T, H] @ w [E, H]^T in f32, then MoeRoute's routing (RouteToken, moe_route.cuh).
// One thread block cluster of kRouterCtas CTAs splits the E router rows: each CTA streams its
// E / kRouterCtas contiguous rows once (an L2 bulk prefetch of the whole slice is issued before
// the grid dependency wait, so under programmatic dependent launch it overlaps the previous
// kernel), its warps multiply them with every token's x (read through L1), and the CTA keeps its
// logits [T, E / kRouterCtas] in shared memory. After a cluster barrier CTA r gathers token r's
// whole logit row from the cluster's shared memory (DSMEM) and one warp routes it. Replaces a
// 32-CTA GEMV (a quarter of the SMs) and a routing launch at batch 1.
//
// One token can take the staged router instead (StagedRouterKernel, Tuning().staged_router): a
// warp per router row, each row bulk-copied to shared memory before the grid dependency wait (as
// the staged GEMV of gemv.cu), its logit written to a per-stream buffer, and the last warp to
// arrive (a per-stream counter) routes the token: one launch, no cluster.
#include <cooperative_groups.h>

#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/timeline.h"
#include "kernels/cuda/stream_scratch.h"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kRouterCtas = 8;               // cluster size (the portable maximum)
constexpr int kRouterMaxTokens = kRouterCtas;  // CTA r routes token r
constexpr int kRouterWarps = 8;
constexpr int kRouterRows = 2;    // router rows per warp in flight
constexpr int kRouterUnroll = 8;  // 16-byte chunks of each row per lane in flight

struct RouterParams {
  const bf16_t* x;  // [T, H]
  int64_t x_stride;
  const bf16_t* w;  // [E, H]
  int hidden;
  int rows_per_cta;  // E / kRouterCtas, even
  RouteParams route;  // tokens T <= kRouterMaxTokens; logits unused
};

// Dynamic shared memory (floats): this CTA's logits [kRouterMaxTokens][rows_per_cta], the routed
// token's logit row [E], the routing scratch probs, choice [E] and group scores [num_groups].
size_t RouterSmemBytes(int experts, int num_groups) {
  return sizeof(float) * (kRouterMaxTokens * (experts / kRouterCtas) + 3 * experts + num_groups);
}

// L2 bulk prefetch of [p, p + bytes) (bytes a multiple of 16, p 16-byte aligned).
__device__ __forceinline__ void PrefetchL2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p), "r"(bytes) : "memory");
}

__global__ void __launch_bounds__(kRouterWarps * 32) RouterKernel(const __grid_constant__ RouterParams p) {
  extern __shared__ __align__(16) float router_smem[];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rpc = p.rows_per_cta, experts = p.route.experts, tokens = static_cast<int>(p.route.tokens);
  float* s_logits = router_smem;                       // [kRouterMaxTokens][rpc]
  float* s_row = s_logits + kRouterMaxTokens * rpc;    // [E]
  float* probs = s_row + experts;                      // [E]
  float* choice = probs + experts;                     // [E]
  float* group_score = choice + experts;               // [num_groups]
  const bf16_t* slice = p.w + static_cast<int64_t>(rank) * rpc * p.hidden;

  // Weights are never written during a forward: start pulling this CTA's slice into L2 before
  // waiting for x. Lanes of warp 0 take 16 KB pieces.
  if (warp == 0) {
    const int64_t bytes = static_cast<int64_t>(rpc) * p.hidden * sizeof(bf16_t);
    constexpr int64_t kPiece = 16 * 1024;
    for (int64_t off = lane * kPiece; off < bytes; off += 32 * kPiece)
      PrefetchL2(reinterpret_cast<const char*>(slice) + off, static_cast<uint32_t>(bytes - off < kPiece ? bytes - off : kPiece));
  }
  GridDependencyWait();  // x is the previous kernel's output
  TriggerDependents();

  // Logits of rows [r0, r0 + kRouterRows) of the slice for every token.
  for (int r0 = warp * kRouterRows; r0 < rpc; r0 += kRouterWarps * kRouterRows) {
    const bf16_t* rows[kRouterRows];
#pragma unroll
    for (int r = 0; r < kRouterRows; ++r) rows[r] = slice + static_cast<int64_t>(r0 + r) * p.hidden;
    float acc[kRouterMaxTokens][kRouterRows] = {};
    for (int c0 = lane * 8; c0 < p.hidden; c0 += kRouterUnroll * 32 * 8) {
      Bf16x8 wv[kRouterUnroll][kRouterRows];
#pragma unroll
      for (int j = 0; j < kRouterUnroll; ++j) {
        const int c = c0 + j * 32 * 8;
        if (c >= p.hidden) break;
#pragma unroll
        for (int r = 0; r < kRouterRows; ++r) {
          const uint4 u = __ldcs(reinterpret_cast<const uint4*>(rows[r] + c));
          memcpy(&wv[j][r], &u, sizeof(u));
        }
      }
#pragma unroll
      for (int j = 0; j < kRouterUnroll; ++j) {
        const int c = c0 + j * 32 * 8;
        if (c >= p.hidden) break;
        float wf[kRouterRows][8];
#pragma unroll
        for (int r = 0; r < kRouterRows; ++r) Unpack8(wv[j][r], wf[r]);
#pragma unroll
        for (int t = 0; t < kRouterMaxTokens; ++t) {
          if (t >= tokens) break;
          float xf[8];
          Unpack8(*reinterpret_cast<const Bf16x8*>(p.x + t * p.x_stride + c), xf);
#pragma unroll
          for (int r = 0; r < kRouterRows; ++r)
#pragma unroll
            for (int i = 0; i < 8; ++i) acc[t][r] = fmaf(wf[r][i], xf[i], acc[t][r]);
        }
      }
    }
#pragma unroll
    for (int t = 0; t < kRouterMaxTokens; ++t) {
      if (t >= tokens) break;
#pragma unroll
      for (int r = 0; r < kRouterRows; ++r) {
        const float v = WarpSum(acc[t][r]);
        if (lane == 0) s_logits[t * rpc + r0 + r] = v;
      }
    }
  }
  cluster.sync();  // every CTA's logits written and visible to the cluster

  if (rank < tokens) {
    for (int e = threadIdx.x; e < experts; e += blockDim.x) {
      const float* peer = cluster.map_shared_rank(s_logits, e / rpc);
      s_row[e] = peer[rank * rpc + e % rpc];
    }
    __syncthreads();
    if (warp == 0) RouteToken(p.route, rank, s_row, probs, choice, group_score, lane);
  }
  cluster.sync();  // peers may still be reading this CTA's logits: stay until they are done
}

// ---- staged router: one token ------------------------------------------------------------------
constexpr int kStagedRouterWarps = 4;  // a router row each
constexpr int kStagedRouterMaxExperts = 4096;
constexpr int kStagedNormMaxHidden = 4096;  // the norm variant keeps a lane's share of sum + y in registers

struct StagedRouterParams {
  const bf16_t* x;  // [1, H] (unused with the norm: x comes from it)
  const bf16_t* w;  // [E, H]
  float* logits;    // [E], per stream
  unsigned* arrivals;  // per stream, zero between launches: the last warp to arrive routes, re-arms
  int hidden;
  int experts;
  RouteParams route;  // tokens 1; logits unused
  ResidualNorm norm;  // the post-attention norm folded in (RmsNormMoeRouter; y null: none)
  uint64_t* timeline = nullptr;  // timeline.h
};

// Dynamic shared memory: the warps' mbarriers (8 bytes each, 32 in all), their rows [4][H] bf16,
// then the routing warp's logit row, probs, choice [E] and group scores [num_groups] (floats).
size_t StagedRouterSmemBytes(int64_t hidden, int experts, int num_groups) {
  return 32 + kStagedRouterWarps * hidden * sizeof(bf16_t) + sizeof(float) * (3 * experts + num_groups);
}

// A warp per router row e = blockIdx.x * 4 + warp: the row is bulk-copied to shared memory before
// the grid dependency wait; after it the warp dots the row with x (kNorm: with rmsnorm(sum + y),
// which every warp forms itself for the whole row: a lane keeps its chunks of sum + y in
// registers), writes its logit to the per-stream buffer and counts itself on the arrival counter.
// The last warp to arrive (every other warp has read sum and y by then) routes the token from
// the logits, writes sum + y and the normed row (kNorm) and re-arms the counter.
template <bool kNorm>
__global__ void __launch_bounds__(kStagedRouterWarps * 32) StagedRouterKernel(const __grid_constant__ StagedRouterParams p) {
  extern __shared__ __align__(128) unsigned char staged_smem[];
  constexpr int kChunks = kStagedNormMaxHidden / 256;  // of 8 columns a lane, kNorm
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int e = blockIdx.x * kStagedRouterWarps + warp;
  TimelineScope tl(p.timeline);
  const uint32_t bar = wgmma::SmemAddr(staged_smem + 8 * warp);
  const bf16_t* row = reinterpret_cast<const bf16_t*>(staged_smem + 32) + static_cast<int64_t>(warp) * p.hidden;
  float* s_logit = reinterpret_cast<float*>(staged_smem + 32 + kStagedRouterWarps * p.hidden * sizeof(bf16_t));
  float* probs = s_logit + p.experts;
  float* choice = probs + p.experts;
  float* group_score = choice + p.experts;
  if (e < p.experts && lane == 0) {
    const uint32_t bytes = static_cast<uint32_t>(p.hidden) * sizeof(bf16_t);
    wgmma::MbarInit(bar, 1);
    wgmma::MbarInitFence();
    wgmma::MbarArriveExpectTx(bar, bytes);
    wgmma::BulkCopy(wgmma::SmemAddr(row), p.w + static_cast<int64_t>(e) * p.hidden, bytes, bar, wgmma::EvictFirst());
  }
  __syncwarp();  // the mbarrier's initialisation before the other lanes wait on it
  GridDependencyWait();  // x (or sum and y) come from the kernels before
  tl.Waited();
  TriggerDependents();
  if (e >= p.experts) return;
  // kNorm: h = bf16(sum + y) for this lane's chunks (lane + 32 j) * 8, and 1 / rms(h).
  Bf16x8 h[kNorm ? kChunks : 1];
  float inv = 0.f;
  if constexpr (kNorm) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = (j * 32 + lane) * 8;
      if (c >= p.hidden) break;
      float a[8];
      h[j] = ResidualAdd8(p.norm.y + c, p.norm.sum + c, a);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += a[i] * a[i];
    }
    inv = rsqrtf(WarpSum(ss) / p.hidden + p.norm.eps);
  }
  auto normed = [&](int j, int c, float f[8]) {  // kNorm: the bf16 normed x of chunk j, as floats
    float a[8];
    Unpack8(h[j], a);
    Unpack8(NormScale8(p.norm, c, a, inv), f);
  };
  wgmma::MbarWait(bar, 0);
  float acc[4] = {};
  if constexpr (kNorm) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = (j * 32 + lane) * 8;
      if (c >= p.hidden) break;
      float xf[8], wf[8];
      normed(j, c, xf);
      LoadShared8(row + c, wf);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[j % 4] = fmaf(wf[i], xf[i], acc[j % 4]);
    }
  } else {
    // Four interleaved partial sums; x through L2 (written by the kernel before: not the .nc path).
    for (int c0 = lane * 8; c0 < p.hidden; c0 += 4 * 32 * 8) {
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const int c = c0 + s * 32 * 8;
        if (c >= p.hidden) break;
        float xf[8], wf[8];
        LoadCg8(p.x + c, xf);
        LoadShared8(row + c, wf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[s] = fmaf(wf[i], xf[i], acc[s]);
      }
    }
  }
  const float logit = WarpSum((acc[0] + acc[1]) + (acc[2] + acc[3]));
  unsigned last = 0;
  if (lane == 0) {
    p.logits[e] = logit;
    __threadfence();  // the logit before the arrival
    last = atomicAdd(p.arrivals, 1u) == static_cast<unsigned>(p.experts - 1);
  }
  if (!__shfl_sync(0xffffffffu, last, 0)) return;
  __threadfence();  // every other warp's logit after its arrival
  for (int i = lane; i < p.experts; i += 32) s_logit[i] = __ldcg(p.logits + i);
  __syncwarp();
  RouteToken(p.route, 0, s_logit, probs, choice, group_score, lane);
  if constexpr (kNorm) {  // every warp has read sum and y: write them back
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int c = (j * 32 + lane) * 8;
      if (c >= p.hidden) break;
      float f[8];
      normed(j, c, f);
      Store8(p.norm.sum + c, h[j]);
      Store8(p.norm.x + c, Pack8(f));
    }
  }
  if (lane == 0) *p.arrivals = 0;  // re-armed for the next launch on this stream
}

// The routing of MoeRouter's arguments, checked (shared by its paths and RmsNormMoeRouter).
RouteParams CheckedRoute(const TensorView& x, const TensorView& w, const MoeRouting& routing,
                         const TensorView& topk_ids, const TensorView& topk_weights) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1), experts = w.dim(0);
  const int k = routing.top_k;
  COROLLA_CHECK(x.dtype == DType::kBF16 && w.dtype == DType::kBF16 && x.rank() == 2 && w.rank() == 2 &&
                w.dim(1) == hidden && topk_ids.dtype == DType::kI32 && topk_weights.dtype == DType::kF32 &&
                k >= 1 && k <= experts && topk_ids.dim(0) == tokens && topk_ids.dim(1) == k &&
                topk_weights.dim(0) == tokens && topk_weights.dim(1) == k)
      << "moe_router x " << x.ToString() << " w " << w.ToString() << " ids " << topk_ids.ToString() << " weights "
      << topk_weights.ToString() << " k " << k;
  COROLLA_CHECK(routing.num_groups >= 1 && routing.num_groups <= 64 && experts % routing.num_groups == 0 &&
                routing.topk_groups >= 1 && routing.topk_groups <= routing.num_groups)
      << "moe_router: " << experts << " experts in " << routing.num_groups << " groups, top " << routing.topk_groups;
  const bool has_bias = routing.correction_bias.data != nullptr && routing.correction_bias.numel() > 0;
  if (has_bias)
    COROLLA_CHECK(routing.correction_bias.dtype == DType::kF32 && routing.correction_bias.numel() == experts &&
                  routing.correction_bias.device == Device::kCuda)
        << "moe_router correction_bias " << routing.correction_bias.ToString();
  RouteParams p{nullptr, 0, has_bias ? routing.correction_bias.ptr<float>() : nullptr, topk_ids.ptr<int32_t>(),
                topk_ids.strides[0], topk_weights.ptr<float>(), topk_weights.strides[0], tokens,
                static_cast<int>(experts), k, routing.renormalize, routing.sigmoid, routing.scaling_factor,
                routing.num_groups, routing.topk_groups};
  p.by_logits = Tuning().route_by_logits;
  return p;
}


// One token on the staged router (norm: folded in, else null); false where it does not apply
// (nothing launched; the caller goes on).
bool LaunchStagedRouter(const TensorView& x, const TensorView& w, const RouteParams& route, int num_groups,
                        const ResidualNorm* norm, cudaStream_t s) {
  const int64_t hidden = w.dim(1), experts = w.dim(0);
  if (x.dim(0) != 1 || experts > kStagedRouterMaxExperts || hidden % 8 != 0 || hidden > 65536 ||
      !w.is_contiguous() || !Aligned16(w.data) || route.top_k > kMaxTopK ||
      (norm == nullptr && (x.strides[1] != 1 || !Aligned16(x.data))) || (norm && hidden > kStagedNormMaxHidden))
    return false;
  int device = 0, max_smem = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t smem = StagedRouterSmemBytes(hidden, static_cast<int>(experts), num_groups);
  if (smem > static_cast<size_t>(max_smem)) return false;
  // The arrival counter, then the logits (16-byte aligned), for any expert count up to the maximum.
  void* scratch = StreamScratch(s, StreamScratchSlot::kStagedRouter, 16 + kStagedRouterMaxExperts * sizeof(float));
  if (scratch == nullptr) return false;
  const auto kernel = norm ? StagedRouterKernel<true> : StagedRouterKernel<false>;
  OptInSharedMemoryOnce(reinterpret_cast<const void*>(kernel));
  StagedRouterParams p{x.ptr<bf16_t>(),
                       w.ptr<bf16_t>(),
                       reinterpret_cast<float*>(static_cast<char*>(scratch) + 16),
                       static_cast<unsigned*>(scratch),
                       static_cast<int>(hidden),
                       static_cast<int>(experts),
                       route,
                       norm ? *norm : ResidualNorm{}};
  p.timeline = TimelineRecord(norm ? "StagedRouter+norm" : "StagedRouter", CeilDiv(experts, kStagedRouterWarps), s);
  LaunchPdl(kernel, dim3(CeilDiv(experts, kStagedRouterWarps)), dim3(kStagedRouterWarps * 32), smem, s, 1, p);
  return true;
}

}  // namespace

bool MoeRouter(const TensorView& x, const TensorView& w, const MoeRouting& routing, const TensorView& topk_ids,
               const TensorView& topk_weights, cudaStream_t s) {
  const int64_t tokens = x.dim(0), hidden = x.dim(1), experts = w.dim(0);
  const int k = routing.top_k;
  const int max_tokens = std::min(kRouterMaxTokens, Tuning().fused_router_max_tokens);
  const bool staged = Tuning().staged_router && tokens == 1;
  if (tokens > max_tokens && !staged) return false;
  const RouteParams route = CheckedRoute(x, w, routing, topk_ids, topk_weights);
  if (staged && LaunchStagedRouter(x, w, route, routing.num_groups, nullptr, s)) return true;
  if (tokens > max_tokens) return false;
  const size_t smem = RouterSmemBytes(static_cast<int>(experts), routing.num_groups);
  if (experts % (2 * kRouterCtas) != 0 || hidden % 8 != 0 || !w.is_contiguous() || x.strides[1] != 1 ||
      reinterpret_cast<uintptr_t>(x.data) % 16 != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0 ||
      (tokens > 1 && x.strides[0] % 8 != 0) || smem > 48 * 1024 || k > kMaxTopK)
    return false;
  if (tokens == 0) return true;
  RouterParams p{x.ptr<bf16_t>(), tokens > 1 ? x.strides[0] : hidden, w.ptr<bf16_t>(), static_cast<int>(hidden),
                 static_cast<int>(experts / kRouterCtas), route};
  LaunchPdl(RouterKernel, dim3(kRouterCtas), dim3(kRouterWarps * 32), smem, s, kRouterCtas, p);
  return true;
}

// router_norm.cu: the norm, router and routing of 1-8 tokens in one cluster launch (false: nothing launched).
bool LaunchClusterNormRouter(const ResidualNorm& norm, const TensorView& w, const RouteParams& route, int num_groups,
                             cudaStream_t s);

bool RmsNormMoeRouter(const TensorView& y, const TensorView& norm_w, float eps, const TensorView& sum,
                      const TensorView& x, const TensorView& w_router, const MoeRouting& routing,
                      const TensorView& topk_ids, const TensorView& topk_weights, cudaStream_t s) {
  const bool cluster = Tuning().cluster_norm_router > 0;
  const int64_t max_tokens = cluster ? Tuning().cluster_norm_router_max_tokens : 1;
  if ((!cluster && !Tuning().staged_router_norm) || x.rank() != 2 || x.dim(0) < 1 ||
      x.dim(0) > max_tokens)
    return false;
  ResidualNorm norm;
  const bool fits = MakeResidualNorm(&y, norm_w, eps, sum, x, &norm);
  const RouteParams route = CheckedRoute(x, w_router, routing, topk_ids, topk_weights);
  if (!fits) return false;
  if (cluster && LaunchClusterNormRouter(norm, w_router, route, routing.num_groups, s)) return true;
  return Tuning().staged_router_norm && LaunchStagedRouter(x, w_router, route, routing.num_groups, &norm, s);
}

}  // namespace corolla::cuda
