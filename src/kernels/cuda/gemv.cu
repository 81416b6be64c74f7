// Linear for a few rows of x: memory-bound, so the kernel is a weight stream. Each warp owns
// kRows rows of W [N, K]; every lane loads its 16-byte chunks of those rows (two passes of
// kUnroll chunks ahead of the arithmetic) and multiplies them with the same chunks of each of the M rows of
// x (read through L1: every warp of the grid reads the same few rows). Warp reductions give
// out[m, n] for the warp's rows, written by lane m * kRows + r.
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"

namespace corolla::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kLoadsInFlight = 8;  // 16-byte weight loads per lane issued before their arithmetic
constexpr int kOneWaveBlocks = 5;  // CTAs an SM must hold for GemvKernel<1, 2>'s grids to be one wave

struct GemvParams {
  const bf16_t* x;
  int64_t x_stride;
  const bf16_t* w;
  void* out;
  int64_t out_stride;
  int m, n, k;
  bool out_f32;
};

// kRows rows of W per warp (fewer rows, more CTAs: the host picks kRows so that small N still
// fills the GPU). Software-pipelined: a pass of kLoadsInFlight / kRows chunks of each row is in
// flight while the previous pass is multiplied, so each lane has up to 2 kLoadsInFlight 16-byte
// loads outstanding. The first pass is issued before GridDependencyWait (weights are not written
// by any kernel): under programmatic dependent launch it overlaps the previous kernel's tail.
// kMinBlocks > 1 caps the registers so that many CTAs fit an SM (kOneWaveBlocks below).
template <int kM, int kRows, int kMinBlocks = 1>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks) GemvKernel(const __grid_constant__ GemvParams p) {
  constexpr int kUnroll = kLoadsInFlight / kRows;
  constexpr int kPass = kUnroll * 32 * 8;  // columns of a row one pass of the warp covers
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = (blockIdx.x * kWarps + warp) * kRows;
  const bool active = n0 < p.n;
  const bf16_t* rows[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) rows[r] = p.w + static_cast<int64_t>(min(n0 + r, p.n - 1)) * p.k;
  // Chunks c0 + j * 256 (j < kUnroll) of each row; those past K are left unloaded (and unused).
  auto load_pass = [&](int c0, Bf16x8 (&wv)[kUnroll][kRows]) {
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int c = c0 + j * 32 * 8;
      if (c >= p.k) break;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint4 u = __ldcs(reinterpret_cast<const uint4*>(rows[r] + c));  // read once: stream past the caches
        memcpy(&wv[j][r], &u, sizeof(u));
      }
    }
  };
  Bf16x8 wv[kUnroll][kRows];
  if (active) load_pass(lane * 8, wv);
  GridDependencyWait();  // x is the previous kernel's output
  TriggerDependents();
  if (!active) return;
  float acc[kM][kRows] = {};
  // With one or two rows of x, their chunks are loaded at the start of the pass (before any
  // use); more rows are read at their use (registers).
  constexpr bool kPrefetchX = kM <= 2;
  for (int c0 = lane * 8; c0 < p.k; c0 += kPass) {
    Bf16x8 xv[kUnroll][kPrefetchX ? kM : 1];
    if constexpr (kPrefetchX)
#pragma unroll
      for (int j = 0; j < kUnroll; ++j) {
        const int c = c0 + j * 32 * 8;
        if (c >= p.k) break;
#pragma unroll
        for (int m = 0; m < kM; ++m)
          if (m < p.m) xv[j][m] = *reinterpret_cast<const Bf16x8*>(p.x + m * p.x_stride + c);
      }
    Bf16x8 next[kUnroll][kRows];
    const bool more = c0 + kPass < p.k;
    if (more) load_pass(c0 + kPass, next);
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int c = c0 + j * 32 * 8;
      if (c >= p.k) break;
      float wf[kRows][8];
#pragma unroll
      for (int r = 0; r < kRows; ++r) Unpack8(wv[j][r], wf[r]);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        if (m >= p.m) break;
        float xf[8];
        if constexpr (kPrefetchX) Unpack8(xv[j][m], xf);
        else Unpack8(*reinterpret_cast<const Bf16x8*>(p.x + m * p.x_stride + c), xf);
#pragma unroll
        for (int r = 0; r < kRows; ++r)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[m][r] = fmaf(wf[r][i], xf[i], acc[m][r]);
      }
    }
    if (more)
#pragma unroll
      for (int j = 0; j < kUnroll; ++j)
#pragma unroll
        for (int r = 0; r < kRows; ++r) wv[j][r] = next[j][r];
  }
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[m][r] = WarpSum(acc[m][r]);
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (lane != m * kRows + r || m >= p.m || n0 + r >= p.n) continue;
      const int64_t o = m * p.out_stride + n0 + r;
      if (p.out_f32) static_cast<float*>(p.out)[o] = acc[m][r];
      else static_cast<bf16_t*>(p.out)[o] = __float2bfloat16(acc[m][r]);
    }
}

}  // namespace

bool LinearGemv(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t s) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  if (m > Tuning().linear_gemv_max_rows) return false;
  COROLLA_CHECK(x.dtype == DType::kBF16 && w.dtype == DType::kBF16 &&
                (out.dtype == DType::kBF16 || out.dtype == DType::kF32) && x.rank() == 2 && w.rank() == 2 &&
                out.rank() == 2 && w.dim(1) == k && out.dim(0) == m && out.dim(1) == n && w.is_contiguous() &&
                x.strides[1] == 1 && out.strides[1] == 1)
      << "linear x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  if (m < 1 || m > 8 || m > Tuning().linear_gemv_max_rows || k % 8 != 0 ||
      reinterpret_cast<uintptr_t>(x.data) % 16 != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0 ||
      (m > 1 && x.strides[0] % 8 != 0))
    return false;
  GemvParams p{x.ptr<bf16_t>(), m > 1 ? x.strides[0] : k, w.ptr<bf16_t>(), out.data, m > 1 ? out.strides[0] : n,
               static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), out.dtype == DType::kF32};
  // Rows per warp: 4 while that leaves >= 4 CTAs per SM (132 SMs), else 2, else 1.
  const int rows = n >= 4 * 132 * kWarps * 4 ? 4 : n >= 4 * 132 * kWarps * 2 ? 2 : 1;
  auto launch = [&](auto m_tag, auto rows_tag) {
    constexpr int kM = decltype(m_tag)::value, kRows = decltype(rows_tag)::value;
    const dim3 grid(CeilDiv(n, kWarps * kRows));
    // One row, two rows a warp (the 4224 <= N < 8448 band: qkv at Qwen3-30B-A3B, 640 CTAs): at
    // 102 registers 4 CTAs fit an SM (528 on an H200), so the grid ran in two waves; capped at
    // 96 (no spills) 5 fit and it is one.
    if constexpr (kM == 1 && kRows == 2) {
      if (Tuning().gemv_one_wave) {
        LaunchPdl(GemvKernel<kM, kRows, kOneWaveBlocks>, grid, dim3(kWarps * 32), 0, s, 1, p);
        return;
      }
    }
    LaunchPdl(GemvKernel<kM, kRows>, grid, dim3(kWarps * 32), 0, s, 1, p);
  };
  auto with_rows = [&](auto m_tag) {
    if (rows == 4) launch(m_tag, std::integral_constant<int, 4>{});
    else if (rows == 2) launch(m_tag, std::integral_constant<int, 2>{});
    else launch(m_tag, std::integral_constant<int, 1>{});
  };
  if (m == 1) with_rows(std::integral_constant<int, 1>{});
  else if (m == 2) with_rows(std::integral_constant<int, 2>{});
  else if (m <= 4) with_rows(std::integral_constant<int, 4>{});
  else with_rows(std::integral_constant<int, 8>{});
  return true;
}

}  // namespace corolla::cuda
