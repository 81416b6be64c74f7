// Backend::DecodeMoeStack on CUDA: every decoder layer of a Qwen3-MoE model for one decode
// token in one persistent launch (a "megakernel"). At batch 1 the op-by-op step is bound by the
// ramp and tail of ~7 kernels a layer, not by HBM (notes/decode_step.md "Batch-1 decode, session
// 5"); here no kernel boundary stops the weight stream. Opt-in (Tuning().decode_stack): measured
// slower than the ops so far; notes/decode_step.md "Persistent decode kernel" has the phase times
// and what is next.
//
// One CTA per SM, 8 consumer warps and two producer warps. Each producer fills its own ring of
// 16 KB shared-memory stages with cp.async.bulk copies (completion by transaction count on the
// stage's full mbarrier; the consumers that read a stage free it through its empty mbarrier):
//   ring A: what is known before the step starts (each layer's qkv rows, the CTA's KV keys, o
//           rows, router rows), so producer A runs ahead across phases and layers as far as its
//           stages allow, while the consumers wait for other CTAs;
//   ring B: the routed experts' gate/up and down rows, issued once producer B has seen the
//           layer's router logits and routed them itself (RouteSoftmaxTopK, as MoeRoute).
// The resident layout (StackParams::resident, with 8 ring-A stages) keeps only the qkv rows
// ring A holds at once and the o rows in ring A, each stage refilled as soon as its rows are
// multiplied (o's land during the attention, the next layer's qkv during the routing); ring B
// then carries the other qkv rows, the keys and the router rows ahead of the experts.
// In the GEMV phases each stage belongs to consumer warps by ring slot (StageSharers: one warp
// a stage from 8 stages on, two for a ring of 4), which compute whole rows and free it alone;
// the attention task's stages are read by all warps. Consumers walk the same phases in the
// same order; between phases that read what other CTAs wrote they meet at a grid barrier (a
// monotonic counter in global memory; all CTAs are resident: grid = SMs, one CTA an SM), except
// that with head_wait the attention tasks wait on a counter of their KV head's qkv rows instead.
// Per layer, CTA c owns a slice of each GEMV's rows:
//   QKV    rows of [q | k | v] from x = rmsnorm(sum) * input_norm (every CTA norms sum itself);
//   ATTN   (KV head g, split s) tasks on the first Hk * S CTAs: q / new-k norm + RoPE, the new
//          token's K/V to the cache, online softmax over the split's cached keys (+ the new
//          key in the last split), a warp per head; partials merged by the last split to
//          finish (per-head counter); the merged heads counted in `merged`, which O waits for;
//   O      rows of o_proj, sum += bf16(o) for its rows;
//   ROUTER rows of the router logits (f32) from rmsnorm(sum) * post_norm;
//   GATEUP (expert slot, intermediate column) pairs: act = silu(g) * u in f32;
//   DOWN   the CTA's rows of H for all top-k experts (a partial per slot), combined with the
//          routing weights in slot order, sum += bf16(y).
// Rounding points follow the op-by-op path (bf16 qkv, q/k after RoPE, attention output, o, the
// MoE output and the residual sum; f32 logits and SiLU-mul activations), so both agree to bf16
// tolerance; the attention's softmax stays in f32 (the mma kernels round P to bf16). The result
// is deterministic (no float atomics). COROLLA_DECODE_STACK_TRACE=1 prints per-phase times of
// eager launches (PrintTrace).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "kernels/cuda/decode_stack.cuh"
#include "kernels/cuda/decode_stack.h"
#include "kernels/cuda/decode_stack_consumer.cuh"
#include "kernels/cuda/pdl.cuh"

namespace corolla::cuda {
namespace {

// ---- producers ---------------------------------------------------------------------------
// Rows [r0, r1) of a [*, k] weight, RowsPerStage(k) a stage.
__device__ void ProduceRows(Ring& ring, const bf16_t* w, int r0, int r1, int k, int lane,
                            uint64_t policy) {
  const int per = RowsPerStage(k);
  for (int r = r0; r < r1; r += per) {
    const int n = min(per, r1 - r);
    const uint32_t bytes = static_cast<uint32_t>(n) * k * 2;
    if (lane == 0) {
      ring.Acquire(bytes);
      BulkCopy(ring.Stage(), w + static_cast<int64_t>(r) * k, bytes, ring.Full(), policy);
    }
    __syncwarp();
    ring.Next();
  }
}

// The cached keys [k0, k1) of KV head g, kChunkKeys a stage (K rows at 0, V rows at half).
__device__ void ProduceKeys(Ring& ring, const StackParams& p, const StackLayer& L, int g, int k0,
                            int k1, int lane) {
  const int bs = p.block_size;
  for (int c = k0; c < k1; c += kChunkKeys) {
    const int n = min(kChunkKeys, k1 - c);
    if (lane == 0) ring.Acquire(static_cast<uint32_t>(n) * kD * 2 * 2);
    __syncwarp();
    const int first_block = c / bs, last_block = (c + n - 1) / bs;
    for (int b = first_block + lane; b <= last_block; b += 32) {
      const int lo = max(c, b * bs), hi = min(c + n, (b + 1) * bs);
      const int64_t row = (static_cast<int64_t>(p.block_table[b]) * p.hk + g) * bs + (lo - b * bs);
      const uint32_t bytes = static_cast<uint32_t>(hi - lo) * kD * 2,
                     off = static_cast<uint32_t>(lo - c) * kD * 2;
      BulkCopy(ring.Stage() + off, L.k_cache + row * kD, bytes, ring.Full());
      BulkCopy(ring.Stage() + kStageBytes / 2 + off, L.v_cache + row * kD, bytes, ring.Full());
    }
    __syncwarp();
    ring.Next();
  }
}

// Rows of a CTA's qkv share that go through ring A: all of them, or with p.resident as many as
// its stages take at once (the rest go through ring B ahead of the layer's keys), so the share
// is in shared memory before the layer starts.
__device__ __forceinline__ int RingAQkvRows(const StackParams& p) {
  return p.resident ? p.stages_a * RowsPerStage(p.hidden) : (p.hq + 2 * p.hk) * kD;
}

// The attention task's cached keys of layer L (CTAs that have one under `plan`).
__device__ void ProduceLayerKeys(Ring& ring, const StackParams& p, const SplitPlan& plan,
                                 const StackLayer& L, int lane) {
  if (blockIdx.x >= p.hk * plan.splits) return;
  const int g = blockIdx.x / plan.splits, s = blockIdx.x % plan.splits;
  const KeyRange keys = plan.Keys(s);
  ProduceKeys(ring, p, L, g, keys.begin, keys.end, lane);
}

// Producer A: every layer's statically known stream, run ahead as far as its stages allow while
// the consumers wait for other CTAs: the CTA's qkv rows, its attention task's cached keys, its o
// rows and its router rows. With p.resident only the qkv rows ring A holds and the o rows: each
// stage is refilled as soon as its rows have been multiplied, so the o rows land during the
// attention and the next layer's qkv rows during the norm, router and routing.
__device__ void ProducerA(const StackParams& p, Ring ring, int lane) {
  const int c = blockIdx.x, grid = gridDim.x, qkv_rows = (p.hq + 2 * p.hk) * kD, q_cols = p.hq * kD;
  const uint64_t first = EvictFirst();
  const Range qkv = Share(qkv_rows, c, grid), o = Share(p.hidden, c, grid),
              r = Share(p.experts, c, grid);
  const int qkv_split = min(qkv.end, qkv.begin + RingAQkvRows(p));
  const SplitPlan plan = PlanSplits(p);
  for (int l = 0; l < p.layers; ++l) {
    const StackLayer& L = p.layer[l];
    ProduceRows(ring, L.qkv, qkv.begin, qkv_split, p.hidden, lane, first);
    if (lane == 0) TraceNow(p.trace, l, 25);
    if (!p.resident) ProduceLayerKeys(ring, p, plan, L, lane);
    ProduceRows(ring, L.o, o.begin, o.end, q_cols, lane, first);
    if (lane == 0) TraceNow(p.trace, l, 24);
    if (!p.resident) ProduceRows(ring, L.router, r.begin, r.end, p.hidden, lane, first);
  }
}

// Grid barriers per layer, in order; a layer's n-th (1-based) is number per_layer * l + n, where
// per_layer is 5, or 4 with head_wait (no barrier after the qkv rows).
constexpr int kBarQkv = 1, kBarO = 2, kBarRouter = 3, kBarGateUp = 4, kBarDown = 5;
__device__ __forceinline__ unsigned BarrierTarget(const StackParams& p, int layer, int which) {
  const int per_layer = p.head_wait ? 4 : 5, n = p.head_wait ? which - 1 : which;
  return static_cast<unsigned>(per_layer * layer + n) * gridDim.x;
}

// MoeRoute's softmax routing of one token by one warp: the top_k of logit [E] (shared memory,
// overwritten) by k rounds of a warp argmax (two REDUX maxima: ties to the lower id), weights exp(l
// - max) over their sum across all experts, or across the k picked with `renormalize` (the same
// ratios as MoeRoute's probabilities, summed in f32 instead of f64). Lane i writes pick i.
__device__ void RouteSoftmaxTopK(float* logit, int experts, int top_k, bool renormalize,
                                 int32_t* ids, float* weights, int lane) {
  float mx = -INFINITY;
  for (int e = lane; e < experts; e += 32) mx = fmaxf(mx, logit[e]);
  mx = WarpMax(mx);
  float z = 0.f;
  for (int e = lane; e < experts; e += 32) z += expf(logit[e] - mx);
  z = WarpSum(z);
  int my_id = 0;
  float my_w = 0.f;
  for (int i = 0; i < top_k; ++i) {
    // The lane's best as (order-preserving bits of the logit, ~id): the warp maximum of the
    // first, then of the second among the lanes holding it (ties to the lower id), by REDUX.
    unsigned bu = 0, be = 0;
    for (int e = lane; e < experts; e += 32) {
      unsigned u = __float_as_uint(logit[e]);
      u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
      if (u > bu || e == lane)
        bu = u, be = ~static_cast<unsigned>(e);  // ascending e: ties keep the lower id
    }
    const unsigned umax = __reduce_max_sync(0xffffffffu, bu);
    const unsigned emax = __reduce_max_sync(0xffffffffu, bu == umax ? be : 0u);
    int id = static_cast<int>(~emax);
    if (id < 0 || id >= experts) id = 0;
    if (lane == i) my_id = id, my_w = expf(logit[id] - mx);
    __syncwarp();
    if (lane == 0) logit[id] = -INFINITY;  // taken
    __syncwarp();
  }
  const float norm = renormalize ? WarpSum(lane < top_k ? my_w : 0.f) : z;
  if (lane < top_k) {
    ids[lane] = my_id;
    weights[lane] = my_w / norm;
  }
}

// Producer B: per layer, the qkv rows ring A does not hold, the attention task's cached keys
// and the router rows (all known before the step: they land while the previous layer's experts
// finish); then it waits for the router logits, routes (ids and weights into the layer's route
// slot, which the consumers read after a ring-B stage issued later), and streams the CTA's
// gate/up pairs and down rows of the chosen experts.
__device__ void ProducerB(const StackParams& p, Ring ring, uint8_t* smem, int lane) {
  const int c = blockIdx.x, grid = gridDim.x, qkv_rows = (p.hq + 2 * p.hk) * kD;
  float* logit = reinterpret_cast<float*>(smem + SmemLayout::kRouteScratch);
  const int pairs = p.top_k * p.inter;
  const int pairs_per_stage = kStageBytes / (4 * p.hidden);
  const uint64_t first = EvictFirst();
  const Range qkv = Share(qkv_rows, c, grid), r = Share(p.experts, c, grid);
  const int qkv_split = min(qkv.end, qkv.begin + RingAQkvRows(p));
  const SplitPlan plan = PlanSplits(p);
  for (int l = 0; l < p.layers; ++l) {
    const StackLayer& L = p.layer[l];
    if (p.resident) {
      ProduceRows(ring, L.qkv, qkv_split, qkv.end, p.hidden, lane, first);
      if (lane == 0) TraceNow(p.trace, l, 26);
      ProduceLayerKeys(ring, p, plan, L, lane);
      ProduceRows(ring, L.router, r.begin, r.end, p.hidden, lane, first);
    }
    if (lane == 0) StackSpin(p.sync + kSyncGrid, BarrierTarget(p, l, kBarRouter));
    if (lane == 0 && p.trace)
      p.trace[(static_cast<int64_t>(l) * grid + c) * kTraceEvents + 16] = wgmma::GlobalTimerNs();
    __syncwarp();
    for (int e = lane; e < p.experts; e += 32) logit[e] = __ldcg(p.logits + e);
    __syncwarp();
    int32_t* ids = reinterpret_cast<int32_t*>(smem + SmemLayout::kRoute) + (l & 1) * 2 * kMaxTopK;
    float* weights = reinterpret_cast<float*>(ids + kMaxTopK);
    if (p.route_logits != nullptr && c == 0)
      for (int e = lane; e < p.experts; e += 32)
        p.route_logits[static_cast<int64_t>(l) * p.experts + e] = logit[e];
    RouteSoftmaxTopK(logit, p.experts, p.top_k, p.renormalize, ids, weights, lane);
    if (p.route_ids != nullptr && c == 0 && lane < p.top_k)
      p.route_ids[l * p.top_k + lane] = ids[lane];
    __syncwarp();
    if (lane == 0 && p.trace)
      p.trace[(static_cast<int64_t>(l) * grid + c) * kTraceEvents + 17] = wgmma::GlobalTimerNs();
    const Range pr = Share(pairs, c, grid), h = Share(p.hidden, c, grid);
    unsigned long long waited = 1;  // trace event 28: time in Acquire (stages not yet free)
    for (int q = pr.begin; q < pr.end;) {
      const int slot = q / p.inter, j = q % p.inter;
      const int n = min(pairs_per_stage, min(pr.end - q, p.inter - j));
      const int e = ids[slot];
      const uint32_t half = static_cast<uint32_t>(n) * p.hidden * 2;
      if (lane == 0) {
        const unsigned long long t0 = p.trace ? wgmma::GlobalTimerNs() : 0;
        ring.Acquire(2 * half);
        if (p.trace) waited += wgmma::GlobalTimerNs() - t0;
        const bf16_t* w = L.gate_up + static_cast<int64_t>(e) * 2 * p.inter * p.hidden;
        BulkCopy(ring.Stage(), w + static_cast<int64_t>(j) * p.hidden, half, ring.Full(), first);
        BulkCopy(ring.Stage() + half, w + static_cast<int64_t>(p.inter + j) * p.hidden, half,
                 ring.Full(), first);
      }
      __syncwarp();
      ring.Next();
      q += n;
    }
    if (lane == 0 && p.trace)
      p.trace[(static_cast<int64_t>(l) * grid + c) * kTraceEvents + 28] = waited;
    for (int slot = 0; slot < p.top_k; ++slot) {
      const bf16_t* w = L.down + static_cast<int64_t>(ids[slot]) * p.hidden * p.inter;
      ProduceRows(ring, w, h.begin, h.end, p.inter, lane, first);
    }
  }
}

__global__ void __launch_bounds__(kThreads, 1)
    DecodeStackKernel(const __grid_constant__ StackParams p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint32_t base = SmemAddr(smem);
  const uint32_t full = base + SmemLayout::kBars, empty = full + kStages * 8;
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      MbarInit(full + i * 8, 1);
      // the consumer warps that read the stage (Ring::Sharers of the stage's ring)
      MbarInit(empty + i * 8, StageSharers(i < p.stages_a ? p.stages_a : kStages - p.stages_a));
    }
    MbarInitFence();
  }
  __syncthreads();
  GridDependencyWait();  // launched with programmatic dependent launch: sum and the metadata
  Ring ring_a{base, full, empty, p.stages_a};
  Ring ring_b{base + p.stages_a * kStageBytes, full + p.stages_a * 8, empty + p.stages_a * 8,
              kStages - p.stages_a};
  if (warp == kConsumerWarps) {
    ProducerA(p, ring_a, lane);
  } else if (warp == kConsumerWarps + 1) {
    ProducerB(p, ring_b, smem, lane);
  } else {
    Consumer cons{p, smem, tid, warp, lane};
    // The ring of the qkv rows past ring A's, the keys and the router rows: ring B in the
    // resident layout, else ring A. Each use works on a copy chosen by value and written back
    // by a branch: a reference chosen at run time (`Ring& s = p.resident ? ring_b : ring_a`)
    // took both rings' addresses, which put them in local memory (a 128-byte stack frame, a
    // local load and store at every Next(), Stage(), Full() and Empty() of every warp).
    auto with_ring_s = [&](auto&& use) {
      Ring ring_s = p.resident ? ring_b : ring_a;
      use(ring_s);
      if (p.resident)
        ring_b = ring_s;
      else
        ring_a = ring_s;
    };
    const int c = blockIdx.x, grid = gridDim.x;
    const int qkv_rows = (p.hq + 2 * p.hk) * kD, q_cols = p.hq * kD;
    const SplitPlan plan = PlanSplits(p);
    bf16_t* x = cons.vec();
    float* act = cons.act();
    float* down_part = reinterpret_cast<float*>(smem + SmemLayout::kDownPart);
    int layer = 0;
    auto trace = [&](int event) { cons.Trace(layer, event); };
    for (int l = 0; l < p.layers; ++l) {
      const StackLayer& L = p.layer[l];
      layer = l;
      trace(0);
      // QKV
      cons.NormInto(p.sum, L.input_norm, p.hidden, x);
      trace(1);
      const Range qkv = Share(qkv_rows, c, grid);
      const int qkv_split = min(qkv.end, qkv.begin + RingAQkvRows(p));
      auto qkv_out = [&](int row, float v) { p.qkv_out[row] = __float2bfloat16(v); };
      if (p.trace != nullptr && cons.Part(ring_a) >= 0) ring_a.WaitFull();  // for event 27 alone
      trace(27);
      cons.Gemv(ring_a, qkv.begin, qkv_split, p.hidden, x, qkv_out);
      trace(22);
      with_ring_s(
          [&](Ring& ring_s) { cons.Gemv(ring_s, qkv_split, qkv.end, p.hidden, x, qkv_out); });
      trace(2);
      if (p.head_wait) {  // count once on each KV head whose rows this CTA wrote
        ConsumerSync();
        if (tid < p.hk && QkvRowsTouchHead(qkv.begin, qkv.end, p.hq, p.hk, tid))
          ArriveRelease(p.sync + kSyncQkvHead + tid * 32);
      } else {
        cons.GridSync(BarrierTarget(p, l, kBarQkv));
      }
      trace(3);
      // ATTN
      if (c < p.hk * plan.splits)
        with_ring_s([&](Ring& ring_s) { cons.Attention(ring_s, L, l, plan); });
      trace(4);
      // O: waits for every KV head's merged output.
      if (tid == 0) StackSpin(p.sync + kSyncMerged, static_cast<unsigned>((l + 1) * p.hk));
      ConsumerSync();
      for (int i = tid; i < q_cols / 8; i += kConsumers)
        reinterpret_cast<Bf16x8*>(x)[i] = LoadCg8(p.attn_out + i * 8);
      ConsumerSync();
      trace(5);
      if (p.trace != nullptr && cons.Part(ring_a) >= 0) ring_a.WaitFull();  // for event 23 alone
      trace(23);
      const Range o = Share(p.hidden, c, grid);
      cons.Gemv(ring_a, o.begin, o.end, q_cols, x, [&](int row, float v) {
        const float y = __bfloat162float(__float2bfloat16(v));
        p.sum[row] = __float2bfloat16(y + __bfloat162float(__ldcg(p.sum + row)));
      });
      trace(6);
      cons.GridSync(BarrierTarget(p, l, kBarO));
      trace(7);
      // ROUTER
      cons.NormInto(p.sum, L.post_norm, p.hidden, x);
      trace(8);
      const Range r = Share(p.experts, c, grid);
      with_ring_s([&](Ring& ring_s) {
        cons.Gemv(ring_s, r.begin, r.end, p.hidden, x,
                  [&](int row, float v) { p.logits[row] = v; });
      });
      trace(9);
      cons.GridSync(BarrierTarget(p, l, kBarRouter));
      trace(10);
      // GATEUP (pairs of gate row j and up row j; ring B, after producer B routed)
      {
        const int pairs = p.top_k * p.inter, per = kStageBytes / (4 * p.hidden);
        const Range pr = Share(pairs, c, grid);
        unsigned long long waited = 1;  // trace event 29: warp 0's waits after its first stage
        bool first = true;
        // A stage holds n gate rows, then their n up rows; each sharer takes whole pairs.
        // (slot, j) of pair q, walked without a division a stage.
        int next_slot = pr.begin / p.inter, next_j = pr.begin % p.inter;
        for (int q = pr.begin; q < pr.end; ring_b.Next()) {
          const int slot = next_slot, j = next_j;
          const int n = min(per, min(pr.end - q, p.inter - j));
          q += n;
          if ((next_j += n) == p.inter) next_j = 0, ++next_slot;
          const int part = cons.Part(ring_b);
          if (part < 0) continue;
          const Range mine = Consumer::PartOf(n, part, ring_b.Sharers());
          const unsigned long long t0 = p.trace && !first ? wgmma::GlobalTimerNs() : 0;
          ring_b.WaitFull();
          if (t0 != 0) waited += wgmma::GlobalTimerNs() - t0;
          first = false;
          if (mine.end - mine.begin == n) {  // the whole stage: its 2n rows four at a time
            float gate[4];                   // n <= 4: kStageBytes / (4 H) with H >= 1024
            cons.DotRows(cons.StageRows(ring_b), 2 * n, p.hidden, x, [&](int row, float v) {
              if (row < n) {
                gate[row] = v;
              } else {
                const float g = gate[row - n];
                __stcg(p.act + slot * p.inter + j + row - n, g / (1.f + expf(-g)) * v);
              }
            });
          } else {  // a share of its pairs: gate row i and up row n + i together
            for (int i = mine.begin; i < mine.end; ++i) {
              float gu[4];
              cons.DotRowsN<2>(cons.StageRows(ring_b) + i * p.hidden, p.hidden, x, gu,
                               n * p.hidden);
              if (lane == 0)
                __stcg(p.act + slot * p.inter + j + i, gu[0] / (1.f + expf(-gu[0])) * gu[1]);
            }
          }
          ring_b.Release(lane);
        }
        if (tid == 0 && p.trace)
          p.trace[(static_cast<int64_t>(l) * grid + c) * kTraceEvents + 29] = waited;
      }
      trace(11);
      cons.GridSync(BarrierTarget(p, l, kBarGateUp));
      trace(12);
      // DOWN: the CTA's rows of H for every slot (a partial per slot and row), then combined
      // with the routing weights in slot order.
      for (int i = tid; i < p.top_k * p.inter / 4; i += kConsumers)
        reinterpret_cast<float4*>(act)[i] = __ldcg(reinterpret_cast<const float4*>(p.act) + i);
      ConsumerSync();
      trace(13);
      const Range h = Share(p.hidden, c, grid);
      for (int slot = 0; slot < p.top_k; ++slot) {
        float* part = down_part + slot * kMaxRows - h.begin;
        cons.Gemv(ring_b, h.begin, h.end, p.inter, act + slot * p.inter,
                  [&](int row, float v) { part[row] = v; });
      }
      ConsumerSync();
      // route_w was written by producer B before the ring-B stages the warps above waited for.
      const float* route_w = reinterpret_cast<const float*>(smem + SmemLayout::kRoute) +
                             (l & 1) * 2 * kMaxTopK + kMaxTopK;
      for (int i = tid; i < h.end - h.begin; i += kConsumers) {
        float acc = 0.f;
        for (int slot = 0; slot < p.top_k; ++slot)
          acc = fmaf(route_w[slot], down_part[slot * kMaxRows + i], acc);
        const float y = __bfloat162float(__float2bfloat16(acc));
        const int row = h.begin + i;
        p.sum[row] = __float2bfloat16(y + __bfloat162float(__ldcg(p.sum + row)));
      }
      trace(14);
      cons.GridSync(BarrierTarget(p, l, kBarDown));
      trace(15);
    }
    if (c == 0) cons.NormInto(p.sum, p.final_norm, p.hidden, p.x_out);
  }
  __syncthreads();
  if (tid == 0) {
    __threadfence();
    const unsigned exited = atomicAdd(p.sync + kSyncExit, 1u) + 1;
    if (exited == gridDim.x) {  // every CTA is past its last wait: re-arm for the next launch
      p.sync[kSyncGrid] = 0;
      p.sync[kSyncMerged] = 0;
      for (int g = 0; g < p.hk; ++g) p.sync[kSyncHead + g * 32] = p.sync[kSyncQkvHead + g * 32] = 0;
      p.sync[kSyncExit] = 0;
      __threadfence();
    }
  }
}

bool IsBf16Matrix(const TensorView& t, int64_t rows, int64_t cols) {
  return t.dtype == DType::kBF16 && t.is_contiguous() && t.numel() == rows * cols &&
         reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
}

// Mean over CTAs and layers 1.. of each phase (event e - 1 to e), and the max over CTAs of a
// CTA's mean; producer B's routing relative to the consumers' router barrier.
void PrintTrace(const unsigned long long* dev, int layers, int grid, cudaStream_t s) {
  std::vector<unsigned long long> t(static_cast<size_t>(layers) * grid * kTraceEvents);
  COROLLA_CUDA_CHECK(cudaMemcpyAsync(t.data(), dev, t.size() * 8, cudaMemcpyDeviceToHost, s));
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));
  auto at = [&](int l, int c, int e) {
    return static_cast<double>(t[(static_cast<size_t>(l) * grid + c) * kTraceEvents + e]);
  };
  static const char* kNames[kTraceEvents] = {"layer start",
                                             "norm",
                                             "qkv gemv",
                                             "qkv barrier",
                                             "attention",
                                             "merged wait+load",
                                             "o gemv",
                                             "o barrier",
                                             "router norm",
                                             "router gemv",
                                             "router barrier",
                                             "gate/up",
                                             "gate/up barrier",
                                             "act load",
                                             "down",
                                             "down barrier",
                                             "B: saw router barrier",
                                             "B: routed",
                                             "A: q/k setup",
                                             "A: chunks",
                                             "A: partials+count",
                                             "A: merge (last)",
                                             "qkv: ring A rows",
                                             "o: stage 0 full",
                                             "A: o rows issued",
                                             "A: qkv rows issued",
                                             "B: qkv tail issued",
                                             "qkv: stage 0 full",
                                             "B: gate/up stage waits",
                                             "gate/up full waits"};
  std::fprintf(stderr,
               "decode stack trace (%d layers, %d CTAs), us: mean over CTAs / max CTA mean\n",
               layers, grid);
  for (int e = 1; e < kTraceEvents; ++e) {
    // B's spin ends vs the consumers' router barrier; the attention task's steps (A: only the
    // CTAs that have one, the merge only where it ran) from the qkv barrier on.
    // Events 22-26 (rows resident or not): warp 0's ring-A qkv rows from the norm, its o
    // stage's arrival from the O phase's start, producer A's last o issue from the norm (it
    // waits for the layer's qkv stages), its last qkv issue (for this layer, issued during the
    // previous one) and producer B's qkv tail from the layer's start.
    // Events 28-29 are durations: producer B's time waiting for free gate/up stages, and
    // consumer warp 0's time waiting for full ones after its first (which includes the routing).
    static const int kFrom[6] = {1, 5, 1, 0, 0, 1};
    const int from = e == 16                           ? 10
                     : e == 18                         ? 3
                     : e >= 22 && e < kTraceWaitEvents ? kFrom[e - 22]
                                                       : e - 1;
    const bool duration = e >= kTraceWaitEvents;
    double sum = 0, worst = 0;
    int ctas = 0;
    for (int c = 0; c < grid; ++c) {
      double cta = 0;
      int n = 0;
      for (int l = 1; l < layers; ++l) {
        if (at(l, c, e) == 0 || (!duration && at(l, c, from) == 0)) continue;
        cta += (duration ? at(l, c, e) - 1 : at(l, c, e) - at(l, c, from)) / 1000.0;
        ++n;
      }
      if (n == 0) continue;
      cta /= n;
      sum += cta;
      worst = std::max(worst, cta);
      ++ctas;
    }
    std::fprintf(stderr, "  %-22s %8.2f %8.2f  (%d CTAs)\n", kNames[e], sum / std::max(1, ctas),
                 worst, ctas);
  }
  double layer = 0;
  for (int l = 1; l + 1 < layers; ++l) layer += (at(l + 1, 0, 0) - at(l, 0, 0)) / 1000.0;
  std::fprintf(stderr, "  layer (CTA 0)          %8.2f\n", layer / std::max(1, layers - 2));
}

}  // namespace

namespace {
DecodeStackRouteSink route_sink;
}  // namespace
void SetDecodeStackRouteSink(const DecodeStackRouteSink& sink) { route_sink = sink; }

int DecodeStackSyncWords() { return kSyncWords; }

bool DecodeMoeStack(const MoeDecoderStack& stack, const AttentionBatch& batch,
                    const TensorView& positions, const TensorView& sum, const TensorView& x_out,
                    const float* inv_freq, unsigned* sync, CachingAllocator& alloc,
                    cudaStream_t s) {
  if (!Tuning().decode_stack || stack.layers.empty()) return false;
  const int layers = static_cast<int>(stack.layers.size());
  const int64_t hidden = sum.numel(), hq = stack.num_q_heads, hk = stack.num_kv_heads;
  const MoeDecoderLayer& l0 = stack.layers[0];
  const int64_t experts = l0.router.dim(0), inter = l0.down.rank() == 3 ? l0.down.dim(2) : 0;
  const int top_k = stack.routing.top_k;
  const bool f32_norm = stack.final_norm.dtype == DType::kF32;
  // The shapes the kernel covers (Qwen3-30B-A3B and its smaller siblings), else the op path.
  bool ok = layers <= kMaxStackLayers && stack.head_dim == kD && hk >= 1 && hk <= kMaxKvHeads &&
            hq % hk == 0 && hq / hk <= kMaxGroup && hidden % 64 == 0 && hidden <= kMaxVec &&
            hq * kD <= kMaxVec && inter % 64 == 0 && top_k >= 1 && top_k <= kMaxDownSlots &&
            top_k * inter <= kMaxAct && experts >= top_k && experts <= kMaxExperts &&
            !stack.routing.sigmoid && stack.routing.num_groups <= 1 &&
            stack.routing.scaling_factor == 1.0f && stack.routing.correction_bias.data == nullptr &&
            stack.rope.rotary_dim == kD && !stack.rope.interleaved && sum.dtype == DType::kBF16 &&
            x_out.dtype == DType::kBF16 && sum.numel() == hidden && x_out.numel() == hidden &&
            batch.seq_lens.numel() == 1 && batch.max_q_len == 1 &&
            batch.slot_mapping.numel() == 1 && positions.numel() == 1 &&
            4 * hidden <= kStageBytes && 2 * hq * kD <= kStageBytes && 2 * inter <= kStageBytes &&
            sum.is_contiguous() && x_out.is_contiguous() &&
            (stack.final_norm.dtype == DType::kF32 || stack.final_norm.dtype == DType::kBF16);
  if (!ok) return false;
  StackParams p{};
  for (int i = 0; i < layers && ok; ++i) {
    const MoeDecoderLayer& L = stack.layers[i];
    const KvCacheView& cache = L.cache;
    ok = IsBf16Matrix(L.qkv, (hq + 2 * hk) * kD, hidden) && IsBf16Matrix(L.o, hidden, hq * kD) &&
         IsBf16Matrix(L.router, experts, hidden) &&
         IsBf16Matrix(L.gate_up, experts * 2 * inter, hidden) &&
         IsBf16Matrix(L.down, experts * hidden, inter) && cache.k.dtype == DType::kBF16 &&
         cache.v.dtype == DType::kBF16 && cache.k.data != cache.v.data && cache.k.rank() == 4 &&
         cache.k.dim(1) == hk && cache.k.dim(3) == kD && cache.k.is_contiguous() &&
         cache.v.is_contiguous() && cache.v.shape == cache.k.shape &&
         cache.block_size() == l0.cache.block_size() && cache.k.dim(0) == l0.cache.k.dim(0);
    for (const TensorView* w : {&L.input_norm, &L.post_attention_norm, &L.q_norm, &L.k_norm})
      ok = ok && (w->dtype == DType::kF32) == f32_norm &&
           (w->dtype == DType::kF32 || w->dtype == DType::kBF16);
    ok = ok && L.q_norm.numel() == kD && L.k_norm.numel() == kD && L.input_norm.numel() == hidden &&
         L.post_attention_norm.numel() == hidden;
    if (ok)
      p.layer[i] = {L.qkv.ptr<bf16_t>(),        L.o.ptr<bf16_t>(),    L.router.ptr<bf16_t>(),
                    L.gate_up.ptr<bf16_t>(),    L.down.ptr<bf16_t>(), L.input_norm.data,
                    L.post_attention_norm.data, L.q_norm.data,        L.k_norm.data,
                    cache.k.ptr<bf16_t>(),      cache.v.ptr<bf16_t>()};
  }
  if (!ok) return false;
  // SMs of the device (one CTA each: the kernel needs all of them resident), set up once per
  // device (-1: one CTA does not fit).
  static std::mutex mu;
  static std::map<int, int> grids;
  int dev = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&dev));
  int grid = 0;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto [it, fresh] = grids.try_emplace(dev, 0);
    if (fresh) {
      int sms = 0, per_sm = 0;
      COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
      COROLLA_CUDA_CHECK(cudaFuncSetAttribute(
          DecodeStackKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, SmemLayout::kBytes));
      COROLLA_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, DecodeStackKernel, kThreads, SmemLayout::kBytes));
      it->second = per_sm >= 1 ? sms : -1;
    }
    grid = it->second;
  }
  if (grid <= 0 || hidden / grid + 1 > kMaxRows || hk > grid) return false;
  p.layers = layers;
  p.hidden = static_cast<int>(hidden);
  p.hq = static_cast<int>(hq);
  p.hk = static_cast<int>(hk);
  p.experts = static_cast<int>(experts);
  p.top_k = top_k;
  p.inter = static_cast<int>(inter);
  p.norm_f32 = f32_norm;
  p.renormalize = stack.routing.renormalize;
  p.eps = stack.eps;
  p.scale_log2 = stack.attention_scale * 1.4426950408889634f;
  p.inv_freq = inv_freq;
  p.attention_factor = stack.rope.attention_factor;
  p.seq_lens = batch.seq_lens.ptr<int32_t>();
  p.block_table = batch.block_tables.ptr<int32_t>();
  p.slot_mapping = batch.slot_mapping.ptr<int32_t>();
  p.positions = positions.ptr<int32_t>();
  p.block_size = l0.cache.block_size();
  p.num_slots = l0.cache.k.dim(0) * l0.cache.block_size();
  p.min_split_keys = Tuning().decode_stack_split_keys;
  p.stages_a = std::clamp(Tuning().decode_stack_stages_a, 2, kStages - 2);
  p.head_wait = Tuning().decode_stack_head_wait;
  p.resident = Tuning().decode_stack_resident;
  for (int c = 0; c < grid; ++c) {  // the qkv rows as the kernel deals them
    const Range rows = Share(static_cast<int>((hq + 2 * hk) * kD), c, grid);
    for (int g = 0; g < hk; ++g)
      p.qkv_head_arrivals[g] +=
          QkvRowsTouchHead(rows.begin, rows.end, static_cast<int>(hq), static_cast<int>(hk), g);
  }
  p.route_logits = route_sink.logits;
  p.route_ids = route_sink.ids;
  p.sum = sum.ptr<bf16_t>();
  p.x_out = x_out.ptr<bf16_t>();
  p.final_norm = stack.final_norm.data;
  ScratchBuffer qkv_out(alloc, static_cast<size_t>((hq + 2 * hk) * kD) * 2);
  ScratchBuffer part(alloc, static_cast<size_t>(grid) * kMaxGroup * kPartStride * 4);
  ScratchBuffer attn_out(alloc, static_cast<size_t>(hq * kD) * 2);
  ScratchBuffer logits(alloc, static_cast<size_t>(experts) * 4);
  ScratchBuffer act(alloc, static_cast<size_t>(top_k * inter) * 4);
  p.qkv_out = qkv_out.as<bf16_t>();
  p.attn_part = part.as<float>();
  p.attn_out = attn_out.as<bf16_t>();
  p.logits = logits.as<float>();
  p.act = act.as<float>();
  p.sync = sync;
  // COROLLA_DECODE_STACK_TRACE=1: eager launches (not under capture) record when each CTA's
  // consumers finish each phase and print the mean phase times (debugging; synchronises).
  static const bool trace = std::getenv("COROLLA_DECODE_STACK_TRACE") != nullptr;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  COROLLA_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
  ScratchBuffer trace_buf(alloc, trace && capturing == cudaStreamCaptureStatusNone
                                     ? static_cast<size_t>(layers) * grid * kTraceEvents * 8
                                     : 0);
  p.trace = trace_buf.as<unsigned long long>();
  if (p.trace != nullptr)
    COROLLA_CUDA_CHECK(
        cudaMemsetAsync(p.trace, 0, static_cast<size_t>(layers) * grid * kTraceEvents * 8, s));
  LaunchPdl(DecodeStackKernel, dim3(grid), dim3(kThreads), SmemLayout::kBytes, s, 1, p);
  if (p.trace != nullptr) PrintTrace(p.trace, layers, grid, s);
  return true;
}

}  // namespace corolla::cuda
