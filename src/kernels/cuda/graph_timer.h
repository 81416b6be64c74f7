// Device timing and graph replay on a CudaBackend's stream, for benchmarks above the kernels
// (the CLI's `bench decode|prefill`), through an interface that needs no CUDA header.
// Both are used by one thread, with the backend they were made for (which must outlive them).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "kernels/backend.h"
#include "kernels/profiling_backend.h"

namespace corolla::cuda {

// CUDA events around work enqueued on the backend's stream.
class StreamTimer {
 public:
  // Null when `backend` is not the CUDA backend.
  static std::unique_ptr<StreamTimer> Create(Backend& backend);
  ~StreamTimer();
  // Milliseconds between events recorded before and after fn() enqueues its work.
  double Time(const std::function<void()>& fn);
  // HBM copy bandwidth (bytes read + written per second): median of 7 cudaMemcpyAsync
  // device-to-device copies of `bytes` (random contents).
  double CopyBandwidth(size_t bytes);

 private:
  struct Impl;
  explicit StreamTimer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Op boundaries as CUDA events on the backend's stream. Marks made while the stream is being
// captured become event-record nodes of the graph (cudaEventRecordExternal), so a replay
// times each op with no host launch gaps in between; outside a capture they are plain records.
// Null when `backend` is not the CUDA backend.
std::unique_ptr<OpClock> MakeEventOpClock(Backend& backend);

// The work fn() enqueues, captured once as a CUDA graph and replayed. fn must not synchronise
// the host, and every buffer it allocates must come back at the same address on replay (true
// of the caching allocator when nothing else allocates in between).
class StreamGraph {
 public:
  // Null (with a message in *error) when the capture fails.
  static std::unique_ptr<StreamGraph> Capture(Backend& backend, const std::function<void()>& fn,
                                              std::string* error);
  ~StreamGraph();
  void Replay();  // enqueues one replay on the backend's stream

 private:
  struct Impl;
  explicit StreamGraph(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace corolla::cuda
