// libFuzzer entry point for the Jinja interpreter: parses the input as a template and renders it
// with a small chat context under tight limits. Not built by default; build with clang and
// -fsanitize=fuzzer,address, linking corolla_jinja.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "tokenizer/jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using corolla::jinja::RenderLimits;
  using corolla::jinja::Template;
  static const nlohmann::ordered_json* context =
      new nlohmann::ordered_json(nlohmann::ordered_json::parse(R"({
        "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "<think>r</think>ok",
                      "tool_calls": [{"function": {"name": "f", "arguments": {"a": 1}}}]},
                     {"role": "tool", "content": "out"}],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})"));
  auto t = Template::Parse(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!t.ok()) return 0;
  RenderLimits limits;
  limits.max_steps = 100'000;
  limits.max_output_bytes = 1 << 20;
  (void)(*t)->Render(*context, limits);
  return 0;
}
