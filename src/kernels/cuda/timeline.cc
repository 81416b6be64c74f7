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
  uint64_t* records = nullptr;  // [window][kMaxCtas][kTimelineFields]
  std::vector<Launch> launches;
  bool printed = false;
  int graph_replays = 0;  // COROLLA_TIMELINE_GRAPH: print after this many replays (0: eager)
  int replays = 0;        // replays of the window's graph
  // Graph mode: the capture that recorded the window, once it has ended (the window is closed).
  cudaGraphExec_t graph = nullptr;
  std::string only;  // COROLLA_TIMELINE_ONLY: only launches whose name holds this are traced
};

Timeline& Get();

void ReportUnfilled() {
  Timeline& t = Get();
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.printed) return;
  if (t.graph_replays > 0) {
    std::fprintf(stderr,
                 "timeline: nothing printed: %lld launches traced in captures (the window starts after "
                 "COROLLA_TIMELINE=%lld), %d replays of its graph (COROLLA_TIMELINE_GRAPH=%d)\n",
                 static_cast<long long>(t.seen), static_cast<long long>(t.start), t.replays, t.graph_replays);
    return;
  }
  std::fprintf(stderr,
               "timeline: nothing printed: %lld traced launches, the window needs %lld "
               "(COROLLA_TIMELINE=%lld + COROLLA_TIMELINE_LAUNCHES=%lld); lower COROLLA_TIMELINE\n",
               static_cast<long long>(t.seen), static_cast<long long>(t.start + t.window + 1),
               static_cast<long long>(t.start), static_cast<long long>(t.window));
}

Timeline& Get() {
  static Timeline* t = [] {
    auto* tl = new Timeline;
    if (const char* v = std::getenv("COROLLA_TIMELINE")) tl->start = std::atoll(v);
    tl->window = 400;
    if (const char* v = std::getenv("COROLLA_TIMELINE_LAUNCHES")) tl->window = std::max(1ll, std::atoll(v));
    if (const char* v = std::getenv("COROLLA_TIMELINE_ONLY")) tl->only = v;
    if (const char* v = std::getenv("COROLLA_TIMELINE_GRAPH")) tl->graph_replays = std::max(1, std::atoi(v));
    // A window never filled prints nothing else: say so at exit, with the launches there were
    // (e.g. `bench decode --skip-op` runs fewer launches a step than the default start expects).
    if (tl->start >= 0) std::atexit(ReportUnfilled);
    return tl;
  }();
  return *t;
}

void Print(Timeline& t, cudaStream_t s) {
  COROLLA_CUDA_CHECK(cudaStreamSynchronize(s));
  constexpr int kF = kTimelineFields;
  const size_t per = static_cast<size_t>(kMaxCtas) * kF;
  std::vector<uint64_t> host(t.launches.size() * per);
  COROLLA_CUDA_CHECK(cudaMemcpy(host.data(), t.records, host.size() * 8, cudaMemcpyDeviceToHost));
  struct Span {
    double entry_min, entry_max, waited_max, exit_max;
    double mark_max[kTimelineMarks];  // the latest CTA's mark (0: none)
  };
  std::vector<Span> spans;
  uint64_t origin = ~0ull;
  for (size_t i = 0; i < t.launches.size(); ++i)
    for (int64_t c = 0; c < std::min(t.launches[i].ctas, kMaxCtas); ++c)
      if (host[i * per + c * kF] != 0) origin = std::min(origin, host[i * per + c * kF]);
  for (size_t i = 0; i < t.launches.size(); ++i) {
    Span sp{1e30, 0, 0, 0, {}};
    for (int64_t c = 0; c < std::min(t.launches[i].ctas, kMaxCtas); ++c) {
      const uint64_t* r = &host[i * per + c * kF];
      if (r[0] == 0) continue;  // not traced (too many CTAs)
      sp.entry_min = std::min(sp.entry_min, (r[0] - origin) * 1e-3);
      sp.entry_max = std::max(sp.entry_max, (r[0] - origin) * 1e-3);
      if (r[1] != 0) sp.waited_max = std::max(sp.waited_max, (r[1] - origin) * 1e-3);
      sp.exit_max = std::max(sp.exit_max, (r[2] - origin) * 1e-3);
      for (int m = 0; m < kTimelineMarks; ++m)
        if (r[3 + m] != 0) sp.mark_max[m] = std::max(sp.mark_max[m], (r[3 + m] - origin) * 1e-3);
    }
    if (sp.entry_min > 1e29) {  // nothing recorded: a zero-length span at the previous exit
      const double prev = spans.empty() ? 0.0 : spans.back().exit_max;
      sp = Span{prev, prev, prev, prev, {}};
    }
    spans.push_back(sp);
  }
  struct Sum {
    int n = 0;
    double early = 0, release = 0, run = 0, path = 0;
    int marked[kTimelineMarks] = {};
    double mark[kTimelineMarks] = {};  // the latest CTA's mark after the last wait
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
    for (int m = 0; m < kTimelineMarks; ++m)
      if (spans[i].mark_max[m] > 0) {
        ++s2.marked[m];
        s2.mark[m] += spans[i].mark_max[m] - spans[i].waited_max;
      }
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
  // How the CTAs of the wider launches spread: their entries, returns from the wait and exits at
  // the 10th, 50th and 90th percentile (CTA waves, a ramp, a tail).
  std::printf("  spread of the first launches' CTAs (percentiles 10 / 50 / 90, us):\n");
  for (size_t i = 0; i < std::min<size_t>(spans.size(), 24); ++i) {
    const int64_t n = std::min(t.launches[i].ctas, kMaxCtas);
    if (n < 32) continue;
    std::vector<double> entry, waited, exit;
    for (int64_t c = 0; c < n; ++c) {
      const uint64_t* r = &host[i * per + c * kF];
      if (r[0] == 0) continue;
      entry.push_back((r[0] - origin) * 1e-3);
      if (r[1] != 0) waited.push_back((r[1] - origin) * 1e-3);  // a kernel with no wait stamps none
      exit.push_back((r[2] - origin) * 1e-3);
    }
    if (entry.empty()) continue;
    for (auto* v : {&entry, &waited, &exit}) std::sort(v->begin(), v->end());
    auto at = [](const std::vector<double>& v, int pct) { return v.empty() ? 0.0 : v[(v.size() - 1) * pct / 100]; };
    std::printf("  #%-3zu %-24s entry %8.2f %8.2f %8.2f  waited %8.2f %8.2f %8.2f  exit %8.2f %8.2f %8.2f\n", i,
                t.launches[i].name.c_str(), at(entry, 10), at(entry, 50), at(entry, 90), at(waited, 10),
                at(waited, 50), at(waited, 90), at(exit, 10), at(exit, 50), at(exit, 90));
  }
  bool header = false;
  for (const auto& [name, s2] : sums) {
    if (std::none_of(s2.marked, s2.marked + kTimelineMarks, [](int n) { return n > 0; })) continue;
    if (!header) std::printf("  phases (Mark i: the latest CTA's mark after the last wait, mean over launches, us):\n");
    header = true;
    std::printf("  %-28s", name.c_str());
    for (int m = 0; m < kTimelineMarks; ++m)
      if (s2.marked[m] > 0) std::printf("  mark%d %6.2f", m, s2.mark[m] / s2.marked[m]);
    std::printf("  run %6.2f\n", s2.run / s2.n);
  }
  std::fflush(stdout);
}

}  // namespace

bool TimelineOn() { return Get().start >= 0; }

uint64_t* TimelineRecord(std::string_view name, int64_t ctas, cudaStream_t s) {
  Timeline& t = Get();
  if (t.start < 0 || t.printed) return nullptr;
  if (!t.only.empty() && name.find(t.only) == std::string_view::npos) return nullptr;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  COROLLA_CUDA_CHECK(cudaStreamIsCapturing(s, &capturing));
  const bool graph = t.graph_replays > 0;
  if ((capturing != cudaStreamCaptureStatusNone) != graph) return nullptr;
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.graph != nullptr) return nullptr;
  const int64_t index = t.seen++ - t.start;
  if (index < 0) return nullptr;
  if (index >= t.window) {
    if (graph) return nullptr;  // printed after a replay
    Print(t, s);
    t.printed = true;
    return nullptr;
  }
  if (t.records == nullptr) {
    // Zeroed on a stream of its own and waited for, so that a capture (relaxed: cudaMalloc is
    // allowed) records no memset node.
    const size_t bytes = static_cast<size_t>(t.window) * kMaxCtas * kTimelineFields * 8;
    cudaStream_t zero = nullptr;
    COROLLA_CUDA_CHECK(cudaMalloc(&t.records, bytes));
    COROLLA_CUDA_CHECK(cudaStreamCreateWithFlags(&zero, cudaStreamNonBlocking));
    COROLLA_CUDA_CHECK(cudaMemsetAsync(t.records, 0, bytes, zero));
    COROLLA_CUDA_CHECK(cudaStreamSynchronize(zero));
    COROLLA_CUDA_CHECK(cudaStreamDestroy(zero));
  }
  t.launches.push_back({std::string(name), ctas});
  if (ctas > kMaxCtas) return nullptr;  // listed with zeros
  return t.records + static_cast<size_t>(index) * kMaxCtas * kTimelineFields;
}

void TimelineGraphCaptured(cudaGraphExec_t exec) {
  Timeline& t = Get();
  if (t.graph_replays == 0) return;
  std::lock_guard<std::mutex> lock(t.mu);
  if (t.graph != nullptr || t.launches.empty()) return;  // the window was closed before, or is not yet open
  t.graph = exec;
}

void TimelineGraphReplayed(cudaGraphExec_t exec, cudaStream_t s) {
  Timeline& t = Get();
  if (t.graph_replays == 0 || t.printed) return;
  std::lock_guard<std::mutex> lock(t.mu);
  if (exec != t.graph || ++t.replays < t.graph_replays) return;
  std::printf("timeline: graph replay %d\n", t.replays);
  Print(t, s);
  t.printed = true;
}

}  // namespace corolla::cuda
