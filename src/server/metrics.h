// Server metrics in the Prometheus text format: request outcomes, token counts, latency
// histograms (time to first token, inter-token latency, end-to-end), and the engine's gauges
// (running/waiting requests, KV usage, prefix-cache hit rate). Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "base/histogram.h"
#include "engine/async_engine.h"

namespace corolla::server {

// Appends `h` in the Prometheus text format: the HELP and TYPE lines unless `header` is false
// (a further label set of a histogram already begun), then cumulative buckets, sum and count.
void RenderHistogram(const Histogram& h, const std::string& name, const std::string& help,
                     const std::string& labels, std::string* out, bool header = true);

class Metrics {
 public:
  explicit Metrics(std::string model_name);

  // outcome: "stop", "length", "abort", "error", "rejected"
  void RequestFinished(const std::string& outcome);
  void AddTokens(int64_t prompt, int64_t generation);
  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  void ObserveEndToEnd(double seconds);
  std::string Render(const EngineStats* stats) const;  // stats null while loading

 private:
  std::string labels_;  // model_name="..."
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> requests_;
  uint64_t prompt_tokens_ = 0, generation_tokens_ = 0;
  Histogram ttft_, itl_, e2e_;
};

}  // namespace corolla::server
