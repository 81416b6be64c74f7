// Backend::RmsNormMoeRouter of 1..8 tokens (Tuning().cluster_norm_router_max_tokens) in one
// launch of one thread block cluster (Tuning().cluster_norm_router CTAs: 16, the default, or 8):
// the post-attention residual add and RMSNorm, the router logits and the routing, where the
// unfused path runs RmsNorm, the router GEMV and MoeRoute as three dependent kernels (each a
// dependency release and an L2 trip on the decode step's critical path).
// - CTA r of the cluster holds router rows [r R, (r + 1) R), R = ceil(E / cluster), in shared
//   memory: each warp bulk-copies its contiguous share before the grid dependency wait (weights
//   only), so under programmatic dependent launch the rows land while the o_proj GEMV runs.
// - After the wait every CTA (past one token with register rows: see below) forms h = bf16(sum +
//   y) and x = bf16(w * h / rms(h)) for every token's whole row, a 16-byte chunk of each row a
//   thread with RmsNormKernel's block size and reduction order (the same bits as the RmsNorm
//   kernel; the tokens' sums share one barrier), stages x and h, and each warp dots its rows with
//   every token's x (StagedDot<1>, the staged GEMV's order: at one token and one router row a CTA
//   there, the same logit bits).
// - Each warp writes its logits into CTA 0's shared memory (DSMEM); one cluster barrier; CTA 0's
//   warps route a token each (RouteToken), while every CTA writes its share of sum and x back
//   (all CTAs have read sum by the barrier; the register build past one token wrote them back
//   before).
// - Past one token the shared-memory build takes every token at once (a warp a token for the
//   norm's sums); the register build's CTA r forms token r's row alone and writes its sum and x
//   back, one cluster barrier, then its warps dot their rows with every token's x (read through
//   L2) on the tensor cores (MmaDots).
// No global counters, fences or second kernel: the logits never leave the cluster. Timeline
// marks (timeline.h): 0 the norm's sums (one row a CTA: the row formed), 4 every token's x
// staged, 1 the CTA's logits pushed, 2 after the barrier, 3 routed.
// With Tuning().cluster_norm_router_regs, where a warp holds at most one row of at most 2048
// (Qwen3-30B-A3B: 8 rows of 2048 a CTA of 8 warps), the rows go to registers instead (a lane's
// chunks of its warp's row, loaded before the wait: StagedDot<1>'s layout, so the same bits):
// the CTAs then need little shared memory (~6 KB at one token) and can wait beside the o_proj
// GEMV's.
#include <cooperative_groups.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/timeline.h"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kMaxThreads = 1024;            // a 16-byte chunk of the row a thread: H <= 8192
constexpr int kBarBytes = 8 * kMaxThreads / 32;  // an mbarrier a warp
constexpr int kMaxExperts = 4096;
constexpr int kRegChunks = 8;  // 16-byte chunks of its row a lane holds in registers: H <= 2048
constexpr int kMaxTokens = 8;

std::atomic<int64_t> reg_launches{0};  // ClusterNormRouterRegLaunches

struct ClusterNormRouterParams {
  ResidualNorm norm;  // rows [tokens, H]
  const bf16_t* w;  // [E, H]
  int hidden, experts;
  int rows_per_cta;  // R
  int x_bytes;       // a staged row of x or h: H bf16 rounded up to 128 bytes
  RouteParams route;             // route.tokens (<= kMaxTokens) tokens; logits unused
  uint64_t* timeline = nullptr;  // timeline.h
};

// Dynamic shared memory: mbarriers, x [S][H] and h [S][H] (S = T; with register rows 1 at one
// token and none past one), the CTA's rows [R][H] (bf16; none with kRegRows), then CTA 0's
// logits, probs, choice [T][E] and group scores [T][groups] (floats; RouteToken's scratch, a
// token's each).
size_t ClusterNormRouterSmem(int64_t hidden, int tokens, int staged_tokens, int staged_rows,
                             int experts, int num_groups) {
  const int64_t x_bytes = (2 * hidden + 127) / 128 * 128;
  return kBarBytes + 2 * staged_tokens * x_bytes + static_cast<size_t>(staged_rows) * hidden * 2 +
         sizeof(float) * tokens * (3 * static_cast<size_t>(experts) + num_groups);
}

// StagedDot<1>'s sum (chunk j of the lane into partial j % 4, the four added in order, then the
// warp sum) with the lane's chunks of the row in registers: chunk j is row[lane * 8 + 256 j].
__device__ __forceinline__ float RegDot(const uint4 (&w)[kRegChunks], const bf16_t* xs, int k, int lane) {
  float acc[4] = {};
#pragma unroll
  for (int j = 0; j < kRegChunks; ++j) {
    const int c = lane * 8 + j * 256;
    if (c >= k) break;
    float xf[8], wf[8];
    LoadShared8(xs + c, xf);
    Bf16x8 wv;
    memcpy(&wv, &w[j], sizeof(wv));
    Unpack8(wv, wf);
#pragma unroll
    for (int i = 0; i < 8; ++i) acc[j % 4] = fmaf(wf[i], xf[i], acc[j % 4]);
  }
  return WarpSum(acc[0] + acc[1] + acc[2] + acc[3]);
}

// The multi-token register build's dots on the tensor cores (mma.sync m16n8k16; rows 8-15 of A
// zero): warp w takes columns [256 w, 256 w + 256) of the CTA's rows (at most 8), lane (g, q) =
// (lane / 4, lane % 4) holding row g's 16-byte chunks at 256 w + 32 b + 8 q, b < 8 (wr, loaded
// before the wait). Any order of k that A and B share gives the dot, so chunk b's eight columns
// are the mma's k {2q, 2q+1, 2q+8, 2q+9} of two k-steps, and B's are token g's same chunk of x:
// one 16-byte load a lane a chunk, where RegDot a token at a time read every token's whole row a
// warp. xg: token g's x, read through L2 (CTA g of the cluster wrote it). Returns the warp's
// share of row g's dots with tokens 2q and 2q + 1.
__device__ __forceinline__ float2 MmaDots(const uint4 (&w)[kRegChunks], const bf16_t* xg,
                                          int tokens, int k, int warp, int lane) {
  const int g = lane / 4, q = lane % 4;
  float d[4] = {};
  uint4 xv[kRegChunks];
#pragma unroll
  for (int b = 0; b < kRegChunks; ++b) {  // every load in flight before the first mma
    const int c = 256 * warp + 32 * b + 8 * q;
    xv[b] = g < tokens && c < k ? __ldcg(reinterpret_cast<const uint4*>(xg + c))
                                : make_uint4(0, 0, 0, 0);
  }
#pragma unroll
  for (int b = 0; b < kRegChunks; ++b) {
    mma::Mma16816(d, {w[b].x, 0u, w[b].y, 0u}, xv[b].x, xv[b].y);
    mma::Mma16816(d, {w[b].z, 0u, w[b].w, 0u}, xv[b].z, xv[b].w);
  }
  return make_float2(d[0], d[1]);
}

// kRegRows: the rows in registers, H <= 2048 (so at most 256 threads): at one token a row a warp
// (at most one), past one MmaDots' layout (a slice of the columns of every row a warp).
// kOneToken: a batch of one token (the count a constant: batch 1's build keeps its registers).
// ptxas (sm_90a): 75 registers (rows in registers, one token; without the explicit minimum of one
// CTA ptxas held it to 64 and spilled), 99 (registers, more tokens), 64 (shared memory, one
// token), 64 and 8 bytes spilled (shared memory, more tokens: the 1024-thread bound; none before
// RouteToken's branch to RouteTokenByLogits, session 57). 75 with kAsync.
// kAsync (register rows, one token; Tuning().cluster_norm_router_async): each warp's logit goes to
// CTA 0 by st.async, completing 4 bytes on CTA 0's mbarrier (armed for E x 4 before the wait and
// published by a relaxed cluster barrier), instead of a DSMEM store and cluster.sync(), whose
// release arrival waits for the CTA's stores to be performed. The write-back of sum and x then
// waits on a second relaxed cluster barrier: what it must follow, every CTA's reads of sum and y,
// is over by the arrival (their values are in the logit pushed before it).
template <bool kRegRows, bool kOneToken, bool kAsync = false>
__global__ void __launch_bounds__(kRegRows ? kRegChunks * 32 : kMaxThreads, 1)
    ClusterNormRouterKernel(const __grid_constant__ ClusterNormRouterParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  cg::cluster_group cluster = cg::this_cluster();
  TimelineScopeLocal tl(p.timeline);
  const int rank = static_cast<int>(cluster.block_rank()), ctas = static_cast<int>(cluster.num_blocks());
  const int t = threadIdx.x, warp = t / 32, lane = t % 32, warps = blockDim.x / 32;
  // This warp's contiguous rows of the CTA's slice.
  const int cta_row0 = rank * p.rows_per_cta;
  const int cta_rows = max(0, min(p.rows_per_cta, p.experts - cta_row0));
  const int per_warp = cta_rows / warps, extra = cta_rows % warps;
  const int row0 = warp * per_warp + min(warp, extra), rows = per_warp + (warp < extra ? 1 : 0);
  // kSpread: CTA r alone forms token r's h and x, straight to global memory (the others read x
  // back through L2); nothing staged.
  constexpr bool kSpread = kRegRows && !kOneToken;
  const int tokens = kOneToken ? 1 : static_cast<int>(p.route.tokens), hidden = p.hidden,
            experts = p.experts, xe = p.x_bytes / 2, staged = kSpread ? 0 : tokens;
  bf16_t* xs = reinterpret_cast<bf16_t*>(smem + kBarBytes);  // token i's x at xs + i * xe
  bf16_t* hs = xs + staged * xe;                             // its h (sum + y) at hs + i * xe
  const bf16_t* ws = hs + staged * xe;
  const int staged_rows = kRegRows ? 0 : p.rows_per_cta;
  float* logits = reinterpret_cast<float*>(const_cast<bf16_t*>(ws) +
                                           static_cast<int64_t>(staged_rows) * hidden);
  float* probs = logits + tokens * experts;
  float* choice = probs + tokens * experts;
  float* group_score = choice + tokens * experts;
  __shared__ float partial[kMaxTokens][32];  // the tokens' per-warp sums of squares
  const uint32_t bar = wgmma::SmemAddr(smem + 8 * warp);
  uint4 wr[kRegChunks];
  if (kRegRows && !kOneToken) {  // MmaDots' chunks: row g's, a slice of its columns a warp
    const int g = lane / 4, q = lane % 4;
    const bf16_t* row = p.w + static_cast<int64_t>(cta_row0 + g) * hidden;
#pragma unroll
    for (int b = 0; b < kRegChunks; ++b) {
      const int c = 256 * warp + 32 * b + 8 * q;
      wr[b] = g < cta_rows && c < hidden ? __ldcs(reinterpret_cast<const uint4*>(row + c))
                                         : make_uint4(0, 0, 0, 0);
    }
  } else if (kRegRows && rows > 0) {  // rows <= 1: the lane's chunks of the warp's row
    const bf16_t* row = p.w + static_cast<int64_t>(cta_row0 + row0) * hidden;
#pragma unroll
    for (int j = 0; j < kRegChunks; ++j)
      if (lane * 8 + j * 256 < hidden)
        wr[j] = __ldcs(reinterpret_cast<const uint4*>(row + lane * 8 + j * 256));
  } else if (lane == 0 && rows > 0) {
    const uint32_t bytes = static_cast<uint32_t>(rows) * hidden * 2;
    wgmma::MbarInit(bar, 1);
    wgmma::MbarInitFence();
    wgmma::MbarArriveExpectTx(bar, bytes);
    wgmma::BulkCopy(wgmma::SmemAddr(ws + static_cast<int64_t>(row0) * hidden),
                    p.w + static_cast<int64_t>(cta_row0 + row0) * hidden, bytes, bar,
                    wgmma::EvictFirst());
  }
  // RmsNormKernel<true>'s arithmetic for chunk t of each row (its launch has one thread per chunk
  // too); the norm weights are weights: loaded before the wait.
  const bool mine = t < hidden / 8;
  float nw[8];
  if (mine) NormWeight8(p.norm.w, p.norm.w_f32, 8 * t, nw);
  const uint32_t logits_bar = wgmma::SmemAddr(smem);  // kAsync: CTA 0's (warp 0's slot, unused with register rows)
  if constexpr (kAsync) {
    static_assert(kRegRows && kOneToken, "kAsync pushes one token's logits from register rows");
    if (rank == 0 && t == 0) {
      wgmma::MbarInit(logits_bar, 1);
      wgmma::MbarInitFence();
      wgmma::MbarArriveExpectTx(logits_bar, static_cast<uint32_t>(experts) * 4);
    }
    // (The cluster barrier's intrinsics, not inline PTX: their .aligned forms need the warp
    // converged, which the compiler ensures only for its own; session 57's inline form hung,
    // likely for that.)
    __syncwarp();
    __cluster_barrier_arrive_relaxed();  // waited before the pushes
  }
  __syncwarp();  // the mbarrier's initialisation before the other lanes wait on it
  GridDependencyWait();  // sum and y come from the kernels before
  tl.Waited();
  TriggerDependents();
  if (kOneToken || kSpread) {
    // One row a CTA: token 0 in every CTA (each dots its rows with it), or past one token token r
    // by CTA r alone (forming every row in every CTA took 4.1 us at 8 tokens), written back before
    // one cluster barrier; the others then read its x through L2 (through DSMEM, the forming SM's
    // ~25 GB/s out took 2.6 us at 8 tokens).
    if (kOneToken || rank < tokens) {
      const int64_t c = static_cast<int64_t>(kOneToken ? 0 : rank) * hidden + 8 * t;
      float a[8] = {};
      if (mine)
        Store8(kSpread ? p.norm.sum + c : hs + 8 * t,
               ResidualAdd8(p.norm.y + c, p.norm.sum + c, a));
      float ss = 0.0f;
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += a[i] * a[i];
      ss = WarpSum(ss);  // BlockSum's order
      if (lane == 0) partial[0][warp] = ss;
      __syncthreads();
      ss = WarpSum(lane < warps ? partial[0][lane] : 0.0f);
      if (mine)
        Store8(kSpread ? p.norm.x + c : xs + 8 * t,
               NormScale8(nw, a, rsqrtf(ss / hidden + p.norm.eps)));
    }
    tl.Mark(0);
    if (kSpread) {
      cluster.sync();  // every token's x in global memory (release / acquire at cluster scope)
    } else {
      __syncthreads();
    }
  } else {
    // The shared-memory build past one token: every CTA forms every row, a row's loads at a time
    // (its 1024-thread bound holds it to 64 registers a thread), every token's sums of squares
    // in one barrier.
    for (int i = 0; i < tokens; ++i) {
      const int64_t c = static_cast<int64_t>(i) * hidden + 8 * t;
      float a[8] = {};
      if (mine) Store8(hs + i * xe + 8 * t, ResidualAdd8(p.norm.y + c, p.norm.sum + c, a));
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < 8; ++j) ss += a[j] * a[j];
      ss = WarpSum(ss);
      if (lane == 0) partial[i][warp] = ss;
    }
    __syncthreads();
    tl.Mark(0);  // sum + y read, the sums of squares formed
    // A warp a token forms 1 / rms (BlockSum's order: the same bits) into its token's first slot
    // of partial (only that warp reads the row), then every thread scales its chunk of each row.
    for (int i = warp; i < tokens; i += warps) {
      const float ss = WarpSum(lane < warps ? partial[i][lane] : 0.0f);
      if (lane == 0) partial[i][0] = rsqrtf(ss / hidden + p.norm.eps);
    }
    __syncthreads();
    if (mine) {
#pragma unroll 1
      for (int i = 0; i < tokens; ++i) {
        float a[8];
        LoadShared8(hs + i * xe + 8 * t, a);
        Store8(xs + i * xe + 8 * t, NormScale8(nw, a, partial[i][0]));
      }
    }
    __syncthreads();  // x staged
  }
  tl.Mark(4);
  // kAsync: CTA 0's mbarrier armed (every CTA arrived before its dependency wait: no wait here)
  if constexpr (kAsync) {
    __syncwarp();
    __cluster_barrier_wait();
  }
  float* dst = cluster.map_shared_rank(logits, 0);
  if constexpr (kSpread) {
    // The warps' column slices summed in warp order; thread i * 8 + r pushes row r's logit of token
    // i (a warp's store: four tokens' rows, 32 bytes each).
    __shared__ float dots[kRegChunks][kMaxTokens][8];  // [warp][token][row]
    const int g = min(lane / 4, tokens - 1);
    const float2 d =
        MmaDots(wr, p.norm.x + static_cast<int64_t>(g) * hidden, tokens, hidden, warp, lane);
    dots[warp][2 * (lane % 4)][lane / 4] = d.x;
    dots[warp][2 * (lane % 4) + 1][lane / 4] = d.y;
    __syncthreads();
    for (int j = t; j < tokens * 8; j += blockDim.x) {
      const int i = j / 8, r = j % 8;
      if (r >= cta_rows) continue;
      float v = 0.0f;
      for (int w = 0; w < warps; ++w) v += dots[w][i][r];
      dst[i * experts + cta_row0 + r] = v;
    }
  } else if (rows > 0) {
    if constexpr (kAsync) {
      const float v = RegDot(wr, xs, hidden, lane);
      if (lane == 0) {
        uint32_t slot, bar0;
        asm volatile("mapa.shared::cluster.u32 %0, %1, 0;\n" : "=r"(slot) : "r"(wgmma::SmemAddr(logits + cta_row0 + row0)));
        asm volatile("mapa.shared::cluster.u32 %0, %1, 0;\n" : "=r"(bar0) : "r"(logits_bar));
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n"
                     ::"r"(slot), "r"(__float_as_uint(v)), "r"(bar0) : "memory");
      }
    } else if constexpr (kRegRows) {
      const float v = RegDot(wr, xs, hidden, lane);
      if (lane == 0) dst[cta_row0 + row0] = v;
    } else {
      wgmma::MbarWait(bar, 0);
      for (int r = 0; r < rows; ++r)
        for (int i = 0; i < tokens; ++i) {
          float v[1];
          StagedDot<1>(ws + static_cast<int64_t>(row0 + r) * hidden, xs + i * xe, hidden, lane, v);
          if (lane == 0) dst[i * experts + cta_row0 + row0 + r] = v[0];
        }
    }
  }
  if constexpr (kAsync) {
    __syncwarp();
    __cluster_barrier_arrive_relaxed();  // this CTA's reads are over
    tl.Mark(1);  // this CTA's logits pushed
    if (rank == 0) wgmma::MbarWait<true>(logits_bar, 0);  // every logit in CTA 0 (acquired)
  } else {
    tl.Mark(1);  // this CTA's logits pushed
    cluster.sync();  // every logit in CTA 0; every CTA has read sum and y
  }
  tl.Mark(2);
  if (rank == 0) {
    const int groups = p.route.num_groups;
    for (int i = warp; i < tokens; i += warps)
      RouteToken(p.route, i, logits + i * experts, probs + i * experts, choice + i * experts,
                 group_score + i * groups, lane);
    tl.Mark(3);  // routed (CTA 0)
  }
  if constexpr (kSpread) return;  // (written back before the first barrier)
  // kAsync: every CTA has read sum and y.
  if constexpr (kAsync) {
    __syncwarp();
    __cluster_barrier_wait();
  }
  // Chunk t of row i is written back by CTA (i * chunks + t) % ctas.
  const int chunks = hidden / 8;
  for (int i = 0; i < tokens; ++i)
    if (mine && (i * chunks + t) % ctas == rank) {
      const int64_t c = static_cast<int64_t>(i) * chunks + t;
      *reinterpret_cast<uint4*>(p.norm.sum + 8 * c) =
          *reinterpret_cast<const uint4*>(hs + i * xe + 8 * t);
      *reinterpret_cast<uint4*>(p.norm.x + 8 * c) =
          *reinterpret_cast<const uint4*>(xs + i * xe + 8 * t);
    }
}

}  // namespace

// Declared in router.cu (its only caller), which has checked the arguments. False where the
// shapes or the device rule the cluster out (nothing launched).
bool LaunchClusterNormRouter(const ResidualNorm& norm, const TensorView& w, const RouteParams& route, int num_groups,
                             cudaStream_t s) {
  const int want = Tuning().cluster_norm_router;
  const int64_t hidden = w.dim(1), experts = w.dim(0);
  if (want <= 0 || hidden % 8 != 0 || hidden / 8 > kMaxThreads || experts > kMaxExperts ||
      !w.is_contiguous() || reinterpret_cast<uintptr_t>(w.data) % 16 != 0 ||
      route.top_k > kMaxTopK || route.tokens < 1 ||
      route.tokens > std::min(kMaxTokens, Tuning().cluster_norm_router_max_tokens))
    return false;
  int device = 0, max_smem = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  // RmsNorm's block size for this row: the norm's reduction order depends on it.
  const int threads = std::clamp<int>(static_cast<int>((hidden / 8 + 31) / 32 * 32), 32, kMaxThreads);
  // Only the configured size: where 16 does not fit, 8 is no fallback (on an H200 it made the
  // step slower than the three kernels).
  const int ctas = want > 8 ? 16 : 8;
  const int rows_per_cta = CeilDiv(experts, ctas);
  const bool reg_rows = Tuning().cluster_norm_router_regs && rows_per_cta <= threads / 32 &&
                        hidden <= int64_t{kRegChunks} * 256;
  const size_t smem =
      ClusterNormRouterSmem(hidden, static_cast<int>(route.tokens),
                            reg_rows && route.tokens > 1 ? 0 : static_cast<int>(route.tokens),
                            reg_rows ? 0 : rows_per_cta, static_cast<int>(experts), num_groups);
  // (1 KB left for the static shared memory: the sums of squares; the multi-token register
  // build's 2 KB more of dots come with E <= 128, far from the limit)
  if (smem > static_cast<size_t>(max_smem) - 1024) return false;
  const bool one = route.tokens == 1;
  const auto kernel =
      reg_rows
          ? (one ? (Tuning().cluster_norm_router_async ? ClusterNormRouterKernel<true, true, true>
                                                        : ClusterNormRouterKernel<true, true>)
                 : ClusterNormRouterKernel<true, false>)
          : (one ? ClusterNormRouterKernel<false, true> : ClusterNormRouterKernel<false, false>);
  OptInSharedMemoryOnce(reinterpret_cast<const void*>(kernel));
  if (!ClusterFits(reinterpret_cast<const void*>(kernel), ctas, threads, smem)) return false;
  ClusterNormRouterParams p{norm,
                            w.ptr<bf16_t>(),
                            static_cast<int>(hidden),
                            static_cast<int>(experts),
                            rows_per_cta,
                            static_cast<int>((2 * hidden + 127) / 128 * 128),
                            route};
  p.timeline = TimelineRecord(reg_rows ? "ClusterNormRouter regs" : "ClusterNormRouter", ctas, s);
  LaunchPdl(kernel, dim3(ctas), dim3(threads), smem, s, ctas, p);
  if (reg_rows) reg_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

int64_t ClusterNormRouterRegLaunches() { return reg_launches.load(std::memory_order_relaxed); }

}  // namespace corolla::cuda
