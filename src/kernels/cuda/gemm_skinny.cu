// Linear for a few rows of x past the GEMV's (3-16: the dense projections of a decode step of a
// few sequences) on the tensor cores, as a weight stream. There cuBLASLt reads W at 1.1-2.2 TB/s
// on an H100 (o_proj 4096 -> 2048 at 8 rows: 14.1 us for 16.8 MB; the router 11 us for 0.5 MB)
// and cannot start before the kernel ahead of it ends, and the SIMT GEMV (gemv.cu) spends an
// FMA on every weight and row, which past 2 rows costs more than its bytes.
//
// A warp owns 16 rows of W [N, K] and a range of K, streamed into mma.sync as skinny_stream.cuh
// describes. The first block of W is loaded before the dependency wait (programmatic dependent
// launch: it overlaps the previous kernel's tail). The warps of a row tile split K and sum their
// tiles through shared memory in warp order (deterministic, no atomics). Rows of x past M
// multiply zeros.
#include <algorithm>
#include <atomic>
#include <string>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"
#include "kernels/cuda/skinny_stream.cuh"
#include "kernels/cuda/timeline.cuh"
#include "kernels/cuda/timeline.h"
#include "kernels/cuda/tuning.h"

namespace corolla::cuda {
namespace {

constexpr int kSkinnyWarps = skinny::kWarps;
constexpr int kSkinnyStep = skinny::kStep;

std::atomic<int64_t> launches{0};

struct SkinnyParams {
  const bf16_t* x;
  int64_t x_stride;
  const bf16_t* w;
  void* out;
  int64_t out_stride;
  int m, n, k;
  int k_parts;  // warps a row tile (a power of two <= kSkinnyWarps)
  int k_part;   // columns a warp (a multiple of kSkinnyStep)
  bool out_f32;
  uint64_t* timeline = nullptr;  // timeline.h
};

// kRowTiles row tiles of x: M <= 8 kRowTiles.
template <int kRowTiles>
__global__ void __launch_bounds__(kSkinnyWarps * 32, 2)
    SkinnyMmaKernel(const __grid_constant__ SkinnyParams p) {
  __shared__ float4 partial[kSkinnyWarps][kRowTiles][32];
  TimelineScope tl(p.timeline);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int tile = blockIdx.x * (kSkinnyWarps / p.k_parts) + warp / p.k_parts;
  const int n0 = tile * 16;
  const bool active = n0 < p.n;
  const int k_begin = (warp % p.k_parts) * p.k_part, k_end = min(p.k, k_begin + p.k_part);
  // Rows past N load row N - 1 (their outputs are dropped).
  const bf16_t* w_lo = p.w + static_cast<int64_t>(min(n0 + g, p.n - 1)) * p.k + 8 * c;
  const bf16_t* w_hi = p.w + static_cast<int64_t>(min(n0 + g + 8, p.n - 1)) * p.k + 8 * c;
  skinny::WBlocks w;
  skinny::LoadW(w_lo, w_hi, active, k_begin, k_end, w);
  GridDependencyWait();  // x is the previous kernel's output
  tl.Waited();
  TriggerDependents();
  auto has_row = [&](int t) { return g + 8 * t < p.m; };
  auto x_row = [&](int t) { return p.x + (g + 8 * t) * p.x_stride + 8 * c; };
  float acc[kRowTiles][4] = {};
  skinny::Stream<kRowTiles>(w, w_lo, w_hi, active, has_row, x_row, k_begin, k_end, acc);
  skinny::StoreParts<kRowTiles>(partial, acc);
  // The first warp of each row tile writes the sums out.
  if (!active || warp % p.k_parts != 0) return;
#pragma unroll
  for (int t = 0; t < kRowTiles; ++t) {
    const float4 v = skinny::PartsSum<kRowTiles>(partial, t, p.k_parts);
    const float s[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int row = 8 * t + 2 * c + (i & 1), col = n0 + g + (i >= 2 ? 8 : 0);
      if (row >= p.m || col >= p.n) continue;
      const int64_t at = row * p.out_stride + col;
      if (p.out_f32)
        static_cast<float*>(p.out)[at] = s[i];
      else
        static_cast<bf16_t*>(p.out)[at] = __float2bfloat16(s[i]);
    }
  }
}

// CTAs of SkinnyMmaKernel<kRowTiles> the device holds at once (the first device asked: every
// GPU of a process is one model).
template <int kRowTiles>
int SkinnyCapacity() {
  static const int capacity = [] {
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, SkinnyMmaKernel<kRowTiles>,
                                                      kSkinnyWarps * 32, 0) != cudaSuccess) {
      (void)cudaGetLastError();
      return 132;
    }
    return std::max(1, sms * per_sm);
  }();
  return capacity;
}

}  // namespace

bool LinearSkinny(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t s) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  if (m <= Tuning().linear_gemv_max_rows || m > Tuning().linear_mma_max_rows || m > 16)
    return false;
  // Anything else (other dtypes, layouts, shapes) is left to cuBLASLt, which checks it.
  if (x.dtype != DType::kBF16 || w.dtype != DType::kBF16 ||
      (out.dtype != DType::kBF16 && out.dtype != DType::kF32) || x.rank() != 2 || w.rank() != 2 ||
      out.rank() != 2 || w.dim(1) != k || out.dim(0) != m || out.dim(1) != n || x.strides[1] != 1 ||
      out.strides[1] != 1 || k % 8 != 0 || !w.is_contiguous() || x.strides[0] % 8 != 0 ||
      reinterpret_cast<uintptr_t>(x.data) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(w.data) % 16 != 0 || n >= (int64_t{1} << 31) / 16 ||
      k > (1 << 30))
    return false;
  const int64_t tiles = CeilDiv(n, 16);
  // Split K (a warp a part, up to a CTA's warps) until the grid has skinny::kTargetWarps, while it
  // stays one wave and a warp keeps at least one step of columns: qkv at 8 rows (320 row tiles)
  // in 8 parts took two waves and ran slower than cuBLASLt (session 38).
  const int capacity = m <= 8 ? SkinnyCapacity<1>() : SkinnyCapacity<2>();
  int parts = 1;
  while (parts < kSkinnyWarps && tiles * parts < skinny::kTargetWarps &&
         k > int64_t{parts} * kSkinnyStep && CeilDiv(tiles, kSkinnyWarps / (parts * 2)) <= capacity)
    parts *= 2;
  SkinnyParams p{x.ptr<bf16_t>(),
                 x.strides[0],
                 w.ptr<bf16_t>(),
                 out.data,
                 out.strides[0],
                 static_cast<int>(m),
                 static_cast<int>(n),
                 static_cast<int>(k),
                 parts,
                 CeilDiv(CeilDiv(k, parts), kSkinnyStep) * kSkinnyStep,
                 out.dtype == DType::kF32};
  const dim3 grid(static_cast<unsigned>(CeilDiv(tiles, kSkinnyWarps / parts)));
  if (TimelineOn())
    p.timeline =
        TimelineRecord("Skinny " + std::to_string(k) + "->" + std::to_string(n), grid.x, s);
  launches.fetch_add(1, std::memory_order_relaxed);
  if (m <= 8)
    LaunchPdl(SkinnyMmaKernel<1>, grid, dim3(kSkinnyWarps * 32), 0, s, 1, p);
  else
    LaunchPdl(SkinnyMmaKernel<2>, grid, dim3(kSkinnyWarps * 32), 0, s, 1, p);
  return true;
}

int64_t LinearSkinnyLaunches() { return launches.load(std::memory_order_relaxed); }

}  // namespace corolla::cuda
