// FP8 block-scaled linear (Backend::LinearFp8) on CUDA: activations quantised per 1 x 128 group
// (fp8_gemm.cu's quantise kernel), then cuBLASLt's Hopper block scaling (kFp8LtVariants, tried in
// order per shape: A = the weight with BLK128x128_32F scales and B = the activations with
// VEC128_32F; else the roles swapped, D transposed back; else VEC128 on both, the weight's
// scales expanded per row), bf16 out, f32 accumulation; a SIMT kernel of the same math serves
// the problems cuBLASLt declines. Fp8Linear owns its cuBLASLt handle, a workspace and a plan
// cache keyed by shape and alignment; one per backend, used from its stream's thread (not
// thread-safe).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <tuple>

#include "kernels/cuda/allocator.h"
#include "tensor/tensor.h"

namespace corolla::cuda {

// Quantises x [T, K] bf16 (rows may be strided) per row and group of 128 columns (backend.h):
// q [T4, K] e4m3 bits (u8, contiguous; T4 >= T, rows T.. are zeros) and scales [ceil(K/128), T4]
// f32 (contiguous; token-major within a group, cuBLASLt's VEC128 layout of its B operand).
void QuantizeFp8Groups(const TensorView& x, const TensorView& q, const TensorView& scales, cudaStream_t s);

// out[t, n] (bf16, rows may be strided) for t < out.dim(0) from the quantised activations of
// QuantizeFp8Groups and the block-scaled weight: one warp per output column, 16-byte chunks.
void LinearFp8Simt(const TensorView& q, const TensorView& scales, const TensorView& w, const TensorView& w_scale,
                   const TensorView& out, cudaStream_t s);

// Weight scales per row for VEC128_32F: out [ceil(K/128), N] f32 (contiguous, N-major),
// out[l, r] = w_scale[r / 128, l] (w_scale as LinearFp8's: [ceil(N/128), ceil(K/128)] rows).
void ExpandFp8WeightScales(const TensorView& w_scale, const TensorView& out, cudaStream_t s);

// out[t, n] = dt[n, t] for t < out.dim(0): bf16, dt [N, M'] with contiguous rows (M' >= T),
// out's rows may be strided.
void TransposeBf16(const TensorView& dt, const TensorView& out, cudaStream_t s);

// fp8_gemv.cu: Backend::LinearFp8 (semantics: kernels/backend.h) for x of
// 1..min(8, Tuning().linear_fp8_gemv_max_rows) rows in one launch, the activation quantisation
// done in the kernel (the same sx and q as QuantizeFp8Groups); out bf16 or f32. False (nothing
// launched) for more rows or layouts it does not cover (K % 16, 16-byte aligned x and w, x's row
// stride % 8, M x K bytes in shared memory). Launched with programmatic dependent launch: it
// reads w and w_scale before the previous kernel has finished (they must be weights).
bool LinearFp8Gemv(const TensorView& x, const TensorView& w, const TensorView& w_scale, const TensorView& out,
                   cudaStream_t s);

// One way of handing the block-scaled GEMM to cuBLASLt. Column-major terms, always "TN" (A op
// T, B op N, both stored K-contiguous, as the docs require of FP8 on Hopper):
//   x_is_a = false: A = weight [K, N], B = activations [K, M4], D [N, M4] = out (row-major);
//   x_is_a = true:  A = activations, B = weight, D [M4, N] column-major = out^T ([N, M4]
//                   row-major, transposed back), or with d_row CUBLASLT_ORDER_ROW = out.
// Scales per the cuBLAS docs (3.1.4.5.1): VEC128 M-/N-major [L, rows] (the activations' [L, M4]
// as QuantizeFp8Groups writes them, the weight's from ExpandFp8WeightScales); BLK128x128
// K-major [ceil(rows/128) columns of L4 floats] (LinearFp8's w_scale, row stride
// Fp8ScaleStride(K)); M and N multiples of 4; 16-byte aligned.
struct Fp8LtVariant {
  bool x_is_a = false;
  bool w_vec = false;      // weight scales VEC128_32F per row (else BLK128x128_32F)
  bool d_f32 = false;      // D f32 (else bf16); the probe only
  bool d_row = false;      // x_is_a: D in row order (= out, no transpose)
  bool fast_accum = false;  // CUBLASLT_MATMUL_DESC_FAST_ACCUM (PyTorch refuses it for block scaling)
  bool late_scale_pointers = false;  // scale pointers set only after the heuristic (the session-3 code)
  bool no_align_prefs = false;       // no MIN_ALIGNMENT_*_BYTES preferences
  bool d_transposed() const { return x_is_a && !d_row; }
  std::string Name() const;
};

constexpr Fp8LtVariant Fp8LtRoles(bool x_is_a, bool w_vec) {
  Fp8LtVariant v;
  v.x_is_a = x_is_a;
  v.w_vec = w_vec;
  return v;
}

// Run's order (the first whose heuristic and matmul succeed for a shape is kept for it): A =
// weight BLK128x128 / B = activations VEC128; A = activations VEC128 / B = weight BLK128x128
// (D transposed back); both VEC128 (the weight's scales expanded per row at each call).
inline constexpr Fp8LtVariant kFp8LtVariants[] = {Fp8LtRoles(false, false), Fp8LtRoles(true, false),
                                                  Fp8LtRoles(false, true)};
inline constexpr int kNumFp8LtVariants = static_cast<int>(sizeof(kFp8LtVariants) / sizeof(kFp8LtVariants[0]));

class Fp8Linear {
 public:
  enum class Path { kAuto, kSimt };  // kAuto: cuBLASLt, the SIMT kernel where it declines

  explicit Fp8Linear(CachingAllocator& alloc);
  ~Fp8Linear();
  Fp8Linear(const Fp8Linear&) = delete;
  Fp8Linear& operator=(const Fp8Linear&) = delete;

  // Backend::LinearFp8 (semantics and layouts: kernels/backend.h).
  void Run(const TensorView& x, const TensorView& w, const TensorView& w_scale, const TensorView& out,
           cudaStream_t stream);
  // Whether cuBLASLt takes an [N, K] weight (what supports_linear_fp8 answers): row lengths of
  // 16 bytes' multiples for the e4m3 operands, N a multiple of 4 for the scale layouts.
  static bool LtTakes(int64_t n, int64_t k) { return n % 16 == 0 && k % 16 == 0; }
  // Per-tensor FP8 (unit scales) through cuBLASLt: out [M, N] bf16 = a [M, K] e4m3 . b [N, K]^T;
  // the FP8 matmul peak of the benchmarks.
  void RunPerTensor(const TensorView& a, const TensorView& b, const TensorView& out, cudaStream_t stream);

  // One cuBLASLt call of `v` (no plan cache; CudaKernelTest.Fp8CublasLtProbe): q [M4, K] and sx
  // [L, M4] from QuantizeFp8Groups, w [N, K], w_scale the weight's scales in v's layout (BLK:
  // LinearFp8's rows; w_vec: ExpandFp8WeightScales), d bf16/f32 [M4, N] (or [N, M4] when
  // v.d_transposed()), contiguous. run is CUBLAS_STATUS_NOT_SUPPORTED when the heuristic found
  // nothing (not run then). timed_reps > 0: after a successful run, that many more launches of
  // the same plan timed by CUDA events (us: mean device time per launch; synchronises).
  struct LtOutcome {
    cublasStatus_t heuristic = CUBLAS_STATUS_SUCCESS, run = CUBLAS_STATUS_NOT_SUPPORTED;
    int found = 0;
    size_t workspace = 0;
    double us = 0;
  };
  LtOutcome RunVariant(const Fp8LtVariant& v, const TensorView& q, const TensorView& sx, const TensorView& w,
                       const TensorView& w_scale, const TensorView& d, cudaStream_t stream, int timed_reps = 0);

  void set_path(Path path) { path_ = path; }
  // The kFp8LtVariants index block-scaled plans start from (tests: each variant's production
  // path); drops the plan cache.
  void set_first_variant(int i);
  Path path() const { return path_; }
  // Problems cuBLASLt declined (ran on the SIMT kernel) since construction.
  int64_t num_declined() const { return num_declined_; }

 private:
  // (m, n, k, ld of out, block scaled, log2 alignments of w | x | out packed)
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, int>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;    // the heuristic found an algorithm
    int variant = 0;    // block scaled: index into kFp8LtVariants (its size: all declined)
    bool x_is_a = false;
    cublasStatus_t status = CUBLAS_STATUS_SUCCESS;  // the heuristic's
    int found = 0;
    size_t workspace = 0;
  };
  // Descriptors and heuristic of one problem: out[m4, n] = x[m4, k] . w[n, k]^T, D's leading
  // dimension ldd; v nullptr: per-tensor scales (A = w). The pointers give the alignments and,
  // unless v->late_scale_pointers, the scale pointers the heuristic sees.
  void BuildPlan(const Fp8LtVariant* v, int64_t m4, int64_t n, int64_t k, int64_t ldd, const void* w, const void* x,
                 const void* d, const void* w_scale, const void* x_scale, Plan* plan);
  static void DestroyPlan(Plan* plan);
  cublasStatus_t Launch(Plan& plan, const void* w, const void* x, void* d, const void* w_scale, const void* x_scale,
                        cudaStream_t stream);

  CachingAllocator& alloc_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 32 << 20;
  std::map<Key, Plan> plans_;
  Path path_ = Path::kAuto;
  int first_variant_ = 0;
  int64_t num_declined_ = 0;
};

}  // namespace corolla::cuda
