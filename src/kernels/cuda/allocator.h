// CachingAllocator: device memory for one CUDA device. Blocks are rounded up to a size class
// (powers of two split in four below 1 GiB, 2 MiB granules above) and a freed block goes to its
// class's free list, so steady-state Allocate never calls cudaMalloc. Freed memory is reused by
// later work on the backend's one stream, which orders it after the work that used it.
// CUDA graphs bake addresses in: while the graph pool is on, blocks come from (and go back to)
// a pool only graph captures use, never handed to eager work nor released to the device.
// Thread-safe (a mutex guards the free lists); shared by the backend and every Tensor it made.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

namespace corolla::cuda {

class CachingAllocator {
 public:
  explicit CachingAllocator(int device) : device_(device) {}
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (256-byte aligned); nullptr-free: aborts on out of memory
  // after releasing the cache and retrying once.
  void* Allocate(size_t bytes);
  void Free(void* ptr);
  // On: Allocate takes from the graph pool (cudaMalloc when it is empty); Free returns a block
  // to the pool it came from, whatever the mode. Graphs share the pool: they replay one at a
  // time on the backend's stream, so one graph's scratch may be another's.
  void SetGraphPool(bool on);
  // On: Free keeps blocks out of the free lists (still counted in use) until it is turned off.
  // The backend's side stream (Backend::RunOnSideStream) runs beside the main one until their
  // join, so a block freed by either in between must not serve the other's next allocation;
  // turned off at the join, after which both streams' uses are ordered before any later work.
  void DeferFrees(bool on);

  size_t bytes_cached() const;
  size_t bytes_in_use() const;
  int64_t num_device_mallocs() const { return num_mallocs_; }

  static size_t RoundSize(size_t bytes);

 private:
  void ReleaseCachedLocked();
  void FreeLocked(void* ptr);

  const int device_;
  mutable std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;  // GUARDED_BY(mu_): size class -> blocks
  std::map<void*, size_t> live_;               // GUARDED_BY(mu_): block -> size class
  std::map<size_t, std::vector<void*>> graph_free_;  // GUARDED_BY(mu_): the graph pool's free blocks
  std::set<void*> graph_blocks_;                     // GUARDED_BY(mu_): every block of the graph pool
  bool graph_pool_ = false;                          // GUARDED_BY(mu_)
  bool defer_frees_ = false;                         // GUARDED_BY(mu_)
  std::vector<void*> deferred_;                      // GUARDED_BY(mu_): freed while deferring
  size_t cached_bytes_ = 0;                    // GUARDED_BY(mu_)
  size_t live_bytes_ = 0;                      // GUARDED_BY(mu_)
  int64_t num_mallocs_ = 0;
};

}  // namespace corolla::cuda
