// `corolla bench serve`: the serving benchmark (like `vllm bench serve`) against a running
// OpenAI-compatible server, or with --in-process against an Engine in this process (the same
// workload without HTTP: what the server itself costs). The core is server/bench_serve.h.
#include <unistd.h>

#include <cstdio>
#include <string>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/model_options.h"
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
  int64_t num_prompts = 100, concurrency = 0, input_len = 128, output_len = 128, seed = 0, vocab_size = 0;
  int64_t num_warmup = 1;
  double timeout_s = 600;
  bool json = false;
  bool progress = true;
  bool in_process = false;
  ModelOptions model;  // --in-process only
  int64_t max_num_seqs = 64, max_batch_tokens = 2048, kv_cache_memory = 256 << 20;
};

Status Run(Options& o) {
  server::BenchServeOptions& b = o.bench;
  b.num_prompts = static_cast<int>(o.num_prompts);
  b.concurrency = static_cast<int>(o.concurrency);
  b.input_len = static_cast<int>(o.input_len);
  b.output_len = static_cast<int>(o.output_len);
  b.seed = static_cast<uint64_t>(o.seed);
  b.vocab_size = static_cast<int>(o.vocab_size);
  b.timeout_s = o.timeout_s;
  b.num_warmup = static_cast<int>(o.num_warmup);
  if (o.progress) b.on_progress = DrawProgress;
  server::BenchServeReport report;
  if (o.in_process) {
    ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelFromOptions(o.model));
    // The server's engine settings, so the two runs differ by HTTP only.
    EngineOptions eo;
    eo.max_num_seqs = static_cast<int>(o.max_num_seqs);
    eo.max_batch_tokens = static_cast<int>(o.max_batch_tokens);
    eo.kv_cache_bytes = o.kv_cache_memory;
    ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(*loaded.model, *loaded.backend, eo));
    if (b.vocab_size <= 0) b.vocab_size = loaded.model->config().vocab_size;
    ASSIGN_OR_RETURN(report, server::RunEngineBench(*engine, b));
    std::string dir = loaded.dir;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    report.model = b.model.empty() ? dir.substr(dir.find_last_of('/') + 1) : b.model;
  } else {
    ASSIGN_OR_RETURN(report, server::RunHttpBench(b));
  }
  if (o.json) {
    std::printf("%s\n", report.ToJson().dump(2).c_str());
  } else {
    std::printf("%s", report.ToText().c_str());
  }
  return report.num_completed > 0 ? Status::Ok() : Internal("every request failed");
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
  flags.Int("num-prompts", &o.num_prompts, "requests to send");
  flags.Int("concurrency", &o.concurrency, "requests in flight at most (0: no limit)");
  flags.Float("request-rate", &o.bench.request_rate, "Poisson arrival rate in requests/s (0: all at once)");
  flags.Int("input-len", &o.input_len, "prompt tokens per request");
  flags.Int("output-len", &o.output_len, "generated tokens per request");
  flags.Int("seed", &o.seed, "seed of the prompts and arrival times");
  flags.Int("vocab-size", &o.vocab_size, "prompt ids from [0, N) (0: the server's vocab_size, else 1000)");
  flags.Float("timeout", &o.timeout_s, "seconds one request may take");
  flags.Int("warmup-prompts", &o.num_warmup, "untimed requests sent first (at the same concurrency)");
  flags.Bool("json", &o.json, "print the result as JSON instead of the table");
  flags.Bool("progress", &o.progress, "progress bar on stderr");
  flags.Bool("in-process", &o.in_process, "run the workload on an Engine in this process instead of over HTTP");
  flags.String("model-dir", &o.model.model, "--in-process: model directory (default: the built-in demo model)");
  flags.String("device", &o.model.device, "--in-process: cpu or cuda");
  flags.Int("threads", &o.model.threads, "--in-process: CPU threads (0: all cores)");
  flags.Int("max-num-seqs", &o.max_num_seqs, "--in-process: maximum sequences in one step (as serve)");
  flags.Int("max-batch-tokens", &o.max_batch_tokens, "--in-process: maximum tokens in one step (as serve)");
  flags.Int("kv-cache-memory", &o.kv_cache_memory, "--in-process: bytes of KV cache (as serve)");
  bool help = false;
  Status s = flags.Parse(argc, argv, 3, &help);
  if (help) return 0;
  if (s.ok()) s = Run(o);
  return ReportStatus("bench serve", s);
}

}  // namespace corolla::cli
