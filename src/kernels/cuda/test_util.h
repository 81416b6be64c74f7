// Helpers of the CUDA tests: the shared GPU backend and its test fixture, random bf16-rounded
// inputs, host <-> backend copies, NaN poisoning, the normalised error ||out - ref|| / ||ref||,
// and a results table printed at exit (by cuda_kernels_test.cc's main).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/numeric.h"
#include "kernels/backend.h"
#include "kernels/cuda/ops.h"

namespace corolla::cuda_test {

// The CUDA backend on device 0 shared by the kernel tests; null without a device.
inline Backend* Gpu() {
  static std::unique_ptr<Backend> be = [] {
    auto r = MakeCudaBackend(0);
    return r.ok() ? std::move(r).value() : nullptr;
  }();
  return be.get();
}

// Tuning() as the process started (environment applied), to restore after a sweep.
inline const cuda::KernelTuning& DefaultTuning() {
  static const cuda::KernelTuning defaults = cuda::Tuning();
  return defaults;
}
// Puts Tuning() back to DefaultTuning() when it leaves scope: a test that changes knobs holds one.
struct TuningRestore {
  ~TuningRestore() { cuda::Tuning() = DefaultTuning(); }
};

// The tests' random generator. CudaKernelTest seeds it per test, from the test's name (FNV-1a:
// the same on every build), so that a test draws the same inputs whatever ran before it: a
// filtered run repeats what the whole suite saw. COROLLA_TEST_SEED mixes in another seed.
inline std::mt19937& Rng() {
  static std::mt19937 rng(12345);
  return rng;
}
inline uint32_t TestSeed(const std::string& name) {
  uint32_t h = 2166136261u;
  for (unsigned char c : name) h = (h ^ c) * 16777619u;
  if (const char* extra = std::getenv("COROLLA_TEST_SEED")) h ^= static_cast<uint32_t>(std::strtoul(extra, nullptr, 10));
  return h;
}

class CudaKernelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Gpu() == nullptr) GTEST_SKIP() << "no CUDA device";
    DefaultTuning();  // captured before any test changes Tuning() (a test's Restore goes back to it)
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    Rng().seed(TestSeed(std::string(info->test_suite_name()) + "." + info->name()));
  }
  Backend& gpu() { return *Gpu(); }
};

inline constexpr double kBf16Tol = 1e-2;
inline constexpr double kF32Tol = 1e-4;

// n values uniform in [-scale, scale], rounded to bf16 so both backends see the same inputs.
inline std::vector<float> RandomBf16(int64_t n, float scale = 1.0f) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = ToFloat(ToBf16(d(Rng())));
  return v;
}

// A host f32 tensor holding `v`.
inline Tensor HostF32(const std::vector<float>& v, Shape shape) {
  Tensor t = Tensor::Empty(DType::kF32, shape);
  std::copy(v.begin(), v.end(), t.ptr<float>());
  return t;
}
inline Tensor HostI32(const std::vector<int32_t>& v, Shape shape) {
  Tensor t = Tensor::Empty(DType::kI32, shape);
  std::copy(v.begin(), v.end(), t.ptr<int32_t>());
  return t;
}

// A backend tensor of dtype `dt` (bf16 or f32) holding `v`.
inline Tensor Upload(Backend& be, const std::vector<float>& v, Shape shape, DType dt) {
  Tensor t = be.Empty(dt, shape);
  if (dt == DType::kBF16) {
    std::vector<bf16> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = ToBf16(v[i]);
    be.CopyFromHost(h.data(), t);
  } else {
    be.CopyFromHost(v.data(), t);
  }
  return t;
}
inline Tensor UploadI32(Backend& be, const std::vector<int32_t>& v, Shape shape) {
  Tensor t = be.Empty(DType::kI32, shape);
  be.CopyFromHost(v.data(), t);
  return t;
}

inline std::vector<float> Download(Backend& be, const TensorView& t) {
  std::vector<float> out(t.numel());
  if (t.dtype == DType::kBF16) {
    std::vector<bf16> h(t.numel());
    be.CopyToHost(t, h.data());
    for (size_t i = 0; i < h.size(); ++i) out[i] = ToFloat(h[i]);
  } else {
    be.CopyToHost(t, out.data());
  }
  return out;
}
inline std::vector<int32_t> DownloadI32(Backend& be, const TensorView& t) {
  std::vector<int32_t> out(t.numel());
  be.CopyToHost(t, out.data());
  return out;
}

// Fills a contiguous backend tensor with NaN so unwritten outputs fail the comparison.
inline void Poison(Backend& be, const TensorView& t) {
  if (t.dtype == DType::kBF16) {
    std::vector<bf16> h(t.numel(), bf16::FromBits(0x7fc0));
    be.CopyFromHost(h.data(), t);
  } else {
    std::vector<float> h(t.numel(), NAN);
    be.CopyFromHost(h.data(), t);
  }
}

// ||a - b|| / ||b||; infinity when a has a NaN/inf or the sizes differ.
inline double RelError(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    double d = static_cast<double>(a[i]) - b[i];
    num += d * d;
    den += static_cast<double>(b[i]) * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

struct ResultRow {
  std::string kernel, shape;
  double error;
  double tolerance;
};
inline std::vector<ResultRow>& Results() {
  static std::vector<ResultRow> rows;
  return rows;
}
inline void Record(const std::string& kernel, const std::string& shape, double error, double tol) {
  Results().push_back({kernel, shape, error, tol});
}

// Milliseconds between CUDA events recorded on `stream` before and after fn() enqueues its work.
inline float EventMs(cudaStream_t stream, const std::function<void()>& fn) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  cudaEventRecord(a, stream);
  fn();
  cudaEventRecord(b, stream);
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms;
}

// Mean device time (us) of `iters` back-to-back calls of fn on `stream`, after one warm-up,
// by CUDA events.
inline double TimeUs(cudaStream_t stream, const std::function<void()>& fn, int iters) {
  fn();
  return 1e3 * EventMs(stream, [&] {
           for (int i = 0; i < iters; ++i) fn();
         }) / iters;
}

// Mean device time (us) of fn's work, captured `reps` times into one CUDA graph and replayed:
// no host launch gaps, for work shorter than its launches. fn runs once first, uncaptured.
inline double GraphUs(cudaStream_t stream, const std::function<void()>& fn, int reps) {
  fn();
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
  for (int i = 0; i < reps; ++i) fn();
  if (cudaStreamEndCapture(stream, &graph) != cudaSuccess ||
      cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
    return -1;
  cudaGraphLaunch(exec, stream);
  const float ms = EventMs(stream, [&] { cudaGraphLaunch(exec, stream); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return 1e3 * ms / reps;
}

// Median device time (us) of `reps` calls of fn on `stream`, each timed alone by CUDA events,
// after one warm-up.
inline double MedianUs(cudaStream_t stream, const std::function<void()>& fn, int reps) {
  fn();
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) ms.push_back(EventMs(stream, fn));
  std::sort(ms.begin(), ms.end());
  return 1e3 * ms[ms.size() / 2];
}

}  // namespace corolla::cuda_test
