#include "tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace corolla::jinja {
namespace {

constexpr int kMaxReprDepth = 64;

void AppendHex(std::string& out, const char* prefix, uint32_t value, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "%0*x", digits, value);
  out += prefix;
  out += buf;
}

// Python's str.isprintable() for the code points a chat is likely to hold; unassigned code
// points count as printable here (we carry no Unicode tables).
bool IsPrintable(uint32_t cp) {
  if (cp < 0x20 || cp == 0x7F) return false;
  if (cp >= 0x80 && cp <= 0xA0) return false;
  if (cp == 0xAD || cp == 0x1680 || cp == 0x202F || cp == 0x205F || cp == 0x3000) return false;
  if (cp >= 0x2000 && cp <= 0x200F) return false;
  if (cp >= 0x2028 && cp <= 0x202E) return false;
  if (cp >= 0x2060 && cp <= 0x206F) return false;
  if (cp == 0xFEFF || (cp >= 0xE000 && cp <= 0xF8FF)) return false;
  return true;
}

std::string StringRepr(std::string_view s) {
  bool has_single = s.find('\'') != std::string_view::npos;
  bool has_double = s.find('"') != std::string_view::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    uint32_t cp = DecodeUtf8(s, &i);
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == static_cast<uint32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (!IsPrintable(cp)) {
      if (cp <= 0xFF) {
        AppendHex(out, "\\x", cp, 2);
      } else if (cp <= 0xFFFF) {
        AppendHex(out, "\\u", cp, 4);
      } else {
        AppendHex(out, "\\U", cp, 8);
      }
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  out += quote;
  return out;
}

std::string ReprImpl(const Value& v, int depth);

std::string ReprImpl(const Value& v, int depth) {
  if (depth > kMaxReprDepth) return "...";
  switch (v.kind()) {
    case Value::Kind::kString:
      return StringRepr(v.as_string());
    case Value::Kind::kList: {
      std::string out = v.is_tuple() ? "(" : "[";
      const List& items = v.as_list();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += ReprImpl(items[i], depth + 1);
      }
      if (v.is_tuple() && items.size() == 1) out += ",";
      out += v.is_tuple() ? ")" : "]";
      return out;
    }
    case Value::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [key, value] : v.as_dict().items()) {
        if (!first) out += ", ";
        first = false;
        out += ReprImpl(key, depth + 1);
        out += ": ";
        out += ReprImpl(value, depth + 1);
      }
      return out + "}";
    }
    case Value::Kind::kUndefined:
      return "Undefined";
    default:
      return v.Str();
  }
}

void DumpJsonString(std::string_view s, bool ensure_ascii, std::string& out) {
  out += '"';
  size_t i = 0;
  while (i < s.size()) {
    size_t start = i;
    uint32_t cp = DecodeUtf8(s, &i);
    switch (cp) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
      if (cp >= 0x10000) {
        uint32_t v = cp - 0x10000;
        AppendHex(out, "\\u", 0xD800 + (v >> 10), 4);
        AppendHex(out, "\\u", 0xDC00 + (v & 0x3FF), 4);
      } else {
        AppendHex(out, "\\u", cp, 4);
      }
    } else {
      out.append(s.substr(start, i - start));
    }
  }
  out += '"';
}

Result<std::string> JsonKey(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString:
      return key.as_string();
    case Value::Kind::kInt:
      return std::to_string(key.as_int());
    case Value::Kind::kFloat:
      return PythonFloatRepr(key.as_float());
    case Value::Kind::kBool:
      return std::string(key.as_bool() ? "true" : "false");
    case Value::Kind::kNone:
      return std::string("null");
    default:
      return InvalidArgument("tojson: keys must be str, int, float, bool or None, not " +
                             key.TypeName());
  }
}

Status DumpJsonImpl(const Value& v, const JsonDumpOptions& opt, int depth, std::string& out) {
  if (depth > kMaxReprDepth) return InvalidArgument("tojson: value nested too deeply");
  auto newline = [&](int level) {
    if (!opt.indent) return;
    out += '\n';
    for (int i = 0; i < level; ++i) out += *opt.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return Status::Ok();
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return Status::Ok();
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return Status::Ok();
    case Value::Kind::kFloat: {
      double d = v.as_float();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += PythonFloatRepr(d);
      }
      return Status::Ok();
    }
    case Value::Kind::kString:
      DumpJsonString(v.as_string(), opt.ensure_ascii, out);
      return Status::Ok();
    case Value::Kind::kList: {
      const List& items = v.as_list();
      if (items.empty()) {
        out += "[]";
        return Status::Ok();
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += opt.item_separator;
        newline(depth + 1);
        RETURN_IF_ERROR(DumpJsonImpl(items[i], opt, depth + 1, out));
      }
      newline(depth);
      out += ']';
      return Status::Ok();
    }
    case Value::Kind::kDict: {
      const auto& items = v.as_dict().items();
      if (items.empty()) {
        out += "{}";
        return Status::Ok();
      }
      std::vector<std::pair<std::string, const Value*>> entries;
      entries.reserve(items.size());
      for (const auto& [key, value] : items) {
        ASSIGN_OR_RETURN(std::string k, JsonKey(key));
        entries.emplace_back(std::move(k), &value);
      }
      if (opt.sort_keys) {
        bool all_strings = std::all_of(items.begin(), items.end(),
                                       [](const auto& kv) { return kv.first.is_string(); });
        if (!all_strings) return Unsupported("tojson: sort_keys with non-string keys");
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += opt.item_separator;
        newline(depth + 1);
        DumpJsonString(entries[i].first, opt.ensure_ascii, out);
        out += opt.key_separator;
        RETURN_IF_ERROR(DumpJsonImpl(*entries[i].second, opt, depth + 1, out));
      }
      newline(depth);
      out += '}';
      return Status::Ok();
    }
    default:
      return InvalidArgument("tojson: Object of type " + v.TypeName() +
                             " is not JSON serializable");
  }
}

}  // namespace

uint32_t DecodeUtf8(std::string_view s, size_t* i) {
  auto c = static_cast<unsigned char>(s[*i]);
  int extra = c < 0x80 ? 0 : (c >> 5) == 0x6 ? 1 : (c >> 4) == 0xE ? 2 : (c >> 3) == 0x1E ? 3 : -1;
  if (extra <= 0 || *i + extra >= s.size()) {
    ++*i;
    return c;
  }
  uint32_t cp = c & (0x3F >> extra);
  for (int k = 1; k <= extra; ++k) {
    auto cc = static_cast<unsigned char>(s[*i + k]);
    if ((cc & 0xC0) != 0x80) {
      ++*i;
      return c;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  *i += extra + 1;
  return cp;
}

Value Value::Undefined(std::string hint) {
  Value v(Kind::kUndefined);
  if (!hint.empty()) v.data_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::Bool(bool b) {
  Value v(Kind::kBool);
  v.data_ = b;
  return v;
}
Value Value::Int(int64_t i) {
  Value v(Kind::kInt);
  v.data_ = i;
  return v;
}
Value Value::Float(double d) {
  Value v(Kind::kFloat);
  v.data_ = d;
  return v;
}
Value Value::String(std::string s) {
  Value v(Kind::kString);
  v.data_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::MakeList(List items, bool is_tuple) {
  Value v(Kind::kList);
  v.is_tuple_ = is_tuple;
  v.data_ = std::make_shared<const List>(std::move(items));
  return v;
}
Value Value::MakeDict(std::shared_ptr<const Dict> dict) {
  Value v(Kind::kDict);
  v.data_ = std::move(dict);
  return v;
}
Value Value::MakeObject(std::shared_ptr<Object> object) {
  Value v(Kind::kObject);
  v.data_ = std::move(object);
  return v;
}
Value Value::MakeCallable(std::shared_ptr<const Callable> callable) {
  Value v(Kind::kCallable);
  v.data_ = std::move(callable);
  return v;
}

int64_t Value::as_int() const {
  if (kind_ == Kind::kBool) return as_bool() ? 1 : 0;
  return std::get<int64_t>(data_);
}

double Value::as_float() const {
  if (kind_ == Kind::kFloat) return std::get<double>(data_);
  return static_cast<double>(as_int());
}

const std::string& Value::undefined_hint() const {
  static const std::string kEmpty;
  if (const auto* p = std::get_if<StrPtr>(&data_)) return **p;
  return kEmpty;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return as_bool();
    case Kind::kInt:
      return as_int() != 0;
    case Kind::kFloat:
      return as_float() != 0.0;
    case Kind::kString:
      return !as_string().empty();
    case Kind::kList:
      return !as_list().empty();
    case Kind::kDict:
      return as_dict().size() != 0;
    default:
      return true;
  }
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return is_tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kObject:
      return as_object().TypeName();
    case Kind::kCallable:
      return "function";
  }
  return "object";
}

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return as_bool() ? "True" : "False";
    case Kind::kInt:
      return std::to_string(as_int());
    case Kind::kFloat:
      return PythonFloatRepr(as_float());
    case Kind::kString:
      return as_string();
    case Kind::kList:
    case Kind::kDict:
      return ReprImpl(*this, 0);
    case Kind::kObject:
      return as_object().Repr();
    case Kind::kCallable:
      return "<function " + as_callable().name + ">";
  }
  return "";
}

std::string Value::Repr() const { return ReprImpl(*this, 0); }

bool Value::Equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (is_float() || other.is_float()) return as_float() == other.as_float();
    return as_int() == other.as_int();
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return as_string() == other.as_string();
    case Kind::kList: {
      if (is_tuple_ != other.is_tuple_) return false;
      const List& a = as_list();
      const List& b = other.as_list();
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); ++i) {
        if (!a[i].Equals(b[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      const Dict& a = as_dict();
      const Dict& b = other.as_dict();
      if (a.size() != b.size()) return false;
      for (const auto& [key, value] : a.items()) {
        const Value* found = b.Find(key);
        if (found == nullptr || !found->Equals(value)) return false;
      }
      return true;
    }
    case Kind::kObject:
      return &as_object() == &other.as_object();
    case Kind::kCallable:
      return &as_callable() == &other.as_callable();
    default:
      return false;
  }
}

Result<bool> Value::Less(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (is_float() || other.is_float()) return as_float() < other.as_float();
    return as_int() < other.as_int();
  }
  if (is_string() && other.is_string()) return as_string() < other.as_string();
  if (is_list() && other.is_list() && is_tuple_ == other.is_tuple_) {
    const List& a = as_list();
    const List& b = other.as_list();
    for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
      if (a[i].Equals(b[i])) continue;
      return a[i].Less(b[i]);
    }
    return a.size() < b.size();
  }
  return InvalidArgument("'<' not supported between instances of '" + TypeName() + "' and '" +
                         other.TypeName() + "'");
}

const Value* Dict::Find(const Value& key) const {
  for (const auto& [k, v] : items_) {
    if (k.Equals(key)) return &v;
  }
  return nullptr;
}

const Value* Dict::Find(std::string_view key) const {
  for (const auto& [k, v] : items_) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (auto& [k, v] : items_) {
    if (k.Equals(key)) {
      v = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
}

Status Object::SetAttr(std::string_view name, Value value) {
  return InvalidArgument("cannot assign attribute '" + std::string(name) + "' on a " + TypeName() +
                         " object (only namespace() objects accept attribute assignment)");
}

std::optional<Value> Namespace::GetAttr(std::string_view name) const {
  if (const Value* v = attrs_.Find(name)) return *v;
  return std::nullopt;
}

Status Namespace::SetAttr(std::string_view name, Value value) {
  attrs_.Set(Value::String(std::string(name)), std::move(value));
  return Status::Ok();
}

std::string Namespace::Repr() const {
  std::string out = "<Namespace {";
  bool first = true;
  for (const auto& [key, value] : attrs_.items()) {
    if (!first) out += ", ";
    first = false;
    out += key.Repr() + ": " + (value.is_object() ? std::string("<object>") : value.Repr());
  }
  return out + "}>";
}

Result<std::vector<Value>> CallArgs::Bind(std::string_view function,
                                          const std::vector<std::string_view>& names) const {
  std::vector<Value> bound(names.size());
  std::vector<bool> set(names.size(), false);
  if (positional.size() > names.size()) {
    return InvalidArgument(std::string(function) + "() takes at most " +
                           std::to_string(names.size()) + " arguments (" +
                           std::to_string(positional.size()) + " given)");
  }
  for (size_t i = 0; i < positional.size(); ++i) {
    bound[i] = positional[i];
    set[i] = true;
  }
  for (const auto& [name, value] : keyword) {
    auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) {
      return InvalidArgument(std::string(function) + "() got an unexpected keyword argument '" +
                             name + "'");
    }
    size_t idx = it - names.begin();
    if (set[idx]) {
      return InvalidArgument(std::string(function) + "() got multiple values for argument '" +
                             name + "'");
    }
    bound[idx] = value;
    set[idx] = true;
  }
  return bound;
}

Result<std::string> DumpJson(const Value& value, const JsonDumpOptions& options) {
  std::string out;
  RETURN_IF_ERROR(DumpJsonImpl(value, options, 0, out));
  return out;
}

std::string PythonFloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form: "-d.ddddde+XX".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string mantissa = sci.substr(0, e);
  int exponent = std::stoi(sci.substr(e + 1));
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits[0];
    if (digits.size() > 1) out += "." + digits.substr(1);
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    out += ebuf;
  } else if (exponent < 0) {
    out += "0." + std::string(-exponent - 1, '0') + digits;
  } else {
    size_t int_digits = exponent + 1;
    if (digits.size() <= int_digits) {
      out += digits + std::string(int_digits - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, int_digits) + "." + digits.substr(int_digits);
    }
  }
  return out;
}

size_t Utf8Length(std::string_view s) {
  size_t n = 0;
  size_t i = 0;
  while (i < s.size()) {
    DecodeUtf8(s, &i);
    ++n;
  }
  return n;
}

}  // namespace corolla::jinja
