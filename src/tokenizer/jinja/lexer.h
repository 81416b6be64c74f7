// Lexer: splits Jinja template source into text and tag tokens, applying the whitespace rules
// transformers renders chat templates with (trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False, plus `-`/`+` modifiers on tags). Stateless functions; the
// returned tokens own their text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace corolla::jinja {

struct Token {
  enum class Type : uint8_t {
    kText,        // literal template text (already whitespace-controlled)
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // value: the decoded string
    kInt,     // value: the digits (underscores removed)
    kFloat,   // value: the literal (underscores removed)
    kOp,      // value: the operator ("+", "//", "(", ...)
    kEof,
  };
  Type type;
  std::string value;
  int line;
};

// Tokenizes `source`. Syntax errors (unterminated tag, comment or string, unbalanced brackets,
// stray characters) name their line.
Result<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace corolla::jinja
