// Chat templates: renders a conversation through the model's Jinja chat template (from
// tokenizer_config.json's "chat_template", or chat_template.jinja beside it), as transformers'
// apply_chat_template does. A ChatTemplate is immutable after Load; Render is thread-safe.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "base/status.h"

namespace corolla {

namespace jinja {
class Template;
}

// ordered_json keeps object keys in the order given, as Python dicts do: `tools | tojson` must
// print a tool's schema in the client's key order. A plain nlohmann::json converts implicitly
// (its keys arrive sorted).
struct ChatRenderOptions {
  bool add_generation_prompt = false;
  nlohmann::ordered_json tools;         // null or a JSON list of tool definitions
  nlohmann::ordered_json extra_kwargs;  // null or an object, e.g. {"enable_thinking": false}
};

class ChatTemplate {
 public:
  // `source` is the template text; bos/eos tokens are exposed to it as bos_token/eos_token.
  static Result<ChatTemplate> Parse(const std::string& source, std::string bos_token,
                                    std::string eos_token);
  // Reads DIR/tokenizer_config.json (chat_template as a string, or a list of named templates:
  // the "default" one) or DIR/chat_template.jinja.
  static Result<ChatTemplate> LoadFromDir(const std::string& dir);

  // messages: a JSON list of {"role": ..., "content": ...} (plus tool_calls etc. as the
  // template reads them). The template sees messages, tools and documents (None unless given,
  // as in transformers), add_generation_prompt, bos_token/eos_token (when set) and every key of
  // extra_kwargs. Errors from the template (raise_exception, type errors) are InvalidArgument;
  // constructs the interpreter lacks are Unsupported.
  Result<std::string> Render(const nlohmann::ordered_json& messages,
                             const ChatRenderOptions& options) const;

 private:
  std::shared_ptr<const jinja::Template> template_;
  std::string bos_token_;
  std::string eos_token_;
};

}  // namespace corolla
