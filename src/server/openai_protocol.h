// The OpenAI request schema: parsing and validating the JSON bodies of /v1/chat/completions and
// /v1/completions into plain structs, and the OpenAI error object. Pure functions of their
// input (no model, no engine), so they are cheap to test and fuzz; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"

namespace corolla::server {

// {"error": {"message", "type", "param", "code"}} with its HTTP status.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // empty: null
  std::string code;   // empty: null
  std::string ToJson() const;
};
ApiError BadRequest(std::string message, std::string param = "");

// Fields shared by chat and text completions. Unset optionals take the model's defaults.
struct CompletionParams {
  std::string model;  // empty: not given
  std::optional<int64_t> max_tokens;
  std::optional<double> temperature, top_p, min_p;
  std::optional<int64_t> top_k;
  std::optional<uint64_t> seed;
  double presence_penalty = 0, frequency_penalty = 0, repetition_penalty = 1;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool skip_special_tokens = true;
  bool stream = false;
  bool include_usage = false;
  int n = 1;
  int num_logprobs = -1;  // <0: none; 0: the sampled token's; k: also the top k
};

struct ChatRequest {
  CompletionParams params;
  nlohmann::json messages;  // validated list; content parts joined into one string
  nlohmann::json tools;     // null or a list
  nlohmann::json chat_template_kwargs;  // null or an object
  bool add_generation_prompt = true;

  // What the chat template is rendered with besides the messages (the server, its fuzz tests).
  ChatRenderOptions RenderOptions() const;
};

struct CompletionRequest {
  CompletionParams params;
  std::string prompt_text;           // when the prompt is text
  std::vector<int32_t> prompt_ids;   // when it is token ids
  bool prompt_is_ids = false;
  bool echo = false;
};

constexpr int kMaxTopLogprobs = 20;

// Each returns the error to answer with, or nothing when *out is filled.
std::optional<ApiError> ParseChatRequest(const std::string& body, ChatRequest* out);
std::optional<ApiError> ParseCompletionRequest(const std::string& body, CompletionRequest* out);

// Parses a JSON object body, or the 400 for malformed JSON / a non-object / nesting deeper than
// kMaxJsonDepth (a tool's parameter schema nests a few levels; 128 leave room for any real one).
constexpr int kMaxJsonDepth = 128;
std::optional<ApiError> ParseJsonObject(const std::string& body, nlohmann::json* out);
// The deepest nesting of arrays and objects in JSON text (brackets inside strings not counted).
int JsonNestingDepth(std::string_view text);

}  // namespace corolla::server
