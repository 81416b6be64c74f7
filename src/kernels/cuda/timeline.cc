#include "kernels/cuda/timeline.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_check.h"

namespace corolla::cuda {
namespace {

constexpr int64_t kMaxCtas = 4096;

struct Launch {
  std::string name;
  int64_t ctas;
};

struct Timeline {
  std::mutex mu;
  int64_t start = -1, window = 0, seen = 0;
  uint64_t* records = nullptr;  // [window][kMaxCtas][3]
  std::vector<Launch> launches;
  bool printed = false;
};

Timeline& Get() {
  static Timeline* t = [] {
    auto* tl = new Timeline;
    if (const char* v = std::getenv("COROLLA_TIMELINE")) tl->start = std::atoll(v);
    tl->window = 400;
    if (const char* v = std::getenv("COROLLA_TIMELINE_LAUNCHES")) tl->window = std::max(1ll, std::atoll(v));
    return tl;
  }();
  return *t;
}

void Print(Timeline& t, cudaStream_t s) {
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));
  const size_t per = static_cast<size_t>(kMaxCtas) * 3;
  std::vector<uint64_t> host(t.launches.size() * per);
  COROLLA_CUDA_CHECK(cudaMemcpy(host.data(), t.records, host.size() * 8, cudaMemcpyDeviceToHost));
  struct Span {
    double entry_min, entry_max, waited_max, exit_max;
  };
  std::vector<Span> spans;
  uint64_t origin = ~0ull;
  for (size_t i = 0; i < t.launches.size(); ++i)
    for (int64_t c = 0; c < std::min(t.launches[i].ctas, kMaxCtas); ++c)
      if (host[i * per + c * 3] != 0) origin = std::min(origin, host[i * per + c * 3]);
  for (size_t i = 0; i < t.launches.size(); ++i) {
    Span sp{1e30, 0, 0, 0};
    for (int64_t c = 0; c < std::min(t.launches[i].ctas, kMaxCtas); ++c) {
      const uint64_t* r = &host[i * per + c * 3];
      if (r[0] == 0) continue;  // not traced (too many CTAs)
      sp.entry_min = std::min(sp.entry_min, (r[0] - origin) * 1e-3);
      sp.entry_max = std::max(sp.entry_max, (r[0] - origin) * 1e-3);
      if (r[1] != 0) sp.waited_max = std::max(sp.waited_max, (r[1] - origin) * 1e-3);
      sp.exit_max = std::max(sp.exit_max, (r[2] - origin) * 1e-3);
    }
    if (sp.entry_min > 1e29) {  // nothing recorded: a zero-length span at the previous exit
      const double prev = spans.empty() ? 0.0 : spans.back().exit_max;
      sp = Span{prev, prev, prev, prev};
    }
    spans.push_back(sp);
  }
  struct Sum {
    int n = 0;
    double early = 0, release = 0, run = 0, path = 0;
  };
  std::map<std::string, Sum> sums;
  for (size_t i = 1; i < spans.size(); ++i) {
    const double prev = spans[i - 1].exit_max;
    Sum& s2 = sums[t.launches[i].name];
    ++s2.n;
    s2.early += prev - spans[i].entry_min;
    s2.release += spans[i].waited_max - prev;
    s2.run += spans[i].exit_max - spans[i].waited_max;
    s2.path += spans[i].exit_max - prev;
  }
  std::printf("timeline: %zu launches over %.1f us (means in us; path adds up to the span)\n", spans.size(),
              spans.back().exit_max - spans.front().entry_min);
  std::printf("  %-28s %6s %8s %8s %8s %8s %10s\n", "kernel", "count", "early", "release", "run", "path", "path total");
  for (const auto& [name, s2] : sums)
    std::printf("  %-28s %6d %8.2f %8.2f %8.2f %8.2f %10.1f\n", name.c_str(), s2.n, s2.early / s2.n, s2.release / s2.n,
                s2.run / s2.n, s2.path / s2.n, s2.path);
  for (size_t i = 0; i < std::min<size_t>(spans.size(), 24); ++i)
    std::printf("  #%-3zu %-28s ctas %5lld entry %9.2f..%9.2f waited %9.2f exit %9.2f\n", i, t.launches[i].name.c_str(),
                static_cast<long long>(t.launches[i].ctas), spans[i].entry_min, spans[i].entry_max, spans[i].waited_max,
                spans[i].exit_max);
  std::fflush(stdout);
}

}  // namespace

bool TimelineOn() { return Get().start >= 0; }

uint64_t* TimelineRecord(std::string_view name, int64_t ctas, cudaStream_t s) {
  Timeline& t = Get();
  if (t.start < 0 || t.printed) return nullptr;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  COROLLA_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
  if (capturing != cudaStreamCaptureStatusNone) return nullptr;
  std::lock_guard<std::mutex> lock(t.mu);
  const int64_t index = t.seen++ - t.start;
  if (index < 0) return nullptr;
  if (index >= t.window) {
    Print(t, s);
    t.printed = true;
    return nullptr;
  }
  if (t.records == nullptr) {
    const size_t bytes = static_cast<size_t>(t.window) * kMaxCtas * 3 * 8;
    COROLLA_CUDA_CHECK(cudaMalloc(&t.records, bytes));
    COROLLA_CUDA_CHECK(cudaMemsetAsync(t.records, 0, bytes, s));
  }
  t.launches.push_back({std::string(name), ctas});
  if (ctas > kMaxCtas) return nullptr;  // listed with zeros
  return t.records + static_cast<size_t>(index) * kMaxCtas * 3;
}

}  // namespace corolla::cuda
