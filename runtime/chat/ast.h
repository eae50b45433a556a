// The syntax tree of a template: jinja2's node types that chat templates use.
// Built by the parser (runtime/chat/parser.h), walked by the interpreter.
#ifndef PAGEDSERVE_RUNTIME_CHAT_AST_H_
#define PAGEDSERVE_RUNTIME_CHAT_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/chat/value.h"

namespace pagedserve::chat {

// ---------------------------------------------------------------- expressions

struct Expr {
  enum class Kind : uint8_t {
    kConst,
    kName,
    kList,
    kTuple,
    kDict,
    kGetAttr,
    kGetItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNot,
    kNeg,
    kPos,
    kBinary,
    kConcat,
    kCompare,
    kCondExpr,
  };
  Expr(Kind k, int l) : kind(k), line(l) {}
  virtual ~Expr() = default;
  Kind kind;
  int line;
};
using ExprPtr = std::unique_ptr<Expr>;

struct ConstExpr : Expr {
  ConstExpr(Value v, int l) : Expr(Kind::kConst, l), value(std::move(v)) {}
  Value value;
};

struct NameExpr : Expr {
  NameExpr(std::string n, int l) : Expr(Kind::kName, l), name(std::move(n)) {}
  std::string name;
};

// A list or tuple literal.
struct SeqExpr : Expr {
  using Expr::Expr;
  std::vector<ExprPtr> items;
};

struct DictExpr : Expr {
  explicit DictExpr(int l) : Expr(Kind::kDict, l) {}
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
};

struct GetAttrExpr : Expr {
  GetAttrExpr(ExprPtr o, std::string a, int l)
      : Expr(Kind::kGetAttr, l), object(std::move(o)), attr(std::move(a)) {}
  ExprPtr object;
  std::string attr;
};

struct GetItemExpr : Expr {
  GetItemExpr(ExprPtr o, ExprPtr i, int l)
      : Expr(Kind::kGetItem, l), object(std::move(o)), index(std::move(i)) {}
  ExprPtr object;
  ExprPtr index;  // a SliceExpr for x[a:b:c]
};

// start:stop:step inside [ ]; absent parts are null.
struct SliceExpr : Expr {
  explicit SliceExpr(int l) : Expr(Kind::kSlice, l) {}
  ExprPtr start, stop, step;
};

struct CallArgsExpr {
  std::vector<ExprPtr> positional;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  ExprPtr star_args;    // *args
  ExprPtr star_kwargs;  // **kwargs
};

struct CallExpr : Expr {
  CallExpr(ExprPtr c, int l) : Expr(Kind::kCall, l), callee(std::move(c)) {}
  ExprPtr callee;
  CallArgsExpr args;
};

// operand | name(args), and `operand is [not] name(args)` (negation is a kNot
// around the test).
struct FilterExpr : Expr {
  FilterExpr(Kind k, ExprPtr o, std::string n, int l)
      : Expr(k, l), operand(std::move(o)), name(std::move(n)) {}
  ExprPtr operand;  // null for the innermost filter of a {% filter %} block
  std::string name;
  CallArgsExpr args;
};

// not x, -x, +x.
struct UnaryExpr : Expr {
  UnaryExpr(Kind k, ExprPtr o, int l) : Expr(k, l), operand(std::move(o)) {}
  ExprPtr operand;
};

enum class BinaryOp : uint8_t { kAdd, kSub, kMul, kDiv, kFloorDiv, kMod, kPow, kAnd, kOr };

struct BinaryExpr : Expr {
  BinaryExpr(BinaryOp o, ExprPtr a, ExprPtr b, int l)
      : Expr(Kind::kBinary, l), op(o), left(std::move(a)), right(std::move(b)) {}
  BinaryOp op;
  ExprPtr left, right;
};

// a ~ b ~ c
struct ConcatExpr : Expr {
  explicit ConcatExpr(int l) : Expr(Kind::kConcat, l) {}
  std::vector<ExprPtr> parts;
};

enum class CompareOp : uint8_t { kEq, kNe, kLt, kLe, kGt, kGe, kIn, kNotIn };

// a < b <= c: chained as Python.
struct CompareExpr : Expr {
  CompareExpr(ExprPtr f, int l) : Expr(Kind::kCompare, l), first(std::move(f)) {}
  ExprPtr first;
  std::vector<std::pair<CompareOp, ExprPtr>> rest;
};

// then if test else otherwise (otherwise null: undefined when the test is false).
struct CondExpr : Expr {
  explicit CondExpr(int l) : Expr(Kind::kCondExpr, l) {}
  ExprPtr test, then, otherwise;
};

// ---------------------------------------------------------------- statements

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

// The left side of {% set %} or {% for %}: a name, a tuple of targets, or ns.attr.
struct Target {
  enum class Kind : uint8_t { kName, kTuple, kNamespaceAttr };
  Kind kind = Kind::kName;
  std::string name;
  std::string attr;
  std::vector<Target> items;
};

struct Stmt {
  enum class Kind : uint8_t {
    kText,
    kPrint,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kCallBlock,
    kFilterBlock,
    kWith,
    kBreak,
    kContinue,
    kScope,  // {% generation %}: renders its body
  };
  Stmt(Kind k, int l) : kind(k), line(l) {}
  virtual ~Stmt() = default;
  Kind kind;
  int line;
};

struct TextStmt : Stmt {
  TextStmt(std::string t, int l) : Stmt(Kind::kText, l), text(std::move(t)) {}
  std::string text;
};

struct PrintStmt : Stmt {
  PrintStmt(ExprPtr e, int l) : Stmt(Kind::kPrint, l), expr(std::move(e)) {}
  ExprPtr expr;
};

struct IfStmt : Stmt {
  explicit IfStmt(int l) : Stmt(Kind::kIf, l) {}
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, elif ...
  Body else_body;
};

struct ForStmt : Stmt {
  explicit ForStmt(int l) : Stmt(Kind::kFor, l) {}
  Target target;
  ExprPtr iter;
  ExprPtr filter;  // {% for x in xs if cond %}
  Body body;
  Body else_body;
};

struct SetStmt : Stmt {
  explicit SetStmt(int l) : Stmt(Kind::kSet, l) {}
  Target target;
  ExprPtr value;
};

// {% set x | filter %}body{% endset %}
struct SetBlockStmt : Stmt {
  explicit SetBlockStmt(int l) : Stmt(Kind::kSetBlock, l) {}
  Target target;
  ExprPtr filter;  // a FilterExpr chain whose innermost operand is null, or null
  Body body;
};

struct MacroDef {
  std::string name;
  std::vector<std::string> params;
  std::vector<ExprPtr> defaults;  // for the last defaults.size() params
  Body body;
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool uses_caller = false;
};

struct MacroStmt : Stmt {
  explicit MacroStmt(int l) : Stmt(Kind::kMacro, l) {}
  MacroDef def;
};

// {% call(params) macro(args) %}body{% endcall %}: the body is `caller`.
struct CallBlockStmt : Stmt {
  explicit CallBlockStmt(int l) : Stmt(Kind::kCallBlock, l) {}
  MacroDef caller;
  ExprPtr call;  // a CallExpr
};

struct FilterBlockStmt : Stmt {
  explicit FilterBlockStmt(int l) : Stmt(Kind::kFilterBlock, l) {}
  ExprPtr filter;  // a FilterExpr chain whose innermost operand is null
  Body body;
};

struct WithStmt : Stmt {
  explicit WithStmt(int l) : Stmt(Kind::kWith, l) {}
  std::vector<std::pair<Target, ExprPtr>> assignments;
  Body body;
};

struct ScopeStmt : Stmt {
  explicit ScopeStmt(int l) : Stmt(Kind::kScope, l) {}
  Body body;
};

struct TemplateAst {
  Body body;
};

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_AST_H_
