// Python methods of str, dict and list (`s.strip()`, `d.items()`, `l.index(x)`), bound by
// FindMethod; mutating methods fail, as in transformers' immutable sandbox.
#include <algorithm>
#include <cctype>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/renderer.h"

namespace corolla::jinja {
namespace {

using internal::Capitalize;
using internal::CodepointOffsets;
using internal::Codepoints;
using internal::FilterItems;
using internal::IsAsciiAlpha;
using internal::IsPyWhitespace;
using internal::Kwarg;
using internal::Lower;
using internal::MakeFunction;
using internal::PyTitle;
using internal::Replace;
using internal::Split;
using internal::Strip;
using internal::StripSide;
using internal::ToInt;
using internal::ToStr;
using internal::Upper;

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
  std::optional<std::string> out = Replace(self.as_string(), old, with, count, r.max_output_bytes());
  if (!out) return r.CheckSize(r.max_output_bytes() + 1);  // the limit's error
  return Value::String(std::move(*out));
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

}  // namespace corolla::jinja
