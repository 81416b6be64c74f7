// jinja2's built-in tests (`x is name(args)`: defined, none, odd, eq, in, sameas, ...) and the
// name -> function table behind FindTest. Not a unit test: those are the *_test.cc files.
#include <string>
#include <unordered_map>

#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/builtins_internal.h"

namespace corolla::jinja {
namespace {

using internal::Lower;
using internal::ToInt;
using internal::Upper;

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

}  // namespace

TestFn FindTest(std::string_view name) {
  auto it = Tests().find(name);
  return it == Tests().end() ? nullptr : it->second;
}

}  // namespace corolla::jinja
