#include "kernels/cuda/pinned_host.h"

#include <algorithm>
#include <cstring>

#include "kernels/cuda/cuda_check.h"

namespace corolla::cuda {

HostStaging::~HostStaging() {
  for (cudaEvent_t e : left_)
    if (e) cudaEventDestroy(e);
  if (buf_) cudaFreeHost(buf_);  // after the stream's work: the backend synchronises it first
}

void HostStaging::CopyToDevice(void* dst, const void* src, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  COROLLA_CUDA_CHECK(cudaStreamIsCapturing(stream, &capturing));
  if (n > half_ || capturing != cudaStreamCaptureStatusNone) {
    COROLLA_CUDA_CHECK(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream));
    return;
  }
  if (!buf_) {
    COROLLA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&buf_), 2 * half_));
    for (cudaEvent_t& e : left_) COROLLA_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  if (used_ + n > half_) {
    COROLLA_CUDA_CHECK(cudaEventRecord(left_[cur_], stream));
    pending_[cur_] = true;
    cur_ ^= 1;
    used_ = 0;
    if (pending_[cur_]) COROLLA_CUDA_CHECK(cudaEventSynchronize(left_[cur_]));
    pending_[cur_] = false;
  }
  char* staged = buf_ + cur_ * half_ + used_;
  used_ += (n + 15) / 16 * 16;
  std::memcpy(staged, src, n);
  COROLLA_CUDA_CHECK(cudaMemcpyAsync(dst, staged, n, cudaMemcpyHostToDevice, stream));
}

HostIdsPool::Slot HostIdsPool::Acquire(int64_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].capacity < n) continue;
      Slot slot = free_[i];
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      return slot;
    }
  }
  Slot slot;
  slot.capacity = std::max<int64_t>(n, 256);
  COROLLA_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&slot.host), sizeof(int32_t) * slot.capacity));
  COROLLA_CUDA_CHECK(cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
  return slot;
}

void HostIdsPool::Release(Slot slot) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(slot);
}

HostIdsPool::~HostIdsPool() {
  for (Slot& slot : free_) {  // PendingIds hold the pool alive until they give their slot back
    cudaEventDestroy(slot.done);
    cudaFreeHost(slot.host);
  }
}

}  // namespace corolla::cuda
