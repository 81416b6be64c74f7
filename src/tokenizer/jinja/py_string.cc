// Python str semantics on UTF-8 for the built-in library: whitespace, stripping, simple case
// mapping, title-casing, replace/split, HTML escaping, and int()/float() parsing of strings.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "tokenizer/jinja/builtins_internal.h"

namespace corolla::jinja::internal {
namespace {

// Simple case mapping for ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic; other code
// points map to themselves (Python maps more; chat templates rarely case-convert other text).
uint32_t ToUpperCp(uint32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c & ~1u;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 0) ? c - 1 : c;
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  return c;
}

uint32_t ToLowerCp(uint32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c == 0x178) return 0xFF;
  if ((c >= 0x100 && c <= 0x137) || (c >= 0x14A && c <= 0x177)) return c | 1u;
  if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 1) ? c + 1 : c;
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  return c;
}

std::string MapCase(std::string_view s, uint32_t (*fn)(uint32_t)) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    uint32_t cp = DecodeUtf8(s, &i);
    uint32_t mapped = fn(cp);
    if (mapped == cp) {
      out.append(s.substr(start, i - start));
    } else {
      AppendUtf8(mapped, out);
    }
  }
  return out;
}

}  // namespace

bool IsPyWhitespace(uint32_t cp) {
  return cp == ' ' || (cp >= '\t' && cp <= '\r') || (cp >= 0x1C && cp <= 0x1F) || cp == 0x85 ||
         cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Byte offsets of each code point of s, plus s.size().
std::vector<size_t> CodepointOffsets(std::string_view s) {
  std::vector<size_t> offsets;
  offsets.reserve(s.size() + 1);
  size_t i = 0;
  while (i < s.size()) {
    offsets.push_back(i);
    DecodeUtf8(s, &i);
  }
  offsets.push_back(s.size());
  return offsets;
}

std::vector<uint32_t> Codepoints(std::string_view s) {
  std::vector<uint32_t> cps;
  size_t i = 0;
  while (i < s.size()) cps.push_back(DecodeUtf8(s, &i));
  return cps;
}

std::string Strip(std::string_view s, const Value& chars, StripSide side) {
  std::vector<uint32_t> set;
  bool whitespace = !chars.is_string();
  if (!whitespace) set = Codepoints(chars.as_string());
  auto strip_cp = [&](uint32_t cp) {
    return whitespace ? IsPyWhitespace(cp) : std::find(set.begin(), set.end(), cp) != set.end();
  };
  std::vector<size_t> off = CodepointOffsets(s);
  size_t begin = 0, end = off.size() - 1;  // code point indices
  auto cp_at = [&](size_t idx) {
    size_t p = off[idx];
    return DecodeUtf8(s, &p);
  };
  if (static_cast<int>(side) & 1) {
    while (begin < end && strip_cp(cp_at(begin))) ++begin;
  }
  if (static_cast<int>(side) & 2) {
    while (end > begin && strip_cp(cp_at(end - 1))) --end;
  }
  return std::string(s.substr(off[begin], off[end] - off[begin]));
}

void AppendUtf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::string Lower(std::string_view s) { return MapCase(s, ToLowerCp); }
std::string Upper(std::string_view s) { return MapCase(s, ToUpperCp); }

std::string Capitalize(std::string_view s) {
  if (s.empty()) return "";
  size_t i = 0;
  uint32_t first = DecodeUtf8(s, &i);
  std::string out;
  AppendUtf8(ToUpperCp(first), out);
  return out + Lower(s.substr(i));
}

bool IsAsciiAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// Python str.title(): a cased letter after an uncased character starts a word.
std::string PyTitle(std::string_view s) {
  std::string out(s);
  bool prev_cased = false;
  for (char& c : out) {
    if (IsAsciiAlpha(c)) {
      c = prev_cased ? std::tolower(c) : std::toupper(c);
      prev_cased = true;
    } else {
      prev_cased = static_cast<unsigned char>(c) >= 0x80 && prev_cased;
    }
  }
  return out;
}

// jinja2's title filter: words start after spaces and -({[<.
std::string JinjaTitle(std::string_view s) {
  std::string out(s);
  bool word_start = true;
  for (char& c : out) {
    bool sep = c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
               c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
    if (sep) {
      word_start = true;
      continue;
    }
    if (static_cast<unsigned char>(c) < 0x80) c = word_start ? std::toupper(c) : std::tolower(c);
    word_start = false;
  }
  return out;
}

std::optional<std::string> Replace(std::string_view s, std::string_view old, std::string_view with, int64_t count,
                                   size_t max_bytes) {
  std::string out;
  if (old.empty()) {  // Python inserts `with` around every code point
    std::vector<size_t> off = CodepointOffsets(s);
    int64_t n = 0;
    for (size_t i = 0; i + 1 < off.size(); ++i) {
      if (count < 0 || n < count) {
        out += with;
        ++n;
      }
      out.append(s.substr(off[i], off[i + 1] - off[i]));
      if (out.size() > max_bytes) return std::nullopt;
    }
    if (count < 0 || n < count) out += with;
    if (out.size() > max_bytes) return std::nullopt;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out += with;
    if (out.size() > max_bytes) return std::nullopt;
    pos = hit + old.size();
    ++n;
  }
  out.append(s.substr(pos));
  if (out.size() > max_bytes) return std::nullopt;
  return out;
}

Result<List> Split(std::string_view s, const Value& sep, int64_t maxsplit, bool from_right) {
  List parts;
  if (sep.is_string()) {
    std::string_view d = sep.as_string();
    if (d.empty()) return InvalidArgument("empty separator");
    std::vector<std::string> pieces;
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(pieces.size()) < maxsplit) {
        size_t hit = s.find(d, pos);
        if (hit == std::string_view::npos) break;
        pieces.emplace_back(s.substr(pos, hit - pos));
        pos = hit + d.size();
      }
      pieces.emplace_back(s.substr(pos));
    } else {
      size_t end = s.size();
      std::vector<std::string> rev;
      while (maxsplit < 0 || static_cast<int64_t>(rev.size()) < maxsplit) {
        if (end < d.size()) break;
        size_t hit = s.rfind(d, end - d.size());
        if (hit == std::string_view::npos) break;
        rev.emplace_back(s.substr(hit + d.size(), end - hit - d.size()));
        end = hit;
      }
      rev.emplace_back(s.substr(0, end));
      pieces.assign(rev.rbegin(), rev.rend());
    }
    for (auto& p : pieces) parts.push_back(Value::String(std::move(p)));
    return parts;
  }
  if (!sep.is_none() && !sep.is_undefined()) {
    return InvalidArgument("must be str or None, not " + sep.TypeName());
  }
  // Whitespace splitting: runs of whitespace separate, no empty strings.
  std::vector<size_t> off = CodepointOffsets(s);
  std::vector<bool> ws(off.size() - 1);
  for (size_t i = 0; i + 1 < off.size(); ++i) {
    size_t p = off[i];
    ws[i] = IsPyWhitespace(DecodeUtf8(s, &p));
  }
  const size_t n = ws.size();
  std::vector<std::string> pieces;
  if (!from_right) {
    size_t i = 0;
    while (true) {
      while (i < n && ws[i]) ++i;
      if (i >= n) break;
      if (maxsplit >= 0 && static_cast<int64_t>(pieces.size()) >= maxsplit) {
        pieces.emplace_back(s.substr(off[i]));  // the rest keeps its trailing whitespace
        break;
      }
      size_t j = i;
      while (j < n && !ws[j]) ++j;
      pieces.emplace_back(s.substr(off[i], off[j] - off[i]));
      i = j;
    }
  } else {
    size_t i = n;
    std::vector<std::string> rev;
    while (true) {
      while (i > 0 && ws[i - 1]) --i;
      if (i == 0) break;
      if (maxsplit >= 0 && static_cast<int64_t>(rev.size()) >= maxsplit) {
        rev.emplace_back(s.substr(0, off[i]));  // the rest keeps its leading whitespace
        break;
      }
      size_t j = i;
      while (j > 0 && !ws[j - 1]) --j;
      rev.emplace_back(s.substr(off[j], off[i] - off[j]));
      i = j;
    }
    pieces.assign(rev.rbegin(), rev.rend());
  }
  for (auto& p : pieces) parts.push_back(Value::String(std::move(p)));
  return parts;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// Python int(str) (base 10): surrounding whitespace, sign and underscores between digits.
std::optional<int64_t> ParseInt(std::string_view s, int base) {
  std::string t = Strip(s, Value::None(), StripSide::kBoth);
  if (t.empty()) return std::nullopt;
  std::string digits;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '_' && i > 0 && i + 1 < t.size() && std::isalnum(t[i - 1]) &&
        std::isalnum(t[i + 1])) {
      continue;
    }
    digits += t[i];
  }
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(digits.c_str(), &end, base);
  if (errno != 0 || end != digits.c_str() + digits.size() || digits.empty() ||
      std::isspace(static_cast<unsigned char>(digits[0]))) {
    return std::nullopt;
  }
  return v;
}

std::optional<double> ParseFloat(std::string_view s) {
  std::string t = Strip(s, Value::None(), StripSide::kBoth);
  if (t.empty()) return std::nullopt;
  std::string lower = Lower(t);
  char* end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  if (lower.find("0x") != std::string::npos) return std::nullopt;  // strtod accepts hex
  return v;
}

}  // namespace corolla::jinja::internal
