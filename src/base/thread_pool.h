// A fixed pool of worker threads for data-parallel loops on the CPU backend.
// ParallelFor is safe to call from one thread at a time per pool (the engine's step thread);
// nested calls from inside a task run serially on the calling worker.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace corolla {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);  // 0: hardware concurrency
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `grain` items,
  // one chunk per thread (the caller takes one). Returns when all are done.
  void ParallelFor(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

  // The process-wide pool used by the CPU kernels (COROLLA_NUM_THREADS overrides its size).
  static ThreadPool& Default();

 private:
  void WorkerLoop(int worker_idx);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(int64_t, int64_t)>* task_ = nullptr;  // guarded by mu_
  int64_t task_n_ = 0;
  int num_chunks_ = 0;
  int64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace corolla
