// Normalizers of tokenizer.json ("normalizer"): Unicode normal forms through utf8proc, and
// Sequence of them. A Normalizer is immutable after FromJson; Normalize is thread-safe.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace corolla {

class Normalizer {
 public:
  // `config`: the "normalizer" object (null means none). Unknown types are Unsupported.
  static Result<std::unique_ptr<Normalizer>> FromJson(const nlohmann::json& config);

  bool empty() const { return forms_.empty(); }
  // Writes the normalised `text` (valid UTF-8) to *out; returns false (and leaves *out alone)
  // when normalisation would not change the text.
  bool Normalize(std::string_view text, std::string* out) const;

  enum class Form { kNFC, kNFD, kNFKC, kNFKD };

 private:
  std::vector<Form> forms_;  // applied in order
};

}  // namespace corolla
