// Bounded-time, structure-aware fuzzing of what a client controls on /v1/chat/completions: seeded
// random edits of the JSON tree of real requests (values swapped for other types, keys added or
// removed, special tokens and Jinja syntax in strings, nesting past the limit), each body parsed
// (ParseChatRequest) and, when accepted, rendered through the chat templates the server loads
// (the demo model's, and Qwen3's and DeepSeek-V3's where scripts/fetch_tokenizers.sh has fetched
// them) and encoded. Every outcome must be an answer: a 4xx, a render error or token ids; never a
// crash, a hang or an exception. request_fuzz.cc is the libFuzzer twin.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "server/openai_protocol.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace corolla::server {
namespace {

using json = nlohmann::json;

const char* const kSeeds[] = {
    R"({"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}],"max_tokens":8})",
    R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
        {"role":"assistant","content":"<think>r</think>ok","reasoning_content":"why"},
        {"role":"user","content":"again"}],"chat_template_kwargs":{"enable_thinking":false}})",
    R"({"messages":[{"role":"user","content":"weather?"},
        {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
          "function":{"name":"get","arguments":"{\"city\": \"Oslo\"}"}}]},
        {"role":"tool","tool_call_id":"c1","content":"{\"t\": 3}"}],
        "tools":[{"type":"function","function":{"name":"get","description":"d",
          "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]})",
    R"({"messages":[{"role":"developer","content":"x"},{"role":"assistant","content":"pre"}],
        "add_generation_prompt":false,"n":2,"stop":["\n"]})"};

const char* const kKeys[] = {"role",         "content",     "tool_calls", "function",          "arguments",
                             "name",         "tool_call_id", "type",      "reasoning_content", "parameters",
                             "messages",     "tools",        "text",      "enable_thinking",   "add_generation_prompt",
                             "chat_template_kwargs"};
const char* const kStrings[] = {"",          "user",        "assistant", "tool",       "system",   "<think>",
                                "</think>",  "<tool_call>", "{{ 1 }}",   "{% if %}",   "\xe6\x97\xa5", "\xff\xfe",
                                "\\u0000",   "function",    "text",      "image_url",  "a\nb"};

// A random JSON value; depth bounds the nesting it builds itself.
json RandomValue(std::mt19937& rng, int depth) {
  switch (rng() % (depth > 3 ? 6 : 8)) {
    case 0: return nullptr;
    case 1: return rng() % 2 == 0;
    case 2: return static_cast<int64_t>(rng() % 2000) - 1000;
    case 3: return (rng() % 2000) / 7.0 - 100;
    case 4:
    case 5: return kStrings[rng() % std::size(kStrings)];
    case 6: {
      json a = json::array();
      for (int i = rng() % 4; i > 0; --i) a.push_back(RandomValue(rng, depth + 1));
      return a;
    }
    default: {
      json o = json::object();
      for (int i = rng() % 4; i > 0; --i) o[kKeys[rng() % std::size(kKeys)]] = RandomValue(rng, depth + 1);
      return o;
    }
  }
}

// Every value of the tree, the root first.
void Collect(json& v, std::vector<json*>* out) {
  out->push_back(&v);
  if (v.is_structured())
    for (auto& child : v) Collect(child, out);
}

// One to four edits at random nodes of the request.
void Mutate(json& request, std::mt19937& rng) {
  for (int edits = 1 + rng() % 4; edits > 0; --edits) {
    std::vector<json*> nodes;
    Collect(request, &nodes);
    json& node = *nodes[rng() % nodes.size()];
    switch (rng() % 5) {
      case 0:  // another value in its place
        if (&node != &request) node = RandomValue(rng, 0);
        break;
      case 1:  // a key added or replaced
        if (node.is_object()) node[kKeys[rng() % std::size(kKeys)]] = RandomValue(rng, 0);
        break;
      case 2:  // an entry removed
        if (node.is_object() && !node.empty()) {
          auto it = node.begin();
          std::advance(it, rng() % node.size());
          node.erase(it);
        } else if (node.is_array() && !node.empty()) {
          node.erase(node.begin() + rng() % node.size());
        }
        break;
      case 3:  // an entry duplicated (long conversations, repeated tool calls)
        if (node.is_array() && !node.empty()) node.push_back(node[rng() % node.size()]);
        break;
      default: {  // wrapped in arrays, sometimes past kMaxJsonDepth
        if (&node == &request) break;
        const int levels = rng() % 8 == 0 ? kMaxJsonDepth + static_cast<int>(rng() % 4) : 1 + rng() % 3;
        for (int i = 0; i < levels; ++i) node = json::array({node});
      }
    }
  }
}

TEST(RequestParser, NestingIsBoundedAndCountedOutsideStrings) {
  EXPECT_EQ(JsonNestingDepth("1"), 0);
  EXPECT_EQ(JsonNestingDepth(R"({"a": [1, {"b": []}]})"), 4);
  EXPECT_EQ(JsonNestingDepth(R"({"a": "[[[{{{"})"), 1);
  EXPECT_EQ(JsonNestingDepth(R"(["\"[[", "\\", ["x"]])"), 2);  // escaped quotes and backslashes
  // The body, the messages list and the message are three levels; x's arrays take the rest.
  auto body = [](int x_depth) {
    return R"({"messages": [{"role": "user", "content": "hi", "x": )" + std::string(x_depth, '[') +
           std::string(x_depth, ']') + "}]}";
  };
  ChatRequest chat;
  EXPECT_FALSE(ParseChatRequest(body(kMaxJsonDepth - 3), &chat).has_value());
  std::optional<ApiError> e = ParseChatRequest(body(kMaxJsonDepth - 2), &chat);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 400);
  EXPECT_NE(e->message.find("levels deep"), std::string::npos) << e->message;
}

TEST(RequestFuzz, ChatBodiesAlwaysGetAnAnswer) {
  std::vector<ChatTemplate> templates;
  for (const char* dir : {"models/corolla-demo", ".cache/tokenizers/qwen3", ".cache/tokenizers/deepseek_v3"}) {
    Result<ChatTemplate> t = ChatTemplate::LoadFromDir(dir);
    if (t.ok()) templates.push_back(std::move(t).value());
  }
  ASSERT_FALSE(templates.empty()) << "the demo model's chat template (models/corolla-demo) did not load";
  Result<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::LoadFromDir("models/corolla-demo");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status().ToString();

  // COROLLA_FUZZ_SECONDS=N: N seconds from a fresh seed (printed) instead of CI's fixed run.
  const char* seconds_env = std::getenv("COROLLA_FUZZ_SECONDS");
  const int seconds = seconds_env ? std::atoi(seconds_env) : 4;
  const uint32_t seed = seconds_env ? std::random_device{}() : 20261201u;
  std::mt19937 rng(seed);
  int iterations = 0, accepted = 0, rendered = 0, too_deep = 0;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(seconds) &&
         (seconds_env || iterations < 20000)) {
    json request = json::parse(kSeeds[rng() % std::size(kSeeds)]);
    Mutate(request, rng);
    const std::string body = request.dump(-1, ' ', false, json::error_handler_t::replace);
    ++iterations;
    ChatRequest chat;
    if (auto e = ParseChatRequest(body, &chat)) {
      EXPECT_GE(e->status, 400);
      EXPECT_LT(e->status, 500);
      EXPECT_FALSE(e->message.empty()) << body;
      EXPECT_TRUE(json::parse(e->ToJson(), nullptr, false).is_object()) << body;
      if (JsonNestingDepth(body) > kMaxJsonDepth) ++too_deep;
      continue;
    }
    ++accepted;
    const ChatTemplate& t = templates[rng() % templates.size()];
    Result<std::string> text = t.Render(chat.messages, chat.RenderOptions());
    if (!text.ok()) {
      EXPECT_FALSE(text.status().message().empty()) << body;
      continue;
    }
    ++rendered;
    Result<std::vector<int32_t>> ids = (*tokenizer)->Encode(*text, /*add_special_tokens=*/false);
    EXPECT_TRUE(ids.ok()) << ids.status().ToString() << " for " << body;
  }
  // The edits must reach every outcome, or the test proves little.
  EXPECT_GT(iterations, 500);
  EXPECT_GT(accepted, iterations / 10);
  EXPECT_GT(rendered, accepted / 10);
  EXPECT_GT(too_deep, 0);
  std::printf("seed %u, %d bodies: %d accepted, %d rendered, %d refused as too deep\n", seed, iterations, accepted,
              rendered, too_deep);
}

}  // namespace
}  // namespace corolla::server
