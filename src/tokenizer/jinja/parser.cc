// Recursive-descent parser following jinja2's grammar and operator precedence (parser.py):
// condexpr < or < and < not < compare < + - < ~ < * / // % < ** < unary < filters/tests <
// postfix (. [] ()) < primary.
#include <charconv>
#include <initializer_list>
#include <string_view>

#include "tokenizer/jinja/ast.h"

namespace corolla::jinja {
namespace {

constexpr int kMaxNesting = 200;

using T = Token::Type;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  Result<Body> ParseTemplate() {
    std::string end;
    ASSIGN_OR_RETURN(Body body, ParseBody({}, "", 0, &end));
    return body;
  }

 private:
  // --- token helpers ---
  const Token& Cur() const { return tokens_[pos_]; }
  const Token& Peek(size_t ahead = 1) const {
    size_t p = pos_ + ahead;
    return tokens_[p < tokens_.size() ? p : tokens_.size() - 1];
  }
  void Next() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(const Token& t, std::string_view op) const { return t.type == T::kOp && t.value == op; }
  bool IsName(const Token& t, std::string_view name) const {
    return t.type == T::kName && t.value == name;
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(Cur(), op)) return false;
    Next();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(Cur(), name)) return false;
    Next();
    return true;
  }
  static std::string Describe(const Token& t) {
    switch (t.type) {
      case T::kText:
        return "text";
      case T::kVarBegin:
        return "'{{'";
      case T::kVarEnd:
        return "'}}'";
      case T::kBlockBegin:
        return "'{%'";
      case T::kBlockEnd:
        return "'%}'";
      case T::kString:
        return "string literal";
      case T::kInt:
      case T::kFloat:
        return "number " + t.value;
      case T::kEof:
        return "end of template";
      default:
        return "'" + t.value + "'";
    }
  }
  Status Error(int line, const std::string& message) const {
    return InvalidArgument("template syntax error at line " + std::to_string(line) + ": " +
                           message);
  }
  Status Unexpected(const std::string& expected) const {
    return Error(Cur().line, "expected " + expected + ", got " + Describe(Cur()));
  }
  Status ExpectOp(std::string_view op) {
    if (!SkipOp(op)) return Unexpected("'" + std::string(op) + "'");
    return Status::Ok();
  }
  Status ExpectBlockEnd() {
    if (Cur().type != T::kBlockEnd) return Unexpected("end of statement '%}'");
    Next();
    return Status::Ok();
  }
  Result<std::string> ExpectName() {
    if (Cur().type != T::kName) return Unexpected("a name");
    std::string name = Cur().value;
    Next();
    return name;
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // --- statements ---

  // Parses statements until a block tag named in `end_tags` (left after its name, so the caller
  // reads the rest of that tag) or the end of the template when `end_tags` is empty.
  Result<Body> ParseBody(std::initializer_list<std::string_view> end_tags, std::string_view opener,
                         int opener_line, std::string* found_end) {
    if (++nesting_ > kMaxNesting) return Error(Cur().line, "blocks nested too deeply");
    Body body;
    while (true) {
      const Token& t = Cur();
      if (t.type == T::kEof) {
        if (end_tags.size() == 0) break;
        std::string expected;
        for (std::string_view e : end_tags) {
          expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
        }
        return Error(opener_line, "'" + std::string(opener) +
                                      "' block opened here is never closed (expected " + expected +
                                      ")");
      }
      if (t.type == T::kText) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kText;
        s->line = t.line;
        s->text = t.value;
        body.push_back(std::move(s));
        Next();
        continue;
      }
      if (t.type == T::kVarBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::kOutput;
        s->line = t.line;
        Next();
        ASSIGN_OR_RETURN(s->expr, ParseTuple(true, {}, false));
        if (Cur().type != T::kVarEnd) return Unexpected("end of print statement '}}'");
        Next();
        body.push_back(std::move(s));
        continue;
      }
      if (t.type != T::kBlockBegin) return Unexpected("text or a tag");
      const Token& name = Peek();
      if (name.type != T::kName) {
        Next();
        return Unexpected("a tag name");
      }
      for (std::string_view e : end_tags) {
        if (name.value == e) {
          *found_end = name.value;
          Next();
          Next();
          --nesting_;
          return body;
        }
      }
      Next();
      ASSIGN_OR_RETURN(StmtPtr stmt, ParseStatement());
      body.push_back(std::move(stmt));
    }
    --nesting_;
    return body;
  }

  Result<StmtPtr> ParseStatement() {
    const Token& tag = Cur();
    int line = tag.line;
    std::string name = tag.value;
    Next();
    auto s = std::make_unique<Stmt>();
    s->line = line;
    std::string end;
    if (name == "if") {
      s->kind = Stmt::Kind::kIf;
      while (true) {
        ASSIGN_OR_RETURN(ExprPtr cond, ParseTuple(false, {}, false));
        RETURN_IF_ERROR(ExpectBlockEnd());
        ASSIGN_OR_RETURN(Body body, ParseBody({"elif", "else", "endif"}, "if", line, &end));
        s->branches.emplace_back(std::move(cond), std::move(body));
        if (end == "elif") continue;
        if (end == "else") {
          RETURN_IF_ERROR(ExpectBlockEnd());
          ASSIGN_OR_RETURN(s->else_body, ParseBody({"endif"}, "if", line, &end));
        }
        RETURN_IF_ERROR(ExpectBlockEnd());
        return s;
      }
    }
    if (name == "for") {
      s->kind = Stmt::Kind::kFor;
      RETURN_IF_ERROR(ParseTargets(s.get(), false));
      if (!SkipName("in")) return Unexpected("'in'");
      ASSIGN_OR_RETURN(s->expr, ParseTuple(false, {"recursive"}, false));
      if (SkipName("if")) {
        ASSIGN_OR_RETURN(s->cond, ParseExpression(true));
      }
      if (IsName(Cur(), "recursive")) {
        return Unsupported("line " + std::to_string(line) + ": recursive for loops");
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      ++loop_depth_;
      ASSIGN_OR_RETURN(s->body, ParseBody({"else", "endfor"}, "for", line, &end));
      --loop_depth_;
      if (end == "else") {
        RETURN_IF_ERROR(ExpectBlockEnd());
        ASSIGN_OR_RETURN(s->else_body, ParseBody({"endfor"}, "for", line, &end));
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (name == "set") {
      RETURN_IF_ERROR(ParseTargets(s.get(), true));
      if (SkipOp("=")) {
        s->kind = Stmt::Kind::kSet;
        ASSIGN_OR_RETURN(s->expr, ParseTuple(true, {}, false));
        RETURN_IF_ERROR(ExpectBlockEnd());
        return s;
      }
      if (!s->attr.empty() || s->targets.size() != 1 || s->unpack) {
        return Unexpected("'=' (a block set assigns to one name)");
      }
      s->kind = Stmt::Kind::kSetBlock;
      if (IsOp(Cur(), "|")) {
        ASSIGN_OR_RETURN(s->expr, ParseFilterChain(nullptr));
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(s->body, ParseBody({"endset"}, "set", line, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (name == "macro") {
      s->kind = Stmt::Kind::kMacro;
      ASSIGN_OR_RETURN(s->name, ExpectName());
      RETURN_IF_ERROR(ParseParams(s.get()));
      RETURN_IF_ERROR(ExpectBlockEnd());
      int saved_loops = loop_depth_;
      loop_depth_ = 0;
      ASSIGN_OR_RETURN(s->body, ParseBody({"endmacro"}, "macro", line, &end));
      loop_depth_ = saved_loops;
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (name == "call") {
      s->kind = Stmt::Kind::kCallBlock;
      if (IsOp(Cur(), "(")) RETURN_IF_ERROR(ParseParams(s.get()));
      ASSIGN_OR_RETURN(s->expr, ParseExpression(true));
      if (s->expr->kind != Expr::Kind::kCall) return Error(line, "expected a call after 'call'");
      RETURN_IF_ERROR(ExpectBlockEnd());
      int saved_loops = loop_depth_;
      loop_depth_ = 0;
      ASSIGN_OR_RETURN(s->body, ParseBody({"endcall"}, "call", line, &end));
      loop_depth_ = saved_loops;
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (name == "filter") {
      s->kind = Stmt::Kind::kFilterBlock;
      ASSIGN_OR_RETURN(s->expr, ParseFilterChain(nullptr, /*leading_pipe=*/false));
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(s->body, ParseBody({"endfilter"}, "filter", line, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) return Error(line, "'" + name + "' outside of a loop");
      s->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (name == "with") {
      s->kind = Stmt::Kind::kWith;
      while (Cur().type != T::kBlockEnd) {
        if (!s->params.empty()) RETURN_IF_ERROR(ExpectOp(","));
        ASSIGN_OR_RETURN(std::string target, ExpectName());
        RETURN_IF_ERROR(ExpectOp("="));
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        s->params.emplace_back(std::move(target), std::move(value));
      }
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(s->body, ParseBody({"endwith"}, "with", line, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    if (name == "generation") {  // transformers' AssistantTracker tag: renders its body
      s->kind = Stmt::Kind::kScope;
      RETURN_IF_ERROR(ExpectBlockEnd());
      ASSIGN_OR_RETURN(s->body, ParseBody({"endgeneration"}, "generation", line, &end));
      RETURN_IF_ERROR(ExpectBlockEnd());
      return s;
    }
    static const char* kKnownEnds[] = {"endif",   "endfor",    "endset",  "endmacro",
                                       "endcall", "endfilter", "endwith", "endgeneration",
                                       "elif",    "else",      "endraw",  "endblock"};
    for (const char* e : kKnownEnds) {
      if (name == e) return Error(line, "unexpected '" + name + "' (no open block it closes)");
    }
    return Unsupported("line " + std::to_string(line) + ": unknown tag '" + name + "'");
  }

  // `x`, `a, b`, `(a, b)` and (for set) `ns.attr`.
  Status ParseTargets(Stmt* s, bool allow_attr) {
    bool paren = SkipOp("(");
    while (true) {
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      s->targets.push_back(std::move(name));
      if (allow_attr && !paren && s->targets.size() == 1 && IsOp(Cur(), ".")) {
        Next();
        ASSIGN_OR_RETURN(s->attr, ExpectName());
        return Status::Ok();
      }
      if (!SkipOp(",")) break;
      s->unpack = true;
      if (Cur().type != T::kName) break;  // trailing comma
    }
    if (paren) {
      s->unpack = true;
      RETURN_IF_ERROR(ExpectOp(")"));
    }
    return Status::Ok();
  }

  // `(a, b=default, ...)` for macros and call blocks.
  Status ParseParams(Stmt* s) {
    RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(Cur(), ")")) {
      if (!s->params.empty()) RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp(Cur(), ")")) break;
      ASSIGN_OR_RETURN(std::string name, ExpectName());
      ExprPtr def;
      if (SkipOp("=")) {
        ASSIGN_OR_RETURN(def, ParseExpression(true));
      }
      s->params.emplace_back(std::move(name), std::move(def));
    }
    Next();
    return Status::Ok();
  }

  // --- expressions ---

  Result<ExprPtr> ParseExpression(bool with_condexpr) {
    if (++nesting_ > kMaxNesting) return Error(Cur().line, "expression nested too deeply");
    Result<ExprPtr> r = with_condexpr ? ParseCondExpr() : ParseOr();
    --nesting_;
    return r;
  }

  Result<ExprPtr> ParseCondExpr() {
    ASSIGN_OR_RETURN(ExprPtr expr, ParseOr());
    while (IsName(Cur(), "if")) {
      int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
      ExprPtr otherwise;
      if (SkipName("else")) {
        ASSIGN_OR_RETURN(otherwise, ParseExpression(true));
      }
      ExprPtr cond = Make(Expr::Kind::kCond, line);
      cond->args.push_back(std::move(expr));
      cond->args.push_back(std::move(test));
      cond->args.push_back(std::move(otherwise));
      expr = std::move(cond);
    }
    return expr;
  }

  Result<ExprPtr> ParseOr() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName(Cur(), "or")) {
      int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      ExprPtr e = Make(Expr::Kind::kOr, line);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprPtr> ParseAnd() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName(Cur(), "and")) {
      int line = Cur().line;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      ExprPtr e = Make(Expr::Kind::kAnd, line);
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprPtr> ParseNot() {
    if (IsName(Cur(), "not")) {
      int line = Cur().line;
      Next();
      if (++nesting_ > kMaxNesting) return Error(line, "expression nested too deeply");
      ASSIGN_OR_RETURN(ExprPtr inner, ParseNot());
      --nesting_;
      ExprPtr e = Make(Expr::Kind::kNot, line);
      e->args.push_back(std::move(inner));
      return e;
    }
    return ParseCompare();
  }

  Result<ExprPtr> ParseCompare() {
    int line = Cur().line;
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    ExprPtr cmp;
    while (true) {
      std::string op;
      const Token& t = Cur();
      if (t.type == T::kOp && (t.value == "==" || t.value == "!=" || t.value == "<" ||
                               t.value == "<=" || t.value == ">" || t.value == ">=")) {
        op = t.value;
        Next();
      } else if (IsName(t, "in")) {
        op = "in";
        Next();
      } else if (IsName(t, "not") && IsName(Peek(), "in")) {
        op = "notin";
        Next();
        Next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = Make(Expr::Kind::kCompare, line);
        cmp->args.push_back(std::move(first));
      }
      ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      cmp->ops.push_back(op);
      cmp->args.push_back(std::move(operand));
    }
    if (cmp) return cmp;
    return first;
  }

  Result<ExprPtr> ParseMath1() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseConcat());
    while (IsOp(Cur(), "+") || IsOp(Cur(), "-")) {
      ExprPtr e = Make(Expr::Kind::kBinary, Cur().line);
      e->name = Cur().value;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseConcat());
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprPtr> ParseConcat() {
    ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
    if (!IsOp(Cur(), "~")) return first;
    ExprPtr e = Make(Expr::Kind::kConcat, Cur().line);
    e->args.push_back(std::move(first));
    while (SkipOp("~")) {
      ASSIGN_OR_RETURN(ExprPtr next, ParseMath2());
      e->args.push_back(std::move(next));
    }
    return e;
  }

  Result<ExprPtr> ParseMath2() {
    ASSIGN_OR_RETURN(ExprPtr left, ParsePow());
    while (IsOp(Cur(), "*") || IsOp(Cur(), "/") || IsOp(Cur(), "//") || IsOp(Cur(), "%")) {
      ExprPtr e = Make(Expr::Kind::kBinary, Cur().line);
      e->name = Cur().value;
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParsePow());
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprPtr> ParsePow() {
    ASSIGN_OR_RETURN(ExprPtr left, ParseUnary(true));
    while (IsOp(Cur(), "**")) {
      ExprPtr e = Make(Expr::Kind::kBinary, Cur().line);
      e->name = "**";
      Next();
      ASSIGN_OR_RETURN(ExprPtr right, ParseUnary(true));
      e->args.push_back(std::move(left));
      e->args.push_back(std::move(right));
      left = std::move(e);
    }
    return left;
  }

  Result<ExprPtr> ParseUnary(bool with_filter) {
    if (++nesting_ > kMaxNesting) return Error(Cur().line, "expression nested too deeply");
    ExprPtr node;
    if (IsOp(Cur(), "-") || IsOp(Cur(), "+")) {
      node = Make(IsOp(Cur(), "-") ? Expr::Kind::kNeg : Expr::Kind::kPos, Cur().line);
      Next();
      ASSIGN_OR_RETURN(ExprPtr inner, ParseUnary(false));
      node->args.push_back(std::move(inner));
    } else {
      ASSIGN_OR_RETURN(node, ParsePrimary());
    }
    ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    --nesting_;
    return node;
  }

  Result<ExprPtr> ParsePrimary() {
    const Token& t = Cur();
    int line = t.line;
    switch (t.type) {
      case T::kName: {
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        if (t.value == "true" || t.value == "True") {
          e->literal = Value::Bool(true);
        } else if (t.value == "false" || t.value == "False") {
          e->literal = Value::Bool(false);
        } else if (t.value == "none" || t.value == "None") {
          e->literal = Value::None();
        } else {
          e->kind = Expr::Kind::kName;
          e->name = t.value;
        }
        Next();
        return e;
      }
      case T::kString: {
        std::string s;
        while (Cur().type == T::kString) {  // adjacent literals concatenate
          s += Cur().value;
          Next();
        }
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::String(std::move(s));
        return e;
      }
      case T::kInt: {
        int64_t v = 0;
        auto [p, ec] = std::from_chars(t.value.data(), t.value.data() + t.value.size(), v);
        if (ec != std::errc()) return Error(line, "integer literal " + t.value + " is too large");
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::Int(v);
        Next();
        return e;
      }
      case T::kFloat: {
        ExprPtr e = Make(Expr::Kind::kLiteral, line);
        e->literal = Value::Float(std::strtod(t.value.c_str(), nullptr));
        Next();
        return e;
      }
      case T::kOp:
        if (t.value == "(") {
          Next();
          ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(true, {}, true));
          RETURN_IF_ERROR(ExpectOp(")"));
          return e;
        }
        if (t.value == "[") {
          Next();
          ExprPtr e = Make(Expr::Kind::kList, line);
          while (!IsOp(Cur(), "]")) {
            if (!e->args.empty()) RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp(Cur(), "]")) break;
            ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
            e->args.push_back(std::move(item));
          }
          Next();
          return e;
        }
        if (t.value == "{") {
          Next();
          ExprPtr e = Make(Expr::Kind::kDict, line);
          while (!IsOp(Cur(), "}")) {
            if (!e->args.empty()) RETURN_IF_ERROR(ExpectOp(","));
            if (IsOp(Cur(), "}")) break;
            ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
            RETURN_IF_ERROR(ExpectOp(":"));
            ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
            e->args.push_back(std::move(key));
            e->args.push_back(std::move(value));
          }
          Next();
          return e;
        }
        break;
      default:
        break;
    }
    return Unexpected("an expression");
  }

  // Comma-separated expressions: a tuple when a comma appears, else the single expression.
  Result<ExprPtr> ParseTuple(bool with_condexpr, std::initializer_list<std::string_view> extra_end,
                             bool explicit_parentheses) {
    int line = Cur().line;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) RETURN_IF_ERROR(ExpectOp(","));
      const Token& t = Cur();
      bool end = t.type == T::kVarEnd || t.type == T::kBlockEnd || IsOp(t, ")");
      for (std::string_view e : extra_end) end = end || IsName(t, e);
      if (end) break;
      ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(with_condexpr));
      items.push_back(std::move(item));
      if (IsOp(Cur(), ",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) {
      if (!items.empty()) return std::move(items[0]);
      if (!explicit_parentheses) return Unexpected("an expression");
    }
    ExprPtr e = Make(Expr::Kind::kTuple, line);
    e->args = std::move(items);
    return e;
  }

  Result<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(Cur(), ".") || IsOp(Cur(), "[")) {
        ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp(Cur(), "(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp(Cur(), "|")) {
        ASSIGN_OR_RETURN(node, ParseFilterChain(std::move(node)));
      } else if (IsName(Cur(), "is")) {
        ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp(Cur(), "(")) {
        ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  Result<ExprPtr> ParseSubscript(ExprPtr node) {
    int line = Cur().line;
    if (SkipOp(".")) {
      if (Cur().type == T::kName) {
        ExprPtr e = Make(Expr::Kind::kAttr, line);
        e->name = Cur().value;
        e->args.push_back(std::move(node));
        Next();
        return e;
      }
      if (Cur().type == T::kInt) {
        ExprPtr e = Make(Expr::Kind::kItem, line);
        e->args.push_back(std::move(node));
        ASSIGN_OR_RETURN(ExprPtr index, ParsePrimary());
        e->args.push_back(std::move(index));
        return e;
      }
      return Unexpected("an attribute name");
    }
    Next();  // [
    ExprPtr start, stop, step;
    bool slice = false;
    if (!IsOp(Cur(), ":")) {
      ASSIGN_OR_RETURN(start, ParseExpression(true));
    }
    if (SkipOp(":")) {
      slice = true;
      if (!IsOp(Cur(), "]") && !IsOp(Cur(), ":")) {
        ASSIGN_OR_RETURN(stop, ParseExpression(true));
      }
      if (SkipOp(":")) {
        if (!IsOp(Cur(), "]")) {
          ASSIGN_OR_RETURN(step, ParseExpression(true));
        }
      }
    }
    if (IsOp(Cur(), ",")) return Unsupported("line " + std::to_string(line) + ": tuple subscripts");
    RETURN_IF_ERROR(ExpectOp("]"));
    if (!slice) {
      if (!start) return Error(line, "empty subscript");
      ExprPtr e = Make(Expr::Kind::kItem, line);
      e->args.push_back(std::move(node));
      e->args.push_back(std::move(start));
      return e;
    }
    ExprPtr e = Make(Expr::Kind::kSlice, line);
    e->args.push_back(std::move(node));
    e->args.push_back(std::move(start));
    e->args.push_back(std::move(stop));
    e->args.push_back(std::move(step));
    return e;
  }

  // Parses `(args, kw=value)` into e->args (after any existing) and e->kwargs.
  Status ParseCallArgs(Expr* e) {
    RETURN_IF_ERROR(ExpectOp("("));
    bool first = true;
    while (!IsOp(Cur(), ")")) {
      if (!first) RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      if (IsOp(Cur(), ")")) break;
      if (IsOp(Cur(), "*") || IsOp(Cur(), "**")) {
        return Unsupported("line " + std::to_string(Cur().line) + ": *args/**kwargs in calls");
      }
      if (Cur().type == T::kName && IsOp(Peek(), "=")) {
        std::string key = Cur().value;
        Next();
        Next();
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->kwargs.emplace_back(std::move(key), std::move(value));
      } else {
        if (!e->kwargs.empty()) {
          return Error(Cur().line, "positional argument after keyword argument");
        }
        ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        e->args.push_back(std::move(value));
      }
    }
    Next();
    return Status::Ok();
  }

  Result<ExprPtr> ParseCall(ExprPtr node) {
    ExprPtr e = Make(Expr::Kind::kCall, Cur().line);
    e->args.push_back(std::move(node));
    RETURN_IF_ERROR(ParseCallArgs(e.get()));
    return e;
  }

  Result<std::string> ParseDottedName() {
    ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (IsOp(Cur(), ".") && Peek().type == T::kName) {
      Next();
      name += "." + Cur().value;
      Next();
    }
    return name;
  }

  // `| f(args) | g ...`; with leading_pipe false the first filter has no `|` (filter blocks).
  Result<ExprPtr> ParseFilterChain(ExprPtr node, bool leading_pipe = true) {
    bool first = true;
    while ((first && !leading_pipe) || IsOp(Cur(), "|")) {
      if (!(first && !leading_pipe)) Next();
      first = false;
      ExprPtr e = Make(Expr::Kind::kFilter, Cur().line);
      ASSIGN_OR_RETURN(e->name, ParseDottedName());
      e->args.push_back(std::move(node));
      if (IsOp(Cur(), "(")) RETURN_IF_ERROR(ParseCallArgs(e.get()));
      node = std::move(e);
    }
    return node;
  }

  Result<ExprPtr> ParseTest(ExprPtr node) {
    int line = Cur().line;
    Next();  // is
    bool negated = SkipName("not");
    ExprPtr e = Make(Expr::Kind::kTest, line);
    ASSIGN_OR_RETURN(e->name, ParseDottedName());
    e->args.push_back(std::move(node));
    const Token& t = Cur();
    if (IsOp(t, "(")) {
      RETURN_IF_ERROR(ParseCallArgs(e.get()));
    } else if ((t.type == T::kName || t.type == T::kString || t.type == T::kInt ||
                t.type == T::kFloat || IsOp(t, "[") || IsOp(t, "{")) &&
               !IsName(t, "else") && !IsName(t, "or") && !IsName(t, "and")) {
      if (IsName(t, "is")) return Error(t.line, "tests cannot be chained with 'is'");
      ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
      ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      e->args.push_back(std::move(arg));
    }
    if (!negated) return e;
    ExprPtr n = Make(Expr::Kind::kNot, line);
    n->args.push_back(std::move(e));
    return n;
  }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int nesting_ = 0;
  int loop_depth_ = 0;
};

}  // namespace

Result<Body> ParseTokens(const std::vector<Token>& tokens) {
  return Parser(tokens).ParseTemplate();
}

}  // namespace corolla::jinja
