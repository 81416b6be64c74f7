// Template: a parsed Jinja template, rendered as jinja2 renders chat templates for transformers
// (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the generation tag,
// and the raise_exception / strftime_now globals and json.dumps-style tojson filter).
// A Template is immutable after Parse; Render may be called from many threads at once: each call
// keeps its own state. Runaway templates end in a ResourceExhausted error, not a hang.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/status.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace corolla::jinja {

// Bounds on one render. Exceeding one is ResourceExhausted.
struct RenderLimits {
  int64_t max_steps = 10'000'000;         // statements, expressions and loop iterations
  size_t max_output_bytes = 64ull << 20;  // output and any single string/list built on the way
  int max_call_depth = 200;               // nested macro calls
};

class Template {
 public:
  // Syntax errors are InvalidArgument, unknown tags Unsupported; both name the line.
  static Result<std::shared_ptr<const Template>> Parse(std::string_view source);

  // `context` must be a JSON object; its keys are the template's variables. Errors: runtime type
  // errors and undefined-variable misuse are InvalidArgument naming the line; unknown filters,
  // tests and methods are Unsupported; raise_exception(msg) is InvalidArgument with message msg.
  Result<std::string> Render(const nlohmann::json& context, const RenderLimits& limits = {}) const;
  // The same, keeping the key order of objects (tojson prints keys in the order given).
  Result<std::string> Render(const nlohmann::ordered_json& context,
                             const RenderLimits& limits = {}) const;
  // Renders with variables already converted; `context` must be a dict.
  Result<std::string> RenderValue(const Value& context, const RenderLimits& limits = {}) const;

  const Body& body() const { return body_; }

 private:
  Template() = default;
  Body body_;
};

}  // namespace corolla::jinja
