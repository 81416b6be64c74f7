// corolla serve: the OpenAI-compatible HTTP server. It listens first (GET /health answers 503
// while the model loads), then loads the model and serves until SIGTERM/SIGINT, when it stops
// accepting, lets in-flight requests finish for a grace period, aborts the rest, and exits 0.
#include <csignal>
#include <cstdio>
#include <pthread.h>

#include "base/logging.h"
#include "cli/commands.h"
#include "cli/model_options.h"
#include "server/server.h"

namespace corolla::cli {
namespace {

struct ServeOptions {
  ModelOptions model;
  std::string host = "127.0.0.1";
  int64_t port = 8000;
  std::string api_key;
  std::string served_model_name;
  int64_t max_num_seqs = 64;
  int64_t max_batch_tokens = 2048;
  int64_t kv_cache_memory = 256 << 20;
  double gpu_memory_utilization = 0;
  int64_t max_model_len = 0;
  int64_t max_waiting = 1024;
  int64_t http_threads = 2;
  int64_t max_body_bytes = 8 << 20;
  int64_t drain_seconds = 30;
  bool prefix_caching = true;
};

Status Run(const ServeOptions& o) {
  if (o.port < 0 || o.port > 65535) return InvalidArgument("--port must be in [0, 65535]");
  if (o.max_num_seqs <= 0 || o.max_batch_tokens <= 0) return InvalidArgument("--max-num-seqs and --max-batch-tokens must be positive");
  if (o.kv_cache_memory <= 0) return InvalidArgument("--kv-cache-memory must be positive");
  // SIGTERM/SIGINT are taken by sigwait below; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  server::ServerOptions so;
  so.http.host = o.host;
  so.http.port = static_cast<int>(o.port);
  so.http.num_threads = static_cast<int>(std::max<int64_t>(1, o.http_threads));
  so.http.max_body_bytes = static_cast<size_t>(o.max_body_bytes);
  so.api_key = o.api_key;
  ASSIGN_OR_RETURN(std::unique_ptr<server::OpenAiServer> srv, server::OpenAiServer::Start(so));
  LOG(INFO) << "listening on http://" << o.host << ":" << srv->port() << " (GET /health is 503 until the model is loaded)";

  ASSIGN_OR_RETURN(std::string dir, o.model.ModelDir());
  LOG(INFO) << "loading model " << dir << " on " << o.model.device << " ...";
  ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelFromOptions(o.model));
  LOG(INFO) << "loaded " << loaded.model->config().model_type << " (" << loaded.model->config().num_layers
            << " layers, vocab " << loaded.model->config().vocab_size << ")";
  if (o.gpu_memory_utilization > 0)
    LOG(WARNING) << "--gpu-memory-utilization is not measured yet on " << loaded.backend->name()
                 << "; sizing the KV cache by --kv-cache-memory";
  EngineOptions eo;
  eo.max_num_seqs = static_cast<int>(o.max_num_seqs);
  eo.max_batch_tokens = static_cast<int>(o.max_batch_tokens);
  eo.kv_cache_bytes = o.kv_cache_memory;
  eo.max_model_len = static_cast<int>(o.max_model_len);
  eo.enable_prefix_caching = o.prefix_caching;
  AsyncEngineOptions ao;
  ao.max_waiting = static_cast<int>(o.max_waiting);
  ASSIGN_OR_RETURN(std::unique_ptr<server::ServedModel> served,
                   server::MakeServedModel(loaded.dir, std::move(loaded.backend), std::move(loaded.model), eo, ao,
                                           o.served_model_name));
  EngineStats stats = served->engine->Stats();
  LOG(INFO) << "serving model '" << served->name << "': KV cache " << stats.num_kv_blocks << " blocks of "
            << stats.block_size << " = " << static_cast<int64_t>(stats.num_kv_blocks) * stats.block_size
            << " tokens, max model length " << served->engine->max_model_len() << ", max " << o.max_num_seqs
            << " sequences per step";
  srv->Attach(std::move(served));
  LOG(INFO) << "ready: http://" << o.host << ":" << srv->port() << "/v1";

  int sig = 0;
  sigwait(&signals, &sig);
  LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ": draining in-flight requests (up to "
            << o.drain_seconds << " s)";
  srv->Shutdown(std::chrono::seconds(o.drain_seconds));
  LOG(INFO) << "stopped";
  return Status::Ok();
}

}  // namespace

int ServeMain(int argc, char** argv) {
  ServeOptions o;
  Flags flags("serve", "Serves a model over an OpenAI-compatible HTTP API.");
  o.model.Declare(flags);
  flags.String("host", &o.host, "address to listen on");
  flags.Int("port", &o.port, "port to listen on (0: any free port)");
  flags.String("api-key", &o.api_key, "require 'Authorization: Bearer KEY' on /v1 endpoints");
  flags.String("served-model-name", &o.served_model_name, "model name in the API (default: the directory's name)");
  flags.Int("max-num-seqs", &o.max_num_seqs, "maximum sequences in one step");
  flags.Int("max-batch-tokens", &o.max_batch_tokens, "maximum tokens in one step (decodes + prefill chunks)");
  flags.Int("kv-cache-memory", &o.kv_cache_memory, "bytes of KV cache");
  flags.Float("gpu-memory-utilization", &o.gpu_memory_utilization, "fraction of GPU memory to use (CUDA; not yet measured)");
  flags.Int("max-model-len", &o.max_model_len, "maximum tokens per sequence (0: the model's)");
  flags.Int("max-waiting", &o.max_waiting, "queued requests beyond which new ones get 429");
  flags.Int("http-threads", &o.http_threads, "I/O threads of the HTTP server");
  flags.Int("max-body-bytes", &o.max_body_bytes, "largest request body accepted (413 above)");
  flags.Int("drain-seconds", &o.drain_seconds, "on SIGTERM, how long in-flight requests may still run");
  flags.Bool("prefix-caching", &o.prefix_caching, "reuse the KV cache of shared prompt prefixes");
  bool help = false;
  Status s = flags.Parse(argc, argv, 2, &help);
  if (help) return 0;
  if (s.ok()) s = Run(o);
  return ReportStatus("serve", s);
}

}  // namespace corolla::cli
