// jinja2's built-in filters (`x | name(args)`), as transformers' chat-template sandbox sees
// them, and the name -> function table behind FindFilter.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/renderer.h"

namespace corolla::jinja {
namespace internal {

Result<Value> FilterItems(Renderer&, const Value& v, const CallArgs&) {
  if (v.is_undefined()) return Value::MakeList({});
  if (!v.is_dict()) return InvalidArgument("Can only get item pairs from a mapping.");
  List items;
  for (const auto& [k, val] : v.as_dict().items()) items.push_back(Value::MakeList({k, val}, true));
  return Value::MakeList(std::move(items));
}

}  // namespace internal

namespace {

using internal::Capitalize;
using internal::CodepointOffsets;
using internal::FilterItems;
using internal::GetAttrPath;
using internal::HtmlEscape;
using internal::JinjaTitle;
using internal::Kwarg;
using internal::Lower;
using internal::ParseFloat;
using internal::ParseInt;
using internal::Replace;
using internal::SortKey;
using internal::SortValues;
using internal::Strip;
using internal::StripSide;
using internal::ToStr;
using internal::Upper;

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

Result<Value> FilterIndent(Renderer& r, const Value& v, const CallArgs& args) {
  ASSIGN_OR_RETURN(auto a, args.Bind("indent", {"width", "first", "blank"}));
  const int64_t width = a[0].is_undefined() || a[0].is_string()
                            ? 4
                            : std::max<int64_t>(0, a[0].is_number() ? a[0].as_int() : 4);
  RETURN_IF_ERROR(r.CheckSize(static_cast<uint64_t>(width)));  // before a width of 10**12 is allocated
  std::string indent = a[0].is_string() ? a[0].as_string() : std::string(width, ' ');
  std::string s = v.Str() + "\n";
  std::vector<std::string> lines;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t nl = s.find('\n', pos);
    lines.push_back(s.substr(pos, nl - pos));
    pos = nl + 1;
  }
  // Every line may take the indent: the output's bound before it is built.
  RETURN_IF_ERROR(r.CheckSize(s.size() + static_cast<uint64_t>(lines.size()) * indent.size()));
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
  std::optional<std::string> out = Replace(v.Str(), old, with, count, r.max_output_bytes());
  if (!out) return r.CheckSize(r.max_output_bytes() + 1);  // the limit's error
  return Value::String(std::move(*out));
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

}  // namespace

FilterFn FindFilter(std::string_view name) {
  auto it = Filters().find(name);
  return it == Filters().end() ? nullptr : it->second;
}


}  // namespace corolla::jinja
