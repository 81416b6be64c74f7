#include "kernels/cuda/fp8_gemm.h"

#include <cuda_fp8.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "base/logging.h"
#include "kernels/backend.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace corolla::cuda {
namespace {

constexpr int kGroup = static_cast<int>(kFp8Block);
constexpr int kWarpsPerCta = 8;

__device__ __forceinline__ float Fp8ToFloat(uint8_t bits) {
  __nv_fp8_e4m3 v;
  v.__x = bits;
  return static_cast<float>(v);
}

struct QuantParams {
  const bf16_t* x;
  int64_t ldx;          // row stride of x (elements)
  int64_t rows, rows4;  // T, T4
  int64_t k;
  int64_t groups;  // ceil(K / 128)
  uint8_t* q;      // [T4, K]
  float* scales;   // [groups, T4]
};

// One warp per (row, group), rows outermost so neighbouring warps read one row. Each lane holds
// 4 elements (lane + 32 j): the warp's max gives amax; the quotient x / s is IEEE (no fast
// math), rounded to e4m3 nearest-even with saturation, as the CPU twin does.
__global__ __launch_bounds__(kWarpsPerCta * 32) void QuantizeFp8Kernel(const __grid_constant__ QuantParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  if (pair >= p.rows4 * p.groups) return;
  const int64_t t = pair / p.groups, g = pair % p.groups, k0 = g * kGroup;
  float v[kGroup / 32];
  float amax = 0.0f;
#pragma unroll
  for (int j = 0; j < kGroup / 32; ++j) {
    const int64_t k = k0 + lane + 32 * j;
    v[j] = t < p.rows && k < p.k ? __bfloat162float(p.x[t * p.ldx + k]) : 0.0f;
    amax = fmaxf(amax, fabsf(v[j]));
  }
  amax = WarpMax(amax);
  const float s = fmaxf(amax, kFp8MinAmax) / kFp8Max;
#pragma unroll
  for (int j = 0; j < kGroup / 32; ++j) {
    const int64_t k = k0 + lane + 32 * j;
    if (k < p.k) p.q[t * p.k + k] = __nv_cvt_float_to_fp8(v[j] / s, __NV_SATFINITE, __NV_E4M3);
  }
  if (lane == 0) p.scales[g * p.rows4 + t] = s;
}

struct SimtParams {
  const uint8_t* q;       // [T4, K]
  const float* scales;    // [groups, T4]
  const uint8_t* w;       // [N, K]
  const float* w_scale;   // [ceil(N/128), groups], row stride w_scale_ld
  bf16_t* out;            // [T, N], row stride ldo
  int64_t rows, rows4, n, k, w_scale_ld, ldo;
};

// One warp per output column n (8 per CTA), grid-strided over rows t. Lane chunks are 16
// bytes, each inside one 128-column group (16 divides 128), so a chunk's dot product takes its
// group's two scales directly.
template <bool kVec>
__global__ __launch_bounds__(kWarpsPerCta * 32) void LinearFp8SimtKernel(const __grid_constant__ SimtParams p) {
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerCta + threadIdx.x / 32;
  if (n >= p.n) return;
  const uint8_t* wr = p.w + n * p.k;
  const float* sw = p.w_scale + (n / kGroup) * p.w_scale_ld;
  for (int64_t t = blockIdx.y; t < p.rows; t += gridDim.y) {
    const uint8_t* xr = p.q + t * p.k;
    float acc = 0.0f;
    for (int64_t k0 = lane * 16; k0 < p.k; k0 += 32 * 16) {
      const int64_t g = k0 / kGroup;
      float dot = 0.0f;
      if constexpr (kVec) {
        const uint4 a = *reinterpret_cast<const uint4*>(xr + k0);
        const uint4 b = *reinterpret_cast<const uint4*>(wr + k0);
        const uint32_t av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 16; ++i)
          dot += Fp8ToFloat(static_cast<uint8_t>(av[i / 4] >> (8 * (i % 4)))) *
                 Fp8ToFloat(static_cast<uint8_t>(bv[i / 4] >> (8 * (i % 4))));
      } else {
        for (int i = 0; i < 16 && k0 + i < p.k; ++i) dot += Fp8ToFloat(xr[k0 + i]) * Fp8ToFloat(wr[k0 + i]);
      }
      acc += dot * (p.scales[g * p.rows4 + t] * sw[g]);
    }
    acc = WarpSum(acc);
    if (lane == 0) p.out[t * p.ldo + n] = __float2bfloat16(acc);
  }
}

// out[l * n + r] = w_scale[(r / 128) * ld + l]: one thread per output, r fastest.
__global__ void ExpandFp8WeightScalesKernel(const float* __restrict__ w_scale, int64_t ld, int64_t n, int64_t groups,
                                            float* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * groups) return;
  const int64_t l = i / n, r = i % n;
  out[i] = w_scale[(r / kGroup) * ld + l];
}

// 32 x 32 tiles through shared memory: reads dt rows (t fastest), writes out rows (n fastest).
constexpr int kTile = 32, kTileRows = 8;
__global__ __launch_bounds__(kTile* kTileRows) void TransposeBf16Kernel(const bf16_t* __restrict__ dt, int64_t ldt,
                                                                        bf16_t* __restrict__ out, int64_t ldo,
                                                                        int64_t rows, int64_t n) {
  __shared__ bf16_t tile[kTile][kTile + 1];
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * kTile, n0 = static_cast<int64_t>(blockIdx.y) * kTile;
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int64_t nn = n0 + j, t = t0 + threadIdx.x;
    if (nn < n && t < rows) tile[j][threadIdx.x] = dt[nn * ldt + t];
  }
  __syncthreads();
  for (int j = threadIdx.y; j < kTile; j += kTileRows) {
    const int64_t t = t0 + j, nn = n0 + threadIdx.x;
    if (t < rows && nn < n) out[t * ldo + nn] = tile[threadIdx.x][j];
  }
}

int Log2Align(const void* ptr) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  int bits = 0;
  while (bits < 8 && ((a >> bits) & 1) == 0) ++bits;  // capped at 256 bytes
  return bits;
}

}  // namespace

void QuantizeFp8Groups(const TensorView& x, const TensorView& q, const TensorView& scales, cudaStream_t s) {
  const int64_t rows = x.dim(0), k = x.dim(1), groups = (k + kGroup - 1) / kGroup, rows4 = q.dim(0);
  COROLLA_CHECK(x.dtype == DType::kBF16 && x.rank() == 2 && x.strides[1] == 1 && q.dtype == DType::kF8E4M3 &&
                q.rank() == 2 && q.dim(1) == k && q.is_contiguous() && rows4 >= rows && scales.dtype == DType::kF32 &&
                scales.rank() == 2 && scales.dim(0) == groups && scales.dim(1) == rows4 && scales.is_contiguous())
      << "fp8 quantise x " << x.ToString() << " q " << q.ToString() << " scales " << scales.ToString();
  if (rows4 == 0 || k == 0) return;
  QuantParams p{x.ptr<bf16_t>(), rows > 1 ? x.strides[0] : k, rows, rows4, k, groups, q.ptr<uint8_t>(),
                scales.ptr<float>()};
  const int64_t warps = rows4 * groups;
  QuantizeFp8Kernel<<<CeilDiv(warps, kWarpsPerCta), kWarpsPerCta * 32, 0, s>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

void LinearFp8Simt(const TensorView& q, const TensorView& scales, const TensorView& w, const TensorView& w_scale,
                   const TensorView& out, cudaStream_t s) {
  const int64_t rows = out.dim(0), n = w.dim(0), k = w.dim(1), groups = (k + kGroup - 1) / kGroup;
  COROLLA_CHECK(q.dtype == DType::kF8E4M3 && q.is_contiguous() && q.rank() == 2 && q.dim(1) == k &&
                q.dim(0) >= rows && scales.dtype == DType::kF32 && scales.is_contiguous() &&
                scales.dim(0) == groups && scales.dim(1) == q.dim(0) && w.dtype == DType::kF8E4M3 &&
                w.is_contiguous() && w_scale.dtype == DType::kF32 && w_scale.rank() == 2 &&
                w_scale.dim(0) == (n + kGroup - 1) / kGroup && w_scale.dim(1) == groups && w_scale.strides[1] == 1 &&
                out.dtype == DType::kBF16 && out.rank() == 2 && out.dim(1) == n && out.strides[1] == 1)
      << "fp8 simt q " << q.ToString() << " scales " << scales.ToString() << " w " << w.ToString() << " w_scale "
      << w_scale.ToString() << " out " << out.ToString();
  if (rows == 0 || n == 0) return;
  SimtParams p{q.ptr<uint8_t>(), scales.ptr<float>(), w.ptr<uint8_t>(), w_scale.ptr<float>(), out.ptr<bf16_t>(),
               rows, q.dim(0), n, k, w_scale.strides[0], rows > 1 ? out.strides[0] : n};
  const dim3 grid(CeilDiv(n, kWarpsPerCta), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
  const bool vec = k % 16 == 0 && reinterpret_cast<uintptr_t>(q.data) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(w.data) % 16 == 0;
  if (vec) {
    LinearFp8SimtKernel<true><<<grid, kWarpsPerCta * 32, 0, s>>>(p);
  } else {
    LinearFp8SimtKernel<false><<<grid, kWarpsPerCta * 32, 0, s>>>(p);
  }
  COROLLA_CUDA_CHECK_LAUNCH();
}

void ExpandFp8WeightScales(const TensorView& w_scale, const TensorView& out, cudaStream_t s) {
  const int64_t groups = w_scale.dim(1), n = out.dim(1);
  COROLLA_CHECK(w_scale.dtype == DType::kF32 && w_scale.rank() == 2 && w_scale.strides[1] == 1 &&
                out.dtype == DType::kF32 && out.rank() == 2 && out.dim(0) == groups && out.is_contiguous() &&
                w_scale.dim(0) == (n + kGroup - 1) / kGroup)
      << "fp8 expand scales w_scale " << w_scale.ToString() << " out " << out.ToString();
  if (n == 0 || groups == 0) return;
  const int64_t ld = w_scale.dim(0) > 1 ? w_scale.strides[0] : groups;
  ExpandFp8WeightScalesKernel<<<CeilDiv(n * groups, 256), 256, 0, s>>>(w_scale.ptr<float>(), ld, n, groups,
                                                                       out.ptr<float>());
  COROLLA_CUDA_CHECK_LAUNCH();
}

void TransposeBf16(const TensorView& dt, const TensorView& out, cudaStream_t s) {
  const int64_t rows = out.dim(0), n = out.dim(1);
  COROLLA_CHECK(dt.dtype == DType::kBF16 && out.dtype == DType::kBF16 && dt.rank() == 2 && out.rank() == 2 &&
                dt.dim(0) == n && dt.dim(1) >= rows && dt.strides[1] == 1 && out.strides[1] == 1)
      << "transpose bf16 dt " << dt.ToString() << " out " << out.ToString();
  if (rows == 0 || n == 0) return;
  const dim3 grid(CeilDiv(rows, kTile), CeilDiv(n, kTile)), block(kTile, kTileRows);
  TransposeBf16Kernel<<<grid, block, 0, s>>>(dt.ptr<bf16_t>(), n > 1 ? dt.strides[0] : dt.dim(1), out.ptr<bf16_t>(),
                                             rows > 1 ? out.strides[0] : n, rows, n);
  COROLLA_CUDA_CHECK_LAUNCH();
}

std::string Fp8LtVariant::Name() const {
  std::string s = x_is_a ? "A=x VEC128, B=w " : "A=w ";
  s += w_vec ? "VEC128" : "BLK128x128";
  if (!x_is_a) s += ", B=x VEC128";
  s += d_f32 ? ", D f32" : ", D bf16";
  if (x_is_a) s += d_row ? " row-order" : " col (out^T)";
  if (fast_accum) s += ", fast-accum";
  if (late_scale_pointers) s += ", scale ptrs after heuristic";
  if (no_align_prefs) s += ", no align prefs";
  return s;
}

Fp8Linear::Fp8Linear(CachingAllocator& alloc) : alloc_(alloc) {
  // COROLLA_FP8_GEMM=simt forces the SIMT kernel (comparisons on the GPU machine).
  if (const char* v = std::getenv("COROLLA_FP8_GEMM"); v != nullptr && std::string(v) == "simt") path_ = Path::kSimt;
  COROLLA_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_ = alloc_.Allocate(workspace_bytes_);
}

Fp8Linear::~Fp8Linear() {
  for (auto& [key, plan] : plans_) DestroyPlan(&plan);
  alloc_.Free(workspace_);
  cublasLtDestroy(handle_);
}

void Fp8Linear::set_first_variant(int i) {
  COROLLA_CHECK(i >= 0 && i < kNumFp8LtVariants) << "fp8 variant " << i;
  first_variant_ = i;
  for (auto& [key, plan] : plans_) DestroyPlan(&plan);
  plans_.clear();
}

void Fp8Linear::DestroyPlan(Plan* plan) {
  if (plan->a) cublasLtMatrixLayoutDestroy(plan->a);
  if (plan->b) cublasLtMatrixLayoutDestroy(plan->b);
  if (plan->c) cublasLtMatrixLayoutDestroy(plan->c);
  if (plan->desc) cublasLtMatmulDescDestroy(plan->desc);
  plan->a = plan->b = plan->c = nullptr;
  plan->desc = nullptr;
  plan->ok = false;
}

// As LtLinear: row-major out[M, N] = x[M, K] w[N, K]^T is column-major out'[N, M] = op_T(A) B
// with A = w stored [K, N] (ld K) and B = x stored [K, M] (ld K); with the roles swapped
// (x_is_a) D = op_T(x) w is [M, N] column-major, out^T in memory (or out with ORDER_ROW).
void Fp8Linear::BuildPlan(const Fp8LtVariant* v, int64_t m4, int64_t n, int64_t k, int64_t ldd, const void* w,
                          const void* x, const void* d, const void* w_scale, const void* x_scale, Plan* plan) {
  const bool x_is_a = v != nullptr && v->x_is_a;
  plan->x_is_a = x_is_a;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  COROLLA_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  COROLLA_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  const int64_t a_cols = x_is_a ? m4 : n, b_cols = x_is_a ? n : m4;
  const void* a_ptr = x_is_a ? x : w;
  const void* b_ptr = x_is_a ? w : x;
  if (v != nullptr) {
    const cublasLtMatmulMatrixScale_t w_mode =
        v->w_vec ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F : CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const cublasLtMatmulMatrixScale_t x_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    const cublasLtMatmulMatrixScale_t a_mode = x_is_a ? x_mode : w_mode, b_mode = x_is_a ? w_mode : x_mode;
    COROLLA_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
    COROLLA_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
    if (!v->late_scale_pointers) {
      // cuBLASLt validates the scale tensors of the block modes at the heuristic: give it the call's.
      const void* a_scale = x_is_a ? x_scale : w_scale;
      const void* b_scale = x_is_a ? w_scale : x_scale;
      COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                          sizeof(a_scale)));
      COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                          sizeof(b_scale)));
    }
    if (v->fast_accum) {
      const int8_t fast = 1;
      COROLLA_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
    }
  }
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_8F_E4M3, k, a_cols, k));
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_8F_E4M3, k, b_cols, k));
  const cudaDataType_t d_type = v != nullptr && v->d_f32 ? CUDA_R_32F : CUDA_R_16BF;
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->c, d_type, a_cols, b_cols, ldd));
  if (x_is_a && v->d_row) {
    const cublasLtOrder_t order = CUBLASLT_ORDER_ROW;
    COROLLA_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(plan->c, CUBLASLT_MATRIX_LAYOUT_ORDER, &order, sizeof(order)));
  }
  cublasLtMatmulPreference_t pref;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace_bytes_, sizeof(workspace_bytes_)));
  if (v == nullptr || !v->no_align_prefs) {
    const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    const void* ptrs[4] = {a_ptr, b_ptr, d, d};
    for (int i = 0; i < 4; ++i) {
      uint32_t bytes = 1u << Log2Align(ptrs[i]);
      COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &bytes, sizeof(bytes)));
    }
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  plan->status = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->c, plan->c, pref, 1,
                                                &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  plan->found = plan->status == CUBLAS_STATUS_SUCCESS ? found : 0;
  plan->ok = plan->found > 0;
  if (plan->ok) {
    plan->algo = result.algo;
    plan->workspace = result.workspaceSize;
  }
}

cublasStatus_t Fp8Linear::Launch(Plan& plan, const void* w, const void* x, void* d, const void* w_scale,
                                  const void* x_scale, cudaStream_t stream) {
  if (w_scale != nullptr) {
    const void* a_scale = plan.x_is_a ? x_scale : w_scale;
    const void* b_scale = plan.x_is_a ? w_scale : x_scale;
    COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                        sizeof(a_scale)));
    COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                        sizeof(b_scale)));
  }
  const float alpha = 1.f, beta = 0.f;
  return cublasLtMatmul(handle_, plan.desc, &alpha, plan.x_is_a ? x : w, plan.a, plan.x_is_a ? w : x, plan.b, &beta, d,
                        plan.c, d, plan.c, &plan.algo, workspace_, workspace_bytes_, stream);
}

Fp8Linear::LtOutcome Fp8Linear::RunVariant(const Fp8LtVariant& v, const TensorView& q, const TensorView& sx,
                                           const TensorView& w, const TensorView& w_scale, const TensorView& d,
                                           cudaStream_t stream, int timed_reps) {
  const int64_t m4 = q.dim(0), k = q.dim(1), n = w.dim(0);
  COROLLA_CHECK(q.is_contiguous() && sx.is_contiguous() && w.is_contiguous() && d.is_contiguous() && w.dim(1) == k &&
                d.numel() == m4 * n && d.dtype == (v.d_f32 ? DType::kF32 : DType::kBF16))
      << "fp8 probe q " << q.ToString() << " w " << w.ToString() << " d " << d.ToString();
  Plan plan;
  BuildPlan(&v, m4, n, k, v.d_transposed() ? m4 : n, w.data, q.data, d.data, w_scale.data, sx.data, &plan);
  LtOutcome r;
  r.heuristic = plan.status;
  r.found = plan.found;
  r.workspace = plan.workspace;
  if (plan.ok) r.run = Launch(plan, w.data, q.data, d.data, w_scale.data, sx.data, stream);
  if (r.run == CUBLAS_STATUS_SUCCESS && timed_reps > 0) {
    cudaEvent_t start, stop;
    COROLLA_CUDA_CHECK(cudaEventCreate(&start));
    COROLLA_CUDA_CHECK(cudaEventCreate(&stop));
    COROLLA_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int i = 0; i < timed_reps; ++i)
      COROLLA_CUBLAS_CHECK(Launch(plan, w.data, q.data, d.data, w_scale.data, sx.data, stream));
    COROLLA_CUDA_CHECK(cudaEventRecord(stop, stream));
    COROLLA_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    COROLLA_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    r.us = 1e3 * ms / timed_reps;
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  DestroyPlan(&plan);
  return r;
}

void Fp8Linear::Run(const TensorView& x, const TensorView& w, const TensorView& w_scale, const TensorView& out,
                    cudaStream_t stream) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  const int64_t groups = (k + kGroup - 1) / kGroup, n_blocks = (n + kGroup - 1) / kGroup;
  COROLLA_CHECK(x.dtype == DType::kBF16 && x.rank() == 2 && x.strides[1] == 1 && w.dtype == DType::kF8E4M3 &&
                w.rank() == 2 && w.dim(1) == k && w.is_contiguous() && w_scale.dtype == DType::kF32 &&
                w_scale.rank() == 2 && w_scale.dim(0) == n_blocks && w_scale.dim(1) == groups &&
                w_scale.strides[1] == 1 && (n_blocks == 1 || w_scale.strides[0] == Fp8ScaleStride(k)) &&
                out.dtype == DType::kBF16 && out.rank() == 2 && out.dim(0) == m && out.dim(1) == n &&
                out.strides[1] == 1)
      << "linear fp8 x " << x.ToString() << " w " << w.ToString() << " w_scale " << w_scale.ToString() << " out "
      << out.ToString();
  if (m == 0) return;
  // Activations: rows padded to a multiple of 4 (cuBLASLt's VEC128 scales need it).
  const int64_t m4 = (m + 3) / 4 * 4;
  ScratchBuffer q_buf(alloc_, static_cast<size_t>(m4 * k)), s_buf(alloc_, static_cast<size_t>(groups * m4) * 4);
  TensorView q(q_buf.as<void>(), DType::kF8E4M3, {m4, k}, Device::kCuda, out.device_idx);
  TensorView sx(s_buf.as<void>(), DType::kF32, {groups, m4}, Device::kCuda, out.device_idx);
  QuantizeFp8Groups(x, q, sx, stream);

  const bool lt = path_ == Path::kAuto && LtTakes(n, k) && reinterpret_cast<uintptr_t>(w_scale.data) % 16 == 0;
  if (lt) {
    // Untransposed D goes straight into out when its rows are the padded rows; else into
    // scratch (256-byte aligned), then copied or transposed.
    const bool direct = m == m4;
    const int64_t ldo = m > 1 && direct ? out.strides[0] : n;
    const int aligns = Log2Align(w.data) | Log2Align(q.data) << 8 | (direct ? Log2Align(out.data) : 8) << 16;
    const Key key{m4, n, k, ldo, true, aligns};
    auto [it, fresh] = plans_.try_emplace(key);
    Plan& plan = it->second;  // unbuilt (desc nullptr) until its variant is tried
    if (fresh) plan.variant = first_variant_;
    while (plan.variant < kNumFp8LtVariants) {
      const Fp8LtVariant& v = kFp8LtVariants[plan.variant];
      ScratchBuffer ws_buf(alloc_, v.w_vec ? static_cast<size_t>(groups * n) * 4 : 0);
      TensorView ws = w_scale;
      if (v.w_vec) {
        ws = TensorView(ws_buf.as<void>(), DType::kF32, {groups, n}, Device::kCuda, out.device_idx);
        ExpandFp8WeightScales(w_scale, ws, stream);
      }
      const bool into_out = direct && !v.d_transposed();
      ScratchBuffer d_buf(alloc_, into_out ? 0 : static_cast<size_t>(m4 * n) * 2);
      void* d = into_out ? out.data : d_buf.as<void>();
      if (plan.desc == nullptr) {
        BuildPlan(&v, m4, n, k, v.d_transposed() ? m4 : (into_out ? ldo : n), w.data, q.data, d, ws.data, sx.data,
                  &plan);
        if (!plan.ok) {
          LOG(WARNING) << "cuBLASLt has no block-scaled FP8 algorithm (" << v.Name() << ") for m=" << m4 << " n=" << n
                       << " k=" << k << " ldo=" << ldo << " (" << cublasLtGetStatusString(plan.status)
                       << (plan.status == CUBLAS_STATUS_SUCCESS ? ", none found" : "") << ")";
        }
      }
      if (plan.ok) {
        const cublasStatus_t st = Launch(plan, w.data, q.data, d, ws.data, sx.data, stream);
        if (st == CUBLAS_STATUS_SUCCESS) {
          if (v.d_transposed()) {
            TransposeBf16(TensorView(d, DType::kBF16, {n, m4}, Device::kCuda, out.device_idx), out, stream);
          } else if (!into_out) {
            Copy(TensorView(d, DType::kBF16, {m4, n}, Device::kCuda, out.device_idx).Slice(0, m), out, stream);
          }
          return;
        }
        // A rejection at launch (not a device fault): the next variant from now on.
        LOG(WARNING) << "cuBLASLt block-scaled FP8 matmul (" << v.Name() << ") m=" << m4 << " n=" << n << " k=" << k
                     << " failed (" << cublasLtGetStatusString(st) << ")";
      }
      DestroyPlan(&plan);
      if (++plan.variant == kNumFp8LtVariants) {
        LOG(WARNING) << "cuBLASLt declined every block-scaled FP8 variant for m=" << m4 << " n=" << n << " k=" << k
                     << "; using the SIMT kernel";
      }
    }
    ++num_declined_;
  }
  LinearFp8Simt(q, sx, w, w_scale, out, stream);
}

void Fp8Linear::RunPerTensor(const TensorView& a, const TensorView& b, const TensorView& out, cudaStream_t stream) {
  const int64_t m = a.dim(0), k = a.dim(1), n = b.dim(0);
  COROLLA_CHECK(a.dtype == DType::kF8E4M3 && b.dtype == DType::kF8E4M3 && out.dtype == DType::kBF16 &&
                a.is_contiguous() && b.is_contiguous() && out.is_contiguous() && b.dim(1) == k && out.dim(0) == m &&
                out.dim(1) == n)
      << "fp8 per-tensor a " << a.ToString() << " b " << b.ToString() << " out " << out.ToString();
  const int aligns = Log2Align(b.data) | Log2Align(a.data) << 8 | Log2Align(out.data) << 16;
  Plan& plan = plans_[{m, n, k, n, false, aligns}];
  if (plan.desc == nullptr) BuildPlan(nullptr, m, n, k, n, b.data, a.data, out.data, nullptr, nullptr, &plan);
  COROLLA_CHECK(plan.ok) << "cuBLASLt has no per-tensor FP8 algorithm for " << m << "x" << n << "x" << k << " ("
                         << cublasLtGetStatusString(plan.status) << ")";
  COROLLA_CUBLAS_CHECK(Launch(plan, b.data, a.data, out.data, nullptr, nullptr, stream));
}

}  // namespace corolla::cuda
