#include "parallel/cuda/ep_kernels.h"

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"

namespace corolla {
namespace {

struct ShiftParams {
  int32_t* ids;
  int64_t row_stride;
  int64_t tokens;
  int top_k;
  int delta;
};

__global__ void ShiftIdsKernel(const __grid_constant__ ShiftParams p) {
  const int64_t n = p.tokens * p.top_k;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p.ids[(i / p.top_k) * p.row_stride + i % p.top_k] += p.delta;
}

}  // namespace

void ShiftExpertIdsCuda(Backend& backend, const TensorView& ids, int delta) {
  auto* cuda_backend = dynamic_cast<cuda::CudaBackend*>(&backend);
  COROLLA_CHECK(cuda_backend != nullptr && ids.device == Device::kCuda && ids.dtype == DType::kI32 &&
                ids.rank() == 2 && ids.strides[1] == 1)
      << "shift expert ids " << ids.ToString() << " on " << backend.name();
  const int64_t n = ids.numel();
  if (n == 0) return;
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 1024));
  ShiftParams p{ids.ptr<int32_t>(), ids.strides[0], ids.dim(0), static_cast<int>(ids.dim(1)), delta};
  ShiftIdsKernel<<<blocks, threads, 0, cuda_backend->stream()>>>(p);
  COROLLA_CUDA_CHECK_LAUNCH();
}

}  // namespace corolla
