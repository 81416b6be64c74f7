// FP8 block-scaled linear (Backend::LinearFp8) on CUDA: activations quantised per 1 x 128 group
// (fp8_gemm.cu's quantise kernel), then cuBLASLt's Hopper block scaling (A: the weight,
// BLK128x128_32F; B: the activations, VEC128_32F; bf16 out, f32 accumulation); a SIMT kernel of
// the same math serves the problems cuBLASLt declines. Fp8Linear owns its cuBLASLt handle, a
// workspace and a plan cache keyed by shape and alignment; one per backend, used from its
// stream's thread (not thread-safe).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
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

  void set_path(Path path) { path_ = path; }
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
    bool ok = false;  // the heuristic found an algorithm
  };
  Plan& GetPlan(const Key& key);

  CachingAllocator& alloc_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 32 << 20;
  std::map<Key, Plan> plans_;
  Path path_ = Path::kAuto;
  int64_t num_declined_ = 0;
};

}  // namespace corolla::cuda
