// corolla serve: the OpenAI-compatible HTTP server. It listens first (GET /health answers 503
// while the model loads), then loads the model and serves until SIGTERM/SIGINT, when it stops
// accepting, lets in-flight requests finish for a grace period, aborts the rest, and exits 0.
// With --dp D (--ep D) it starts D ranks (parallel/launcher.h): rank 0 serves HTTP and hands each
// request to the least loaded rank; all ranks step in lockstep (engine/dp_engine.h).
#include <csignal>
#include <cstdio>
#include <fstream>
#include <pthread.h>
#include <thread>
#include <unistd.h>

#include "base/logging.h"
#include "cli/commands.h"
#include "cli/data_parallel.h"
#include "cli/model_options.h"
#include "engine/dp_engine.h"
#include "engine/kv_budget.h"
#include "model/safetensors.h"
#include "parallel/expert_parallel.h"
#include "parallel/launcher.h"
#include "server/server.h"

namespace corolla::cli {
namespace {

// --- load progress ----------------------------------------------------------------------------
// The loader has no progress hook yet, so on the CPU the bar watches memory grow: the weights'
// bytes as the CPU backend holds them (every tensor widened to float32) against the growth of
// this process's anonymous memory. An estimate, clamped below 100% until the load returns.

int64_t ExpectedCpuWeightBytes(const std::string& dir) {
  Result<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  if (!ckpt.ok()) return 0;
  int64_t total = 0;
  for (const std::string& name : (*ckpt)->Names())
    if (const SafetensorsEntry* e = (*ckpt)->Find(name)) total += e->shape.numel() * 4;
  return total;
}

int64_t AnonymousMemoryBytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "RssAnon:") {
      int64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(4096, '\n');
  }
  return -1;
}

// LoadModelFromOptions while a thread draws "loading weights [=====>    ] 40.0% of 2.5 GiB" on
// a terminal (CPU only; other devices log the time it took).
Result<LoadedModel> LoadWithProgress(const ModelOptions& options) {
  Result<std::string> dir = options.ModelDir();
  const bool from_checkpoint = options.device == "cpu" && !options.random_weights && isatty(STDERR_FILENO) && dir.ok();
  const int64_t expected = from_checkpoint ? ExpectedCpuWeightBytes(*dir) : 0;
  const int64_t base = AnonymousMemoryBytes();
  std::atomic<bool> done{false};
  std::thread bar;
  if (expected > 0 && base >= 0) {
    bar = std::thread([&] {
      constexpr int kWidth = 30;
      auto start = std::chrono::steady_clock::now();
      while (!done.load()) {
        double fraction = std::clamp(static_cast<double>(AnonymousMemoryBytes() - base) / expected, 0.0, 0.99);
        int filled = static_cast<int>(fraction * kWidth);
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "\rloading weights [%s>%s] %5.1f%% of %.2f GiB  %.0f s", std::string(filled, '=').c_str(),
                     std::string(kWidth - filled, ' ').c_str(), 100 * fraction, expected / double(1 << 30), secs);
        std::fflush(stderr);
        for (int i = 0; i < 10 && !done.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      std::fprintf(stderr, "\rloading weights [%s] 100.0%% of %.2f GiB\n", std::string(kWidth + 1, '=').c_str(),
                   expected / double(1 << 30));
    });
  }
  Result<LoadedModel> loaded = LoadModelFromOptions(options);
  done = true;
  if (bar.joinable()) bar.join();
  return loaded;
}

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
  bool graph_warmup = true;
  std::string async_scheduling;  // on|off; unset: on for cuda
  int64_t ep_capacity = -1;      // --dp D --ep D: see --ep-capacity
};

// --dp D --ep D: every forward is collective. Rounds in which every rank brings at most
// --ep-capacity tokens (decode of up to that many sequences) exchange them in fixed-size blocks,
// with no host synchronisation, and replay decode CUDA graphs, which every rank captures at
// start-up, the same list in the same order (DpRankEngine::CaptureDecodeGraphs); other rounds
// (prefills) run eagerly through the sized exchange. -1: DecodeGraphs::kMaxCollectiveBatch on cuda
// (the graphs' largest batch), 0 on the CPU; 0: the sized exchange only, no graphs.
Status ResolveEpCapacity(ServeOptions& o) {
  if (o.ep_capacity < 0)
    o.ep_capacity = o.model.device == "cuda" ? DecodeGraphs::kMaxCollectiveBatch : 0;
  if (o.ep_capacity != 0 && (o.ep_capacity < DecodeGraphs::kMaxCollectiveBatch ||
                             o.ep_capacity > kNvlExchangeMaxCapacity))
    return InvalidArgument(
        "--ep-capacity must be 0 or in [" + std::to_string(DecodeGraphs::kMaxCollectiveBatch) +
        ", " + std::to_string(kNvlExchangeMaxCapacity) + "] (every decode graph's batch must fit)");
  o.model.ep_capacity = static_cast<int>(o.ep_capacity);
  o.model.ep_sized_fallback = o.ep_capacity > 0;
  return Status::Ok();
}

Result<EngineOptions> MakeEngineOptions(const ServeOptions& o, const LoadedModel& loaded, bool async_scheduling) {
  EngineOptions eo;
  eo.max_num_seqs = static_cast<int>(o.max_num_seqs);
  eo.max_batch_tokens = static_cast<int>(o.max_batch_tokens);
  // With --gpu-memory-utilization the KV cache takes what the fraction leaves after the weights
  // (now loaded) and activations.
  ASSIGN_OR_RETURN(
      eo.kv_cache_bytes,
      ResolveKvCacheBytes(*loaded.backend, loaded.model->config(), o.gpu_memory_utilization,
                          o.kv_cache_memory, eo.max_batch_tokens, eo.max_num_seqs,
                          static_cast<int>(o.max_model_len)));
  eo.max_model_len = static_cast<int>(o.max_model_len);
  eo.enable_prefix_caching = o.prefix_caching;
  eo.warm_decode_graphs = o.graph_warmup;
  eo.async_scheduling = async_scheduling;
  ASSIGN_OR_RETURN(eo.linear_state_dtype, o.model.LinearStateDtype());
  return eo;
}

// --dp: this rank's engine over `model`. Under DP-EP (experts split over the DP ranks) every
// forward is collective and the ranks run one per round (see ResolveEpCapacity).
Result<std::unique_ptr<DpRankEngine>> MakeRankEngine(Model& model, Backend& backend, const EngineOptions& eo,
                                                     const ParallelContext& parallel, int ep_capacity) {
  const RankLayout& l = parallel.layout();
  const bool dp_ep = l.ep_size > l.tp_size;
  return DpRankEngine::Create(model, backend, eo, l.dp_rank, dp_ep, dp_ep ? ep_capacity : 0);
}

// --dp: the smallest of the ranks' maximum model lengths (each rank's KV cache may differ).
Result<int> AgreeOnMaxModelLen(const DpAllGather& exchange, int mine) {
  ASSIGN_OR_RETURN(std::vector<std::string> all, exchange(std::to_string(mine)));
  int smallest = mine;
  for (const std::string& s : all) smallest = std::min(smallest, std::stoi(s));
  return smallest;
}

// --dp --ep with a fixed capacity: every rank, after agreeing on max_model_len, captures the
// same decode graphs in the same order (collective forwards), before the first round.
void CaptureDpDecodeGraphs(DpRankEngine& rank, const ParallelContext& parallel, int ep_capacity, int max_model_len) {
  const RankLayout& l = parallel.layout();
  if (l.ep_size <= l.tp_size || ep_capacity == 0) return;
  auto start = std::chrono::steady_clock::now();
  const int forwards = rank.CaptureDecodeGraphs(max_model_len);
  if (forwards == 0) {
    LOG(INFO) << "DP rank " << l.dp_rank << ": no decode graphs (CPU, MLA or COROLLA_CUDA_GRAPHS=0); decode rounds "
              << "still take the fixed-capacity exchange";
    return;
  }
  LOG(INFO) << "DP rank " << l.dp_rank << ": decode graphs up to context " << max_model_len << ", " << forwards
            << " start-up forwards in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s";
}

// --dp, ranks 1..D-1: no HTTP; the rounds of rank 0's DataParallelEngine until it stops them.
// Once serving, SIGTERM/SIGINT are ignored (blocking them is not enough: threads started before
// main, such as OpenBLAS's, would take them and die): rank 0 drains, then tells every rank to stop.
Status RunFollower(const ServeOptions& o, bool async_scheduling) {
  ASSIGN_OR_RETURN(LoadedModel loaded, LoadModelFromOptions(o.model));
  ASSIGN_OR_RETURN(EngineOptions eo, MakeEngineOptions(o, loaded, async_scheduling));
  const int capacity = static_cast<int>(o.ep_capacity);
  ASSIGN_OR_RETURN(std::unique_ptr<DpRankEngine> rank,
                   MakeRankEngine(*loaded.model, *loaded.backend, eo, *loaded.parallel, capacity));
  const DpAllGather exchange = DpRoundExchange(*loaded.parallel);
  std::signal(SIGTERM, SIG_IGN);  // before rank 0 can say it is ready
  std::signal(SIGINT, SIG_IGN);
  ASSIGN_OR_RETURN(const int max_model_len, AgreeOnMaxModelLen(exchange, rank->engine().max_model_len()));
  CaptureDpDecodeGraphs(*rank, *loaded.parallel, capacity, max_model_len);
  LOG(INFO) << loaded.parallel->layout().ToString() << ": KV cache " << rank->engine().num_kv_blocks() << " blocks; serving";
  return RunDpFollower(*rank, exchange);
}

Status Run(const ServeOptions& o) {
  if (o.port < 0 || o.port > 65535) return InvalidArgument("--port must be in [0, 65535]");
  if (o.max_num_seqs <= 0 || o.max_batch_tokens <= 0) return InvalidArgument("--max-num-seqs and --max-batch-tokens must be positive");
  if (o.kv_cache_memory <= 0) return InvalidArgument("--kv-cache-memory must be positive");
  // On the CPU the forward runs inside the launch: overlap buys nothing there, and taking a
  // step's tokens after launching the next would delay every output by that step.
  ASSIGN_OR_RETURN(const bool async_scheduling,
                   ParseOnOff("async-scheduling", o.async_scheduling, o.model.device == "cuda"));
  // SIGTERM/SIGINT are taken by sigwait below; block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);
  ASSIGN_OR_RETURN(const ProcessEnv env, ReadProcessEnv());
  if (o.model.world_size() > 1 && env.rank != 0) return RunFollower(o, async_scheduling);

  std::unique_ptr<ParallelContext> parallel;  // --dp: outlives the server, whose engine uses it
  server::ServerOptions so;
  so.http.host = o.host;
  so.http.port = static_cast<int>(o.port);
  so.http.num_threads = static_cast<int>(std::max<int64_t>(1, o.http_threads));
  so.http.max_body_bytes = static_cast<size_t>(o.max_body_bytes);
  so.api_key = o.api_key;
  ASSIGN_OR_RETURN(std::unique_ptr<server::OpenAiServer> srv, server::OpenAiServer::Start(so));
  LOG(INFO) << "listening on http://" << o.host << ":" << srv->port() << " (GET /health is 503 until the model is loaded)";

  std::string what;
  if (o.model.random_weights) {
    what = "random weights of " + (o.model.config.empty() ? o.model.model + "/config.json" : o.model.config);
  } else {
    ASSIGN_OR_RETURN(what, o.model.ModelDir());
  }
  LOG(INFO) << "loading model " << what << " on " << o.model.device << " ...";
  auto load_start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(LoadedModel loaded, LoadWithProgress(o.model));
  LOG(INFO) << "loaded " << loaded.model->config().model_type << " (" << loaded.model->config().num_layers
            << " layers, vocab " << loaded.model->config().vocab_size << ") in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - load_start).count() << " s";
  ASSIGN_OR_RETURN(const EngineOptions eo, MakeEngineOptions(o, loaded, async_scheduling));
  AsyncEngineOptions ao;
  ao.max_waiting = static_cast<int>(o.max_waiting);
  server::EngineFactory make_engine = [&](Model& model, Backend& backend) -> Result<std::unique_ptr<ServingEngine>> {
    ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(model, backend, eo));
    return std::unique_ptr<ServingEngine>(new AsyncEngine(std::move(engine), ao));
  };
  DataParallelEngine* dp_engine = nullptr;
  if (IsDataParallel(loaded)) {
    parallel = std::move(loaded.parallel);
    make_engine = [&](Model& model, Backend& backend) -> Result<std::unique_ptr<ServingEngine>> {
      const int capacity = static_cast<int>(o.ep_capacity);
      ASSIGN_OR_RETURN(std::unique_ptr<DpRankEngine> rank, MakeRankEngine(model, backend, eo, *parallel, capacity));
      const DpAllGather exchange = DpRoundExchange(*parallel);
      ASSIGN_OR_RETURN(const int max_model_len, AgreeOnMaxModelLen(exchange, rank->engine().max_model_len()));
      CaptureDpDecodeGraphs(*rank, *parallel, capacity, max_model_len);
      // A failed round (a rank died) aborts every request; the SIGTERM then ends this process.
      auto engine = std::make_unique<DataParallelEngine>(std::move(rank), exchange, parallel->layout().dp_size,
                                                         max_model_len, ao, [](const Status&) { ::kill(::getpid(), SIGTERM); });
      dp_engine = engine.get();
      return std::unique_ptr<ServingEngine>(std::move(engine));
    };
  }
  ASSIGN_OR_RETURN(std::unique_ptr<server::ServedModel> served,
                   server::MakeServedModel(loaded.dir, std::move(loaded.backend), std::move(loaded.model), make_engine,
                                           o.served_model_name.empty() ? loaded.name : o.served_model_name));
  EngineStats stats = served->engine->Stats();
  LOG(INFO) << "serving model '" << served->name << "': KV cache " << stats.num_kv_blocks << " blocks of "
            << stats.block_size << " = " << static_cast<int64_t>(stats.num_kv_blocks) * stats.block_size
            << " tokens" << (parallel ? " over " + std::to_string(parallel->layout().dp_size) + " data-parallel ranks" : "")
            << ", max model length " << served->engine->max_model_len() << ", max " << o.max_num_seqs
            << " sequences per step" << (parallel ? " per rank" : "");
  srv->Attach(std::move(served));
  LOG(INFO) << "ready: http://" << o.host << ":" << srv->port() << "/v1";

  int sig = 0;
  sigwait(&signals, &sig);
  LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT") << ": draining in-flight requests (up to "
            << o.drain_seconds << " s)";
  srv->Shutdown(std::chrono::seconds(o.drain_seconds));
  if (dp_engine != nullptr) RETURN_IF_ERROR(dp_engine->status());
  LOG(INFO) << "stopped";
  return Status::Ok();
}

}  // namespace

int ServeMain(int argc, char** argv) {
  ServeOptions o;
  Flags flags("serve", "Serves a model over an OpenAI-compatible HTTP API.");
  o.model.Declare(flags);
  o.model.DeclareRandomWeights(flags);
  flags.String("host", &o.host, "address to listen on");
  flags.Int("port", &o.port, "port to listen on (0: any free port)");
  flags.String("api-key", &o.api_key, "require 'Authorization: Bearer KEY' on /v1 endpoints");
  flags.String("served-model-name", &o.served_model_name, "model name in the API (default: the directory's name)");
  flags.Int("max-num-seqs", &o.max_num_seqs, "maximum sequences in one step");
  flags.Int("max-batch-tokens", &o.max_batch_tokens, "maximum tokens in one step (decodes + prefill chunks)");
  flags.Int("kv-cache-memory", &o.kv_cache_memory, "bytes of KV cache");
  flags.Float("gpu-memory-utilization", &o.gpu_memory_utilization,
              "fraction of the device's memory this server may use; the KV cache gets what the weights and "
              "activations leave (CPU: of host RAM). Overrides --kv-cache-memory");
  flags.Int("max-model-len", &o.max_model_len, "maximum tokens per sequence (0: the model's)");
  flags.Int("max-waiting", &o.max_waiting, "queued requests beyond which new ones get 429");
  flags.Int("http-threads", &o.http_threads, "I/O threads of the HTTP server");
  flags.Int("max-body-bytes", &o.max_body_bytes, "largest request body accepted (413 above)");
  flags.Int("drain-seconds", &o.drain_seconds, "on SIGTERM, how long in-flight requests may still run");
  flags.Bool("prefix-caching", &o.prefix_caching, "reuse the KV cache of shared prompt prefixes");
  flags.Bool(
      "graph-warmup", &o.graph_warmup,
      "capture the decode CUDA graphs (batch x context buckets) while the server is idle, small "
      "batches first, instead of in the first step that needs each");
  flags.Int(
      "ep-capacity", &o.ep_capacity,
      "--dp D --ep D: tokens per rank up to which a round exchanges fixed-size blocks and replays "
      "decode CUDA graphs (captured at start-up); other rounds exchange sized blocks eagerly. "
      "-1: " +
          std::to_string(DecodeGraphs::kMaxCollectiveBatch) +
          " on cuda, 0 on the CPU; 0: sized only, no graphs");
  flags.String("async-scheduling", &o.async_scheduling,
               "on|off: prepare and launch step N+1 while the device runs step N (requests with "
               "penalties or logprobs still step synchronously); default on with --device cuda, off on "
               "the CPU, where it would delay each token by a step");
  bool help = false;
  Status s = flags.Parse(argc, argv, 2, &help);
  if (help) return 0;
  if (s.ok() && o.model.tp > 1)
    s = Unsupported("serve --tp is not supported yet (every TP rank would have to run each step); --dp D --ep D is");
  if (s.ok())
    if (std::optional<int> rc = SpawnLocalRanks(o.model.world_size(), argc, argv)) return *rc;
  if (s.ok()) s = ResolveEpCapacity(o);
  if (s.ok()) s = Run(o);
  return ReportStatus("serve", s);
}

}  // namespace corolla::cli
