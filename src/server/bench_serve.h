// Serving benchmark, like `vllm bench serve`: random token-id prompts of an exact length sent to
// an OpenAI-compatible /v1/completions endpoint as streams (ignore_eos, max_tokens = output
// length, so every request produces exactly that many tokens), either closed-loop at a fixed
// concurrency or open-loop with Poisson arrivals, and a report of throughput and TTFT / TPOT /
// ITL percentiles. The same workload can run against an in-process Engine to measure what the
// HTTP server costs. The HTTP client is our own, on Boost.Beast, one I/O thread.
// Functions here are reentrant; each run owns its state.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"

namespace corolla::server {

struct BenchServeOptions {
  std::string url = "http://127.0.0.1:8000";  // scheme, host, port; a path before /v1 is kept
  std::string model;                          // empty: the first model of GET /v1/models
  int num_prompts = 100;
  int concurrency = 0;        // requests in flight at most (0: no limit)
  double request_rate = 0;    // Poisson arrivals per second (0: all at once)
  int input_len = 128;        // prompt tokens
  int output_len = 128;       // generated tokens
  int vocab_size = 0;         // prompt ids drawn from [0, vocab_size); 0: from /v1/models, else 1000
  uint64_t seed = 0;
  double timeout_s = 600;     // per request
  int num_warmup = 0;         // untimed requests first (other prompts, same lengths and concurrency)
  // Sampling of every request (default greedy). With temperature > 0, request i of a run draws
  // with seed SamplingSeed(seed, i), over HTTP and in-process alike, so both runs sample the same.
  double temperature = 0;
  int top_k = 0;       // 0: off
  double top_p = 1;    // 1: off
  double min_p = 0;    // 0: off
  // Called after each request ends with (finished, total); e.g. a progress bar.
  std::function<void(int, int)> on_progress;
};

// One request as the client saw it. Times in seconds from when it was sent.
struct BenchRequestResult {
  bool ok = false;
  std::string error;      // when !ok
  int prompt_tokens = 0;  // from the server's usage (the prompt length for the engine)
  int output_tokens = 0;
  double ttft = 0;        // first streamed token
  double latency = 0;     // last byte
  std::vector<double> itl;  // gaps between successive streamed token chunks
};

struct LatencySummary {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;  // seconds
};

// An in-process run's engine steps of one kind (StepRecord). Times in seconds; rows and tokens
// are means over the steps.
struct StepSummary {
  int steps = 0, graph_steps = 0;
  double mean = 0, p50 = 0, p90 = 0;
  double decode_rows = 0, prefill_tokens = 0;
};

// The steps that only decoded, and those that also computed prompt tokens.
struct StepSummaries {
  StepSummary decode, mixed;
};
StepSummaries SummarizeSteps(const std::vector<StepRecord>& records);

// The sampling seed of request `index` of a run seeded `seed`.
uint64_t SamplingSeed(uint64_t seed, int index);

struct BenchServeReport {
  std::string target;  // the URL, or "engine (in-process)"
  std::string model;
  std::string sampling;  // "greedy", or "temperature T, top_k K, top_p P, min_p M"
  int num_prompts = 0;
  int concurrency = 0;
  double request_rate = 0;
  int input_len = 0, output_len = 0;
  int num_completed = 0, num_failed = 0;
  std::vector<std::string> first_errors;  // up to 5
  int64_t total_input_tokens = 0, total_output_tokens = 0;
  double duration_s = 0;
  double request_throughput = 0;       // completed requests / s
  double output_throughput = 0;        // generated tokens / s
  double total_token_throughput = 0;   // (prompt + generated) tokens / s
  LatencySummary ttft, tpot, itl, e2e;
  std::optional<StepSummaries> steps;  // in-process runs: the engine's steps

  std::string ToText() const;  // the human-readable table
  nlohmann::json ToJson() const;
};

// The `num_prompts` prompts of a run: `input_len` ids each, uniform in [0, vocab_size).
std::vector<std::vector<int32_t>> RandomPrompts(const BenchServeOptions& options, int vocab_size);

// Percentile q in [0, 100] with linear interpolation between closest ranks (numpy's default).
double Percentile(std::vector<double> values, double q);

// Builds the report of a run that took `duration_s`.
BenchServeReport Summarize(const BenchServeOptions& options, const std::vector<BenchRequestResult>& results,
                           double duration_s);

// Runs the benchmark against the server at options.url. Errors: a bad URL, or a server that
// cannot be reached / does not list a model; failed requests are counted in the report instead.
Result<BenchServeReport> RunHttpBench(const BenchServeOptions& options);

// The same workload through `engine` directly (AddRequest + Step on this thread, greedy,
// ignore_eos), with the same arrival process: the server-less baseline. The engine must be idle.
Result<BenchServeReport> RunEngineBench(Engine& engine, const BenchServeOptions& options);

}  // namespace corolla::server
