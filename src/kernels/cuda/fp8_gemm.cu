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

Fp8Linear::Fp8Linear(CachingAllocator& alloc) : alloc_(alloc) {
  // COROLLA_FP8_GEMM=simt forces the SIMT kernel (comparisons on the GPU machine).
  if (const char* v = std::getenv("COROLLA_FP8_GEMM"); v != nullptr && std::string(v) == "simt") path_ = Path::kSimt;
  COROLLA_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_ = alloc_.Allocate(workspace_bytes_);
}

Fp8Linear::~Fp8Linear() {
  for (auto& [key, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.desc);
  }
  alloc_.Free(workspace_);
  cublasLtDestroy(handle_);
}

// As LtLinear: row-major out[M, N] = x[M, K] w[N, K]^T is column-major out'[N, M] = op_T(A) B
// with A = w stored [K, N] (ld K) and B = x stored [K, M] (ld K). The scales follow the
// operands: A's BLK128x128 [ceil(N/128) columns of Fp8ScaleStride(K) floats], B's VEC128
// [ceil(K/128) columns of M floats] (M a multiple of 4: the quantised rows are padded).
Fp8Linear::Plan& Fp8Linear::GetPlan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const auto [m, n, k, ldo, block_scaled, aligns] = key;
  Plan plan;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (block_scaled) {
    const cublasLtMatmulMatrixScale_t a_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    const cublasLtMatmulMatrixScale_t b_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &a_mode, sizeof(a_mode)));
    COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &b_mode, sizeof(b_mode)));
  }
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_8F_E4M3, k, n, k));
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_8F_E4M3, k, m, k));
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, CUDA_R_16BF, n, m, ldo));
  cublasLtMatmulPreference_t pref;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace_bytes_, sizeof(workspace_bytes_)));
  const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int i = 0; i < 4; ++i) {
    uint32_t bytes = 1u << ((aligns >> (8 * std::min(i, 2))) & 0xff);
    COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &bytes, sizeof(bytes)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.c, plan.c, pref,
                                                           1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  plan.ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
  if (plan.ok) {
    plan.algo = result.algo;
  } else {
    LOG(WARNING) << "cuBLASLt has no " << (block_scaled ? "block-scaled " : "") << "FP8 algorithm for m=" << m
                 << " n=" << n << " k=" << k << " ldo=" << ldo << " (" << cublasLtGetStatusString(st)
                 << "); using the SIMT kernel";
  }
  return plans_.emplace(key, plan).first->second;
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
    // Straight into out when its rows are the padded rows; else into scratch, then copied.
    const bool direct = m == m4;
    ScratchBuffer d_buf(alloc_, direct ? 0 : static_cast<size_t>(m4 * n) * 2);
    TensorView d = direct ? out : TensorView(d_buf.as<void>(), DType::kBF16, {m4, n}, Device::kCuda, out.device_idx);
    const int64_t ldo = m > 1 && direct ? out.strides[0] : n;
    const int aligns = Log2Align(w.data) | Log2Align(q.data) << 8 | Log2Align(d.data) << 16;
    Plan& plan = GetPlan({m4, n, k, ldo, true, aligns});
    if (plan.ok) {
      const void* a_scale = w_scale.data;
      const void* b_scale = sx.data;
      COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &a_scale,
                                                          sizeof(a_scale)));
      COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &b_scale,
                                                          sizeof(b_scale)));
      const float alpha = 1.f, beta = 0.f;
      const cublasStatus_t st = cublasLtMatmul(handle_, plan.desc, &alpha, w.data, plan.a, q.data, plan.b, &beta,
                                               d.data, plan.c, d.data, plan.c, &plan.algo, workspace_,
                                               workspace_bytes_, stream);
      if (st == CUBLAS_STATUS_SUCCESS) {
        if (!direct) Copy(d.Slice(0, m), out, stream);
        return;
      }
      // A rejection at launch (not a device fault): this plan runs on the SIMT kernel from now on.
      LOG(WARNING) << "cuBLASLt block-scaled FP8 matmul m=" << m4 << " n=" << n << " k=" << k << " failed ("
                   << cublasLtGetStatusString(st) << "); using the SIMT kernel";
      plan.ok = false;
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
  const Plan& plan = GetPlan({m, n, k, n, false, aligns});
  COROLLA_CHECK(plan.ok) << "cuBLASLt has no per-tensor FP8 algorithm for " << m << "x" << n << "x" << k;
  const float alpha = 1.f, beta = 0.f;
  COROLLA_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &alpha, b.data, plan.a, a.data, plan.b, &beta, out.data,
                                      plan.c, out.data, plan.c, &plan.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace corolla::cuda
