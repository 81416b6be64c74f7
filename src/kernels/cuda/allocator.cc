#include "kernels/cuda/allocator.h"

#include "kernels/cuda/cuda_check.h"

namespace corolla::cuda {

size_t CachingAllocator::RoundSize(size_t bytes) {
  constexpr size_t kMin = 512;
  constexpr size_t kLarge = size_t{1} << 30;
  constexpr size_t kGranule = size_t{2} << 20;
  if (bytes <= kMin) return kMin;
  if (bytes >= kLarge) return (bytes + kGranule - 1) / kGranule * kGranule;
  // Four classes per power of two: waste at most 25%.
  size_t p = size_t{1} << (63 - __builtin_clzll(bytes - 1));  // largest power of two < bytes
  size_t step = p / 4;
  return (bytes + step - 1) / step * step;
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseCachedLocked();
  // Live blocks belong to tensors that outlive the backend; leave them to process exit.
}

void CachingAllocator::ReleaseCachedLocked() {
  int prev = -1;
  cudaGetDevice(&prev);
  cudaSetDevice(device_);
  cudaDeviceSynchronize();
  for (auto& [size, blocks] : free_)
    for (void* p : blocks) COROLLA_CUDA_CHECK(cudaFree(p));
  free_.clear();
  cached_bytes_ = 0;
  if (prev >= 0) cudaSetDevice(prev);
}

void* CachingAllocator::Allocate(size_t bytes) {
  size_t size = RoundSize(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  auto& free_lists = graph_pool_ ? graph_free_ : free_;
  auto it = free_lists.find(size);
  void* p = nullptr;
  if (it != free_lists.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    if (!graph_pool_) cached_bytes_ -= size;
  } else {
    cudaError_t err = cudaMalloc(&p, size);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear the sticky-free error state
      ReleaseCachedLocked();
      err = cudaMalloc(&p, size);
    }
    COROLLA_CHECK(err == cudaSuccess) << "cudaMalloc(" << size << ") on device " << device_ << ": "
                                      << cudaGetErrorString(err) << "; in use " << live_bytes_;
    ++num_mallocs_;
    if (graph_pool_) graph_blocks_.insert(p);
  }
  live_[p] = size;
  live_bytes_ += size;
  return p;
}

void CachingAllocator::Free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (defer_frees_) {
    COROLLA_CHECK(live_.count(ptr)) << "freeing unknown device pointer";
    deferred_.push_back(ptr);
    return;
  }
  FreeLocked(ptr);
}

void CachingAllocator::DeferFrees(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  defer_frees_ = on;
  if (on) return;
  for (void* p : deferred_) FreeLocked(p);
  deferred_.clear();
}

void CachingAllocator::FreeLocked(void* ptr) {
  auto it = live_.find(ptr);
  COROLLA_CHECK(it != live_.end()) << "freeing unknown device pointer";
  size_t size = it->second;
  live_.erase(it);
  live_bytes_ -= size;
  if (graph_blocks_.count(ptr)) {
    graph_free_[size].push_back(ptr);
    return;
  }
  free_[size].push_back(ptr);
  cached_bytes_ += size;
}

void CachingAllocator::SetGraphPool(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  graph_pool_ = on;
}

size_t CachingAllocator::bytes_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}
size_t CachingAllocator::bytes_in_use() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_bytes_;
}

}  // namespace corolla::cuda
