// `corolla tokenize` and `corolla detokenize`: text (or a chat) on stdin to token ids, and ids
// back to text, with a model's tokenizer.json.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/flags.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace corolla::cli {
namespace {

std::string ReadStdin() {
  std::ios::sync_with_stdio(false);
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

// Ordered: the chat template prints messages and tool schemas in the client's key order.
Result<nlohmann::ordered_json> ParseJson(const std::string& text, const std::string& what) {
  auto j = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return InvalidArgument(what + " is not valid JSON");
  return j;
}

Result<std::vector<int32_t>> ParseIds(const std::string& text) {
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return std::vector<int32_t>{};
  if (text[first] == '[' || text[first] == '{') {
    ASSIGN_OR_RETURN(nlohmann::ordered_json j, ParseJson(text, "stdin"));
    if (j.is_object() && j.contains("ids")) j = j["ids"];
    if (!j.is_array()) return InvalidArgument("expected a JSON list of ids or {\"ids\": [...]}");
    std::vector<int32_t> ids;
    for (const auto& v : j) {
      if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX)
        return InvalidArgument("'" + v.dump() + "' is not a token id");
      ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    return ids;
  }
  // Comma- and/or whitespace-separated integers.
  std::string list = text;
  for (char& c : list)
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n') c = ',';
  std::string compact;
  for (size_t i = 0; i < list.size(); ++i)
    if (list[i] != ',' || (!compact.empty() && compact.back() != ',')) compact += list[i];
  while (!compact.empty() && compact.back() == ',') compact.pop_back();
  return ParseIdList(compact);
}

Status Tokenize(int argc, char** argv, bool* help) {
  std::string dir, tools_file;
  bool chat = false, add_generation_prompt = false, add_special_tokens = false;
  Flags flags("tokenize",
              "Reads UTF-8 text on stdin (exactly as given, newlines included) and prints its "
              "token ids as {\"ids\":[...]}.\nWith --chat, stdin is a JSON list of messages, "
              "rendered through the model's chat template and encoded as it stands.");
  flags.String("tokenizer", &dir, "directory with tokenizer.json (and tokenizer_config.json)");
  flags.Bool("chat", &chat, "stdin is a JSON list of {\"role\", \"content\"} messages");
  flags.Bool("add-generation-prompt", &add_generation_prompt,
             "with --chat: end with the assistant's turn header");
  flags.String("tools", &tools_file, "with --chat: JSON file with a list of tool definitions");
  flags.Bool("add-special-tokens", &add_special_tokens,
             "apply the tokenizer's post-processor (e.g. add BOS); not with --chat");
  RETURN_IF_ERROR(flags.Parse(argc, argv, 2, help));
  if (*help) return Status::Ok();
  if (dir.empty()) return InvalidArgument("--tokenizer DIR is required");
  if (!chat && (add_generation_prompt || !tools_file.empty()))
    return InvalidArgument("--add-generation-prompt and --tools need --chat");
  if (chat && add_special_tokens)
    return InvalidArgument("--add-special-tokens does not apply to --chat (the template adds them)");
  ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::LoadFromDir(dir));
  std::string input = ReadStdin();
  std::string text;
  if (chat) {
    ASSIGN_OR_RETURN(nlohmann::ordered_json messages, ParseJson(input, "stdin (--chat)"));
    if (messages.is_object() && messages.contains("messages")) messages = messages["messages"];
    if (!messages.is_array()) return InvalidArgument("--chat expects a JSON list of messages");
    ChatRenderOptions options;
    options.add_generation_prompt = add_generation_prompt;
    if (!tools_file.empty()) {
      std::ifstream in(tools_file);
      if (!in) return NotFound("cannot open --tools file " + tools_file);
      std::stringstream s;
      s << in.rdbuf();
      ASSIGN_OR_RETURN(options.tools, ParseJson(s.str(), tools_file));
      if (!options.tools.is_array()) return InvalidArgument(tools_file + ": expected a JSON list");
    }
    ASSIGN_OR_RETURN(ChatTemplate chat_template, ChatTemplate::LoadFromDir(dir));
    ASSIGN_OR_RETURN(text, chat_template.Render(messages, options));
  } else {
    text = std::move(input);
  }
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, tokenizer->Encode(text, add_special_tokens));
  std::string out = "{\"ids\":[";
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    out += std::to_string(ids[i]);
  }
  out += "]}\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  return Status::Ok();
}

Status Detokenize(int argc, char** argv, bool* help) {
  std::string dir;
  bool skip_special_tokens = false;
  Flags flags("detokenize",
              "Reads token ids on stdin (a JSON list, {\"ids\":[...]}, or comma/whitespace "
              "separated) and prints their text, with no newline added.");
  flags.String("tokenizer", &dir, "directory with tokenizer.json");
  flags.Bool("skip-special-tokens", &skip_special_tokens, "leave out special tokens");
  RETURN_IF_ERROR(flags.Parse(argc, argv, 2, help));
  if (*help) return Status::Ok();
  if (dir.empty()) return InvalidArgument("--tokenizer DIR is required");
  ASSIGN_OR_RETURN(auto tokenizer, Tokenizer::LoadFromDir(dir));
  ASSIGN_OR_RETURN(std::vector<int32_t> ids, ParseIds(ReadStdin()));
  ASSIGN_OR_RETURN(std::string text, tokenizer->Decode(ids, skip_special_tokens));
  std::fwrite(text.data(), 1, text.size(), stdout);
  return Status::Ok();
}

}  // namespace

int TokenizeMain(int argc, char** argv) {
  bool help = false;
  return ReportStatus("tokenize", Tokenize(argc, argv, &help));
}

int DetokenizeMain(int argc, char** argv) {
  bool help = false;
  return ReportStatus("detokenize", Detokenize(argc, argv, &help));
}

}  // namespace corolla::cli
