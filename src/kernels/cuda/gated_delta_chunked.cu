// The gated delta rule in its chunked WY/UT form on tensor cores (prefill chunks of many tokens);
// the math is the CPU twin's ChunkedHead (kernels/cpu/linear_attention.cc). Per chunk of C = 64
// tokens from state S0 [Dk, Dv], with G_t the cumulative log decay, gamma_t = exp(G_t),
// D[t][i] = exp(G_t - G_i), q and k L2-normalised:
//   A[t][i] = beta_t D[t][i] k_t.k_i (i < t),  delta = (I + A)^-1 (beta V - diag(beta gamma) K S0),
//   O = diag(gamma) Q S0 + (D o Q K^T, i <= t) delta,   S = gamma_C S0 + (diag(D[C-1][.]) K)^T delta.
//
// CTA = (value columns [32 x, 32 x + 32), value head, sequence), 4 warps; it loops over its
// sequence's chunks with its slice of S in f32 registers (mma C fragments: warp w owns the 8
// columns [8w, 8w + 8) for all Dk rows). A C fragment becomes a B operand (S in K S0 and Q S0,
// delta in the solve, P delta and K^T delta) in registers: split into bf16 hi + lo and each
// 8x8 piece transposed by movmatrix. Per chunk:
//   1. q, k (raw bf16, the norms stay f32 scalars applied after the products), v slice, gates:
//      cp.async, K double-buffered, Q and V refilled once the chunk's products are done.
//   2. per-token scalars: 1/|q| * Dk^-0.5, 1/|k|, beta, G (log2 domain, one warp's scan).
//   3. K S0 and Q S0 (warp w: its 8 columns, all 64 tokens) -> rhs and O's first term in
//      registers; the lower 16x16 blocks of K K^T and Q K^T shared out 5 per warp -> -A,
//      P = D o Q K^T (bf16 hi + lo), A's diagonal blocks in f32, each inverted by the warp that
//      made it (forward substitution, lane = column) -> T_ii (bf16 hi + lo).
//   4. warp-local from here (its columns): blocked forward substitution over the four 16-token
//      blocks, delta_i = T_ii (rhs_i - sum_j<i A_ij delta_j); O += P delta; S = gamma S + K^T
//      (delta scaled by 1/|k| D[C-1][t]).
// Three CTA barriers per chunk. Precision: every f32 quantity used as an mma operand (S, -A, P,
// T, the solve's right side, delta) is split x = hi + lo, hi = bf16(x), lo = bf16(x - hi), and
// its products take two mma (exact bf16 q / k times hi and lo) or three (hi hi, hi lo, lo hi),
// f32 accumulation: about 2^-16 relative per operand instead of bf16's 2^-9, so the kernel
// tracks its f32 twin to near f32 accuracy (host emulation: ~5e-6 relative). Per warp and chunk
// at Dk 128 that is 332 mma instead of 196; shared memory 103.3 KB (was 102.3: S and delta no
// longer pass through it, -A, P, T gained lo copies), still two CTAs per SM. The state
// accumulates in f32 and is rounded to the state dtype once at the end. A ragged last chunk
// zero-fills its missing rows and gives them beta 0, 1/|k| 0 and log decay 0, so they add
// nothing and G_{C-1} is the last real token's.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gated_delta.h"
#include "kernels/cuda/mma.cuh"

namespace corolla::cuda {
namespace {

using namespace mma;

constexpr int kChunk = kDeltaChunkTokens;
constexpr int kCols = kDeltaChunkCols;
constexpr int kWarps = kCols / 8;  // one n8 column tile per warp
constexpr int kThreads = 32 * kWarps;
constexpr int kBlocks = kChunk / 16;  // 16-token blocks of a chunk
constexpr float kLog2e = 1.4426950408889634f;
static_assert(kChunk == 64 && kWarps == 4, "the Gram task table below assumes 4 warps and 4 blocks");

// Shared memory of one CTA, in bf16 elements unless stated. Rows are padded by 16 bytes so the
// 8 rows of an ldmatrix phase start 4 banks apart (conflict-free) and stay 16-byte aligned.
template <int kDk>
struct ChunkSmem {
  static constexpr int kQkStride = kDk + 8;      // q, k rows
  static constexpr int kColStride = kCols + 8;   // v rows
  static constexpr int kTriStride = kChunk + 8;  // -A and P rows
  static constexpr int kTStride = 24;            // T_ii rows
  static constexpr int kDiagStride = 17;         // f32 diagonal blocks of A (scalar reads only)
  static constexpr size_t kQ = 0;
  static constexpr size_t kK = kQ + sizeof(bf16_t) * kChunk * kQkStride;  // 2 stages
  static constexpr size_t kV = kK + sizeof(bf16_t) * 2 * kChunk * kQkStride;
  // -A, P and T as bf16 hi then lo (each lo array follows its hi array at kTriBytes / kTBytes).
  static constexpr size_t kTriBytes = sizeof(bf16_t) * kChunk * kTriStride;
  static constexpr size_t kTBytes = sizeof(bf16_t) * kBlocks * 16 * kTStride;
  static constexpr size_t kNegA = kV + sizeof(bf16_t) * kChunk * kColStride;
  static constexpr size_t kP = kNegA + 2 * kTriBytes;
  static constexpr size_t kT = kP + 2 * kTriBytes;
  static constexpr size_t kDiag = kT + 2 * kTBytes;
  static constexpr size_t kScalars = kDiag + sizeof(float) * kBlocks * 16 * kDiagStride;  // 4 x [C] f32
  static constexpr size_t kBytes = kScalars + sizeof(float) * 4 * kChunk;
  static_assert(kK % 16 == 0 && kV % 16 == 0 && kNegA % 16 == 0 && kP % 16 == 0 && kTriBytes % 16 == 0 &&
                    kT % 16 == 0 && kTBytes % 16 == 0 && kDiag % 16 == 0 && kScalars % 16 == 0,
                "ldmatrix and cp.async need 16-byte aligned rows");
  static_assert(kDk % 16 == 0, "K S0 steps over 16 rows of S (one state tile) per k-step");
  // Two CTAs per SM: 228 KB per SM, 1 KB of it reserved per CTA (105.7 KB at Dk 128).
  static_assert(2 * (kBytes + 1024) <= 228 * 1024, "two CTAs per SM");
};

// The 10 lower 16x16 blocks of K K^T and of Q K^T, 5 per warp; each warp's first task is the
// K K^T diagonal block it inverts.
struct GramTask {
  int8_t kk;  // 1: K K^T (-> -A), 0: Q K^T (-> P)
  int8_t bi, bj;  // token block of the rows, of the columns (bj <= bi)
};
__constant__ GramTask kGramTasks[kWarps * 5] = {
    {1, 0, 0}, {1, 1, 0}, {0, 0, 0}, {0, 1, 0}, {0, 1, 1},  // warp 0
    {1, 1, 1}, {1, 2, 0}, {1, 2, 1}, {0, 2, 0}, {0, 2, 1},  // warp 1
    {1, 2, 2}, {1, 3, 0}, {0, 2, 2}, {0, 3, 0}, {0, 3, 1},  // warp 2
    {1, 3, 3}, {1, 3, 1}, {1, 3, 2}, {0, 3, 2}, {0, 3, 3},  // warp 3
};

__device__ __forceinline__ float SoftplusF(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float StateLoad(const float* p) { return *p; }
__device__ __forceinline__ float StateLoad(const bf16_t* p) { return __bfloat162float(*p); }
__device__ __forceinline__ void StateStore(float* p, float v) { *p = v; }
__device__ __forceinline__ void StateStore(bf16_t* p, float v) { *p = __float2bfloat16(v); }  // nearest even
__device__ __forceinline__ void StorePair(bf16_t* p, float lo, float hi) {
  *reinterpret_cast<uint32_t*>(p) = PackBf16x2(lo, hi);
}
// x0, x1 (a fragment's lower and upper column) as bf16x2 hi and lo: x = hi + lo to ~2^-16.
__device__ __forceinline__ void SplitPair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
  const float2 hf = __bfloat1622float2(h);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = PackBf16x2(x0 - hf.x, x1 - hf.y);  // x - hi is exact in f32
}
// The pair stored as hi at p and lo at p + lo_offset (elements).
__device__ __forceinline__ void StoreSplit(bf16_t* p, size_t lo_offset, float x0, float x1) {
  uint32_t hi, lo;
  SplitPair(x0, x1, hi, lo);
  *reinterpret_cast<uint32_t*>(p) = hi;
  *reinterpret_cast<uint32_t*>(p + lo_offset) = lo;
}
// An 8x8 b16 matrix in the ldmatrix layout (lane l: row l / 4, columns 2 (l % 4), +1) transposed
// across the warp: lane l gets column l / 4, rows 2 (l % 4), +1.
__device__ __forceinline__ uint32_t MovTrans(uint32_t a) {
  uint32_t d;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
  return d;
}
// A 16x8 f32 C fragment (rows k, columns n: {(g, 2c), (g, 2c+1), (g+8, 2c), (g+8, 2c+1)}) as the
// B operands of m16n8k16 (k 2c..+1 and 2c+8..+9, n g), bf16 hi and lo.
__device__ __forceinline__ void CToB(const float (&x)[4], uint32_t (&hi)[2], uint32_t (&lo)[2]) {
  uint32_t h0, l0, h1, l1;
  SplitPair(x[0], x[1], h0, l0);
  SplitPair(x[2], x[3], h1, l1);
  hi[0] = MovTrans(h0);
  hi[1] = MovTrans(h1);
  lo[0] = MovTrans(l0);
  lo[1] = MovTrans(l1);
}
// d += a b for a = ah + al, b = bh + bl (the al bl term, ~2^-16 of the product, left out).
__device__ __forceinline__ void Mma3(float (&d)[4], const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                     const uint32_t (&bh)[2], const uint32_t (&bl)[2]) {
  Mma16816(d, al, bh[0], bh[1]);
  Mma16816(d, ah, bl[0], bl[1]);
  Mma16816(d, ah, bh[0], bh[1]);
}

template <int kDk, typename StateT>
__global__ void __launch_bounds__(kThreads, 2) GatedDeltaChunkedKernel(const __grid_constant__ DeltaRuleParams p) {
  using L = ChunkSmem<kDk>;
  constexpr int kQkStride = L::kQkStride, kColStride = L::kColStride, kTriStride = L::kTriStride;
  constexpr int kTStride = L::kTStride, kDiagStride = L::kDiagStride;
  constexpr int kRowChunks = kDk / 8;  // 16-byte pieces of a q/k row
  constexpr int kStateTiles = kDk / 16;

  const int seq = blockIdx.z, h = blockIdx.y, col0 = blockIdx.x * kCols;
  const int begin = p.query_start[seq], end = p.query_start[seq + 1], len = end - begin;
  if (len <= 0 || len < p.min_tokens || len >= p.max_tokens) return;  // the recurrent kernel's sequence
  const int32_t slot = p.slots[seq];
  if (slot < 0 || slot >= p.num_slots) return;  // whole CTA: no barrier is skipped by part of it
  const bool fresh = p.seq_lens[seq] == len;

  extern __shared__ __align__(16) unsigned char smem[];
  bf16_t* sQ = reinterpret_cast<bf16_t*>(smem + L::kQ);          // [C][kQkStride]
  bf16_t* sK = reinterpret_cast<bf16_t*>(smem + L::kK);          // [2][C][kQkStride]
  bf16_t* sV = reinterpret_cast<bf16_t*>(smem + L::kV);          // [C][kColStride]
  constexpr size_t kTriLo = L::kTriBytes / sizeof(bf16_t), kTLo = L::kTBytes / sizeof(bf16_t);  // lo offsets
  bf16_t* sNegA = reinterpret_cast<bf16_t*>(smem + L::kNegA);    // [2][C][kTriStride], -A hi, lo
  bf16_t* sP = reinterpret_cast<bf16_t*>(smem + L::kP);          // [2][C][kTriStride], P hi, lo
  bf16_t* sT = reinterpret_cast<bf16_t*>(smem + L::kT);          // [2][4][16][kTStride], T_ii hi, lo
  float* sDiag = reinterpret_cast<float*>(smem + L::kDiag);      // [4][16][kDiagStride], A_ii
  float* sQinv = reinterpret_cast<float*>(smem + L::kScalars);   // [C] 1/|q| Dk^-0.5 (0 past the chunk)
  float* sKinv = sQinv + kChunk;                                  // [C] 1/|k|
  float* sBeta = sKinv + kChunk;                                  // [C]
  float* sG = sBeta + kChunk;                                     // [C] G_t log2(e)

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, c = lane % 4;
  const int wc = warp * 8;  // this warp's first column of the slice
  const int kh = h / p.group;
  const float decay_rate = -expf(p.a_log[h]) * kLog2e;
  const float dt_bias = p.dt_bias[h];
  StateT* S = static_cast<StateT*>(p.state) + (static_cast<int64_t>(slot) * p.hv + h) * kDk * p.dv + col0;

  // Chunk loads: rows past the chunk's n tokens are zero-filled.
  auto load_k = [&](int tok0, int n, bf16_t* dst) {
    for (int idx = tid; idx < kChunk * kRowChunks; idx += kThreads) {
      const int r = idx / kRowChunks, ch = idx % kRowChunks;
      const bool valid = r < n;
      const bf16_t* src = valid ? p.k + static_cast<int64_t>(tok0 + r) * p.k_token_stride + kh * p.k_head_stride + ch * 8 : p.k;
      CpAsync16(dst + r * kQkStride + ch * 8, src, valid);
    }
  };
  auto load_qv = [&](int tok0, int n) {
    for (int idx = tid; idx < kChunk * kRowChunks; idx += kThreads) {
      const int r = idx / kRowChunks, ch = idx % kRowChunks;
      const bool valid = r < n;
      const bf16_t* src = valid ? p.q + static_cast<int64_t>(tok0 + r) * p.q_token_stride + kh * p.q_head_stride + ch * 8 : p.q;
      CpAsync16(sQ + r * kQkStride + ch * 8, src, valid);
    }
    for (int idx = tid; idx < kChunk * (kCols / 8); idx += kThreads) {
      const int r = idx / (kCols / 8), ch = idx % (kCols / 8);
      const bool valid = r < n;
      const bf16_t* src =
          valid ? p.v + static_cast<int64_t>(tok0 + r) * p.v_token_stride + h * p.v_head_stride + col0 + ch * 8 : p.v;
      CpAsync16(sV + r * kColStride + ch * 8, src, valid);
    }
  };
  // Raw gate inputs a, b of tokens 2 lane, 2 lane + 1 of a chunk (warp 0), a chunk ahead.
  float gate_a[2] = {0.f, 0.f}, gate_b[2] = {0.f, 0.f};
  auto load_gates = [&](int tok0, int n) {
    if (warp != 0) return;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int t = 2 * lane + j;
      gate_a[j] = t < n ? __bfloat162float(p.a[static_cast<int64_t>(tok0 + t) * p.a_stride + h]) : 0.f;
      gate_b[j] = t < n ? __bfloat162float(p.b[static_cast<int64_t>(tok0 + t) * p.b_stride + h]) : 0.f;
    }
  };

  const int num_chunks = (len + kChunk - 1) / kChunk;
  load_k(begin, min(kChunk, len), sK);
  load_qv(begin, min(kChunk, len));
  CpAsyncCommit();
  load_gates(begin, min(kChunk, len));

  // The state slice: element e of tile mt is row 16 mt + g + 8 (e / 2), column wc + 2c + e % 2.
  float st[kStateTiles][4];
#pragma unroll
  for (int mt = 0; mt < kStateTiles; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * mt + g + 8 * (e / 2), col = wc + 2 * c + (e & 1);
      st[mt][e] = fresh ? 0.f : StateLoad(S + static_cast<int64_t>(row) * p.dv + col);
    }

  for (int ci = 0; ci < num_chunks; ++ci) {
    const int tok0 = begin + ci * kChunk, n = min(kChunk, end - tok0);
    const bool more = ci + 1 < num_chunks;
    const int next0 = tok0 + kChunk, next_n = more ? min(kChunk, end - next0) : 0;
    const bf16_t* sKc = sK + (ci & 1) * kChunk * kQkStride;
    CpAsyncWait<0>();
    __syncthreads();  // the chunk's q/k/v landed; every warp is done with the previous chunk
    if (more) {
      load_k(next0, next_n, sK + ((ci + 1) & 1) * kChunk * kQkStride);
      CpAsyncCommit();
    }

    // ---- per-token scalars -------------------------------------------------------------
    {
      const int r = tid / 2, half = tid % 2;  // two threads per token row
      const bf16_t* qr = sQ + r * kQkStride + half * (kDk / 2);
      const bf16_t* kr = sKc + r * kQkStride + half * (kDk / 2);
      float qss = 0.f, kss = 0.f;
#pragma unroll
      for (int i = 0; i < kDk / 16; ++i) {
        float fq[8], fk[8];
        Unpack8(*reinterpret_cast<const Bf16x8*>(qr + 8 * i), fq);
        Unpack8(*reinterpret_cast<const Bf16x8*>(kr + 8 * i), fk);
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          qss += fq[j] * fq[j];
          kss += fk[j] * fk[j];
        }
      }
      qss += __shfl_xor_sync(0xffffffffu, qss, 1);
      kss += __shfl_xor_sync(0xffffffffu, kss, 1);
      if (half == 0) {
        sQinv[r] = r < n ? rsqrtf(qss + 1e-6f) * p.scale : 0.f;
        sKinv[r] = r < n ? rsqrtf(kss + 1e-6f) : 0.f;
      }
    }
    if (warp == 0) {
      // log2 decays and betas of tokens 2 lane, 2 lane + 1; G by an inclusive warp scan.
      float lg[2], beta[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const bool valid = 2 * lane + j < n;
        lg[j] = valid ? decay_rate * SoftplusF(gate_a[j] + dt_bias) : 0.f;
        beta[j] = valid ? 1.f / (1.f + expf(-gate_b[j])) : 0.f;
      }
      const float pair = lg[0] + lg[1];
      float incl = pair;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const float y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += y;
      }
      sG[2 * lane] = incl - pair + lg[0];
      sG[2 * lane + 1] = incl;
      sBeta[2 * lane] = beta[0];
      sBeta[2 * lane + 1] = beta[1];
      if (more) load_gates(next0, next_n);
    }
    __syncthreads();  // scalars visible

    // ---- K S0, Q S0 over this warp's columns: rhs and O's first term --------------------
    float rhs[kBlocks][4], o[kBlocks][4];
#pragma unroll
    for (int mt = 0; mt < kBlocks; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) rhs[mt][e] = o[mt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < kStateTiles; ++kk) {
      // B = S rows 16 kk .. +15 (k) x this warp's 8 columns (n): state tile kk, hi and lo.
      uint32_t bh[2], bl[2];
      CToB(st[kk], bh, bl);
#pragma unroll
      for (int mt = 0; mt < kBlocks; ++mt) {
        const int dcol = 16 * kk + (lane / 16) * 8;
        uint32_t ak[4], aq[4];
        LdMatrixX4(ak, sKc + (16 * mt + lane % 16) * kQkStride + dcol);
        LdMatrixX4(aq, sQ + (16 * mt + lane % 16) * kQkStride + dcol);
        Mma16816(rhs[mt], ak, bl[0], bl[1]);
        Mma16816(o[mt], aq, bl[0], bl[1]);
        Mma16816(rhs[mt], ak, bh[0], bh[1]);
        Mma16816(o[mt], aq, bh[0], bh[1]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < kBlocks; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * mt + g + 8 * (e / 2), col = wc + 2 * c + (e & 1);
        const float gamma = exp2f(sG[r]);
        rhs[mt][e] = sBeta[r] * (__bfloat162float(sV[r * kColStride + col]) - gamma * sKinv[r] * rhs[mt][e]);
        o[mt][e] *= gamma * sQinv[r];
      }

    // ---- lower blocks of K K^T and Q K^T -> -A, P; A_ii in f32 ---------------------------
    for (int task = 0; task < 5; ++task) {
      const GramTask gt = kGramTasks[warp * 5 + task];
      const bf16_t* x = gt.kk ? sKc : sQ;
      float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
      for (int ks = 0; ks < kDk / 16; ++ks) {
        // A: rows 16 bi.. of x; B (K^T as "col"): K rows 16 bj.., two n8 tiles per x4.
        uint32_t af[4], bk[4];
        LdMatrixX4(af, x + (16 * gt.bi + lane % 16) * kQkStride + 16 * ks + (lane / 16) * 8);
        LdMatrixX4(bk, sKc + (16 * gt.bj + (lane / 16) * 8 + lane % 8) * kQkStride + 16 * ks + ((lane / 8) % 2) * 8);
        Mma16816(acc[0], af, bk[0], bk[1]);
        Mma16816(acc[1], af, bk[2], bk[3]);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int r = 16 * gt.bi + g + 8 * hr;
          float val[2];
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            const int i = 16 * gt.bj + 8 * nt + 2 * c + j;
            const float decay = i <= r ? exp2f(sG[r] - sG[i]) : 0.f;
            const float dot = acc[nt][2 * hr + j];
            val[j] = gt.kk ? (i < r ? sBeta[r] * sKinv[r] * sKinv[i] * decay * dot : 0.f)
                           : sQinv[r] * sKinv[i] * decay * dot;
          }
          const int i0 = 16 * gt.bj + 8 * nt + 2 * c;
          if (gt.kk) {
            StoreSplit(sNegA + r * kTriStride + i0, kTriLo, -val[0], -val[1]);
            if (gt.bi == gt.bj) {
              float* d = sDiag + r * kDiagStride + (i0 - 16 * gt.bj);  // block bi's rows are rows r
              d[0] = val[0];
              d[1] = val[1];
            }
          } else {
            StoreSplit(sP + r * kTriStride + i0, kTriLo, val[0], val[1]);
          }
        }
    }
    __syncwarp();
    {
      // T_ww = (I + A_ww)^-1 by forward substitution; lane % 16 = column (lanes 16-31 repeat it).
      const float* a_blk = sDiag + warp * 16 * kDiagStride;
      const int col = lane % 16;
      float t[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        float x = i == col ? 1.f : 0.f;
#pragma unroll
        for (int j = 0; j < i; ++j) x -= a_blk[i * kDiagStride + j] * t[j];
        t[i] = x;
      }
      if (lane < 16) {
#pragma unroll
        for (int i = 0; i < 16; ++i) {
          const bf16_t hi = __float2bfloat16(t[i]);
          sT[(warp * 16 + i) * kTStride + col] = hi;
          sT[kTLo + (warp * 16 + i) * kTStride + col] = __float2bfloat16(t[i] - __bfloat162float(hi));
        }
      }
    }
    __syncthreads();  // -A, P, T visible; every warp is done with sQ and sV
    if (more) {
      load_qv(next0, next_n);
      CpAsyncCommit();
    }

    // ---- delta by blocked forward substitution (this warp's columns, in registers) ----------
    // dh/dl: delta's B fragments (block bj's tokens as k, this warp's columns as n), hi and lo;
    // sh/sl: the same of delta scaled by 1/|k_t| D[C-1][t] for the state update.
    const float g_last = sG[kChunk - 1];
    uint32_t dh[kBlocks][2], dl[kBlocks][2], sh[kBlocks][2], sl[kBlocks][2];
#pragma unroll
    for (int bi = 0; bi < kBlocks; ++bi) {
      float x[4] = {rhs[bi][0], rhs[bi][1], rhs[bi][2], rhs[bi][3]};
#pragma unroll
      for (int bj = 0; bj < bi; ++bj) {
        uint32_t ah[4], al[4];
        const bf16_t* a = sNegA + (16 * bi + lane % 16) * kTriStride + 16 * bj + (lane / 16) * 8;
        LdMatrixX4(ah, a);
        LdMatrixX4(al, a + kTriLo);
        Mma3(x, ah, al, dh[bj], dl[bj]);
      }
      uint32_t xh[2], xl[2], th[4], tl[4];
      CToB(x, xh, xl);
      const bf16_t* t = sT + (16 * bi + lane % 16) * kTStride + (lane / 16) * 8;
      LdMatrixX4(th, t);
      LdMatrixX4(tl, t + kTLo);
      float d[4] = {0.f, 0.f, 0.f, 0.f};
      Mma3(d, th, tl, xh, xl);
      CToB(d, dh[bi], dl[bi]);
      float ds[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = 16 * bi + g + 8 * (e / 2);
        ds[e] = d[e] * sKinv[r] * exp2f(g_last - sG[r]);
      }
      CToB(ds, sh[bi], sl[bi]);
    }

    // ---- O += P delta; write the chunk's outputs ------------------------------------------
#pragma unroll
    for (int mt = 0; mt < kBlocks; ++mt) {
#pragma unroll
      for (int kt = 0; kt <= mt; ++kt) {
        uint32_t ph[4], pl[4];
        const bf16_t* a = sP + (16 * mt + lane % 16) * kTriStride + 16 * kt + (lane / 16) * 8;
        LdMatrixX4(ph, a);
        LdMatrixX4(pl, a + kTriLo);
        Mma3(o[mt], ph, pl, dh[kt], dl[kt]);
      }
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const int r = 16 * mt + g + 8 * hr;
        if (r < n)
          StorePair(p.out + static_cast<int64_t>(tok0 + r) * p.out_token_stride + h * p.out_head_stride + col0 + wc + 2 * c,
                    o[mt][2 * hr], o[mt][2 * hr + 1]);
      }
    }

    // ---- S = gamma_last S + K^T delta_scaled ----------------------------------------------
    const float gamma_last = exp2f(g_last);
#pragma unroll
    for (int mt = 0; mt < kStateTiles; ++mt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) st[mt][e] *= gamma_last;
#pragma unroll
      for (int kt = 0; kt < kBlocks; ++kt) {
        // A = K^T (rows: key dims 16 mt.., columns: tokens 16 kt..) from K stored [token][dim]:
        // matrices (dims +0, tokens +0), (dims +8, tokens +0), (dims +0, tokens +8), (dims +8,
        // tokens +8), transposed, so lane l addresses token 16 kt + l % 8 + 8 (l / 16), dims
        // 16 mt + 8 ((l / 8) % 2).
        uint32_t af[4];
        LdMatrixX4Trans(af, sKc + (16 * kt + lane % 8 + 8 * (lane / 16)) * kQkStride + 16 * mt + 8 * ((lane / 8) % 2));
        Mma16816(st[mt], af, sl[kt][0], sl[kt][1]);
        Mma16816(st[mt], af, sh[kt][0], sh[kt][1]);
      }
    }
  }

#pragma unroll
  for (int mt = 0; mt < kStateTiles; ++mt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * mt + g + 8 * (e / 2), col = wc + 2 * c + (e & 1);
      StateStore(S + static_cast<int64_t>(row) * p.dv + col, st[mt][e]);
    }
}

// The key head dims the chunked kernel is built for (the recurrent kernel takes the rest).
using ChunkedHeadDims = HeadDimList<32, 64, 128>;

template <int kDk, typename StateT>
void Launch(const DeltaRuleParams& p, int num_seqs, cudaStream_t s) {
  constexpr size_t kSmem = ChunkSmem<kDk>::kBytes;
  static const bool configured = [] {
    COROLLA_CUDA_CHECK(cudaFuncSetAttribute(GatedDeltaChunkedKernel<kDk, StateT>,
                                            cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem)));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>(p.dv / kCols), static_cast<unsigned>(p.hv), static_cast<unsigned>(num_seqs));
  GatedDeltaChunkedKernel<kDk, StateT><<<grid, kThreads, kSmem, s>>>(p);
}

bool Aligned(const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

}  // namespace

bool GatedDeltaChunkedSupports(int dk, const DeltaRuleParams& p) {
  const bool dims = DispatchHeadDim(dk, ChunkedHeadDims{}, [](auto) {}) && p.dv % kCols == 0;
  const bool rows16 = Aligned(p.q, 16) && Aligned(p.k, 16) && Aligned(p.v, 16) && p.q_token_stride % 8 == 0 &&
                      p.q_head_stride % 8 == 0 && p.k_token_stride % 8 == 0 && p.k_head_stride % 8 == 0 &&
                      p.v_token_stride % 8 == 0 && p.v_head_stride % 8 == 0;
  const bool out_pairs = Aligned(p.out, 4) && p.out_token_stride % 2 == 0 && p.out_head_stride % 2 == 0;
  return dims && rows16 && out_pairs;
}

void LaunchGatedDeltaChunked(const DeltaRuleParams& p, int dk, bool bf16_state, int num_seqs, cudaStream_t s) {
  const bool ok = DispatchHeadDim(dk, ChunkedHeadDims{}, [&](auto d) {
    if (bf16_state)
      Launch<decltype(d)::value, bf16_t>(p, num_seqs, s);
    else
      Launch<decltype(d)::value, float>(p, num_seqs, s);
  });
  COROLLA_CHECK(ok) << "chunked gated delta rule: key head dim " << dk << " is not in its table (32, 64, 128)";
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace corolla::cuda
