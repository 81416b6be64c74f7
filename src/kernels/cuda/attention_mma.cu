// Tensor-core causal GQA attention (FlashAttention-2 style) over the paged, heads-major KV cache
// ([num_blocks, Hk, block_size, D]) with separate K and V tensors, Dv <= Dk (DeepSeek's
// decompressed MLA prefill: 192 / 128; else Dk == Dv). attention.cu owns
// the host entry: it validates, plans (rows per CTA, number of KV splits), allocates the split
// partials and merges them; this file runs one plan. Semantics and query rows are the SIMT
// kernel's: row r of a sequence is (token r / group, head kvh * group + r % group), so one K/V
// tile in shared memory serves every query head of its group (decode at group 8: 8 rows of one
// token), and a tile's rows may mix tokens, each masked at its own position.
//
// CTA = (row tile, split) x kv head x sequence. K/V tiles of kBlockN keys stream through shared
// memory, double-buffered with cp.async (zero-filled past the CTA's keys); S = Q K^T and
// O += P V run on mma.sync m16n8k16 (bf16 in, f32 accumulate) with ldmatrix fragments; the
// online softmax is f32 in the log2 domain. Two CTA shapes (MmaTiles): prefill, 4 warps down
// the rows (64 rows); decode, one 16-row tile whose keys the warps share out, their softmax
// states merged through shared memory at the end. Split-KV: each CTA derives its key range from
// its own sequence's device-side length, so one plan serves any lengths under its hints
// (CUDA-graph replay).
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/split_kv_merge.cuh"
#include "kernels/cuda/stream_scratch.h"

namespace corolla::cuda {
namespace {

struct MmaParams {
  const bf16_t* q;
  int64_t q_token_stride, q_head_stride;
  bf16_t* out;
  int64_t out_token_stride, out_head_stride;
  const bf16_t* k_cache;  // [num_blocks, Hk, block_size, D]
  const bf16_t* v_cache;
  const int32_t* block_tables;  // [B, table_stride]
  int64_t table_stride;
  const int32_t* query_start;  // [B + 1]
  const int32_t* seq_lens;     // [B]
  int kv_heads, group, q_heads, block_size;
  int block_shift;   // log2(block_size) when it is a power of two (shift/mask addressing), else -1
  float scale_log2;  // softmax scale * log2(e)
  // blockIdx.x = row tile + row_tiles * split. num_splits 1: the CTA normalises and writes out;
  // else split s takes the keys SplitKeyRange (split_keys.h) deals it in kBlockN tiles,
  // and writes unnormalised partials for SplitKvMergeKernel (split_kv_merge.cuh).
  int row_tiles, num_splits;
  float* part_o;   // [T * Hq, num_splits, Dv]
  float* part_ml;  // [T * Hq, num_splits, 2]: running max (log2 domain) and sum
  // Fused merge (null: SplitKvMergeKernel runs after): [B, Hk, row_tiles] arrival counters,
  // zero between launches; the last split of a (sequence, KV head, row tile) to arrive merges.
  int* counters;
};

// One CTA shape. kWarpsM warps stack 16-row slices of the tile; kWarpsN warps split each K/V
// tile's keys between them (each with its own softmax state, merged at the end).
template <int kDk_, int kDv_, int kWarpsM_, int kWarpsN_, int kBlockN_>
struct MmaConfig {
  static constexpr int kDk = kDk_, kDv = kDv_, kWarpsM = kWarpsM_, kWarpsN = kWarpsN_,
                       kBlockN = kBlockN_;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
  static constexpr int kBlockM = 16 * kWarpsM;         // query rows per CTA
  static constexpr int kWarpKeys = kBlockN / kWarpsN;  // keys of a tile that one warp scores
  static constexpr int kKeyTiles = kWarpKeys / 8;      // n8 tiles of S per warp
  static constexpr int kDimTiles = kDv / 8;            // n8 tiles of O per warp
  static constexpr int kChunksK = kDk / 8, kChunksV = kDv / 8;  // 16-byte pieces of a row
  // Shared rows padded by 16 bytes: the 8 rows one ldmatrix phase reads (16 bytes each) then
  // start 4 banks apart and cover all 32 banks; cp.async destinations stay 16-byte aligned.
  static constexpr int kStrideK = kDk + 8, kStrideV = kDv + 8;  // Q and K rows; V rows
  static constexpr int kOStride = kDv + 8;  // f32 rows of the cross-warp merge (same reasoning)
  // Q tile, then 2 stages of (K tile, V tile).
  static constexpr size_t kPipeBytes =
      sizeof(bf16_t) * ((kBlockM + 2 * kBlockN) * kStrideK + 2 * kBlockN * kStrideV);
  static constexpr size_t kMergeBytes = kWarpsN > 1 ? sizeof(float) * kWarpsN * kBlockM * (kOStride + 2) : 0;
  static constexpr size_t kSmemBytes = kPipeBytes > kMergeBytes ? kPipeBytes : kMergeBytes;
  static_assert(kWarpKeys % 16 == 0 && kDk % 16 == 0 && kDv % 16 == 0,
                "P V steps over 16 keys and 16 dims, S over 16 dims");
  static_assert((kBlockN * kChunksK) % kThreads == 0 && (kBlockN * kChunksV) % kThreads == 0,
                "whole K/V load passes");
};

// The tile shapes per head dims (the table of which dims exist is in attention.cu).
// Prefill: 64 rows x 64 keys (32 keys at Dk 256, where a stage is 32 KB).
// Decode: 16 rows; 4 warps x 16 keys of a 64-key tile (2 x 16 of 32 at Dk 256).
template <int kDk, int kDv>
struct MmaTiles {
  static constexpr int kPrefillKeys = kDk == 256 ? 32 : 64;
  using Prefill = MmaConfig<kDk, kDv, 4, 1, kPrefillKeys>;
  using Decode = MmaConfig<kDk, kDv, 1, kDk == 256 ? 2 : 4, kDk == 256 ? 32 : 64>;
};

// ---- PTX wrappers --------------------------------------------------------------------------
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// 16 bytes global -> shared, bypassing L1; zero-filled (nothing read) when !valid.
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i, and r[i] of lane l
// holds row l / 4, columns 2 (l % 4), +1 of matrix i (.trans: column l / 4, rows 2 (l % 4), +1).
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const bf16_t* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
// d += a b: a 16x16 row-major, b 16x8 col-major, d 16x8 f32. With g = lane / 4, c = lane % 4:
// a = {(g, 2c..+1), (g+8, 2c..+1), (g, 2c+8..+9), (g+8, 2c+8..+9)}, b = {(k 2c..+1, n g),
// (k 2c+8..+9, n g)}, d = {(g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1)}.
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats as one bf16x2 register, the first in the low half (the lower column of a fragment).
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}

// Flat (token, head) index of query row `row` of the CTA's sequence; the split partials and the
// merge index rows this way.
__device__ __forceinline__ int64_t GlobalRow(const MmaParams& p, int q0, int kvh, int row) {
  return static_cast<int64_t>(q0 + row / p.group) * p.q_heads + kvh * p.group + row % p.group;
}

// Split-KV with the fused merge, called by every thread of the CTA once its partials (or its
// empty-split marks) are written: the CTA counts itself in, and the last of the num_splits CTAs
// of its (sequence b, KV head, row tile) merges the splits of the tile's rows [row0, row_end)
// into out as SplitKvMergeKernel does, then re-arms the counter for the next launch. Uses the
// dynamic shared memory (the pipeline is drained) for the rows' (m, l) of every split.
template <class C>
__device__ void ArriveAndMerge(const MmaParams& p, int b, int kvh, int tile, int q0, int row0, int row_end) {
  constexpr int kD = C::kDv, kThreads = C::kThreads;  // the rows merged are O's
  extern __shared__ __align__(16) unsigned char mma_smem[];
  __shared__ int s_last;
  __threadfence();  // this thread's partials are visible device-wide before the CTA counts itself in
  __syncthreads();
  if (threadIdx.x == 0) {
    int* counter = p.counters + (static_cast<int64_t>(b) * p.kv_heads + kvh) * p.row_tiles + tile;
    const bool last = atomicAdd(counter, 1) == p.num_splits - 1;
    if (last) atomicExch(counter, 0);  // every other split has arrived: nobody else touches it now
    s_last = last;
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();  // the other splits' partials are read after their arrivals
  const int splits = p.num_splits, rows = row_end - row0;
  float2* sml = reinterpret_cast<float2*>(mma_smem);  // [rows][splits] (m, l); fits (host-checked)
  for (int idx = threadIdx.x; idx < rows * splits; idx += kThreads) {
    const int r = idx / splits, sp = idx % splits;
    const int64_t part = GlobalRow(p, q0, kvh, row0 + r) * splits + sp;
    sml[idx] = __ldcg(reinterpret_cast<const float2*>(p.part_ml) + part);  // L2: other SMs wrote it
  }
  __syncthreads();
  // Thread per (row, 4 dims). The partial rows of kBatch splits are loaded together before any
  // is used (an empty split's o is read too, and weighted out by a select): one round trip to L2
  // per kBatch splits (8: at 16 the 64-row D128 tile spilled).
  constexpr int kBatch = 8;
  for (int idx = threadIdx.x; idx < rows * (kD / 4); idx += kThreads) {
    const int r = idx / (kD / 4), c4 = idx % (kD / 4);
    const float2* ml = sml + r * splits;
    float mx = -INFINITY;
    for (int sp = 0; sp < splits; ++sp) mx = fmaxf(mx, ml[sp].x);
    const int64_t grow = GlobalRow(p, q0, kvh, row0 + r);
    const float4* o = reinterpret_cast<const float4*>(p.part_o + grow * splits * kD) + c4;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float sum = 0.f;
    for (int s0 = 0; s0 < splits; s0 += kBatch) {
      float4 ov[kBatch];
#pragma unroll
      for (int i = 0; i < kBatch; ++i)
        if (s0 + i < splits) ov[i] = __ldcg(o + (s0 + i) * (kD / 4));
#pragma unroll
      for (int i = 0; i < kBatch; ++i) {
        if (s0 + i >= splits) break;
        const float2 msp = ml[s0 + i];
        const bool seen = msp.x != -INFINITY;
        const float wt = seen ? exp2f(msp.x - mx) : 0.f;
        sum += seen ? wt * msp.y : 0.f;
        AddWeighted(acc, wt, seen, ov[i]);
      }
    }
    const int row = row0 + r;
    const float inv = 1.f / sum;
    __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(
        p.out + (q0 + row / p.group) * p.out_token_stride + (kvh * p.group + row % p.group) * p.out_head_stride + 4 * c4);
    dst[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
    dst[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  }
}

template <class C>
__global__ void __launch_bounds__(C::kThreads) AttentionMmaKernel(const __grid_constant__ MmaParams p) {
  constexpr int kDk = C::kDk, kDv = C::kDv, kBlockM = C::kBlockM, kBlockN = C::kBlockN;
  constexpr int kStrideK = C::kStrideK, kStrideV = C::kStrideV;
  constexpr int kThreads = C::kThreads, kChunksK = C::kChunksK, kChunksV = C::kChunksV;
  extern __shared__ __align__(16) unsigned char mma_smem[];
  bf16_t* sQ = reinterpret_cast<bf16_t*>(mma_smem);  // [kBlockM][kStrideK]
  bf16_t* sK = sQ + kBlockM * kStrideK;              // [2][kBlockN][kStrideK]
  bf16_t* sV = sK + 2 * kBlockN * kStrideK;          // [2][kBlockN][kStrideV]

  GridDependencyWait();  // launched with programmatic dependent launch (pdl.cuh): q and the cache
  TriggerDependents();
  const int b = blockIdx.z, kvh = blockIdx.y;
  const int split = blockIdx.x / p.row_tiles;
  // Latest rows first: under causality they see the most keys, so the long CTAs start early.
  const int tile = p.row_tiles - 1 - static_cast<int>(blockIdx.x % p.row_tiles);
  const int row0 = tile * kBlockM;
  const int q0 = p.query_start[b];
  const int q_len = p.query_start[b + 1] - q0;
  const int rows_total = q_len * p.group;
  if (row0 >= rows_total) return;
  const int seq_len = p.seq_lens[b];
  const int prefix = seq_len - q_len;
  const int visible_end = prefix + (min(row0 + kBlockM, rows_total) - 1) / p.group + 1;
  const KeyRange keys = SplitKeyRange(seq_len, p.num_splits, split, kBlockN, visible_end);
  const int kv_begin = keys.begin, kv_end = keys.end;
  const int tid = threadIdx.x;
  if (kv_begin >= kv_end) {  // an empty split: mark its partials empty (the merge skips them)
    for (int r = tid; p.num_splits > 1 && r < kBlockM && row0 + r < rows_total; r += kThreads) {
      const int64_t part = GlobalRow(p, q0, kvh, row0 + r) * p.num_splits + split;
      p.part_ml[2 * part] = -INFINITY;
      p.part_ml[2 * part + 1] = 0.f;
    }
    if (p.counters != nullptr) ArriveAndMerge<C>(p, b, kvh, tile, q0, row0, min(row0 + kBlockM, rows_total));
    return;
  }
  const int warp = tid / 32, lane = tid % 32;
  const int warp_m = warp % C::kWarpsM, warp_n = warp / C::kWarpsM;
  const int32_t* table = p.block_tables + b * p.table_stride;

  // Q tile -> shared, rows past the sequence's zero-filled.
  for (int idx = tid; idx < kBlockM * kChunksK; idx += kThreads) {
    const int r = idx / kChunksK, c = idx % kChunksK;
    const int row = row0 + r;
    const bool valid = row < rows_total;
    const bf16_t* src = p.q;
    if (valid)
      src += (q0 + row / p.group) * p.q_token_stride + (kvh * p.group + row % p.group) * p.q_head_stride + c * 8;
    CpAsync16(sQ + r * kStrideK + c * 8, src, valid);
  }
  // K/V keys [n0, n0 + kBlockN) -> stage; keys at or past kv_end zero-filled (masked in S; zero
  // V rows keep 0 * V finite). A block's keys are contiguous, any block_size.
  // Dk == Dv: K and V of a chunk share one pass and one offset; else K rows (Dk wide) and V rows
  // (Dv) take a pass each. One pass for both keeps the square configs' registers (two passes
  // cost the 128 / 128 prefill 35 more).
  auto load_rows = [&](int n0, bf16_t* dst, bf16_t* dst_v, const bf16_t* cache, auto chunks_tag,
                       int stride) {
    constexpr int kRowChunks = decltype(chunks_tag)::value;
    constexpr bool kBoth = kDk == kDv;  // dst_v: V's rows of the same key and chunk
#pragma unroll
    for (int i = 0; i < kBlockN * kRowChunks / kThreads; ++i) {
      const int idx = tid + i * kThreads, j = idx / kRowChunks, c = idx % kRowChunks;
      const int key = n0 + j;
      const bool valid = key < kv_end;
      int64_t offset = 0;
      if (valid) {
        const PagedSlot slot = LocateKey(table, key, p.block_size, p.block_shift);
        offset =
            ((slot.block * p.kv_heads + kvh) * p.block_size + slot.in_block) * (kRowChunks * 8) +
            c * 8;
      }
      CpAsync16(dst + j * stride + c * 8, cache + offset, valid);
      if constexpr (kBoth) CpAsync16(dst_v + j * stride + c * 8, p.v_cache + offset, valid);
    }
  };
  auto load_tile = [&](int n0, int stage) {
    bf16_t* k_dst = sK + stage * kBlockN * kStrideK;
    bf16_t* v_dst = sV + stage * kBlockN * kStrideV;
    if constexpr (kDk == kDv) {
      load_rows(n0, k_dst, v_dst, p.k_cache, std::integral_constant<int, kChunksK>{}, kStrideK);
    } else {
      load_rows(n0, k_dst, nullptr, p.k_cache, std::integral_constant<int, kChunksK>{}, kStrideK);
      load_rows(n0, v_dst, nullptr, p.v_cache, std::integral_constant<int, kChunksV>{}, kStrideV);
    }
  };

  // This thread's two rows of the warp's 16 (C-fragment rows g and g + 8): key limit (exclusive)
  // = min(own position + 1, kv_end); 0 for rows past the sequence's (they are never written).
  const int warp_row0 = row0 + warp_m * 16;
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = warp_row0 + lane / 4 + 8 * h;
    limit[h] = row < rows_total ? min(prefix + row / p.group + 1, kv_end) : 0;
  }
  // Keys below this are visible to every valid row of the warp: tiles wholly below skip masking.
  const int warp_limit = min(prefix + warp_row0 / p.group + 1, kv_end);

  float o[C::kDimTiles][4];  // O, C fragments of dims 8 dt .. 8 dt + 7
#pragma unroll
  for (int dt = 0; dt < C::kDimTiles; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of rows g, g + 8 (log2 domain)
  float l[2] = {0.f, 0.f};              // this thread's part of the running sums (quad-reduced at the end)

  const int num_tiles = (kv_end - kv_begin + kBlockN - 1) / kBlockN;
  load_tile(kv_begin, 0);
  CpAsyncCommit();  // group 0: Q and the first tile
  for (int t = 0; t < num_tiles; ++t) {
    const int n0 = kv_begin + t * kBlockN, stage = t & 1;
    if (t + 1 < num_tiles) {
      load_tile(n0 + kBlockN, stage ^ 1);
      CpAsyncCommit();
      CpAsyncWait<1>();
    } else {
      CpAsyncWait<0>();
    }
    __syncthreads();  // this stage (and Q) visible to every warp

    const int key0 = n0 + warp_n * C::kWarpKeys;  // this warp's keys: [key0, key0 + kWarpKeys)
    const bf16_t* k_tile = sK + (stage * kBlockN + warp_n * C::kWarpKeys) * kStrideK;
    const bf16_t* v_tile = sV + (stage * kBlockN + warp_n * C::kWarpKeys) * kStrideV;

    // S = Q K^T over 16-dim steps. A (Q rows, row-major): matrices (rows 0-7 | 8-15) x (dims
    // 0-7 | 8-15) in a0..a3 order, so lane l addresses row l % 16, dims 8 (l / 16).
    // B (K^T, "col" = K rows as stored): b0 of key tile n = K[8n + g][2c..], i.e. a plain
    // ldmatrix of keys 8n..8n+7 x dims 0-7; b1 the same at dims 8-15. One x4 covers two key
    // tiles: matrices (keys +0, dims +0), (keys +0, dims +8), (keys +8, dims +0), (keys +8,
    // dims +8), so lane l addresses key 8 (l / 16) + l % 8, dims 8 ((l / 8) % 2).
    float s[C::kKeyTiles][4];
#pragma unroll
    for (int nt = 0; nt < C::kKeyTiles; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < kDk / 16; ++ks) {
      uint32_t a[4];
      LdMatrixX4(a, sQ + (warp_m * 16 + lane % 16) * kStrideK + ks * 16 + (lane / 16) * 8);
#pragma unroll
      for (int np = 0; np < C::kKeyTiles / 2; ++np) {
        uint32_t bk[4];
        LdMatrixX4(bk, k_tile + (np * 16 + (lane / 16) * 8 + lane % 8) * kStrideK + ks * 16 +
                           ((lane / 8) % 2) * 8);
        Mma16816(s[2 * np], a, bk[0], bk[1]);
        Mma16816(s[2 * np + 1], a, bk[2], bk[3]);
      }
    }

    // Mask (causal per row, and the CTA's key range), scale into the log2 domain. Element e of
    // key tile nt is row g + 8 (e / 2), key key0 + 8 nt + 2c + e % 2.
    const bool need_mask = key0 + C::kWarpKeys > warp_limit;
#pragma unroll
    for (int nt = 0; nt < C::kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + nt * 8 + 2 * (lane % 4) + (e & 1);
        s[nt][e] = need_mask && key >= limit[e / 2] ? -INFINITY : s[nt][e] * p.scale_log2;
      }
    // Online softmax: a row's 16 keys per tile sit in the 4 lanes of a quad.
    float alpha[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m[h];
#pragma unroll
      for (int nt = 0; nt < C::kKeyTiles; ++nt) mx = fmaxf(mx, fmaxf(s[nt][2 * h], s[nt][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row that has seen no key yet keeps max -inf; subtract 0 then (p = 2^-inf = 0, alpha 0).
      const float base = mx == -INFINITY ? 0.f : mx;
      alpha[h] = exp2f(m[h] - base);
      m[h] = mx;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < C::kKeyTiles; ++nt) {
        s[nt][2 * h] = exp2f(s[nt][2 * h] - base);
        s[nt][2 * h + 1] = exp2f(s[nt][2 * h + 1] - base);
        sum += s[nt][2 * h] + s[nt][2 * h + 1];
      }
      l[h] = l[h] * alpha[h] + sum;
    }
#pragma unroll
    for (int dt = 0; dt < C::kDimTiles; ++dt) {
      o[dt][0] *= alpha[0];
      o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1];
      o[dt][3] *= alpha[1];
    }

    // O += P V over 16-key steps. A = P from registers: the C fragments of key tiles 2kk and
    // 2kk + 1 hold (g, 2c..+1), (g+8, 2c..+1) of keys 16kk..+7 and 16kk+8..+15, exactly the
    // a0/a1 and a2/a3 of the A fragment of those 16 keys. B = V (k = key, n = dim), stored
    // key-major, so ldmatrix.trans: b0 of dim tile n = V[keys 2c..+1][dim 8n + g] is the
    // transposed 8x8 of keys 0-7 x dims 8n..; b1 the same at keys 8-15. One x4: matrices (keys
    // +0, dims +0), (keys +8, dims +0), (keys +0, dims +8), (keys +8, dims +8), so lane l
    // addresses key 8 ((l / 8) % 2) + l % 8, dims 8 (l / 16).
#pragma unroll
    for (int kk = 0; kk < C::kWarpKeys / 16; ++kk) {
      const uint32_t a[4] = {PackBf16x2(s[2 * kk][0], s[2 * kk][1]), PackBf16x2(s[2 * kk][2], s[2 * kk][3]),
                             PackBf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             PackBf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
      for (int dp = 0; dp < kDv / 16; ++dp) {
        uint32_t bv[4];
        LdMatrixX4Trans(bv, v_tile + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kStrideV +
                                dp * 16 + (lane / 16) * 8);
        Mma16816(o[2 * dp], a, bv[0], bv[1]);
        Mma16816(o[2 * dp + 1], a, bv[2], bv[3]);
      }
    }
    __syncthreads();  // every warp is done with this stage before the next prefetch overwrites it
  }

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
    l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
  }

  if constexpr (C::kWarpsN == 1) {
    // Straight from the C fragments: row g + 8h, dims 8 dt + 2c, +1.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = warp_row0 + lane / 4 + 8 * h;
      if (row >= rows_total) continue;
      const int col = 2 * (lane % 4);
      if (p.num_splits > 1) {  // unnormalised partials (m -inf, l 0 when the row saw no key here)
        const int64_t part = GlobalRow(p, q0, kvh, row) * p.num_splits + split;
        float* dst = p.part_o + part * kDv + col;
#pragma unroll
        for (int dt = 0; dt < C::kDimTiles; ++dt)
          *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][2 * h], o[dt][2 * h + 1]);
        if (lane % 4 == 0) *reinterpret_cast<float2*>(p.part_ml + 2 * part) = make_float2(m[h], l[h]);
      } else {
        const float inv = 1.f / l[h];
        bf16_t* dst = p.out + (q0 + row / p.group) * p.out_token_stride +
                      (kvh * p.group + row % p.group) * p.out_head_stride + col;
#pragma unroll
        for (int dt = 0; dt < C::kDimTiles; ++dt)
          *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) =
              __floats2bfloat162_rn(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
      }
    }
  } else {
    // Warps that shared a tile's keys hold softmax states of the same rows: stage them in shared
    // memory (the pipeline buffers are free: the loop ended on a barrier, no copy in flight) and
    // merge as the split merge does.
    constexpr int kOStride = C::kOStride;
    float* sO = reinterpret_cast<float*>(mma_smem);               // [kWarpsN][kBlockM][kOStride]
    float* sML = sO + C::kWarpsN * kBlockM * kOStride;             // [kWarpsN][kBlockM][2]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = warp_m * 16 + lane / 4 + 8 * h;
      float* dst = sO + (warp_n * kBlockM + r) * kOStride + 2 * (lane % 4);
#pragma unroll
      for (int dt = 0; dt < C::kDimTiles; ++dt)
        *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][2 * h], o[dt][2 * h + 1]);
      if (lane % 4 == 0) {
        sML[2 * (warp_n * kBlockM + r)] = m[h];
        sML[2 * (warp_n * kBlockM + r) + 1] = l[h];
      }
    }
    __syncthreads();
    // Thread per (row, 4 dims).
    for (int idx = tid; idx < kBlockM * (kDv / 4); idx += kThreads) {
      const int r = idx / (kDv / 4), c4 = idx % (kDv / 4);
      const int row = row0 + r;
      if (row >= rows_total) continue;
      float mx = -INFINITY;
#pragma unroll
      for (int w = 0; w < C::kWarpsN; ++w) mx = fmaxf(mx, sML[2 * (w * kBlockM + r)]);
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      float sum = 0.f;
#pragma unroll
      for (int w = 0; w < C::kWarpsN; ++w) {
        const float mw = sML[2 * (w * kBlockM + r)];
        if (mw == -INFINITY) continue;  // this warp's keys were all masked for the row
        const float wt = exp2f(mw - mx);
        sum += wt * sML[2 * (w * kBlockM + r) + 1];
        const float4 ow = *reinterpret_cast<const float4*>(sO + (w * kBlockM + r) * kOStride + 4 * c4);
        acc.x += wt * ow.x;
        acc.y += wt * ow.y;
        acc.z += wt * ow.z;
        acc.w += wt * ow.w;
      }
      if (p.num_splits > 1) {
        const int64_t part = GlobalRow(p, q0, kvh, row) * p.num_splits + split;
        *reinterpret_cast<float4*>(p.part_o + part * kDv + 4 * c4) = acc;
        if (c4 == 0) *reinterpret_cast<float2*>(p.part_ml + 2 * part) = make_float2(mx, sum);
      } else {
        const float inv = 1.f / sum;
        __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(
            p.out + (q0 + row / p.group) * p.out_token_stride + (kvh * p.group + row % p.group) * p.out_head_stride +
            4 * c4);
        dst[0] = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
        dst[1] = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
      }
    }
  }
  if (p.counters != nullptr) ArriveAndMerge<C>(p, b, kvh, tile, q0, row0, min(row0 + kBlockM, rows_total));
}

// Launches one plan; true when the kernel merged the splits itself (fused merge).
template <class C>
bool LaunchMma(MmaParams p, int num_seqs, cudaStream_t s) {
  static const bool configured = [] {
    COROLLA_CUDA_CHECK(cudaFuncSetAttribute(AttentionMmaKernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(C::kSmemBytes)));
    return true;
  }();
  (void)configured;
  p.counters = nullptr;
  if (p.num_splits > 1 && Tuning().attention_fused_merge &&
      static_cast<int64_t>(num_seqs) * p.kv_heads * p.row_tiles <= kMaxSplitKvMergeCounters &&
      sizeof(float2) * C::kBlockM * p.num_splits <= C::kSmemBytes)
    p.counters = SplitKvMergeCounters(s);
  dim3 grid(p.row_tiles * p.num_splits, p.kv_heads, num_seqs);
  LaunchPdl(AttentionMmaKernel<C>, grid, dim3(C::kThreads), C::kSmemBytes, s, 1, p);
  return p.counters != nullptr;
}

}  // namespace

// Declared in split_kv_merge.cuh (16 KB a stream).
int* SplitKvMergeCounters(cudaStream_t s) {
  return static_cast<int*>(
      StreamScratch(s, StreamScratchSlot::kSplitKvMergeCounters, kMaxSplitKvMergeCounters * sizeof(int)));
}

// Declared in attention.cu (its only caller), which has checked the tensors: q [T, Hq, kDk] and
// out [T, Hq, kDv] with 16-byte aligned rows, contiguous caches k [num_blocks, Hk, bs, kDk] and
// v [num_blocks, Hk, bs, kDv].
template <int kDk, int kDv>
bool AttentionMma(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
                  float scale_log2, int rows_per_cta, int row_tiles, int num_splits, float* part_o,
                  float* part_ml, const TensorView& out, cudaStream_t s) {
  const int bs = cache.block_size();
  const int shift = BlockShift(bs);
  MmaParams p{q.ptr<bf16_t>(),
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
              static_cast<int>(cache.k.dim(1)),
              static_cast<int>(q.dim(1) / cache.k.dim(1)),
              static_cast<int>(q.dim(1)),
              bs,
              shift,
              scale_log2,
              row_tiles,
              num_splits,
              part_o,
              part_ml,
              nullptr};
  const int num_seqs = static_cast<int>(batch.seq_lens.numel());
  using Tiles = MmaTiles<kDk, kDv>;
  if (rows_per_cta == Tiles::Decode::kBlockM) return LaunchMma<typename Tiles::Decode>(p, num_seqs, s);
  COROLLA_CHECK(rows_per_cta == Tiles::Prefill::kBlockM) << "attention mma: no " << rows_per_cta << "-row tile";
  return LaunchMma<typename Tiles::Prefill>(p, num_seqs, s);
}

#define COROLLA_ATTENTION_MMA(kDk, kDv)                                                     \
  template bool AttentionMma<kDk, kDv>(const TensorView&, const KvCacheView&,               \
                                       const AttentionBatch&, float, int, int, int, float*, \
                                       float*, const TensorView&, cudaStream_t);
COROLLA_ATTENTION_MMA(32, 32)
COROLLA_ATTENTION_MMA(64, 64)
COROLLA_ATTENTION_MMA(128, 128)
COROLLA_ATTENTION_MMA(256, 256)
COROLLA_ATTENTION_MMA(192, 128)
#undef COROLLA_ATTENTION_MMA

}  // namespace corolla::cuda
