// The small-batch decode attention kernel's (attention_decode.cu) parameters, shared memory and
// split-KV merges: the counter merge (the last CTA of a (sequence, KV head) to arrive reads every
// split's partials from global memory) and the cluster merge (the splits as one thread block
// cluster, partials in shared memory, read over DSMEM). In an anonymous namespace: included by
// attention_decode.cu only (as decode_stack.cuh by the decode stack's files).
#pragma once

#include <cooperative_groups.h>

#include <cmath>
#include <cstdint>

#include "kernels/cuda/attention_prologue.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/split_kv_merge.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kWarpKeys = 16;                   // keys one warp scores a pass
constexpr int kPassKeys = kWarps * kWarpKeys;   // keys of a pass
constexpr int kChunkAlign = kWarpKeys;          // a split's keys: a multiple of this
constexpr int kMaxGroup = 16;
// The last CTA of a (sequence, KV head) reads group x splits x D f32 partials through one SM:
// the plan keeps that at most Tuning().attention_decode_merge_floats (128 KB by default) and
// group x splits at most kMaxMergeRows (its (m, l) pairs in shared memory).
constexpr int kMaxMergeRows = 512;

// kOutProj (QkNormRopeAttentionProj, Tuning().attention_region): the o projection of the one
// token folded in. The grid has CTAs past the attention's (blockIdx.y >= kv_heads); every CTA
// bulk-copies rows_per_cta rows of w into shared memory before its wait, each attention CTA
// counts itself on counters[0] once its share of the output is written (the cluster merge's
// items; with the counter merge after its arrival, which the last to arrive merges before it
// returns; with one split its heads), and every CTA then
// waits for all of them, reads the output row and multiplies its rows (StagedDot<1> a row, the
// staged GEMV's order where it takes a row a warp). counters[1] counts the CTAs past that wait;
// the last re-arms both (zero between launches).
struct DecodeOutProj {
  const bf16_t* w;  // [n, k], k = q_heads * D
  bf16_t* out;      // [n]
  int n, k, rows_per_cta;
  int x_bytes;  // the staged output row: k bf16 rounded up to 128 bytes
  int attention_ctas;
  unsigned* counters;
  bool copy_after_wait;  // Tuning().attention_region_late_copy: w's copies start after the wait
};
// Its dynamic shared memory: the mbarrier (128 bytes with padding), x, then the CTA's rows.
constexpr int kOutProjHeader = 128;

struct DecodeParams {
  const bf16_t* q;  // row (token t, head h) at t * q_token_stride + h * q_head_stride
  int64_t q_token_stride, q_head_stride;
  bf16_t* out;
  int64_t out_token_stride, out_head_stride;
  bf16_t* k_cache;  // [num_blocks, Hk, block_size, D], < 2^31 rows (host-checked); written with kPrologue
  bf16_t* v_cache;
  const int32_t* block_tables;  // [B, table_stride]
  int64_t table_stride;
  const int32_t* query_start;  // [B + 1]; every sequence 0 or 1 query tokens
  const int32_t* seq_lens;     // [B]
  int kv_heads, group, q_heads, block_size;
  int block_shift;   // log2(block_size) when a power of two, else -1
  float scale_log2;  // softmax scale * log2(e)
  // blockIdx.x = split. num_splits 1: the CTA normalises and writes out; else split s takes the
  // keys SplitKeyRange (split_keys.h) deals it in kChunkAlign tiles, and writes unnormalised
  // partials (m -inf, l 0 when it has no key).
  int num_splits;
  float* part_o;   // [T * Hq, num_splits, D]
  float* part_ml;  // [T * Hq, num_splits, 2]
  int* counters;   // [B, Hk] arrival counters (zero between launches), or null: merged after
  int trigger_at;      // TriggerDependents: 0 at entry, 1 after the wait, 2 after the passes (Tuning())
  bool wide_merge;     // every split merges a share (WideMergeDecode; Tuning().attention_decode_wide_merge)
  bool prefetch;       // Tuning().attention_decode_prefetch
  bool warm_merge;     // Tuning().attention_decode_warm_merge
  bool relaxed_exit;   // Tuning().attention_decode_relaxed_exit
  DecodePrologue prologue;  // kPrologue only
  DecodeOutProj proj;       // kOutProj only
  uint64_t* timeline = nullptr;  // timeline.h
};

// Shared memory: the warps' scaled, masked S (C-fragment order), double-buffered by pass parity,
// and the merge's per-(row, split) (m, l) then (weight, l).
template <int kRowBlocks>
struct DecodeSmem {
  float4 s[2][kRowBlocks][kWarps][32];
  union {
    float2 ml[kMaxMergeRows];
    uint4 q[kRowBlocks * 8 * 256 * 2 / 16];  // kPrologue: the group's q rows [group][D] bf16, before any pass
  };
  float inv_l[kMaxGroup];
  int last;
};

// The merge's weights from sm.ml [rows][splits] of (m, l): a warp per row takes the max, turns
// each split's m into its weight 2^(m - max) (0 for an empty split) and sums the weighted l.
template <int kRowBlocks>
__device__ __forceinline__ void MergeWeights(DecodeSmem<kRowBlocks>& sm, int rows, int splits) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < rows; r += kWarps) {
    float2* rml = sm.ml + r * splits;
    float mx = -INFINITY;
    for (int sp = lane; sp < splits; sp += 32) mx = fmaxf(mx, rml[sp].x);
    mx = WarpMax(mx);
    float sum = 0.f;
    for (int sp = lane; sp < splits; sp += 32) {
      const float wt = rml[sp].x == -INFINITY ? 0.f : exp2f(rml[sp].x - mx);
      rml[sp].x = wt;
      sum += wt * rml[sp].y;
    }
    sum = WarpSum(sum);
    if (lane == 0) sm.inv_l[r] = 1.f / sum;
  }
}

// A merged item into the output: dims 4 c4 .. 4 c4 + 3 of the group's row r, scaled by inv (1 / l).
__device__ __forceinline__ void StoreMergedItem(const DecodeParams& p, int q0, int kvh, int r, int c4, float4 v,
                                                float inv) {
  __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(
      p.out + static_cast<int64_t>(q0) * p.out_token_stride + static_cast<int64_t>(kvh * p.group + r) * p.out_head_stride +
      4 * c4);
  dst[0] = __floats2bfloat162_rn(v.x * inv, v.y * inv);
  dst[1] = __floats2bfloat162_rn(v.z * inv, v.w * inv);
}

// The last CTA of (sequence b, KV head kvh) to arrive merges the splits' partials of the group's
// rows into out (as SplitKvMergeKernel), then re-arms the counter. Called by every thread once
// its partials are written.
template <int kD, int kRowBlocks>
__device__ void ArriveAndMergeDecode(const DecodeParams& p, DecodeSmem<kRowBlocks>& sm, int b, int kvh, int q0,
                                     const TimelineScopeLocal& tl) {
  // The CTA barrier orders every thread's partials before thread 0's release (cumulative at GPU
  // scope); its acquire, passed on by the second barrier, orders the other splits' partials before
  // this CTA's reads. One acquire-release atomic a CTA, no fence in every thread before and after
  // it (2.889 vs 2.899 ms a step at ctx 8192 on an H200, batch 1, graph, two runs each).
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = p.counters + static_cast<int64_t>(b) * p.kv_heads + kvh;
    int old;
    asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
    const bool last = old == p.num_splits - 1;
    if (last) atomicExch(counter, 0);  // every other split has arrived: nobody else touches it now
    sm.last = last;
  }
  __syncthreads();
  tl.Mark(2);
  if (!sm.last) return;
  const int splits = p.num_splits, rows = p.group;
  // The group's rows are consecutive flat rows: their partials are one block.
  const int64_t row0 = static_cast<int64_t>(q0) * p.q_heads + static_cast<int64_t>(kvh) * p.group;
  const float2* ml = reinterpret_cast<const float2*>(p.part_ml) + row0 * splits;
  // Thread per (row, 4 dims) item, two items (idx, idx + kThreads) a round, kBatch splits' o of
  // both loaded together; the first round's loads go out before the (m, l) phases, so the whole
  // merge of a small plan (group 8, D 128, <= 16 splits: one round) is about one L2 round trip.
  // An empty split's o was never written: its weight 0 selects it out (never multiplied).
  constexpr int kBatch = 16;
  const int items = rows * (kD / 4);
  const int rounds = (items + 2 * kThreads - 1) / (2 * kThreads);
  const int batches = (splits + kBatch - 1) / kBatch;
  for (int round = 0; round < rounds; ++round) {
    float4 acc[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
    for (int batch = 0; batch < batches; ++batch) {
      const int s0 = batch * kBatch;
      float4 ov[2][kBatch];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int idx = threadIdx.x + (2 * round + j) * kThreads;
        if (idx >= items) continue;
        const float4* o =
            reinterpret_cast<const float4*>(p.part_o + (row0 + idx / (kD / 4)) * splits * kD) + idx % (kD / 4);
#pragma unroll
        for (int i = 0; i < kBatch; ++i)
          if (s0 + i < splits) ov[j][i] = __ldcg(o + (s0 + i) * (kD / 4));  // L2: other SMs wrote it
      }
      if (round == 0 && batch == 0) {  // uniform: every thread passes here once, first
        for (int i = threadIdx.x; i < rows * splits; i += kThreads) sm.ml[i] = __ldcg(ml + i);
        __syncthreads();
        MergeWeights(sm, rows, splits);
        __syncthreads();
        tl.Mark(3);
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int idx = threadIdx.x + (2 * round + j) * kThreads;
        if (idx >= items) continue;
        const float2* rml = sm.ml + (idx / (kD / 4)) * splits;
#pragma unroll
        for (int i = 0; i < kBatch; ++i) {
          if (s0 + i >= splits) break;
          const float wt = rml[s0 + i].x;
          AddWeighted(acc[j], wt, wt != 0.f, ov[j][i]);
        }
      }
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int idx = threadIdx.x + (2 * round + j) * kThreads;
      if (idx >= items) continue;
      const int r = idx / (kD / 4), c4 = idx % (kD / 4);
      const float inv = sm.inv_l[r];
      StoreMergedItem(p, q0, kvh, r, c4, acc[j], inv);
    }
  }
}

// Where p.wide_merge (the host has checked that every CTA of the grid can be resident at once,
// that a split's share of the items fits the CTA's threads and that the counters hold 2 x [B,
// Hk]): each split of (sequence b, KV head kvh) counts itself in and waits until all have, then
// merges its 1 / splits share of the (row, 4 dims) items instead of the last CTA merging them
// all. An item's splits are spread over T = kThreads / share threads (kWideLoads loads a thread,
// all issued before the weights are formed); their sums meet in shared memory in thread order.
// The last CTA to leave re-arms both counters (arrivals [B, Hk], departures after them).
constexpr int kWideLoads = 8;
constexpr int kWideDepartures = kMaxSplitKvMergeCounters / 2;
template <int kD, int kRowBlocks>
__device__ void WideMergeDecode(const DecodeParams& p, DecodeSmem<kRowBlocks>& sm, int b, int kvh, int q0, int split,
                                const TimelineScopeLocal& tl) {
  unsigned* arrivals = reinterpret_cast<unsigned*>(p.counters) + static_cast<int64_t>(b) * p.kv_heads + kvh;
  __syncthreads();  // every thread's partials written
  if (threadIdx.x == 0) {
    asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(arrivals) : "memory");
    wgmma::SpinUntil(arrivals, static_cast<unsigned>(p.num_splits));  // (then an acquire fence)
  }
  __syncthreads();
  tl.Mark(2);
  const int splits = p.num_splits, items = p.group * (kD / 4), per = (items + splits - 1) / splits;
  const int i0 = split * per, n = min(per, items - i0);
  if (n > 0) {
    const int64_t row0 = static_cast<int64_t>(q0) * p.q_heads + static_cast<int64_t>(kvh) * p.group;
    const int r_first = i0 / (kD / 4), nrows = (i0 + n - 1) / (kD / 4) - r_first + 1;
    const int t = threadIdx.x, j = t % n, sub = t / n, threads = kThreads / n;
    const int idx = i0 + j, r = idx / (kD / 4), c4 = idx % (kD / 4);
    const float4* o = reinterpret_cast<const float4*>(p.part_o + (row0 + r) * splits * kD) + c4;
    float4 ov[kWideLoads];
#pragma unroll
    for (int k = 0; k < kWideLoads; ++k) {
      const int s = sub + k * threads;
      if (sub < threads && s < splits) ov[k] = __ldcg(o + s * (kD / 4));  // L2: other SMs wrote them
    }
    const float2* ml = reinterpret_cast<const float2*>(p.part_ml) + (row0 + r_first) * splits;
    for (int i = t; i < nrows * splits; i += kThreads) sm.ml[i] = __ldcg(ml + i);
    __syncthreads();
    MergeWeights(sm, nrows, splits);
    __syncthreads();
    tl.Mark(3);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    const float2* rml = sm.ml + (r - r_first) * splits;
#pragma unroll
    for (int k = 0; k < kWideLoads; ++k) {
      const int s = sub + k * threads;
      if (sub >= threads || s >= splits) break;
      const float wt = rml[s].x;
      AddWeighted(acc, wt, wt != 0.f, ov[k]);
    }
    float4* red = &sm.s[0][0][0][0];  // the passes' scratch, free now: kThreads float4
    red[t] = acc;
    __syncthreads();
    if (t < n) {
      float4 v = red[t];
      for (int k = 1; k < threads; ++k) {
        const float4 w = red[t + k * n];
        v.x += w.x, v.y += w.y, v.z += w.z, v.w += w.w;
      }
      const float inv = sm.inv_l[r - r_first];
      StoreMergedItem(p, q0, kvh, r, c4, v, inv);
    }
  }
  tl.Mark(4);
  if (threadIdx.x == 0) {  // every split has passed its wait once all have left: re-arm
    unsigned* departures = arrivals + kWideDepartures;
    if (atomicAdd(departures, 1u) == static_cast<unsigned>(splits - 1)) {
      atomicExch(arrivals, 0u);
      atomicExch(departures, 0u);
    }
  }
}

// kCluster: a split's partials in its own shared memory ([8][kD] o and (m, l) of each row).
template <int kD>
struct ClusterPartials {
  float o[8 * kD];
  float2 ml[8];
};
constexpr int kMaxClusterSplits = 16;  // a cluster of the splits of one (sequence, KV head)

// The splits of (sequence, KV head) as one thread block cluster (kCluster, groups <= 8, <= 16
// splits): after a cluster barrier every CTA reads all splits' (m, l) from its peers' shared
// memory (DSMEM) and forms the weights as ArriveAndMergeDecode does, then merges its 1 / splits
// share of the (row, 4 dims) items, reading the peers' o; a second barrier keeps each CTA's
// partials alive until its peers are done. No partials in global memory, fence or counter.
// dry: the same instructions without the output's store and the marks (p.warm_merge).
template <int kD>
__device__ void ClusterMergeDecode(const DecodeParams& p, DecodeSmem<1>& sm, ClusterPartials<kD>& cl, int kvh, int q0,
                                   const TimelineScopeLocal& tl, bool dry = false) {
  cg::cluster_group cluster = cg::this_cluster();
  const int splits = p.num_splits, rows = p.group, rank = static_cast<int>(cluster.block_rank());
  cluster.sync();  // every split's partials written, visible to the cluster
  if (!dry) tl.Mark(1);
  for (int i = threadIdx.x; i < rows * splits; i += kThreads)
    sm.ml[i] = cluster.map_shared_rank(&cl, i % splits)->ml[i / splits];
  __syncthreads();
  if (!dry) tl.Mark(2);
  MergeWeights(sm, rows, splits);
  __syncthreads();
  if (!dry) tl.Mark(3);
  const int items = rows * (kD / 4), per = (items + splits - 1) / splits;
  for (int i = threadIdx.x; i < per && rank * per + i < items; i += kThreads) {
    const int idx = rank * per + i, r = idx / (kD / 4), c4 = idx % (kD / 4);
    const float2* rml = sm.ml + r * splits;
    float4 ov[kMaxClusterSplits];
#pragma unroll
    for (int sp = 0; sp < kMaxClusterSplits; ++sp)
      if (sp < splits) ov[sp] = reinterpret_cast<const float4*>(cluster.map_shared_rank(&cl, sp)->o + r * kD)[c4];
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int sp = 0; sp < kMaxClusterSplits; ++sp) {
      if (sp >= splits) break;
      const float wt = rml[sp].x;
      AddWeighted(acc, wt, wt != 0.f, ov[sp]);
    }
    const float inv = sm.inv_l[r];
    if (!dry) StoreMergedItem(p, q0, kvh, r, c4, acc, inv);
  }
  if (!dry) tl.Mark(4);
  // Peers may still read this CTA's partials. Only their reads must be over before it exits, and
  // a peer's reads are (their values summed into the stores above) by its arrival: with
  // p.relaxed_exit the arrival does not also wait for this CTA's output stores to be performed
  // (a release), which under the o projection's copies took ~1 us.
  if (p.relaxed_exit) {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  } else {
    cluster.sync();
  }
  if (!dry) tl.Mark(5);
}

// kOutProj, before the dependency wait (weights only): thread 0 starts the bulk copy of the
// CTA's rows of w (CTA index blockIdx.x + gridDim.x * blockIdx.y) on the header's mbarrier.
__device__ __forceinline__ void OutProjStage(const DecodeOutProj& op, unsigned char* smem) {
  const int cta = blockIdx.x + gridDim.x * blockIdx.y;
  const int row0 = cta * op.rows_per_cta, rows = max(0, min(op.rows_per_cta, op.n - row0));
  if (threadIdx.x != 0 || rows == 0) return;
  const uint32_t bar = wgmma::SmemAddr(smem), bytes = static_cast<uint32_t>(rows) * op.k * 2;
  wgmma::MbarInit(bar, 1);
  wgmma::MbarInitFence();
  wgmma::MbarArriveExpectTx(bar, bytes);
  wgmma::BulkCopy(wgmma::SmemAddr(smem + kOutProjHeader + op.x_bytes), op.w + static_cast<int64_t>(row0) * op.k,
                  bytes, bar, wgmma::EvictFirst());
}

// kOutProj, after the attention (every CTA, every thread, once): see DecodeOutProj. `attended`:
// this CTA is one of the attention's and its share of p.out is written. The counters' protocol
// is the decode stack's grid barrier's (wgmma.cuh): a CTA barrier, then thread 0's release
// arrival; the waiting thread polls relaxed and fences once (acquire), the barrier after it
// passes that on. Not inlined: inlined at the kernel's three exits it made the counter-merge
// build spill 896 bytes (none this way; the cluster build keeps its twin's figures).
__device__ __noinline__ void OutProjPhase(const DecodeParams& p, bool attended, unsigned char* smem) {
  const DecodeOutProj& op = p.proj;
  __syncthreads();  // every thread's stores of the output (and its reads of everything) done
  if (threadIdx.x == 0) {
    if (attended) wgmma::ArriveRelease(op.counters);
    // (10 s without every attention CTA, a placement the host check missed, traps: the launch
    // fails instead of hanging.)
    wgmma::SpinUntil(op.counters, static_cast<unsigned>(op.attention_ctas));
    if (atomicAdd(op.counters + 1, 1u) == gridDim.x * gridDim.y * gridDim.z - 1) {
      atomicExch(op.counters, 0u);  // every CTA is past the wait: re-armed for the next launch
      atomicExch(op.counters + 1, 0u);
    }
  }
  __syncthreads();
  bf16_t* xs = reinterpret_cast<bf16_t*>(smem + kOutProjHeader);
  for (int i = threadIdx.x; i < op.k / 8; i += kThreads)  // one token: its heads contiguous (host-checked)
    reinterpret_cast<uint4*>(xs)[i] = __ldcg(reinterpret_cast<const uint4*>(p.out) + i);
  __syncthreads();
  const int cta = blockIdx.x + gridDim.x * blockIdx.y;
  const int row0 = cta * op.rows_per_cta, rows = max(0, min(op.rows_per_cta, op.n - row0));
  if (rows == 0) return;
  wgmma::MbarWait(wgmma::SmemAddr(smem), 0);
  const bf16_t* ws = reinterpret_cast<const bf16_t*>(smem + kOutProjHeader + op.x_bytes);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  for (int r = warp; r < rows; r += kWarps) {
    float v[1];
    StagedDot<1>(ws + static_cast<int64_t>(r) * op.k, xs, op.k, lane, v);
    if (lane == 0) op.out[row0 + r] = __float2bfloat16(v[0]);
  }
}

}  // namespace
}  // namespace corolla::cuda
