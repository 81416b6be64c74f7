// A compiled pre-tokenizer regex (PCRE2 with JIT, UTF and Unicode properties) with the match
// iteration of the Oniguruma engine that Hugging Face tokenizers uses. Patterns are written for
// Oniguruma; TranslateOnigPattern rewrites the escapes whose meaning differs in PCRE2.
// A Regex is immutable after Compile and FindAll is thread-safe (match state is per thread).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace corolla {

class Regex {
 public:
  // `literal`: match `pattern` as plain text rather than as a regex.
  static Result<std::unique_ptr<Regex>> Compile(std::string_view pattern, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  struct Match {
    uint32_t begin, end;  // byte offsets into the subject
  };
  // Appends every match of the pattern in `subject` (valid UTF-8), left to right, as Oniguruma's
  // find-iterator yields them: after an empty match the search resumes one character later.
  Status FindAll(std::string_view subject, std::vector<Match>* matches) const;

  const std::string& pattern() const { return pattern_; }

 private:
  Regex() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8
};

// Rewrites the escapes whose Oniguruma meaning differs from PCRE2's: \s and \S (Unicode
// White_Space), \w and \W (letters, marks, decimal digits, connector punctuation), \h and \H
// (hexadecimal digits in Oniguruma, horizontal space in PCRE2).
std::string TranslateOnigPattern(std::string_view pattern);

}  // namespace corolla
