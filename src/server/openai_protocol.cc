#include "server/openai_protocol.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

namespace corolla::server {

using json = nlohmann::json;

std::string ApiError::ToJson() const {
  json e = {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}};
  // (replace: a message may quote a client's string cut at a byte count)
  return json{{"error", e}}.dump(-1, ' ', false, json::error_handler_t::replace);
}

ChatRenderOptions ChatRequest::RenderOptions() const {
  ChatRenderOptions o;
  o.add_generation_prompt = add_generation_prompt;
  o.tools = tools;
  o.extra_kwargs = chat_template_kwargs;
  return o;
}

ApiError BadRequest(std::string message, std::string param) {
  ApiError e;
  e.status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  return e;
}

int JsonNestingDepth(std::string_view text) {
  int depth = 0, deepest = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped character cannot end the string
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return deepest;
}

std::optional<ApiError> ParseJsonObject(const std::string& body, json* out) {
  // Checked before parsing: the parsed value is copied, converted and destroyed recursively
  // (and rendered by the chat template), so a body of nested brackets would overflow a stack.
  if (JsonNestingDepth(body) > kMaxJsonDepth)
    return BadRequest("the request body nests JSON arrays and objects more than " + std::to_string(kMaxJsonDepth) +
                      " levels deep");
  *out = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) return BadRequest("the request body is not valid JSON");
  if (!out->is_object()) return BadRequest("the request body must be a JSON object");
  return std::nullopt;
}

namespace {

const char* TypeName(const json& v) {
  if (v.is_string()) return "a string";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_array()) return "an array";
  if (v.is_object()) return "an object";
  return "null";
}

ApiError WrongType(const std::string& key, const char* expected, const json& v) {
  return BadRequest("'" + key + "' must be " + expected + ", got " + TypeName(v), key);
}

// Field readers: absent or null leaves *out untouched.
std::optional<ApiError> GetBool(const json& j, const char* key, bool* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_boolean()) return WrongType(key, "a boolean", *it);
  *out = it->get<bool>();
  return std::nullopt;
}

std::optional<ApiError> GetInt(const json& j, const char* key, int64_t lo, int64_t hi, std::optional<int64_t>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  int64_t v;
  if (it->is_number_integer()) {
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      return BadRequest("'" + std::string(key) + "' is out of range", key);
    v = it->get<int64_t>();
  } else if (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>() &&
             std::fabs(it->get<double>()) < 9e15) {
    v = static_cast<int64_t>(it->get<double>());
  } else {
    return WrongType(key, "an integer", *it);
  }
  if (v < lo || v > hi)
    return BadRequest("'" + std::string(key) + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                          "], got " + std::to_string(v),
                      key);
  *out = v;
  return std::nullopt;
}

std::optional<ApiError> GetNumber(const json& j, const char* key, double lo, double hi, std::optional<double>* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return WrongType(key, "a number", *it);
  double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), "'%s' must be in [%g, %g], got %g", key, lo, hi, v);
    return BadRequest(buf, key);
  }
  *out = v;
  return std::nullopt;
}

#define RETURN_IF_API_ERROR(expr)            \
  do {                                       \
    if (auto _err = (expr)) return _err;     \
  } while (0)

std::optional<ApiError> ParseParams(const json& j, CompletionParams* p) {
  if (auto it = j.find("model"); it != j.end() && !it->is_null()) {
    if (!it->is_string()) return WrongType("model", "a string", *it);
    p->model = it->get<std::string>();
  }
  std::optional<int64_t> max_tokens;
  RETURN_IF_API_ERROR(GetInt(j, "max_tokens", 1, INT32_MAX, &max_tokens));
  RETURN_IF_API_ERROR(GetInt(j, "max_completion_tokens", 1, INT32_MAX, &max_tokens));
  p->max_tokens = max_tokens;
  RETURN_IF_API_ERROR(GetNumber(j, "temperature", 0, 100, &p->temperature));
  RETURN_IF_API_ERROR(GetNumber(j, "top_p", 1e-9, 1, &p->top_p));
  RETURN_IF_API_ERROR(GetNumber(j, "min_p", 0, 1, &p->min_p));
  RETURN_IF_API_ERROR(GetInt(j, "top_k", -1, INT32_MAX, &p->top_k));
  std::optional<int64_t> seed;
  if (auto it = j.find("seed"); it != j.end() && it->is_number_unsigned()) {
    p->seed = it->get<uint64_t>();
  } else {
    RETURN_IF_API_ERROR(GetInt(j, "seed", INT64_MIN, INT64_MAX, &seed));
    if (seed) p->seed = static_cast<uint64_t>(*seed);
  }
  std::optional<double> v;
  RETURN_IF_API_ERROR(GetNumber(j, "presence_penalty", -2, 2, &v));
  if (v) p->presence_penalty = *std::exchange(v, std::nullopt);
  RETURN_IF_API_ERROR(GetNumber(j, "frequency_penalty", -2, 2, &v));
  if (v) p->frequency_penalty = *std::exchange(v, std::nullopt);
  RETURN_IF_API_ERROR(GetNumber(j, "repetition_penalty", 1e-6, 100, &v));
  if (v) p->repetition_penalty = *v;
  if (auto it = j.find("stop"); it != j.end() && !it->is_null()) {
    if (it->is_string()) {
      p->stop.push_back(it->get<std::string>());
    } else if (it->is_array()) {
      for (const auto& s : *it) {
        if (!s.is_string()) return BadRequest("'stop' must be a string or a list of strings", "stop");
        p->stop.push_back(s.get<std::string>());
      }
    } else {
      return WrongType("stop", "a string or a list of strings", *it);
    }
    if (p->stop.size() > 64) return BadRequest("at most 64 stop strings are allowed", "stop");
    for (const auto& s : p->stop)
      if (s.empty()) return BadRequest("stop strings must not be empty", "stop");
  }
  if (auto it = j.find("stop_token_ids"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return WrongType("stop_token_ids", "a list of integers", *it);
    for (const auto& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        return BadRequest("'stop_token_ids' must be a list of token ids", "stop_token_ids");
      p->stop_token_ids.push_back(t.get<int32_t>());
    }
  }
  RETURN_IF_API_ERROR(GetBool(j, "ignore_eos", &p->ignore_eos));
  RETURN_IF_API_ERROR(GetBool(j, "skip_special_tokens", &p->skip_special_tokens));
  RETURN_IF_API_ERROR(GetBool(j, "stream", &p->stream));
  if (auto it = j.find("stream_options"); it != j.end() && !it->is_null()) {
    if (!it->is_object()) return WrongType("stream_options", "an object", *it);
    if (!p->stream) return BadRequest("'stream_options' is only allowed when 'stream' is true", "stream_options");
    RETURN_IF_API_ERROR(GetBool(*it, "include_usage", &p->include_usage));
  }
  std::optional<int64_t> n;
  RETURN_IF_API_ERROR(GetInt(j, "n", 1, 128, &n));
  if (n) p->n = static_cast<int>(*n);
  return std::nullopt;
}

// Text of a message's content: a string, or the text parts of a list joined.
std::optional<ApiError> NormalizeContent(json& message, size_t idx) {
  const std::string param = "messages[" + std::to_string(idx) + "].content";
  auto it = message.find("content");
  if (it == message.end() || it->is_null() || it->is_string()) return std::nullopt;
  if (!it->is_array()) return WrongType(param, "a string or a list of content parts", *it);
  std::string text;
  for (const auto& part : *it) {
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string())
      return BadRequest("each content part must be an object with a 'type'", param);
    if (part["type"] != "text")
      return BadRequest("content parts of type '" + part["type"].get<std::string>() + "' are not supported", param);
    if (!part.contains("text") || !part["text"].is_string())
      return BadRequest("a text content part needs a string 'text'", param);
    text += part["text"].get<std::string>();
  }
  *it = text;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseChatRequest(const std::string& body, ChatRequest* out) {
  json j;
  RETURN_IF_API_ERROR(ParseJsonObject(body, &j));
  RETURN_IF_API_ERROR(ParseParams(j, &out->params));
  auto it = j.find("messages");
  if (it == j.end() || it->is_null()) return BadRequest("'messages' is required", "messages");
  if (!it->is_array()) return WrongType("messages", "a list of messages", *it);
  if (it->empty()) return BadRequest("'messages' must contain at least one message", "messages");
  out->messages = std::move(*it);
  for (size_t i = 0; i < out->messages.size(); ++i) {
    json& m = out->messages[i];
    const std::string param = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return WrongType(param, "an object", m);
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return BadRequest(param + " needs a string 'role'", param + ".role");
    static const char* kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    if (std::find(std::begin(kRoles), std::end(kRoles), role->get<std::string>()) == std::end(kRoles))
      return BadRequest("unknown role '" + role->get<std::string>() + "'", param + ".role");
    RETURN_IF_API_ERROR(NormalizeContent(m, i));
  }
  bool logprobs = false;
  RETURN_IF_API_ERROR(GetBool(j, "logprobs", &logprobs));
  std::optional<int64_t> top;
  RETURN_IF_API_ERROR(GetInt(j, "top_logprobs", 0, kMaxTopLogprobs, &top));
  if (top && !logprobs) return BadRequest("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
  if (logprobs) out->params.num_logprobs = static_cast<int>(top.value_or(0));
  if (auto t = j.find("tools"); t != j.end() && !t->is_null()) {
    if (!t->is_array()) return WrongType("tools", "a list", *t);
    if (!t->empty()) out->tools = *t;
  }
  if (auto k = j.find("chat_template_kwargs"); k != j.end() && !k->is_null()) {
    if (!k->is_object()) return WrongType("chat_template_kwargs", "an object", *k);
    out->chat_template_kwargs = *k;
  }
  RETURN_IF_API_ERROR(GetBool(j, "add_generation_prompt", &out->add_generation_prompt));
  return std::nullopt;
}

std::optional<ApiError> ParseCompletionRequest(const std::string& body, CompletionRequest* out) {
  json j;
  RETURN_IF_API_ERROR(ParseJsonObject(body, &j));
  RETURN_IF_API_ERROR(ParseParams(j, &out->params));
  auto it = j.find("prompt");
  if (it == j.end() || it->is_null()) return BadRequest("'prompt' is required", "prompt");
  const json* prompt = &*it;
  if (prompt->is_array() && prompt->size() == 1 && ((*prompt)[0].is_string() || (*prompt)[0].is_array()))
    prompt = &(*prompt)[0];  // a batch of one
  if (prompt->is_string()) {
    out->prompt_text = prompt->get<std::string>();
    if (out->prompt_text.empty()) return BadRequest("'prompt' must not be empty", "prompt");
  } else if (prompt->is_array()) {
    if (prompt->empty()) return BadRequest("'prompt' must not be empty", "prompt");
    for (const auto& t : *prompt) {
      if (t.is_string() || t.is_array()) return BadRequest("batched prompts are not supported; send one per request", "prompt");
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        return BadRequest("'prompt' must be a string or a list of token ids", "prompt");
      out->prompt_ids.push_back(t.get<int32_t>());
    }
    out->prompt_is_ids = true;
  } else {
    return WrongType("prompt", "a string or a list of token ids", *prompt);
  }
  RETURN_IF_API_ERROR(GetBool(j, "echo", &out->echo));
  std::optional<int64_t> logprobs;
  RETURN_IF_API_ERROR(GetInt(j, "logprobs", 0, kMaxTopLogprobs, &logprobs));
  if (logprobs) out->params.num_logprobs = static_cast<int>(*logprobs);
  if (auto s = j.find("suffix"); s != j.end() && !s->is_null())
    return BadRequest("'suffix' is not supported", "suffix");
  if (auto b = j.find("best_of"); b != j.end() && !b->is_null() && !(b->is_number_integer() && b->get<int64_t>() == 1))
    return BadRequest("only best_of = 1 is supported", "best_of");
  return std::nullopt;
}

}  // namespace corolla::server
