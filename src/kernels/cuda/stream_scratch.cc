#include "kernels/cuda/stream_scratch.h"

#include <map>
#include <mutex>
#include <utility>

#include "kernels/cuda/cuda_check.h"
#include "base/check.h"

namespace corolla::cuda {

void* StreamScratch(cudaStream_t s, StreamScratchSlot slot, size_t bytes) {
  static std::mutex mu;
  static std::map<std::pair<cudaStream_t, StreamScratchSlot>, std::pair<void*, size_t>> scratch;
  std::lock_guard<std::mutex> lock(mu);
  auto it = scratch.find({s, slot});
  if (it != scratch.end()) {
    COROLLA_CHECK(it->second.second == bytes)
        << "stream scratch slot " << static_cast<int>(slot) << ": " << bytes << " bytes asked, "
        << it->second.second << " allocated";
    return it->second.first;
  }
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  COROLLA_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return nullptr;
  void* p = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&p, bytes));
  COROLLA_CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, s));
  scratch.emplace(std::make_pair(s, slot), std::make_pair(p, bytes));
  return p;
}

}  // namespace corolla::cuda
