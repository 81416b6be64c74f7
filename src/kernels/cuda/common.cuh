// Device helpers shared by the CUDA kernels: bf16 <-> f32, 16-byte vectors of 8 bf16, warp
// reductions, and the table-driven dispatch of compile-time head dims. Device code only.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cuda_check.h"
#include "tensor/tensor.h"

namespace corolla::cuda {

using bf16_t = __nv_bfloat16;

// Eight bf16 in one 16-byte load/store.
struct alignas(16) Bf16x8 {
  __nv_bfloat162 h[4];
};

__device__ __forceinline__ void Unpack8(const Bf16x8& v, float f[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 p = __bfloat1622float2(v.h[i]);
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}
__device__ __forceinline__ Bf16x8 Pack8(const float f[8]) {
  Bf16x8 v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
  return v;
}

// A 4 x 4 transpose of 32-bit words across the four lanes of a quad (lanes 4i .. 4i + 3): lane q
// holds w[j], and leaves with v[s] = lane s's w[q]. Two shuffle stages (partners q ^ 2, q ^ 1),
// each swapping the two words whose index bit differs from the lane's. The whole warp must call
// it. An mma / wgmma accumulator fragment holds, per row, 2 columns of each 8-column group in each
// of a quad's lanes; with w[j] the bf16 pair of group j0 + j, lane q leaves with all 8 columns of
// group j0 + q, one 16-byte store instead of four 4-byte ones.
__device__ __forceinline__ void QuadTranspose(uint32_t (&w)[4]) {
  const int q = threadIdx.x % 4;
#pragma unroll
  for (int bit = 2; bit >= 1; bit /= 2) {
    const bool hi = (q & bit) != 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (j & bit) continue;
      // Pair (j, j | bit): a lane keeps the word whose index bit matches its own and sends the
      // other; what it receives lands in the sent word's slot.
      const uint32_t send = hi ? w[j] : w[j | bit];
      const uint32_t got = __shfl_xor_sync(0xffffffffu, send, bit);
      if (hi)
        w[j] = got;
      else
        w[j | bit] = got;
    }
  }
}

// Stores an mma / wgmma accumulator fragment's rows as bf16, 16 bytes a lane: rows r0 and r0 + 8
// (r0 = the fragment's first row + lane / 4) of `out` [.., n], kGroups 8-column groups from col0,
// pair(j, h) the bf16 pair this lane holds of group j in row r0 + 8 h. Rows >= rows and columns
// >= n (whole groups: n % 8 == 0) are not written. The whole warp must call it.
template <int kGroups, class Pair>
__device__ __forceinline__ void StoreFragmentBf16(bf16_t* out, int n, int rows, int r0, int col0,
                                                  Pair pair) {
  static_assert(kGroups % 4 == 0, "whole quads of 8-column groups");
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = r0 + 8 * h;
    bf16_t* row = out + static_cast<int64_t>(r) * n;
#pragma unroll
    for (int j0 = 0; j0 < kGroups; j0 += 4) {
      uint32_t w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const __nv_bfloat162 v = pair(j0 + j, h);
        memcpy(&w[j], &v, 4);
      }
      QuadTranspose(w);
      const int col = col0 + 8 * (j0 + static_cast<int>(threadIdx.x % 4));
      if (r < rows && col < n)
        *reinterpret_cast<uint4*>(row + col) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// Eight bf16 as floats: from shared memory in one 128-bit load (a Bf16x8 copy can split into
// four 32-bit loads), or from global memory through L2 (.cg: data an earlier kernel of the stream
// wrote, which the read-only .nc path must not see under programmatic dependent launch).
__device__ __forceinline__ void LoadShared8(const bf16_t* p, float f[8]) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  Bf16x8 v;
  memcpy(&v, &u, sizeof(u));
  Unpack8(v, f);
}
// Eight bf16 to shared or global memory in one 128-bit store (a Bf16x8 assignment can split into
// four 32-bit stores: four-way bank conflicts in shared memory, 4-byte pieces to global).
__device__ __forceinline__ void Store8(bf16_t* p, const Bf16x8& v) {
  uint4 u;
  memcpy(&u, &v, sizeof(u));
  *reinterpret_cast<uint4*>(p) = u;
}
__device__ __forceinline__ void LoadCg8(const bf16_t* p, float f[8]) {
  const uint4 u = __ldcg(reinterpret_cast<const uint4*>(p));
  Bf16x8 v;
  memcpy(&v, &u, sizeof(u));
  Unpack8(v, f);
}
// Norm weights [c, c + 8) as floats: bf16, or f32 (w_f32; Qwen3.5's norms); c a multiple of 8.
__device__ __forceinline__ void NormWeight8(const void* w, bool w_f32, int64_t c, float f[8]) {
  if (w_f32) {
    const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(w) + c);
    const float4 lo = q[0], hi = q[1];
    f[0] = lo.x, f[1] = lo.y, f[2] = lo.z, f[3] = lo.w, f[4] = hi.x, f[5] = hi.y, f[6] = hi.z, f[7] = hi.w;
  } else {
    Unpack8(*reinterpret_cast<const Bf16x8*>(static_cast<const bf16_t*>(w) + c), f);
  }
}
// RmsNorm with the residual (sum += y; x = rmsnorm(sum) * w) folded into a kernel that reads x:
// the staged GEMV (RmsNormLinear) and the staged router (RmsNormMoeRouter).
struct ResidualNorm {
  const bf16_t* y;  // [T, H] (T = 1 but for the cluster norm-router's)
  bf16_t* sum;      // [T, H]: read, then written (sum + y) once no CTA / warp reads it any more
  const void* w;    // [H] bf16, or f32 with w_f32
  bool w_f32;
  float eps;
  bf16_t* x;  // [T, H]: the normed rows
};
// The fused ops' norm arguments, checked (bf16 rows [T, H] each, a bf16 or f32 weight of H); false
// where a layout rules the fused kernels out (not contiguous, not 16-byte aligned). y null
// (NormLinear: sum already holds the row to norm) leaves norm->y null.
inline bool MakeResidualNorm(const TensorView* y, const TensorView& norm_w, float eps, const TensorView& sum,
                             const TensorView& x, ResidualNorm* norm) {
  COROLLA_CHECK(x.rank() == 2 && x.dim(0) >= 1 && x.dtype == DType::kBF16 &&
                (y == nullptr || (y->dtype == DType::kBF16 && y->shape == x.shape)) &&
                sum.dtype == DType::kBF16 && sum.shape == x.shape &&
                (norm_w.dtype == DType::kBF16 || norm_w.dtype == DType::kF32) &&
                norm_w.numel() == x.dim(1))
      << "residual norm y " << (y ? y->ToString() : "none") << " sum " << sum.ToString() << " x "
      << x.ToString() << " norm " << norm_w.ToString();
  for (const TensorView* t : {y, &sum, &x, &norm_w})
    if (t != nullptr && (!t->is_contiguous() || reinterpret_cast<uintptr_t>(t->data) % 16 != 0)) return false;
  *norm = {y ? y->ptr<bf16_t>() : nullptr, sum.ptr<bf16_t>(), norm_w.data, norm_w.dtype == DType::kF32, eps,
           x.ptr<bf16_t>()};
  return true;
}

// RmsNorm's scaling of eight columns: bf16(w * (h * inv)), h the summed row as floats, w the norm
// weights (NormWeight8), inv = 1 / rms (RmsNormKernel's rounding).
__device__ __forceinline__ Bf16x8 NormScale8(const float w[8], const float h[8], float inv) {
  float a[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] = w[i] * (h[i] * inv);
  return Pack8(a);
}
// The same for columns c.. of a ResidualNorm row.
__device__ __forceinline__ Bf16x8 NormScale8(const ResidualNorm& n, int64_t c, const float h[8], float inv) {
  float w[8];
  NormWeight8(n.w, n.w_f32, c, w);
  return NormScale8(w, h, inv);
}

// RmsNorm's residual add of eight columns: h = bf16(y + sum) (y and sum read through L2),
// returned packed, and as floats in a.
__device__ __forceinline__ Bf16x8 ResidualAdd8(const bf16_t* y, const bf16_t* sum, float a[8]) {
  float b[8];
  LoadCg8(y, a);
  LoadCg8(sum, b);
#pragma unroll
  for (int i = 0; i < 8; ++i) a[i] += b[i];
  const Bf16x8 h = Pack8(a);
  Unpack8(h, a);
  return h;
}

// The order of f32 values as unsigned keys (larger float, larger key; NaN not ordered).
__device__ __forceinline__ unsigned OrderedKey(float v) {
  const unsigned u = __float_as_uint(v);
  return u & 0x80000000u ? ~u : u | 0x80000000u;
}
template <int kWidth = 32>
__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int o = kWidth / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o, kWidth);
  return v;
}
__device__ __forceinline__ float WarpMax(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// The CTA's sum of v (every thread gets it): warp sums, then warp 0's lanes add them. The same
// order wherever it is called with the same block size (RmsNorm and the fused norms rely on it).
__device__ __forceinline__ float BlockSum(float v) {
  __shared__ float partial[32];
  v = WarpSum(v);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const int num_warps = blockDim.x / 32;
  v = lane < num_warps ? partial[lane] : 0.0f;
  v = WarpSum(v);
  __syncthreads();  // partial[] may be reused by the next call
  return v;
}

// out[n] for kRows consecutive rows of a staged slice (`w`, shared), x in shared memory (the
// staged GEMV of gemv.cu, the cluster norm-router of router_norm.cu): each
// lane sums its 16-byte chunks lane * 8 + j * 256 into kSets interleaved partial sums per row
// (kRows * kSets independent FMA chains: with a few warps an SM the multiply is latency-bound),
// then a warp sum; every lane gets the row sums.
template <int kRows>
__device__ __forceinline__ void StagedDot(const bf16_t* w, const bf16_t* x, int k, int lane, float (&out)[kRows]) {
  constexpr int kSets = kRows >= 3 ? 1 : 4 / kRows;
  float acc[kSets][kRows] = {};
  auto dot_chunk = [&](int c, float (&a)[kRows]) {
    float xf[8];
    LoadShared8(x + c, xf);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float wf[8];
      LoadShared8(w + static_cast<int64_t>(r) * k + c, wf);
#pragma unroll
      for (int i = 0; i < 8; ++i) a[r] = fmaf(wf[i], xf[i], a[r]);
    }
  };
  int c = lane * 8;
#pragma unroll 2
  for (; c + (kSets - 1) * 32 * 8 < k; c += kSets * 32 * 8)
#pragma unroll
    for (int s = 0; s < kSets; ++s) dot_chunk(c + s * 32 * 8, acc[s]);
#pragma unroll
  for (int s = 0; s + 1 < kSets; ++s)
    if (c + s * 32 * 8 < k) dot_chunk(c + s * 32 * 8, acc[s]);
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float v = acc[0][r];
#pragma unroll
    for (int s = 1; s < kSets; ++s) v += acc[s][r];
    out[r] = WarpSum(v);
  }
}

// True when every row of a 2-D-ish view (innermost contiguous) starts 16-byte aligned and the
// row length is a multiple of 8 bf16: the kernels then use Bf16x8 accesses.
inline bool Vectorisable(const TensorView& t, int64_t row_len) {
  if (row_len % 8 != 0) return false;
  if (reinterpret_cast<uintptr_t>(t.data) % 16 != 0) return false;
  for (int i = 0; i + 1 < t.rank(); ++i)
    if (t.strides[i] % 8 != 0) return false;
  return true;
}

inline int CeilDiv(int64_t a, int64_t b) { return static_cast<int>((a + b - 1) / b); }
inline bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
// log2 of a power-of-two KV block size (the kernels shift), else -1 (they divide).
inline int BlockShift(int block_size) {
  if (block_size <= 0 || (block_size & (block_size - 1)) != 0) return -1;
  int shift = 0;
  while ((1 << shift) < block_size) ++shift;
  return shift;
}
// Where `key` of a sequence sits in a paged cache: its physical block (from the sequence's row
// of the block table) and its slot in that block; block_shift from BlockShift.
struct PagedSlot {
  int64_t block;
  int in_block;
};
__device__ __forceinline__ PagedSlot LocateKey(const int32_t* table, int key, int block_size, int block_shift) {
  const int blk = block_shift >= 0 ? key >> block_shift : key / block_size;
  const int in_blk = block_shift >= 0 ? key & (block_size - 1) : key - blk * block_size;
  return {table[blk], in_blk};
}

// The one table of head dims the attention/norm kernels are specialised for.
template <int... kDims>
struct HeadDimList {};
using SupportedHeadDims = HeadDimList<32, 64, 128, 256>;

// Calls fn(std::integral_constant<int, D>{}) for the D == head_dim in the table; false if none.
template <typename Fn, int... kDims>
bool DispatchHeadDim(int head_dim, HeadDimList<kDims...>, Fn&& fn) {
  bool found = false;
  ((head_dim == kDims ? (fn(std::integral_constant<int, kDims>{}), found = true) : false), ...);
  return found;
}
template <typename Fn>
bool DispatchHeadDim(int head_dim, Fn&& fn) {
  return DispatchHeadDim(head_dim, SupportedHeadDims{}, static_cast<Fn&&>(fn));
}

}  // namespace corolla::cuda
