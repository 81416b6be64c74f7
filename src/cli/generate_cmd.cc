// corolla generate: runs one prompt through the engine and prints the generated ids.
#include <chrono>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/model_options.h"
#include "engine/engine.h"
#include "parallel/launcher.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace corolla::cli {
namespace {

struct GenerateOptions {
  ModelOptions model;
  std::string prompt_ids;
  std::string prompt;  // text
  std::string chat;    // one user message, through the chat template
  int64_t max_tokens = 64;
  double temperature = -1;  // <0: the model's generation_config default
  double top_p = -1;
  int64_t top_k = -1;
  double min_p = -1;
  int64_t seed = 0;
  bool ignore_eos = false;
  bool json = false;
};

// The prompt's ids: --prompt-ids as given, or --prompt / --chat through the model's tokenizer.
Result<std::vector<int32_t>> PromptIds(const GenerateOptions& o, const std::string& dir,
                                       const Tokenizer* tokenizer) {
  if (!o.prompt_ids.empty()) return ParseIdList(o.prompt_ids);
  std::string text = o.prompt;
  if (!o.chat.empty()) {
    ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::LoadFromDir(dir));
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    messages.push_back({{"role", "user"}, {"content", o.chat}});
    ChatRenderOptions options;
    options.add_generation_prompt = true;
    ASSIGN_OR_RETURN(text, chat.Render(messages, options));
  }
  return tokenizer->Encode(text);
}

Status Run(const GenerateOptions& o) {
  ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromOptions(o.model));
  std::unique_ptr<Tokenizer> tokenizer;
  if (auto t = Tokenizer::LoadFromDir(m.dir); t.ok()) {
    tokenizer = std::move(t).value();
  } else if (o.prompt_ids.empty()) {
    return t.status().WithContext("--prompt/--chat need the model's tokenizer");
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> prompt, PromptIds(o, m.dir, tokenizer.get()));
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
  if (!m.is_output_rank()) return Status::Ok();  // every rank computed the same tokens; rank 0 prints
  const auto& [ids, reason] = results[0];
  std::string text;
  if (tokenizer) {
    ASSIGN_OR_RETURN(text, tokenizer->Decode(ids, /*skip_special_tokens=*/true));
  }

  if (o.json) {
    nlohmann::json out = {{"ids", ids},
                          {"finish_reason", FinishReasonName(reason)},
                          {"prompt_tokens", prompt.size()},
                          {"completion_tokens", ids.size()},
                          {"seconds", secs},
                          {"tokens_per_second", secs > 0 ? ids.size() / secs : 0.0}};
    if (tokenizer) out["text"] = text;
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else if (tokenizer && o.prompt_ids.empty()) {
    std::printf("%s\n", text.c_str());
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
  Flags flags("generate",
              "Generates from a prompt with the CPU or CUDA engine. With --prompt-ids it prints the\n"
              "generated ids; with --prompt or --chat, the generated text.");
  o.model.Declare(flags);
  flags.String("prompt-ids", &o.prompt_ids, "prompt as comma-separated token ids, e.g. 1,2,3 (prints ids)");
  flags.String("prompt", &o.prompt, "prompt as text, encoded by the model's tokenizer (prints text)");
  flags.String("chat", &o.chat, "one user message, rendered through the model's chat template (prints text)");
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
  int given = !o.prompt_ids.empty() + !o.prompt.empty() + !o.chat.empty();
  if (s.ok() && given != 1) s = InvalidArgument("give exactly one of --prompt-ids, --prompt, --chat");
  if (s.ok())
    if (std::optional<int> rc = SpawnLocalRanks(static_cast<int>(o.model.tp), argc, argv)) return *rc;
  if (s.ok()) s = Run(o);
  return ReportStatus("generate", s);
}

}  // namespace corolla::cli
