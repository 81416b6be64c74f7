// Prefill attention on Hopper's wgmma (FlashAttention-3 style) for Dk = Dv = 128 and for
// DeepSeek's decompressed MLA (Dk = 192, Dv = 128), bf16, over the paged, heads-major KV cache
// ([num_blocks, Hk, block_size, Dk or Dv], any block_size). Same
// semantics and query rows as attention_mma.cu: row r of a sequence is (token r / group, head
// kvh * group + r % group), so one K/V tile in shared memory serves every query head of its GQA
// group and the rows of a tile may mix tokens, each masked at its own position. attention.cu
// chooses this kernel (Tuning().attention_wgmma, sm_90) for batches with more than 16 query
// tokens in a sequence (never split-KV); decode stays on attention_mma.cu.
//
// CTA = 128 query rows x KV head x sequence, 384 threads, warp-specialised:
// - warpgroups 0 and 1 (consumers) own rows 0-63 / 64-127 of the tile. Per K/V tile of 128 keys:
//   S = Q K^T by 8 wgmma.m64n128k16 (Q and K from shared memory, both K-major), mask (causal per
//   row, only on tiles that reach past the warpgroup's first row), online softmax in f32 in the
//   log2 domain, P packed to bf16 registers (the accumulator fragment is the register-A
//   fragment), O += P V by 8 wgmma.m64n128k16 with A from registers and V (stored [keys][dims])
//   as an MN-major B operand (imm-trans-b 1). O (64 f32 per thread) stays in registers; the
//   output is normalised and written bf16 from them.
// - warpgroup 2 (producer) gathers the K and V rows of each tile through the block table by
//   16-byte cp.async into the 128-byte-swizzled layout (keys past the CTA's last visible key
//   zero-filled); once it has issued tile t + kLag it waits for tile t's copies (cp.async
//   groups), fences them to the async proxy and arrives on full[t % kStages] (count 128);
//   consumers release a stage per warp on empty[stage] (count 8) after its P V. kStages deep.
// Shared tiles: a [rows][D] bf16 tile is D / 64 panels [D / 64][rows][64], each 1024-aligned,
// element (r, d) of panel d / 64 at Sw128(r, (d % 64) / 8) + 2 (d % 8) (wgmma.cuh's layout).
// Q (32 KB; 48 at Dk 192) is loaded once by all threads before the roles split (TMA builds: by
// the consumers, waited for after the split, so the producer's first K/V loads overlap it).
// Dk 192 (WgmmaShape<192>): S takes 12 k16 steps instead of 8, a stage holds a 48 KB K tile and
// a 32 KB V tile, so the ring is 2 stages deep (3 at 128); everything after S is the D 128
// kernel's.
// TMA producer (Tuning().attention_wgmma_tma where TmaServes: block_size a power of two >= 8, a
// multiple of 128, or one block a sequence of >= 128 keys; AttentionWgmmaKernel<S, kVariant,
// true>): one warp of the producer warpgroup loads every tile whose 128 keys all lie below kv_end
// by cp.async.bulk.tensor from the caches viewed as 2-D [num_blocks * Hk * block_size, D] bf16
// maps (box 64 dims x min(block_size, 128) keys, 128-byte swizzle: the layout above; box i of a
// panel at i * box_rows * 128 bytes, 1024-aligned), lane 0 arming the stage's full barrier
// (count 1) with arrive.expect_tx of the tile's bytes, the lanes issuing a box each (Dk 192: K's
// three panels' boxes spread over the lanes, IssueTileBoxes); the consumers' wait completes when
// the bytes have landed (no kLag). The last tile, when it reaches past kv_end (its V rows there
// must be zero: P = 0 times a NaN of a cache slot is NaN), is gathered by the 128 producer threads
// with the cp.async zero fill; after their wait_group and proxy fence a named barrier (id 3) joins
// them and one thread arrives. Builds (Tuning().attention_wgmma_variant,
// AttentionWgmmaKernel<kVariant>): 0 the above; 1 the grid flattened, the KV heads fastest (every
// head's heaviest causal row tiles dispatched first) or, where the K/V of all heads overflows L2, a
// head's row tiles together (heads_fastest); 2 as 1 with FlashAttention-3's intra-warpgroup overlap
// (ConsumeOverlap: S of tile j and P V of tile j - 1 issued together, the softmax of S_j under the
// P V; setmaxnreg 240 / 24; the producer signals a tile once it has landed); 3 as 2 plus the
// ping-pong of the consumer warpgroups (named barriers: one issues its GEMMs while the other runs
// its softmax); 4 and 5 as 2 and 3 with SoftmaxFast (ex2.approx.ftz, the scale folded into one
// FFMA). CudaKernelTest.AttentionWgmmaTileProbe checks one S tile and one P V tile alone. The tile
// layout, the parameters and the three producers live in attention_wgmma_producer.cuh.
#include <algorithm>
#include <atomic>

#include "kernels/cuda/attention_wgmma_producer.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/tensor_map.h"
#include "kernels/cuda/wgmma.cuh"

namespace corolla::cuda {
namespace {

// One consumer warpgroup's softmax state and its steps over a K/V tile (see Consume).
struct ConsumerState {
  float o[64];  // O: o[4 j + 2 h + i] = row g + 8 h, dim 8 j + 2 cq + i
  float s[64];  // S, then P (f32): s[4 j + 2 h + i] = row g + 8 h, key n0 + 8 j + 2 cq + i
  uint32_t a[kBlockN / 16][4];  // P as bf16 A fragments, one per 16 keys
  float m[2], l[2];  // running max (log2 domain) and this thread's part of the sums, rows g, g + 8
  int limit[2];      // key limit (exclusive) of rows g, g + 8; 0 past the sequence's rows
  int wg_limit;      // keys below it are visible to every valid row of the warpgroup
};

// S = Q K^T over Dk / 16 k16 steps (step ks reads panel ks / 4 at +32 bytes per step), committed
// as one wgmma group.
template <class S>
__device__ __forceinline__ void IssueS(ConsumerState& c, uint32_t q_rows, uint32_t sk) {
  // A fresh value (the first step does not accumulate): the previous tile's P is dead here,
  // not carried through the asm's "+f" operands.
#pragma unroll
  for (int i = 0; i < 64; ++i) c.s[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) wgmma::FenceOperand(c.s[i]);
  wgmma::Fence();
#pragma unroll
  for (int ks = 0; ks < S::kDk / 16; ++ks) {
    const uint32_t qa = q_rows + (ks / 4) * (kBlockM * 128) + 32 * (ks % 4);
    const uint32_t kb = sk + (ks / 4) * kHalfK + 32 * (ks % 4);
    wgmma::MmaM64N128K16(c.s, wgmma::SmemDescSw128(qa), wgmma::SmemDescSw128(kb), ks > 0);
  }
  wgmma::Commit();
}

// O += P V over 8 k16 steps of keys from the packed fragments, committed as one wgmma group.
__device__ __forceinline__ void IssuePv(ConsumerState& c, uint32_t sv) {
#pragma unroll
  for (int i = 0; i < 64; ++i) wgmma::FenceOperand(c.o[i]);
  wgmma::Fence();
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) PvStep(c.o, c.a[kk], sv + kk * 16 * 128);
  wgmma::Commit();
}

// Mask (causal per row, only where the tile reaches past the warpgroup's first row), scale into
// the log2 domain and take the online softmax step on S (done): s becomes P, m and l move on;
// returns each row's alpha (the factor O still has to take). Does not touch O.
__device__ __forceinline__ void Softmax(ConsumerState& c, int n0, float scale_log2, int cq,
                                        float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) wgmma::FenceOperand(c.s[i]);
  const bool need_mask = n0 + kBlockN > c.wg_limit;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int key = n0 + 8 * j + 2 * cq + (e & 1);
      c.s[4 * j + e] = need_mask && key >= c.limit[e / 2] ? -INFINITY : c.s[4 * j + e] * scale_log2;
    }
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // a row's keys sit in the 4 lanes of a quad
    float mx = c.m[h];
#pragma unroll
    for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(c.s[4 * j + 2 * h], c.s[4 * j + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    // A row that has seen no key yet keeps max -inf; subtract 0 then (p = 2^-inf = 0, alpha 0).
    const float base = mx == -INFINITY ? 0.f : mx;
    alpha[h] = exp2f(c.m[h] - base);
    c.m[h] = mx;
    float sum = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      c.s[4 * j + 2 * h] = exp2f(c.s[4 * j + 2 * h] - base);
      c.s[4 * j + 2 * h + 1] = exp2f(c.s[4 * j + 2 * h + 1] - base);
      sum += c.s[4 * j + 2 * h] + c.s[4 * j + 2 * h + 1];
    }
    c.l[h] = c.l[h] * alpha[h] + sum;
  }
}

__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Softmax with fewer instructions per score (variants 4 and 5): the mask on the raw scores, the
// row max taken on them and scaled once (scale_log2 > 0: the host falls back otherwise), each P
// as ex2.approx.ftz(s * scale_log2 - max) (one FFMA, no denormal fix-up; P below 2^-126 is 0).
// Same contract as Softmax.
__device__ __forceinline__ void SoftmaxFast(ConsumerState& c, int n0, float scale_log2, int cq,
                                            float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) wgmma::FenceOperand(c.s[i]);
  if (n0 + kBlockN > c.wg_limit) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = n0 + 8 * j + 2 * cq + (e & 1);
        if (key >= c.limit[e / 2]) c.s[4 * j + e] = -INFINITY;
      }
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // a row's keys sit in the 4 lanes of a quad
    float mx = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; ++j) mx = fmaxf(mx, fmaxf(c.s[4 * j + 2 * h], c.s[4 * j + 2 * h + 1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx = fmaxf(c.m[h], mx * scale_log2);
    // A row that has seen no key yet keeps max -inf; subtract 0 then (p = 2^-inf = 0, alpha 0).
    const float base = mx == -INFINITY ? 0.f : mx;
    alpha[h] = Exp2Ftz(c.m[h] - base);
    c.m[h] = mx;
    float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      c.s[4 * j + 2 * h] = Exp2Ftz(fmaf(c.s[4 * j + 2 * h], scale_log2, -base));
      c.s[4 * j + 2 * h + 1] = Exp2Ftz(fmaf(c.s[4 * j + 2 * h + 1], scale_log2, -base));
      sum0 += c.s[4 * j + 2 * h];
      sum1 += c.s[4 * j + 2 * h + 1];
    }
    c.l[h] = c.l[h] * alpha[h] + (sum0 + sum1);
  }
}

// O *= alpha per row (O's wgmmas done), then P -> bf16 A fragments: the fragment of keys 16 kk..
// is the packed S fragment of key columns 2 kk (a[kk][0], a[kk][1]) and 2 kk + 1 (a[kk][2],
// a[kk][3]). Packed before the P V fence: registers written between a fence and the wgmmas make
// ptxas insert a warpgroup arrive and serialise the wgmmas.
__device__ __forceinline__ void RescaleAndPack(ConsumerState& c, const float (&alpha)[2]) {
#pragma unroll
  for (int i = 0; i < 64; ++i) wgmma::FenceOperand(c.o[i]);
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) c.o[4 * j + e] *= alpha[e / 2];
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      c.a[kk][i] = PackBf16x2(c.s[8 * kk + 2 * i], c.s[8 * kk + 2 * i + 1]);
}

// Rows g, g + 8 of this thread's warp: key limits, running max and sum; O zeroed.
__device__ __forceinline__ void InitState(const WgmmaAttnParams& p, ConsumerState& c, int wg_row0,
                                          int rows_total, int prefix) {
  const int warp = (threadIdx.x / 32) % 4, g = (threadIdx.x % 32) / 4;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = wg_row0 + 16 * warp + g + 8 * h;
    c.limit[h] = row < rows_total ? prefix + row / p.group + 1 : 0;
    c.m[h] = -INFINITY;
    c.l[h] = 0.f;
  }
  c.wg_limit = wg_row0 < rows_total ? prefix + wg_row0 / p.group + 1 : 0;
#pragma unroll
  for (int i = 0; i < 64; ++i) c.o[i] = 0.f;
}

// O (all wgmmas on it done) normalised by the row sums, written bf16.
__device__ __forceinline__ void WriteOut(const WgmmaAttnParams& p, ConsumerState& c, int q0,
                                         int wg_row0, int rows_total, int kvh) {
  const int warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, cq = lane % 4;
#pragma unroll
  for (int i = 0; i < 64; ++i) wgmma::FenceOperand(c.o[i]);

#pragma unroll
  for (int h = 0; h < 2; ++h) {
    c.l[h] += __shfl_xor_sync(0xffffffffu, c.l[h], 1);
    c.l[h] += __shfl_xor_sync(0xffffffffu, c.l[h], 2);
  }
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = wg_row0 + 16 * warp + g + 8 * h;
    if (row >= rows_total) continue;
    const float inv = 1.f / c.l[h];
    bf16_t* dst = p.out + (q0 + row / p.group) * p.out_token_stride +
                  (kvh * p.group + row % p.group) * p.out_head_stride + 2 * cq;
#pragma unroll
    for (int j = 0; j < 16; ++j)
      *reinterpret_cast<__nv_bfloat162*>(dst + 8 * j) =
          __floats2bfloat162_rn(c.o[4 * j + 2 * h] * inv, c.o[4 * j + 2 * h + 1] * inv);
  }
}

// A consumer warpgroup: 64 rows of the tile over all its K/V tiles; per tile S, softmax, P V,
// each waited for (variants 0 and 1; ConsumeOverlap below overlaps them).
template <class S>
__device__ __forceinline__ void Consume(const WgmmaAttnParams& p, int q0, int row0, int rows_total,
                                        int prefix, int kvh, int num_tiles, uint32_t sq,
                                        uint32_t pipe, uint32_t full, uint32_t empty) {
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, cq = lane % 4;
  const int wg_row0 = row0 + 64 * wg;
  ConsumerState c;
  InitState(p, c, wg_row0, rows_total, prefix);
  const uint32_t q_rows = sq + wg * 64 * 128;  // this warpgroup's Q rows in each half
  for (int it = 0; it < num_tiles; ++it) {
    const int stage = it % S::kStages;
    const uint32_t sk = pipe + stage * S::kStageBytes;
    wgmma::MbarWait(full + 8 * stage, (it / S::kStages) & 1);
    __syncwarp();  // converged after the barrier spin (the wgmma instructions are .aligned)
    IssueS<S>(c, q_rows, sk);
    wgmma::Wait<0>();
    float alpha[2];
    Softmax(c, it * kBlockN, p.scale_log2, cq, alpha);
    RescaleAndPack(c, alpha);
    IssuePv(c, sk + S::kKTileBytes);
    wgmma::Wait<0>();
    __syncwarp();
    if (lane == 0) wgmma::MbarArrive(empty + 8 * stage);  // this warp is done with the stage
  }
  WriteOut(p, c, q0, wg_row0, rows_total, kvh);
}

// wgmma::MbarWait without the trap: false after 10 s. A __trap() inside the consumers' tile loop
// makes ptxas ignore their setmaxnreg budget (the overlapped loop then spills ~200 bytes and
// serialises its wgmmas), so ConsumeOverlap traps once, after its loop.
__device__ __forceinline__ bool WaitOrTimeout(uint32_t bar, uint32_t parity) {
  if (wgmma::MbarTryWait(bar, parity)) return true;
  const uint64_t start = wgmma::GlobalTimerNs();
  while (!wgmma::MbarTryWait(bar, parity))
    if (wgmma::GlobalTimerNs() - start > 10'000'000'000ull) return false;
  return true;
}

// Named barriers of the ping-pong between the two consumer warpgroups (ids 1 and 2; 0 is
// __syncthreads): 256 threads, the waiting warpgroup's 128 (bar.sync) and the other's (bar.arrive).
__device__ __forceinline__ void NamedBarSync(int id) {
  asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void NamedBarArrive(int id) {
  asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}

// A consumer warpgroup with FlashAttention-3's intra-warpgroup overlap (variants >= 2): at tile
// it, S_it = Q K_it^T and O += P_{it-1} V_{it-1} are issued back to back (two wgmma groups), the
// softmax of S_it runs once S_it is done (wait_group 1) while P V still runs, then O is rescaled
// and P_it packed once P V is done (wait_group 0); the last tile's P V after the loop. Live at
// once: S (64 f32), O (64) and P (32 bf16x2). Holds stage it (K) and stage it - 1 (V); frees
// it - 1 after its P V. kPingPong: the two warpgroups take turns issuing their wgmmas (named
// barrier 1 + wg waited before, the other's arrived at after), so one's softmax runs under the
// other's GEMMs; warpgroup 1 starts by letting 0 go first and skips its last arrive (balanced).
// kOverlapSplitKv: K_it is waited for on full, V_{it-1} on full_v, and K_it freed (empty) as soon
// as S_it is done, V_{it-1} (empty_v) after its P V (ProduceSplit); else one barrier pair per
// stage (full_v = full, empty_v = empty unused) and the stage freed after its P V.
template <class S, bool kPingPong, bool kFast>
__device__ __forceinline__ void ConsumeOverlap(const WgmmaAttnParams& p, int q0, int row0,
                                               int rows_total, int prefix, int kvh, int num_tiles,
                                               uint32_t sq, uint32_t pipe, uint32_t full,
                                               uint32_t empty, uint32_t full_v, uint32_t empty_v) {
  const int wg = threadIdx.x / 128, lane = threadIdx.x % 32, cq = lane % 4;
  const int wg_row0 = row0 + 64 * wg;
  ConsumerState c;
  InitState(p, c, wg_row0, rows_total, prefix);
  const uint32_t q_rows = sq + wg * 64 * 128;  // this warpgroup's Q rows in each half
  if (kPingPong && wg == 1) NamedBarArrive(1);  // warpgroup 0 issues first
  // Tile 0: S, softmax, P packed (O is zero: alpha is 0 and harmless).
  bool timed_out = !WaitOrTimeout(full, 0);
  __syncwarp();
  if (kPingPong) NamedBarSync(1 + wg);
  IssueS<S>(c, q_rows, pipe);
  if (kPingPong && !(wg == 1 && num_tiles == 1)) NamedBarArrive(2 - wg);
  wgmma::Wait<0>();
  if constexpr (kOverlapSplitKv) {
    __syncwarp();
    if (lane == 0) wgmma::MbarArrive(empty);  // K_0 done with
  }
  float alpha[2];
  if constexpr (kFast)
    SoftmaxFast(c, 0, p.scale_log2, cq, alpha);
  else
    Softmax(c, 0, p.scale_log2, cq, alpha);
  RescaleAndPack(c, alpha);
  for (int it = 1; it < num_tiles; ++it) {
    const int stage = it % S::kStages, prev = (it - 1) % S::kStages;
    const uint32_t sk = pipe + stage * S::kStageBytes;
    if (!WaitOrTimeout(full + 8 * stage, (it / S::kStages) & 1) ||
        (kOverlapSplitKv && !WaitOrTimeout(full_v + 8 * prev, ((it - 1) / S::kStages) & 1))) {
      timed_out = true;
      break;
    }
    __syncwarp();  // converged after the barrier spin (the wgmma instructions are .aligned)
    if (kPingPong) NamedBarSync(1 + wg);
    IssueS<S>(c, q_rows, sk);
    IssuePv(c, pipe + prev * S::kStageBytes + S::kKTileBytes);
    if (kPingPong && !(wg == 1 && it == num_tiles - 1)) NamedBarArrive(2 - wg);
    wgmma::Wait<1>();  // S_it done, P_{it-1} V_{it-1} may still run
    if constexpr (kOverlapSplitKv) {
      __syncwarp();
      if (lane == 0) wgmma::MbarArrive(empty + 8 * stage);  // K_it done with
    }
    if constexpr (kFast)
      SoftmaxFast(c, it * kBlockN, p.scale_log2, cq, alpha);
    else
      Softmax(c, it * kBlockN, p.scale_log2, cq, alpha);
    wgmma::Wait<0>();
    __syncwarp();
    if (lane == 0) wgmma::MbarArrive((kOverlapSplitKv ? empty_v : empty) + 8 * prev);  // V_{it-1}
    // P_it's registers only after the wait: the packing must not be hoisted above it.
#pragma unroll
    for (int i = 0; i < 64; ++i) wgmma::FenceOperand(c.s[i]);
    RescaleAndPack(c, alpha);
  }
  const int last = (num_tiles - 1) % S::kStages;
  if (kOverlapSplitKv && !timed_out &&
      !WaitOrTimeout(full_v + 8 * last, ((num_tiles - 1) / S::kStages) & 1))
    timed_out = true;
  __syncwarp();
  IssuePv(c, pipe + last * S::kStageBytes + S::kKTileBytes);
  wgmma::Wait<0>();
  __syncwarp();
  if (lane == 0) wgmma::MbarArrive((kOverlapSplitKv ? empty_v : empty) + 8 * last);
  WriteOut(p, c, q0, wg_row0, rows_total, kvh);
  if (timed_out) __trap();  // a protocol bug (see wgmma::MbarWait), reported after the loop
}

// kVariant (Tuning().attention_wgmma_variant): 0 the base kernel (row tiles latest first within
// a KV head, KV heads and sequences on grid y / z); >= 1 the grid's x walks (row tile, KV head)
// with the KV heads fastest, so every head's heaviest row tiles are dispatched before any
// lighter one (longest first over the whole grid), where the K/V of every KV head fits in L2
// (WgmmaAttnParams::heads_fastest; else a head's row tiles, latest first, one head after the
// other: DeepSeek-V3's 128 heads of 8k keys are 671 MB, and heads fastest read them from HBM
// once per row tile); >= 2 intra-warpgroup overlap
// (ConsumeOverlap; the producer signals each tile as soon as it has landed, kLag 0, since the
// consumers hold two stages); 3 plus the warpgroup ping-pong; 4 and 5: 2 and 3 with
// SoftmaxFast. kTma: the TMA producer (ProduceTma) instead of the cp.async gather.
template <class S, int kVariant, bool kTma>
__global__ void __launch_bounds__(kThreads, 1)
    AttentionWgmmaKernel(const __grid_constant__ WgmmaAttnParams p) {
  constexpr int kStages = S::kStages;
  constexpr uint32_t kStageBytes = S::kStageBytes;
  // Declared 16-byte aligned so that the 1024-byte alignment is computed, not assumed.
  extern __shared__ __align__(16) unsigned char attn_wgmma_smem[];
  const uint32_t base = wgmma::SmemAddr(attn_wgmma_smem);
  const uint32_t sq = (base + 1023) & ~1023u;
  const uint32_t pipe = sq + S::kQBytes;
  const uint32_t full = pipe + kStages * kStageBytes, empty = full + 8 * kStages;
  const uint32_t full_v = empty + 8 * kStages, empty_v = full_v + 8 * kStages;  // kSplit only
  constexpr bool kSplit = kVariant >= 2 && kOverlapSplitKv;

  GridDependencyWait();  // launched with programmatic dependent launch (pdl.cuh): q and the cache
  TriggerDependents();
  const int b = blockIdx.z;
  // Latest rows first: under causality they see the most keys, so the long CTAs start early.
  // Variants >= 1 walk (row tile, KV head) on grid x, the KV heads fastest where the KV of all
  // heads fits L2 (p.heads_fastest), else the row tiles of a head (its K/V is read by all of them).
  const int x = static_cast<int>(blockIdx.x);
  const int kvh = kVariant >= 1 ? (p.heads_fastest ? x % p.kv_heads : x / p.row_tiles) : blockIdx.y;
  const int tile =
      p.row_tiles - 1 - (kVariant >= 1 ? (p.heads_fastest ? x / p.kv_heads : x % p.row_tiles) : x);
  const int row0 = tile * kBlockM;
  const int q0 = p.query_start[b];
  const int q_len = p.query_start[b + 1] - q0;
  const int rows_total = q_len * p.group;
  if (row0 >= rows_total) return;  // the whole CTA, before any barrier
  const int prefix = p.seq_lens[b] - q_len;
  const int kv_end =
      prefix + (min(row0 + kBlockM, rows_total) - 1) / p.group + 1;  // keys the tile sees
  const int num_tiles = (kv_end + kBlockN - 1) / kBlockN;

  // Q tile -> shared, rows past the sequence's zero-filled: by all threads, waited for before the
  // roles split; kTma: by the consumers only, who wait for it after the split (QReady), so the
  // producer's first K/V loads go out while Q is in flight.
  constexpr int kQThreads = kTma ? kConsumers * 128 : kThreads;
  if (threadIdx.x < kQThreads) {
    constexpr int kChunks = S::kDk / 8;  // 16-byte chunks of a Q row
    for (int idx = threadIdx.x; idx < kBlockM * kChunks; idx += kQThreads) {
      const int r = idx / kChunks, c = idx % kChunks, row = row0 + r;
      const bool valid = row < rows_total;
      const bf16_t* src = p.q;
      if (valid)
        src += (q0 + row / p.group) * p.q_token_stride +
               (kvh * p.group + row % p.group) * p.q_head_stride + c * 8;
      wgmma::CpAsync16(sq + TileChunk(kBlockM, r, c), src, valid);
    }
    wgmma::CpAsyncCommit();
  }
  // Full barriers: 128 producer arrivals a phase (cp.async), or 1 (TMA: arrive.expect_tx).
  constexpr uint32_t kFullCount = kTma ? 1 : kProducerThreads;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      wgmma::MbarInit(full + 8 * s, kFullCount);
      wgmma::MbarInit(empty + 8 * s, kConsumers * 4);
      if constexpr (kSplit) {
        wgmma::MbarInit(full_v + 8 * s, kFullCount);
        wgmma::MbarInit(empty_v + 8 * s, kConsumers * 4);
      }
    }
    wgmma::MbarInitFence();
  }
  if (kTma && threadIdx.x == kConsumers * 128) {
    wgmma::TmaPrefetchDescriptor(&p.k_map);
    wgmma::TmaPrefetchDescriptor(&p.v_map);
  }
  if constexpr (!kTma) {
    wgmma::CpAsyncWait<0>();
    wgmma::FenceProxyAsync();
  }
  __syncthreads();
  if constexpr (kVariant < 2) {
    if (threadIdx.x >= kConsumers * 128) {
      wgmma::SetMaxRegsDec<kProducerRegs>();
      if constexpr (kTma)
        ProduceTma<S, false>(p, b, kvh, kv_end, num_tiles, pipe);
      else
        Produce<S, S::kLag>(p, b, kvh, kv_end, num_tiles, pipe, full, empty);
    } else {
      wgmma::SetMaxRegsInc<kConsumerRegs>();
      if constexpr (kTma) QReady();
      Consume<S>(p, q0, row0, rows_total, prefix, kvh, num_tiles, sq, pipe, full, empty);
    }
  } else {
    if (threadIdx.x >= kConsumers * 128) {
      wgmma::SetMaxRegsDec<kOverlapProducerRegs>();
      if constexpr (kTma)
        ProduceTma<S, kSplit>(p, b, kvh, kv_end, num_tiles, pipe);
      else if constexpr (kSplit)
        ProduceSplit<S>(p, b, kvh, kv_end, num_tiles, pipe, full, empty, full_v, empty_v);
      else
        Produce<S, 0>(p, b, kvh, kv_end, num_tiles, pipe, full, empty);
    } else {
      wgmma::SetMaxRegsInc<kOverlapConsumerRegs>();
      if constexpr (kTma) QReady();
      ConsumeOverlap<S, kVariant == 3 || kVariant == 5, kVariant >= 4>(
          p, q0, row0, rows_total, prefix, kvh, num_tiles, sq, pipe, full, empty,
          kSplit ? full_v : full, kSplit ? empty_v : empty);
    }
  }
}

// One S tile and one P V tile through the same wrappers and layouts as the kernel:
// s[64][128] = q[64][128] k[128][128]^T; o[64][128] = p[64][128 keys] v[128 keys][128].
// CudaKernelTest.AttentionWgmmaTileProbe.
template <bool kWide>
__global__ void __launch_bounds__(128, 1)
    AttentionWgmmaProbeKernel(const bf16_t* q, const bf16_t* k, const bf16_t* pm, const bf16_t* v,
                              float* s_out, float* o_out) {
  extern __shared__ __align__(16) unsigned char probe_smem[];
  const uint32_t base = wgmma::SmemAddr(probe_smem);
  constexpr uint32_t kTileBytes = kVTileBytes;  // 128 x 128 bf16
  const uint32_t sq = (base + 1023) & ~1023u, sk = sq + 64 * 256, sv = sk + kTileBytes;
  const int t = threadIdx.x, warp = t / 32, lane = t % 32, g = lane / 4, cq = lane % 4;
  for (int idx = t; idx < 64 * 16; idx += 128)
    wgmma::CpAsync16(sq + TileChunk(64, idx / 16, idx % 16), q + idx * 8, true);
  for (int idx = t; idx < 128 * 16; idx += 128) {
    wgmma::CpAsync16(sk + TileChunk(128, idx / 16, idx % 16), k + idx * 8, true);
    wgmma::CpAsync16(sv + TileChunk(128, idx / 16, idx % 16), v + idx * 8, true);
  }
  wgmma::CpAsyncCommit();
  wgmma::CpAsyncWait<0>();
  wgmma::FenceProxyAsync();
  __syncthreads();
  float s[64], o[64];
#pragma unroll
  for (int i = 0; i < 64; ++i) s[i] = o[i] = 0.f;
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    wgmma::FenceOperand(s[i]);
    wgmma::FenceOperand(o[i]);
  }
  // P's A fragments straight from global: rows 16 warp + g (+8), keys 16 kk + 2 cq (+8).
  const int r = 16 * warp + g;
  uint32_t a[8][4];
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const int col = 16 * kk + 2 * cq;
    a[kk][0] = *reinterpret_cast<const uint32_t*>(pm + r * 128 + col);
    a[kk][1] = *reinterpret_cast<const uint32_t*>(pm + (r + 8) * 128 + col);
    a[kk][2] = *reinterpret_cast<const uint32_t*>(pm + r * 128 + col + 8);
    a[kk][3] = *reinterpret_cast<const uint32_t*>(pm + (r + 8) * 128 + col + 8);
  }
  wgmma::Fence();
#pragma unroll
  for (int ks = 0; ks < 8; ++ks)
    wgmma::MmaM64N128K16(s, wgmma::SmemDescSw128(sq + (ks / 4) * 64 * 128 + 32 * (ks % 4)),
                         wgmma::SmemDescSw128(sk + (ks / 4) * kHalfK + 32 * (ks % 4)), ks > 0);
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint32_t v_rows = sv + kk * 16 * 128;
    if constexpr (kWide) {
      wgmma::MmaM64N128K16RsMn(o, a[kk], wgmma::SmemDescSw128Mn(v_rows, kHalfK), true);
    } else {
      wgmma::MmaM64N64K16RsMn(*reinterpret_cast<float(*)[32]>(&o[0]), a[kk],
                              wgmma::SmemDescSw128Mn(v_rows, 0), true);
      wgmma::MmaM64N64K16RsMn(*reinterpret_cast<float(*)[32]>(&o[32]), a[kk],
                              wgmma::SmemDescSw128Mn(v_rows + kHalfK, 0), true);
    }
  }
  wgmma::Commit();
  wgmma::Wait<0>();
#pragma unroll
  for (int i = 0; i < 64; ++i) {
    wgmma::FenceOperand(s[i]);
    wgmma::FenceOperand(o[i]);
  }
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = 16 * warp + g + 8 * h, col = 8 * j + 2 * cq;
      s_out[row * 128 + col] = s[4 * j + 2 * h];
      s_out[row * 128 + col + 1] = s[4 * j + 2 * h + 1];
      o_out[row * 128 + col] = o[4 * j + 2 * h];
      o_out[row * 128 + col + 1] = o[4 * j + 2 * h + 1];
    }
}

// Sets the kernel's shared-memory attribute once per device.
template <class Kernel>
void SetSmemOnce(Kernel kernel, std::atomic<uint64_t>& set, size_t bytes) {
  int device = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  const uint64_t device_bit = uint64_t{1} << (device % 64);
  if (set.load(std::memory_order_acquire) & device_bit) return;
  COROLLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)));
  set.fetch_or(device_bit, std::memory_order_acq_rel);
}

// One build: variant 0 on grid (row tile, KV head, sequence); variants >= 1 with (row tile, KV
// head) flattened on grid x in p.heads_fastest's order.
template <class S, int kVariant, bool kTma>
void LaunchBuild(const WgmmaAttnParams& p, int row_tiles, int kv_heads, unsigned num_seqs,
                 cudaStream_t s) {
  constexpr size_t smem = kVariant >= 2 && kOverlapSplitKv ? S::kSmemBytesSplit : S::kSmemBytes;
  const auto kernel = AttentionWgmmaKernel<S, kVariant, kTma>;
  static std::atomic<uint64_t> attrs_set{0};
  SetSmemOnce(kernel, attrs_set, smem);
  if constexpr (kVariant == 0) {
    LaunchPdl(kernel, dim3(row_tiles, kv_heads, num_seqs), dim3(kThreads), smem, s, 1, p);
  } else {
    const int64_t ctas_x = static_cast<int64_t>(row_tiles) * kv_heads;
    COROLLA_CHECK(ctas_x <= 0x7fffffff) << "attention wgmma: " << ctas_x << " CTAs on grid x";
    LaunchPdl(kernel, dim3(static_cast<unsigned>(ctas_x), 1, num_seqs), dim3(kThreads), smem, s,
              1, p);
  }
}

template <class S, int kVariant>
void LaunchVariant(const WgmmaAttnParams& p, bool tma, int row_tiles, int kv_heads,
                   unsigned num_seqs, cudaStream_t s) {
  if (tma)
    LaunchBuild<S, kVariant, true>(p, row_tiles, kv_heads, num_seqs, s);
  else
    LaunchBuild<S, kVariant, false>(p, row_tiles, kv_heads, num_seqs, s);
}

// The build of Tuning().attention_wgmma_variant (4 and 5 fall back to 2 and 3 where SoftmaxFast
// cannot take the scale).
template <class S>
void LaunchShape(const WgmmaAttnParams& p, bool tma, int row_tiles, int kv_heads, unsigned num_seqs,
                 cudaStream_t s) {
  int variant = std::clamp(Tuning().attention_wgmma_variant, 0, kWgmmaVariants - 1);
  if (variant >= 4 && !(p.scale_log2 > 0.f)) variant -= 2;  // SoftmaxFast takes the max unscaled
  using Launch = void (*)(const WgmmaAttnParams&, bool, int, int, unsigned, cudaStream_t);
  static constexpr Launch kBuilds[kWgmmaVariants] = {&LaunchVariant<S, 0>, &LaunchVariant<S, 1>,
                                                     &LaunchVariant<S, 2>, &LaunchVariant<S, 3>,
                                                     &LaunchVariant<S, 4>, &LaunchVariant<S, 5>};
  kBuilds[variant](p, tma, row_tiles, kv_heads, num_seqs, s);
}

// Whether the TMA producer can serve the cache: a box of min(block_size, 128) keys starts
// 1024-aligned in the tile and never crosses a block where block_size is a power of two >= 8, a
// multiple of 128, or at least 128 with every sequence in one block (DeepSeek's decompressed
// prefill: a tile of whole keys lies inside it); both caches dense [num_blocks, Hk, block_size,
// Dk or Dv] bf16 with 16-byte aligned bases, rows addressable as int32 TMA coordinates.
bool TmaServes(const KvCacheView& cache, const AttentionBatch& batch) {
  const int bs = cache.block_size();
  const bool one_block = batch.block_tables.rank() == 2 && batch.block_tables.dim(1) == 1;
  if (BlockShift(bs) < 3 && bs % kBlockN != 0 && !(one_block && bs >= kBlockN)) return false;
  const int64_t rows = cache.k.dim(0) * cache.k.dim(1) * cache.k.dim(2);
  for (const TensorView* t : {&cache.k, &cache.v})
    if (t->dtype != DType::kBF16 || t->rank() != 4 || !t->is_contiguous() ||
        t->dim(0) * t->dim(1) * t->dim(2) != rows ||
        reinterpret_cast<uintptr_t>(t->data) % 16 != 0)
      return false;
  return rows > 0 && rows <= 0x7fffffff;
}

// Whether the flattened grid (variants >= 1) walks the KV heads fastest
// (Tuning().attention_wgmma_heads_fastest; -1: where every KV head's keys (the context's bound,
// else the query tokens) fit in a share of L2, so that the row tiles running at once, of all
// heads, find their K/V there). Otherwise a head's row tiles run together and share its K/V.
bool HeadsFastest(int kv_heads, int64_t dk, const AttentionBatch& batch, int max_q_len) {
  if (Tuning().attention_wgmma_heads_fastest >= 0)
    return Tuning().attention_wgmma_heads_fastest != 0;
  constexpr int64_t kL2KvBytes = 24 << 20;  // of the H100 / H200's 50 MB
  const int64_t keys = std::max<int64_t>(batch.max_seq_len, max_q_len);
  return kv_heads * keys * (dk + kDv) * 2 <= kL2KvBytes;
}

}  // namespace

bool AttentionWgmmaSupported() {
  int device = 0, major = 0, max_smem = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  COROLLA_CUDA_CHECK(
      cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t smem = std::max(WgmmaShape<128>::kSmemBytesSplit, WgmmaShape<192>::kSmemBytesSplit);
  return major == 9 && smem <= static_cast<size_t>(max_smem);
}

void AttentionWgmma(const TensorView& q, const KvCacheView& cache, const AttentionBatch& batch,
                    float scale_log2, const TensorView& out, cudaStream_t s) {
  const int64_t dk = q.dim(2);
  COROLLA_CHECK((dk == 128 || dk == 192) && cache.k.dim(3) == dk && out.dim(2) == kDv &&
                cache.v.dim(3) == kDv)
      << "attention wgmma: Dk " << dk << " (K cache " << cache.k.dim(3) << "), Dv " << out.dim(2)
      << " (V cache " << cache.v.dim(3) << "); the kernel is built for Dk 128 or 192, Dv " << kDv;
  const int kv_heads = static_cast<int>(cache.k.dim(1));
  const int group = static_cast<int>(q.dim(1) / kv_heads);
  const int max_q_len = batch.max_q_len > 0 ? batch.max_q_len : static_cast<int>(q.dim(0));
  const int row_tiles = static_cast<int>(CeilDiv(static_cast<int64_t>(max_q_len) * group, kBlockM));
  const int bs = cache.block_size();
  WgmmaAttnParams p{{},
                    {},
                    q.ptr<bf16_t>(),
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
                    bs,
                    BlockShift(bs),
                    scale_log2,
                    row_tiles,
                    std::min(bs, kBlockN),
                    HeadsFastest(kv_heads, dk, batch, max_q_len)};
  const bool tma = Tuning().attention_wgmma_tma && TmaServes(cache, batch);
  if (tma) {
    const int64_t rows = cache.k.dim(0) * kv_heads * bs;
    p.k_map = TensorMap2dSw128(cache.k.data, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rows, dk, dk * 2, 64,
                               p.tma_box_rows, "attention wgmma k cache");
    p.v_map = TensorMap2dSw128(cache.v.data, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, rows, kDv, kDv * 2,
                               64, p.tma_box_rows, "attention wgmma v cache");
  }
  const unsigned num_seqs = static_cast<unsigned>(batch.seq_lens.numel());
  if (dk == 192)
    LaunchShape<WgmmaShape<192>>(p, tma, row_tiles, kv_heads, num_seqs, s);
  else
    LaunchShape<WgmmaShape<128>>(p, tma, row_tiles, kv_heads, num_seqs, s);
}

void AttentionWgmmaTileProbe(const TensorView& q, const TensorView& k, const TensorView& pm,
                             const TensorView& v, const TensorView& s_out, const TensorView& o_out,
                             bool wide, cudaStream_t s) {
  auto is = [](const TensorView& t, DType dt, int64_t rows) {
    return t.dtype == dt && t.rank() == 2 && t.dim(0) == rows && t.dim(1) == 128 &&
           t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  };
  COROLLA_CHECK(is(q, DType::kBF16, 64) && is(k, DType::kBF16, 128) && is(pm, DType::kBF16, 64) &&
                is(v, DType::kBF16, 128) && is(s_out, DType::kF32, 64) &&
                is(o_out, DType::kF32, 64))
      << "attention wgmma probe: q " << q.ToString() << " k " << k.ToString() << " p "
      << pm.ToString() << " v " << v.ToString();
  constexpr size_t kProbeSmem = 1024 + 64 * 256 + 2 * kVTileBytes;
  static std::atomic<uint64_t> set_wide{0}, set_narrow{0};
  if (wide) {
    SetSmemOnce(AttentionWgmmaProbeKernel<true>, set_wide, kProbeSmem);
    AttentionWgmmaProbeKernel<true>
        <<<1, 128, kProbeSmem, s>>>(q.ptr<bf16_t>(), k.ptr<bf16_t>(), pm.ptr<bf16_t>(),
                                    v.ptr<bf16_t>(), s_out.ptr<float>(), o_out.ptr<float>());
  } else {
    SetSmemOnce(AttentionWgmmaProbeKernel<false>, set_narrow, kProbeSmem);
    AttentionWgmmaProbeKernel<false>
        <<<1, 128, kProbeSmem, s>>>(q.ptr<bf16_t>(), k.ptr<bf16_t>(), pm.ptr<bf16_t>(),
                                    v.ptr<bf16_t>(), s_out.ptr<float>(), o_out.ptr<float>());
  }
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace corolla::cuda
