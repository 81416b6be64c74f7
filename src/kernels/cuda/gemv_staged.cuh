// The staged GEMV of one row (GemvStagedKernel, gemv.cu's Linear, RmsNormLinear and NormLinear):
// one CTA an SM stages its whole slice of W [N, K] in shared memory by bulk copies issued before
// its dependency wait, then multiplies it with x. Internal to gemv.cu, which includes it (an
// anonymous namespace).
#pragma once

#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/expert_prefetch.h"
#include "kernels/cuda/moe_decode.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

// ---- staged: one row of x, the CTA's whole slice of W in shared memory --------------------------
constexpr int kStagedWarps = 16;
constexpr int kStagedHeader = 8 * kStagedWarps;  // the warps' mbarriers
// Shared memory a staged CTA may take (its slice, x, the header): leaves room on the SM for a
// kernel before it (the decode attention takes <= 12 KB) on a 228 KB carveout.
constexpr int64_t kStagedMaxSmem = 200 * 1024;

// Tuning().moe_predict: the batch-1 o_proj's first `ctas` CTAs predict the layer's MoE routing
// before their dependency wait (PredictMoeRouting). picks null: no prediction.
struct MoePredictParams {
  const bf16_t* router = nullptr;  // [E, H]
  const void* norm_w = nullptr;    // [H] the post-attention norm's, bf16 or f32 with norm_f32
  bool norm_f32 = false;
  const bf16_t* sum = nullptr;  // [H]: the layer's input (the residual before the attention)
  int32_t* picks = nullptr;     // MoePredictedPicks (moe_decode.h)
  int experts = 0, hidden = 0, top_k = 0, tag = 0;
  int ctas = 0;  // the predicting CTAs, E / ctas rows each (dividing kStagedWarps)
};

// Tuning().moe_prefetch_qkv(_down), an experiment: the batch-1 qkv projection's CTAs prefetch into
// L2, as they leave, the first gate_up_rows rows of each pick's gate and up halves and the first
// down_rows rows of its W_down (PrefetchPickedExperts). picks null: none.
struct ExpertL2Prefetch {
  const int32_t* picks = nullptr;  // [top_k]: MoePreviousPicks or MoePredictedPicks (moe_decode.h)
  const bf16_t* gate_up = nullptr;  // [E, 2I, H]
  const bf16_t* down = nullptr;     // [E, H, I]
  int experts = 0, top_k = 0, hidden = 0, inter = 0;
  int gate_up_rows = 0, down_rows = 0;
  bool evict_last = false;
  int tag = 0;  // picks predicted (MoePredictedPicks): prefetch only where this tag is beside them
};

struct StagedGemvParams {
  const bf16_t* x;  // (with the norm: unused)
  const bf16_t* w;
  void* out;
  int n, k;
  int rows_per_cta;
  int x_bytes;  // x's share of shared memory (K bf16, rounded up to 128 bytes)
  bool out_f32;
  // null, or [cta][6]: global timer (ns) at entry, after the wait, x and W staged, end; then the
  // SM's clock64() at staged and at end (their ratio to the timer gives the SM clock).
  uint64_t* trace;
  // RmsNormLinear's norm folded in (y null: x as given), K <= 8 * the CTA's threads (a 16-byte
  // chunk a thread); its CTAs count themselves on `arrivals` (per stream, zero between launches).
  ResidualNorm norm;
  unsigned* arrivals;
  uint64_t* timeline = nullptr;  // timeline.h
  int spread_ns = 0;             // Tuning().gemv_staged_spread_ns
  int depth = 0;                 // Tuning().gemv_staged_depth(_norm): copies in flight a CTA
  MoePredictParams pred{};       // GemvStagedKernel<false, true> only
  ExpertL2Prefetch l2{};
};

// ExpertL2Prefetch's prefetches, by one thread of each CTA: its share of the picks' rows
// (ForEachExpertPrefetch, expert_prefetch.h).
__device__ __noinline__ void PrefetchPickedExperts(const ExpertL2Prefetch& f) {
  const int64_t gate = int64_t{f.gate_up_rows} * f.hidden * 2, down = int64_t{f.down_rows} * f.inter * 2;
  const uint64_t policy = f.evict_last ? wgmma::EvictLast() : wgmma::EvictNormal();
  ForEachExpertPrefetch(gate, down, f.top_k, blockIdx.x, gridDim.x, [&](int slot, int region, int64_t offset, int64_t bytes) {
    const int e = __ldcg(f.picks + slot);
    if (e < 0 || e >= f.experts) return;
    const char* base = region == 2 ? reinterpret_cast<const char*>(f.down) + int64_t{e} * f.hidden * f.inter * 2
                                   : reinterpret_cast<const char*>(f.gate_up) +
                                         (int64_t{e} * 2 + region) * f.inter * f.hidden * 2;
    wgmma::PrefetchL2(base + offset, static_cast<uint32_t>(bytes), policy);
  });
}

// MoePredictParams's prediction, by every thread of CTA b < p.ctas: rows [b R, b R + R) of the
// router (R = E / ctas), kStagedWarps / R warps a row, dotted with x~ = norm_w * sum (ranks
// only: no 1 / rms, which scales every logit alike) into the logits; the last CTA to arrive has
// one warp pick the top k (softmax keeps the logits' order; keys of the logit's order above
// 127 - e, so that REDUX max finds a pick and its expert at once, lower ids first in a tie at
// 2^-16 of the logit) and tag them. The counter is re-armed by that CTA.
// In two parts: the loads of the thread's first chunk (PredictLoads), issued before the CTA's
// bulk copies, which would otherwise queue them behind its 128 KB of weights (session 56: the
// dots then ended ~5 us after entry, past the wait), then the rest (PredictMoeRouting).
struct PredictChunk {
  int c;          // the thread's first column (past H: none)
  uint4 w, h;     // its router row's and sum's 8 bf16
  float n[8];     // the norm's weights
  const bf16_t* row;
};
__device__ __forceinline__ PredictChunk PredictLoads(const MoePredictParams& p, bool with_sum = true) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = p.experts / p.ctas, per_row = kStagedWarps / rows;
  PredictChunk q;
  q.row = p.router + static_cast<int64_t>(blockIdx.x * rows + warp / per_row) * p.hidden;
  q.c = (warp % per_row * 32 + lane) * 8;
  if (q.c < p.hidden) {
    q.w = __ldcs(reinterpret_cast<const uint4*>(q.row + q.c));
    if (with_sum) q.h = __ldcg(reinterpret_cast<const uint4*>(p.sum + q.c));
    NormWeight8(p.norm_w, p.norm_f32, q.c, q.n);
  }
  return q;
}
__device__ __forceinline__ float PredictDot(const uint4& wu, const uint4& hu, const float (&n)[8]) {
  Bf16x8 wv, hv;
  memcpy(&wv, &wu, sizeof(wv));
  memcpy(&hv, &hu, sizeof(hv));
  float w[8], h[8], acc = 0.f;
  Unpack8(wv, w);
  Unpack8(hv, h);
#pragma unroll
  for (int i = 0; i < 8; ++i) acc = fmaf(w[i], n[i] * h[i], acc);
  return acc;
}
__device__ __forceinline__ void PredictMoeRouting(const MoePredictParams& p, const PredictChunk& q) {
  __shared__ float partial[kStagedWarps];
  __shared__ bool last;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int rows = p.experts / p.ctas, per_row = kStagedWarps / rows;
  float acc = q.c < p.hidden ? PredictDot(q.w, q.h, q.n) : 0.f;
  for (int c = q.c + per_row * 256; c < p.hidden; c += per_row * 256) {
    float n[8];
    NormWeight8(p.norm_w, p.norm_f32, c, n);
    acc += PredictDot(__ldcs(reinterpret_cast<const uint4*>(q.row + c)),
                      __ldcg(reinterpret_cast<const uint4*>(p.sum + c)), n);
  }
  acc = WarpSum(acc);
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  float* logits = reinterpret_cast<float*>(p.picks + kMoePredictionLogits);
  unsigned* arrivals = reinterpret_cast<unsigned*>(p.picks + kMoePredictionArrivals);
  if (t < rows) {
    float v = 0.f;
    for (int i = 0; i < per_row; ++i) v += partial[t * per_row + i];
    logits[blockIdx.x * rows + t] = v;
  }
  __syncthreads();
  if (t == 0) {
    __threadfence();
    last = atomicAdd(arrivals, 1u) == static_cast<unsigned>(p.ctas) - 1;
  }
  __syncthreads();
  if (!last || warp != 0) return;
  __threadfence();
  unsigned key[kMoePredictionMaxExperts / 32];
#pragma unroll
  for (int j = 0; j < kMoePredictionMaxExperts / 32; ++j) {
    const int e = lane + 32 * j;
    key[j] = e < p.experts ? (OrderedKey(__ldcg(logits + e)) & ~0x7Fu) | (127u - e) : 0u;
  }
  int pick = -1;
  for (int i = 0; i < p.top_k; ++i) {
    unsigned m = 0;
#pragma unroll
    for (int j = 0; j < kMoePredictionMaxExperts / 32; ++j) m = max(m, key[j]);
    const unsigned best = __reduce_max_sync(0xffffffffu, m);
#pragma unroll
    for (int j = 0; j < kMoePredictionMaxExperts / 32; ++j)
      if (key[j] == best) key[j] = 0;
    if (lane == i) pick = 127 - static_cast<int>(best & 0x7Fu);
  }
  if (lane < p.top_k) p.picks[lane] = pick;
  __syncwarp();
  if (lane == 0) {
    __threadfence();
    *reinterpret_cast<volatile int32_t*>(p.picks + kMoePredictionTag) = p.tag;
    *arrivals = 0;
  }
}

// The norm variant's staging of x: thread t forms chunk t of h = bf16(sum + y), the CTA sums h^2
// (warp sums, then every thread adds the 16 in order: the same 1 / rms in every CTA), and stores
// bf16(w * h / rms) to xs. The CTA then counts itself on the arrival counter (all its threads have
// read sum and y); the last CTA to arrive writes h to sum and the normed row to x.
// kAdded (NormLinear: sum already holds h, MoeExpertsResidual having added y): h is sum as it
// is, nothing is counted, and CTA 0 writes x.
template <bool kAdded>
__device__ __forceinline__ void StageNormedX(const StagedGemvParams& p, bf16_t* xs) {
  __shared__ float warp_ss[kStagedWarps];
  __shared__ unsigned last_cta;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const bool mine = t < p.k / 8;
  float a[8] = {};
  Bf16x8 h{};
  if (mine) {
    if constexpr (kAdded) LoadCg8(p.norm.sum + 8 * t, a);
    else h = ResidualAdd8(p.norm.y + 8 * t, p.norm.sum + 8 * t, a);
  }
  float ss = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) ss += a[i] * a[i];
  ss = WarpSum(ss);
  if (lane == 0) warp_ss[warp] = ss;
  __syncthreads();  // every thread of this CTA has read sum and y
  if (!kAdded && t == 0) {
    __threadfence();
    last_cta = atomicAdd(p.arrivals, 1u) == gridDim.x - 1;
  }
  float total = 0.f;
#pragma unroll
  for (int w = 0; w < kStagedWarps; ++w) total += warp_ss[w];
  const float inv = rsqrtf(total / p.k + p.norm.eps);
  Bf16x8 xv{};
  if (mine) {
    xv = NormScale8(p.norm, 8 * t, a, inv);
    Store8(xs + 8 * t, xv);
  }
  __syncthreads();  // xs staged; last_cta seen by every thread
  if constexpr (kAdded) {
    if (blockIdx.x == 0 && mine) Store8(p.norm.x + 8 * t, xv);
  } else if (last_cta) {  // every CTA has read sum and y
    __threadfence();
    if (mine) {
      Store8(p.norm.sum + 8 * t, h);
      Store8(p.norm.x + 8 * t, xv);
    }
    if (t == 0) *p.arrivals = 0;  // re-armed for the next launch on this stream
  }
}

// A warp's `rows` rows of W from row0 on (at ws: shared memory once barrier `bar` has landed)
// times x (xs, shared), stored to p.out: groups of 4, then the last 1-3.
__device__ __forceinline__ void MultiplyStaged(const StagedGemvParams& p, const bf16_t* ws, const bf16_t* xs, int row0,
                                               int rows, uint32_t bar, int lane) {
  wgmma::MbarWait(bar, 0);
  if (p.trace && threadIdx.x == 0) {
    p.trace[blockIdx.x * 6 + 2] = wgmma::GlobalTimerNs();
    p.trace[blockIdx.x * 6 + 4] = clock64();
  }
  auto store = [&](int r, float v) {
    const int64_t o = row0 + r;
    if (p.out_f32) static_cast<float*>(p.out)[o] = v;
    else static_cast<bf16_t*>(p.out)[o] = __float2bfloat16(v);
  };
  auto group = [&](int r, auto rows_tag) {
    constexpr int kRows = decltype(rows_tag)::value;
    float acc[kRows];
    StagedDot<kRows>(ws + static_cast<int64_t>(r) * p.k, xs, p.k, lane, acc);
#pragma unroll
    for (int i = 0; i < kRows; ++i)
      if (lane == i) store(r + i, acc[i]);
  };
  int r = 0;
  for (; r + 4 <= rows; r += 4) group(r, std::integral_constant<int, 4>{});
  switch (rows - r) {
    case 3: group(r, std::integral_constant<int, 3>{}); break;
    case 2: group(r, std::integral_constant<int, 2>{}); break;
    case 1: group(r, std::integral_constant<int, 1>{}); break;
    default: break;
  }
  if (p.trace && threadIdx.x == 0) {
    p.trace[blockIdx.x * 6 + 3] = wgmma::GlobalTimerNs();
    p.trace[blockIdx.x * 6 + 5] = clock64();
  }
}

// CTA b owns rows [b * rows_per_cta, ...) of W, split evenly over its warps; each warp's lane 0
// issues one bulk copy of the warp's rows (contiguous in W) on the warp's mbarrier before the
// dependency wait. After it the CTA copies x to shared memory, and each warp multiplies its rows
// (groups of 4, then the last 1-3) once its copy has landed.
// At most 64 registers (2 CTAs' worth an SM): a CTA must fit beside the kernel before it.
// kBeside: the same kernel as a second function, so that it keeps a carveout of its own (function
// attributes are per function): the one launched beside a folded decode attention. kPredict: the
// batch-1 o_proj predicting the MoE's routing (p.pred) while it waits, a function of its own so
// that the others' code stays as it was.
template <bool kBeside, bool kPredict = false>
__global__ void __launch_bounds__(kStagedWarps * 32, 2) GemvStagedKernel(const __grid_constant__ StagedGemvParams p) {
  extern __shared__ __align__(128) unsigned char smem[];
  TimelineScope tl(p.timeline);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int cta_row0 = blockIdx.x * p.rows_per_cta;
  const int cta_rows = min(p.rows_per_cta, p.n - cta_row0);
  const int per_warp = cta_rows / kStagedWarps, extra = cta_rows % kStagedWarps;
  const int row0 = warp * per_warp + min(warp, extra), rows = per_warp + (warp < extra ? 1 : 0);
  bf16_t* xs = reinterpret_cast<bf16_t*>(smem + kStagedHeader);
  bf16_t* ws = reinterpret_cast<bf16_t*>(smem + kStagedHeader + p.x_bytes) + static_cast<int64_t>(row0) * p.k;
  const uint32_t bar = wgmma::SmemAddr(smem + 8 * warp);
  if (p.trace && threadIdx.x == 0) p.trace[blockIdx.x * 6] = wgmma::GlobalTimerNs();
  const bool predicts = kPredict && blockIdx.x < p.pred.ctas;
  PredictChunk chunk{};
  if (predicts) chunk = PredictLoads(p.pred);
  if (lane == 0 && rows > 0) {
    wgmma::MbarInit(bar, 1);
    wgmma::MbarInitFence();
  }
  // With a depth, warp w's copy waits for warp w - depth's to land (that warp has rows where this
  // one has: rows fall with the warp index): each barrier must be initialised first.
  if (p.depth > 0) __syncthreads();
  if (lane == 0 && rows > 0) {
    const uint32_t bytes = static_cast<uint32_t>(rows) * p.k * 2;
    if (p.depth > 0 && warp >= p.depth) wgmma::MbarWait(bar - 8 * p.depth, 0);
    if (p.spread_ns > 0 && warp > 0) {  // the CTA's barrier after the wait waits for this lane too
      const uint64_t until = wgmma::GlobalTimerNs() + static_cast<uint64_t>(p.spread_ns) * warp / kStagedWarps;
      while (wgmma::GlobalTimerNs() < until) __nanosleep(100);
    }
    wgmma::MbarArriveExpectTx(bar, bytes);
    wgmma::BulkCopy(wgmma::SmemAddr(ws), p.w + static_cast<int64_t>(cta_row0 + row0) * p.k, bytes, bar,
                    wgmma::EvictFirst());
  }
  if (predicts) PredictMoeRouting(p.pred, chunk);
  GridDependencyWait();  // x is the previous kernel's output
  tl.Waited();
  TriggerDependents();
  if (p.trace && threadIdx.x == 0) p.trace[blockIdx.x * 6 + 1] = wgmma::GlobalTimerNs();
  if (p.norm.y != nullptr) {
    StageNormedX<false>(p, xs);
  } else if (p.norm.sum != nullptr) {
    StageNormedX<true>(p, xs);
  } else {
    for (int c = threadIdx.x; c < p.k / 8; c += blockDim.x)
      reinterpret_cast<uint4*>(xs)[c] = reinterpret_cast<const uint4*>(p.x)[c];
    __syncthreads();
  }
  if (rows > 0) MultiplyStaged(p, ws, xs, cta_row0 + row0, rows, bar, lane);
  if (p.l2.picks != nullptr && threadIdx.x == 0 &&
      (p.l2.tag == 0 || reinterpret_cast<const volatile int32_t*>(p.l2.picks)[kMoePredictionTag] == p.l2.tag))
    PrefetchPickedExperts(p.l2);
}

// The staged GEMV with a norm folded in takes one row of K <= 8 x its threads, a contiguous
// 16-byte aligned bf16 w and a bf16 or f32 out [1, N]; the norm's tensors are checked by
// MakeResidualNorm.
inline bool StagedNormFits(const TensorView& x, const TensorView& w, const TensorView& out, bool norm_fits) {
  const int64_t k = x.dim(1), n = w.dim(0);
  COROLLA_CHECK(w.dtype == DType::kBF16 && w.rank() == 2 && w.dim(1) == k &&
                (out.dtype == DType::kBF16 || out.dtype == DType::kF32) && out.rank() == 2 && out.dim(0) == 1 &&
                out.dim(1) == n)
      << "rmsnorm_linear x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  return norm_fits && k % 8 == 0 && k <= 8 * kStagedWarps * 32 && w.is_contiguous() &&
         reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && out.strides[1] == 1;
}

}  // namespace
}  // namespace corolla::cuda
