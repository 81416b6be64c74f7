// Pinned host memory behind the CUDA backend's asynchronous copies. HostStaging: a ring that
// small host-to-device copies go through, because cudaMemcpyAsync from pageable memory may wait
// for the stream to drain (the CUDA runtime's API-sync rules), which would stall a host that
// prepares step N+1 while the device runs step N; from pinned memory it does not. HostIdsPool:
// the buffers, each with an event, that sampled token ids are copied back into.
// HostStaging is used by the backend's one thread; HostIdsPool is thread-safe.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace corolla::cuda {

class HostStaging {
 public:
  explicit HostStaging(size_t bytes = size_t{8} << 20) : half_(bytes / 2) {}
  ~HostStaging();
  HostStaging(const HostStaging&) = delete;
  HostStaging& operator=(const HostStaging&) = delete;

  // Enqueues dst <- src (n bytes, dst on the device) on `stream`; src may be reused once this
  // returns. Copies larger than half the ring, and copies while the stream is being captured
  // into a graph, go straight from src.
  void CopyToDevice(void* dst, const void* src, size_t n, cudaStream_t stream);

 private:
  // The ring's two halves alternate: leaving one records an event after the copies staged
  // there, and coming back to it waits for that event (in steady state long since reached).
  char* buf_ = nullptr;  // pinned, 2 * half_ bytes, allocated on first use
  const size_t half_;
  int cur_ = 0;       // the half being filled
  size_t used_ = 0;   // bytes of it taken
  cudaEvent_t left_[2] = {nullptr, nullptr};
  bool pending_[2] = {false, false};  // left_[h] recorded and not yet waited for
};

class HostIdsPool {
 public:
  struct Slot {
    int32_t* host = nullptr;  // pinned, `capacity` ids
    int64_t capacity = 0;
    cudaEvent_t done = nullptr;  // recorded after the copy into `host`
  };
  HostIdsPool() = default;
  ~HostIdsPool();  // every slot must be back
  HostIdsPool(const HostIdsPool&) = delete;
  HostIdsPool& operator=(const HostIdsPool&) = delete;

  Slot Acquire(int64_t n);  // a free slot of at least n ids, or a new one
  void Release(Slot slot);

 private:
  std::mutex mu_;
  std::vector<Slot> free_;  // GUARDED_BY(mu_)
};

}  // namespace corolla::cuda
