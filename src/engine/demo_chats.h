// Test support: the built-in demo model's golden chats (golden-chat.json beside the model) as
// greedy requests that stop at the model's eos ids, with the ids the reference generated.
// Shared by the CPU and CUDA tests; header-only.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "model/config.h"

namespace corolla {

struct DemoChats {
  std::vector<GenerationRequest> requests;
  std::vector<std::vector<int32_t>> expected;  // greedy_ids of each chat
};

inline Result<DemoChats> LoadDemoChats(const std::string& dir, const ModelConfig& config) {
  ASSIGN_OR_RETURN(GenerationConfig gen, LoadGenerationConfig(dir, config));
  ASSIGN_OR_RETURN(std::string text, ReadFile(dir + "/golden-chat.json"));
  ASSIGN_OR_RETURN(nlohmann::json golden, ParseJson(text, dir + "/golden-chat.json"));
  DemoChats chats;
  for (const auto& chat : golden["chats"]) {
    GenerationRequest r;
    r.prompt = chat["prompt_ids"].get<std::vector<int32_t>>();
    r.sampling.temperature = 0;
    r.max_tokens = static_cast<int>(chat["greedy_ids"].size()) + 16;
    r.stop_token_ids = std::vector<int32_t>(gen.eos_token_ids.begin(), gen.eos_token_ids.end());
    chats.requests.push_back(r);
    chats.expected.push_back(chat["greedy_ids"].get<std::vector<int32_t>>());
  }
  if (chats.requests.empty()) return Corrupt(dir + "/golden-chat.json: no chats");
  return chats;
}

}  // namespace corolla
