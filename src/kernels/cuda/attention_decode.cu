// Decode attention for small batches: every sequence has one query token (its K/V already in
// the paged, heads-major cache [num_blocks, Hk, block_size, D]), Dk = Dv = D in {64, 128, 256},
// separate K and V, GQA group <= 16. attention.cu's Attention() routes such calls here (when
// Tuning().attention_decode_kernel is on) before the mma.sync kernel; this file plans the split
// and launches.
//
// The mma.sync decode kernel spends a long serial instruction stream on few CTAs (cp.async
// pipeline, ldmatrix, a cross-warp merge through 74 KB of shared memory). This one is built for
// latency: CTA = (split, KV head, sequence), 4 warps; each pass of 64 keys issues every load it
// needs at once straight into registers (the next pass's loads are issued before this one's
// math), and runs both products on mma.sync m16n8k16 from those registers:
// - S = Q K^T (16 query rows: the group, zero-padded, x 8 keys): the dot product may visit the
//   dims in any order as long as Q and K agree, so lane (g, c) loads 16 bytes of key g (and of
//   query row g) at dims 32 q + 8 c and uses their words 2e, 2e+1 as the b0/b1 (a0/a2) of k-step
//   (q, e). Warp w scores keys 16 w .. 16 w + 15 of the pass.
// - O^T = V^T P^T (16 dims x 8 query rows; a second row block for groups > 8): the C fragments of
//   S (lane (g, c): row g, keys 2c, 2c+1 and 8+2c, 8+2c+1 of its 16) are exactly the B fragment
//   of P^T; V^T as the A operand needs key pairs of one dim in a register, made from two loaded
//   words (key pairs, dim pairs) by byte permutes. Warp w owns dims [w D/4, (w+1) D/4): lane
//   (g, c) loads D/32 dims at w D/4 + g D/32 of keys 2c, 2c+1, 2c+8, 2c+9 of each 16-key block;
//   word t of them is m-tile t (m = g -> its low dim, m = g + 8 -> its high dim).
// The warps exchange their scaled, masked S through 4-8 KB of shared memory (one barrier a
// pass); every warp then computes the softmax of all 64 keys itself (same max and sum in every
// warp, so no cross-warp merge of O). Split-KV partials use split_kv_merge.cuh's format; the
// last CTA of a (sequence, KV head) to arrive merges them (per-stream arrival counters shared
// with attention_mma.cu, re-armed by that CTA, so a CUDA graph can replay the launch), or, where
// the whole grid fits the device at once, every split merges a share once all have arrived
// (the wide merge), or the splits merge as one cluster (the merges, the parameters and the
// shared memory layout: attention_decode.cuh).
// Under programmatic dependent launch the first passes of cached keys are loaded before the
// dependency wait (Tuning().attention_decode_prefetch), and QkNormRopeAttention folds the
// prologue in (kPrologue: each CTA normalises and rotates its group's q heads; the split holding
// the step's key writes that key's k and v to the cache itself).
#include <algorithm>
#include <atomic>

#include "kernels/cuda/attention_decode.cuh"
#include "kernels/cuda/attention_prologue.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/timeline.h"
#include "kernels/cuda/split_kv_merge.cuh"
#include "kernels/cuda/stream_scratch.h"

namespace corolla::cuda {
namespace {

__device__ __forceinline__ uint32_t Word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// kWords 32-bit words from 4 kWords-byte aligned global memory, through L2 only (.cg, as q and K:
// under programmatic dependent launch the kernel that wrote them may still be running when this
// one starts, so the read-only .nc path's contract does not hold).
template <int kWords>
__device__ __forceinline__ void LoadWords(uint32_t (&w)[kWords], const bf16_t* src) {
  if constexpr (kWords == 4) {
    const uint4 v = __ldcg(reinterpret_cast<const uint4*>(src));
    w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
  } else if constexpr (kWords == 2) {
    const uint2 v = __ldcg(reinterpret_cast<const uint2*>(src));
    w[0] = v.x, w[1] = v.y;
  } else {
    static_assert(kWords == 1);
    w[0] = __ldcg(reinterpret_cast<const unsigned int*>(src));
  }
}

template <int kN>
__device__ __forceinline__ void StoreF32(float* dst, const float (&f)[kN]) {
  static_assert(kN % 2 == 0);
  if constexpr (kN % 4 == 0) {
#pragma unroll
    for (int i = 0; i < kN; i += 4) *reinterpret_cast<float4*>(dst + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
  } else {
    *reinterpret_cast<float2*>(dst) = make_float2(f[0], f[1]);
  }
}

template <int kN>
__device__ __forceinline__ void StoreBf16(bf16_t* dst, const float (&f)[kN], float scale) {
  uint32_t w[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) w[i] = mma::PackBf16x2(f[2 * i] * scale, f[2 * i + 1] * scale);
  if constexpr (kN == 8) {
    *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
  } else if constexpr (kN == 4) {
    *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
  } else {
    static_assert(kN == 2);
    *reinterpret_cast<uint32_t*>(dst) = w[0];
  }
}

// One pass's loads, in this lane's fragment order.
template <int kD>
struct PassRegs {
  static constexpr int kQChunks = kD / 32;  // 16-byte pieces of a row a lane loads
  static constexpr int kVWords = kD / 64;   // words of V a lane loads per key = m-tiles of its warp
  uint4 k[2][kQChunks];         // key 16 w + 8 t + g, dims 32 q + 8 c .. + 7
  uint32_t v[4][4][kVWords];    // 16-key block kb, key 16 kb + {2c, 2c+1, 2c+8, 2c+9}[i], its dims
};

// kRowBlocks: 1 for groups <= 8 (query rows = the n of P V), 2 up to 16. kPrologue: the prologue
// folded in (p.prologue; q holds the raw projection). kCluster: the splits of a (sequence, KV
// head) form a thread block cluster and merge through shared memory (ClusterMergeDecode).
// Timeline marks (timeline.h): 0 every pass multiplied; with the cluster 1 after its first
// barrier, 2 the peers' (m, l) read, 3 the merge weights formed, 4 merged, 5 after the last
// barrier; else 1 partials written, 2 arrived (counted in), 3 the merging CTA's weights formed,
// 4 merged.
// kOutProj: the o projection folded in (DecodeOutProj: the CTAs with blockIdx.y >= kv_heads only
// project; one sequence).
template <int kD, int kRowBlocks, bool kPrologue, bool kCluster = false, bool kOutProj = false>
__global__ void __launch_bounds__(kThreads) AttentionDecodeKernel(const __grid_constant__ DecodeParams p) {
  static_assert(!kCluster || kRowBlocks == 1, "the cluster merge keeps 8 rows a split");
  static_assert(!kOutProj || (kPrologue && kRowBlocks == 1), "the folded projection: one row block, the prologue");
  using Regs = PassRegs<kD>;
  constexpr int kQChunks = Regs::kQChunks, kVWords = Regs::kVWords;
  constexpr int kLaneDims = kD / 32;    // V / O dims a lane owns (2 per m-tile)
  constexpr bool kPrefetch = kD <= 128;  // two passes' loads in registers (D 256: one, ~255 regs otherwise)
  // Passes loaded before the dependency wait: where registers allow (else 16-80 bytes spill).
  constexpr bool kEarly = kPrefetch && kRowBlocks == 1;
  __shared__ DecodeSmem<kRowBlocks> sm;
  __shared__ __align__(16) ClusterPartials<kCluster ? kD : 4> cl;  // kCluster only
  TimelineScopeLocal tl(p.timeline);

  if (p.trigger_at == 0) TriggerDependents();  // safe: pdl.cuh
  extern __shared__ __align__(128) unsigned char proj_smem[];  // kOutProj only
  if constexpr (kOutProj) {
    if (!p.proj.copy_after_wait) OutProjStage(p.proj, proj_smem);
    if (blockIdx.y >= p.kv_heads) {  // a projecting CTA only
      GridDependencyWait();
      tl.Waited();
      if (p.trigger_at == 1) TriggerDependents();
      if (p.proj.copy_after_wait) OutProjStage(p.proj, proj_smem);
      OutProjPhase(p, false, proj_smem);
      return;
    }
  }
  const int b = blockIdx.z, kvh = blockIdx.y, split = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  // Before the dependency wait this grid reads only what no kernel of the forward writes: the
  // step's metadata (query starts, lengths, tables, positions, slots: copied from the host) and
  // the cache rows of keys below this step's key (seq_len - 1), written by earlier forwards,
  // which have completed (this grid starts after the qkv projection has passed its own wait, so
  // every kernel before that one is done). The step's key is written by the prologue (a kernel
  // before this one, or this grid with kPrologue) and read after the wait.
  const int q0 = p.query_start[b];
  const bool has_query = p.query_start[b + 1] - q0 > 0;  // else no CTA of b arrives
  const int seq_len = p.seq_lens[b];
  const int new_key = seq_len - 1;
  const KeyRange keys = SplitKeyRange(seq_len, p.num_splits, split, kChunkAlign, seq_len);
  const int kv_begin = keys.begin, kv_end = keys.end;
  const int num_passes = (kv_end - kv_begin + kPassKeys - 1) / kPassKeys;
  const int32_t* table = p.block_tables + b * p.table_stride;

  // Loads keys [lo, hi) of the pass at n0 into r; its other keys are zero when fill (masked in S,
  // and zero rows of V keep P V finite whatever the cache holds there), untouched otherwise.
  auto load_keys = [&](Regs& r, int n0, int lo, int hi, bool fill) {
    // Cache rows of keys n0 + lane and n0 + 32 + lane (-1: not loaded), shuffled to the lanes
    // that need them.
    int row_lo = -1, row_hi = -1;
    if (n0 + lane >= lo && n0 + lane < hi) {
      const PagedSlot s = LocateKey(table, n0 + lane, p.block_size, p.block_shift);
      row_lo = static_cast<int>((s.block * p.kv_heads + kvh) * p.block_size + s.in_block);
    }
    if (n0 + 32 + lane >= lo && n0 + 32 + lane < hi) {
      const PagedSlot s = LocateKey(table, n0 + 32 + lane, p.block_size, p.block_shift);
      row_hi = static_cast<int>((s.block * p.kv_heads + kvh) * p.block_size + s.in_block);
    }
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      // Key 16 warp + 8 t + g: in the low 32 for warps 0-1 (warp-uniform choice).
      const int row = __shfl_sync(0xffffffffu, warp < 2 ? row_lo : row_hi, (16 * warp + 8 * t + g) & 31);
      const bf16_t* src = p.k_cache + static_cast<int64_t>(row) * kD + 8 * c;
#pragma unroll
      for (int i = 0; i < kQChunks; ++i) {
        if (row >= 0) r.k[t][i] = __ldcg(reinterpret_cast<const uint4*>(src + 32 * i));
        else if (fill) r.k[t][i] = make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int kb = 0; kb < 4; ++kb)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = 16 * kb + 2 * c + (i & 1) + 8 * (i >> 1);  // 2c, 2c+1, 2c+8, 2c+9 of block kb
        const int row = __shfl_sync(0xffffffffu, kb < 2 ? row_lo : row_hi, key & 31);
        if (row >= 0) {
          LoadWords<kVWords>(r.v[kb][i], p.v_cache + static_cast<int64_t>(row) * kD + warp * (kD / 4) + g * kLaneDims);
        } else if (fill) {
#pragma unroll
          for (int w = 0; w < kVWords; ++w) r.v[kb][i][w] = 0u;
        }
      }
  };
  // A whole pass; the step's key only after the wait (when it may be new).
  auto load_pass = [&](Regs& r, int n0) { load_keys(r, n0, n0, kv_end, true); };

  // With p.warm_merge (the cluster build) the loop's first trip runs only the merge, dry (no
  // store, no mark), on whatever the shared memory holds, so that its code is in the instruction
  // cache when the second trip's real merge runs it: one call site, one copy of the code. Off by
  // default (slower); the loop stays: this build of the cluster kernel (255 registers, 60 bytes
  // of spill, against 225 and none without the loop) ran the batch-1 step 0.06 ms faster on an
  // H200. Its SASS does the index arithmetic on the uniform datapath (UIMAD / UMOV / UISETP),
  // 5480 instructions against 5656, and the merge's steps run ~1.2 us faster (notes/
  // decode_sessions.md, Session 12; Tuning().attention_decode_warm_merge).
  for (bool dry = kCluster && p.warm_merge;; dry = false) {
    if (!dry) {
      // The first passes of cached keys, before the wait (p.prefetch); the step's key patched in after.
      Regs r0, r1;
      const bool early = kEarly && p.prefetch && has_query && kv_begin < kv_end;
      const int cached_end = min(kv_end, new_key);
      if constexpr (kEarly) {
        if (early) {
          load_keys(r0, kv_begin, kv_begin, cached_end, true);
          if (num_passes > 1) load_keys(r1, kv_begin + kPassKeys, kv_begin + kPassKeys, cached_end, true);
        }
      }
      LaneRope<kD> rope;
      if constexpr (kPrologue)
        if (has_query) rope = MakeLaneRope<kD>(static_cast<float>(p.prologue.positions[q0]), p.prologue.inv_freq,
                                               p.prologue.attention_factor, lane);

      GridDependencyWait();  // programmatic dependent launch (pdl.cuh): q, this step's key
      tl.Waited();
      if (p.trigger_at == 1) TriggerDependents();
      if constexpr (kOutProj)
        if (p.proj.copy_after_wait) OutProjStage(p.proj, proj_smem);
      if (!has_query) {
        if constexpr (kOutProj) OutProjPhase(p, true, proj_smem);  // counted in all the same
        return;
      }
      if (kv_begin >= kv_end) {  // an empty split: mark its partials empty (the merge skips them)
        // It has no passes, so "after the passes" is now: left to its exit, the trigger would
        // wait for the merge, and the next kernel (o_proj's copies) with it. A split is empty
        // only when the sequence has fewer kChunkAlign tiles than the plan has splits
        // (SplitKeyRange, split_keys.h).
        if (p.trigger_at == 2) TriggerDependents();
        if constexpr (kCluster) {
          for (int r = threadIdx.x; r < p.group; r += kThreads) cl.ml[r] = make_float2(-INFINITY, 0.f);
          ClusterMergeDecode<kD>(p, sm, cl, kvh, q0, tl);
        } else if (p.num_splits > 1) {
          for (int r = threadIdx.x; r < p.group; r += kThreads) {
            const int64_t part = (static_cast<int64_t>(q0) * p.q_heads + kvh * p.group + r) * p.num_splits + split;
            *reinterpret_cast<float2*>(p.part_ml + 2 * part) = make_float2(-INFINITY, 0.f);
          }
          if (p.wide_merge) WideMergeDecode<kD, kRowBlocks>(p, sm, b, kvh, q0, split, tl);
          else if (p.counters != nullptr) ArriveAndMergeDecode<kD, kRowBlocks>(p, sm, b, kvh, q0, tl);
        }
        if constexpr (kOutProj) OutProjPhase(p, true, proj_smem);
        return;
      }
      const bool owns_new_key = new_key >= kv_begin && new_key < kv_end;

      // kPrologue: warp w takes items w, w + 4, ..: the group's q heads (normalised and rotated into
      // shared memory), then, in the split that holds the step's key, its k (normalised, rotated,
      // into the cache) and v (into the cache). Same math as the prologue kernel (NormRopeHead).
      if constexpr (kPrologue) {
        using Vec = BfVec<kD / 32>;
        const DecodePrologue& pro = p.prologue;
        const int e0 = lane * (kD / 32);
        const int slot = pro.slots[q0];
        const bool to_cache = slot >= 0 && slot < pro.num_slots;  // padding tokens have no slot
        const int64_t cache_row =
            to_cache ? ((static_cast<int64_t>(slot / p.block_size) * p.kv_heads + kvh) * p.block_size +
                        slot % p.block_size)
                     : 0;
        bf16_t* q_s = reinterpret_cast<bf16_t*>(sm.q);
        const int items = p.group + (owns_new_key ? 2 : 0);
        for (int j = warp; j < items; j += kWarps) {
          if (j < p.group) {
            const Vec in = *reinterpret_cast<const Vec*>(p.q + static_cast<int64_t>(q0) * p.q_token_stride +
                                                         static_cast<int64_t>(kvh * p.group + j) * p.q_head_stride + e0);
            *reinterpret_cast<Vec*>(q_s + j * kD + e0) = NormRopeHead<kD>(in, pro.q_w, pro.q_w_f32, pro.eps, rope, lane);
          } else if (j == p.group) {
            const Vec in = *reinterpret_cast<const Vec*>(pro.k + static_cast<int64_t>(q0) * pro.k_token_stride +
                                                         static_cast<int64_t>(kvh) * pro.k_head_stride + e0);
            const Vec out = NormRopeHead<kD>(in, pro.k_w, pro.k_w_f32, pro.eps, rope, lane);
            if (to_cache) *reinterpret_cast<Vec*>(p.k_cache + cache_row * kD + e0) = out;
          } else {
            const Vec in = *reinterpret_cast<const Vec*>(pro.v + static_cast<int64_t>(q0) * pro.v_token_stride +
                                                         static_cast<int64_t>(kvh) * pro.v_head_stride + e0);
            if (to_cache) *reinterpret_cast<Vec*>(p.v_cache + cache_row * kD + e0) = in;
          }
        }
        __syncthreads();  // q in shared memory; the step's k / v in the cache for this CTA's loads below
      }
      // The step's key into the passes loaded before the wait.
      if constexpr (kEarly) {
        if (early && owns_new_key) {
          if (new_key < kv_begin + kPassKeys) load_keys(r0, kv_begin, new_key, new_key + 1, false);
          else if (new_key < kv_begin + 2 * kPassKeys) load_keys(r1, kv_begin + kPassKeys, new_key, new_key + 1, false);
        }
      }

      // Q rows g (and g + 8) of the group, 16-byte pieces at dims 32 q + 8 c; zero past the group.
      uint4 qa[kQChunks], qb[kRowBlocks == 2 ? kQChunks : 1];
      if constexpr (kPrologue) {
        const bf16_t* q_s = reinterpret_cast<const bf16_t*>(sm.q) + g * kD + 8 * c;
    #pragma unroll
        for (int i = 0; i < kQChunks; ++i)
          qa[i] = g < p.group ? *reinterpret_cast<const uint4*>(q_s + 32 * i) : make_uint4(0, 0, 0, 0);
        if constexpr (kRowBlocks == 2) {
    #pragma unroll
          for (int i = 0; i < kQChunks; ++i)
            qb[i] = g + 8 < p.group ? *reinterpret_cast<const uint4*>(q_s + 8 * kD + 32 * i) : make_uint4(0, 0, 0, 0);
        }
      } else {
        const bf16_t* qrow = p.q + static_cast<int64_t>(q0) * p.q_token_stride +
                             static_cast<int64_t>(kvh * p.group + g) * p.q_head_stride + 8 * c;
    #pragma unroll
        for (int i = 0; i < kQChunks; ++i)
          qa[i] = g < p.group ? __ldcg(reinterpret_cast<const uint4*>(qrow + 32 * i)) : make_uint4(0, 0, 0, 0);
        if constexpr (kRowBlocks == 2) {
    #pragma unroll
          for (int i = 0; i < kQChunks; ++i)
            qb[i] = g + 8 < p.group ? __ldcg(reinterpret_cast<const uint4*>(qrow + 8 * p.q_head_stride + 32 * i))
                                    : make_uint4(0, 0, 0, 0);
        }
      }

      // Running softmax state of rows g (and g + 8), the same in every warp: max (log2 domain) and
      // this lane's part of the sum (quad-reduced at the end).
      float m_run[kRowBlocks], l_run[kRowBlocks];
      // O^T accumulators: m-tile t (dims w D/4 + g D/32 + 2t, +1), row block rb; C fragment
      // {(dim lo, row 2c), (lo, 2c+1), (lo + 1, 2c), (lo + 1, 2c+1)} (rows + 8 rb).
      float acc[kVWords][kRowBlocks][4];
    #pragma unroll
      for (int rb = 0; rb < kRowBlocks; ++rb) {
        m_run[rb] = -INFINITY;
        l_run[rb] = 0.f;
    #pragma unroll
        for (int t = 0; t < kVWords; ++t) acc[t][rb][0] = acc[t][rb][1] = acc[t][rb][2] = acc[t][rb][3] = 0.f;
      }

      auto compute_pass = [&](const Regs& r, int n0, int buf) {
        // S of this warp's 16 keys: n8 tiles t (keys 16 warp + 8 t ..), k-steps (chunk i, half e).
        float s[2][4];
    #pragma unroll
        for (int t = 0; t < 2; ++t) {
          s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
    #pragma unroll
          for (int i = 0; i < kQChunks; ++i)
    #pragma unroll
            for (int e = 0; e < 2; ++e) {
              const uint32_t a[4] = {Word(qa[i], 2 * e), kRowBlocks == 2 ? Word(qb[kRowBlocks == 2 ? i : 0], 2 * e) : 0u,
                                     Word(qa[i], 2 * e + 1),
                                     kRowBlocks == 2 ? Word(qb[kRowBlocks == 2 ? i : 0], 2 * e + 1) : 0u};
              mma::Mma16816(s[t], a, Word(r.k[t][i], 2 * e), Word(r.k[t][i], 2 * e + 1));
            }
        }
        // Mask keys past kv_end (decode: the one query sees every key of the sequence), scale into
        // the log2 domain, hand to the other warps. Element e: row g + 8 (e / 2), key 2c + e % 2.
    #pragma unroll
        for (int t = 0; t < 2; ++t)
    #pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = n0 + 16 * warp + 8 * t + 2 * c + (e & 1);
            s[t][e] = key < kv_end ? s[t][e] * p.scale_log2 : -INFINITY;
          }
        sm.s[buf][0][warp][lane] = make_float4(s[0][0], s[0][1], s[1][0], s[1][1]);
        if constexpr (kRowBlocks == 2) sm.s[buf][1][warp][lane] = make_float4(s[0][2], s[0][3], s[1][2], s[1][3]);
        __syncthreads();

        // Softmax over the pass's 64 keys of row g (+ 8 rb), in every warp; P as the B fragments of
        // P^T per 16-key block kb: b0 = keys 2c, 2c+1, b1 = keys 2c+8, 2c+9, column (row) g.
        uint32_t pb[kRowBlocks][4][2];
    #pragma unroll
        for (int rb = 0; rb < kRowBlocks; ++rb) {
          float v[4][4];
          float mx = m_run[rb];
    #pragma unroll
          for (int kb = 0; kb < 4; ++kb) {
            const float4 x = sm.s[buf][rb][kb][lane];
            v[kb][0] = x.x, v[kb][1] = x.y, v[kb][2] = x.z, v[kb][3] = x.w;
            mx = fmaxf(mx, fmaxf(fmaxf(x.x, x.y), fmaxf(x.z, x.w)));
          }
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          // A row that has seen no key keeps max -inf; subtract 0 then (p = 0, alpha 0).
          const float base = mx == -INFINITY ? 0.f : mx;
          const float alpha = exp2f(m_run[rb] - base);
          m_run[rb] = mx;
          float sum = 0.f;
    #pragma unroll
          for (int kb = 0; kb < 4; ++kb) {
    #pragma unroll
            for (int j = 0; j < 4; ++j) {
              v[kb][j] = exp2f(v[kb][j] - base);
              sum += v[kb][j];
            }
            pb[rb][kb][0] = mma::PackBf16x2(v[kb][0], v[kb][1]);
            pb[rb][kb][1] = mma::PackBf16x2(v[kb][2], v[kb][3]);
          }
          l_run[rb] = l_run[rb] * alpha + sum;
          // The accumulators hold rows 2c, 2c+1: their alphas sit in lanes 4 (2c) and 4 (2c + 1).
          const float alpha0 = __shfl_sync(0xffffffffu, alpha, 8 * c);
          const float alpha1 = __shfl_sync(0xffffffffu, alpha, 8 * c + 4);
    #pragma unroll
          for (int t = 0; t < kVWords; ++t) {
            acc[t][rb][0] *= alpha0;
            acc[t][rb][1] *= alpha1;
            acc[t][rb][2] *= alpha0;
            acc[t][rb][3] *= alpha1;
          }
        }

        // O^T += V^T P^T per 16-key block and m-tile: a0 = (key 2c, 2c+1) of dim lo, a1 the same of
        // dim lo + 1, a2/a3 keys 2c+8, 2c+9.
    #pragma unroll
        for (int kb = 0; kb < 4; ++kb)
    #pragma unroll
          for (int t = 0; t < kVWords; ++t) {
            const uint32_t w0 = r.v[kb][0][t], w1 = r.v[kb][1][t], w2 = r.v[kb][2][t], w3 = r.v[kb][3][t];
            const uint32_t a[4] = {__byte_perm(w0, w1, 0x5410), __byte_perm(w0, w1, 0x7632), __byte_perm(w2, w3, 0x5410),
                                   __byte_perm(w2, w3, 0x7632)};
    #pragma unroll
            for (int rb = 0; rb < kRowBlocks; ++rb) mma::Mma16816(acc[t][rb], a, pb[rb][kb][0], pb[rb][kb][1]);
          }
      };

      if constexpr (kPrefetch) {
        if (!early) load_pass(r0, kv_begin);
        for (int pass = 0; pass < num_passes; pass += 2) {
          const int n0 = kv_begin + pass * kPassKeys;
          if (pass + 1 < num_passes && !(early && pass == 0)) load_pass(r1, n0 + kPassKeys);
          compute_pass(r0, n0, 0);
          if (pass + 1 < num_passes) {
            if (pass + 2 < num_passes) load_pass(r0, n0 + 2 * kPassKeys);
            compute_pass(r1, n0 + kPassKeys, 1);
          }
        }
      } else {
        for (int pass = 0; pass < num_passes; ++pass) {
          const int n0 = kv_begin + pass * kPassKeys;
          load_pass(r0, n0);
          compute_pass(r0, n0, pass & 1);
        }
      }

      tl.Mark(0);  // every pass multiplied
      if (p.trigger_at == 2) TriggerDependents();  // (empty splits: above; no query: at exit)
      // Rows 2c, 2c+1 (+ 8 rb) of this lane's accumulators: their max and sum from lanes 8c, 8c + 4.
    #pragma unroll
      for (int rb = 0; rb < kRowBlocks; ++rb) {
        float l = l_run[rb];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
    #pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float row_l = __shfl_sync(0xffffffffu, l, 8 * c + 4 * h);
          const float row_m = __shfl_sync(0xffffffffu, m_run[rb], 8 * c + 4 * h);
          const int row = 8 * rb + 2 * c + h;
          if (row >= p.group) continue;
          float f[kLaneDims];
    #pragma unroll
          for (int t = 0; t < kVWords; ++t) {
            f[2 * t] = acc[t][rb][h];
            f[2 * t + 1] = acc[t][rb][2 + h];
          }
          const int dim0 = warp * (kD / 4) + g * kLaneDims;
          const int head = kvh * p.group + row;
          if constexpr (kCluster) {
            StoreF32(cl.o + row * kD + dim0, f);
            if (warp == 0 && g == 0) cl.ml[row] = make_float2(row_m, row_l);
          } else if (p.num_splits > 1) {
            const int64_t part = (static_cast<int64_t>(q0) * p.q_heads + head) * p.num_splits + split;
            StoreF32(p.part_o + part * kD + dim0, f);
            if (warp == 0 && g == 0) *reinterpret_cast<float2*>(p.part_ml + 2 * part) = make_float2(row_m, row_l);
          } else {
            StoreBf16(p.out + static_cast<int64_t>(q0) * p.out_token_stride +
                          static_cast<int64_t>(head) * p.out_head_stride + dim0,
                      f, 1.f / row_l);
          }
        }
      }
    }
    if constexpr (kCluster) {
      ClusterMergeDecode<kD>(p, sm, cl, kvh, q0, tl, dry);
    } else {
      tl.Mark(1);  // partials (or the output) written
      if (p.num_splits > 1 && p.wide_merge) WideMergeDecode<kD, kRowBlocks>(p, sm, b, kvh, q0, split, tl);
      else if (p.num_splits > 1 && p.counters != nullptr) ArriveAndMergeDecode<kD, kRowBlocks>(p, sm, b, kvh, q0, tl);
      tl.Mark(4);  // merged (the last CTA of the KV head; the others right away)
    }
    if (!dry) break;
  }
  if constexpr (kOutProj) OutProjPhase(p, true, proj_smem);
}

std::atomic<int64_t> cluster_launches{0};     // AttentionDecodeClusterLaunches
std::atomic<int64_t> wide_merge_launches{0};  // AttentionDecodeWideMergeLaunches
std::atomic<int64_t> cluster_cuts{0};         // AttentionDecodeClusterCuts

// Launches the decode kernel; with `cluster` (Tuning().attention_decode_cluster_merge_seqs) the splits
// of each (sequence, KV head) as one cluster where the plan and the device allow it. True when
// the cluster build ran (no partials to merge after it).
template <int kD, int kRowBlocks>
bool LaunchDecode(DecodeParams p, bool prologue, bool cluster, int num_seqs, cudaStream_t s) {
  const char* name = prologue ? "AttentionDecode+prologue" : "AttentionDecode";
  if constexpr (kRowBlocks == 1) {
    const auto kernel = prologue ? AttentionDecodeKernel<kD, 1, true, true> : AttentionDecodeKernel<kD, 1, false, true>;
    SetCarveoutOnce(reinterpret_cast<const void*>(kernel), Tuning().attention_decode_carveout);
    if (cluster && p.num_splits > 1 && p.num_splits <= kMaxClusterSplits &&
        ClusterFits(reinterpret_cast<const void*>(kernel), p.num_splits, kThreads, 0)) {
      // One wave (Tuning().attention_decode_one_wave): fewer, longer splits until every (sequence,
      // KV head)'s cluster fits the device at once (the device deals the keys out by num_splits).
      const int64_t pairs = int64_t{p.kv_heads} * num_seqs;
      const int planned = p.num_splits;
      while (Tuning().attention_decode_one_wave && p.num_splits > 2 &&
             ClusterCapacity(reinterpret_cast<const void*>(kernel), p.num_splits, kThreads, 0) <
                 pairs)
        --p.num_splits;
      if (p.num_splits != planned) cluster_cuts.fetch_add(1, std::memory_order_relaxed);
      const dim3 grid(p.num_splits, p.kv_heads, num_seqs);
      p.timeline = TimelineRecord(name, int64_t{grid.x} * grid.y * grid.z, s);
      LaunchPdl(kernel, grid, dim3(kThreads), 0, s, p.num_splits, p);
      cluster_launches.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
  }
  const auto kernel =
      prologue ? AttentionDecodeKernel<kD, kRowBlocks, true> : AttentionDecodeKernel<kD, kRowBlocks, false>;
  const dim3 grid(p.num_splits, p.kv_heads, num_seqs);
  p.timeline = TimelineRecord(name, int64_t{grid.x} * grid.y * grid.z, s);
  if (p.trigger_at == 2) p.trigger_at = 1;  // (after the passes: the cluster merge only, Tuning())
  SetCarveoutOnce(reinterpret_cast<const void*>(kernel), Tuning().attention_decode_carveout);
  if (p.wide_merge) {  // its splits wait for each other: every CTA must be resident at once
    p.wide_merge = ResidentCtas(reinterpret_cast<const void*>(kernel), kThreads, 0) >=
                   int64_t{grid.x} * grid.y * grid.z;
    if (p.wide_merge) wide_merge_launches.fetch_add(1, std::memory_order_relaxed);
  }
  LaunchPdl(kernel, grid, dim3(kThreads), 0, s, 1, p);
  return false;
}

std::atomic<int64_t> region_launches{0};  // AttentionRegionLaunches

// The attention with the o projection folded in (kOutProj, one sequence; the splits merged as a
// cluster or, with `cluster` off, by the merge counters, which must then exist): grid (splits, Y)
// with Y >= kv_heads rows of CTAs; false (nothing launched) where no Y lets the rows fit shared
// memory with every CTA resident at once (the projecting CTAs wait for the attention's: all must
// be placed together).
template <int kD>
bool LaunchDecodeOutProj(DecodeParams p, bool cluster, cudaStream_t s) {
  const auto kernel =
      cluster ? AttentionDecodeKernel<kD, 1, true, true, true> : AttentionDecodeKernel<kD, 1, true, false, true>;
  const int splits = p.num_splits;
  if (cluster ? splits < 2 || splits > kMaxClusterSplits : splits > 1 && p.counters == nullptr) return false;
  int device = 0, sms = 0, max_smem = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  cudaFuncAttributes attrs{};
  COROLLA_CUDA_CHECK(cudaFuncGetAttributes(&attrs, reinterpret_cast<const void*>(kernel)));
  OptInSharedMemoryOnce(reinterpret_cast<const void*>(kernel));
  // (At the driver's carveout for ~150 KB, 164 KB, the norm-router's CTAs cannot wait beside
  // these: Tuning().attention_decode_carveout 100 lets them.) Set before the occupancy queries.
  SetCarveoutOnce(reinterpret_cast<const void*>(kernel), Tuning().attention_decode_carveout);
  // As many rows of clusters as the SMs hold one CTA an SM, fewer (more rows of w a CTA) where the
  // device cannot hold that many clusters at once, never fewer than the attention's.
  int rows_y = std::max(p.kv_heads, sms / splits);
  size_t smem = 0;
  for (;; --rows_y) {
    p.proj.rows_per_cta = static_cast<int>(CeilDiv(p.proj.n, int64_t{splits} * rows_y));
    smem = kOutProjHeader + static_cast<size_t>(p.proj.x_bytes) +
           static_cast<size_t>(p.proj.rows_per_cta) * p.proj.k * 2;
    bool fits = smem + attrs.sharedSizeBytes <= static_cast<size_t>(max_smem);
    if (fits && cluster) {
      fits = ClusterCapacity(reinterpret_cast<const void*>(kernel), splits, kThreads, smem) >= rows_y;
    } else if (fits) {
      fits = ResidentCtas(reinterpret_cast<const void*>(kernel), kThreads, smem) >= int64_t{splits} * rows_y;
    }
    if (fits) break;
    if (rows_y == p.kv_heads) return false;
  }
  const int ctas = splits * rows_y;
  p.proj.attention_ctas = splits * p.kv_heads;
  p.timeline = TimelineRecord("AttentionRegion", ctas, s);
  LaunchPdl(kernel, dim3(splits, rows_y, 1), dim3(kThreads), smem, s, cluster ? splits : 1, p);
  if (cluster) cluster_launches.fetch_add(1, std::memory_order_relaxed);
  region_launches.fetch_add(1, std::memory_order_relaxed);
  return true;
}

}  // namespace

int64_t AttentionDecodeClusterLaunches() { return cluster_launches.load(std::memory_order_relaxed); }
int64_t AttentionDecodeWideMergeLaunches() { return wide_merge_launches.load(std::memory_order_relaxed); }
int64_t AttentionDecodeClusterCuts() { return cluster_cuts.load(std::memory_order_relaxed); }
int64_t AttentionRegionLaunches() { return region_launches.load(std::memory_order_relaxed); }

bool AttentionDecodeServes(const TensorView& q, const KvCacheView& cache, int max_q_len) {
  const int64_t d = q.dim(2), hk = cache.k.dim(1);
  const int64_t rows = cache.k.dim(0) * hk * cache.k.dim(2);  // cache rows, addressed as int32
  return Tuning().attention_decode_kernel && max_q_len == 1 && cache.k.data != cache.v.data &&
         cache.v.dim(3) == d && (d == 64 || d == 128 || d == 256) && q.dim(1) % hk == 0 &&
         q.dim(1) / hk <= kMaxGroup && rows < (int64_t{1} << 31);
}

// Whether WideMergeDecode may run for this plan (LaunchDecode then checks that the grid fits the
// device at once): Tuning().attention_decode_wide_merge, the counters, a split's share of the
// items within the CTA's threads and its loads, its rows' (m, l) within the shared rows.
bool WideMergeFits(int splits, int group, int d, int64_t pairs, bool counters) {
  if (!Tuning().attention_decode_wide_merge || !counters || splits < 2 || pairs > kWideDepartures) return false;
  const int items = group * (d / 4), per = (items + splits - 1) / splits;
  if (per > kThreads) return false;
  const int threads = kThreads / per, rows = per / (d / 4) + 2;
  return (splits + threads - 1) / threads <= kWideLoads && rows * splits <= kMaxMergeRows;
}

bool DecodeSplitsCappedToCluster(const AttentionBatch& batch) {
  const int max_keys = Tuning().attention_decode_cluster_max_keys;
  return batch.seq_lens.numel() <= Tuning().attention_decode_cluster_merge_seqs && max_keys > 0 &&
         batch.max_seq_len <= max_keys;
}

// Declared in attention.cu (its only caller), which has checked the tensors (q/out [T, Hq, D]
// with 16-byte aligned rows, contiguous 16-byte aligned caches) and AttentionDecodeServes.
bool AttentionDecode(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch, float scale_log2,
                     const TensorView& out, CachingAllocator& alloc, cudaStream_t s, const DecodePrologue* prologue,
                     const TensorView* proj_w, const TensorView* proj_out) {
  const int d = static_cast<int>(q.dim(2)), kv_heads = static_cast<int>(cache.k.dim(1));
  const int group = static_cast<int>(q.dim(1)) / kv_heads;
  const int num_seqs = static_cast<int>(batch.seq_lens.numel());
  // Split-KV from host hints (max_seq_len may be an upper bound, as under graph replay): splits
  // for Tuning().attention_split_min_ctas CTAs (at most that many with attention_decode_one_wave,
  // else at least), each at least attention_decode_split_keys keys of max_seq_len, and no more
  // partials than the merging CTA may read (attention_decode_merge_floats, kMaxMergeRows); at
  // most a cluster's where DecodeSplitsCappedToCluster.
  const int64_t pairs = static_cast<int64_t>(num_seqs) * kv_heads;
  const int min_keys =
      std::max(kChunkAlign, (Tuning().attention_decode_split_keys + kChunkAlign - 1) / kChunkAlign * kChunkAlign);
  const int merge_cap = std::min(Tuning().attention_decode_merge_floats / (group * d), kMaxMergeRows / group);
  int max_splits = std::max(1, merge_cap);
  if (DecodeSplitsCappedToCluster(batch)) max_splits = std::min(max_splits, kMaxClusterSplits);
  // Splits for `target` CTAs (Tuning().attention_decode_one_wave: at most that many).
  auto plan = [&](int target) {
    if (batch.max_seq_len <= min_keys || target <= 0 || pairs >= target || max_splits <= 1)
      return 1;
    const int64_t by_ctas = Tuning().attention_decode_one_wave
                                ? std::max<int64_t>(1, target / pairs)
                                : CeilDiv(target, pairs);
    const int64_t want =
        std::min<int64_t>({by_ctas, CeilDiv(batch.max_seq_len, min_keys), max_splits});
    const int64_t chunk = CeilDiv(CeilDiv(batch.max_seq_len, want), kChunkAlign) * kChunkAlign;
    return static_cast<int>(CeilDiv(batch.max_seq_len, chunk));
  };
  int num_splits = plan(Tuning().attention_split_min_ctas);
  // A batch whose splits merge as clusters plans for attention_decode_cluster_min_ctas CTAs where
  // that leaves 2-15 splits (a full cluster of 16 in place of a wide merge lost: on an H100 batch
  // 2 at 8192 keys 5.050-5.067 ms a step against 4.973-4.977 with the wide merge's 33 splits).
  if (num_seqs <= Tuning().attention_decode_cluster_merge_seqs && group <= 8) {
    const int fewer = plan(Tuning().attention_decode_cluster_min_ctas);
    if (fewer >= 2 && fewer < kMaxClusterSplits) num_splits = std::min(num_splits, fewer);
  }
  const int64_t merge_rows = q.dim(0) * q.dim(1);
  ScratchBuffer partials(alloc, num_splits > 1 ? merge_rows * num_splits * (d + 2) * sizeof(float) : 0);
  float* part_o = num_splits > 1 ? partials.as<float>() : nullptr;
  float* part_ml = num_splits > 1 ? part_o + merge_rows * num_splits * d : nullptr;
  int* counters = nullptr;
  if (num_splits > 1 && Tuning().attention_fused_merge && pairs <= kMaxSplitKvMergeCounters)
    counters = SplitKvMergeCounters(s);
  const DecodeParams p{q.ptr<bf16_t>(),
                       q.strides[0],
                       q.strides[1],
                       out.ptr<bf16_t>(),
                       out.strides[0],
                       out.strides[1],
                       cache.k.ptr<bf16_t>(),
                       cache.v.ptr<bf16_t>(),
                       batch.block_tables.ptr<int32_t>(),
                       batch.block_tables.rank() == 2 ? batch.block_tables.dim(1) : 0,
                       batch.query_start.ptr<int32_t>(),
                       batch.seq_lens.ptr<int32_t>(),
                       kv_heads,
                       group,
                       static_cast<int>(q.dim(1)),
                       cache.block_size(),
                       BlockShift(cache.block_size()),
                       scale_log2,
                       num_splits,
                       part_o,
                       part_ml,
                       counters,
                       Tuning().attention_decode_trigger == 0 && !Tuning().pdl_early_trigger
                           ? 1
                           : Tuning().attention_decode_trigger,
                       WideMergeFits(num_splits, group, d, pairs, counters != nullptr),
                       Tuning().attention_decode_prefetch,
                       Tuning().attention_decode_warm_merge,
                       Tuning().attention_decode_relaxed_exit,
                       prologue ? *prologue : DecodePrologue{},
                       DecodeOutProj{}};
  const bool fused = prologue != nullptr, cluster = num_seqs <= Tuning().attention_decode_cluster_merge_seqs;
  const bool wide = group > 8;
  // The o projection folded in: one token, its heads contiguous; w [n, q_heads D] and the
  // projection [1, n], bf16, contiguous, 16-byte aligned.
  const int64_t proj_k = q.dim(1) * d;
  if (proj_w != nullptr && fused && !wide && num_seqs == 1 && q.dim(0) == 1 && out.strides[1] == d &&
      out.strides[2] == 1 && proj_w->dtype == DType::kBF16 && proj_w->rank() == 2 && proj_w->dim(1) == proj_k &&
      proj_w->is_contiguous() && proj_out->dtype == DType::kBF16 && proj_out->numel() == proj_w->dim(0) &&
      proj_out->is_contiguous() && reinterpret_cast<uintptr_t>(proj_w->data) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out.data) % 16 == 0 && proj_w->dim(0) < (int64_t{1} << 30)) {
    auto* counters =
        static_cast<unsigned*>(StreamScratch(s, StreamScratchSlot::kAttentionRegion, 2 * sizeof(unsigned)));
    if (counters != nullptr) {
      DecodeParams pp = p;
      pp.wide_merge = false;  // (its own residency rule)
      pp.proj = DecodeOutProj{proj_w->ptr<bf16_t>(), proj_out->ptr<bf16_t>(), static_cast<int>(proj_w->dim(0)),
                              static_cast<int>(proj_k), 0, static_cast<int>((2 * proj_k + 127) / 128 * 128), 0,
                              counters, Tuning().attention_region_late_copy};
      const bool by_cluster = cluster && num_splits > 1 && num_splits <= kMaxClusterSplits;
      const bool projected = d == 64    ? LaunchDecodeOutProj<64>(pp, by_cluster, s)
                             : d == 128 ? LaunchDecodeOutProj<128>(pp, by_cluster, s)
                                        : LaunchDecodeOutProj<256>(pp, by_cluster, s);
      if (projected) return true;
    }
  }
  if (proj_w != nullptr) return false;  // the folded kernel or nothing
  bool clustered = false;
  switch (d) {
    case 64:
      clustered = wide ? LaunchDecode<64, 2>(p, fused, cluster, num_seqs, s)
                       : LaunchDecode<64, 1>(p, fused, cluster, num_seqs, s);
      break;
    case 128:
      clustered = wide ? LaunchDecode<128, 2>(p, fused, cluster, num_seqs, s)
                       : LaunchDecode<128, 1>(p, fused, cluster, num_seqs, s);
      break;
    case 256:
      clustered = wide ? LaunchDecode<256, 2>(p, fused, cluster, num_seqs, s)
                       : LaunchDecode<256, 1>(p, fused, cluster, num_seqs, s);
      break;
    default: COROLLA_CHECK(false) << "attention decode: no D " << d << " kernel";
  }
  if (num_splits > 1 && counters == nullptr && !clustered) {
    const SplitMergeParams mp{part_o, part_ml, out.ptr<bf16_t>(), out.strides[0], out.strides[1], merge_rows,
                              static_cast<int>(q.dim(1)), num_splits};
    if (d == 64) LaunchSplitKvMerge<64>(mp, s);
    else if (d == 128) LaunchSplitKvMerge<128>(mp, s);
    else LaunchSplitKvMerge<256>(mp, s);
  }
  return false;
}

}  // namespace corolla::cuda
