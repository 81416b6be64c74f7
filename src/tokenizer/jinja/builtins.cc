// Argument helpers shared by the built-in library, and the Python operations the renderer calls
// directly: iteration, `in`, `%` formatting, slicing and indexing (declared in builtins.h).
#include "tokenizer/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstring>

#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/renderer.h"

namespace corolla::jinja {
namespace internal {

Result<int64_t> ToInt(const Value& v, const char* what) {
  if (v.is_int() || v.is_bool()) return v.as_int();
  return InvalidArgument(std::string(what) + " must be an integer, not " + v.TypeName());
}

Result<std::string> ToStr(const Value& v, const char* what) {
  if (v.is_string()) return v.as_string();
  return InvalidArgument(std::string(what) + " must be a string, not " + v.TypeName());
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

Value MakeFunction(std::string name, std::function<Result<Value>(Renderer&, const CallArgs&)> fn) {
  auto c = std::make_shared<Callable>();
  c->name = std::move(name);
  c->fn = std::move(fn);
  return Value::MakeCallable(std::move(c));
}

}  // namespace internal

using internal::CodepointOffsets;
using internal::ToInt;

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

// A %-format's width or precision past this is an error, not a string of that size.
constexpr int64_t kMaxFormatWidth = 1 << 20;

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
    if (spec.size() > 20) return Unsupported("format spec " + spec);
    // Width and precision (the digits after the flags, after the '.'), bounded: a width is output.
    auto number = [](std::string_view d) {  // saturates past kMaxFormatWidth
      int64_t n = 0;
      for (char ch : d) n = std::min<int64_t>(n * 10 + (ch - '0'), kMaxFormatWidth + 1);
      return n;
    };
    const size_t digits = spec.find_first_not_of("%-+ 0#"), dot = spec.find('.');
    const std::string_view spec_view(spec);
    const int64_t width = digits == std::string::npos ? 0 : number(spec_view.substr(digits, dot - digits));
    const int64_t precision = dot == std::string::npos ? -1 : number(spec_view.substr(dot + 1));
    if (width > kMaxFormatWidth || precision > kMaxFormatWidth) {
      return ResourceExhausted("format spec " + spec + ": a width or precision over " + std::to_string(kMaxFormatWidth));
    }
    // printf of one value into a string of its length (no fixed buffer to cut it short).
    auto print = [&](const std::string& f, auto x) {
      const int n = std::snprintf(nullptr, 0, f.c_str(), x);
      std::string text(n > 0 ? n : 0, '\0');
      if (n > 0) std::snprintf(text.data(), text.size() + 1, f.c_str(), x);
      out += text;
    };
    switch (conv) {
      case 's':
      case 'r': {
        // Python counts code points: precision cuts, width pads ('-': on the right).
        std::string s = conv == 's' ? v->Str() : v->Repr();
        std::vector<size_t> off = CodepointOffsets(s);
        int64_t chars = static_cast<int64_t>(off.size()) - 1;
        if (precision >= 0 && precision < chars) {
          s.resize(off[precision]);
          chars = precision;
        }
        const std::string pad(static_cast<size_t>(std::max<int64_t>(0, width - chars)), ' ');
        out += spec.find('-') != std::string::npos ? s + pad : pad + s;
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
        print(spec, n);
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
        print(spec, v->as_float());
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
