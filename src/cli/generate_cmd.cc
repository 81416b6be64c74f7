// corolla generate: runs one prompt through the engine and prints the generated ids.
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "engine/engine.h"

namespace corolla::cli {
namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string prompt_ids;
  int64_t max_tokens = 64;
  double temperature = -1;  // <0: the model's generation_config default
  double top_p = -1;
  int64_t top_k = -1;
  double min_p = -1;
  int64_t seed = 0;
  bool ignore_eos = false;
  bool json = false;
};

Status Run(const GenerateOptions& o) {
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt, ParseIdList(o.prompt_ids));
  ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromOptions(o.model));
  ASSIGN_OR_RETURN(GenerationConfig gen, LoadGenerationConfig(m.dir, m.model->config()));

  GenerationRequest request;
  request.prompt = prompt;
  request.max_tokens = static_cast<int>(o.max_tokens);
  request.stop_token_ids = gen.eos_token_ids;
  request.ignore_eos = o.ignore_eos;
  // Unset options take the model's generation_config.json defaults, as transformers does.
  SamplingParams& sp = request.sampling;
  bool model_samples = gen.do_sample.value_or(true);
  sp.temperature = static_cast<float>(o.temperature >= 0 ? o.temperature
                                      : model_samples   ? gen.temperature.value_or(1.0)
                                                        : 0.0);
  sp.top_p = static_cast<float>(o.top_p >= 0 ? o.top_p : gen.top_p.value_or(1.0));
  sp.top_k = static_cast<int>(o.top_k >= 0 ? o.top_k : gen.top_k.value_or(0));
  sp.min_p = static_cast<float>(o.min_p >= 0 ? o.min_p : gen.min_p.value_or(0.0));
  sp.seed = static_cast<uint64_t>(o.seed);
  if (sp.top_p <= 0 || sp.top_p > 1) return InvalidArgument("--top-p must be in (0, 1]");
  if (sp.min_p < 0 || sp.min_p > 1) return InvalidArgument("--min-p must be in [0, 1]");
  if (o.max_tokens <= 0) return InvalidArgument("--max-tokens must be positive");

  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(*m.model, *m.backend, EngineOptions{}));
  auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(auto results, engine->Generate({request}));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto& [ids, reason] = results[0];

  if (o.json) {
    nlohmann::json out = {{"ids", ids},
                          {"finish_reason", FinishReasonName(reason)},
                          {"prompt_tokens", prompt.size()},
                          {"completion_tokens", ids.size()},
                          {"seconds", secs},
                          {"tokens_per_second", secs > 0 ? ids.size() / secs : 0.0}};
    std::printf("%s\n", out.dump().c_str());
  } else {
    for (size_t i = 0; i < ids.size(); ++i) std::printf("%s%d", i ? "," : "", ids[i]);
    std::printf("\n");
    std::fprintf(stderr, "%zu tokens, finish_reason=%s, %.1f tokens/s\n", ids.size(),
                 FinishReasonName(reason), secs > 0 ? ids.size() / secs : 0.0);
  }
  return Status::Ok();
}

}  // namespace

int GenerateMain(int argc, char** argv) {
  GenerateOptions o;
  Flags flags("generate", "Generates tokens from a prompt with the CPU or CUDA engine.");
  o.model.Declare(flags);
  flags.String("prompt-ids", &o.prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3");
  flags.Int("max-tokens", &o.max_tokens, "maximum number of tokens to generate");
  flags.Float("temperature", &o.temperature, "sampling temperature; 0 is greedy (default: the model's generation_config, else 1)");
  flags.Float("top-p", &o.top_p, "nucleus sampling: keep the smallest set of tokens with this much probability");
  flags.Int("top-k", &o.top_k, "keep only the k most likely tokens (0: all)");
  flags.Float("min-p", &o.min_p, "drop tokens less likely than min-p times the most likely one");
  flags.Int("seed", &o.seed, "random seed of the sampler");
  flags.Bool("ignore-eos", &o.ignore_eos, "keep generating past end-of-sequence tokens");
  flags.Bool("json", &o.json, "print one JSON line {\"ids\", \"finish_reason\", ...}");
  bool help = false;
  Status s = flags.Parse(argc, argv, 2, &help);
  if (help) return 0;
  if (s.ok() && o.prompt_ids.empty()) s = InvalidArgument("--prompt-ids is required");
  if (s.ok()) s = Run(o);
  return ReportStatus("generate", s);
}

}  // namespace corolla::cli
