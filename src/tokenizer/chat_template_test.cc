#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace corolla {
namespace {

namespace fs = std::filesystem;

// Tests run from the repository root.
const char* kQwen3Dir = ".cache/tokenizers/qwen3";
const char* kDeepSeekDir = ".cache/tokenizers/deepseek_v3";
const char* kDemoDir = "models/corolla-demo";

nlohmann::ordered_json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::ordered_json::parse(ss.str());
}

bool RealTokenizersPresent() {
  return fs::exists(std::string(kQwen3Dir) + "/tokenizer_config.json") &&
         fs::exists(std::string(kDeepSeekDir) + "/tokenizer_config.json");
}

#define REQUIRE_REAL_TOKENIZERS()                                       \
  ASSERT_TRUE(RealTokenizersPresent())                                  \
      << "real tokenizer configs missing under .cache/tokenizers: run " \
         "scripts/fetch_tokenizers.sh first"

// Every `chat` case of tests/data/tokenizer-golden/NAME.json, rendered by transformers.
void CheckGoldenChats(const std::string& model_dir, const std::string& golden_path) {
  Result<ChatTemplate> t = ChatTemplate::LoadFromDir(model_dir);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  nlohmann::ordered_json golden = ReadJson(golden_path);
  ASSERT_TRUE(golden.contains("chat"));
  ASSERT_FALSE(golden["chat"].empty());
  for (const auto& c : golden["chat"]) {
    ChatRenderOptions options;
    options.add_generation_prompt = c.value("add_generation_prompt", false);
    if (c.contains("tools")) options.tools = c["tools"];
    if (c.contains("kwargs")) options.extra_kwargs = c["kwargs"];
    Result<std::string> text = t->Render(c["messages"], options);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(*text, c["text"].get<std::string>()) << c["messages"].dump();
  }
}

TEST(ChatTemplate, Qwen3MatchesTransformers) {
  REQUIRE_REAL_TOKENIZERS();
  CheckGoldenChats(kQwen3Dir, "tests/data/tokenizer-golden/qwen3.json");
}

TEST(ChatTemplate, DeepSeekV3MatchesTransformers) {
  REQUIRE_REAL_TOKENIZERS();
  CheckGoldenChats(kDeepSeekDir, "tests/data/tokenizer-golden/deepseek_v3.json");
}

TEST(ChatTemplate, DemoModelMatchesGoldenChat) {
  Result<ChatTemplate> t = ChatTemplate::LoadFromDir(kDemoDir);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  nlohmann::ordered_json golden = ReadJson(std::string(kDemoDir) + "/golden-chat.json");
  ASSERT_FALSE(golden["chats"].empty());
  for (const auto& c : golden["chats"]) {
    ChatRenderOptions options;
    options.add_generation_prompt = true;
    Result<std::string> text = t->Render(c["messages"], options);
    ASSERT_TRUE(text.ok()) << text.status().ToString();
    EXPECT_EQ(*text, c["prompt_text"].get<std::string>());
  }
}

// Tools, tool calls, reasoning and kwargs through the real templates. Expected texts were
// rendered by jinja2 3.1.6 in transformers' chat-template environment (render(messages=...,
// tools=..., documents=None, add_generation_prompt=True, bos/eos tokens, **kwargs)).
struct AgentCase {
  const char* name;
  const char* messages;
  const char* tools;
  const char* kwargs;
  const char* expected;
};
const AgentCase kAgentCases[] = {
    {"qwen3_tools",
     "[{\"role\": \"system\", \"content\": \"You are helpful.\"}, {\"role\": \"user\", "
     "\"content\": \"Weather in Paris\?\"}]",
     "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
     "\"Weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
     "{\"type\": \"string\", \"description\": \"City name, e.g. Zürich\"}}, \"required\": "
     "[\"city\"]}}}]",
     "{}",
     "<|im_start|>system\nYou are helpful.\n\n# Tools\n\nYou may call one or more functions to "
     "assist with the user query.\n\nYou are provided with function signatures within "
     "<tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": "
     "\"get_weather\", \"description\": \"Weather for a city.\", \"parameters\": {\"type\": "
     "\"object\", \"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, "
     "e.g. Zürich\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a "
     "json object with function name and arguments within <tool_call></tool_call> XML "
     "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
     "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in "
     "Paris\?<|im_end|>\n<|im_start|>assistant\n"},
    {"qwen3_agent",
     "[{\"role\": \"user\", \"content\": \"Weather in Paris\?\"}, {\"role\": \"assistant\", "
     "\"content\": \"\", \"reasoning_content\": \"Need the tool.\", \"tool_calls\": [{\"type\": "
     "\"function\", \"function\": {\"name\": \"get_weather\", \"arguments\": {\"city\": "
     "\"Paris\"}}}]}, {\"role\": \"tool\", \"content\": \"{\\\"temp\\\": 21}\"}, {\"role\": "
     "\"tool\", \"content\": \"second\"}, {\"role\": \"assistant\", \"content\": \"<think>\\nIt is "
     "warm.\\n</think>\\n\\nIt is 21 C.\"}, {\"role\": \"user\", \"content\": \"Thanks\"}]",
     "[{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": "
     "\"Weather for a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": "
     "{\"type\": \"string\", \"description\": \"City name, e.g. Zürich\"}}, \"required\": "
     "[\"city\"]}}}]",
     "{\"enable_thinking\": false}",
     "<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with the user "
     "query.\n\nYou are provided with function signatures within <tools></tools> XML "
     "tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
     "\"description\": \"Weather for a city.\", \"parameters\": {\"type\": \"object\", "
     "\"properties\": {\"city\": {\"type\": \"string\", \"description\": \"City name, e.g. "
     "Zürich\"}}, \"required\": [\"city\"]}}}\n</tools>\n\nFor each function call, return a json "
     "object with function name and arguments within <tool_call></tool_call> XML "
     "tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
     "<args-json-object>}\n</tool_call><|im_end|>\n<|im_start|>user\nWeather in "
     "Paris\?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", "
     "\"arguments\": {\"city\": "
     "\"Paris\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n{\"temp\": "
     "21}\n</tool_response>\n<tool_response>\nsecond\n</"
     "tool_response><|im_end|>\n<|im_start|>assistant\nIt is 21 "
     "C.<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n<think>\n\n</"
     "think>\n\n"},
    {"deepseek_tools",
     "[{\"role\": \"system\", \"content\": \"S1\"}, {\"role\": \"system\", \"content\": \"S2\"}, "
     "{\"role\": \"user\", \"content\": \"Weather\?\"}, {\"role\": \"assistant\", \"content\": "
     "null, \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
     "\"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}, {\"type\": \"function\", \"function\": "
     "{\"name\": \"get_time\", \"arguments\": \"{}\"}}]}, {\"role\": \"tool\", \"content\": "
     "\"21C\"}, {\"role\": \"tool\", \"content\": \"noon\"}, {\"role\": \"assistant\", "
     "\"content\": \"Warm at noon.\"}, {\"role\": \"user\", \"content\": \"ok\"}]",
     "null", "{}",
     "<｜begin▁of▁sentence｜>S1\n\nS2<｜User｜>Weather\?<｜Assistant｜><｜tool▁calls▁begin｜><"
     "｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": "
     "\"Paris\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```"
     "json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜><"
     "｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>21C<｜tool▁output▁end｜>\n<"
     "｜tool▁output▁begin｜>noon<｜tool▁output▁end｜><｜tool▁outputs▁end｜>Warm at "
     "noon.<｜end▁of▁sentence｜><｜User｜>ok<｜Assistant｜>"},
};

TEST(ChatTemplate, ToolsReasoningAndKwargsMatchJinja2) {
  REQUIRE_REAL_TOKENIZERS();
  for (const AgentCase& c : kAgentCases) {
    std::string name = c.name;
    Result<ChatTemplate> t =
        ChatTemplate::LoadFromDir(name.rfind("qwen3", 0) == 0 ? kQwen3Dir : kDeepSeekDir);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ChatRenderOptions options;
    options.add_generation_prompt = true;
    options.tools = nlohmann::ordered_json::parse(c.tools);
    options.extra_kwargs = nlohmann::ordered_json::parse(c.kwargs);
    Result<std::string> text = t->Render(nlohmann::ordered_json::parse(c.messages), options);
    ASSERT_TRUE(text.ok()) << name << ": " << text.status().ToString();
    EXPECT_EQ(*text, c.expected) << name;
  }
}

TEST(ChatTemplate, Qwen3EnableThinkingFalse) {
  REQUIRE_REAL_TOKENIZERS();
  Result<ChatTemplate> t = ChatTemplate::LoadFromDir(kQwen3Dir);
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ChatRenderOptions options;
  options.add_generation_prompt = true;
  options.extra_kwargs = {{"enable_thinking", false}};
  Result<std::string> text = t->Render(R"([{"role": "user", "content": "Hi"}])"_json, options);
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
}

class TempDir {
 public:
  TempDir() {
    path_ =
        fs::temp_directory_path() / ("corolla_chat_template_test_" + std::to_string(::getpid()) +
                                     "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  void Write(const std::string& name, const std::string& text) const {
    std::ofstream(path_ / name) << text;
  }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

TEST(ChatTemplate, LoadsNamedTemplateListAndTokenObjects) {
  TempDir dir;
  dir.Write("tokenizer_config.json", R"({
    "bos_token": {"__type": "AddedToken", "content": "<s>"},
    "eos_token": "</s>",
    "chat_template": [
      {"name": "tool_use", "template": "TOOLS"},
      {"name": "default", "template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}{{ eos_token }}"}
    ]})");
  Result<ChatTemplate> t = ChatTemplate::LoadFromDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Result<std::string> text = t->Render(R"([{"role": "user", "content": "x"}])"_json, {});
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "<s>x</s>");
}

TEST(ChatTemplate, ChatTemplateJinjaFileTakesPrecedence) {
  TempDir dir;
  dir.Write("tokenizer_config.json", R"({"eos_token": "E", "chat_template": "from config"})");
  dir.Write("chat_template.jinja", "from file {{ eos_token }}{{ bos_token is defined }}\n");
  Result<ChatTemplate> t = ChatTemplate::LoadFromDir(dir.path());
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  Result<std::string> text = t->Render(nlohmann::ordered_json::array(), {});
  ASSERT_TRUE(text.ok()) << text.status().ToString();
  EXPECT_EQ(*text, "from file EFalse");
}

TEST(ChatTemplate, ContextMatchesTransformers) {
  Result<ChatTemplate> t = ChatTemplate::Parse(
      "{{ tools is defined }}{{ tools is none }}{{ add_generation_prompt }}"
      "{{ documents is none }}{{ custom }}{% if tools %}{{ tools | tojson }}{% endif %}",
      "", "");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  ChatRenderOptions options;
  Result<std::string> text = t->Render(nlohmann::ordered_json::array(), options);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, "TrueTrueFalseTrue");
  options.add_generation_prompt = true;
  options.tools =
      nlohmann::ordered_json::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  options.extra_kwargs = {{"custom", 7}};
  text = t->Render(nlohmann::ordered_json::array(), options);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text, R"(TrueFalseTrueTrue7[{"type": "function", "function": {"name": "f"}}])");
}

TEST(ChatTemplate, Errors) {
  TempDir empty;
  EXPECT_EQ(ChatTemplate::LoadFromDir(empty.path()).status().code(), StatusCode::kNotFound);

  TempDir no_default;
  no_default.Write("tokenizer_config.json",
                   R"({"chat_template": [{"name": "tool_use", "template": "x"}]})");
  Result<ChatTemplate> t = ChatTemplate::LoadFromDir(no_default.path());
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("tool_use"), std::string::npos);

  TempDir bad;
  bad.Write("tokenizer_config.json", R"({"chat_template": "{% if x %}"})");
  EXPECT_FALSE(ChatTemplate::LoadFromDir(bad.path()).ok());

  Result<ChatTemplate> raising = ChatTemplate::Parse(
      "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be user') }}"
      "{% endif %}",
      "", "");
  ASSERT_TRUE(raising.ok());
  Result<std::string> text = raising->Render(R"([{"role": "assistant", "content": "x"}])"_json, {});
  ASSERT_FALSE(text.ok());
  EXPECT_EQ(text.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(text.status().message().find("first message must be user"), std::string::npos);
}

}  // namespace
}  // namespace corolla
