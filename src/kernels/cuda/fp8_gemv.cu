// FP8 GEMV (Backend::LinearFp8 for 1..8 rows of x, one launch): out[M, N] = x[M, K] . W[N, K]^T
// with W e4m3 in 128 x 128 scaled blocks. A decode step is a weight stream, and e4m3 weights are
// half bf16's bytes. Each CTA quantises all of x into shared memory the way backend.h's contract
// says (per row and 128-column group: sx = max(amax, 1e-4) / 448, q = e4m3(x / sx)), then its
// warps stream tasks of kRows rows of W (16-byte loads of 16 e4m3, software-pipelined passes as
// gemv.cu) and sum per chunk of 16 columns sum_k q w, scaled by sx * sw of the chunk's group.
// The grid is at most one CTA per SM (shared memory holds M x K bytes of q), each warp walking
// tasks with the grid's stride, so x is quantised once per SM; the first two passes of weight
// loads are in flight while it is (the first before the programmatic dependency wait).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <atomic>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/fp8_gemm.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/pdl.cuh"

namespace corolla::cuda {
namespace {

constexpr int kGroup = static_cast<int>(kFp8Block);
constexpr int kMaxWarps = 16;                 // warps per CTA (the host may launch fewer)
constexpr int kLoadsPerPass = 4;              // 16-byte weight loads per lane in one pass
constexpr int kChunk = 16;                    // e4m3 per 16-byte load
constexpr int kWarpCols = 32 * kChunk;        // columns one load per lane covers: 512
constexpr int kQuantPairs = 16;               // (row, group) pairs of x a warp loads before quantising
constexpr int kStaticSmemLimit = 48 * 1024;   // dynamic shared memory without the opt-in

struct Fp8GemvParams {
  const bf16_t* x;  // [m, k], row stride x_stride
  int64_t x_stride;
  const uint8_t* w;      // [n, k] e4m3, contiguous
  const float* w_scale;  // [ceil(n / 128), groups], row stride w_scale_stride
  int64_t w_scale_stride;
  void* out;  // [m, n] bf16 or f32, row stride out_stride
  int64_t out_stride;
  int m, n, k, groups;
  int num_tasks;  // ceil(n / kRows): task t is rows t * kRows .. t * kRows + kRows - 1 of W
  int q_offset;   // bytes of dynamic shared memory before q (the scales sx, 16-byte aligned)
  bool out_f32;
};

// Four e4m3 (the little-endian bytes of u) to f32, exactly (e4m3 -> f16 -> f32).
__device__ __forceinline__ void Fp8x4ToFloat(uint32_t u, float* f) {
  const __half2 lo(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u & 0xffffu), __NV_E4M3));
  const __half2 hi(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(u >> 16), __NV_E4M3));
  const float2 a = __half22float2(lo), b = __half22float2(hi);
  f[0] = a.x;
  f[1] = a.y;
  f[2] = b.x;
  f[3] = b.y;
}

// v / s rounded to nearest even, from inv = RN(1 / s): q0 = RN(v inv) is within an ulp of v / s,
// r = v - q0 s is exact (fma), and RN(q0 + r inv) is the correctly rounded quotient (Markstein's
// correction). Three operations instead of a division; checked on the host against x / s for
// every bf16 x and every bf16 amax: identical wherever |x / s| > 2^-12 (below, both round to a
// zero of e4m3, possibly of the other sign).
__device__ __forceinline__ float DivideRn(float v, float s, float inv) {
  const float q0 = __fmul_rn(v, inv);
  const float r = __fmaf_rn(-q0, s, v);
  return __fmaf_rn(r, inv, q0);
}

// kM: rows of x the instance holds accumulators for (p.m <= kM); kRows: rows of W per task.
template <int kM, int kRows>
__global__ void __launch_bounds__(kMaxWarps * 32, 1) Fp8GemvKernel(const __grid_constant__ Fp8GemvParams p) {
  constexpr int kUnroll = kLoadsPerPass / kRows;  // chunks of each row per pass
  constexpr int kPass = kUnroll * kWarpCols;      // columns of a row one pass covers
  extern __shared__ __align__(16) uint8_t smem[];
  float* sx = reinterpret_cast<float*>(smem);  // [m, groups]
  uint8_t* q = smem + p.q_offset;              // [m, k] e4m3
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int task_stride = gridDim.x * warps;

  // Pass (t, c): chunks c + j * 512 + lane * 16 (j < kUnroll) of task t's rows (rows past N
  // read row N - 1; their sums are dropped), and each chunk's weight block scale (a task's
  // rows lie in one 128-row block: kRows divides 128). Chunks past K are left unloaded.
  auto load_pass = [&](int t, int c, uint4(&wv)[kUnroll][kRows], float(&sw)[kUnroll]) {
    const int n0 = t * kRows;
    const float* scale_row = p.w_scale + static_cast<int64_t>(n0 / kGroup) * p.w_scale_stride;
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int col = c + j * kWarpCols + lane * kChunk;
      if (col >= p.k) break;
      sw[j] = __ldg(scale_row + col / kGroup);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int64_t row = min(n0 + r, p.n - 1);
        wv[j][r] = __ldcs(reinterpret_cast<const uint4*>(p.w + row * p.k + col));  // read once
      }
    }
  };
  // The pass after (t, c): the next columns of the task, else the warp's next task.
  auto advance = [&](int& t, int& c) {
    c += kPass;
    if (c >= p.k) {
      c = 0;
      t += task_stride;
    }
  };

  int task = blockIdx.x * warps + warp, c0 = 0;
  uint4 wv[kUnroll][kRows], nv[kUnroll][kRows];
  float sw[kUnroll], nsw[kUnroll];
  if (task < p.num_tasks) load_pass(task, c0, wv, sw);  // weights: before the wait
  GridDependencyWait();                                  // x is the previous kernel's output
  TriggerDependents();
  int next_task = task, next_c0 = c0;
  advance(next_task, next_c0);
  if (next_task < p.num_tasks) load_pass(next_task, next_c0, nv, nsw);

  // x quantised into shared memory: a half-warp per (row, group), lane l of the half holding
  // columns 8 l .. 8 l + 7 (K % 16 == 0: all in or all out); each warp issues the loads of
  // kQuantPairs / 2 steps, 2 pairs each, before it reduces any (x comes from L2: latency-bound).
  const int half_lane = lane % 16, pairs = p.m * p.groups;
  for (int base = warp * kQuantPairs; base < pairs; base += warps * kQuantPairs) {
    uint4 u[kQuantPairs / 2];
#pragma unroll
    for (int i = 0; i < kQuantPairs / 2; ++i) {
      const int pair = base + 2 * i + lane / 16, row = pair / p.groups, col = pair % p.groups * kGroup + half_lane * 8;
      u[i] = pair < pairs && col < p.k ? *reinterpret_cast<const uint4*>(p.x + row * p.x_stride + col)
                                       : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < kQuantPairs / 2; ++i) {
      const int pair = base + 2 * i + lane / 16, row = pair / p.groups, g = pair % p.groups;
      const int col = g * kGroup + half_lane * 8;
      const uint32_t words[4] = {u[i].x, u[i].y, u[i].z, u[i].w};
      float v[8];
      float amax = 0.f;
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // bf16 -> f32 is a shift
        v[2 * e] = __uint_as_float(words[e] << 16);
        v[2 * e + 1] = __uint_as_float(words[e] & 0xffff0000u);
        amax = fmaxf(amax, fmaxf(fabsf(v[2 * e]), fabsf(v[2 * e + 1])));
      }
#pragma unroll
      for (int o = 8; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));  // the half's
      const float s = fmaxf(amax, kFp8MinAmax) / kFp8Max;
      const float inv = 1.0f / s;
      if (pair < pairs && col < p.k) {
        uint32_t packed[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const uint32_t lo = __nv_cvt_float2_to_fp8x2(
              make_float2(DivideRn(v[4 * e], s, inv), DivideRn(v[4 * e + 1], s, inv)), __NV_SATFINITE, __NV_E4M3);
          const uint32_t hi = __nv_cvt_float2_to_fp8x2(
              make_float2(DivideRn(v[4 * e + 2], s, inv), DivideRn(v[4 * e + 3], s, inv)), __NV_SATFINITE, __NV_E4M3);
          packed[e] = lo | hi << 16;
        }
        *reinterpret_cast<uint2*>(q + row * p.k + col) = make_uint2(packed[0], packed[1]);
        if (half_lane == 0) sx[row * p.groups + g] = s;
      }
    }
  }
  __syncthreads();
  if (task >= p.num_tasks) return;

  float acc[kM][kRows] = {};
  while (true) {
    // Pass (task, c0), held in wv / sw; pass (next_task, next_c0) is in flight in nv / nsw.
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      const int col = c0 + j * kWarpCols + lane * kChunk;
      if (col >= p.k) break;
      const int g = col / kGroup;
      // Half a chunk (8 columns) at a time, so a task can hold 4 rows: each row's 8 weights
      // converted once for every row of x, each row of x's 8 once for every weight row.
      float dot[kM][kRows] = {};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float wf[kRows][kChunk / 2];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          Fp8x4ToFloat(h == 0 ? wv[j][r].x : wv[j][r].z, wf[r]);
          Fp8x4ToFloat(h == 0 ? wv[j][r].y : wv[j][r].w, wf[r] + 4);
        }
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          if (m >= p.m) break;
          const uint2 xq = *reinterpret_cast<const uint2*>(q + m * p.k + col + h * (kChunk / 2));
          float xf[kChunk / 2];
          Fp8x4ToFloat(xq.x, xf);
          Fp8x4ToFloat(xq.y, xf + 4);
#pragma unroll
          for (int r = 0; r < kRows; ++r)
#pragma unroll
            for (int i = 0; i < kChunk / 2; ++i) dot[m][r] = fmaf(wf[r][i], xf[i], dot[m][r]);
        }
      }
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        if (m >= p.m) break;
        const float scale = sx[m * p.groups + g] * sw[j];
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[m][r] = fmaf(dot[m][r], scale, acc[m][r]);
      }
    }
    if (next_task != task) {  // the task's last pass: out[m, n0 + r] from lane m * kRows + r
      const int n0 = task * kRows;
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float sum = WarpSum(acc[m][r]);
          acc[m][r] = 0.f;
          if (lane != m * kRows + r || m >= p.m || n0 + r >= p.n) continue;
          const int64_t o = m * p.out_stride + n0 + r;
          if (p.out_f32) static_cast<float*>(p.out)[o] = sum;
          else static_cast<bf16_t*>(p.out)[o] = __float2bfloat16(sum);
        }
    }
    if (next_task >= p.num_tasks) break;
    task = next_task;
    c0 = next_c0;
#pragma unroll
    for (int j = 0; j < kUnroll; ++j) {
      sw[j] = nsw[j];
#pragma unroll
      for (int r = 0; r < kRows; ++r) wv[j][r] = nv[j][r];
    }
    advance(next_task, next_c0);
    if (next_task < p.num_tasks) load_pass(next_task, next_c0, nv, nsw);
  }
}

template <int kM, int kRows>
void Launch(const Fp8GemvParams& p, int ctas, int warps, int smem, int device, int max_smem, cudaStream_t s) {
  const auto kernel = Fp8GemvKernel<kM, kRows>;
  // Function attributes are per device: opt in to the device's shared memory once on each.
  static std::atomic<uint64_t> attrs_set{0};
  const uint64_t device_bit = uint64_t{1} << (device % 64);
  if (smem > kStaticSmemLimit && !(attrs_set.load(std::memory_order_acquire) & device_bit)) {
    COROLLA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, max_smem));
    attrs_set.fetch_or(device_bit, std::memory_order_acq_rel);
  }
  LaunchPdl(kernel, dim3(ctas), dim3(warps * 32), static_cast<size_t>(smem), s, 1, p);
}

}  // namespace

bool LinearFp8Gemv(const TensorView& x, const TensorView& w, const TensorView& w_scale, const TensorView& out,
                   cudaStream_t s) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  if (m < 1 || m > 8 || m > Tuning().linear_fp8_gemv_max_rows) return false;
  const int64_t groups = (k + kGroup - 1) / kGroup, n_blocks = (n + kGroup - 1) / kGroup;
  COROLLA_CHECK(x.dtype == DType::kBF16 && x.rank() == 2 && x.strides[1] == 1 && w.dtype == DType::kF8E4M3 &&
                w.rank() == 2 && w.dim(1) == k && w.is_contiguous() && w_scale.dtype == DType::kF32 &&
                w_scale.rank() == 2 && w_scale.dim(0) == n_blocks && w_scale.dim(1) == groups &&
                w_scale.strides[1] == 1 && (out.dtype == DType::kBF16 || out.dtype == DType::kF32) &&
                out.rank() == 2 && out.dim(0) == m && out.dim(1) == n && out.strides[1] == 1)
      << "linear fp8 gemv x " << x.ToString() << " w " << w.ToString() << " w_scale " << w_scale.ToString() << " out "
      << out.ToString();
  // 16-byte rows of W and of q in shared memory, 8-byte loads of x (4 bf16 of one group).
  if (n == 0 || k == 0 || k % kChunk != 0 || n > (int64_t{1} << 30) || k > (int64_t{1} << 24) ||
      reinterpret_cast<uintptr_t>(x.data) % 16 != 0 || reinterpret_cast<uintptr_t>(w.data) % 16 != 0 ||
      (m > 1 && x.strides[0] % 8 != 0))
    return false;
  int device = 0, sms = 0, max_smem = 0;
  COROLLA_CUDA_CHECK(cudaGetDevice(&device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  COROLLA_CUDA_CHECK(cudaDeviceGetAttribute(&max_smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const int64_t q_offset = (m * groups * 4 + 15) / 16 * 16, smem = q_offset + m * k;
  if (smem > max_smem) return false;  // M x K bytes of q must fit (8 x 18432 on an H200 do)

  // Rows of W per task: from 3 rows of x on, converting x's chunks is what bounds the speed,
  // so 4 (3-4 rows of x, while that leaves >= 8 warps per SM a task: 32 KB of loads in
  // flight) or 2 (registers: 5-8 rows); for 1-2 rows of x 2 once every warp slot of the GPU
  // still gets a task, else 1 (more warps streaming). Warps per CTA and CTAs so that each warp
  // has the same number of tasks, iters, or one fewer; at least 4 warps, which share the
  // quantisation.
  const int64_t slots = static_cast<int64_t>(sms) * kMaxWarps;
  const int rows = m >= 3 && m <= 4 && (n + 3) / 4 >= slots / 2 ? 4 : m >= 3 || (n + 1) / 2 >= slots ? 2 : 1;
  const int64_t tasks = (n + rows - 1) / rows;
  const int64_t iters = (tasks + slots - 1) / slots;
  const int warps = static_cast<int>(std::clamp<int64_t>((tasks + sms * iters - 1) / (sms * iters), 4, kMaxWarps));
  const int ctas = CeilDiv(tasks, warps * iters);
  Fp8GemvParams p{x.ptr<bf16_t>(),
                  m > 1 ? x.strides[0] : k,
                  w.ptr<uint8_t>(),
                  w_scale.ptr<float>(),
                  w_scale.strides[0],
                  out.data,
                  m > 1 ? out.strides[0] : n,
                  static_cast<int>(m),
                  static_cast<int>(n),
                  static_cast<int>(k),
                  static_cast<int>(groups),
                  static_cast<int>(tasks),
                  static_cast<int>(q_offset),
                  out.dtype == DType::kF32};
  auto launch = [&](auto m_tag, auto rows_tag) {
    Launch<decltype(m_tag)::value, decltype(rows_tag)::value>(p, ctas, warps, static_cast<int>(smem), device,
                                                               max_smem, s);
  };
  auto with_rows = [&](auto m_tag) {
    if constexpr (decltype(m_tag)::value == 4) {  // rows 4: 3-4 rows of x only
      if (rows == 4) return launch(m_tag, std::integral_constant<int, 4>{});
    }
    if (rows == 2) launch(m_tag, std::integral_constant<int, 2>{});
    else launch(m_tag, std::integral_constant<int, 1>{});
  };
  if (m == 1) with_rows(std::integral_constant<int, 1>{});
  else if (m == 2) with_rows(std::integral_constant<int, 2>{});
  else if (m <= 4) with_rows(std::integral_constant<int, 4>{});
  else with_rows(std::integral_constant<int, 8>{});
  return true;
}

}  // namespace corolla::cuda
