// libFuzzer entry point for SafetensorsFile::ParseHeader; not part of the default build.
// Build and run (from the repository root):
//   clang++ -std=c++20 -O1 -g -fsanitize=fuzzer,address,undefined -Isrc \
//     src/model/safetensors_fuzz.cc src/model/safetensors.cc src/tensor/tensor.cc \
//     src/tensor/dtype.cc src/base/status.cc src/base/check.cc -o /tmp/safetensors_fuzz
//   /tmp/safetensors_fuzz -max_total_time=30 -max_len=65536 [corpus dir, e.g. with
//     tests/data/golden/qwen3-moe.safetensors copied in]
// Any input may be rejected; an accepted one must describe tensors that tile its data section.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::map<std::string, std::string> metadata;
  auto entries = corolla::SafetensorsFile::ParseHeader(data, size, &metadata);
  if (!entries.ok()) return 0;
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  const uint64_t data_size = size - 8 - header_len;
  uint64_t covered = 0;
  for (const corolla::SafetensorsEntry& e : *entries) {
    const bool inside = e.offset >= 0 && e.nbytes >= 0 &&
                        static_cast<uint64_t>(e.offset + e.nbytes) <= data_size &&
                        e.shape.numel() * corolla::DTypeSize(e.dtype) == e.nbytes;
    if (!inside) {
      std::fprintf(stderr, "accepted tensor %s outside the data section\n", e.name.c_str());
      std::abort();
    }
    covered += static_cast<uint64_t>(e.nbytes);
  }
  if (covered != data_size) {
    std::fprintf(stderr, "accepted tensors cover %llu of %llu data bytes\n",
                 static_cast<unsigned long long>(covered),
                 static_cast<unsigned long long>(data_size));
    std::abort();
  }
  return 0;
}
