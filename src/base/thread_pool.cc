#include "base/thread_pool.h"

#include <algorithm>
#include <cstdlib>

namespace corolla {
namespace {
thread_local bool tls_in_pool_task = false;

void ChunkBounds(int64_t n, int num_chunks, int idx, int64_t* begin, int64_t* end) {
  int64_t base = n / num_chunks, rem = n % num_chunks;
  *begin = idx * base + std::min<int64_t>(idx, rem);
  *end = *begin + base + (idx < rem ? 1 : 0);
}
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 0; i + 1 < num_threads; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::Default() {
  static ThreadPool* pool = [] {
    const char* env = std::getenv("COROLLA_NUM_THREADS");
    return new ThreadPool(env ? std::atoi(env) : 0);
  }();
  return *pool;
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  int chunks = static_cast<int>(std::min<int64_t>(num_threads(), (n + grain - 1) / grain));
  if (chunks <= 1 || tls_in_pool_task || workers_.empty()) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    task_ = &fn;
    task_n_ = n;
    num_chunks_ = chunks;
    pending_ = chunks - 1;
    ++generation_;
  }
  work_cv_.notify_all();
  int64_t begin, end;
  ChunkBounds(n, chunks, 0, &begin, &end);
  tls_in_pool_task = true;
  fn(begin, end);
  tls_in_pool_task = false;
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [this] { return pending_ == 0; });
  task_ = nullptr;
}

void ThreadPool::WorkerLoop(int worker_idx) {
  tls_in_pool_task = true;
  int64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* task;
    int64_t n;
    int chunks;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      task = task_;
      n = task_n_;
      chunks = num_chunks_;
    }
    int chunk = worker_idx + 1;
    if (task != nullptr && chunk < chunks) {
      int64_t begin, end;
      ChunkBounds(n, chunks, chunk, &begin, &end);
      (*task)(begin, end);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }
}

}  // namespace corolla
