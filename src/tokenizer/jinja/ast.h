// The syntax tree of a parsed template, and the parser that builds it from lexer tokens.
// Nodes are immutable once parsed and owned by their parent (the Template owns the root), so a
// parsed tree may be rendered from many threads at once.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "tokenizer/jinja/lexer.h"
#include "tokenizer/jinja/value.h"

namespace corolla::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args: elements
    kTuple,    // args: elements
    kDict,     // args: key0, value0, key1, value1, ...
    kAttr,     // args[0].name
    kItem,     // args[0][args[1]]
    kSlice,    // args[0][args[1]:args[2]:args[3]], each bound may be null
    kCall,     // args[0](args[1..], kwargs)
    kFilter,   // args[0] | name(args[1..], kwargs); args[0] null in filter blocks
    kTest,     // args[0] is name(args[1..], kwargs)
    kNeg,      // -args[0]
    kPos,      // +args[0]
    kNot,      // not args[0]
    kAnd,      // args[0] and args[1]
    kOr,       // args[0] or args[1]
    kBinary,   // args[0] name args[1], name in + - * / // % **
    kConcat,   // args[0] ~ args[1] ~ ...
    kCompare,  // args[0] ops[0] args[1] ops[1] args[2] ...; ops: == != < <= > >= in notin
    kCond,     // args[0] if args[1] else args[2] (args[2] may be null)
  };
  Kind kind;
  int line = 0;
  std::string name;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches: (condition, body) ...; else_body
    kFor,          // for targets in expr [if cond]: body; else_body
    kSet,          // set targets = expr, or set targets[0].attr = expr
    kSetBlock,     // set targets[0] [| filters in expr]: body
    kMacro,        // macro name(params): body
    kCallBlock,    // call(params) expr: body  (body becomes `caller`)
    kFilterBlock,  // filter expr: body
    kBreak,
    kContinue,
    kWith,   // with params: body
    kScope,  // generation: body, rendered in place
  };
  Kind kind;
  int line = 0;
  std::string text;
  std::string name;
  std::string attr;
  ExprPtr expr;
  ExprPtr cond;
  std::vector<std::string> targets;
  bool unpack = false;  // targets written as a tuple (`for k, v in ...`)
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default/value may be null
  Body body;
  Body else_body;
};

// Parses the lexer's tokens into statements. Unknown tags and constructs we do not implement are
// Unsupported; malformed ones are InvalidArgument. Both name the line.
Result<Body> ParseTokens(const std::vector<Token>& tokens);

}  // namespace corolla::jinja
