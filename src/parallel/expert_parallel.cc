#include "parallel/expert_parallel.h"

#include "parallel/cuda/ep_kernels.h"

namespace corolla {

void ToLocalExpertIds(Backend& backend, const TensorView& topk_ids, int first_expert) {
  COROLLA_CHECK(topk_ids.dtype == DType::kI32 && topk_ids.rank() == 2 && topk_ids.strides[1] == 1)
      << "topk_ids " << topk_ids.ToString();
  if (first_expert == 0 || topk_ids.numel() == 0) return;
  if (topk_ids.device == Device::kCpu) {
    for (int64_t t = 0; t < topk_ids.dim(0); ++t)
      for (int64_t k = 0; k < topk_ids.dim(1); ++k) topk_ids.ptr<int32_t>()[t * topk_ids.strides[0] + k] -= first_expert;
    return;
  }
#ifdef COROLLA_HAVE_CUDA
  ShiftExpertIdsCuda(backend, topk_ids, -first_expert);
#else
  COROLLA_CHECK(false) << "a CUDA tensor in a build without CUDA";
#endif
}

}  // namespace corolla
