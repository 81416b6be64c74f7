// Helpers shared by the files of the built-in library (filters.cc, jinja_tests.cc, globals.cc,
// methods.cc): Python str semantics on UTF-8 (py_string.cc) and argument handling (builtins.cc).
// Private to corolla_jinja; include builtins.h for the public surface. All functions are pure.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/value.h"

namespace corolla::jinja::internal {

// --- Python str semantics on UTF-8 (py_string.cc) ---

bool IsPyWhitespace(uint32_t cp);
bool IsAsciiAlpha(char c);
// Byte offsets of each code point of s, plus s.size().
std::vector<size_t> CodepointOffsets(std::string_view s);
std::vector<uint32_t> Codepoints(std::string_view s);
void AppendUtf8(uint32_t cp, std::string& out);

enum class StripSide { kLeft = 1, kRight = 2, kBoth = 3 };
// str.strip/lstrip/rstrip; `chars` is a str of code points to strip, else whitespace.
std::string Strip(std::string_view s, const Value& chars, StripSide side);

// Simple case mapping (see ToUpperCp in py_string.cc for the scripts covered).
std::string Lower(std::string_view s);
std::string Upper(std::string_view s);
std::string Capitalize(std::string_view s);
// Python str.title(): a cased letter after an uncased character starts a word.
std::string PyTitle(std::string_view s);
// jinja2's title filter: words start after spaces and -({[<.
std::string JinjaTitle(std::string_view s);

// str.replace; count < 0 replaces all. Nothing once the output passes max_bytes (a huge `with`
// times many matches is never built).
std::optional<std::string> Replace(std::string_view s, std::string_view old, std::string_view with, int64_t count,
                                   size_t max_bytes);
// str.split / str.rsplit; sep None or Undefined splits on runs of whitespace.
Result<List> Split(std::string_view s, const Value& sep, int64_t maxsplit, bool from_right);
std::string HtmlEscape(std::string_view s);
// Python int(str, base) / float(str); nullopt when Python would raise ValueError.
std::optional<int64_t> ParseInt(std::string_view s, int base);
std::optional<double> ParseFloat(std::string_view s);

// --- argument helpers (builtins.cc) ---

Result<int64_t> ToInt(const Value& v, const char* what);
Result<std::string> ToStr(const Value& v, const char* what);
// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then index 0.
Result<Value> GetAttrPath(Renderer& r, const Value& item, const Value& attribute);
// The keyword argument `name`, or nullptr.
const Value* Kwarg(const CallArgs& args, std::string_view name);
// Comparison key for sort/min/max/unique/dictsort: lower-cased strings unless case_sensitive.
Value SortKey(const Value& v, bool case_sensitive);
// Stable sort of items by keys[i]; the first failed comparison is the error.
Result<List> SortValues(List items, const std::vector<Value>& keys, bool reverse);
// A callable Value named `name` (globals and bound methods).
Value MakeFunction(std::string name, std::function<Result<Value>(Renderer&, const CallArgs&)> fn);

// --- filters shared with methods (filters.cc) ---

// The `items` filter, which is also dict.items().
Result<Value> FilterItems(Renderer& r, const Value& v, const CallArgs& args);

}  // namespace corolla::jinja::internal
