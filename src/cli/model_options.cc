#include "cli/model_options.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "base/logging.h"
#include "model/random_weights.h"

namespace corolla::cli {

namespace fs = std::filesystem;

void ModelOptions::Declare(Flags& flags) {
  flags.String("model", &model,
               "Hugging Face model directory (config.json, *.safetensors); default: the built-in "
               "demo model");
  flags.String("device", &device, "cpu or cuda");
  flags.Int("threads", &threads, "CPU threads (0: all cores)");
  flags.Int("tp", &tp,
            "tensor-parallel ranks, one process per GPU (spawned on this node unless RANK/WORLD_SIZE "
            "are set); MoE experts are split over the same ranks");
  flags.Int("dp", &dp,
            "data-parallel ranks, one process per GPU: each takes every dp-th sequence of the input and "
            "keeps its own KV cache");
  flags.Int("ep", &ep,
            "expert-parallel ranks: --tp (default; TP-EP) or --dp x --tp (DP-EP: each rank holds 1/ep of "
            "the experts and tokens travel to them by all-to-all)");
  flags.String("linear-state-dtype", &linear_state_dtype,
               "hybrid models (Gated DeltaNet): storage of the recurrent state, f32 or bf16 (half the memory; "
               "math stays f32; accuracy cost in BENCHMARKS.md)");
  flags.String("fp8", &fp8,
               "FP8 checkpoints (DeepSeek-V3): native (block-scaled FP8 GEMMs for the projections, "
               "activations quantised per 1x128, routed experts FP8 too; default on cuda) or dequant "
               "(weights dequantised to bf16 at load; default on cpu)");
}

Result<DType> ParseLinearStateDtype(const std::string& name) {
  if (name == "f32") return DType::kF32;
  if (name == "bf16") return DType::kBF16;
  return InvalidArgument("--linear-state-dtype " + name + ": expected f32 or bf16");
}

void ModelOptions::DeclareRandomWeights(Flags& flags) {
  flags.Bool("random-weights", &random_weights,
             "random bf16 weights of --config's shape instead of a checkpoint (for benchmarks; without "
             "--model there is no tokenizer, so prompts must be token ids)");
  flags.String("config", &config, "--random-weights: the model's config.json (default: --model's)");
  flags.Int("layers", &layers, "--random-weights: keep only the first N layers (0: all)");
  flags.Int("weight-seed", &seed, "--random-weights: seed of the weights");
}

Result<std::string> ModelOptions::ModelDir() const {
  if (!model.empty()) {
    if (!fs::is_directory(model)) return NotFound("model directory '" + model + "' does not exist");
    return model;
  }
  std::vector<fs::path> candidates;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    candidates.push_back(exe.parent_path() / "models/corolla-demo");
    candidates.push_back(exe.parent_path().parent_path() / "models/corolla-demo");
  }
  candidates.push_back(fs::path(COROLLA_SOURCE_DIR) / "models/corolla-demo");
  for (const auto& c : candidates)
    if (fs::exists(c / "config.json")) return c.string();
  return NotFound("no --model given and the built-in model (models/corolla-demo) was not found");
}

namespace {

std::string BaseName(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path.substr(path.find_last_of('/') + 1);
}

Result<LoadedModel> LoadRandom(const ModelOptions& options) {
  if (options.world_size() != 1) return InvalidArgument("--random-weights loads one process only (--tp 1 --dp 1)");
  if (options.config.empty() && options.model.empty())
    return InvalidArgument("--random-weights needs --config CONFIG.json (or --model DIR for its config.json)");
  LoadedModel loaded;
  std::string config_path = options.config;
  if (!options.model.empty()) {
    ASSIGN_OR_RETURN(loaded.dir, options.ModelDir());
    if (config_path.empty()) config_path = loaded.dir + "/config.json";
  }
  ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
  ASSIGN_OR_RETURN(nlohmann::json json, ParseJson(text, config_path));
  ASSIGN_OR_RETURN(ModelConfig config, ParseModelConfig(json));
  if (options.layers < 0) return InvalidArgument("--layers must not be negative");
  if (options.layers > 0) config.num_layers = static_cast<int>(std::min<int64_t>(options.layers, config.num_layers));
  // The served name: the model directory's, else the config file's ("qwen3-30b-a3b.json"), or
  // its directory's when that file is a plain config.json.
  const fs::path config_file(config_path);
  loaded.name = !loaded.dir.empty()                   ? BaseName(loaded.dir)
                : config_file.stem() != "config"      ? config_file.stem().string()
                : config_file.parent_path().empty()   ? "config"
                                                      : BaseName(fs::absolute(config_file).parent_path().string());
  ASSIGN_OR_RETURN(loaded.backend, MakeBackend(options.device));
  auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(loaded.model, LoadModelRandom(config, *loaded.backend, static_cast<uint64_t>(options.seed)));
  LOG(INFO) << "random weights of " << config_path << " (" << config.model_type << ", " << config.num_layers
            << " layers) on " << loaded.backend->name() << " in "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() << " s"
            << (loaded.dir.empty() ? "; no tokenizer: token-id prompts only" : "");
  return loaded;
}

}  // namespace

Result<RankSetup> SetUpRank(const std::string& device, const ParallelConfig& config, int ep_capacity) {
  RankSetup setup;
  if (config.tp < 1 || config.dp < 1 || config.ep < 0) return InvalidArgument("--tp and --dp must be positive, --ep not negative");
  if (config.world_size() == 1) {
    ASSIGN_OR_RETURN(setup.backend, MakeBackend(device));
    return setup;
  }
  ASSIGN_OR_RETURN(ProcessEnv env, ReadProcessEnv());
  if (!env.from_env || env.world_size != config.world_size())
    return InvalidArgument("--tp " + std::to_string(config.tp) + " x --dp " + std::to_string(config.dp) +
                           " needs one process per rank: RANK and WORLD_SIZE=" + std::to_string(config.world_size()) +
                           " in the environment (corolla generate, logits and bench decode start them themselves)");
#ifdef COROLLA_HAVE_CUDA
  if (device == "cuda") {
    ASSIGN_OR_RETURN(setup.backend, MakeCudaBackend(env.local_rank));  // one GPU per local rank
  } else
#endif
  {
    ASSIGN_OR_RETURN(setup.backend, MakeBackend(device));
  }
  ASSIGN_OR_RETURN(setup.parallel, ParallelContext::Create(config, env, *setup.backend));
  const RankLayout& l = setup.parallel->layout();
  setup.shard = {l.tp_size, l.tp_rank, setup.parallel->tp(), l.ep_size, l.ep_rank, setup.parallel->ep(),
                 l.dp_size, l.dp_rank, ep_capacity};
  const char* via_exchange = std::getenv("COROLLA_TP_EP_EXCHANGE");
  setup.shard.tp_ep_exchange = via_exchange != nullptr && std::string(via_exchange) == "1";
  return setup;
}

Result<LoadedModel> LoadModelFromOptions(const ModelOptions& options) {
  if (options.threads > 0) setenv("COROLLA_NUM_THREADS", std::to_string(options.threads).c_str(), 1);
  if (!options.fp8.empty()) {
    if (options.fp8 != "native" && options.fp8 != "dequant")
      return InvalidArgument("--fp8 " + options.fp8 + ": expected native or dequant");
    setenv("COROLLA_FP8", options.fp8.c_str(), 1);
  }
  if (options.random_weights) return LoadRandom(options);
  LoadedModel loaded;
  ASSIGN_OR_RETURN(loaded.dir, options.ModelDir());
  loaded.name = BaseName(loaded.dir);
  ASSIGN_OR_RETURN(RankSetup setup, SetUpRank(options.device, options.parallel(), options.ep_capacity));
  loaded.backend = std::move(setup.backend);
  loaded.parallel = std::move(setup.parallel);
  ModelShard shard = setup.shard;
  shard.ep_sized_fallback = options.ep_sized_fallback && options.ep_capacity > 0;
  auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(loaded.model, LoadModel(loaded.dir, *loaded.backend, shard));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  LOG(DEBUG) << "loaded " << loaded.dir << " (" << loaded.model->config().model_type << ") on "
             << loaded.backend->name() << " in " << secs << " s";
  return loaded;
}

}  // namespace corolla::cli
