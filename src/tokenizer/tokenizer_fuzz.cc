// libFuzzer entry point for the tokenizer.json loader and, when the input loads, Encode and
// Decode on fixed text. Not built by default (the *_fuzz.cc files are excluded from the library
// globs); build with clang -fsanitize=fuzzer,address against corolla_tokenizer.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view json(reinterpret_cast<const char*>(data), size);
  auto tok = corolla::Tokenizer::LoadFromJson(json);
  if (!tok.ok()) return 0;
  auto ids = (*tok)->Encode("Hello, world! 123 <s> 日本語 e\u0301 \r\n\t  x");
  if (ids.ok()) {
    (void)(*tok)->Decode(*ids);
    corolla::StreamingDetokenizer stream(**tok, true);
    for (int32_t id : *ids) (void)stream.Push(id);
    (void)stream.Flush();
  }
  std::vector<int32_t> edges = {0, (*tok)->vocab_size() - 1, (*tok)->vocab_size(), -1};
  (void)(*tok)->Decode(edges);
  return 0;
}
