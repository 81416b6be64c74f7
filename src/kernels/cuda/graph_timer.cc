#include "kernels/cuda/graph_timer.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/timeline.h"

namespace corolla::cuda {

struct StreamTimer::Impl {
  cudaStream_t stream;
  cudaEvent_t start, stop;
};

std::unique_ptr<StreamTimer> StreamTimer::Create(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) return nullptr;
  auto impl = std::make_unique<Impl>();
  impl->stream = cuda->stream();
  COROLLA_CUDA_CHECK(cudaEventCreate(&impl->start));
  COROLLA_CUDA_CHECK(cudaEventCreate(&impl->stop));
  return std::unique_ptr<StreamTimer>(new StreamTimer(std::move(impl)));
}

StreamTimer::StreamTimer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StreamTimer::~StreamTimer() {
  cudaEventDestroy(impl_->start);
  cudaEventDestroy(impl_->stop);
}

double StreamTimer::Time(const std::function<void()>& fn) {
  COROLLA_CUDA_CHECK(cudaEventRecord(impl_->start, impl_->stream));
  fn();
  COROLLA_CUDA_CHECK(cudaEventRecord(impl_->stop, impl_->stream));
  COROLLA_CUDA_CHECK(cudaEventSynchronize(impl_->stop));
  float ms = 0;
  COROLLA_CUDA_CHECK(cudaEventElapsedTime(&ms, impl_->start, impl_->stop));
  return ms;
}

double StreamTimer::CopyBandwidth(size_t bytes) {
  void *a = nullptr, *b = nullptr;
  COROLLA_CUDA_CHECK(cudaMalloc(&a, bytes));
  COROLLA_CUDA_CHECK(cudaMalloc(&b, bytes));
  std::vector<uint32_t> block(1 << 20);
  uint32_t x = 12345;
  for (auto& v : block) v = x = x * 1664525u + 1013904223u;
  for (size_t off = 0; off < bytes; off += block.size() * 4)
    COROLLA_CUDA_CHECK(cudaMemcpy(static_cast<char*>(a) + off, block.data(),
                                  std::min(bytes - off, block.size() * 4), cudaMemcpyHostToDevice));
  std::vector<double> ms;
  for (int i = 0; i < 8; ++i) {
    const double t = Time([&] {
      COROLLA_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, impl_->stream));
    });
    if (i > 0) ms.push_back(t);  // the first is a warm-up
  }
  std::sort(ms.begin(), ms.end());
  COROLLA_CUDA_CHECK(cudaFree(a));
  COROLLA_CUDA_CHECK(cudaFree(b));
  return 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3);
}

namespace {

class EventOpClock final : public OpClock {
 public:
  explicit EventOpClock(cudaStream_t stream) : stream_(stream) {}
  ~EventOpClock() override {
    for (cudaEvent_t e : events_) cudaEventDestroy(e);
  }
  void Reset() override { used_ = 0; }
  void Mark() override {
    if (used_ == events_.size()) {
      cudaEvent_t e;
      COROLLA_CUDA_CHECK(cudaEventCreate(&e));
      events_.push_back(e);
    }
    // External records are for captures only (elsewhere the runtime refuses the flag).
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    COROLLA_CUDA_CHECK(cudaStreamIsCapturing(stream_, &capturing));
    if (capturing == cudaStreamCaptureStatusActive)
      COROLLA_CUDA_CHECK(cudaEventRecordWithFlags(events_[used_++], stream_, cudaEventRecordExternal));
    else
      COROLLA_CUDA_CHECK(cudaEventRecord(events_[used_++], stream_));
  }
  std::vector<double> IntervalsMs() override {
    std::vector<double> ms;
    if (used_ == 0) return ms;
    COROLLA_CUDA_CHECK(cudaEventSynchronize(events_[used_ - 1]));
    for (size_t i = 1; i < used_; ++i) {
      float t = 0;
      COROLLA_CUDA_CHECK(cudaEventElapsedTime(&t, events_[i - 1], events_[i]));
      ms.push_back(t);
    }
    return ms;
  }

 private:
  cudaStream_t stream_;
  std::vector<cudaEvent_t> events_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<OpClock> MakeEventOpClock(Backend& backend) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) return nullptr;
  return std::make_unique<EventOpClock>(cuda->stream());
}

struct StreamGraph::Impl {
  cudaStream_t stream;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

std::unique_ptr<StreamGraph> StreamGraph::Capture(Backend& backend, const std::function<void()>& fn,
                                                  std::string* error) {
  auto* cuda = dynamic_cast<CudaBackend*>(&backend);
  if (cuda == nullptr) {
    *error = "not the CUDA backend";
    return nullptr;
  }
  auto impl = std::make_unique<Impl>();
  impl->stream = cuda->stream();
  // Relaxed: the allocator may still cudaMalloc (outside the stream) during the capture.
  cudaError_t err = cudaStreamBeginCapture(impl->stream, cudaStreamCaptureModeRelaxed);
  if (err == cudaSuccess) {
    fn();
    err = cudaStreamEndCapture(impl->stream, &impl->graph);
  }
  if (err == cudaSuccess) err = cudaGraphInstantiate(&impl->exec, impl->graph, 0);
  if (err == cudaSuccess) TimelineGraphCaptured(impl->exec);
  if (err != cudaSuccess) {
    *error = cudaGetErrorString(err);
    cudaGetLastError();
    if (impl->graph) cudaGraphDestroy(impl->graph);
    return nullptr;
  }
  return std::unique_ptr<StreamGraph>(new StreamGraph(std::move(impl)));
}

StreamGraph::StreamGraph(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

StreamGraph::~StreamGraph() {
  cudaGraphExecDestroy(impl_->exec);
  cudaGraphDestroy(impl_->graph);
}

void StreamGraph::Replay() {
  COROLLA_CUDA_CHECK(cudaGraphLaunch(impl_->exec, impl_->stream));
  TimelineGraphReplayed(impl_->exec, impl_->stream);
}

}  // namespace corolla::cuda
