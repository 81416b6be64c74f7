// Renderer: the state of one Template::Render call (variable scopes, output, step and depth
// counters) and the tree-walking evaluator. Internal to corolla_jinja; builtins.cc calls back into
// it for filters that apply other filters, tests or callables. Not thread-safe: one per render.
#pragma once

#include <deque>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/template.h"
#include "tokenizer/jinja/value.h"

namespace corolla::jinja {

// A variable scope. Frames are owned by the Renderer as a stack; a frame a closure (macro) points
// to stays alive until the render ends, so closures may hold raw pointers.
struct Frame {
  Frame* parent = nullptr;
  std::vector<std::pair<std::string, Value>> vars;
  bool captured = false;  // a closure points here: keep it until the render ends

  const Value* Find(std::string_view name) const;
  void Set(std::string_view name, Value value);
};

class Renderer {
 public:
  Renderer(const Value& context, const RenderLimits& limits);

  Result<std::string> Run(const Body& body);

  // Jinja's attribute and subscript semantics (sandboxed): a missing attribute or key is
  // Undefined; looking into an Undefined is an error.
  Result<Value> GetAttr(const Value& obj, std::string_view name);
  Result<Value> GetItem(const Value& obj, const Value& key);
  Result<Value> Call(const Value& callee, const CallArgs& args);
  Result<Value> ApplyFilter(std::string_view name, const Value& input, const CallArgs& args);
  Result<bool> ApplyTest(std::string_view name, const Value& input, const CallArgs& args);
  // Error unless a string or list of `bytes` fits the output limit.
  Status CheckSize(size_t bytes) const;
  size_t max_output_bytes() const { return limits_.max_output_bytes; }
  // Counts one step of work; error once over the limit.
  Status Step();
  // Marks `status` as raised by raise_exception: it propagates with its message unchanged.
  Status Raise(Status status);

  // Runs a macro body in a new frame below `closure`; used by macro and caller callables.
  Result<Value> CallMacro(const Stmt& macro, Frame* closure, const CallArgs& args,
                          const Value* caller);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Frame* NewFrame(Frame* parent);
  // Frees `frame` if it is the newest and no closure holds it.
  void ReleaseFrame(Frame* frame);
  // Marks `frame` and its ancestors as held by a closure.
  static void Capture(Frame* frame);
  Value Lookup(std::string_view name) const;
  Status Located(int line, Status status) const;

  Status ExecBody(const Body& body, std::string& out);
  Status Exec(const Stmt& stmt, std::string& out);
  Status ExecFor(const Stmt& stmt, std::string& out);
  Status Assign(const Stmt& stmt, Value value);
  Result<Value> Eval(const Expr& expr);
  Result<Value> EvalInner(const Expr& expr);
  Result<Value> EvalBinary(const Expr& expr, const Value& a, const Value& b);
  Result<Value> EvalCompare(const Expr& expr);
  Result<Value> EvalFilterChain(const Expr& expr, const Value& input);
  Status EvalArgs(const Expr& expr, size_t first, CallArgs* args);
  Result<Value> MakeMacro(const Stmt& stmt);

  const Value& context_;
  RenderLimits limits_;
  std::deque<Frame> frames_;
  Frame* frame_ = nullptr;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  size_t output_bytes_ = 0;
  Flow flow_ = Flow::kNormal;
  bool raised_ = false;
};

}  // namespace corolla::jinja
