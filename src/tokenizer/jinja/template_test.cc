#include "tokenizer/jinja/template.h"

#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

namespace corolla::jinja {
namespace {

struct GoldenCase {
  const char* name;
  const char* source;
  const char* context;  // JSON; empty for kDefaultContext
  const char* expected;
};

#include "tokenizer/jinja/template_cases.inc"

Result<std::string> RenderText(std::string_view source, const std::string& context_json = "{}") {
  ASSIGN_OR_RETURN(auto t, Template::Parse(source));
  return t->Render(nlohmann::ordered_json::parse(context_json));
}

std::string MustRender(std::string_view source, const std::string& context_json = "{}") {
  Result<std::string> r = RenderText(source, context_json);
  EXPECT_TRUE(r.ok()) << source << "\n -> " << r.status().ToString();
  return r.ok() ? *r : "<error>";
}

Status RenderError(std::string_view source, const std::string& context_json = "{}") {
  Result<std::string> r = RenderText(source, context_json);
  EXPECT_FALSE(r.ok()) << source << "\n rendered: " << (r.ok() ? *r : "");
  return r.ok() ? Status::Ok() : r.status();
}

// Every case of template_cases.py must render exactly as jinja2 rendered it.
TEST(JinjaTemplate, MatchesJinja2Goldens) {
  int num_cases = 0;
  for (const GoldenCase& c : kGoldenCases) {
    ++num_cases;
    std::string context = c.context[0] != '\0' ? c.context : kDefaultContext;
    Result<std::string> r = RenderText(c.source, context);
    ASSERT_TRUE(r.ok()) << c.name << ": " << r.status().ToString();
    EXPECT_EQ(*r, c.expected) << c.name << "\nsource: " << c.source;
  }
  EXPECT_GT(num_cases, 80);
}

TEST(JinjaTemplate, GenerationTagRendersBody) {
  EXPECT_EQ(MustRender("{% generation %}a{{ 1 }}{% endgeneration %}b"), "a1b");
}

TEST(JinjaTemplate, WhitespaceControlEdgeCases) {
  // trim_blocks removes exactly one newline after a block tag, none after {{ }}.
  EXPECT_EQ(MustRender("{% if true %}\n\nx{% endif %}"), "\nx");
  EXPECT_EQ(MustRender("{{ 'a' }}\n"), "a");  // the template's own last newline is dropped
  EXPECT_EQ(MustRender("{{ 'a' }}\n\n"), "a\n");
  // lstrip_blocks only strips when the tag starts the line.
  EXPECT_EQ(MustRender("x  {% if true %}y{% endif %}"), "x  y");
  EXPECT_EQ(MustRender("x\n  {% if true %}y{% endif %}"), "x\ny");
  // {{- strips newlines too; lstrip does not touch variable tags.
  EXPECT_EQ(MustRender("a\n  {{- 'b' }}"), "ab");
  EXPECT_EQ(MustRender("a\n  {{ 'b' }}"), "a\n  b");
}

TEST(JinjaTemplate, UndefinedSemantics) {
  EXPECT_EQ(MustRender("[{{ x }}][{{ x | default('d') }}][{{ x is defined }}]"), "[][d][False]");
  Status s = RenderError("{{ x.y }}");
  EXPECT_NE(s.message().find("'x' is undefined"), std::string::npos) << s.ToString();
  s = RenderError("{{ x + 1 }}");
  EXPECT_NE(s.message().find("'x' is undefined"), std::string::npos) << s.ToString();
  // Missing attributes of defined objects are Undefined, not errors.
  EXPECT_EQ(MustRender("[{{ m.nope }}]", R"({"m": {"a": 1}})"), "[]");
}

TEST(JinjaTemplate, ContextKeyOrderIsKept) {
  EXPECT_EQ(MustRender("{{ d | tojson }}", R"({"d": {"z": 1, "a": 2}})"), R"({"z": 1, "a": 2})");
}

TEST(JinjaTemplate, ErrorsNameTheLine) {
  Result<std::shared_ptr<const Template>> t = Template::Parse("a\n{% foo %}");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(t.status().message().find("line 2"), std::string::npos) << t.status().ToString();
  EXPECT_NE(t.status().message().find("'foo'"), std::string::npos) << t.status().ToString();

  Status s = RenderError("x\n\n{{ 'a' | frobnicate }}");
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("line 3"), std::string::npos) << s.ToString();
  EXPECT_NE(s.message().find("frobnicate"), std::string::npos) << s.ToString();

  s = RenderError("{{ 1 is frobnicated }}");
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("frobnicated"), std::string::npos) << s.ToString();

  s = RenderError("{{ 'abc'.casefold() }}");
  EXPECT_EQ(s.code(), StatusCode::kUnsupported);
  EXPECT_NE(s.message().find("casefold"), std::string::npos) << s.ToString();

  t = Template::Parse("{% for x in y %}\n{% if x %}\nz");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("line 2"), std::string::npos) << t.status().ToString();
  EXPECT_NE(t.status().message().find("endif"), std::string::npos) << t.status().ToString();

  t = Template::Parse("{% for x in y %}\nz");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("line 1"), std::string::npos) << t.status().ToString();
  EXPECT_NE(t.status().message().find("endfor"), std::string::npos) << t.status().ToString();

  for (const char* bad :
       {"{{ 1 + }}", "{% if %}{% endif %}", "{{ 'abc }}", "{{ (1 }}", "{% endif %}", "{% break %}",
        "{# open", "{{ a", "{{ a ]] }}", "{% set x %}", "{{ x[] }}"}) {
    EXPECT_FALSE(Template::Parse(bad).ok()) << bad;
  }
}

TEST(JinjaTemplate, RaiseException) {
  Status s = RenderError("ok\n{{ raise_exception('Conversation roles must alternate') }}");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), "Conversation roles must alternate");
  // Raised inside a macro and a loop, the message still passes through unchanged.
  s = RenderError(
      "{% macro m() %}{% for i in [1] %}{{ raise_exception('bad ' ~ i) }}{% endfor %}"
      "{% endmacro %}{{ m() }}");
  EXPECT_EQ(s.message(), "bad 1");
}

TEST(JinjaTemplate, RuntimeTypeErrors) {
  EXPECT_EQ(RenderError("{{ 'a' + 1 }}").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderError("{{ 1 / 0 }}").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderError("{{ 1 < 'a' }}").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderError("{% for x in 5 %}{% endfor %}").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderError("{{ x | tojson }}").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RenderError("{{ range(1000000) | length }}").code(), StatusCode::kInvalidArgument);
  // The immutable sandbox refuses mutation, as transformers does.
  EXPECT_FALSE(RenderText("{% set l = [1] %}{{ l.append(2) }}").ok());
  EXPECT_FALSE(RenderText("{% set d = {} %}{% set d.x = 1 %}").ok());
}

TEST(JinjaTemplate, RunawayTemplatesStop) {
  // Nested loops: 10^5^3 iterations would take hours.
  Status s = RenderError(
      "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}"
      "{% endfor %}{% endfor %}{% endfor %}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  // Unbounded recursion.
  s = RenderError("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  // Exponential string growth.
  s = RenderError(
      "{% set ns = namespace(s='ab') %}{% for i in range(100) %}{% set ns.s = ns.s + ns.s %}"
      "{% endfor %}{{ ns.s | length }}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  s = RenderError("{{ 'x' * 100000000000 }}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  // indent's width is output too: bounded before the string is made (it threw bad_alloc).
  s = RenderError("{{ 'a\nb' | indent(1000000000000) }}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  s = RenderError("{{ ('x\n' * 100000) | indent(1000, blank=true) }}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  // replace's output is bounded as it grows, not after (10**9 bytes were built first).
  s = RenderError("{{ ('x' * 1000000) | replace('x', 'y' * 1000) }}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  s = RenderError("{{ ('x' * 1000000).replace('', 'y' * 1000) }}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_EQ(MustRender("{{ 'a-b-c' | replace('-', '+', 1) }}|{{ 'ab'.replace('', '.') }}"), "a+b-c|.a.b.");
  // %-format: widths and precisions count code points as Python does, no output is cut at a
  // fixed buffer, and a width past the bound is an error rather than a string of that size.
  EXPECT_EQ(MustRender("{{ '%5s|%-5s|%.2s|%3s|%05d' % ('ab', 'ab', 'abc', '\xc3\xa9', 42) }}"),
            "   ab|ab   |ab|  \xc3\xa9|00042");
  EXPECT_EQ(MustRender("{{ ('%5s' % ('x' * 600)) | length }}|{{ ('%600d' % 1) | length }}"), "600|600");
  s = RenderError("{{ '%99999999999999999s' % 'a' }}");
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  // An empty string or list times a huge count is empty at once (the fuzzer's hang: 10**18
  // empty appends).
  EXPECT_EQ(MustRender("{{ ([] * 1000000000000000000) | length }}|{{ '' * 1000000000000000000 }}|"
                       "{{ (() * 1000000000000000000) | length }}"),
            "0||0");
  // Limits are configurable.
  auto t = Template::Parse("{% for i in range(100) %}{{ i }}{% endfor %}");
  ASSERT_TRUE(t.ok());
  RenderLimits tight;
  tight.max_steps = 50;
  EXPECT_EQ((*t)->Render(nlohmann::json::object(), tight).status().code(),
            StatusCode::kResourceExhausted);
  tight = RenderLimits();
  tight.max_output_bytes = 10;
  EXPECT_EQ((*t)->Render(nlohmann::json::object(), tight).status().code(),
            StatusCode::kResourceExhausted);
}

TEST(JinjaTemplate, DeepNestingIsAnErrorNotACrash) {
  std::string deep(5000, '(');
  EXPECT_FALSE(Template::Parse("{{ " + deep + "1" + std::string(5000, ')') + " }}").ok());
  std::string blocks;
  for (int i = 0; i < 1000; ++i) blocks += "{% if true %}";
  EXPECT_FALSE(Template::Parse(blocks).ok());
  std::string nots;
  for (int i = 0; i < 5000; ++i) nots += "not ";
  EXPECT_FALSE(Template::Parse("{{ " + nots + "1 }}").ok());
}

TEST(JinjaTemplate, StrftimeNow) {
  std::string year = MustRender("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

TEST(JinjaTemplate, RenderIsThreadSafe) {
  auto t = Template::Parse(
      "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m %}{% endfor %}"
      "{{ ns.n }}");
  ASSERT_TRUE(t.ok());
  std::vector<std::thread> threads;
  std::vector<std::string> results(8);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      nlohmann::json ctx = {{"messages", std::vector<int>(1000, i)}};
      for (int k = 0; k < 20; ++k) {
        Result<std::string> r = (*t)->Render(ctx);
        results[i] = r.ok() ? *r : r.status().ToString();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int i = 0; i < 8; ++i) EXPECT_EQ(results[i], std::to_string(1000 * i));
}

TEST(JinjaValue, PythonFloatRepr) {
  EXPECT_EQ(PythonFloatRepr(1.0), "1.0");
  EXPECT_EQ(PythonFloatRepr(0.1), "0.1");
  EXPECT_EQ(PythonFloatRepr(1e16), "1e+16");
  EXPECT_EQ(PythonFloatRepr(1234567890123456.0), "1234567890123456.0");
  EXPECT_EQ(PythonFloatRepr(1e-5), "1e-05");
  EXPECT_EQ(PythonFloatRepr(0.0001), "0.0001");
  EXPECT_EQ(PythonFloatRepr(-2.5e-7), "-2.5e-07");
  EXPECT_EQ(PythonFloatRepr(1.5e300), "1.5e+300");
  EXPECT_EQ(PythonFloatRepr(123.456), "123.456");
}

TEST(JinjaValue, DumpJsonMatchesPython) {
  Value v = Value::FromJson(nlohmann::ordered_json::parse(
      R"({"b": [1, 2.0, "x\u0001é"], "a": {}, "c": [], "d": null, "e": true})"));
  JsonDumpOptions compact;
  EXPECT_EQ(*DumpJson(v, compact),
            R"({"b": [1, 2.0, "x\u0001é"], "a": {}, "c": [], "d": null, "e": true})");
  JsonDumpOptions indented;
  indented.indent = "  ";
  indented.item_separator = ",";
  EXPECT_EQ(*DumpJson(v, indented),
            "{\n  \"b\": [\n    1,\n    2.0,\n    \"x\\u0001\xC3\xA9\"\n  ],\n  \"a\": {},\n"
            "  \"c\": [],\n  \"d\": null,\n  \"e\": true\n}");
  JsonDumpOptions ascii;
  ascii.ensure_ascii = true;
  EXPECT_EQ(*DumpJson(Value::String("é😀"), ascii), R"("\u00e9\ud83d\ude00")");
}

}  // namespace
}  // namespace corolla::jinja
