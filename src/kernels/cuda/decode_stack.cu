// Backend::DecodeMoeStack on CUDA: every decoder layer of a Qwen3-MoE model for one decode
// token in one persistent launch (a "megakernel"). At batch 1 the op-by-op step is bound by the
// ramp and tail of ~7 kernels a layer, not by HBM (NOTES.md "Batch-1 decode, session 5"); here
// no kernel boundary stops the weight stream. Opt-in (Tuning().decode_stack): measured slower
// than the ops so far; NOTES.md "Persistent decode kernel" has the phase times and what is next.
//
// One CTA per SM, 8 consumer warps and two producer warps. Each producer fills its own ring of
// 16 KB shared-memory stages with cp.async.bulk copies (completion by transaction count on the
// stage's full mbarrier; the consumer that read a stage frees it through its empty mbarrier):
//   ring A: what is known before the step starts (each layer's qkv rows, the CTA's KV keys, o
//           rows, router rows), so producer A runs ahead across phases and layers as far as its
//           stages allow, while the consumers wait for other CTAs;
//   ring B: the routed experts' gate/up and down rows, issued once producer B has seen the
//           layer's router logits and routed them itself (RouteSoftmaxTopK, as MoeRoute).
// In the GEMV phases each stage belongs to one consumer warp (by ring slot), which computes its
// whole rows and frees it alone; the attention task's stages are read by all warps. Consumers
// walk the same phases in the same order; between phases that read what other CTAs wrote they
// meet at a grid barrier (a monotonic counter in global memory; all CTAs are resident: grid =
// SMs, one CTA an SM). Per layer, CTA c owns a slice of each GEMV's rows:
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

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/decode_stack.h"
#include "kernels/cuda/moe_route.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

using wgmma::BulkCopy;
using wgmma::EvictFirst;
using wgmma::MbarArrive;
using wgmma::MbarArriveExpectTx;
using wgmma::MbarInit;
using wgmma::MbarInitFence;
using wgmma::MbarWait;
using wgmma::SmemAddr;

constexpr int kConsumerWarps = 8;
constexpr int kConsumers = kConsumerWarps * 32;
constexpr int kThreads = kConsumers + 64;  // + producer A (warp 8) + producer B (warp 9)
constexpr int kStageBytes = 16 * 1024;
constexpr int kStages = 12;    // ring A takes StackParams::stages_a of them, ring B the rest
constexpr int kD = 128;        // head dim
constexpr int kMaxGroup = 16;  // query heads per KV head
constexpr int kChunkKeys = kStageBytes / (4 * kD);  // keys per ring-A stage: K rows at 0, V at half
static_assert(kChunkKeys == 32, "the softmax keeps one key a lane");
constexpr int kTraceEvents = 22;  // COROLLA_DECODE_STACK_TRACE: timestamps per (layer, CTA)
constexpr int kMaxVec = 8192;     // bf16 elements of the GEMV input (H and Hq * D)
constexpr int kMaxAct = 6144;     // top_k * I (f32)
constexpr int kMaxExperts = 512;
constexpr int kMaxRows = 64;         // rows of H a CTA owns (H / grid)
constexpr int kMaxDownSlots = 16;    // top_k (DOWN keeps a partial per (slot, row))
constexpr int kPartStride = kD + 4;  // attention partial: o[D], m, l (rows 16-byte aligned)

// Sync words (each on its own 128-byte line): grid barrier, merged heads, exits, per-KV-head
// split counters from kSyncHead.
constexpr int kSyncGrid = 0, kSyncMerged = 32, kSyncExit = 64, kSyncHead = 96;

// Phase-local buffers share one region: the GEMV input (QKV, O, ROUTER, GATEUP), the attention
// task's q and new K/V (ATTN), and the SiLU-mul activations (DOWN) are never live together.
struct SmemLayout {
  static constexpr int kRing = 0;
  static constexpr int kShared = kRing + kStages * kStageBytes;  // vec | q, new K/V | act
  static constexpr int kVec = kShared;                           // bf16 [kMaxVec]
  static constexpr int kQ = kShared;                             // bf16 [kMaxGroup][kD]
  static constexpr int kNewKv = kQ + kMaxGroup * kD * 2;         // bf16 [2][kD]: the new K, V
  static constexpr int kAct = kShared;                           // f32 [kMaxAct]
  static constexpr int kSharedBytes = kMaxAct * 4;
  static constexpr int kDownPart = kShared + kSharedBytes;  // f32 [kMaxDownSlots][kMaxRows]
  static constexpr int kRouteScratch =
      kDownPart + kMaxDownSlots * kMaxRows * 4;  // f32 [kMaxExperts] (B)
  static constexpr int kRoute =
      kRouteScratch + kMaxExperts * 4;  // [2 layers][ids kMaxTopK | w kMaxTopK]
  static constexpr int kMisc = kRoute + 2 * 2 * kMaxTopK * 4;  // f32 / int scratch [64]
  static constexpr int kBars = kMisc + 64 * 4;                 // full[kStages], empty[kStages]
  static constexpr int kBytes = kBars + 2 * kStages * 8;
};
static_assert(kMaxVec * 2 <= SmemLayout::kSharedBytes &&
                  (kMaxGroup + 1) * kD * 2 <= SmemLayout::kSharedBytes,
              "the phase-local region holds each phase's buffers");
static_assert(SmemLayout::kBytes <= 227 * 1024, "decode stack shared memory");
static_assert(SmemLayout::kBars % 8 == 0, "mbarrier alignment");

struct StackLayer {
  const bf16_t* qkv;      // [(Hq + 2 Hk) D, H]
  const bf16_t* o;        // [H, Hq D]
  const bf16_t* router;   // [E, H]
  const bf16_t* gate_up;  // [E, 2I, H]
  const bf16_t* down;     // [E, H, I]
  const void* input_norm;
  const void* post_norm;
  const void* q_norm;
  const void* k_norm;
  bf16_t* k_cache;  // [blocks, Hk, block_size, D]
  bf16_t* v_cache;
};

struct StackParams {
  int layers, hidden, hq, hk, experts, top_k, inter;
  bool norm_f32;  // every RMSNorm weight f32 (else bf16)
  bool renormalize;
  float eps, scale_log2;  // softmax scale * log2(e)
  const float* inv_freq;  // [D / 2]
  float attention_factor;
  const int32_t* seq_lens;      // [1]
  const int32_t* block_table;   // [max_blocks]
  const int32_t* slot_mapping;  // [1]
  const int32_t* positions;     // [1]
  int block_size;
  int64_t num_slots;
  int min_split_keys;
  int stages_a;               // ring A's stages (ring B: kStages - stages_a)
  unsigned long long* trace;  // [layers][grid][kTraceEvents] %globaltimer, or null
  float* route_logits;        // DecodeStackRouteSink: [layers][E] router logits (CTA 0), or null
  int32_t* route_ids;         // [layers][top_k]
  bf16_t* sum;                // [H], the residual stream, in place
  bf16_t* x_out;              // [H], rmsnorm(sum) * final_norm after the last layer
  const void* final_norm;
  bf16_t* qkv_out;   // [(Hq + 2 Hk) D]
  float* attn_part;  // [grid][kMaxGroup][kPartStride]
  bf16_t* attn_out;  // [Hq D]
  float* logits;     // [E]
  float* act;        // [top_k I]
  unsigned* sync;
  StackLayer layer[kMaxStackLayers];
};

// ---- small helpers ------------------------------------------------------------------------------
// Spins until *p >= target, then orders the caller's later loads after what made it so
// (relaxed polls and one acquire fence: an ld.acquire per poll invalidates the SM's L1 each
// time). A wait of 10 s is a protocol bug: trap instead of hanging.
__device__ __forceinline__ void SpinUntil(const unsigned* p, unsigned target) {
  uint64_t start = 0;
  for (unsigned polls = 0;; ++polls) {
    unsigned v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    if (v >= target) break;
    if ((polls & 1023) == 1023) {
      const uint64_t now = wgmma::GlobalTimerNs();
      if (start == 0)
        start = now;
      else if (now - start > 10'000'000'000ull)
        __trap();
    }
  }
  asm volatile("fence.acq_rel.gpu;\n" ::: "memory");
}
// Adds 1 to *p after every write that happens before it (this thread's, and other threads'
// ordered before it by a CTA barrier) is visible at GPU scope: the arrival half of a grid
// barrier, without a separate fence or a returned value.
__device__ __forceinline__ void ArriveRelease(unsigned* p) {
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(p) : "memory");
}
// atomicAdd(p, 1) with acquire and release semantics at GPU scope: returns the old value.
__device__ __forceinline__ unsigned FetchAddAcqRel(unsigned* p) {
  unsigned old;
  asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], 1;\n" : "=r"(old) : "l"(p) : "memory");
  return old;
}
__device__ __forceinline__ void ConsumerSync() {
  asm volatile("bar.sync 1, %0;\n" ::"n"(kConsumers) : "memory");
}
__device__ __forceinline__ float NormWeight(const void* w, bool f32, int i) {
  return f32 ? static_cast<const float*>(w)[i] : __bfloat162float(static_cast<const bf16_t*>(w)[i]);
}
__device__ __forceinline__ Bf16x8 LoadCg8(const bf16_t* p) {
  uint4 u = __ldcg(reinterpret_cast<const uint4*>(p));
  Bf16x8 v;
  memcpy(&v, &u, sizeof(v));
  return v;
}
// Eight bf16 of shared memory (16-byte aligned) in one 128-bit load (a Bf16x8 copy can split
// into four 32-bit loads: a 4-way bank conflict at a 16-byte lane stride).
__device__ __forceinline__ void Load8(const bf16_t* p, float f[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  Bf16x8 v;
  memcpy(&v, &u, sizeof(v));
  Unpack8(v, f);
}
__device__ __forceinline__ void Load8(const float* p, float f[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
struct Range {
  int begin, end;
};
// CTA c's share of n items over `parts` CTAs.
__device__ __forceinline__ Range Share(int n, int c, int parts) {
  return {static_cast<int>(static_cast<int64_t>(n) * c / parts),
          static_cast<int>(static_cast<int64_t>(n) * (c + 1) / parts)};
}
__device__ __forceinline__ int RowsPerStage(int k) { return min(kMaxRows, kStageBytes / (2 * k)); }

// The attention split plan of this step, the same in every thread: S splits of the seq_len - 1
// cached keys (the new key goes with the last split).
struct SplitPlan {
  int splits, chunk, cached;
};
__device__ __forceinline__ SplitPlan PlanSplits(const StackParams& p) {
  const int cached = p.seq_lens[0] - 1;
  const int cap = max(1, min(static_cast<int>(gridDim.x) / p.hk, static_cast<int>(gridDim.x)));
  const int want = max(1, (cached + p.min_split_keys - 1) / p.min_split_keys);
  const int splits = min(want, cap);
  return {splits, (cached + splits - 1) / splits, cached};
}

// A ring of stages: the producer's and each consumer's position in it.
struct Ring {
  uint32_t base;  // shared address of stage 0
  uint32_t full;  // shared address of full barrier 0 (8 bytes apart)
  uint32_t empty;
  int stages;
  uint32_t iter = 0;
  __device__ uint32_t Stage() const { return base + (iter % stages) * kStageBytes; }
  __device__ uint32_t Full() const { return full + (iter % stages) * 8; }
  __device__ uint32_t Empty() const { return empty + (iter % stages) * 8; }
  // Producer (one lane): waits until the stage is free, then expects `bytes` on its full barrier.
  __device__ void Acquire(uint32_t bytes) const {
    if (iter >= static_cast<uint32_t>(stages)) MbarWait(Empty(), ((iter / stages) - 1) & 1);
    MbarArriveExpectTx(Full(), bytes);
  }
  __device__ void WaitFull() const { MbarWait(Full(), (iter / stages) & 1); }
  // The consumer warp that read the stage: done with it.
  __device__ void Release(int lane) const {
    __syncwarp();
    if (lane == 0) MbarArrive(Empty());
  }
};

// ---- producers
// ------------------------------------------------------------------------------------ Rows [r0,
// r1) of a [*, k] weight, RowsPerStage(k) a stage.
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
    ++ring.iter;
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
    ++ring.iter;
  }
}

// Producer A: every layer's statically known stream.
__device__ void ProducerA(const StackParams& p, Ring ring, int lane) {
  const int c = blockIdx.x, grid = gridDim.x, qkv_rows = (p.hq + 2 * p.hk) * kD, q_cols = p.hq * kD;
  const SplitPlan plan = PlanSplits(p);
  const uint64_t first = EvictFirst();
  const Range qkv = Share(qkv_rows, c, grid), o = Share(p.hidden, c, grid),
              r = Share(p.experts, c, grid);
  for (int l = 0; l < p.layers; ++l) {
    const StackLayer& L = p.layer[l];
    ProduceRows(ring, L.qkv, qkv.begin, qkv.end, p.hidden, lane, first);
    if (c < p.hk * plan.splits) {
      const int g = c / plan.splits, s = c % plan.splits;
      const int k0 = min(plan.cached, s * plan.chunk), k1 = min(plan.cached, k0 + plan.chunk);
      ProduceKeys(ring, p, L, g, k0, k1, lane);
    }
    ProduceRows(ring, L.o, o.begin, o.end, q_cols, lane, first);
    ProduceRows(ring, L.router, r.begin, r.end, p.hidden, lane, first);
  }
}

// Grid barriers per layer, in order; a layer's n-th (1-based) is number kBarriersPerLayer * l + n.
constexpr int kBarriersPerLayer = 5;
constexpr int kBarQkv = 1, kBarO = 2, kBarRouter = 3, kBarGateUp = 4, kBarDown = 5;
__device__ __forceinline__ unsigned BarrierTarget(int layer, int which) {
  return static_cast<unsigned>(kBarriersPerLayer * layer + which) * gridDim.x;
}

// MoeRoute's softmax routing of one token by one warp: the top_k of logit [E] (shared memory,
// overwritten) by k rounds of a warp argmax (two REDUX maxima: ties to the lower id), weights exp(l - max) over
// their sum across all experts, or across the k picked with `renormalize` (the same ratios as
// MoeRoute's probabilities, summed in f32 instead of f64). Lane i writes pick i.
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
      if (u > bu || e == lane) bu = u, be = ~static_cast<unsigned>(e);  // ascending e: ties keep the lower id
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

// Producer B: per layer, waits for the router logits, routes (ids and weights into the layer's
// route slot, which the consumers read after a ring-B stage issued later), then streams the
// CTA's gate/up pairs and down rows of the chosen experts.
__device__ void ProducerB(const StackParams& p, Ring ring, uint8_t* smem, int lane) {
  const int c = blockIdx.x, grid = gridDim.x;
  float* logit = reinterpret_cast<float*>(smem + SmemLayout::kRouteScratch);
  const int pairs = p.top_k * p.inter;
  const int pairs_per_stage = kStageBytes / (4 * p.hidden);
  const uint64_t first = EvictFirst();
  for (int l = 0; l < p.layers; ++l) {
    const StackLayer& L = p.layer[l];
    if (lane == 0) SpinUntil(p.sync + kSyncGrid, BarrierTarget(l, kBarRouter));
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
    const Range pr = Share(pairs, c, grid);
    for (int q = pr.begin; q < pr.end;) {
      const int slot = q / p.inter, j = q % p.inter;
      const int n = min(pairs_per_stage, min(pr.end - q, p.inter - j));
      const int e = ids[slot];
      const uint32_t half = static_cast<uint32_t>(n) * p.hidden * 2;
      if (lane == 0) {
        ring.Acquire(2 * half);
        const bf16_t* w = L.gate_up + static_cast<int64_t>(e) * 2 * p.inter * p.hidden;
        BulkCopy(ring.Stage(), w + static_cast<int64_t>(j) * p.hidden, half, ring.Full(), first);
        BulkCopy(ring.Stage() + half, w + static_cast<int64_t>(p.inter + j) * p.hidden, half,
                 ring.Full(), first);
      }
      __syncwarp();
      ++ring.iter;
      q += n;
    }
    const Range h = Share(p.hidden, c, grid);
    for (int slot = 0; slot < p.top_k; ++slot) {
      const bf16_t* w = L.down + static_cast<int64_t>(ids[slot]) * p.hidden * p.inter;
      ProduceRows(ring, w, h.begin, h.end, p.inter, lane, first);
    }
  }
}

// ---- consumers
// ------------------------------------------------------------------------------------
struct Consumer {
  const StackParams& p;
  uint8_t* smem;
  int tid, warp, lane;

  __device__ bf16_t* vec() const { return reinterpret_cast<bf16_t*>(smem + SmemLayout::kVec); }
  __device__ float* act() const { return reinterpret_cast<float*>(smem + SmemLayout::kAct); }
  __device__ float* misc() const { return reinterpret_cast<float*>(smem + SmemLayout::kMisc); }
  // COROLLA_DECODE_STACK_TRACE: when this CTA's consumers finished phase `event` of `layer`.
  __device__ void Trace(int layer, int event) const {
    if (p.trace != nullptr && tid == 0)
      p.trace[(static_cast<int64_t>(layer) * gridDim.x + blockIdx.x) * kTraceEvents + event] =
          wgmma::GlobalTimerNs();
  }

  // Arrives at grid barrier `target` once every consumer of this CTA is done, and returns once
  // every CTA has arrived. Writes before it (any consumer thread) are visible after it.
  __device__ void GridSync(unsigned target) const {
    ConsumerSync();
    if (tid == 0) {
      ArriveRelease(p.sync + kSyncGrid);
      SpinUntil(p.sync + kSyncGrid, target);
    }
    ConsumerSync();
  }

  // vec = bf16(rmsnorm(src) * w), src [n] bf16 (another CTA may have written it: read from L2).
  __device__ void NormInto(const bf16_t* src, const void* w, int n, bf16_t* dst) {
    float ss = 0.f;
    for (int c = tid; c < n / 8; c += kConsumers) {
      float a[8];
      Unpack8(LoadCg8(src + c * 8), a);
#pragma unroll
      for (int i = 0; i < 8; ++i) ss += a[i] * a[i];
    }
    ss = WarpSum(ss);
    if (lane == 0) misc()[warp] = ss;
    ConsumerSync();
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < kConsumerWarps; ++i) total += misc()[i];
    const float inv = rsqrtf(total / n + p.eps);
    for (int c = tid; c < n / 8; c += kConsumers) {
      float a[8];
      Unpack8(LoadCg8(src + c * 8), a);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[i] = NormWeight(w, p.norm_f32, c * 8 + i) * (a[i] * inv);
      reinterpret_cast<Bf16x8*>(dst)[c] = Pack8(a);
    }
    ConsumerSync();  // dst complete; misc free again
  }

  // The stages of the GEMV phases belong to consumer warps by ring slot (slot % 8), each
  // computing whole rows from its stage and freeing it alone: several stages in work at once
  // and no barrier between them. A slot's owner is fixed, so it meets the slot's phases in
  // order (a parity wait must never run a phase ahead).
  __device__ bool Owns(const Ring& ring) const {
    return static_cast<int>((ring.iter % ring.stages) % kConsumerWarps) == warp;
  }
  __device__ const bf16_t* StageRows(const Ring& ring) const {
    return reinterpret_cast<const bf16_t*>(smem + (ring.Stage() - SmemAddr(smem)));
  }

  // kRows rows of w (each k long, shared memory) dotted with x (shared, bf16 or f32 [k]):
  // sums in out[0, kRows) on every lane. kRows is a template argument so the loop has no
  // per-row guards (a guard on a value the compiler cannot see is warp-uniform costs a
  // convergence barrier per row and chunk).
  template <int kRows, typename X>
  __device__ void DotRowsN(const bf16_t* w, int k, const X* x, float (&out)[4]) const {
    float acc[kRows] = {};
    const int chunks = k / 8;
#pragma unroll 2
    for (int c = lane; c < chunks; c += 32) {
      float xf[8];
      Load8(x + c * 8, xf);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        float wf[8];
        Load8(w + r * k + c * 8, wf);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[r] = fmaf(wf[i], xf[i], acc[r]);
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) out[r] = WarpSum(acc[r]);  // independent shuffle chains
  }
  // Rows [0, n) of the stage dotted with x, four at a time; emit(row, value) on lane 0.
  template <typename X, typename Emit>
  __device__ void DotRows(const bf16_t* w, int n, int k, const X* x, Emit emit) const {
    for (int r0 = 0; r0 < n; r0 += 4) {
      float v[4];
      const int rows = min(4, n - r0);
      const bf16_t* wr = w + r0 * k;
      if (rows == 4)
        DotRowsN<4>(wr, k, x, v);
      else if (rows == 3)
        DotRowsN<3>(wr, k, x, v);
      else if (rows == 2)
        DotRowsN<2>(wr, k, x, v);
      else
        DotRowsN<1>(wr, k, x, v);
      if (lane == 0) {
#pragma unroll
        for (int r = 0; r < 4; ++r)
          if (r < rows) emit(r0 + r, v[r]);
      }
    }
  }

  // Rows [r0, r1) of a [*, k] weight from the ring, dotted with x; out(row, value) on lane 0
  // of the warp that owns the row's stage.
  template <typename Out>
  __device__ void Gemv(Ring& ring, int r0, int r1, int k, const bf16_t* x, Out out) {
    const int per = RowsPerStage(k);
    for (int r = r0; r < r1; r += per, ++ring.iter) {
      if (!Owns(ring)) continue;
      const int n = min(per, r1 - r);
      ring.WaitFull();
      DotRows(StageRows(ring), n, k, x, [&](int row, float v) { out(r + row, v); });
      ring.Release(lane);
    }
  }

  // ---- attention task (KV head g, split s) ------------------------------------------------------
  __device__ void Attention(Ring& ring, const StackLayer& L, int layer, const SplitPlan& plan) {
    const int c = blockIdx.x, g = c / plan.splits, s = c % plan.splits;
    const int group = p.hq / p.hk;
    bf16_t* qs = reinterpret_cast<bf16_t*>(smem + SmemLayout::kQ);
    bf16_t* new_kv = reinterpret_cast<bf16_t*>(smem + SmemLayout::kNewKv);
    const bool last = s == plan.splits - 1;
    // RoPE of the lane's 4 elements e0.. (pairs (i, i + 64): the partner sits in lane ^ 16).
    const int e0 = lane * 4;
    float cs[4], sn[4];
    {
      const float pos = static_cast<float>(p.positions[0]);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        sincosf(pos * p.inv_freq[(e0 + i) % (kD / 2)], &sn[i], &cs[i]);
        cs[i] *= p.attention_factor;
        sn[i] *= lane < 16 ? -p.attention_factor : p.attention_factor;
      }
    }
    auto norm_rope = [&](const bf16_t* src, const void* w, bf16_t* dst) {
      float a[4];
      const uint2 u = __ldcg(reinterpret_cast<const uint2*>(src + e0));
      const bf16_t* h = reinterpret_cast<const bf16_t*>(&u);
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        a[i] = __bfloat162float(h[i]);
        ss += a[i] * a[i];
      }
      ss = WarpSum(ss);
      const float inv = rsqrtf(ss / kD + p.eps);
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = NormWeight(w, p.norm_f32, e0 + i) * (a[i] * inv);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float partner = __shfl_xor_sync(0xffffffffu, a[i], 16);
        dst[e0 + i] = __float2bfloat16(a[i] * cs[i] + partner * sn[i]);
      }
    };
    for (int hh = warp; hh < group; hh += kConsumerWarps)
      norm_rope(p.qkv_out + (g * group + hh) * kD, L.q_norm, qs + hh * kD);
    if (last && warp == 0) {  // the new token's K (normed, rotated) and V, also into the cache
      const int kv_base = p.hq * kD;
      norm_rope(p.qkv_out + kv_base + g * kD, L.k_norm, new_kv);
      const uint2 v =
          __ldcg(reinterpret_cast<const uint2*>(p.qkv_out + kv_base + (p.hk + g) * kD + e0));
      *reinterpret_cast<uint2*>(new_kv + kD + e0) = v;
      __syncwarp();
      const int slot = p.slot_mapping[0];
      if (slot >= 0 && slot < p.num_slots) {
        const int64_t row = (static_cast<int64_t>(slot / p.block_size) * p.hk + g) * p.block_size +
                            slot % p.block_size;
        *reinterpret_cast<uint2*>(L.k_cache + row * kD + e0) =
            *reinterpret_cast<const uint2*>(new_kv + e0);
        *reinterpret_cast<uint2*>(L.v_cache + row * kD + e0) = v;
      }
    }
    ConsumerSync();
    Trace(layer, 18);
    // Online softmax state of the warp's heads (warp, warp + 8): lane's dims e0..e0+3.
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, o[2][4] = {};
    // One chunk: n keys, K rows at kr, V rows at vr (shared memory, [n][kD] bf16).
    // One chunk of n <= 32 keys (K rows at kr, V rows at vr, [n][kD] bf16 in shared memory),
    // each warp for its own heads: lane j scores key j (K read in a rotated 16-byte order, so a
    // quarter warp touches every bank once), softmax across the lanes, then P V with p_j
    // broadcast from lane j and the lane's 4 output dims.
    auto chunk = [&](const bf16_t* kr, const bf16_t* vr, int n) {
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        const int hh = warp + t * kConsumerWarps;
        if (hh >= group) break;
        float sc = -INFINITY;
        if (lane < n) {
          float acc = 0.f;
#pragma unroll 4
          for (int i = 0; i < kD / 8; ++i) {
            const int cidx = (i + lane) % (kD / 8);
            float kf[8], qf[8];
            Load8(kr + lane * kD + cidx * 8, kf);
            Load8(qs + hh * kD + cidx * 8, qf);
#pragma unroll
            for (int u = 0; u < 8; ++u) acc = fmaf(qf[u], kf[u], acc);
          }
          sc = acc * p.scale_log2;
        }
        const float mn = fmaxf(m[t], WarpMax(sc));
        const float alpha = exp2f(m[t] - mn);  // m = -inf at first: 0
        const float pr = lane < n ? exp2f(sc - mn) : 0.f;
        l[t] = l[t] * alpha + WarpSum(pr);
        m[t] = mn;
#pragma unroll
        for (int i = 0; i < 4; ++i) o[t][i] *= alpha;
#pragma unroll 4
        for (int j = 0; j < n; ++j) {
          const float pj = __shfl_sync(0xffffffffu, pr, j);
          const uint2 u = *reinterpret_cast<const uint2*>(vr + j * kD + e0);
          const bf16_t* vv = reinterpret_cast<const bf16_t*>(&u);
#pragma unroll
          for (int i = 0; i < 4; ++i) o[t][i] = fmaf(pj, __bfloat162float(vv[i]), o[t][i]);
        }
      }
    };
    const int k0 = min(plan.cached, s * plan.chunk), k1 = min(plan.cached, k0 + plan.chunk);
    for (int cpos = k0; cpos < k1; cpos += kChunkKeys) {
      const int n = min(kChunkKeys, k1 - cpos);
      ring.WaitFull();
      const uint8_t* stage = smem + (ring.Stage() - SmemAddr(smem));
      chunk(reinterpret_cast<const bf16_t*>(stage),
            reinterpret_cast<const bf16_t*>(stage + kStageBytes / 2), n);
      ConsumerSync();  // every warp is done with the stage
      if (tid == 0) MbarArrive(ring.Empty());
      ++ring.iter;
    }
    if (last) chunk(new_kv, new_kv + kD, 1);
    Trace(layer, 19);
    // Partials (or, with one split, the output).
    unsigned* head_count = p.sync + kSyncHead + g * 32;
    int* flag = reinterpret_cast<int*>(misc());
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const int hh = warp + t * kConsumerWarps;
      if (hh >= group) break;
      if (plan.splits == 1) {
        const float inv = 1.f / l[t];
        bf16_t out[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) out[i] = __float2bfloat16(o[t][i] * inv);
        *reinterpret_cast<uint2*>(p.attn_out + (g * group + hh) * kD + e0) =
            *reinterpret_cast<const uint2*>(out);
      } else {
        float* part = p.attn_part + (static_cast<int64_t>(c) * kMaxGroup + hh) * kPartStride;
        __stcg(reinterpret_cast<float4*>(part + e0),
               make_float4(o[t][0], o[t][1], o[t][2], o[t][3]));
        if (lane == 0) {
          __stcg(part + kD, m[t]);
          __stcg(part + kD + 1, l[t]);
        }
      }
    }
    ConsumerSync();
    if (plan.splits > 1) {
      if (tid == 0) {
        const unsigned done = FetchAddAcqRel(head_count) + 1;
        flag[0] = done == static_cast<unsigned>((layer + 1) * plan.splits);
      }
      ConsumerSync();
      Trace(layer, 20);
      const bool merge = flag[0] != 0;
      if (merge) {
        const int first = g * plan.splits;
        // The splits' (m, l) across the lanes, then their o partials eight loads at a time.
        for (int hh = warp; hh < group; hh += kConsumerWarps) {
          auto part = [&](int sp) {
            return p.attn_part + (static_cast<int64_t>(first + sp) * kMaxGroup + hh) * kPartStride;
          };
          float mx = -INFINITY;
          for (int sp = lane; sp < plan.splits; sp += 32) mx = fmaxf(mx, __ldcg(part(sp) + kD));
          mx = WarpMax(mx);
          float lsum = 0.f;
          for (int sp = lane; sp < plan.splits; sp += 32) {
            const float ms = __ldcg(part(sp) + kD);
            lsum += ms == -INFINITY ? 0.f : exp2f(ms - mx) * __ldcg(part(sp) + kD + 1);
          }
          lsum = WarpSum(lsum);
          float acc[4] = {};
          for (int sp0 = 0; sp0 < plan.splits; sp0 += 8) {
            float4 ov[8];
            float wgt[8];
#pragma unroll
            for (int u = 0; u < 8; ++u) {
              const int sp = min(sp0 + u, plan.splits - 1);
              ov[u] = __ldcg(reinterpret_cast<const float4*>(part(sp) + e0));
              const float ms = __ldcg(part(sp) + kD);
              wgt[u] = sp0 + u >= plan.splits || ms == -INFINITY ? 0.f : exp2f(ms - mx);
            }
#pragma unroll
            for (int u = 0; u < 8; ++u) {
              acc[0] += wgt[u] * ov[u].x;
              acc[1] += wgt[u] * ov[u].y;
              acc[2] += wgt[u] * ov[u].z;
              acc[3] += wgt[u] * ov[u].w;
            }
          }
          const float inv = 1.f / lsum;
          bf16_t out[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) out[i] = __float2bfloat16(acc[i] * inv);
          *reinterpret_cast<uint2*>(p.attn_out + (g * group + hh) * kD + e0) =
              *reinterpret_cast<const uint2*>(out);
        }
        ConsumerSync();
        if (tid == 0) ArriveRelease(p.sync + kSyncMerged);
        Trace(layer, 21);
      }
    } else if (tid == 0) {
      ArriveRelease(p.sync + kSyncMerged);
    }
  }
};

__global__ void __launch_bounds__(kThreads, 1)
    DecodeStackKernel(const __grid_constant__ StackParams p) {
  extern __shared__ __align__(1024) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const uint32_t base = SmemAddr(smem);
  const uint32_t full = base + SmemLayout::kBars, empty = full + kStages * 8;
  if (tid == 0) {
    for (int i = 0; i < kStages; ++i) {
      MbarInit(full + i * 8, 1);
      MbarInit(empty + i * 8, 1);  // the one consumer warp (or thread) that read the stage
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
      cons.Gemv(ring_a, qkv.begin, qkv.end, p.hidden, x,
                [&](int row, float v) { p.qkv_out[row] = __float2bfloat16(v); });
      trace(2);
      cons.GridSync(BarrierTarget(l, kBarQkv));
      trace(3);
      // ATTN
      if (c < p.hk * plan.splits) cons.Attention(ring_a, L, l, plan);
      trace(4);
      // O: waits for every KV head's merged output.
      if (tid == 0) SpinUntil(p.sync + kSyncMerged, static_cast<unsigned>((l + 1) * p.hk));
      ConsumerSync();
      for (int i = tid; i < q_cols / 8; i += kConsumers)
        reinterpret_cast<Bf16x8*>(x)[i] = LoadCg8(p.attn_out + i * 8);
      ConsumerSync();
      trace(5);
      const Range o = Share(p.hidden, c, grid);
      cons.Gemv(ring_a, o.begin, o.end, q_cols, x, [&](int row, float v) {
        const float y = __bfloat162float(__float2bfloat16(v));
        p.sum[row] = __float2bfloat16(y + __bfloat162float(__ldcg(p.sum + row)));
      });
      trace(6);
      cons.GridSync(BarrierTarget(l, kBarO));
      trace(7);
      // ROUTER
      cons.NormInto(p.sum, L.post_norm, p.hidden, x);
      trace(8);
      const Range r = Share(p.experts, c, grid);
      cons.Gemv(ring_a, r.begin, r.end, p.hidden, x, [&](int row, float v) { p.logits[row] = v; });
      trace(9);
      cons.GridSync(BarrierTarget(l, kBarRouter));
      trace(10);
      // GATEUP (pairs of gate row j and up row j; ring B, after producer B routed)
      {
        const int pairs = p.top_k * p.inter, per = kStageBytes / (4 * p.hidden);
        const Range pr = Share(pairs, c, grid);
        for (int q = pr.begin; q < pr.end; ++ring_b.iter) {
          const int slot = q / p.inter, j = q % p.inter;
          const int n = min(per, min(pr.end - q, p.inter - j));
          q += n;
          if (!cons.Owns(ring_b)) continue;
          ring_b.WaitFull();
          float gate[4];  // n <= 4: kStageBytes / (4 H) with H >= 1024
          cons.DotRows(cons.StageRows(ring_b), 2 * n, p.hidden, x, [&](int row, float v) {
            if (row < n) {
              gate[row] = v;
            } else {
              const float g = gate[row - n];
              __stcg(p.act + slot * p.inter + j + row - n, g / (1.f + expf(-g)) * v);
            }
          });
          ring_b.Release(lane);
        }
      }
      trace(11);
      cons.GridSync(BarrierTarget(l, kBarGateUp));
      trace(12);
      // DOWN: the CTA's rows of H for every slot (a partial per slot and row), then combined
      // with the routing weights in slot order.
      for (int i = tid; i < p.top_k * p.inter / 4; i += kConsumers)
        reinterpret_cast<float4*>(act)[i] = __ldcg(reinterpret_cast<const float4*>(p.act) + i);
      ConsumerSync();
      trace(13);
      const Range h = Share(p.hidden, c, grid);
      {
        const int per = RowsPerStage(p.inter);
        for (int slot = 0; slot < p.top_k; ++slot) {
          for (int r0 = h.begin; r0 < h.end; r0 += per, ++ring_b.iter) {
            if (!cons.Owns(ring_b)) continue;
            const int n = min(per, h.end - r0);
            ring_b.WaitFull();
            float* part = down_part + slot * kMaxRows + (r0 - h.begin);
            cons.DotRows(cons.StageRows(ring_b), n, p.inter, act + slot * p.inter,
                         [&](int row, float v) { part[row] = v; });
            ring_b.Release(lane);
          }
        }
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
      cons.GridSync(BarrierTarget(l, kBarDown));
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
      for (int g = 0; g < p.hk; ++g) p.sync[kSyncHead + g * 32] = 0;
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
                                             "A: merge (last)"};
  std::fprintf(stderr,
               "decode stack trace (%d layers, %d CTAs), us: mean over CTAs / max CTA mean\n",
               layers, grid);
  for (int e = 1; e < kTraceEvents; ++e) {
    // B's spin ends vs the consumers' router barrier; the attention task's steps (A: only the
    // CTAs that have one, the merge only where it ran) from the qkv barrier on.
    const int from = e == 16 ? 10 : e == 18 ? 3 : e - 1;
    double sum = 0, worst = 0;
    int ctas = 0;
    for (int c = 0; c < grid; ++c) {
      double cta = 0;
      int n = 0;
      for (int l = 1; l < layers; ++l) {
        if (at(l, c, e) == 0 || at(l, c, from) == 0) continue;
        cta += (at(l, c, e) - at(l, c, from)) / 1000.0;
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

int DecodeStackSyncWords() { return kSyncHead + 64 * 32; }

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
  bool ok = layers <= kMaxStackLayers && stack.head_dim == kD && hk >= 1 && hk <= 64 &&
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
