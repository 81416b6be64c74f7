// The built-in library of the interpreter: jinja2's filters and tests, the globals transformers
// provides (range, namespace, dict, raise_exception, strftime_now), and Python methods of str,
// dict and list. Internal to corolla_jinja; all functions are pure apart from their arguments.
// Implemented in filters.cc, jinja_tests.cc, globals.cc, methods.cc and builtins.cc, with the
// helpers they share in builtins_internal.h.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "tokenizer/jinja/value.h"

namespace corolla::jinja {

class Renderer;

using FilterFn = Result<Value> (*)(Renderer& r, const Value& input, const CallArgs& args);
using TestFn = Result<bool> (*)(Renderer& r, const Value& input, const CallArgs& args);

// nullptr when there is no such filter/test.
FilterFn FindFilter(std::string_view name);
TestFn FindTest(std::string_view name);
// A global function (range, namespace, ...), or nullopt.
std::optional<Value> FindGlobal(std::string_view name);
// `obj.name` as a bound method of a str, dict or list, or nullopt when Python has no such
// method. Methods we lack, and methods that mutate (forbidden in transformers' immutable
// sandbox), are returned as callables that fail with Unsupported/InvalidArgument.
std::optional<Value> FindMethod(const Value& obj, std::string_view name);

// Python iteration: list items, dict keys, string code points; Undefined is empty.
Result<List> Iterate(const Value& value);
// Python `item in container`.
Result<bool> Contains(const Value& container, const Value& item);
// Python `fmt % args` for the common conversions (%s %r %d %i %f %x %%).
Result<std::string> PercentFormat(const std::string& fmt, const Value& args);
// Python slicing of a str (by code point), list or tuple; bounds may be None/Undefined.
Result<Value> Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);
// Python indexing of a str or list (negative from the end); Undefined when out of range.
Value Index(const Value& obj, int64_t index);

}  // namespace corolla::jinja
