#include "tokenizer/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tokenizer/jinja/template.h"

namespace corolla {
namespace {

Result<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// bos_token / eos_token are strings, AddedToken objects {"content": ...}, or null.
std::string TokenContent(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return "";
}

}  // namespace

Result<ChatTemplate> ChatTemplate::Parse(const std::string& source, std::string bos_token,
                                         std::string eos_token) {
  Result<std::shared_ptr<const jinja::Template>> parsed = jinja::Template::Parse(source);
  if (!parsed.ok()) return parsed.status().WithContext("chat template");
  ChatTemplate t;
  t.template_ = std::move(parsed).value();
  t.bos_token_ = std::move(bos_token);
  t.eos_token_ = std::move(eos_token);
  return t;
}

Result<ChatTemplate> ChatTemplate::LoadFromDir(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "tokenizer_config.json").string();
  const std::string jinja_path = (fs::path(dir) / "chat_template.jinja").string();
  nlohmann::json config = nlohmann::json::object();
  if (fs::exists(config_path)) {
    ASSIGN_OR_RETURN(std::string text, ReadFile(config_path));
    config = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return Corrupt(config_path + ": not a JSON object");
    }
  }
  std::string source;
  std::string source_name;
  if (fs::exists(jinja_path)) {  // as in transformers, the separate file takes precedence
    ASSIGN_OR_RETURN(source, ReadFile(jinja_path));
    source_name = jinja_path;
  } else {
    auto it = config.find("chat_template");
    if (it == config.end() || it->is_null()) {
      return NotFound(dir +
                      ": no chat template (no chat_template in tokenizer_config.json and no "
                      "chat_template.jinja)");
    }
    source_name = config_path + " chat_template";
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      std::string names;
      bool found = false;
      for (const auto& entry : *it) {
        if (!entry.is_object() || !entry.contains("name") || !entry.contains("template") ||
            !entry["name"].is_string() || !entry["template"].is_string()) {
          return Corrupt(config_path + ": chat_template list entries must be {name, template}");
        }
        names += (names.empty() ? "" : ", ") + entry["name"].get<std::string>();
        if (entry["name"] == "default") {
          source = entry["template"].get<std::string>();
          found = true;
        }
      }
      if (!found) {
        return NotFound(config_path +
                        ": chat_template list has no \"default\" entry (has: " + names + ")");
      }
    } else {
      return Corrupt(config_path + ": chat_template must be a string or a list");
    }
  }
  Result<ChatTemplate> t =
      Parse(source, TokenContent(config, "bos_token"), TokenContent(config, "eos_token"));
  if (!t.ok()) return t.status().WithContext(source_name);
  return t;
}

Result<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                         const ChatRenderOptions& options) const {
  if (!template_) return InvalidArgument("chat template was not loaded");
  if (!messages.is_array()) return InvalidArgument("messages must be a JSON list");
  if (!options.extra_kwargs.is_null() && !options.extra_kwargs.is_object()) {
    return InvalidArgument("chat template kwargs must be a JSON object");
  }
  nlohmann::ordered_json context = nlohmann::ordered_json::object();
  context["messages"] = messages;
  context["tools"] = options.tools;  // null when not given, as transformers passes tools=None
  context["documents"] = nullptr;
  context["add_generation_prompt"] = options.add_generation_prompt;
  // transformers passes special_tokens_map, which leaves out unset tokens.
  if (!bos_token_.empty()) context["bos_token"] = bos_token_;
  if (!eos_token_.empty()) context["eos_token"] = eos_token_;
  if (options.extra_kwargs.is_object()) {
    for (auto it = options.extra_kwargs.begin(); it != options.extra_kwargs.end(); ++it) {
      context[it.key()] = it.value();
    }
  }
  Result<std::string> text = template_->Render(context);
  if (!text.ok()) return text.status().WithContext("chat template");
  return text;
}

}  // namespace corolla
