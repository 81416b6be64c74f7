// Bounded-time fuzzing of the interpreter: seeded random mutations (byte flips, deletions,
// duplications, inserted Jinja fragments) of the real chat templates must parse and render
// without crashing or hanging; errors are fine. template_fuzz.cc is the libFuzzer twin.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tokenizer/jinja/template.h"

namespace corolla::jinja {
namespace {

std::vector<std::string> SeedTemplates() {
  std::vector<std::string> seeds;
  for (const char* path : {".cache/tokenizers/qwen3/tokenizer_config.json",
                           ".cache/tokenizers/deepseek_v3/tokenizer_config.json",
                           "models/corolla-demo/tokenizer_config.json"}) {
    std::ifstream in(path);
    if (!in) continue;
    std::stringstream ss;
    ss << in.rdbuf();
    auto config = nlohmann::json::parse(ss.str(), nullptr, false);
    if (config.is_object() && config["chat_template"].is_string()) {
      seeds.push_back(config["chat_template"].get<std::string>());
    }
  }
  seeds.push_back(
      "{% macro m(a, b=1) %}{{ a ~ b }}{% endmacro %}{% set ns = namespace(x=0) %}"
      "{% for k, v in d.items() if v %}{{ loop.index }}{{ m(k) }}{% set ns.x = ns.x + v %}"
      "{% else %}none{% endfor %}{{ ns.x | tojson(indent=2) }}{{ s[::-1] | upper }}"
      "{% filter trim %} {{ [1, 2] | map('string') | join(',') }} {% endfilter %}");
  return seeds;
}

const char* kFragments[] = {
    "{%",    "%}",       "{{",   "}}",       "{#",   "#}",     "-",      "+",          "(",
    ")",     "[",        "]",    "{",        "}",    "'",      "\"",     "\\",         "|",
    ".",     ",",        ":",    "~",        "*",    "**",     " if ",   " else ",     " endif ",
    " for ", " endfor ", " in ", " not ",    " is ", " loop ", " set ",  " macro ",    " raw ",
    "\n",    "0",        "-1",   "messages", "none", "range(", "tojson", "namespace(", "[::-1]"};

std::string Mutate(std::string s, std::mt19937& rng) {
  int num_mutations = 1 + rng() % 4;
  for (int m = 0; m < num_mutations; ++m) {
    size_t pos = s.empty() ? 0 : rng() % (s.size() + 1);
    size_t len = 1 + rng() % 16;
    switch (rng() % 5) {
      case 0:
        if (!s.empty() && pos < s.size()) s[pos] = static_cast<char>(rng());
        break;
      case 1:
        if (pos < s.size()) s.erase(pos, len);
        break;
      case 2:
        if (pos < s.size()) s.insert(pos, s.substr(pos, len));
        break;
      case 3:
        s.insert(pos, kFragments[rng() % (sizeof(kFragments) / sizeof(kFragments[0]))]);
        break;
      default: {  // move a chunk of the template elsewhere
        if (s.size() < 2) break;
        size_t from = rng() % s.size();
        std::string chunk = s.substr(from, len * 4);
        s.insert(pos, chunk);
        break;
      }
    }
  }
  return s;
}

TEST(JinjaFuzz, MutatedRealTemplatesNeverCrashOrHang) {
  ASSERT_TRUE(std::filesystem::exists(".cache/tokenizers/qwen3/tokenizer_config.json"))
      << "real tokenizer configs missing under .cache/tokenizers: run scripts/fetch_tokenizers.sh";
  std::vector<std::string> seeds = SeedTemplates();
  ASSERT_GE(seeds.size(), 3u);
  auto context = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "sys"},
      {"role": "user", "content": "hi <tool_response>x</tool_response>"},
      {"role": "assistant", "content": "<think>\nr\n</think>\n\nok", "reasoning_content": null,
       "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]},
      {"role": "tool", "content": "out"},
      {"role": "assistant", "content": null,
       "tool_calls": [{"type": "function", "function": {"name": "g", "arguments": "{}"}}]}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>",
    "d": {"a": 1, "b": 0}, "s": "héllo"})");
  RenderLimits limits;
  limits.max_steps = 200'000;
  limits.max_output_bytes = 1 << 20;
  std::mt19937 rng(20240601);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  int64_t iterations = 0, parsed = 0, rendered = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    std::string source = seeds[rng() % seeds.size()];
    // Mutations compound: sometimes mutate an already mutated template again.
    int rounds = 1 + rng() % 3;
    for (int r = 0; r < rounds; ++r) source = Mutate(std::move(source), rng);
    ++iterations;
    auto t = Template::Parse(source);
    if (!t.ok()) continue;
    ++parsed;
    auto out = (*t)->Render(context, limits);
    if (out.ok()) ++rendered;
  }
  EXPECT_GT(iterations, 100);
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rendered, 0);
  std::printf("fuzz: %lld mutants, %lld parsed, %lld rendered\n",
              static_cast<long long>(iterations), static_cast<long long>(parsed),
              static_cast<long long>(rendered));
}

}  // namespace
}  // namespace corolla::jinja
