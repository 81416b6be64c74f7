#include "tokenizer/jinja/renderer.h"

#include <cmath>
#include <limits>

#include "tokenizer/jinja/builtins.h"

namespace corolla::jinja {
namespace {

// The `loop` variable of a for loop; one per loop, updated in place each iteration.
class LoopObject final : public Object {
 public:
  explicit LoopObject(std::shared_ptr<const List> items) : items_(std::move(items)) {}
  void set_index0(int64_t i) { index0_ = i; }

  std::string TypeName() const override { return "LoopContext"; }
  std::optional<Value> GetAttr(std::string_view name) const override {
    const int64_t length = static_cast<int64_t>(items_->size());
    if (name == "index") return Value::Int(index0_ + 1);
    if (name == "index0") return Value::Int(index0_);
    if (name == "revindex") return Value::Int(length - index0_);
    if (name == "revindex0") return Value::Int(length - index0_ - 1);
    if (name == "first") return Value::Bool(index0_ == 0);
    if (name == "last") return Value::Bool(index0_ == length - 1);
    if (name == "length") return Value::Int(length);
    if (name == "depth") return Value::Int(1);
    if (name == "depth0") return Value::Int(0);
    if (name == "previtem") {
      if (index0_ == 0) return Value::Undefined("there is no previous item");
      return (*items_)[index0_ - 1];
    }
    if (name == "nextitem") {
      if (index0_ + 1 >= length) return Value::Undefined("there is no next item");
      return (*items_)[index0_ + 1];
    }
    if (name == "cycle") {
      auto fn = std::make_shared<Callable>();
      fn->name = "loop.cycle";
      int64_t index0 = index0_;
      fn->fn = [index0](Renderer&, const CallArgs& args) -> Result<Value> {
        if (args.positional.empty()) return InvalidArgument("loop.cycle() needs an argument");
        return args.positional[index0 % static_cast<int64_t>(args.positional.size())];
      };
      return Value::MakeCallable(std::move(fn));
    }
    return std::nullopt;
  }
  std::string Repr() const override {
    return "<LoopContext " + std::to_string(index0_ + 1) + "/" + std::to_string(items_->size()) +
           ">";
  }

 private:
  std::shared_ptr<const List> items_;
  int64_t index0_ = 0;
};

bool StartsWith(const std::string& s, std::string_view prefix) {
  return s.compare(0, prefix.size(), prefix) == 0;
}

Status UndefinedError(const Value& v) {
  const std::string& hint = v.undefined_hint();
  return InvalidArgument(hint.empty() ? "value is undefined" : hint);
}

Result<Value> IntResult(__int128 v) {
  if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min()) {
    return OutOfRange("integer result out of 64-bit range");
  }
  return Value::Int(static_cast<int64_t>(v));
}

}  // namespace

const Value* Frame::Find(std::string_view name) const {
  for (const auto& [k, v] : vars) {
    if (k == name) return &v;
  }
  return nullptr;
}

void Frame::Set(std::string_view name, Value value) {
  for (auto& [k, v] : vars) {
    if (k == name) {
      v = std::move(value);
      return;
    }
  }
  vars.emplace_back(std::string(name), std::move(value));
}

Renderer::Renderer(const Value& context, const RenderLimits& limits)
    : context_(context), limits_(limits) {
  frame_ = NewFrame(nullptr);
}

Frame* Renderer::NewFrame(Frame* parent) {
  frames_.emplace_back();
  frames_.back().parent = parent;
  return &frames_.back();
}

void Renderer::ReleaseFrame(Frame* frame) {
  if (!frames_.empty() && &frames_.back() == frame && !frame->captured) frames_.pop_back();
}

void Renderer::Capture(Frame* frame) {
  for (; frame != nullptr && !frame->captured; frame = frame->parent) frame->captured = true;
}

Result<std::string> Renderer::Run(const Body& body) {
  std::string out;
  RETURN_IF_ERROR(ExecBody(body, out));
  return out;
}

Status Renderer::Step() {
  if (++steps_ > limits_.max_steps) {
    return ResourceExhausted("template exceeded " + std::to_string(limits_.max_steps) +
                             " evaluation steps");
  }
  return Status::Ok();
}

Status Renderer::CheckSize(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) {
    return ResourceExhausted("template output exceeded " +
                             std::to_string(limits_.max_output_bytes) + " bytes");
  }
  return Status::Ok();
}

Status Renderer::Raise(Status status) {
  raised_ = true;
  return status;
}

Status Renderer::Located(int line, Status status) const {
  if (raised_ || status.ok() || StartsWith(status.message(), "line ")) return status;
  return Status(status.code(), "line " + std::to_string(line) + ": " + status.message());
}

Value Renderer::Lookup(std::string_view name) const {
  for (const Frame* f = frame_; f != nullptr; f = f->parent) {
    if (const Value* v = f->Find(name)) return *v;
  }
  if (context_.is_dict()) {
    if (const Value* v = context_.as_dict().Find(name)) return *v;
  }
  if (auto global = FindGlobal(name)) return *global;
  return Value::Undefined("'" + std::string(name) + "' is undefined");
}

// --- statements ---

Status Renderer::ExecBody(const Body& body, std::string& out) {
  for (const StmtPtr& stmt : body) {
    RETURN_IF_ERROR(Exec(*stmt, out));
    if (flow_ != Flow::kNormal) return Status::Ok();
  }
  return Status::Ok();
}

Status Renderer::Exec(const Stmt& stmt, std::string& out) {
  RETURN_IF_ERROR(Step());
  switch (stmt.kind) {
    case Stmt::Kind::kText:
      out += stmt.text;
      return CheckSize(out.size());
    case Stmt::Kind::kOutput: {
      ASSIGN_OR_RETURN(Value v, Eval(*stmt.expr));
      out += v.Str();
      return CheckSize(out.size());
    }
    case Stmt::Kind::kIf:
      for (const auto& [cond, body] : stmt.branches) {
        ASSIGN_OR_RETURN(Value c, Eval(*cond));
        if (c.Truthy()) return ExecBody(body, out);
      }
      return ExecBody(stmt.else_body, out);
    case Stmt::Kind::kFor:
      return ExecFor(stmt, out);
    case Stmt::Kind::kSet: {
      ASSIGN_OR_RETURN(Value v, Eval(*stmt.expr));
      return Located(stmt.line, Assign(stmt, std::move(v)));
    }
    case Stmt::Kind::kSetBlock:
    case Stmt::Kind::kFilterBlock: {
      Frame* saved = frame_;
      frame_ = NewFrame(saved);
      std::string captured;
      Status s = ExecBody(stmt.body, captured);
      ReleaseFrame(frame_);
      frame_ = saved;
      RETURN_IF_ERROR(s);
      Value v = Value::String(std::move(captured));
      if (stmt.expr) {
        ASSIGN_OR_RETURN(v, EvalFilterChain(*stmt.expr, v));
      }
      if (stmt.kind == Stmt::Kind::kSetBlock) return Assign(stmt, std::move(v));
      out += v.Str();
      return CheckSize(out.size());
    }
    case Stmt::Kind::kMacro: {
      ASSIGN_OR_RETURN(Value macro, MakeMacro(stmt));
      frame_->Set(stmt.name, std::move(macro));
      return Status::Ok();
    }
    case Stmt::Kind::kCallBlock: {
      const Expr& call = *stmt.expr;
      ASSIGN_OR_RETURN(Value callee, Eval(*call.args[0]));
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(call, 1, &args));
      auto caller = std::make_shared<Callable>();
      caller->name = "caller";
      const Stmt* block = &stmt;
      Frame* closure = frame_;
      Capture(closure);
      caller->fn = [block, closure](Renderer& r, const CallArgs& a) {
        return r.CallMacro(*block, closure, a, nullptr);
      };
      args.keyword.emplace_back("caller", Value::MakeCallable(std::move(caller)));
      Result<Value> v = Call(callee, args);
      if (!v.ok()) return Located(stmt.line, v.status());
      out += v->Str();
      return CheckSize(out.size());
    }
    case Stmt::Kind::kBreak:
      flow_ = Flow::kBreak;
      return Status::Ok();
    case Stmt::Kind::kContinue:
      flow_ = Flow::kContinue;
      return Status::Ok();
    case Stmt::Kind::kWith: {
      Frame* saved = frame_;
      Frame* inner = NewFrame(saved);
      for (const auto& [name, value] : stmt.params) {
        Result<Value> v = Eval(*value);
        if (!v.ok()) {
          frame_ = saved;
          return v.status();
        }
        frame_ = inner;  // later assignments see earlier ones
        inner->Set(name, std::move(v).value());
      }
      frame_ = inner;
      Status s = ExecBody(stmt.body, out);
      ReleaseFrame(inner);
      frame_ = saved;
      return s;
    }
    case Stmt::Kind::kScope:
      return ExecBody(stmt.body, out);
  }
  return Internal("unknown statement kind");
}

Status Renderer::Assign(const Stmt& stmt, Value value) {
  if (!stmt.attr.empty()) {
    Value target = Lookup(stmt.targets[0]);
    if (!target.is_object()) {
      if (target.is_undefined()) return UndefinedError(target);
      return InvalidArgument("cannot assign attribute '" + stmt.attr + "' on a " +
                             target.TypeName() + " (only namespace() objects accept assignment)");
    }
    return target.as_object().SetAttr(stmt.attr, std::move(value));
  }
  if (!stmt.unpack) {
    frame_->Set(stmt.targets[0], std::move(value));
    return Status::Ok();
  }
  ASSIGN_OR_RETURN(List items, Iterate(value));
  if (items.size() != stmt.targets.size()) {
    return InvalidArgument("cannot unpack " + std::to_string(items.size()) + " values into " +
                           std::to_string(stmt.targets.size()) + " names");
  }
  for (size_t i = 0; i < items.size(); ++i) frame_->Set(stmt.targets[i], std::move(items[i]));
  return Status::Ok();
}

Status Renderer::ExecFor(const Stmt& stmt, std::string& out) {
  ASSIGN_OR_RETURN(Value iterable, Eval(*stmt.expr));
  Result<List> all = Iterate(iterable);
  if (!all.ok()) return Located(stmt.line, all.status());
  Frame* saved = frame_;
  Frame* body_frame = NewFrame(saved);
  frame_ = body_frame;
  auto bind = [&](const Value& item) -> Status {
    body_frame->vars.clear();
    if (!stmt.unpack) {
      body_frame->Set(stmt.targets[0], item);
      return Status::Ok();
    }
    Result<List> parts = Iterate(item);
    if (!parts.ok()) return Located(stmt.line, parts.status());
    if (parts->size() != stmt.targets.size()) {
      return Located(stmt.line, InvalidArgument("cannot unpack " + std::to_string(parts->size()) +
                                                " values into " +
                                                std::to_string(stmt.targets.size()) + " names"));
    }
    for (size_t i = 0; i < parts->size(); ++i) body_frame->Set(stmt.targets[i], (*parts)[i]);
    return Status::Ok();
  };
  auto run = [&]() -> Status {
    auto items = std::make_shared<List>();
    if (stmt.cond) {
      for (Value& item : *all) {
        RETURN_IF_ERROR(Step());
        RETURN_IF_ERROR(bind(item));
        ASSIGN_OR_RETURN(Value keep, Eval(*stmt.cond));
        if (keep.Truthy()) items->push_back(std::move(item));
      }
    } else {
      *items = std::move(*all);
    }
    if (items->empty()) {
      frame_ = saved;
      return ExecBody(stmt.else_body, out);
    }
    auto loop = std::make_shared<LoopObject>(items);
    Value loop_value = Value::MakeObject(loop);
    for (size_t i = 0; i < items->size(); ++i) {
      RETURN_IF_ERROR(Step());
      RETURN_IF_ERROR(bind((*items)[i]));
      loop->set_index0(static_cast<int64_t>(i));
      body_frame->Set("loop", loop_value);
      RETURN_IF_ERROR(ExecBody(stmt.body, out));
      if (flow_ == Flow::kBreak) {
        flow_ = Flow::kNormal;
        break;
      }
      flow_ = Flow::kNormal;
    }
    return Status::Ok();
  };
  Status s = run();
  ReleaseFrame(body_frame);
  frame_ = saved;
  return s;
}

Result<Value> Renderer::MakeMacro(const Stmt& stmt) {
  auto fn = std::make_shared<Callable>();
  fn->name = stmt.name;
  const Stmt* macro = &stmt;
  Frame* closure = frame_;
  Capture(closure);
  fn->fn = [macro, closure](Renderer& r, const CallArgs& args) {
    return r.CallMacro(*macro, closure, args, nullptr);
  };
  return Value::MakeCallable(std::move(fn));
}

Result<Value> Renderer::CallMacro(const Stmt& macro, Frame* closure, const CallArgs& args,
                                  const Value* caller) {
  if (call_depth_ >= limits_.max_call_depth) {
    return ResourceExhausted("macro calls nested deeper than " +
                             std::to_string(limits_.max_call_depth));
  }
  Frame* inner = NewFrame(closure);
  const size_t num_params = macro.params.size();
  std::vector<bool> bound(num_params, false);
  List varargs;
  auto kwargs = std::make_shared<Dict>();
  for (size_t i = 0; i < args.positional.size(); ++i) {
    if (i < num_params) {
      inner->Set(macro.params[i].first, args.positional[i]);
      bound[i] = true;
    } else {
      varargs.push_back(args.positional[i]);
    }
  }
  for (const auto& [name, value] : args.keyword) {
    if (name == "caller") {
      inner->Set("caller", value);
      continue;
    }
    bool found = false;
    for (size_t i = 0; i < num_params; ++i) {
      if (macro.params[i].first != name) continue;
      if (bound[i]) {
        return InvalidArgument("macro '" + macro.name + "' got multiple values for argument '" +
                               name + "'");
      }
      inner->Set(name, value);
      bound[i] = found = true;
    }
    if (!found) kwargs->Set(Value::String(name), value);
  }
  if (caller != nullptr) inner->Set("caller", *caller);
  inner->Set("varargs", Value::MakeList(std::move(varargs), /*is_tuple=*/true));
  inner->Set("kwargs", Value::MakeDict(std::move(kwargs)));
  Frame* saved = frame_;
  frame_ = inner;
  ++call_depth_;
  auto finish = [&](Status s) {
    --call_depth_;
    ReleaseFrame(inner);
    frame_ = saved;
    return s;
  };
  for (size_t i = 0; i < num_params; ++i) {
    if (bound[i]) continue;
    const auto& [name, def] = macro.params[i];
    if (!def) {
      inner->Set(name, Value::Undefined("parameter '" + name + "' of macro '" + macro.name +
                                        "' was not provided"));
      continue;
    }
    Result<Value> v = Eval(*def);
    if (!v.ok()) return finish(v.status());
    inner->Set(name, std::move(v).value());
  }
  std::string out;
  Status s = ExecBody(macro.body, out);
  flow_ = Flow::kNormal;
  RETURN_IF_ERROR(finish(s));
  return Value::String(std::move(out));
}

// --- expressions ---

Result<Value> Renderer::Eval(const Expr& expr) {
  RETURN_IF_ERROR(Step());
  Result<Value> v = EvalInner(expr);
  if (!v.ok()) return Located(expr.line, v.status());
  return v;
}

Status Renderer::EvalArgs(const Expr& expr, size_t first, CallArgs* args) {
  for (size_t i = first; i < expr.args.size(); ++i) {
    ASSIGN_OR_RETURN(Value v, Eval(*expr.args[i]));
    args->positional.push_back(std::move(v));
  }
  for (const auto& [name, value] : expr.kwargs) {
    ASSIGN_OR_RETURN(Value v, Eval(*value));
    args->keyword.emplace_back(name, std::move(v));
  }
  return Status::Ok();
}

Result<Value> Renderer::EvalFilterChain(const Expr& expr, const Value& input) {
  Value in = input;
  if (expr.args[0]) {
    ASSIGN_OR_RETURN(in, EvalFilterChain(*expr.args[0], input));
  }
  CallArgs args;
  RETURN_IF_ERROR(EvalArgs(expr, 1, &args));
  Result<Value> v = ApplyFilter(expr.name, in, args);
  if (!v.ok()) return Located(expr.line, v.status());
  return v;
}

Result<Value> Renderer::EvalInner(const Expr& expr) {
  switch (expr.kind) {
    case Expr::Kind::kLiteral:
      return expr.literal;
    case Expr::Kind::kName:
      return Lookup(expr.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      List items;
      items.reserve(expr.args.size());
      for (const ExprPtr& e : expr.args) {
        ASSIGN_OR_RETURN(Value v, Eval(*e));
        items.push_back(std::move(v));
      }
      return Value::MakeList(std::move(items), expr.kind == Expr::Kind::kTuple);
    }
    case Expr::Kind::kDict: {
      auto dict = std::make_shared<Dict>();
      for (size_t i = 0; i + 1 < expr.args.size(); i += 2) {
        ASSIGN_OR_RETURN(Value k, Eval(*expr.args[i]));
        ASSIGN_OR_RETURN(Value v, Eval(*expr.args[i + 1]));
        if (k.is_list() && !k.is_tuple()) return InvalidArgument("unhashable type: 'list'");
        if (k.is_dict()) return InvalidArgument("unhashable type: 'dict'");
        dict->Set(std::move(k), std::move(v));
      }
      return Value::MakeDict(std::move(dict));
    }
    case Expr::Kind::kAttr: {
      ASSIGN_OR_RETURN(Value obj, Eval(*expr.args[0]));
      return GetAttr(obj, expr.name);
    }
    case Expr::Kind::kItem: {
      ASSIGN_OR_RETURN(Value obj, Eval(*expr.args[0]));
      ASSIGN_OR_RETURN(Value key, Eval(*expr.args[1]));
      return GetItem(obj, key);
    }
    case Expr::Kind::kSlice: {
      ASSIGN_OR_RETURN(Value obj, Eval(*expr.args[0]));
      if (obj.is_undefined()) return UndefinedError(obj);
      Value bounds[3];
      for (int i = 0; i < 3; ++i) {
        if (expr.args[i + 1]) {
          ASSIGN_OR_RETURN(bounds[i], Eval(*expr.args[i + 1]));
        } else {
          bounds[i] = Value::None();
        }
      }
      return Slice(obj, bounds[0], bounds[1], bounds[2]);
    }
    case Expr::Kind::kCall: {
      ASSIGN_OR_RETURN(Value callee, Eval(*expr.args[0]));
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(expr, 1, &args));
      return Call(callee, args);
    }
    case Expr::Kind::kFilter: {
      ASSIGN_OR_RETURN(Value input, Eval(*expr.args[0]));
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(expr, 1, &args));
      return ApplyFilter(expr.name, input, args);
    }
    case Expr::Kind::kTest: {
      ASSIGN_OR_RETURN(Value input, Eval(*expr.args[0]));
      CallArgs args;
      RETURN_IF_ERROR(EvalArgs(expr, 1, &args));
      ASSIGN_OR_RETURN(bool b, ApplyTest(expr.name, input, args));
      return Value::Bool(b);
    }
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: {
      ASSIGN_OR_RETURN(Value v, Eval(*expr.args[0]));
      if (v.is_undefined()) return UndefinedError(v);
      if (!v.is_number()) {
        return InvalidArgument("bad operand type for unary " +
                               std::string(expr.kind == Expr::Kind::kNeg ? "-" : "+") + ": '" +
                               v.TypeName() + "'");
      }
      if (expr.kind == Expr::Kind::kPos) return v.is_bool() ? Value::Int(v.as_int()) : v;
      if (v.is_float()) return Value::Float(-v.as_float());
      return IntResult(-static_cast<__int128>(v.as_int()));
    }
    case Expr::Kind::kNot: {
      ASSIGN_OR_RETURN(Value v, Eval(*expr.args[0]));
      return Value::Bool(!v.Truthy());
    }
    case Expr::Kind::kAnd: {
      ASSIGN_OR_RETURN(Value a, Eval(*expr.args[0]));
      if (!a.Truthy()) return a;
      return Eval(*expr.args[1]);
    }
    case Expr::Kind::kOr: {
      ASSIGN_OR_RETURN(Value a, Eval(*expr.args[0]));
      if (a.Truthy()) return a;
      return Eval(*expr.args[1]);
    }
    case Expr::Kind::kBinary: {
      ASSIGN_OR_RETURN(Value a, Eval(*expr.args[0]));
      ASSIGN_OR_RETURN(Value b, Eval(*expr.args[1]));
      return EvalBinary(expr, a, b);
    }
    case Expr::Kind::kConcat: {
      std::string s;
      for (const ExprPtr& e : expr.args) {
        ASSIGN_OR_RETURN(Value v, Eval(*e));
        s += v.Str();
        RETURN_IF_ERROR(CheckSize(s.size()));
      }
      return Value::String(std::move(s));
    }
    case Expr::Kind::kCompare:
      return EvalCompare(expr);
    case Expr::Kind::kCond: {
      ASSIGN_OR_RETURN(Value test, Eval(*expr.args[1]));
      if (test.Truthy()) return Eval(*expr.args[0]);
      if (expr.args[2]) return Eval(*expr.args[2]);
      return Value::Undefined("the inline if expression evaluated to false and has no else");
    }
  }
  return Internal("unknown expression kind");
}

Result<Value> Renderer::EvalBinary(const Expr& expr, const Value& a, const Value& b) {
  const std::string& op = expr.name;
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  auto type_error = [&]() {
    return InvalidArgument("unsupported operand type(s) for " + op + ": '" + a.TypeName() +
                           "' and '" + b.TypeName() + "'");
  };
  if (a.is_number() && b.is_number()) {
    bool both_int = !a.is_float() && !b.is_float();
    if (op == "+") {
      if (both_int) return IntResult(static_cast<__int128>(a.as_int()) + b.as_int());
      return Value::Float(a.as_float() + b.as_float());
    }
    if (op == "-") {
      if (both_int) return IntResult(static_cast<__int128>(a.as_int()) - b.as_int());
      return Value::Float(a.as_float() - b.as_float());
    }
    if (op == "*") {
      if (both_int) return IntResult(static_cast<__int128>(a.as_int()) * b.as_int());
      return Value::Float(a.as_float() * b.as_float());
    }
    if (op == "/") {
      if (b.as_float() == 0) return InvalidArgument("division by zero");
      return Value::Float(a.as_float() / b.as_float());
    }
    if (op == "//" || op == "%") {
      if (both_int) {
        int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) return InvalidArgument("integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          return op == "//" ? IntResult(-static_cast<__int128>(x)) : Value::Int(0);
        }
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          q -= 1;
          m += y;
        }
        return Value::Int(op == "//" ? q : m);
      }
      double x = a.as_float(), y = b.as_float();
      if (y == 0) return InvalidArgument("float division or modulo by zero");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      if (op == "%") return Value::Float(m);
      return Value::Float(std::floor(x / y));
    }
    if (op == "**") {
      if (both_int && b.as_int() >= 0) {
        __int128 result = 1, base = a.as_int();
        int64_t e = b.as_int();
        while (e > 0) {
          if (result > INT64_MAX || result < INT64_MIN) break;
          if (base > INT64_MAX || base < INT64_MIN) {
            return OutOfRange("integer result out of 64-bit range");
          }
          if (e & 1) result *= base;
          e >>= 1;
          if (e > 0) base *= base;
        }
        return IntResult(result);
      }
      if (a.as_float() == 0 && b.as_float() < 0) {
        return InvalidArgument("0.0 cannot be raised to a negative power");
      }
      return Value::Float(std::pow(a.as_float(), b.as_float()));
    }
    return type_error();
  }
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      RETURN_IF_ERROR(CheckSize(a.as_string().size() + b.as_string().size()));
      return Value::String(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      RETURN_IF_ERROR(CheckSize(a.as_list().size() + b.as_list().size()));
      List items = a.as_list();
      items.insert(items.end(), b.as_list().begin(), b.as_list().end());
      return Value::MakeList(std::move(items), a.is_tuple());
    }
    if (a.is_string()) {
      return InvalidArgument("can only concatenate str (not \"" + b.TypeName() + "\") to str");
    }
    return type_error();
  }
  if (op == "*") {
    const Value* seq = (a.is_string() || a.is_list()) ? &a : &b;
    const Value* count = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_list()) && (count->is_int() || count->is_bool())) {
      int64_t n = std::max<int64_t>(0, count->as_int());
      size_t unit = seq->is_string() ? seq->as_string().size() : seq->as_list().size();
      if (unit == 0) n = 0;  // '' * 10**18 is '': no 10**18 empty appends
      if (unit > 0 && static_cast<uint64_t>(n) > limits_.max_output_bytes / unit + 1) {
        return CheckSize(limits_.max_output_bytes + 1);
      }
      RETURN_IF_ERROR(CheckSize(unit * n));
      if (seq->is_string()) {
        std::string s;
        for (int64_t i = 0; i < n; ++i) s += seq->as_string();
        return Value::String(std::move(s));
      }
      List items;
      for (int64_t i = 0; i < n; ++i) {
        items.insert(items.end(), seq->as_list().begin(), seq->as_list().end());
      }
      return Value::MakeList(std::move(items), seq->is_tuple());
    }
    return type_error();
  }
  if (op == "%" && a.is_string()) {
    ASSIGN_OR_RETURN(std::string s, PercentFormat(a.as_string(), b));
    return Value::String(std::move(s));
  }
  return type_error();
}

Result<Value> Renderer::EvalCompare(const Expr& expr) {
  ASSIGN_OR_RETURN(Value left, Eval(*expr.args[0]));
  for (size_t i = 0; i < expr.ops.size(); ++i) {
    ASSIGN_OR_RETURN(Value right, Eval(*expr.args[i + 1]));
    const std::string& op = expr.ops[i];
    bool result;
    if (op == "==") {
      result = left.Equals(right);
    } else if (op == "!=") {
      result = !left.Equals(right);
    } else if (op == "in" || op == "notin") {
      if (left.is_undefined() && !right.is_list()) return UndefinedError(left);
      ASSIGN_OR_RETURN(result, Contains(right, left));
      if (op == "notin") result = !result;
    } else {
      if (left.is_undefined()) return UndefinedError(left);
      if (right.is_undefined()) return UndefinedError(right);
      if (op == "<") {
        ASSIGN_OR_RETURN(result, left.Less(right));
      } else if (op == ">") {
        ASSIGN_OR_RETURN(result, right.Less(left));
      } else if (op == "<=") {
        ASSIGN_OR_RETURN(bool greater, right.Less(left));
        result = !greater;
      } else {
        ASSIGN_OR_RETURN(bool less, left.Less(right));
        result = !less;
      }
    }
    if (!result) return Value::Bool(false);
    left = std::move(right);
  }
  return Value::Bool(true);
}

Result<Value> Renderer::GetAttr(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_object()) {
    if (auto v = obj.as_object().GetAttr(name)) return *v;
  } else if (obj.is_dict()) {
    if (auto method = FindMethod(obj, name)) return *method;
    if (const Value* v = obj.as_dict().Find(name)) return *v;
  } else if (auto method = FindMethod(obj, name)) {
    return *method;
  }
  std::string type = obj.is_object() ? obj.TypeName() : obj.TypeName() + " object";
  return Value::Undefined("'" + type + "' has no attribute '" + std::string(name) + "'");
}

Result<Value> Renderer::GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (obj.is_dict()) {
    if (const Value* v = obj.as_dict().Find(key)) return *v;
  } else if ((obj.is_list() || obj.is_string()) && (key.is_int() || key.is_bool())) {
    return Index(obj, key.as_int());
  }
  if (key.is_string()) return GetAttr(obj, key.as_string());
  return Value::Undefined("'" + obj.TypeName() + " object' has no item " + key.Repr());
}

Result<Value> Renderer::Call(const Value& callee, const CallArgs& args) {
  if (callee.is_callable()) return callee.as_callable().fn(*this, args);
  if (callee.is_undefined()) {
    return Unsupported("call of an undefined function or method (" + callee.undefined_hint() + ")");
  }
  return InvalidArgument("'" + callee.TypeName() + "' object is not callable");
}

Result<Value> Renderer::ApplyFilter(std::string_view name, const Value& input,
                                    const CallArgs& args) {
  FilterFn fn = FindFilter(name);
  if (fn == nullptr) return Unsupported("unknown filter '" + std::string(name) + "'");
  Result<Value> v = fn(*this, input, args);
  if (!v.ok() && !raised_ && !StartsWith(v.status().message(), "line ") &&
      v.status().message().find(std::string(name)) == std::string::npos) {
    return Status(v.status().code(), "filter '" + std::string(name) + "': " + v.status().message());
  }
  return v;
}

Result<bool> Renderer::ApplyTest(std::string_view name, const Value& input, const CallArgs& args) {
  TestFn fn = FindTest(name);
  if (fn == nullptr) return Unsupported("unknown test '" + std::string(name) + "'");
  return fn(*this, input, args);
}

}  // namespace corolla::jinja
