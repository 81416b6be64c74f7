#include "kernels/cuda/linear.h"

#include "kernels/cuda/cuda_check.h"

namespace corolla::cuda {

LtLinear::LtLinear(CachingAllocator& alloc) : alloc_(alloc) {
  COROLLA_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_ = alloc_.Allocate(workspace_bytes_);
}

LtLinear::~LtLinear() {
  for (auto& [key, plan] : plans_) {
    cublasLtMatrixLayoutDestroy(plan.a);
    cublasLtMatrixLayoutDestroy(plan.b);
    cublasLtMatrixLayoutDestroy(plan.c);
    cublasLtMatmulDescDestroy(plan.desc);
  }
  alloc_.Free(workspace_);
  cublasLtDestroy(handle_);
}

// Row-major out[T, N] = x[T, K] w[N, K]^T is column-major out'[N, T] = w'^T [N, K] x'[K, T],
// where w' is w read column-major ([K, N], ld K) and x' is x ([K, T], ld = x's row stride).
const LtLinear::Plan& LtLinear::GetPlan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const auto [m, n, k, ldx, ldo, out_dtype, aligns, batch, ldw, stride_w, stride_x, stride_o] = key;
  Plan plan;
  const cudaDataType_t out_type = out_dtype == static_cast<int>(DType::kF32) ? CUDA_R_32F : CUDA_R_16BF;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  COROLLA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  // A = w' stored [K, N] ld ldw (K unless w's rows are strided; op T gives [N, K]); B = x' [K, T]
  // ld ldx; C = out' [N, T] ld ldo. Batched: one such triple per b, each strided_* after the last.
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.a, CUDA_R_16BF, k, n, ldw));
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.b, CUDA_R_16BF, k, m, ldx));
  COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan.c, out_type, n, m, ldo));
  if (batch > 1) {  // matrix b of each operand starts b * stride elements after the first
    const int32_t count = batch;
    const std::pair<cublasLtMatrixLayout_t, int64_t> layouts[3] = {{plan.a, stride_w}, {plan.b, stride_x},
                                                                   {plan.c, stride_o}};
    for (const auto& [layout, stride] : layouts) {
      COROLLA_CUBLAS_CHECK(
          cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
      COROLLA_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                            &stride, sizeof(stride)));
    }
  }
  cublasLtMatmulPreference_t pref;
  COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof(workspace_bytes_)));
  // The heuristic assumes 256-byte aligned pointers unless told: views into fused tensors are not.
  const cublasLtMatmulPreferenceAttributes_t align_attrs[3] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES};
  for (int i = 0; i < 3; ++i) {
    uint32_t bytes = 1u << ((aligns >> (8 * i)) & 0xff);
    COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attrs[i], &bytes, sizeof(bytes)));
    if (i == 2)
      COROLLA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
          pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &bytes, sizeof(bytes)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, plan.desc, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (batch > 1 && status != CUBLAS_STATUS_SUCCESS) found = 0;  // a batched layout it does not take: the caller loops
  if (batch == 1) COROLLA_CUBLAS_CHECK(status);
  COROLLA_CHECK(found > 0 || batch > 1) << "cuBLASLt has no algorithm for linear m=" << m << " n=" << n
                                        << " k=" << k << " ldx=" << ldx << " ldo=" << ldo;
  plan.found = found > 0;
  plan.algo = result.algo;
  return plans_.emplace(key, plan).first->second;
}

namespace {
// log2 of the alignment (capped at 256 bytes) of every address p + i * stride_bytes.
int Log2Align(const void* p, int64_t stride_bytes = 0) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) | static_cast<uintptr_t>(stride_bytes);
  int bits = 0;
  while (bits < 8 && ((a >> bits) & 1) == 0) ++bits;
  return bits;
}
}  // namespace

bool LtLinear::RunBatched(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t stream) {
  const int64_t m = x.dim(0), batch = x.dim(1), k = x.dim(2), n = w.dim(1);
  COROLLA_CHECK(x.dtype == DType::kBF16 && w.dtype == DType::kBF16 &&
                (out.dtype == DType::kBF16 || out.dtype == DType::kF32) && x.rank() == 3 && w.rank() == 3 &&
                out.rank() == 3 && w.dim(0) == batch && w.dim(2) == k && out.dim(0) == m && out.dim(1) == batch &&
                out.dim(2) == n && x.strides[2] == 1 && w.strides[2] == 1 && out.strides[2] == 1 &&
                (n == 1 || w.strides[1] >= k) && (m == 1 || (x.strides[0] >= k && out.strides[0] >= n)))
      << "batched linear x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  if (m == 0 || batch == 0) return true;
  if (batch > INT32_MAX) return false;
  // A single row or weight row: its leading dimension is never stepped over, any valid value does.
  const int64_t ldx = m > 1 ? x.strides[0] : k, ldo = m > 1 ? out.strides[0] : n, ldw = n > 1 ? w.strides[1] : k;
  const int64_t es = DTypeSize(x.dtype), eo = DTypeSize(out.dtype);
  const int aligns = Log2Align(w.data, w.strides[0] * es) | Log2Align(x.data, x.strides[1] * es) << 8 |
                     Log2Align(out.data, out.strides[1] * eo) << 16;
  const Plan& plan = GetPlan({m, n, k, ldx, ldo, static_cast<int>(out.dtype), aligns, static_cast<int>(batch), ldw,
                              w.strides[0], x.strides[1], out.strides[1]});
  if (!plan.found) return false;
  const float alpha = 1.f, beta = 0.f;
  COROLLA_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &alpha, w.data, plan.a, x.data, plan.b, &beta, out.data,
                                      plan.c, out.data, plan.c, &plan.algo, workspace_, workspace_bytes_, stream));
  return true;
}

void LtLinear::Run(const TensorView& x, const TensorView& w, const TensorView& out,
                   cudaStream_t stream) {
  const int64_t m = x.dim(0), k = x.dim(1), n = w.dim(0);
  COROLLA_CHECK(x.dtype == DType::kBF16 && w.dtype == DType::kBF16 &&
                (out.dtype == DType::kBF16 || out.dtype == DType::kF32) && x.rank() == 2 &&
                w.rank() == 2 && out.rank() == 2 && w.dim(1) == k && out.dim(0) == m &&
                out.dim(1) == n && w.is_contiguous() && x.strides[1] == 1 && out.strides[1] == 1)
      << "linear x " << x.ToString() << " w " << w.ToString() << " out " << out.ToString();
  if (m == 0) return;
  const int64_t ldx = m > 1 ? x.strides[0] : k, ldo = m > 1 ? out.strides[0] : n;
  const int aligns = Log2Align(w.data) | Log2Align(x.data) << 8 | Log2Align(out.data) << 16;
  const Plan& plan = GetPlan({m, n, k, ldx, ldo, static_cast<int>(out.dtype), aligns, 1, k, 0, 0, 0});
  const float alpha = 1.f, beta = 0.f;
  COROLLA_CUBLAS_CHECK(cublasLtMatmul(handle_, plan.desc, &alpha, w.data, plan.a, x.data, plan.b,
                                      &beta, out.data, plan.c, out.data, plan.c, &plan.algo,
                                      workspace_, workspace_bytes_, stream));
}

}  // namespace corolla::cuda
