// Linear (out = x @ w^T) through cuBLASLt: bf16 x and w, bf16 or f32 out, fp32 accumulation.
// Owns the cuBLASLt handle, a 32 MiB workspace and a cache of matmul plans (descriptors and
// the heuristic's algorithm) keyed by shape, strides and output dtype. Not thread-safe: one
// per backend, used from its stream's thread.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <tuple>

#include "kernels/cuda/allocator.h"
#include "tensor/tensor.h"

namespace corolla::cuda {

class LtLinear {
 public:
  explicit LtLinear(CachingAllocator& alloc);
  ~LtLinear();
  LtLinear(const LtLinear&) = delete;
  LtLinear& operator=(const LtLinear&) = delete;

  // x [T, K] (rows may be strided), w [N, K] contiguous, out [T, N] (rows may be strided).
  void Run(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t stream);
  // Backend::BatchedLinear as one strided-batched matmul: x [T, B, K], w [B, N, K] (rows of
  // each w[b] may be strided), out [T, B, N], innermost dims contiguous, bf16 (out bf16 or
  // f32). False (nothing launched) when cuBLASLt has no algorithm for the layout.
  bool RunBatched(const TensorView& x, const TensorView& w, const TensorView& out, cudaStream_t stream);

 private:
  // (m, n, k, ldx, ldout, out dtype, alignment of w | x | out pointers packed, batch count,
  // ldw, batch strides of w, x, out); batch count 1 and strides 0 for Run.
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int, int64_t, int64_t, int64_t,
                         int64_t>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool found = false;  // the heuristic returned an algorithm (only batched plans may lack one)
  };
  const Plan& GetPlan(const Key& key);

  CachingAllocator& alloc_;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 32 << 20;
  std::map<Key, Plan> plans_;
};

}  // namespace corolla::cuda
