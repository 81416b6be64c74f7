// MLA decode attention on tensor cores: all query heads of one decoding token against the paged
// latent cache ([num_blocks, 1, block_size, Dk], Dk = kv_lora + rope), whose rows are the keys
// and, by their first Dv = kv_lora dims, the values: each latent row comes into shared memory
// once per CTA and serves S = Q K^T and O += P V for all the CTA's heads. attention.cu routes
// pure-decode batches of MLA's absorbed shapes here (MlaDecodeServes); prefill keeps its path.
//
// CTA = (tile of kRows heads, KV split, sequence); 8 warps. Latent tiles of kBlockN rows stream
// through a kStages-deep cp.async ring (zero-filled past the split's keys). Per tile:
//  1. S: warp (rg, kg) scores its 16 heads (row group rg) against its kWarpKeys keys (key group
//     kg) over all Dk dims (mma.sync m16n8k16 bf16 -> f32, ldmatrix from the padded rows).
//  2. Softmax (f32, log2 domain): the key groups of a row group exchange their row maxima through
//     shared memory, so every warp holds the same running max per row; each writes its P (bf16)
//     to shared memory, keeps its part of the running sum, and key group 0 publishes the rescale
//     factor alpha of each row.
//  3. O += P V: warp w owns output dims [w kWarpDims, +kWarpDims) of all kRows heads (the
//     accumulators stay in registers: 4 x 8 x 4 f32 at 64 heads), A = P and B = V (ldmatrix.trans
//     of the same latent tile) from shared memory.
// Split-KV (several CTAs per sequence when the batch alone would leave SMs idle): each split takes
// its own sequence's keys (SplitKeyRange, split_keys.h: kBlockN tiles), writes
// unnormalised partials (o, max, sum) in f32, and SplitKvMergeKernel (split_kv_merge.cuh) merges
// them. The host plans the number of splits from its hints (max_seq_len may be an upper bound).
#include <algorithm>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/split_kv_merge.cuh"

namespace corolla::cuda {
namespace {

using mma::CpAsync16;
using mma::CpAsyncCommit;
using mma::CpAsyncWait;
using mma::LdMatrixX2;
using mma::LdMatrixX4;
using mma::LdMatrixX4Trans;
using mma::Mma16816;

struct MlaParams {
  const bf16_t* q;  // [T, Hq, Dk]
  int64_t q_token_stride, q_head_stride;
  bf16_t* out;  // [T, Hq, Dv]
  int64_t out_token_stride, out_head_stride;
  const bf16_t* latent;         // [num_blocks, 1, block_size, Dk]
  const int32_t* block_tables;  // [B, table_stride]
  int64_t table_stride;
  const int32_t* query_start;  // [B + 1]: at most one token per sequence
  const int32_t* seq_lens;     // [B]
  int q_heads, block_size;
  int block_shift;   // log2(block_size) when a power of two, else -1
  float scale_log2;  // softmax scale * log2(e)
  int num_splits;    // 1: the CTA normalises and writes out; else partials
  float* part_o;     // [T * Hq, num_splits, Dv]
  float* part_ml;    // [T * Hq, num_splits, 2]: max (log2 domain) and sum
};

// One CTA shape. Warps: kRowGroups x kKeyGroups for S, kWarps slices of the Dv dims for P V.
template <int kDk_, int kDv_, int kRows_, int kBlockN_, int kStages_>
struct MlaConfig {
  static constexpr int kDk = kDk_, kDv = kDv_, kRows = kRows_, kBlockN = kBlockN_, kStages = kStages_;
  static constexpr int kWarps = kDv >= 512 ? 8 : 2;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kRowGroups = kRows / 16;
  static constexpr int kKeyGroups = kWarps / kRowGroups;
  static constexpr int kWarpKeys = kBlockN / kKeyGroups;  // S: keys of a tile per warp
  static constexpr int kKeyTiles = kWarpKeys / 8;         // n8 tiles of S per warp
  static constexpr int kWarpDims = kDv / kWarps;          // P V: output dims per warp
  static constexpr int kDimTiles = kWarpDims / 8;         // n8 tiles of O per warp and row group
  static constexpr int kChunks = kDk / 8;                 // 16-byte pieces of a latent row
  // Rows padded by 16 bytes: the 8 rows one ldmatrix phase reads start 4 banks apart (conflict-
  // free); every region stays 16-byte aligned for cp.async.
  static constexpr int kStride = kDk + 8;
  static constexpr int kPStride = kBlockN + 8;
  static constexpr size_t kQBytes = sizeof(bf16_t) * kRows * kStride;
  static constexpr size_t kKBytes = sizeof(bf16_t) * kStages * kBlockN * kStride;
  static constexpr size_t kPBytes = sizeof(bf16_t) * kRows * kPStride;
  // Row maxima and sums per key group, alpha and the final max per row.
  static constexpr size_t kStatBytes = sizeof(float) * (2 * kKeyGroups + 2) * kRows;
  static constexpr size_t kSmemBytes = kQBytes + kKBytes + kPBytes + kStatBytes;
  static_assert(kRows % 16 == 0 && kWarps % kRowGroups == 0, "whole 16-row groups, each with its key groups");
  static_assert(kWarpKeys % 8 == 0 && kBlockN % 16 == 0, "S in n8 key tiles, P V in k16 key steps");
  static_assert(kWarpDims % 16 == 0 && kWarps * kWarpDims == kDv, "P V in 16-dim ldmatrix.trans steps");
  static_assert(kDk % 16 == 0 && kDv <= kDk, "S in k16 dim steps; V is the first Dv dims of a row");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory per CTA");
};

// The configurations, by head count (attention.cu's table lists the (Dk, Dv) pairs routed here).
// DeepSeek-V3 (576/512): 64 heads per CTA (32-key tiles, 3 stages, 189 KB), or 16 when fewer
// heads (TP shards; 64-key tiles, 2 stages, 168 KB). The test fixture's 48/32: 16 heads.
template <int kDk, int kDv>
struct MlaTiles;
template <>
struct MlaTiles<576, 512> {
  using Wide = MlaConfig<576, 512, 64, 32, 3>;
  using Narrow = MlaConfig<576, 512, 16, 64, 2>;
};
template <>
struct MlaTiles<48, 32> {
  using Wide = MlaConfig<48, 32, 16, 32, 2>;
  using Narrow = Wide;
};

template <class C>
__global__ void __launch_bounds__(C::kThreads, 1) MlaDecodeKernel(const __grid_constant__ MlaParams p) {
  constexpr int kRows = C::kRows, kBlockN = C::kBlockN, kStride = C::kStride, kPStride = C::kPStride;
  constexpr int kThreads = C::kThreads, kChunks = C::kChunks, kStages = C::kStages;
  constexpr int kKeyGroups = C::kKeyGroups, kRowGroups = C::kRowGroups;
  extern __shared__ __align__(16) unsigned char mla_smem[];
  bf16_t* sQ = reinterpret_cast<bf16_t*>(mla_smem);  // [kRows][kStride]
  bf16_t* sK = sQ + kRows * kStride;                  // [kStages][kBlockN][kStride]
  bf16_t* sP = sK + kStages * kBlockN * kStride;      // [kRows][kPStride]
  float* sMax = reinterpret_cast<float*>(sP + kRows * kPStride);  // [kKeyGroups][kRows]
  float* sSum = sMax + kKeyGroups * kRows;                          // [kKeyGroups][kRows]
  float* sAlpha = sSum + kKeyGroups * kRows;                        // [kRows]
  float* sM = sAlpha + kRows;                                       // [kRows]

  const int row0 = blockIdx.x * kRows, split = blockIdx.y, b = blockIdx.z;
  const int q0 = p.query_start[b];
  if (p.query_start[b + 1] == q0) return;  // the sequence has no token in this step
  const int seq_len = p.seq_lens[b];
  const KeyRange keys = SplitKeyRange(seq_len, p.num_splits, split, kBlockN, seq_len);
  const int kv_begin = keys.begin, kv_end = keys.end;
  const int rows_valid = min(kRows, p.q_heads - row0);
  const int tid = threadIdx.x;
  auto part_of = [&](int r) { return (static_cast<int64_t>(q0) * p.q_heads + row0 + r) * p.num_splits + split; };
  if (kv_begin >= kv_end) {  // an empty split: mark its partials empty (the combine skips them)
    for (int r = tid; p.num_splits > 1 && r < rows_valid; r += kThreads) {
      p.part_ml[2 * part_of(r)] = -INFINITY;
      p.part_ml[2 * part_of(r) + 1] = 0.f;
    }
    return;
  }
  const int warp = tid / 32, lane = tid % 32;
  const int32_t* table = p.block_tables + b * p.table_stride;

  // Q tile -> shared (heads past Hq zero-filled: their rows are computed, never written).
  for (int idx = tid; idx < kRows * kChunks; idx += kThreads) {
    const int r = idx / kChunks, c = idx % kChunks;
    const bool valid = r < rows_valid;
    const bf16_t* src = p.q;
    if (valid) src += q0 * p.q_token_stride + (row0 + r) * p.q_head_stride + c * 8;
    CpAsync16(sQ + r * kStride + c * 8, src, valid);
  }
  // Latent rows [n0, n0 + kBlockN) of tile `tile` -> stage; rows at or past kv_end zero-filled
  // (masked in S; zero V rows keep 0 * V finite). A block's rows are contiguous.
  auto load_tile = [&](int tile, int stage) {
    const int n0 = kv_begin + tile * kBlockN;
    bf16_t* dst = sK + stage * kBlockN * kStride;
    for (int idx = tid; idx < kBlockN * kChunks; idx += kThreads) {
      const int j = idx / kChunks, c = idx % kChunks;
      const int key = n0 + j;
      const bool valid = key < kv_end;
      int64_t offset = 0;
      if (valid) {
        const PagedSlot slot = LocateKey(table, key, p.block_size, p.block_shift);
        offset = (slot.block * p.block_size + slot.in_block) * C::kDk + c * 8;
      }
      CpAsync16(dst + j * kStride + c * 8, p.latent + offset, valid);
    }
  };

  const int num_tiles = (kv_end - kv_begin + kBlockN - 1) / kBlockN;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {  // group s: tile s (group 0 also holds Q)
    if (s < num_tiles) load_tile(s, s);
    CpAsyncCommit();
  }

  // S roles: this thread's rows are rg * 16 + lane / 4 (+ 8), its keys kg * kWarpKeys + ...
  const int rg = warp % kRowGroups, kg = warp / kRowGroups;
  const int key_base = kg * C::kWarpKeys;
  float m_run[2] = {-INFINITY, -INFINITY};  // running max of the two rows (the same in every key group)
  float l_part[2] = {0.f, 0.f};             // this thread's part of the running sums
  // P V roles: dims dim0 .. dim0 + kWarpDims of every row group.
  const int dim0 = warp * C::kWarpDims;
  float o[kRowGroups][C::kDimTiles][4];
#pragma unroll
  for (int g = 0; g < kRowGroups; ++g)
#pragma unroll
    for (int dt = 0; dt < C::kDimTiles; ++dt) o[g][dt][0] = o[g][dt][1] = o[g][dt][2] = o[g][dt][3] = 0.f;

  for (int t = 0; t < num_tiles; ++t) {
    const int stage = t % kStages;
    // Prefetch tile t + kStages - 1 into the stage tile t - 1 used (freed by the barrier ending
    // iteration t - 1); always commit, so group t holds tile t.
    if (t + kStages - 1 < num_tiles) load_tile(t + kStages - 1, (t + kStages - 1) % kStages);
    CpAsyncCommit();
    CpAsyncWait<kStages - 1>();
    __syncthreads();  // tile t (and Q) visible to every warp
    const bf16_t* k_tile = sK + stage * kBlockN * kStride;
    const int n0 = kv_begin + t * kBlockN;

    // 1. S = Q K^T for rows rg, keys key_base.. of the tile. A (Q, row-major): lane l addresses
    // row l % 16, dims 8 (l / 16). B (K^T, col-major = K rows as stored): an x4 covers two key
    // tiles, matrices (keys +0, dims +0), (+0, +8), (+8, +0), (+8, +8): lane l addresses key
    // 8 (l / 16) + l % 8, dims 8 ((l / 8) % 2); an x2 one key tile (lanes 0-15 of the same).
    // Even and odd dim steps accumulate apart (two independent mma chains per key tile, summed
    // after the loop): a warp has few key tiles, so one chain would wait on each mma's latency.
    float s[C::kKeyTiles][4], s_odd[C::kKeyTiles][4];
#pragma unroll
    for (int nt = 0; nt < C::kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = s_odd[nt][e] = 0.f;
    auto score_step = [&](int ks, float (&acc)[C::kKeyTiles][4]) {
      uint32_t a[4];
      LdMatrixX4(a, sQ + (rg * 16 + lane % 16) * kStride + ks * 16 + (lane / 16) * 8);
      if constexpr (C::kKeyTiles % 2 == 0) {
#pragma unroll
        for (int np = 0; np < C::kKeyTiles / 2; ++np) {
          uint32_t bk[4];
          LdMatrixX4(bk, k_tile + (key_base + np * 16 + (lane / 16) * 8 + lane % 8) * kStride + ks * 16 +
                             ((lane / 8) % 2) * 8);
          Mma16816(acc[2 * np], a, bk[0], bk[1]);
          Mma16816(acc[2 * np + 1], a, bk[2], bk[3]);
        }
      } else {
#pragma unroll
        for (int nt = 0; nt < C::kKeyTiles; ++nt) {
          uint32_t bk[2];
          LdMatrixX2(bk, k_tile + (key_base + nt * 8 + lane % 8) * kStride + ks * 16 + ((lane / 8) % 2) * 8);
          Mma16816(acc[nt], a, bk[0], bk[1]);
        }
      }
    };
#pragma unroll 2
    for (int ks = 0; ks + 1 < C::kDk / 16; ks += 2) {
      score_step(ks, s);
      score_step(ks + 1, s_odd);
    }
    if constexpr (C::kDk / 16 % 2 == 1) score_step(C::kDk / 16 - 1, s);
#pragma unroll
    for (int nt = 0; nt < C::kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] += s_odd[nt][e];

    // 2. Softmax. Element e of key tile nt: row lane / 4 + 8 (e / 2), key 8 nt + 2 (lane % 4) + e % 2.
    const bool need_mask = n0 + kBlockN > kv_end;
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nt = 0; nt < C::kKeyTiles; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + key_base + nt * 8 + 2 * (lane % 4) + (e & 1);
        s[nt][e] = need_mask && key >= kv_end ? -INFINITY : s[nt][e] * p.scale_log2;
        mx[e / 2] = fmaxf(mx[e / 2], s[nt][e]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {  // a row's keys of this warp sit in the 4 lanes of a quad
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
      mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
      if (lane % 4 == 0) sMax[kg * kRows + rg * 16 + lane / 4 + 8 * h] = mx[h];
    }
    __syncthreads();  // every key group's maxima visible
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = rg * 16 + lane / 4 + 8 * h;
      float tile_max = -INFINITY;
#pragma unroll
      for (int w = 0; w < kKeyGroups; ++w) tile_max = fmaxf(tile_max, sMax[w * kRows + row]);
      // Finite: the tile holds at least one key below kv_end. alpha is 0 on the first tile.
      const float m_new = fmaxf(m_run[h], tile_max);
      const float alpha = exp2f(m_run[h] - m_new);
      m_run[h] = m_new;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < C::kKeyTiles; ++nt) {
        const float p0 = exp2f(s[nt][2 * h] - m_new), p1 = exp2f(s[nt][2 * h + 1] - m_new);
        sum += p0 + p1;
        *reinterpret_cast<__nv_bfloat162*>(sP + row * kPStride + key_base + nt * 8 + 2 * (lane % 4)) =
            __floats2bfloat162_rn(p0, p1);
      }
      l_part[h] = l_part[h] * alpha + sum;
      if (kg == 0 && lane % 4 == 0) sAlpha[row] = alpha;
    }
    __syncthreads();  // P and alpha visible

    // 3. O = alpha O + P V. A = P (row-major, as Q above); B = V rows of the tile, key-major, so
    // ldmatrix.trans: matrices (keys +0, dims +0), (keys +8, dims +0), (keys +0, dims +8),
    // (keys +8, dims +8), lane l addressing key 8 ((l / 8) % 2) + l % 8, dims 8 (l / 16).
#pragma unroll
    for (int g = 0; g < kRowGroups; ++g) {
      const float a0 = sAlpha[g * 16 + lane / 4], a1 = sAlpha[g * 16 + lane / 4 + 8];
#pragma unroll
      for (int dt = 0; dt < C::kDimTiles; ++dt) {
        o[g][dt][0] *= a0;
        o[g][dt][1] *= a0;
        o[g][dt][2] *= a1;
        o[g][dt][3] *= a1;
      }
    }
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      uint32_t pa[kRowGroups][4];
#pragma unroll
      for (int g = 0; g < kRowGroups; ++g)
        LdMatrixX4(pa[g], sP + (g * 16 + lane % 16) * kPStride + kk * 16 + (lane / 16) * 8);
#pragma unroll
      for (int dp = 0; dp < C::kWarpDims / 16; ++dp) {
        uint32_t bv[4];
        LdMatrixX4Trans(bv, k_tile + (kk * 16 + ((lane / 8) % 2) * 8 + lane % 8) * kStride + dim0 + dp * 16 +
                                (lane / 16) * 8);
#pragma unroll
        for (int g = 0; g < kRowGroups; ++g) {
          Mma16816(o[g][2 * dp], pa[g], bv[0], bv[1]);
          Mma16816(o[g][2 * dp + 1], pa[g], bv[2], bv[3]);
        }
      }
    }
    __syncthreads();  // the stage, P and alpha are free for the next iteration
  }

  // Row sums: the quad's lanes, then the key groups (through shared memory); the max is the same
  // in every key group.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    l_part[h] += __shfl_xor_sync(0xffffffffu, l_part[h], 1);
    l_part[h] += __shfl_xor_sync(0xffffffffu, l_part[h], 2);
    const int row = rg * 16 + lane / 4 + 8 * h;
    if (lane % 4 == 0) {
      sSum[kg * kRows + row] = l_part[h];
      if (kg == 0) sM[row] = m_run[h];
    }
  }
  __syncthreads();
#pragma unroll
  for (int g = 0; g < kRowGroups; ++g)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = g * 16 + lane / 4 + 8 * h;
      if (r >= rows_valid) continue;
      float l = 0.f;
#pragma unroll
      for (int w = 0; w < kKeyGroups; ++w) l += sSum[w * kRows + r];
      const int col = dim0 + 2 * (lane % 4);
      if (p.num_splits > 1) {  // unnormalised partials
        const int64_t part = part_of(r);
        float* dst = p.part_o + part * C::kDv + col;
#pragma unroll
        for (int dt = 0; dt < C::kDimTiles; ++dt)
          *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[g][dt][2 * h], o[g][dt][2 * h + 1]);
        if (warp == 0 && lane % 4 == 0) *reinterpret_cast<float2*>(p.part_ml + 2 * part) = make_float2(sM[r], l);
      } else {
        const float inv = 1.f / l;
        bf16_t* dst = p.out + q0 * p.out_token_stride + (row0 + r) * p.out_head_stride + col;
#pragma unroll
        for (int dt = 0; dt < C::kDimTiles; ++dt)
          *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) =
              __floats2bfloat162_rn(o[g][dt][2 * h] * inv, o[g][dt][2 * h + 1] * inv);
      }
    }
}

int NumSms() {
  static const int sms = [] {
    int dev = 0, n = 0;
    COROLLA_CUDA_CHECK(cudaGetDevice(&dev));
    COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
    return n;
  }();
  return sms;
}

// Splits per sequence: forced by Tuning().mla_decode_splits, none when splitting is off
// (attention_split_min_ctas 0) or the hint is unknown; else the count that minimises a cost in
// tile times: waves of CTAs (one per SM) x (tiles per split + 2 for the Q load and epilogue),
// plus the combine's traffic (partials written and read at ~3 TB/s). Then as few splits as
// cover max_seq_len in whole tiles of the chosen size (none empty at the longest length).
template <class C>
int PlanSplits(int64_t ctas_per_split, int64_t rows, int max_seq_len) {
  const int max_tiles = std::max(1, CeilDiv(max_seq_len, C::kBlockN));
  int splits = 1;
  if (Tuning().mla_decode_splits > 0) {
    splits = std::min(Tuning().mla_decode_splits, max_tiles);
  } else if (Tuning().attention_split_min_ctas > 0 && max_seq_len > C::kBlockN) {
    // One tile on one SM while all are busy, in seconds: its multiply-adds at ~3 TFLOP/s (mma.sync
    // fed from shared memory) or its latent rows at the SM's share of ~3.5 TB/s, the slower.
    const int sms = NumSms();
    const double tile_s = std::max(2.0 * C::kRows * C::kBlockN * (C::kDk + C::kDv) / 3e12,
                                   2.0 * C::kBlockN * C::kDk / (3.5e12 / sms));
    double best = INFINITY;
    for (int sp = 1; sp <= std::min(max_tiles, 256); ++sp) {
      const int64_t waves = (ctas_per_split * sp + sms - 1) / sms;
      const double combine_s = sp > 1 ? 2e-6 + rows * sp * (C::kDv + 2) * 8.0 / 3e12 : 0.0;
      const double cost = waves * (CeilDiv(max_tiles, sp) + 2) + combine_s / tile_s;
      if (cost < 0.98 * best) {
        best = cost;
        splits = sp;
      }
    }
  }
  const int chunk_tiles = CeilDiv(max_tiles, splits);
  return CeilDiv(max_tiles, chunk_tiles);
}

template <class C>
void LaunchMlaDecode(MlaParams p, int64_t tokens, int num_seqs, int max_seq_len, CachingAllocator& alloc,
                     cudaStream_t s) {
  static const bool configured = [] {
    COROLLA_CUDA_CHECK(cudaFuncSetAttribute(MlaDecodeKernel<C>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            static_cast<int>(C::kSmemBytes)));
    return true;
  }();
  (void)configured;
  const int row_tiles = CeilDiv(p.q_heads, C::kRows);
  const int64_t rows = tokens * p.q_heads;  // (token, head) rows of the partials and of out
  p.num_splits = PlanSplits<C>(static_cast<int64_t>(row_tiles) * num_seqs, rows, max_seq_len);
  ScratchBuffer partials(alloc, p.num_splits > 1 ? rows * p.num_splits * (C::kDv + 2) * sizeof(float) : 0);
  if (p.num_splits > 1) {
    p.part_o = partials.as<float>();
    p.part_ml = p.part_o + rows * p.num_splits * C::kDv;
  }
  MlaDecodeKernel<C><<<dim3(row_tiles, p.num_splits, num_seqs), C::kThreads, C::kSmemBytes, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
  if (p.num_splits > 1) {
    LaunchSplitKvMerge<C::kDv>(
        {p.part_o, p.part_ml, p.out, p.out_token_stride, p.out_head_stride, rows, p.q_heads, p.num_splits}, s);
  }
}

bool Aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

bool MlaDecodeServes(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
                     const TensorView& out) {
  const int64_t dk = q.dim(2), dv = out.dim(2);
  const bool dims = (dk == 576 && dv == 512) || (dk == 48 && dv == 32);
  return Tuning().attention_mma && dims && cache.k.data == cache.v.data && cache.k.dim(1) == 1 &&
         batch.max_q_len == 1 && q.dim(0) <= batch.seq_lens.numel() && Aligned(q.data, 16) &&
         q.strides[0] % 8 == 0 && q.strides[1] % 8 == 0 && Aligned(out.data, 4) && out.strides[0] % 2 == 0 &&
         out.strides[1] % 2 == 0 && Aligned(cache.k.data, 16);
}

void MlaDecode(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch, float scale,
               const TensorView& out, CachingAllocator& alloc, cudaStream_t s) {
  COROLLA_CHECK(MlaDecodeServes(q, cache, batch, out) && q.dtype == DType::kBF16 && out.dtype == DType::kBF16 &&
                cache.k.dtype == DType::kBF16 && cache.k.rank() == 4 && cache.k.is_contiguous() &&
                cache.k.dim(3) == q.dim(2) && out.dim(0) == q.dim(0) && out.dim(1) == q.dim(1) &&
                q.strides[2] == 1 && out.strides[2] == 1)
      << "mla decode q " << q.ToString() << " cache " << cache.k.ToString() << " out " << out.ToString()
      << " max_q_len " << batch.max_q_len;
  const int num_seqs = static_cast<int>(batch.seq_lens.numel());
  if (q.dim(0) == 0 || num_seqs == 0) return;
  const int bs = cache.block_size();
  const int shift = BlockShift(bs);
  MlaParams p{q.ptr<bf16_t>(),
              q.strides[0],
              q.strides[1],
              out.ptr<bf16_t>(),
              out.strides[0],
              out.strides[1],
              cache.k.ptr<bf16_t>(),
              batch.block_tables.ptr<int32_t>(),
              batch.block_tables.rank() == 2 ? batch.block_tables.dim(1) : 0,
              batch.query_start.ptr<int32_t>(),
              batch.seq_lens.ptr<int32_t>(),
              static_cast<int>(q.dim(1)),
              bs,
              shift,
              scale * 1.4426950408889634f,
              1,
              nullptr,
              nullptr};
  const int hq = static_cast<int>(q.dim(1));
  auto launch = [&](auto tiles) {
    using Tiles = decltype(tiles);
    if (hq >= Tiles::Wide::kRows) {
      LaunchMlaDecode<typename Tiles::Wide>(p, q.dim(0), num_seqs, batch.max_seq_len, alloc, s);
    } else {
      LaunchMlaDecode<typename Tiles::Narrow>(p, q.dim(0), num_seqs, batch.max_seq_len, alloc, s);
    }
  };
  if (q.dim(2) == 576) {
    launch(MlaTiles<576, 512>{});
  } else {
    launch(MlaTiles<48, 32>{});
  }
}

}  // namespace corolla::cuda
