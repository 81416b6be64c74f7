#include "tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cstring>

#include "tokenizer/jinja/builtins_internal.h"

namespace corolla::jinja {
namespace {

using internal::AppendUtf8;

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }


int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Python's "unicode-escape" decoding of a string literal body; unknown escapes stay as written.
std::string DecodeEscapes(std::string_view body) {
  std::string out;
  out.reserve(body.size());
  for (size_t i = 0; i < body.size(); ++i) {
    char c = body[i];
    if (c != '\\' || i + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++i];
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;  // line continuation
      case 'x':
      case 'u':
      case 'U': {
        int digits = e == 'x' ? 2 : e == 'u' ? 4 : 8;
        uint32_t cp = 0;
        bool ok = true;
        for (int k = 1; ok && k <= digits; ++k) {
          if (i + k >= body.size() || HexValue(body[i + k]) < 0) {
            ok = false;
            break;
          }
          cp = cp * 16 + HexValue(body[i + k]);
        }
        if (ok && cp <= 0x10FFFF) {
          AppendUtf8(cp, out);
          i += digits;
        } else {
          out += '\\';
          out += e;
        }
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = e - '0';
          for (int k = 0; k < 2 && i + 1 < body.size() && body[i + 1] >= '0' && body[i + 1] <= '7';
               ++k) {
            cp = cp * 8 + (body[++i] - '0');
          }
          AppendUtf8(cp, out);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Jinja joins source.splitlines() with "\n": \r\n and \r become \n, and (without
    // keep_trailing_newline) one trailing newline is dropped.
    src_.reserve(source.size());
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') newlines_.push_back(i);
    }
  }

  Result<std::vector<Token>> Run() {
    bool line_starting = true;  // the text about to be read begins a line
    while (pos_ < src_.size()) {
      size_t tag = FindTagStart(pos_);
      std::string_view text(src_.data() + pos_,
                            (tag == std::string::npos ? src_.size() : tag) - pos_);
      size_t text_pos = pos_;
      if (tag == std::string::npos) {
        Emit(Token::Type::kText, std::string(text), text_pos);
        break;
      }
      char kind = src_[tag + 1];  // '{', '%' or '#'
      char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
      if (modifier == '-') {
        while (!text.empty() && IsSpace(text.back())) text.remove_suffix(1);
      } else if (modifier != '+' && kind != '{') {
        // lstrip_blocks: drop spaces between the line start and a block or comment tag.
        size_t line_pos = text.rfind('\n');
        line_pos = line_pos == std::string_view::npos ? 0 : line_pos + 1;
        if ((line_pos > 0 || line_starting) && line_pos < text.size() &&
            std::all_of(text.begin() + line_pos, text.end(), IsSpace)) {
          text = text.substr(0, line_pos);
        }
      }
      if (!text.empty()) Emit(Token::Type::kText, std::string(text), text_pos);
      pos_ = tag + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
      if (kind == '#') {
        RETURN_IF_ERROR(LexComment(tag));
      } else if (kind == '%' && IsRawBegin()) {
        RETURN_IF_ERROR(LexRaw(tag));
      } else {
        RETURN_IF_ERROR(LexTag(kind == '%', tag));
      }
      line_starting = pos_ > 0 && src_[pos_ - 1] == '\n';
    }
    Emit(Token::Type::kEof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  int LineAt(size_t offset) const {
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), offset) -
                                newlines_.begin());
  }

  Status Error(size_t offset, const std::string& message) const {
    return InvalidArgument("template syntax error at line " + std::to_string(LineAt(offset)) +
                           ": " + message);
  }

  void Emit(Token::Type type, std::string value, size_t offset) {
    tokens_.push_back(Token{type, std::move(value), LineAt(offset)});
  }

  size_t FindTagStart(size_t from) const {
    while (true) {
      size_t p = src_.find('{', from);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      from = p + 1;
    }
  }

  // After a block or comment end: `-` strips all following whitespace, `+` keeps it, and
  // otherwise trim_blocks removes one newline.
  void AfterBlockEnd(char modifier) {
    if (modifier == '-') {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) ++pos_;
    } else if (modifier != '+' && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
  }

  Status LexComment(size_t tag) {
    size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) return Error(tag, "comment opened here is never closed");
    char modifier =
        end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    pos_ = end + 2;
    AfterBlockEnd(modifier);
    return Status::Ok();
  }

  bool IsRawBegin() const {
    size_t p = pos_;
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < src_.size() && IsNameChar(src_[p])) return false;
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  Status LexRaw(size_t tag) {
    size_t p = src_.find("%}", pos_);
    bool strip_after = src_[p - 1] == '-';
    pos_ = p + 2;
    if (strip_after) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) ++pos_;
    }
    // Find {% endraw %} with optional modifiers and spaces.
    size_t search = pos_;
    while (true) {
      size_t open = src_.find("{%", search);
      if (open == std::string::npos) return Error(tag, "raw block opened here is never closed");
      size_t q = open + 2;
      char modifier = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q++] : 0;
      while (q < src_.size() && IsSpace(src_[q])) ++q;
      if (src_.compare(q, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      q += 6;
      while (q < src_.size() && IsSpace(src_[q])) ++q;
      char end_modifier = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_modifier = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) {
        search = open + 2;
        continue;
      }
      std::string_view body(src_.data() + pos_, open - pos_);
      if (modifier == '-') {
        while (!body.empty() && IsSpace(body.back())) body.remove_suffix(1);
      }
      if (!body.empty()) Emit(Token::Type::kText, std::string(body), pos_);
      pos_ = q + 2;
      AfterBlockEnd(end_modifier);
      return Status::Ok();
    }
  }

  Status LexTag(bool block, size_t tag) {
    Emit(block ? Token::Type::kBlockBegin : Token::Type::kVarBegin, "", tag);
    std::vector<char> brackets;
    while (true) {
      while (pos_ < src_.size() && IsSpace(src_[pos_])) ++pos_;
      if (pos_ >= src_.size()) {
        return Error(tag, std::string(block ? "block tag" : "variable tag") +
                              " opened here is never closed");
      }
      if (brackets.empty()) {
        std::string_view rest(src_.data() + pos_, src_.size() - pos_);
        const char* close = block ? "%}" : "}}";
        char modifier = 0;
        size_t len = 0;
        if (rest.substr(0, 2) == close) {
          len = 2;
        } else if ((rest[0] == '-' || rest[0] == '+') && rest.substr(1, 2) == close) {
          modifier = rest[0];
          len = 3;
        }
        if (len > 0) {
          Emit(block ? Token::Type::kBlockEnd : Token::Type::kVarEnd, "", pos_);
          pos_ += len;
          if (block) {
            AfterBlockEnd(modifier);
          } else if (modifier == '-') {
            while (pos_ < src_.size() && IsSpace(src_[pos_])) ++pos_;
          }
          return Status::Ok();
        }
      }
      RETURN_IF_ERROR(LexExpressionToken(brackets));
    }
  }

  Status LexExpressionToken(std::vector<char>& brackets) {
    size_t start = pos_;
    char c = src_[pos_];
    if (c == '\'' || c == '"') {
      size_t p = pos_ + 1;
      while (p < src_.size() && src_[p] != c) p += src_[p] == '\\' ? 2 : 1;
      if (p >= src_.size()) return Error(start, "unterminated string literal");
      Emit(Token::Type::kString,
           DecodeEscapes(std::string_view(src_).substr(pos_ + 1, p - pos_ - 1)), start);
      pos_ = p + 1;
      return Status::Ok();
    }
    if (IsDigit(c)) {
      bool after_dot = !tokens_.empty() && tokens_.back().type == Token::Type::kOp &&
                       tokens_.back().value == ".";
      std::string digits;
      auto read_digits = [&]() {
        while (pos_ < src_.size() &&
               (IsDigit(src_[pos_]) ||
                (src_[pos_] == '_' && pos_ + 1 < src_.size() && IsDigit(src_[pos_ + 1])))) {
          if (src_[pos_] != '_') digits += src_[pos_];
          ++pos_;
        }
      };
      read_digits();
      bool is_float = false;
      if (!after_dot && pos_ + 1 < src_.size() && src_[pos_] == '.' && IsDigit(src_[pos_ + 1])) {
        is_float = true;
        digits += src_[pos_++];
        read_digits();
      }
      if (!after_dot && pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
        size_t p = pos_ + 1;
        if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
        if (p < src_.size() && IsDigit(src_[p])) {
          is_float = true;
          digits += 'e';
          digits.append(src_, pos_ + 1, p - pos_ - 1);
          pos_ = p;
          read_digits();
        }
      }
      Emit(is_float ? Token::Type::kFloat : Token::Type::kInt, std::move(digits), start);
      return Status::Ok();
    }
    if (IsNameStart(c)) {
      while (pos_ < src_.size() && IsNameChar(src_[pos_])) ++pos_;
      Emit(Token::Type::kName, src_.substr(start, pos_ - start), start);
      return Status::Ok();
    }
    static const char* kTwoCharOps[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwoCharOps) {
      if (src_.compare(pos_, 2, op) == 0) {
        Emit(Token::Type::kOp, op, start);
        pos_ += 2;
        return Status::Ok();
      }
    }
    if (std::strchr("+-/*%~[](){}><=.:|,;", c) == nullptr || c == '\0') {
      return Error(start, std::string("unexpected character '") + c + "'");
    }
    if (c == '(' || c == '[' || c == '{') {
      if (brackets.size() >= 256) return Error(start, "brackets nested too deeply");
      brackets.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets.empty() || brackets.back() != c) {
        return Error(start, std::string("unexpected '") + c + "'");
      }
      brackets.pop_back();
    }
    Emit(Token::Type::kOp, std::string(1, c), start);
    ++pos_;
    return Status::Ok();
  }

  std::string src_;
  std::vector<size_t> newlines_;
  size_t pos_ = 0;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> Tokenize(std::string_view source) { return Lexer(source).Run(); }

}  // namespace corolla::jinja
