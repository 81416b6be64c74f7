// Value: the dynamic value of the Jinja interpreter, modelled on the Python objects jinja2 sees
// (Undefined distinct from None, bool/int/float, str, list/tuple, insertion-ordered dict,
// namespace and loop objects, callables). Strings, lists and dicts are immutable and shared, so
// copying a Value is cheap; only Object (namespace) state is mutable, and it is per render.
// A Value is not thread-safe to mutate, but immutable values may be read from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "base/status.h"

namespace corolla::jinja {

class Value;
class Dict;
class Object;
struct Callable;
class Renderer;

using List = std::vector<Value>;

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,  // also tuples (is_tuple()), which differ only in how they print
    kDict,
    kObject,    // namespace(), loop
    kCallable,  // macros, globals, bound methods
  };

  Value() : kind_(Kind::kUndefined) {}            // Undefined
  static Value Undefined(std::string hint = {});  // hint: "'x' is undefined" for errors
  static Value None() { return Value(Kind::kNone); }
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double d);
  static Value String(std::string s);
  static Value MakeList(List items, bool is_tuple = false);
  static Value MakeDict(std::shared_ptr<const Dict> dict);
  static Value MakeObject(std::shared_ptr<Object> object);
  static Value MakeCallable(std::shared_ptr<const Callable> callable);

  template <typename Json>
  static Value FromJson(const Json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // int, float or bool: Python's numbers.Number (bool is an int subclass).
  bool is_number() const { return is_int() || is_float() || is_bool(); }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && is_tuple_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_object() const { return kind_ == Kind::kObject; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return std::get<bool>(data_); }
  int64_t as_int() const;   // bool or int
  double as_float() const;  // bool, int or float
  const std::string& as_string() const { return *std::get<StrPtr>(data_); }
  const List& as_list() const { return *std::get<ListPtr>(data_); }
  const Dict& as_dict() const { return *std::get<DictPtr>(data_); }
  Object& as_object() const { return *std::get<ObjPtr>(data_); }
  const Callable& as_callable() const { return *std::get<FnPtr>(data_); }
  const std::string& undefined_hint() const;

  // Python truthiness.
  bool Truthy() const;
  // Python type name for messages ("str", "int", "dict", ...).
  std::string TypeName() const;
  // What {{ value }} prints: str(value), with Undefined as "".
  std::string Str() const;
  // Python repr(value), as in printing a list of strings.
  std::string Repr() const;
  // Python `==` (1 == 1.0 == True; lists elementwise; dicts ignoring order).
  bool Equals(const Value& other) const;
  // Python `<`; error for unorderable types.
  Result<bool> Less(const Value& other) const;

 private:
  using StrPtr = std::shared_ptr<const std::string>;
  using ListPtr = std::shared_ptr<const List>;
  using DictPtr = std::shared_ptr<const Dict>;
  using ObjPtr = std::shared_ptr<Object>;
  using FnPtr = std::shared_ptr<const Callable>;

  explicit Value(Kind kind) : kind_(kind) {}

  Kind kind_;
  bool is_tuple_ = false;
  std::variant<std::monostate, bool, int64_t, double, StrPtr, ListPtr, DictPtr, ObjPtr, FnPtr>
      data_;
};

// An insertion-ordered mapping with Python key equality. Lookups are linear: template dicts
// are small (message fields, tool schemas).
class Dict {
 public:
  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
  // Replaces the value of an existing key in place, else appends.
  void Set(Value key, Value value);
  const std::vector<std::pair<Value, Value>>& items() const { return items_; }
  size_t size() const { return items_.size(); }

 private:
  std::vector<std::pair<Value, Value>> items_;
};

// Native objects with attributes: namespace() (mutable attributes) and the loop variable.
class Object {
 public:
  virtual ~Object() = default;
  virtual std::string TypeName() const = 0;
  // nullopt when there is no such attribute.
  virtual std::optional<Value> GetAttr(std::string_view name) const = 0;
  // Only namespaces accept assignment (`{% set ns.x = ... %}`).
  virtual Status SetAttr(std::string_view name, Value value);
  virtual std::string Repr() const { return "<" + TypeName() + " object>"; }
};

class Namespace final : public Object {
 public:
  std::string TypeName() const override { return "Namespace"; }
  std::optional<Value> GetAttr(std::string_view name) const override;
  Status SetAttr(std::string_view name, Value value) override;
  std::string Repr() const override;

 private:
  Dict attrs_;
};

// Call arguments as written: positional then keyword.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // Binds arguments to `names` Python-style (positional first, then by keyword); missing ones
  // stay Undefined. Errors on unknown keywords, duplicates, or too many positional arguments.
  Result<std::vector<Value>> Bind(std::string_view function,
                                  const std::vector<std::string_view>& names) const;
};

// A function callable from templates. `renderer` gives access to the render in progress
// (macros render their bodies through it).
struct Callable {
  std::string name;
  std::function<Result<Value>(Renderer& renderer, const CallArgs& args)> fn;
};

// json.dumps(value, ensure_ascii=..., indent=..., separators=..., sort_keys=...) as Python
// writes it. `indent`: nullopt for a single line, else the string repeated per level.
struct JsonDumpOptions {
  std::optional<std::string> indent;
  std::string item_separator = ", ";  // Python's default; "," when indent is set
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
Result<std::string> DumpJson(const Value& value, const JsonDumpOptions& options);

// Python's repr() of a float ("1.0", "1e+16", "0.30000000000000004", "inf", "nan").
std::string PythonFloatRepr(double d);

// Decodes the UTF-8 code point at s[*i] and advances *i past it; a byte that does not start a
// valid sequence decodes as itself (one byte).
uint32_t DecodeUtf8(std::string_view s, size_t* i);

// Number of code points in UTF-8 `s` (Python len of a str).
size_t Utf8Length(std::string_view s);

template <typename Json>
Value Value::FromJson(const Json& json) {
  switch (json.type()) {
    case nlohmann::json::value_t::null:
      return None();
    case nlohmann::json::value_t::boolean:
      return Bool(json.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Int(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      uint64_t u = json.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Float(static_cast<double>(u));
      return Int(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Float(json.template get<double>());
    case nlohmann::json::value_t::string:
      return String(json.template get<std::string>());
    case nlohmann::json::value_t::array: {
      List items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(FromJson(item));
      return MakeList(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      auto dict = std::make_shared<Dict>();
      for (auto it = json.begin(); it != json.end(); ++it) {
        dict->Set(String(it.key()), FromJson(it.value()));
      }
      return MakeDict(std::move(dict));
    }
    default:  // binary, discarded
      return None();
  }
}

}  // namespace corolla::jinja
