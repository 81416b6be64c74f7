#include "tokenizer/jinja/builtins.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <unordered_map>

#include "tokenizer/jinja/renderer.h"

namespace corolla::jinja {
namespace {

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

// --- string helpers (Python str semantics on UTF-8) ---

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

enum class StripSide { kLeft = 1, kRight = 2, kBoth = 3 };

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

std::string Replace(std::string_view s, std::string_view old, std::string_view with,
                    int64_t count) {
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
    }
    if (count < 0 || n < count) out += with;
    return out;
  }
  size_t pos = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    size_t hit = s.find(old, pos);
    if (hit == std::string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out += with;
    pos = hit + old.size();
    ++n;
  }
  out.append(s.substr(pos));
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

// --- argument helpers ---

Result<int64_t> ToInt(const Value& v, const char* what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  return InvalidArgument(std::string(what) + " must be an integer, not " + v.TypeName());
}

Result<std::string> ToStr(const Value& v, const char* what) {
  if (v.is_string()) return v.as_string();
  return InvalidArgument(std::string(what) + " must be a string, not " + v.TypeName());
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

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then index 0.
Result<Value> GetAttrPath(Renderer& r, const Value& item, const Value& attribute) {
  if (attribute.is_int()) return r.GetItem(item, attribute);
  ASSIGN_OR_RETURN(std::string path, ToStr(attribute, "attribute"));
  Value cur = item;
  size_t pos = 0;
  while (true) {
    size_t dot = path.find('.', pos);
    std::string part = path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    Value key = Value::String(part);
    if (!part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
      key = Value::Int(std::stoll(part));
    }
    ASSIGN_OR_RETURN(cur, r.GetItem(cur, key));
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

const Value* Kwarg(const CallArgs& args, std::string_view name) {
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

// Comparison key for sort/min/max/unique/dictsort: lower-cased strings unless case_sensitive.
Value SortKey(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::String(Lower(v.as_string()));
  return v;
}

Result<List> SortValues(List items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  Status error;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    Result<bool> less = reverse ? keys[b].Less(keys[a]) : keys[a].Less(keys[b]);
    if (!less.ok()) {
      if (error.ok()) error = less.status();
      return false;
    }
    return *less;
  });
  RETURN_IF_ERROR(error);
  List sorted;
  sorted.reserve(items.size());
  for (size_t i : order) sorted.push_back(std::move(items[i]));
  return sorted;
}

// --- filters ---

Result<Value> FilterAbs(Renderer&, const Value& v, const CallArgs&) {
  if (v.is_float()) return Value::Float(std::fabs(v.as_float()));
  if (v.is_int() || v.is_bool()) {
    if (v.as_int() == INT64_MIN) return OutOfRange("abs overflow");
    return Value::Int(std::llabs(v.as_int()));
  }
  return InvalidArgument("bad operand type for abs(): '" + v.TypeName() + "'");
}

Result<Value> FilterCapitalize(Renderer&, const Value& v, const CallArgs&) {
  return Value::String(Capitalize(v.Str()));
}

Result<Value> FilterDefault(Renderer&, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("default", {"default_value", "boolean"}));
  Value fallback = a[0].is_undefined() ? Value::String("") : a[0];
  if (v.is_undefined() || (a[1].Truthy() && !v.Truthy())) return fallback;
  return v;
}

Result<Value> FilterDictsort(Renderer&, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("dictsort", {"case_sensitive", "by", "reverse"}));
  if (!v.is_dict()) return InvalidArgument("dictsort expects a dict, got " + v.TypeName());
  bool by_value = a[1].is_string() && a[1].as_string() == "value";
  List items;
  std::vector<Value> keys;
  for (const auto& [k, val] : v.as_dict().items()) {
    items.push_back(Value::MakeList({k, val}, true));
    keys.push_back(SortKey(by_value ? val : k, a[0].Truthy()));
  }
  ASSIGN_OR_RETURN(List sorted, SortValues(std::move(items), keys, a[2].Truthy()));
  return Value::MakeList(std::move(sorted));
}

Result<Value> FilterEscape(Renderer&, const Value& v, const CallArgs&) {
  return Value::String(HtmlEscape(v.Str()));
}

Result<Value> FilterFirst(Renderer&, const Value& v, const CallArgs&) {
  ASSIGN_OR_RETURN(List items, Iterate(v));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

Result<Value> FilterLast(Renderer&, const Value& v, const CallArgs&) {
  ASSIGN_OR_RETURN(List items, Iterate(v));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

Result<Value> FilterFloat(Renderer&, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("float", {"default"}));
  Value fallback = a[0].is_undefined() ? Value::Float(0.0) : a[0];
  if (v.is_number()) return Value::Float(v.as_float());
  if (v.is_string()) {
    if (auto d = ParseFloat(v.as_string())) return Value::Float(*d);
  }
  return fallback;
}

Result<Value> FilterInt(Renderer&, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("int", {"default", "base"}));
  Value fallback = a[0].is_undefined() ? Value::Int(0) : a[0];
  int base = a[1].is_int() ? static_cast<int>(a[1].as_int()) : 10;
  if (v.is_int() || v.is_bool()) return Value::Int(v.as_int());
  if (v.is_float()) {
    double d = v.as_float();
    if (std::isnan(d) || std::isinf(d) || std::fabs(d) >= 9.2e18) return fallback;
    return Value::Int(static_cast<int64_t>(d));
  }
  if (v.is_string()) {
    if (auto i = ParseInt(v.as_string(), base)) return Value::Int(*i);
    if (auto d = ParseFloat(v.as_string())) {
      if (!std::isnan(*d) && !std::isinf(*d) && std::fabs(*d) < 9.2e18) {
        return Value::Int(static_cast<int64_t>(*d));
      }
    }
  }
  return fallback;
}

Result<Value> FilterIndent(Renderer&, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("indent", {"width", "first", "blank"}));
  std::string indent =
      a[0].is_string() ? a[0].as_string()
      : a[0].is_undefined()
          ? std::string(4, ' ')
          : std::string(std::max<int64_t>(0, a[0].is_number() ? a[0].as_int() : 4), ' ');
  std::string s = v.Str() + "\n";
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    lines.push_back(s.substr(pos, nl - pos));
    pos = nl + 1;
  }
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (a[2].Truthy() || !lines[i].empty()) out += indent;
    }
    out += lines[i];
  }
  if (a[1].Truthy()) out = indent + out;
  return Value::String(std::move(out));
}

Result<Value> FilterItems(Renderer&, const Value& v, const CallArgs&) {
  if (v.is_undefined()) return Value::MakeList({});
  if (!v.is_dict()) return InvalidArgument("Can only get item pairs from a mapping.");
  List items;
  for (const auto& [k, val] : v.as_dict().items()) items.push_back(Value::MakeList({k, val}, true));
  return Value::MakeList(std::move(items));
}

Result<Value> FilterJoin(Renderer& r, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("join", {"d", "attribute"}));
  std::string sep = a[0].is_undefined() ? "" : a[0].Str();
  ASSIGN_OR_RETURN(List items, Iterate(v));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    if (!a[1].is_undefined() && !a[1].is_none()) {
      ASSIGN_OR_RETURN(Value item, GetAttrPath(r, items[i], a[1]));
      out += item.Str();
    } else {
      out += items[i].Str();
    }
    RETURN_IF_ERROR(r.CheckSize(out.size()));
  }
  return Value::String(std::move(out));
}

Result<Value> FilterLength(Renderer&, const Value& v, const CallArgs&) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return Value::Int(0);
    case Value::Kind::kString:
      return Value::Int(static_cast<int64_t>(Utf8Length(v.as_string())));
    case Value::Kind::kList:
      return Value::Int(static_cast<int64_t>(v.as_list().size()));
    case Value::Kind::kDict:
      return Value::Int(static_cast<int64_t>(v.as_dict().size()));
    default:
      return InvalidArgument("object of type '" + v.TypeName() + "' has no len()");
  }
}

Result<Value> FilterList(Renderer&, const Value& v, const CallArgs&) {
  ASSIGN_OR_RETURN(List items, Iterate(v));
  return Value::MakeList(std::move(items));
}

Result<Value> FilterLower(Renderer&, const Value& v, const CallArgs&) {
  return Value::String(Lower(v.Str()));
}
Result<Value> FilterUpper(Renderer&, const Value& v, const CallArgs&) {
  return Value::String(Upper(v.Str()));
}

Result<Value> FilterMap(Renderer& r, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(List items, Iterate(v));
  List out;
  if (const Value* attribute = Kwarg(args, "attribute")) {
    const Value* fallback = Kwarg(args, "default");
    for (const Value& item : items) {
      ASSIGN_OR_RETURN(Value x, GetAttrPath(r, item, *attribute));
      if (x.is_undefined() && fallback != nullptr) x = *fallback;
      out.push_back(std::move(x));
    }
    return Value::MakeList(std::move(out));
  }
  if (args.positional.empty()) return InvalidArgument("map needs a filter name or attribute=");
  ASSIGN_OR_RETURN(std::string name, ToStr(args.positional[0], "map filter name"));
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : items) {
    ASSIGN_OR_RETURN(Value x, r.ApplyFilter(name, item, rest));
    out.push_back(std::move(x));
  }
  return Value::MakeList(std::move(out));
}

Result<Value> MinMax(Renderer& r, const Value& v, const CallArgs& args, bool want_max) {
  ASSIGN_OR_RETURN(auto a, args.Bind(want_max ? "max" : "min", {"case_sensitive", "attribute"}));
  ASSIGN_OR_RETURN(List items, Iterate(v));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    Value key = items[i];
    if (!a[1].is_undefined() && !a[1].is_none()) {
      ASSIGN_OR_RETURN(key, GetAttrPath(r, items[i], a[1]));
    }
    key = SortKey(key, a[0].Truthy());
    if (i == 0) {
      best_key = key;
      continue;
    }
    ASSIGN_OR_RETURN(bool better, want_max ? best_key.Less(key) : key.Less(best_key));
    if (better) {
      best = i;
      best_key = key;
    }
  }
  return items[best];
}
Result<Value> FilterMax(Renderer& r, const Value& v, const CallArgs& a) {
  return MinMax(r, v, a, true);
}
Result<Value> FilterMin(Renderer& r, const Value& v, const CallArgs& a) {
  return MinMax(r, v, a, false);
}

Result<Value> FilterReplace(Renderer& r, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("replace", {"old", "new", "count"}));
  ASSIGN_OR_RETURN(std::string old, ToStr(a[0], "replace old"));
  ASSIGN_OR_RETURN(std::string with, ToStr(a[1], "replace new"));
  int64_t count = -1;
  if (a[2].is_int()) count = a[2].as_int();
  std::string out = Replace(v.Str(), old, with, count);
  RETURN_IF_ERROR(r.CheckSize(out.size()));
  return Value::String(std::move(out));
}

Result<Value> FilterReverse(Renderer&, const Value& v, const CallArgs&) {
  if (v.is_string()) {
    std::vector<size_t> off = CodepointOffsets(v.as_string());
    std::string out;
    for (size_t i = off.size() - 1; i > 0; --i) {
      out.append(v.as_string(), off[i - 1], off[i] - off[i - 1]);
    }
    return Value::String(std::move(out));
  }
  ASSIGN_OR_RETURN(List items, Iterate(v));
  std::reverse(items.begin(), items.end());
  return Value::MakeList(std::move(items));
}

Result<Value> FilterRound(Renderer&, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("round", {"precision", "method"}));
  int64_t precision = a[0].is_int() ? a[0].as_int() : 0;
  std::string method = a[1].is_string() ? a[1].as_string() : "common";
  if (!v.is_number()) return InvalidArgument("round expects a number, got " + v.TypeName());
  double scale = std::pow(10.0, static_cast<double>(precision));
  double x = v.as_float() * scale;
  double rounded;
  if (method == "common") {
    rounded = std::nearbyint(x);  // Python's round(): half to even
  } else if (method == "ceil") {
    rounded = std::ceil(x);
  } else if (method == "floor") {
    rounded = std::floor(x);
  } else {
    return InvalidArgument("method must be common, ceil or floor");
  }
  if (method == "common" && !v.is_float() && precision >= 0) return Value::Int(v.as_int());
  return Value::Float(rounded / scale);
}

Result<Value> FilterSafe(Renderer&, const Value& v, const CallArgs&) { return v; }

Result<Value> SelectImpl(Renderer& r, const Value& v, const CallArgs& args, bool by_attr,
                         bool keep) {
  ASSIGN_OR_RETURN(List items, Iterate(v));
  size_t first_test_arg = by_attr ? 1 : 0;
  if (by_attr && args.positional.empty()) return InvalidArgument("missing attribute argument");
  std::string test;
  if (args.positional.size() > first_test_arg) {
    ASSIGN_OR_RETURN(test, ToStr(args.positional[first_test_arg], "test name"));
  }
  CallArgs test_args;
  if (args.positional.size() > first_test_arg + 1) {
    test_args.positional.assign(args.positional.begin() + first_test_arg + 1,
                                args.positional.end());
  }
  test_args.keyword = args.keyword;
  List out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attr) {
      ASSIGN_OR_RETURN(subject, GetAttrPath(r, item, args.positional[0]));
    }
    bool pass;
    if (test.empty()) {
      pass = subject.Truthy();
    } else {
      ASSIGN_OR_RETURN(pass, r.ApplyTest(test, subject, test_args));
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::MakeList(std::move(out));
}
Result<Value> FilterSelect(Renderer& r, const Value& v, const CallArgs& a) {
  return SelectImpl(r, v, a, false, true);
}
Result<Value> FilterReject(Renderer& r, const Value& v, const CallArgs& a) {
  return SelectImpl(r, v, a, false, false);
}
Result<Value> FilterSelectattr(Renderer& r, const Value& v, const CallArgs& a) {
  return SelectImpl(r, v, a, true, true);
}
Result<Value> FilterRejectattr(Renderer& r, const Value& v, const CallArgs& a) {
  return SelectImpl(r, v, a, true, false);
}

Result<Value> FilterSort(Renderer& r, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("sort", {"reverse", "case_sensitive", "attribute"}));
  ASSIGN_OR_RETURN(List items, Iterate(v));
  std::vector<Value> keys;
  for (const Value& item : items) {
    Value key = item;
    if (!a[2].is_undefined() && !a[2].is_none()) {
      ASSIGN_OR_RETURN(key, GetAttrPath(r, item, a[2]));
    }
    keys.push_back(SortKey(key, a[1].Truthy()));
  }
  ASSIGN_OR_RETURN(List sorted, SortValues(std::move(items), keys, a[0].Truthy()));
  return Value::MakeList(std::move(sorted));
}

Result<Value> FilterString(Renderer&, const Value& v, const CallArgs&) {
  return v.is_string() ? v : Value::String(v.Str());
}

Result<Value> FilterSum(Renderer& r, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("sum", {"attribute", "start"}));
  ASSIGN_OR_RETURN(List items, Iterate(v));
  Value total = a[1].is_undefined() ? Value::Int(0) : a[1];
  for (const Value& item : items) {
    Value x = item;
    if (!a[0].is_undefined() && !a[0].is_none()) {
      ASSIGN_OR_RETURN(x, GetAttrPath(r, item, a[0]));
    }
    if (!x.is_number() || !total.is_number()) {
      return InvalidArgument("unsupported operand type(s) for +: '" + total.TypeName() + "' and '" +
                             x.TypeName() + "'");
    }
    if (x.is_float() || total.is_float()) {
      total = Value::Float(total.as_float() + x.as_float());
    } else {
      int64_t s;
      if (__builtin_add_overflow(total.as_int(), x.as_int(), &s)) return OutOfRange("sum overflow");
      total = Value::Int(s);
    }
  }
  return total;
}

Result<Value> FilterTitle(Renderer&, const Value& v, const CallArgs&) {
  return Value::String(JinjaTitle(v.Str()));
}

// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False) -- not jinja2's HTML-safe default.
Result<Value> FilterTojson(Renderer& r, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a,
                   args.Bind("tojson", {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonDumpOptions opt;
  opt.ensure_ascii = a[0].Truthy();
  if (a[1].is_string()) {
    opt.indent = a[1].as_string();
  } else if (a[1].is_int()) {
    opt.indent = std::string(std::max<int64_t>(0, std::min<int64_t>(a[1].as_int(), 1024)), ' ');
  } else if (!a[1].is_none() && !a[1].is_undefined()) {
    return InvalidArgument("indent must be an int or str");
  }
  if (opt.indent) opt.item_separator = ",";
  if (a[2].is_list()) {
    const List& seps = a[2].as_list();
    if (seps.size() != 2 || !seps[0].is_string() || !seps[1].is_string()) {
      return InvalidArgument("separators must be a pair of strings");
    }
    opt.item_separator = seps[0].as_string();
    opt.key_separator = seps[1].as_string();
  }
  opt.sort_keys = a[3].Truthy();
  ASSIGN_OR_RETURN(std::string s, DumpJson(v, opt));
  RETURN_IF_ERROR(r.CheckSize(s.size()));
  return Value::String(std::move(s));
}

Result<Value> FilterTrim(Renderer&, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("trim", {"chars"}));
  return Value::String(Strip(v.Str(), a[0], StripSide::kBoth));
}

Result<Value> FilterUnique(Renderer& r, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("unique", {"case_sensitive", "attribute"}));
  ASSIGN_OR_RETURN(List items, Iterate(v));
  List out;
  std::vector<Value> seen;
  for (const Value& item : items) {
    Value key = item;
    if (!a[1].is_undefined() && !a[1].is_none()) {
      ASSIGN_OR_RETURN(key, GetAttrPath(r, item, a[1]));
    }
    key = SortKey(key, a[0].Truthy());
    bool dup = std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return s.Equals(key); });
    if (!dup) {
      seen.push_back(key);
      out.push_back(item);
    }
  }
  return Value::MakeList(std::move(out));
}

Result<Value> FilterWordcount(Renderer&, const Value& v, const CallArgs&) {
  std::string s = v.Str();
  int64_t n = 0;
  bool in_word = false;
  for (char c : s) {
    bool word = std::isalnum(static_cast<unsigned char>(c)) || c == '_' ||
                static_cast<unsigned char>(c) >= 0x80;
    if (word && !in_word) ++n;
    in_word = word;
  }
  return Value::Int(n);
}

Result<Value> FilterFormat(Renderer&, const Value& v, const CallArgs& args) {
  if (!args.keyword.empty()) {
    auto dict = std::make_shared<Dict>();
    for (const auto& [k, val] : args.keyword) dict->Set(Value::String(k), val);
    ASSIGN_OR_RETURN(std::string s, PercentFormat(v.Str(), Value::MakeDict(dict)));
    return Value::String(std::move(s));
  }
  ASSIGN_OR_RETURN(std::string s,
                   PercentFormat(v.Str(), Value::MakeList(args.positional, /*is_tuple=*/true)));
  return Value::String(std::move(s));
}

const std::unordered_map<std::string_view, FilterFn>& Filters() {
  static const auto* filters = new std::unordered_map<std::string_view, FilterFn>{
      {"abs", FilterAbs},
      {"capitalize", FilterCapitalize},
      {"count", FilterLength},
      {"d", FilterDefault},
      {"default", FilterDefault},
      {"dictsort", FilterDictsort},
      {"e", FilterEscape},
      {"escape", FilterEscape},
      {"first", FilterFirst},
      {"float", FilterFloat},
      {"format", FilterFormat},
      {"forceescape", FilterEscape},
      {"indent", FilterIndent},
      {"int", FilterInt},
      {"items", FilterItems},
      {"join", FilterJoin},
      {"last", FilterLast},
      {"length", FilterLength},
      {"list", FilterList},
      {"lower", FilterLower},
      {"map", FilterMap},
      {"max", FilterMax},
      {"min", FilterMin},
      {"reject", FilterReject},
      {"rejectattr", FilterRejectattr},
      {"replace", FilterReplace},
      {"reverse", FilterReverse},
      {"round", FilterRound},
      {"safe", FilterSafe},
      {"select", FilterSelect},
      {"selectattr", FilterSelectattr},
      {"sort", FilterSort},
      {"string", FilterString},
      {"sum", FilterSum},
      {"title", FilterTitle},
      {"tojson", FilterTojson},
      {"trim", FilterTrim},
      {"unique", FilterUnique},
      {"upper", FilterUpper},
      {"wordcount", FilterWordcount},
  };
  return *filters;
}

// --- tests ---

Result<bool> Arg0(const CallArgs& args, const char* test) {
  if (args.positional.empty() && args.keyword.empty()) {
    return InvalidArgument(std::string("test '") + test + "' needs an argument");
  }
  return true;
}
const Value& First(const CallArgs& args) {
  return args.positional.empty() ? args.keyword[0].second : args.positional[0];
}

Result<bool> Compare(const Value& v, const CallArgs& args, const char* name, int which) {
  ASSIGN_OR_RETURN(bool ok, Arg0(args, name));
  (void)ok;
  const Value& other = First(args);
  switch (which) {
    case 0:
      return v.Equals(other);
    case 1:
      return !v.Equals(other);
    case 2:
      return v.Less(other);
    case 3:
      return other.Less(v);
    case 4: {
      ASSIGN_OR_RETURN(bool g, other.Less(v));
      return !g;
    }
    default: {
      ASSIGN_OR_RETURN(bool l, v.Less(other));
      return !l;
    }
  }
}

#define SIMPLE_TEST(fn_name, expr) \
  Result<bool> fn_name(Renderer&, const Value& v, const CallArgs& args) { return (expr); }

SIMPLE_TEST(TestDefined, !v.is_undefined())
SIMPLE_TEST(TestUndefined, v.is_undefined())
SIMPLE_TEST(TestNone, v.is_none())
SIMPLE_TEST(TestBoolean, v.is_bool())
SIMPLE_TEST(TestTrue, v.is_bool() && v.as_bool())
SIMPLE_TEST(TestFalse, v.is_bool() && !v.as_bool())
SIMPLE_TEST(TestInteger, v.is_int())
SIMPLE_TEST(TestFloat, v.is_float())
SIMPLE_TEST(TestNumber, v.is_number())
SIMPLE_TEST(TestString, v.is_string())
SIMPLE_TEST(TestMapping, v.is_dict())
SIMPLE_TEST(TestIterable, v.is_string() || v.is_list() || v.is_dict() || v.is_undefined())
SIMPLE_TEST(TestSequence, v.is_string() || v.is_list() || v.is_dict() || v.is_undefined())
SIMPLE_TEST(TestCallable, v.is_callable())
SIMPLE_TEST(TestEscaped, false)
SIMPLE_TEST(TestLower, v.is_string() && Lower(v.as_string()) == v.as_string())
SIMPLE_TEST(TestUpper, v.is_string() && Upper(v.as_string()) == v.as_string())
SIMPLE_TEST(TestEq, Compare(v, args, "eq", 0))
SIMPLE_TEST(TestNe, Compare(v, args, "ne", 1))
SIMPLE_TEST(TestLt, Compare(v, args, "lt", 2))
SIMPLE_TEST(TestGt, Compare(v, args, "gt", 3))
SIMPLE_TEST(TestLe, Compare(v, args, "le", 4))
SIMPLE_TEST(TestGe, Compare(v, args, "ge", 5))
SIMPLE_TEST(TestFilter, v.is_string() && FindFilter(v.as_string()) != nullptr)
SIMPLE_TEST(TestTest, v.is_string() && FindTest(v.as_string()) != nullptr)
#undef SIMPLE_TEST

Result<bool> TestOdd(Renderer&, const Value& v, const CallArgs&) {
  ASSIGN_OR_RETURN(int64_t i, ToInt(v, "odd test value"));
  return i % 2 != 0;
}
Result<bool> TestEven(Renderer&, const Value& v, const CallArgs&) {
  ASSIGN_OR_RETURN(int64_t i, ToInt(v, "even test value"));
  return i % 2 == 0;
}
Result<bool> TestDivisibleby(Renderer&, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(bool ok, Arg0(args, "divisibleby"));
  (void)ok;
  ASSIGN_OR_RETURN(int64_t i, ToInt(v, "divisibleby value"));
  ASSIGN_OR_RETURN(int64_t d, ToInt(First(args), "divisibleby argument"));
  if (d == 0) return InvalidArgument("integer division or modulo by zero");
  return i % d == 0;
}
Result<bool> TestIn(Renderer&, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(bool ok, Arg0(args, "in"));
  (void)ok;
  return Contains(First(args), v);
}
Result<bool> TestSameas(Renderer&, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(bool ok, Arg0(args, "sameas"));
  (void)ok;
  const Value& o = First(args);
  if (v.kind() != o.kind()) return false;
  if (v.is_none() || v.is_undefined()) return true;
  if (v.is_bool()) return v.as_bool() == o.as_bool();
  if (v.is_int() && v.as_int() >= -5 && v.as_int() <= 256) return v.as_int() == o.as_int();
  if (v.is_list() || v.is_dict() || v.is_string()) {
    if (v.is_string()) return &v.as_string() == &o.as_string();
    if (v.is_list()) return &v.as_list() == &o.as_list();
    return &v.as_dict() == &o.as_dict();
  }
  return v.Equals(o) && (v.is_object() || v.is_callable());
}

const std::unordered_map<std::string_view, TestFn>& Tests() {
  static const auto* tests = new std::unordered_map<std::string_view, TestFn>{
      {"defined", TestDefined},
      {"undefined", TestUndefined},
      {"none", TestNone},
      {"boolean", TestBoolean},
      {"true", TestTrue},
      {"false", TestFalse},
      {"integer", TestInteger},
      {"float", TestFloat},
      {"number", TestNumber},
      {"string", TestString},
      {"mapping", TestMapping},
      {"iterable", TestIterable},
      {"sequence", TestSequence},
      {"callable", TestCallable},
      {"escaped", TestEscaped},
      {"lower", TestLower},
      {"upper", TestUpper},
      {"odd", TestOdd},
      {"even", TestEven},
      {"divisibleby", TestDivisibleby},
      {"eq", TestEq},
      {"equalto", TestEq},
      {"==", TestEq},
      {"ne", TestNe},
      {"!=", TestNe},
      {"lt", TestLt},
      {"lessthan", TestLt},
      {"<", TestLt},
      {"gt", TestGt},
      {"greaterthan", TestGt},
      {">", TestGt},
      {"le", TestLe},
      {"<=", TestLe},
      {"ge", TestGe},
      {">=", TestGe},
      {"in", TestIn},
      {"sameas", TestSameas},
      {"filter", TestFilter},
      {"test", TestTest},
  };
  return *tests;
}

// --- globals ---

Value MakeFunction(std::string name, std::function<Result<Value>(Renderer&, const CallArgs&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return Value::MakeCallable(std::move(c));
}

Result<Value> GlobalRange(Renderer&, const CallArgs& args) {
  if (!args.keyword.empty()) return InvalidArgument("range() takes no keyword arguments");
  const auto& p = args.positional;
  if (p.empty() || p.size() > 3) return InvalidArgument("range expected 1 to 3 arguments");
  int64_t start = 0, stop, step = 1;
  if (p.size() == 1) {
    ASSIGN_OR_RETURN(stop, ToInt(p[0], "range argument"));
  } else {
    ASSIGN_OR_RETURN(start, ToInt(p[0], "range argument"));
    ASSIGN_OR_RETURN(stop, ToInt(p[1], "range argument"));
    if (p.size() == 3) {
      ASSIGN_OR_RETURN(step, ToInt(p[2], "range argument"));
    }
  }
  if (step == 0) return InvalidArgument("range() arg 3 must not be zero");
  __int128 span =
      step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
  __int128 n = span <= 0 ? 0 : (span + (step > 0 ? step : -step) - 1) / (step > 0 ? step : -step);
  if (n > kMaxRange) {
    return InvalidArgument("Range too big. The sandbox blocks ranges larger than MAX_RANGE (" +
                           std::to_string(kMaxRange) + ").");
  }
  List items;
  for (int64_t i = 0; i < static_cast<int64_t>(n); ++i)
    items.push_back(Value::Int(start + i * step));
  return Value::MakeList(std::move(items));
}

Result<std::shared_ptr<Dict>> DictFromArgs(const CallArgs& args, const char* fn) {
  auto dict = std::make_shared<Dict>();
  if (args.positional.size() > 1)
    return InvalidArgument(std::string(fn) + "() takes at most 1 positional argument");
  if (!args.positional.empty()) {
    const Value& src = args.positional[0];
    if (src.is_dict()) {
      for (const auto& [k, v] : src.as_dict().items()) dict->Set(k, v);
    } else {
      ASSIGN_OR_RETURN(List pairs, Iterate(src));
      for (const Value& pair : pairs) {
        if (!pair.is_list() || pair.as_list().size() != 2) {
          return InvalidArgument(std::string(fn) + "() sequence elements must be pairs");
        }
        dict->Set(pair.as_list()[0], pair.as_list()[1]);
      }
    }
  }
  for (const auto& [k, v] : args.keyword) dict->Set(Value::String(k), v);
  return dict;
}

Result<Value> GlobalNamespace(Renderer&, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto dict, DictFromArgs(args, "namespace"));
  auto ns = std::make_shared<Namespace>();
  for (const auto& [k, v] : dict->items()) {
    if (!k.is_string()) return InvalidArgument("namespace() keys must be strings");
    RETURN_IF_ERROR(ns->SetAttr(k.as_string(), v));
  }
  return Value::MakeObject(std::move(ns));
}

Result<Value> GlobalDict(Renderer&, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto dict, DictFromArgs(args, "dict"));
  return Value::MakeDict(std::move(dict));
}

Result<Value> GlobalRaiseException(Renderer& r, const CallArgs& args) {
  std::string message = args.positional.empty() ? "" : args.positional[0].Str();
  return r.Raise(InvalidArgument(message));
}

Result<Value> GlobalStrftimeNow(Renderer&, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("strftime_now", {"format"}));
  ASSIGN_OR_RETURN(std::string format, ToStr(a[0], "strftime_now format"));
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[512];
  size_t n = format.empty() ? 0 : std::strftime(buf, sizeof(buf), format.c_str(), &tm);
  return Value::String(std::string(buf, n));
}

// --- methods ---

using MethodFn = Result<Value> (*)(Renderer&, const Value& self, const CallArgs& args);

Value BindMethod(const Value& self, std::string_view name, MethodFn fn) {
  return MakeFunction(std::string(name),
                      [self, fn](Renderer& r, const CallArgs& args) { return fn(r, self, args); });
}

Value Unavailable(const Value& self, std::string_view name, bool mutating) {
  std::string msg = "method '" + std::string(name) + "' of " + self.TypeName() +
                    (mutating ? " is not allowed: transformers renders chat templates in an "
                                "immutable sandbox"
                              : " is not supported");
  bool unsupported = !mutating;
  return MakeFunction(std::string(name),
                      [msg, unsupported](Renderer&, const CallArgs&) -> Result<Value> {
                        if (unsupported) return Unsupported(msg);
                        return InvalidArgument(msg);
                      });
}

// Code point index of byte offset `byte` in s.
int64_t CodepointIndex(std::string_view s, size_t byte) {
  return static_cast<int64_t>(Utf8Length(s.substr(0, byte)));
}

// Resolves Python's optional [start, end] code point bounds to byte offsets.
Result<std::pair<size_t, size_t>> ByteRange(const std::string& s, const Value& start,
                                            const Value& end) {
  std::vector<size_t> off = CodepointOffsets(s);
  int64_t n = static_cast<int64_t>(off.size()) - 1;
  auto norm = [&](const Value& v, int64_t def) -> Result<int64_t> {
    if (v.is_undefined() || v.is_none()) return def;
    ASSIGN_OR_RETURN(int64_t i, ToInt(v, "slice index"));
    if (i < 0) i += n;
    return std::clamp<int64_t>(i, 0, n);
  };
  ASSIGN_OR_RETURN(int64_t b, norm(start, 0));
  ASSIGN_OR_RETURN(int64_t e, norm(end, n));
  if (e < b) e = b;
  return std::make_pair(off[b], off[e]);
}

Result<Value> AffixImpl(const Value& self, const CallArgs& args, bool prefix) {
  ASSIGN_OR_RETURN(auto a,
                   args.Bind(prefix ? "startswith" : "endswith", {"affix", "start", "end"}));
  ASSIGN_OR_RETURN(auto range, ByteRange(self.as_string(), a[1], a[2]));
  std::string_view s =
      std::string_view(self.as_string()).substr(range.first, range.second - range.first);
  List options;
  if (a[0].is_tuple()) {
    options = a[0].as_list();
  } else {
    options.push_back(a[0]);
  }
  for (const Value& o : options) {
    if (!o.is_string()) {
      return InvalidArgument(std::string(prefix ? "startswith" : "endswith") +
                             " first arg must be str or a tuple of str, not " + o.TypeName());
    }
    const std::string& x = o.as_string();
    if (x.size() <= s.size() &&
        (prefix ? s.substr(0, x.size()) == x : s.substr(s.size() - x.size()) == x)) {
      return Value::Bool(true);
    }
  }
  return Value::Bool(false);
}

Result<Value> StrStartswith(Renderer&, const Value& self, const CallArgs& args) {
  return AffixImpl(self, args, true);
}
Result<Value> StrEndswith(Renderer&, const Value& self, const CallArgs& args) {
  return AffixImpl(self, args, false);
}

Result<Value> SplitImpl(const Value& self, const CallArgs& args, bool from_right) {
  ASSIGN_OR_RETURN(auto a, args.Bind(from_right ? "rsplit" : "split", {"sep", "maxsplit"}));
  int64_t maxsplit = -1;
  if (!a[1].is_undefined()) {
    ASSIGN_OR_RETURN(maxsplit, ToInt(a[1], "maxsplit"));
  }
  ASSIGN_OR_RETURN(List parts, Split(self.as_string(), a[0], maxsplit, from_right));
  return Value::MakeList(std::move(parts));
}
Result<Value> StrSplit(Renderer&, const Value& self, const CallArgs& args) {
  return SplitImpl(self, args, false);
}
Result<Value> StrRsplit(Renderer&, const Value& self, const CallArgs& args) {
  return SplitImpl(self, args, true);
}

Result<Value> StripImpl(const Value& self, const CallArgs& args, StripSide side) {
  ASSIGN_OR_RETURN(auto a, args.Bind("strip", {"chars"}));
  if (!a[0].is_undefined() && !a[0].is_none() && !a[0].is_string()) {
    return InvalidArgument("strip arg must be None or str");
  }
  return Value::String(Strip(self.as_string(), a[0], side));
}
Result<Value> StrStrip(Renderer&, const Value& s, const CallArgs& a) {
  return StripImpl(s, a, StripSide::kBoth);
}
Result<Value> StrLstrip(Renderer&, const Value& s, const CallArgs& a) {
  return StripImpl(s, a, StripSide::kLeft);
}
Result<Value> StrRstrip(Renderer&, const Value& s, const CallArgs& a) {
  return StripImpl(s, a, StripSide::kRight);
}

Result<Value> StrReplace(Renderer& r, const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("replace", {"old", "new", "count"}));
  ASSIGN_OR_RETURN(std::string old, ToStr(a[0], "replace old"));
  ASSIGN_OR_RETURN(std::string with, ToStr(a[1], "replace new"));
  int64_t count = -1;
  if (!a[2].is_undefined()) {
    ASSIGN_OR_RETURN(count, ToInt(a[2], "replace count"));
  }
  std::string out = Replace(self.as_string(), old, with, count);
  RETURN_IF_ERROR(r.CheckSize(out.size()));
  return Value::String(std::move(out));
}

Result<Value> StrUpper(Renderer&, const Value& s, const CallArgs&) {
  return Value::String(Upper(s.as_string()));
}
Result<Value> StrLower(Renderer&, const Value& s, const CallArgs&) {
  return Value::String(Lower(s.as_string()));
}
Result<Value> StrTitle(Renderer&, const Value& s, const CallArgs&) {
  return Value::String(PyTitle(s.as_string()));
}
Result<Value> StrCapitalize(Renderer&, const Value& s, const CallArgs&) {
  return Value::String(Capitalize(s.as_string()));
}

Result<Value> FindImpl(const Value& self, const CallArgs& args, bool reverse, bool raise,
                       const char* name) {
  ASSIGN_OR_RETURN(auto a, args.Bind(name, {"sub", "start", "end"}));
  ASSIGN_OR_RETURN(std::string sub, ToStr(a[0], "substring"));
  ASSIGN_OR_RETURN(auto range, ByteRange(self.as_string(), a[1], a[2]));
  std::string_view s(self.as_string());
  std::string_view window = s.substr(range.first, range.second - range.first);
  size_t hit = reverse ? window.rfind(sub) : window.find(sub);
  if (hit == std::string_view::npos) {
    if (raise) return InvalidArgument("substring not found");
    return Value::Int(-1);
  }
  return Value::Int(CodepointIndex(s, range.first + hit));
}
Result<Value> StrFind(Renderer&, const Value& s, const CallArgs& a) {
  return FindImpl(s, a, false, false, "find");
}
Result<Value> StrRfind(Renderer&, const Value& s, const CallArgs& a) {
  return FindImpl(s, a, true, false, "rfind");
}
Result<Value> StrIndex(Renderer&, const Value& s, const CallArgs& a) {
  return FindImpl(s, a, false, true, "index");
}

Result<Value> StrCount(Renderer&, const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("count", {"sub"}));
  ASSIGN_OR_RETURN(std::string sub, ToStr(a[0], "substring"));
  const std::string& s = self.as_string();
  if (sub.empty()) return Value::Int(static_cast<int64_t>(Utf8Length(s)) + 1);
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) ++n;
  return Value::Int(n);
}

Result<Value> StrJoin(Renderer& r, const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("join", {"iterable"}));
  ASSIGN_OR_RETURN(List items, Iterate(a[0]));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      return InvalidArgument("sequence item " + std::to_string(i) + ": expected str instance, " +
                             items[i].TypeName() + " found");
    }
    if (i) out += self.as_string();
    out += items[i].as_string();
    RETURN_IF_ERROR(r.CheckSize(out.size()));
  }
  return Value::String(std::move(out));
}

// str.format with {} / {0} / {name} fields and {!r}/{!s}; format specs are not supported.
Result<Value> StrFormat(Renderer& r, const Value& self, const CallArgs& args) {
  const std::string& f = self.as_string();
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    char c = f[i];
    if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}') ++i;
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = f.find('}', i);
    if (close == std::string::npos)
      return InvalidArgument("Single '{' encountered in format string");
    std::string field = f.substr(i + 1, close - i - 1);
    i = close;
    char conversion = 0;
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      conversion = bang + 1 < field.size() ? field[bang + 1] : 0;
      field = field.substr(0, bang);
    }
    if (field.find(':') != std::string::npos || field.find('.') != std::string::npos ||
        field.find('[') != std::string::npos) {
      return Unsupported("str.format field '{" + field + "}' (format specs and lookups)");
    }
    const Value* v = nullptr;
    if (field.empty() || std::all_of(field.begin(), field.end(), ::isdigit)) {
      size_t idx = field.empty() ? auto_index++ : std::stoul(field);
      if (idx >= args.positional.size()) {
        return InvalidArgument("Replacement index " + std::to_string(idx) + " out of range");
      }
      v = &args.positional[idx];
    } else {
      v = Kwarg(args, field);
      if (v == nullptr) return InvalidArgument("format: missing key '" + field + "'");
    }
    out += conversion == 'r' ? v->Repr() : v->Str();
    RETURN_IF_ERROR(r.CheckSize(out.size()));
  }
  return Value::String(std::move(out));
}

template <bool (*Pred)(uint32_t)>
Result<Value> StrIs(Renderer&, const Value& self, const CallArgs&) {
  std::vector<uint32_t> cps = Codepoints(self.as_string());
  if (cps.empty()) return Value::Bool(false);
  return Value::Bool(std::all_of(cps.begin(), cps.end(), Pred));
}
bool CpDigit(uint32_t c) { return c >= '0' && c <= '9'; }
bool CpAlpha(uint32_t c) {
  return c < 0x80 ? IsAsciiAlpha(static_cast<char>(c)) : !IsPyWhitespace(c);
}
bool CpAlnum(uint32_t c) { return CpDigit(c) || CpAlpha(c); }
bool CpSpace(uint32_t c) { return IsPyWhitespace(c); }

Result<Value> StrIsCase(const Value& self, bool upper) {
  const std::string& s = self.as_string();
  bool cased = false;
  for (char c : s) {
    if (IsAsciiAlpha(c)) {
      cased = true;
      if ((std::isupper(static_cast<unsigned char>(c)) != 0) != upper) return Value::Bool(false);
    }
  }
  return Value::Bool(cased);
}
Result<Value> StrIsupper(Renderer&, const Value& s, const CallArgs&) { return StrIsCase(s, true); }
Result<Value> StrIslower(Renderer&, const Value& s, const CallArgs&) { return StrIsCase(s, false); }

Result<Value> StrSplitlines(Renderer&, const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("splitlines", {"keepends"}));
  const std::string& s = self.as_string();
  List lines;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\n' && s[i] != '\r') continue;
    size_t end = i;
    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
    lines.push_back(Value::String(s.substr(start, (a[0].Truthy() ? i + 1 : end) - start)));
    start = i + 1;
  }
  if (start < s.size()) lines.push_back(Value::String(s.substr(start)));
  return Value::MakeList(std::move(lines));
}

Result<Value> AffixRemove(const Value& self, const CallArgs& args, bool prefix) {
  ASSIGN_OR_RETURN(auto a, args.Bind(prefix ? "removeprefix" : "removesuffix", {"affix"}));
  ASSIGN_OR_RETURN(std::string x, ToStr(a[0], "affix"));
  const std::string& s = self.as_string();
  if (x.size() <= s.size()) {
    if (prefix && s.compare(0, x.size(), x) == 0) return Value::String(s.substr(x.size()));
    if (!prefix && s.compare(s.size() - x.size(), x.size(), x) == 0) {
      return Value::String(s.substr(0, s.size() - x.size()));
    }
  }
  return self;
}
Result<Value> StrRemoveprefix(Renderer&, const Value& s, const CallArgs& a) {
  return AffixRemove(s, a, true);
}
Result<Value> StrRemovesuffix(Renderer&, const Value& s, const CallArgs& a) {
  return AffixRemove(s, a, false);
}

Result<Value> DictItems(Renderer& r, const Value& self, const CallArgs&) {
  return FilterItems(r, self, {});
}
Result<Value> DictKeys(Renderer&, const Value& self, const CallArgs&) {
  List keys;
  for (const auto& [k, v] : self.as_dict().items()) keys.push_back(k);
  return Value::MakeList(std::move(keys));
}
Result<Value> DictValues(Renderer&, const Value& self, const CallArgs&) {
  List values;
  for (const auto& [k, v] : self.as_dict().items()) values.push_back(v);
  return Value::MakeList(std::move(values));
}
Result<Value> DictGet(Renderer&, const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("get", {"key", "default"}));
  if (const Value* v = self.as_dict().Find(a[0])) return *v;
  return a[1].is_undefined() ? Value::None() : a[1];
}
Result<Value> Identity(Renderer&, const Value& self, const CallArgs&) { return self; }

Result<Value> ListIndex(Renderer&, const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("index", {"value"}));
  const List& items = self.as_list();
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].Equals(a[0])) return Value::Int(static_cast<int64_t>(i));
  }
  return InvalidArgument(a[0].Repr() + " is not in list");
}
Result<Value> ListCount(Renderer&, const Value& self, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("count", {"value"}));
  int64_t n = 0;
  for (const Value& v : self.as_list()) n += v.Equals(a[0]) ? 1 : 0;
  return Value::Int(n);
}

struct MethodEntry {
  std::string_view name;
  MethodFn fn;  // nullptr: exists in Python but unavailable here
  bool mutating = false;
};

const MethodEntry* FindEntry(const std::vector<MethodEntry>& table, std::string_view name) {
  for (const MethodEntry& e : table) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

const std::vector<MethodEntry>& StrMethods() {
  static const auto* table = new std::vector<MethodEntry>{
      {"startswith", StrStartswith},
      {"endswith", StrEndswith},
      {"split", StrSplit},
      {"rsplit", StrRsplit},
      {"strip", StrStrip},
      {"lstrip", StrLstrip},
      {"rstrip", StrRstrip},
      {"replace", StrReplace},
      {"upper", StrUpper},
      {"lower", StrLower},
      {"title", StrTitle},
      {"capitalize", StrCapitalize},
      {"find", StrFind},
      {"rfind", StrRfind},
      {"index", StrIndex},
      {"count", StrCount},
      {"join", StrJoin},
      {"format", StrFormat},
      {"isdigit", StrIs<CpDigit>},
      {"isnumeric", StrIs<CpDigit>},
      {"isdecimal", StrIs<CpDigit>},
      {"isalpha", StrIs<CpAlpha>},
      {"isalnum", StrIs<CpAlnum>},
      {"isspace", StrIs<CpSpace>},
      {"isupper", StrIsupper},
      {"islower", StrIslower},
      {"splitlines", StrSplitlines},
      {"removeprefix", StrRemoveprefix},
      {"removesuffix", StrRemovesuffix},
      {"casefold", nullptr},
      {"center", nullptr},
      {"encode", nullptr},
      {"expandtabs", nullptr},
      {"format_map", nullptr},
      {"istitle", nullptr},
      {"isidentifier", nullptr},
      {"isprintable", nullptr},
      {"ljust", nullptr},
      {"maketrans", nullptr},
      {"partition", nullptr},
      {"rindex", nullptr},
      {"rjust", nullptr},
      {"rpartition", nullptr},
      {"swapcase", nullptr},
      {"translate", nullptr},
      {"zfill", nullptr},
  };
  return *table;
}

const std::vector<MethodEntry>& DictMethods() {
  static const auto* table = new std::vector<MethodEntry>{
      {"items", DictItems},       {"keys", DictKeys},
      {"values", DictValues},     {"get", DictGet},
      {"copy", Identity},         {"fromkeys", nullptr},
      {"clear", nullptr, true},   {"pop", nullptr, true},
      {"popitem", nullptr, true}, {"setdefault", nullptr, true},
      {"update", nullptr, true},
  };
  return *table;
}

const std::vector<MethodEntry>& ListMethods() {
  static const auto* table = new std::vector<MethodEntry>{
      {"index", ListIndex},       {"count", ListCount},     {"copy", Identity},
      {"append", nullptr, true},  {"clear", nullptr, true}, {"extend", nullptr, true},
      {"insert", nullptr, true},  {"pop", nullptr, true},   {"remove", nullptr, true},
      {"reverse", nullptr, true}, {"sort", nullptr, true},
  };
  return *table;
}

}  // namespace

FilterFn FindFilter(std::string_view name) {
  auto it = Filters().find(name);
  return it == Filters().end() ? nullptr : it->second;
}

TestFn FindTest(std::string_view name) {
  auto it = Tests().find(name);
  return it == Tests().end() ? nullptr : it->second;
}

std::optional<Value> FindGlobal(std::string_view name) {
  static const auto* globals = new std::vector<std::pair<std::string_view, Value>>{
      {"range", MakeFunction("range", GlobalRange)},
      {"namespace", MakeFunction("namespace", GlobalNamespace)},
      {"dict", MakeFunction("dict", GlobalDict)},
      {"raise_exception", MakeFunction("raise_exception", GlobalRaiseException)},
      {"strftime_now", MakeFunction("strftime_now", GlobalStrftimeNow)},
  };
  for (const auto& [n, v] : *globals) {
    if (n == name) return v;
  }
  return std::nullopt;
}

std::optional<Value> FindMethod(const Value& obj, std::string_view name) {
  const std::vector<MethodEntry>* table = nullptr;
  if (obj.is_string()) {
    table = &StrMethods();
  } else if (obj.is_dict()) {
    table = &DictMethods();
  } else if (obj.is_list() && !obj.is_tuple()) {
    table = &ListMethods();
  } else if (obj.is_tuple() && (name == "index" || name == "count")) {
    table = &ListMethods();
  } else {
    return std::nullopt;
  }
  const MethodEntry* e = FindEntry(*table, name);
  if (e == nullptr) return std::nullopt;
  if (e->fn == nullptr) return Unavailable(obj, name, e->mutating);
  return BindMethod(obj, name, e->fn);
}

Result<List> Iterate(const Value& value) {
  switch (value.kind()) {
    case Value::Kind::kUndefined:
      return List{};
    case Value::Kind::kList:
      return value.as_list();
    case Value::Kind::kDict: {
      List keys;
      for (const auto& [k, v] : value.as_dict().items()) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      const std::string& s = value.as_string();
      std::vector<size_t> off = CodepointOffsets(s);
      List chars;
      for (size_t i = 0; i + 1 < off.size(); ++i) {
        chars.push_back(Value::String(s.substr(off[i], off[i + 1] - off[i])));
      }
      return chars;
    }
    default:
      return InvalidArgument("'" + value.TypeName() + "' object is not iterable");
  }
}

Result<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return InvalidArgument("'in <string>' requires string as left operand, not " +
                               item.TypeName());
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.as_list()) {
        if (v.Equals(item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return container.as_dict().Find(item) != nullptr;
    default:
      return InvalidArgument("argument of type '" + container.TypeName() + "' is not iterable");
  }
}

Result<std::string> PercentFormat(const std::string& fmt, const Value& args) {
  List positional;
  const Dict* mapping = nullptr;
  if (args.is_tuple()) {
    positional = args.as_list();
  } else if (args.is_dict()) {
    mapping = &args.as_dict();
  } else {
    positional.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) return InvalidArgument("incomplete format");
    const Value* v = nullptr;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos || mapping == nullptr) {
        return InvalidArgument("format requires a mapping");
      }
      v = mapping->Find(std::string_view(fmt).substr(i + 1, close - i - 1));
      if (v == nullptr) return InvalidArgument("format: missing key");
      i = close + 1;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::strchr("-+ 0#", fmt[i]) != nullptr) spec += fmt[i++];
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) spec += fmt[i++];
    if (i < fmt.size() && fmt[i] == '.') {
      spec += fmt[i++];
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) spec += fmt[i++];
    }
    if (i >= fmt.size()) return InvalidArgument("incomplete format");
    char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (v == nullptr) {
      if (mapping != nullptr && positional.empty()) {
        v = &args;
      } else {
        if (next >= positional.size()) {
          return InvalidArgument("not enough arguments for format string");
        }
        v = &positional[next++];
      }
    }
    char buf[512];
    if (spec.size() > 20) return Unsupported("format spec " + spec);
    switch (conv) {
      case 's':
      case 'r': {
        std::string s = conv == 's' ? v->Str() : v->Repr();
        if (spec == "%") {
          out += s;
        } else {
          spec += 's';
          std::snprintf(buf, sizeof(buf), spec.c_str(), s.c_str());
          out += buf;
        }
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o': {
        if (!v->is_number()) {
          return InvalidArgument("%" + std::string(1, conv) +
                                 " format: a real number is required, not " + v->TypeName());
        }
        long long n = v->is_float() ? static_cast<long long>(v->as_float()) : v->as_int();
        spec += "ll";
        spec += conv == 'i' ? 'd' : conv;
        std::snprintf(buf, sizeof(buf), spec.c_str(), n);
        out += buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!v->is_number()) {
          return InvalidArgument("must be real number, not " + v->TypeName());
        }
        spec += conv;
        std::snprintf(buf, sizeof(buf), spec.c_str(), v->as_float());
        out += buf;
        break;
      }
      default:
        return Unsupported(std::string("format conversion %") + conv);
    }
  }
  if (mapping == nullptr && next < positional.size()) {
    return InvalidArgument("not all arguments converted during string formatting");
  }
  return out;
}

Result<Value> Slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  auto opt_int = [](const Value& v, const char* what) -> Result<std::optional<int64_t>> {
    if (v.is_none() || v.is_undefined()) return std::optional<int64_t>();
    ASSIGN_OR_RETURN(int64_t i, ToInt(v, what));
    return std::optional<int64_t>(i);
  };
  ASSIGN_OR_RETURN(auto step_opt, opt_int(step, "slice step"));
  ASSIGN_OR_RETURN(auto start_opt, opt_int(start, "slice start"));
  ASSIGN_OR_RETURN(auto stop_opt, opt_int(stop, "slice stop"));
  int64_t st = step_opt.value_or(1);
  if (st == 0) return InvalidArgument("slice step cannot be zero");
  std::vector<size_t> off;
  int64_t n;
  if (obj.is_string()) {
    off = CodepointOffsets(obj.as_string());
    n = static_cast<int64_t>(off.size()) - 1;
  } else if (obj.is_list()) {
    n = static_cast<int64_t>(obj.as_list().size());
  } else {
    return InvalidArgument("'" + obj.TypeName() + "' object is not subscriptable");
  }
  auto norm = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    return i;
  };
  int64_t b = norm(start_opt, st > 0 ? 0 : n - 1);
  int64_t e = norm(stop_opt, st > 0 ? n : -1);
  std::vector<int64_t> idx;
  if (st > 0) {
    for (int64_t i = b; i < e; i += st) idx.push_back(i);
  } else {
    for (int64_t i = b; i > e; i += st) idx.push_back(i);
  }
  if (obj.is_string()) {
    const std::string& s = obj.as_string();
    std::string out;
    for (int64_t i : idx) out.append(s, off[i], off[i + 1] - off[i]);
    return Value::String(std::move(out));
  }
  List out;
  for (int64_t i : idx) out.push_back(obj.as_list()[i]);
  return Value::MakeList(std::move(out), obj.is_tuple());
}

Value Index(const Value& obj, int64_t index) {
  if (obj.is_list()) {
    int64_t n = static_cast<int64_t>(obj.as_list().size());
    if (index < 0) index += n;
    if (index < 0 || index >= n) return Value::Undefined("list index out of range");
    return obj.as_list()[index];
  }
  const std::string& s = obj.as_string();
  bool ascii =
      std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (ascii) {
    int64_t n = static_cast<int64_t>(s.size());
    if (index < 0) index += n;
    if (index < 0 || index >= n) return Value::Undefined("string index out of range");
    return Value::String(s.substr(index, 1));
  }
  std::vector<size_t> off = CodepointOffsets(s);
  int64_t n = static_cast<int64_t>(off.size()) - 1;
  if (index < 0) index += n;
  if (index < 0 || index >= n) return Value::Undefined("string index out of range");
  return Value::String(s.substr(off[index], off[index + 1] - off[index]));
}

}  // namespace corolla::jinja
