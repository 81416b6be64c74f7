// corolla generate: runs prompts through the engine and prints the generated ids or text.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/data_parallel.h"
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

// The prompts' ids: --prompt-ids as given (several separated by ';'), or --prompt / --chat
// through the model's tokenizer.
Result<std::vector<std::vector<int32_t>>> PromptIds(const GenerateOptions& o, const std::string& dir,
                                                    const Tokenizer* tokenizer) {
  std::vector<std::vector<int32_t>> prompts;
  if (!o.prompt_ids.empty()) {
    std::stringstream ss(o.prompt_ids);
    std::string item;
    while (std::getline(ss, item, ';')) {
      ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIdList(item));
      prompts.push_back(std::move(ids));
    }
    return prompts;
  }
  std::string text = o.prompt;
  if (!o.chat.empty()) {
    ASSIGN_OR_RETURN(ChatTemplate chat, ChatTemplate::LoadFromDir(dir));
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    messages.push_back({{"role", "user"}, {"content", o.chat}});
    ChatRenderOptions options;
    options.add_generation_prompt = true;
    ASSIGN_OR_RETURN(text, chat.Render(messages, options));
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(text));
  prompts.push_back(std::move(ids));
  return prompts;
}

using Generated = std::pair<std::vector<int32_t>, FinishReason>;

// Under data parallelism: every rank's results (as "index reason id id ...\n" lines), in input order.
Result<std::vector<Generated>> GatherResults(const LoadedModel& m, const std::vector<int>& mine,
                                             const std::vector<Generated>& my_results, size_t num_prompts) {
  std::ostringstream blob;
  for (size_t j = 0; j < mine.size(); ++j) {
    blob << mine[j] << ' ' << static_cast<int>(my_results[j].second);
    for (int32_t id : my_results[j].first) blob << ' ' << id;
    blob << '\n';
  }
  ASSIGN_OR_RETURN(std::vector<std::string> parts, GatherFromDpRanks(m, blob.str()));
  std::vector<Generated> all(num_prompts);
  std::vector<bool> seen(num_prompts, false);
  for (const std::string& part : parts) {
    std::istringstream lines(part);
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream fields(line);
      size_t idx = 0;
      int reason = 0;
      fields >> idx >> reason;
      if (!fields || idx >= num_prompts || seen[idx]) return Internal("bad result line from a DP rank: " + line);
      seen[idx] = true;
      all[idx].second = static_cast<FinishReason>(reason);
      for (int32_t id; fields >> id;) all[idx].first.push_back(id);
    }
  }
  for (size_t i = 0; i < num_prompts; ++i)
    if (!seen[i]) return Internal("no DP rank returned prompt " + std::to_string(i));
  return all;
}

Status Run(const GenerateOptions& o) {
  ASSIGN_OR_RETURN(LoadedModel m, LoadModelFromOptions(o.model));
  std::unique_ptr<Tokenizer> tokenizer;
  if (auto t = Tokenizer::LoadFromDir(m.dir); t.ok()) {
    tokenizer = std::move(t).value();
  } else if (o.prompt_ids.empty()) {
    return t.status().WithContext("--prompt/--chat need the model's tokenizer");
  }
  ASSIGN_OR_RETURN(std::vector<std::vector<int32_t>> prompts, PromptIds(o, m.dir, tokenizer.get()));
  ASSIGN_OR_RETURN(GenerationConfig gen, LoadGenerationConfig(m.dir, m.model->config()));

  GenerationRequest request;
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

  // Under DP-EP the ranks run forwards in lockstep (cli/data_parallel.h): no decode graphs,
  // whose capture warms up with forwards of its own.
  if (IsDpEp(m)) setenv("COROLLA_CUDA_GRAPHS", "0", 1);
  CountingModel counted(*m.model);
  EngineOptions eo;
  ASSIGN_OR_RETURN(eo.linear_state_dtype, o.model.LinearStateDtype());
  ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(counted, *m.backend, eo));
  const std::vector<int> mine = SequencesOfThisRank(static_cast<int>(prompts.size()), m);
  std::vector<int64_t> seq_ids;
  for (int i : mine) {
    request.prompt = prompts[i];
    ASSIGN_OR_RETURN(int64_t id, engine->AddRequest(request));
    seq_ids.push_back(id);
  }
  auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(StepInLockstep(*engine, counted, m));
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::vector<Generated> results;
  for (int64_t id : seq_ids) {
    const Sequence* s = engine->Find(id);
    if (s == nullptr || !s->finished()) return Internal("sequence " + std::to_string(id) + " did not finish");
    results.push_back({std::vector<int32_t>(s->tokens.begin() + s->num_prompt_tokens, s->tokens.end()), s->finish_reason});
  }
  if (IsDataParallel(m)) {
    ASSIGN_OR_RETURN(results, GatherResults(m, mine, results, prompts.size()));
  }
  if (!m.is_output_rank()) return Status::Ok();  // rank 0 prints (TP ranks computed the same tokens)

  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto& [ids, reason] = results[i];
    std::string text;
    if (tokenizer) {
      ASSIGN_OR_RETURN(text, tokenizer->Decode(ids, /*skip_special_tokens=*/true));
    }
    if (o.json) {
      nlohmann::json out = {{"ids", ids},
                            {"finish_reason", FinishReasonName(reason)},
                            {"prompt_tokens", prompts[i].size()},
                            {"completion_tokens", ids.size()},
                            {"seconds", secs},
                            {"tokens_per_second", secs > 0 ? ids.size() / secs : 0.0}};
      if (tokenizer) out["text"] = text;
      std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    } else if (tokenizer && o.prompt_ids.empty()) {
      std::printf("%s\n", text.c_str());
    } else {
      for (size_t j = 0; j < ids.size(); ++j) std::printf("%s%d", j ? "," : "", ids[j]);
      std::printf("\n");
      std::fprintf(stderr, "%zu tokens, finish_reason=%s, %.1f tokens/s\n", ids.size(),
                   FinishReasonName(reason), secs > 0 ? ids.size() / secs : 0.0);
    }
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
  flags.String("prompt-ids", &o.prompt_ids,
               "prompt as comma-separated token ids, e.g. 1,2,3 (prints ids); several prompts separated by ';' "
               "run together, one output line each (with --dp D, rank r takes every D-th)");
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
    if (std::optional<int> rc = SpawnLocalRanks(o.model.world_size(), argc, argv)) return *rc;
  if (s.ok()) s = Run(o);
  return ReportStatus("generate", s);
}

}  // namespace corolla::cli
