// The global functions a chat template can call: jinja2's range, namespace and dict, and
// transformers' raise_exception and strftime_now; FindGlobal looks them up by name.
#include <ctime>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/builtins_internal.h"
#include "tokenizer/jinja/renderer.h"

namespace corolla::jinja {
namespace {

using internal::MakeFunction;
using internal::ToInt;
using internal::ToStr;

constexpr int64_t kMaxRange = 100000;  // jinja2.sandbox.MAX_RANGE

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

}  // namespace

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

}  // namespace corolla::jinja
