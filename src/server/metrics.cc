#include "server/metrics.h"

#include <cstdio>

namespace corolla::server {

namespace {
std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.9g", v);
  return buf;
}
}  // namespace

void RenderHistogram(const Histogram& h, const std::string& name, const std::string& help,
                     const std::string& labels, std::string* out, bool header) {
  if (header) *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t b = 0; b < h.counts().size(); ++b) {
    cumulative += h.counts()[b];
    std::string le = b < h.bounds().size() ? Num(h.bounds()[b]) : "+Inf";
    *out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_sum{" + labels + "} " + Num(h.sum()) + "\n";
  *out += name + "_count{" + labels + "} " + std::to_string(h.count()) + "\n";
}

Metrics::Metrics(std::string model_name)
    : labels_("model_name=\"" + model_name + "\""),
      ttft_({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640}),
      itl_({0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}),
      e2e_({0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}) {}

void Metrics::RequestFinished(const std::string& outcome) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[outcome];
}
void Metrics::AddTokens(int64_t prompt, int64_t generation) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  generation_tokens_ += generation;
}
void Metrics::ObserveTimeToFirstToken(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(s);
}
void Metrics::ObserveInterTokenLatency(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  itl_.Observe(s);
}
void Metrics::ObserveEndToEnd(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  e2e_.Observe(s);
}

std::string Metrics::Render(const EngineStats* stats) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  auto gauge = [&](const std::string& name, const std::string& help, double v) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " gauge\n" + name + "{" + labels_ + "} " + Num(v) + "\n";
  };
  auto counter = [&](const std::string& name, const std::string& help, double v) {
    out += "# HELP " + name + " " + help + "\n# TYPE " + name + " counter\n" + name + "{" + labels_ + "} " + Num(v) + "\n";
  };
  out += "# HELP corolla:request_success_total Finished requests by outcome.\n# TYPE corolla:request_success_total counter\n";
  for (const char* outcome : {"stop", "length", "abort", "error", "rejected"}) {
    auto it = requests_.find(outcome);
    out += "corolla:request_success_total{" + labels_ + ",finished_reason=\"" + outcome + "\"} " +
           std::to_string(it == requests_.end() ? 0 : it->second) + "\n";
  }
  counter("corolla:prompt_tokens_total", "Prompt tokens of admitted requests.", static_cast<double>(prompt_tokens_));
  counter("corolla:generation_tokens_total", "Generated tokens.", static_cast<double>(generation_tokens_));
  if (stats) {
    gauge("corolla:num_requests_running", "Requests in the running batch.", stats->num_running);
    gauge("corolla:num_requests_waiting", "Requests waiting for admission.", stats->num_waiting);
    gauge("corolla:kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = full).", stats->kv_usage());
    gauge("corolla:kv_cache_blocks", "KV cache blocks in all.", stats->num_kv_blocks);
    counter("corolla:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
            static_cast<double>(stats->prefix_cache_queries));
    counter("corolla:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
            static_cast<double>(stats->prefix_cache_hits));
    gauge("corolla:prefix_cache_hit_rate", "Prefix cache hits over queries, in tokens.",
          stats->prefix_cache_queries ? static_cast<double>(stats->prefix_cache_hits) / stats->prefix_cache_queries : 0.0);
    counter("corolla:num_preemptions_total", "Sequences preempted for KV blocks.", static_cast<double>(stats->num_preemptions));
  }
  if (stats) {
    const char* step_help =
        "Engine steps by kind (decode: every sequence one new token; mixed: prompt tokens too), "
        "from the "
        "later of a step's launch and the previous step's tokens reaching the host to its own.";
    RenderHistogram(stats->steps.decode_seconds, "corolla:engine_step_duration_seconds", step_help,
                    labels_ + ",kind=\"decode\"", &out);
    RenderHistogram(stats->steps.mixed_seconds, "corolla:engine_step_duration_seconds", step_help,
                    labels_ + ",kind=\"mixed\"", &out, /*header=*/false);
    RenderHistogram(stats->steps.tokens, "corolla:iteration_tokens_total",
                    "Tokens computed by each engine step.", labels_, &out);
  }
  RenderHistogram(ttft_, "corolla:time_to_first_token_seconds", "Time to first token.", labels_,
                  &out);
  RenderHistogram(itl_, "corolla:inter_token_latency_seconds",
                  "Time between consecutive output tokens.", labels_, &out);
  RenderHistogram(e2e_, "corolla:e2e_request_latency_seconds", "End-to-end request latency.",
                  labels_, &out);
  return out;
}

}  // namespace corolla::server
