#include "cli/model_options.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "base/logging.h"

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

Result<LoadedModel> LoadModelFromOptions(const ModelOptions& options) {
  if (options.threads > 0) setenv("COROLLA_NUM_THREADS", std::to_string(options.threads).c_str(), 1);
  LoadedModel loaded;
  ASSIGN_OR_RETURN(loaded.dir, options.ModelDir());
  ModelShard shard;
  const ParallelConfig parallel{static_cast<int>(options.tp), 0, 1};
  if (options.tp < 1) return InvalidArgument("--tp must be positive");
  if (parallel.world_size() > 1) {
    ASSIGN_OR_RETURN(ProcessEnv env, ReadProcessEnv());
    if (!env.from_env || env.world_size != parallel.world_size())
      return InvalidArgument("--tp " + std::to_string(options.tp) +
                             " needs one process per rank: RANK and WORLD_SIZE=" + std::to_string(options.tp) +
                             " in the environment (corolla generate and logits start them themselves)");
#ifdef COROLLA_HAVE_CUDA
    if (options.device == "cuda") {
      ASSIGN_OR_RETURN(loaded.backend, MakeCudaBackend(env.local_rank));  // one GPU per local rank
    } else
#endif
    {
      ASSIGN_OR_RETURN(loaded.backend, MakeBackend(options.device));
    }
    ASSIGN_OR_RETURN(loaded.parallel, ParallelContext::Create(parallel, env, *loaded.backend));
    const RankLayout& l = loaded.parallel->layout();
    shard = {l.tp_size, l.tp_rank, loaded.parallel->tp(), l.ep_size, l.ep_rank, loaded.parallel->ep()};
  } else {
    ASSIGN_OR_RETURN(loaded.backend, MakeBackend(options.device));
  }
  auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(loaded.model, LoadModel(loaded.dir, *loaded.backend, shard));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  LOG(DEBUG) << "loaded " << loaded.dir << " (" << loaded.model->config().model_type << ") on "
             << loaded.backend->name() << " in " << secs << " s";
  return loaded;
}

}  // namespace corolla::cli
