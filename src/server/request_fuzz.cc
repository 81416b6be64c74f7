// libFuzzer entry point for what a client sends to /v1/chat/completions and /v1/completions: the
// body parsed (ParseChatRequest / ParseCompletionRequest) and, for an accepted chat, rendered
// through the demo model's chat template and encoded with its tokenizer (run from the repository
// root: models/corolla-demo). Not built by default; scripts/fuzz.sh builds it with clang and
// -fsanitize=fuzzer,address,undefined. request_fuzz_test.cc is the seeded, structure-aware twin
// that CI runs.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "server/openai_protocol.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace corolla;
  static const ChatTemplate* chat_template = [] {
    Result<ChatTemplate> t = ChatTemplate::LoadFromDir("models/corolla-demo");
    if (!t.ok()) {
      std::fprintf(stderr, "request_fuzz: run from the repository root (%s)\n", t.status().ToString().c_str());
      std::abort();
    }
    return new ChatTemplate(std::move(t).value());
  }();
  static const Tokenizer* tokenizer = Tokenizer::LoadFromDir("models/corolla-demo").value().release();
  const std::string body(reinterpret_cast<const char*>(data), size);
  server::CompletionRequest completion;
  if (auto e = server::ParseCompletionRequest(body, &completion)) (void)e->ToJson();
  server::ChatRequest chat;
  if (auto e = server::ParseChatRequest(body, &chat)) {
    (void)e->ToJson();
    return 0;
  }
  Result<std::string> text = chat_template->Render(chat.messages, chat.RenderOptions());
  if (text.ok()) (void)tokenizer->Encode(*text, /*add_special_tokens=*/false);
  return 0;
}
