// `corolla bench serve`: the serving benchmark (like `vllm bench serve`) against a running
// OpenAI-compatible server, or with --in-process against an Engine in this process (the same
// workload without HTTP: what the server itself costs). The core is server/bench_serve.h.
// --concurrency and --num-prompts take lists ("1,16,64"): one run each, in order, against one
// server or one loaded model; run i draws its prompts with --seed + i, so an HTTP and an
// in-process sweep send the same prompts and no run hits the prefix cache of an earlier one.
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_options.h"
#include "engine/kv_budget.h"
#include "server/bench_serve.h"

namespace corolla::cli {
namespace {

// "[=====>    ] 37/100 requests" on a terminal; a line per tenth otherwise.
void DrawProgress(int done, int total) {
  static const bool tty = isatty(STDERR_FILENO);
  if (tty) {
    constexpr int kWidth = 40;
    int filled = total ? done * kWidth / total : kWidth;
    std::string bar(filled, '=');
    if (filled < kWidth) bar += '>' + std::string(kWidth - filled - 1, ' ');
    std::fprintf(stderr, "\r[%s] %d/%d requests", bar.c_str(), done, total);
    if (done == total) std::fputc('\n', stderr);
  } else if (done == total || (total >= 10 && done % (total / 10) == 0)) {
    std::fprintf(stderr, "%d/%d requests done\n", done, total);
  }
  std::fflush(stderr);
}

struct Options {
  server::BenchServeOptions bench;
  std::string num_prompts = "100", concurrency = "0";  // lists: one run per concurrency
  int64_t input_len = 128, output_len = 128, seed = 0, vocab_size = 0;
  int64_t num_warmup = 1, top_k = 0;
  double timeout_s = 600;
  bool json = false;
  bool progress = true;
  bool in_process = false;
  ModelOptions model;  // --in-process only
  int64_t max_num_seqs = 64, max_batch_tokens = 2048, kv_cache_memory = 256 << 20;
  double gpu_memory_utilization = 0;
  std::string async_scheduling;  // on|off; unset: on for cuda
};

struct PlannedRun {
  int concurrency = 0;
  int num_prompts = 0;
};

// The (concurrency, num_prompts) of each run: --num-prompts has one entry, or one per concurrency.
Result<std::vector<PlannedRun>> Runs(const Options& o) {
  ASSIGN_OR_RETURN(std::vector<int32_t> concurrencies, ParseIdList(o.concurrency));
  ASSIGN_OR_RETURN(std::vector<int32_t> prompts, ParseIdList(o.num_prompts));
  if (concurrencies.empty() || prompts.empty()) return InvalidArgument("--concurrency and --num-prompts need a value");
  if (prompts.size() != 1 && prompts.size() != concurrencies.size())
    return InvalidArgument("--num-prompts needs one value or one per --concurrency value (" +
                           std::to_string(concurrencies.size()) + ")");
  std::vector<PlannedRun> runs;
  for (size_t i = 0; i < concurrencies.size(); ++i) runs.push_back({concurrencies[i], prompts[prompts.size() == 1 ? 0 : i]});
  return runs;
}

Status Run(Options& o) {
  server::BenchServeOptions& b = o.bench;
  ASSIGN_OR_RETURN(std::vector<PlannedRun> runs, Runs(o));
  b.input_len = static_cast<int>(o.input_len);
  b.output_len = static_cast<int>(o.output_len);
  b.seed = static_cast<uint64_t>(o.seed);
  b.vocab_size = static_cast<int>(o.vocab_size);
  b.timeout_s = o.timeout_s;
  b.num_warmup = static_cast<int>(o.num_warmup);
  b.top_k = static_cast<int>(std::clamp<int64_t>(o.top_k, -1, INT32_MAX));  // -1: rejected as negative
  if (o.progress) b.on_progress = DrawProgress;
  // --in-process: the model and an engine with the server's settings, so the runs differ from
  // the HTTP ones by the server only.
  LoadedModel loaded;
  std::unique_ptr<Engine> engine;
  std::string model_name = b.model;
  if (o.in_process) {
    EngineOptions eo;
    ASSIGN_OR_RETURN(eo.async_scheduling,
                     ParseOnOff("async-scheduling", o.async_scheduling, o.model.device == "cuda"));
    ASSIGN_OR_RETURN(loaded, LoadModelFromOptions(o.model));
    eo.max_num_seqs = static_cast<int>(o.max_num_seqs);
    eo.max_batch_tokens = static_cast<int>(o.max_batch_tokens);
    ASSIGN_OR_RETURN(eo.linear_state_dtype, o.model.LinearStateDtype());
    ASSIGN_OR_RETURN(
        eo.kv_cache_bytes,
        ResolveKvCacheBytes(*loaded.backend, loaded.model->config(), o.gpu_memory_utilization,
                            o.kv_cache_memory, eo.max_batch_tokens, eo.max_num_seqs,
                            /*max_model_len=*/0));
    ASSIGN_OR_RETURN(engine, Engine::Create(*loaded.model, *loaded.backend, eo));
    if (b.vocab_size <= 0) b.vocab_size = loaded.model->config().vocab_size;
    if (model_name.empty()) model_name = loaded.name;
  }
  int num_completed = 0;
  for (size_t i = 0; i < runs.size(); ++i) {
    b.concurrency = runs[i].concurrency;
    b.num_prompts = runs[i].num_prompts;
    b.seed = static_cast<uint64_t>(o.seed) + i;
    server::BenchServeReport report;
    if (o.in_process) {
      ASSIGN_OR_RETURN(report, server::RunEngineBench(*engine, b));
      report.model = model_name;
    } else {
      ASSIGN_OR_RETURN(report, server::RunHttpBench(b));
    }
    num_completed += report.num_completed;
    if (o.json && runs.size() > 1) {
      std::printf("%s\n", report.ToJson().dump().c_str());  // JSON lines: each run as it ends
      std::fflush(stdout);
    } else if (o.json) {
      std::printf("%s\n", report.ToJson().dump(2).c_str());
    } else {
      std::printf("%s", report.ToText().c_str());
      std::fflush(stdout);
    }
  }
  return num_completed > 0 ? Status::Ok() : Internal("every request failed");
}

}  // namespace

int BenchServeMain(int argc, char** argv) {
  Options o;
  Flags flags("bench serve",
              "Serving benchmark: random token prompts of --input-len through /v1/completions (streaming, "
              "ignore_eos, max_tokens = --output-len), closed-loop at --concurrency or Poisson arrivals at "
              "--request-rate; prints throughput and TTFT/TPOT/ITL mean, p50, p90, p99.");
  flags.String("url", &o.bench.url, "server base URL (http://HOST:PORT, optionally ending in /v1)");
  flags.String("model", &o.bench.model, "model name to request (default: the server's first in /v1/models)");
  flags.String("num-prompts", &o.num_prompts, "requests to send (a list: one per --concurrency value)");
  flags.String("concurrency", &o.concurrency,
               "requests in flight at most (0: no limit); a list (1,16,64) runs once per value, in order");
  flags.Float("request-rate", &o.bench.request_rate, "Poisson arrival rate in requests/s (0: all at once)");
  flags.Int("input-len", &o.input_len, "prompt tokens per request");
  flags.Int("output-len", &o.output_len, "generated tokens per request");
  flags.Int("seed", &o.seed, "seed of the prompts and arrival times");
  flags.Int("vocab-size", &o.vocab_size, "prompt ids from [0, N) (0: the server's vocab_size, else 1000)");
  flags.Float("timeout", &o.timeout_s, "seconds one request may take");
  flags.Int("warmup-prompts", &o.num_warmup, "untimed requests sent first (at the same concurrency)");
  flags.Float("temperature", &o.bench.temperature,
              "sampling temperature of every request (0, the default: greedy); request i of a run samples "
              "with a seed of --seed and i, over HTTP and --in-process alike");
  flags.Int("top-k", &o.top_k, "with --temperature: top-k (0: off)");
  flags.Float("top-p", &o.bench.top_p, "with --temperature: top-p (1: off)");
  flags.Float("min-p", &o.bench.min_p, "with --temperature: min-p (0: off)");
  flags.Bool("json", &o.json, "print the result as JSON instead of the table (several runs: one line each)");
  flags.Bool("progress", &o.progress, "progress bar on stderr");
  flags.Bool("in-process", &o.in_process, "run the workload on an Engine in this process instead of over HTTP");
  flags.String("model-dir", &o.model.model, "--in-process: model directory (default: the built-in demo model)");
  flags.String("device", &o.model.device, "--in-process: cpu or cuda");
  flags.Int("threads", &o.model.threads, "--in-process: CPU threads (0: all cores)");
  o.model.DeclareRandomWeights(flags);
  flags.Int("max-num-seqs", &o.max_num_seqs, "--in-process: maximum sequences in one step (as serve)");
  flags.Int("max-batch-tokens", &o.max_batch_tokens, "--in-process: maximum tokens in one step (as serve)");
  flags.Int("kv-cache-memory", &o.kv_cache_memory, "--in-process: bytes of KV cache (as serve)");
  flags.Float("gpu-memory-utilization", &o.gpu_memory_utilization,
              "--in-process: size the KV cache from this fraction of the device's memory (as serve)");
  flags.String("async-scheduling", &o.async_scheduling, "--in-process: on|off (as serve: default on for cuda)");
  bool help = false;
  Status s = flags.Parse(argc, argv, 3, &help);
  if (help) return 0;
  if (s.ok()) s = Run(o);
  return ReportStatus("bench serve", s);
}

}  // namespace corolla::cli
