#include "runtime/chat/parser.h"

#include <algorithm>
#include <initializer_list>
#include <optional>
#include <set>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "runtime/chat/filters.h"
#include "runtime/chat/jinja_tests.h"
#include "runtime/chat/str_cat.h"
#include "runtime/common/status_macros.h"

namespace pagedserve::chat {
namespace {

using Names = std::vector<std::string_view>;

// ---------------------------------------------------------------- unknown filters and tests

// jinja2's compiler refuses an unknown filter or test at compile time unless
// it sits in a "soft" frame: the test or body of an {% if %} or an inline if,
// not inside a nested loop, macro or block.
class NameChecker {
 public:
  absl::Status Check(const Body& body, bool soft) {
    for (const StmtPtr& s : body) PS_RETURN_IF_ERROR(CheckStmt(*s, soft));
    return absl::OkStatus();
  }

 private:
  absl::Status CheckStmt(const Stmt& s, bool soft) {
    switch (s.kind) {
      case Stmt::Kind::kPrint: return CheckExpr(static_cast<const PrintStmt&>(s).expr.get(), soft);
      case Stmt::Kind::kIf: return CheckIf(static_cast<const IfStmt&>(s));
      case Stmt::Kind::kFor: {
        const auto& f = static_cast<const ForStmt&>(s);
        PS_RETURN_IF_ERROR(CheckExpr(f.iter.get(), soft));
        PS_RETURN_IF_ERROR(CheckExpr(f.filter.get(), false));
        PS_RETURN_IF_ERROR(Check(f.body, false));
        return Check(f.else_body, false);
      }
      case Stmt::Kind::kSet: return CheckExpr(static_cast<const SetStmt&>(s).value.get(), soft);
      case Stmt::Kind::kSetBlock: {
        const auto& b = static_cast<const SetBlockStmt&>(s);
        PS_RETURN_IF_ERROR(CheckExpr(b.filter.get(), soft));
        return Check(b.body, false);
      }
      case Stmt::Kind::kMacro: return CheckMacro(static_cast<const MacroStmt&>(s).def);
      case Stmt::Kind::kCallBlock: {
        const auto& c = static_cast<const CallBlockStmt&>(s);
        PS_RETURN_IF_ERROR(CheckExpr(c.call.get(), soft));
        return CheckMacro(c.caller);
      }
      case Stmt::Kind::kFilterBlock: {
        const auto& f = static_cast<const FilterBlockStmt&>(s);
        PS_RETURN_IF_ERROR(CheckExpr(f.filter.get(), soft));
        return Check(f.body, false);
      }
      case Stmt::Kind::kWith: {
        const auto& w = static_cast<const WithStmt&>(s);
        for (const auto& [target, value] : w.assignments)
          PS_RETURN_IF_ERROR(CheckExpr(value.get(), soft));
        return Check(w.body, false);
      }
      case Stmt::Kind::kScope: return Check(static_cast<const ScopeStmt&>(s).body, false);
      default: return absl::OkStatus();
    }
  }

  absl::Status CheckIf(const IfStmt& s) {
    for (const auto& [test, body] : s.branches) {
      PS_RETURN_IF_ERROR(CheckExpr(test.get(), true));
      PS_RETURN_IF_ERROR(Check(body, true));
    }
    return Check(s.else_body, true);
  }

  absl::Status CheckMacro(const MacroDef& def) {
    for (const ExprPtr& d : def.defaults) PS_RETURN_IF_ERROR(CheckExpr(d.get(), false));
    return Check(def.body, false);
  }

  absl::Status CheckArgs(const CallArgsExpr& args, bool soft) {
    for (const ExprPtr& e : args.positional) PS_RETURN_IF_ERROR(CheckExpr(e.get(), soft));
    for (const auto& [name, e] : args.keywords) PS_RETURN_IF_ERROR(CheckExpr(e.get(), soft));
    PS_RETURN_IF_ERROR(CheckExpr(args.star_args.get(), soft));
    return CheckExpr(args.star_kwargs.get(), soft);
  }

  absl::Status CheckExpr(const Expr* e, bool soft) {
    if (e == nullptr) return absl::OkStatus();
    switch (e->kind) {
      case Expr::Kind::kList:
      case Expr::Kind::kTuple:
        for (const ExprPtr& item : static_cast<const SeqExpr*>(e)->items) {
          PS_RETURN_IF_ERROR(CheckExpr(item.get(), soft));
        }
        return absl::OkStatus();
      case Expr::Kind::kDict:
        for (const auto& [k, v] : static_cast<const DictExpr*>(e)->items) {
          PS_RETURN_IF_ERROR(CheckExpr(k.get(), soft));
          PS_RETURN_IF_ERROR(CheckExpr(v.get(), soft));
        }
        return absl::OkStatus();
      case Expr::Kind::kGetAttr:
        return CheckExpr(static_cast<const GetAttrExpr*>(e)->object.get(), soft);
      case Expr::Kind::kGetItem: {
        const auto* g = static_cast<const GetItemExpr*>(e);
        PS_RETURN_IF_ERROR(CheckExpr(g->object.get(), soft));
        return CheckExpr(g->index.get(), soft);
      }
      case Expr::Kind::kSlice: {
        const auto* s = static_cast<const SliceExpr*>(e);
        PS_RETURN_IF_ERROR(CheckExpr(s->start.get(), soft));
        PS_RETURN_IF_ERROR(CheckExpr(s->stop.get(), soft));
        return CheckExpr(s->step.get(), soft);
      }
      case Expr::Kind::kCall: {
        const auto* c = static_cast<const CallExpr*>(e);
        PS_RETURN_IF_ERROR(CheckExpr(c->callee.get(), soft));
        return CheckArgs(c->args, soft);
      }
      case Expr::Kind::kFilter:
      case Expr::Kind::kTest: return CheckFilterOrTest(static_cast<const FilterExpr*>(e), soft);
      case Expr::Kind::kNot:
      case Expr::Kind::kNeg:
      case Expr::Kind::kPos:
        return CheckExpr(static_cast<const UnaryExpr*>(e)->operand.get(), soft);
      case Expr::Kind::kBinary: {
        const auto* b = static_cast<const BinaryExpr*>(e);
        PS_RETURN_IF_ERROR(CheckExpr(b->left.get(), soft));
        return CheckExpr(b->right.get(), soft);
      }
      case Expr::Kind::kConcat:
        for (const ExprPtr& p : static_cast<const ConcatExpr*>(e)->parts) {
          PS_RETURN_IF_ERROR(CheckExpr(p.get(), soft));
        }
        return absl::OkStatus();
      case Expr::Kind::kCompare: {
        const auto* c = static_cast<const CompareExpr*>(e);
        PS_RETURN_IF_ERROR(CheckExpr(c->first.get(), soft));
        for (const auto& [op, operand] : c->rest)
          PS_RETURN_IF_ERROR(CheckExpr(operand.get(), soft));
        return absl::OkStatus();
      }
      case Expr::Kind::kCondExpr: {
        const auto* c = static_cast<const CondExpr*>(e);
        PS_RETURN_IF_ERROR(CheckExpr(c->test.get(), true));
        PS_RETURN_IF_ERROR(CheckExpr(c->then.get(), true));
        return CheckExpr(c->otherwise.get(), true);
      }
      default: return absl::OkStatus();
    }
  }

  absl::Status CheckFilterOrTest(const FilterExpr* f, bool soft) {
    const bool filter = f->kind == Expr::Kind::kFilter;
    const bool known = filter ? IsKnownFilter(f->name) : IsKnownTest(f->name);
    if (!known && !soft) {
      return absl::InvalidArgumentError(
          Cat("line ", f->line, ": No ", filter ? "filter" : "test", " named '", f->name, "'."));
    }
    PS_RETURN_IF_ERROR(CheckExpr(f->operand.get(), soft));
    return CheckArgs(f->args, soft);
  }
};

// ---------------------------------------------------------------- the parser

class Parser {
 public:
  Parser(std::vector<Token> tokens, const ParseOptions& options)
      : tokens_(std::move(tokens)), options_(options) {}

  absl::StatusOr<std::unique_ptr<TemplateAst>> Run() {
    auto ast = std::make_unique<TemplateAst>();
    PS_RETURN_IF_ERROR(Subparse({}, &ast->body));
    PS_RETURN_IF_ERROR(NameChecker().Check(ast->body, false));
    return ast;
  }

 private:
  // RAII: one level of nesting, refused past options_.max_nesting.
  class Nest {
   public:
    explicit Nest(Parser* p) : p_(p) { ++p_->depth_; }
    ~Nest() { --p_->depth_; }
    absl::Status Check() const {
      if (p_->depth_ <= p_->options_.max_nesting) return absl::OkStatus();
      return absl::ResourceExhaustedError(Cat("line ", p_->cur().line,
                                              ": the template nests deeper than ",
                                              p_->options_.max_nesting, " levels (max_nesting)"));
    }

   private:
    Parser* p_;
  };

  // ------------------------------------------------------------ token stream

  const Token& cur() const { return tokens_[pos_]; }
  const Token& peek() const { return tokens_[std::min(pos_ + 1, tokens_.size() - 1)]; }
  void Advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool IsOp(std::string_view op) const {
    return cur().type == TokenType::kOperator && cur().text == op;
  }
  bool IsName(std::string_view name) const {
    return cur().type == TokenType::kName && cur().text == name;
  }
  bool IsAnyName(const Names& names) const {
    return cur().type == TokenType::kName &&
           std::find(names.begin(), names.end(), cur().text) != names.end();
  }
  bool SkipOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Advance();
    return true;
  }
  bool SkipName(std::string_view name) {
    if (!IsName(name)) return false;
    Advance();
    return true;
  }

  absl::Status Error(std::string_view message) const {
    return absl::InvalidArgumentError(Cat("line ", cur().line, ": ", message));
  }

  static std::string Describe(const Token& t) {
    switch (t.type) {
      case TokenType::kEof: return "end of template";
      case TokenType::kBlockEnd: return "end of statement block";
      case TokenType::kVariableEnd: return "end of print statement";
      case TokenType::kBlockBegin: return "begin of statement block";
      case TokenType::kVariableBegin: return "begin of print statement";
      case TokenType::kData: return "template data";
      default: return t.text;
    }
  }

  absl::Status ExpectOp(std::string_view op) {
    if (SkipOp(op)) return absl::OkStatus();
    return Error(Cat("expected token '", op, "', got '", Describe(cur()), "'"));
  }
  absl::Status ExpectType(TokenType type, std::string_view what) {
    if (cur().type == type) {
      Advance();
      return absl::OkStatus();
    }
    return Error(Cat("expected token '", what, "', got '", Describe(cur()), "'"));
  }
  absl::StatusOr<std::string> ExpectName() {
    if (cur().type != TokenType::kName)
      return Error(Cat("expected token 'name', got '", Describe(cur()), "'"));
    std::string name = cur().text;
    Advance();
    return name;
  }
  absl::Status ExpectNameValue(std::string_view name) {
    if (SkipName(name)) return absl::OkStatus();
    return Error(Cat("expected token '", name, "', got '", Describe(cur()), "'"));
  }

  // ------------------------------------------------------------ statements

  absl::Status Subparse(const Names& end_tokens, Body* body) {
    while (cur().type != TokenType::kEof) {
      const Token& t = cur();
      if (t.type == TokenType::kData) {
        body->push_back(std::make_unique<TextStmt>(t.text, t.line));
        Advance();
      } else if (t.type == TokenType::kVariableBegin) {
        Advance();
        const int line = cur().line;
        PS_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(TupleMode{}));
        PS_RETURN_IF_ERROR(ExpectType(TokenType::kVariableEnd, "end of print statement"));
        body->push_back(std::make_unique<PrintStmt>(std::move(e), line));
      } else if (t.type == TokenType::kBlockBegin) {
        Advance();
        if (!end_tokens.empty() && IsAnyName(end_tokens)) return absl::OkStatus();
        PS_RETURN_IF_ERROR(ParseStatement(body));
        PS_RETURN_IF_ERROR(ExpectType(TokenType::kBlockEnd, "end of statement block"));
      } else {
        return Error(Cat("unexpected '", Describe(t), "'"));
      }
    }
    return absl::OkStatus();
  }

  absl::Status ParseStatements(const Names& end_tokens, bool drop_needle, Body* body) {
    Nest nest(this);
    PS_RETURN_IF_ERROR(nest.Check());
    SkipOp(":");
    PS_RETURN_IF_ERROR(ExpectType(TokenType::kBlockEnd, "end of statement block"));
    PS_RETURN_IF_ERROR(Subparse(end_tokens, body));
    if (cur().type == TokenType::kEof) {
      std::vector<std::string> quoted;
      for (std::string_view t : end_tokens) quoted.push_back(Cat("'", t, "'"));
      return Error(Cat("unexpected end of template, expected ", absl::StrJoin(quoted, " or ")));
    }
    if (drop_needle) Advance();
    return absl::OkStatus();
  }

  absl::Status ParseStatement(Body* body) {
    if (cur().type != TokenType::kName) return Error("tag name expected");
    const std::string tag = cur().text;
    if (tag == "if") return Append(ParseIf(), body);
    if (tag == "for") return Append(ParseFor(), body);
    if (tag == "set") return Append(ParseSet(), body);
    if (tag == "macro") return Append(ParseMacro(), body);
    if (tag == "call") return Append(ParseCallBlock(), body);
    if (tag == "filter") return Append(ParseFilterBlock(), body);
    if (tag == "with") return Append(ParseWith(), body);
    if (tag == "generation") return Append(ParseScope("endgeneration"), body);
    if (tag == "print") return ParsePrint(body);
    if (tag == "break" || tag == "continue") return Append(ParseLoopControl(), body);
    if (tag == "extends" || tag == "block" || tag == "include" || tag == "import" ||
        tag == "from") {
      return absl::UnimplementedError(
          Cat("line ", cur().line, ": the '", tag,
              "' tag is not supported (templates cannot load other templates)"));
    }
    if (tag == "autoescape") {
      return absl::UnimplementedError(
          Cat("line ", cur().line, ": the 'autoescape' tag is not supported"));
    }
    return Error(Cat("Encountered unknown tag '", tag, "'."));
  }

  static absl::Status Append(absl::StatusOr<StmtPtr> stmt, Body* body) {
    if (!stmt.ok()) return stmt.status();
    body->push_back(std::move(*stmt));
    return absl::OkStatus();
  }

  absl::StatusOr<StmtPtr> ParseIf() {
    auto node = std::make_unique<IfStmt>(cur().line);
    Advance();
    while (true) {
      PS_ASSIGN_OR_RETURN(ExprPtr test, ParseTuple(NoCondExpr({})));
      Body body;
      PS_RETURN_IF_ERROR(ParseStatements({"elif", "else", "endif"}, false, &body));
      node->branches.emplace_back(std::move(test), std::move(body));
      const std::string token = cur().text;
      Advance();
      if (token == "elif") continue;
      if (token == "else") PS_RETURN_IF_ERROR(ParseStatements({"endif"}, true, &node->else_body));
      break;
    }
    return node;
  }

  absl::StatusOr<StmtPtr> ParseFor() {
    auto node = std::make_unique<ForStmt>(cur().line);
    Advance();
    PS_ASSIGN_OR_RETURN(node->target, ParseAssignTarget({"in"}, false));
    PS_RETURN_IF_ERROR(ExpectNameValue("in"));
    PS_ASSIGN_OR_RETURN(node->iter, ParseTuple(NoCondExpr({"recursive"})));
    if (SkipName("if")) {
      PS_ASSIGN_OR_RETURN(node->filter, ParseExpression(true));
    }
    if (IsName("recursive")) {
      return absl::UnimplementedError(
          Cat("line ", cur().line, ": recursive for loops are not supported"));
    }
    ++loop_depth_;
    const absl::Status body = ParseStatements({"endfor", "else"}, false, &node->body);
    --loop_depth_;
    PS_RETURN_IF_ERROR(body);
    const bool has_else = IsName("else");
    Advance();
    if (has_else) PS_RETURN_IF_ERROR(ParseStatements({"endfor"}, true, &node->else_body));
    return node;
  }

  absl::StatusOr<StmtPtr> ParseSet() {
    const int line = cur().line;
    Advance();
    PS_ASSIGN_OR_RETURN(Target target, ParseAssignTarget({}, true));
    if (SkipOp("=")) {
      auto node = std::make_unique<SetStmt>(line);
      node->target = std::move(target);
      PS_ASSIGN_OR_RETURN(node->value, ParseTuple(TupleMode{}));
      return node;
    }
    auto node = std::make_unique<SetBlockStmt>(line);
    node->target = std::move(target);
    if (IsOp("|")) {
      PS_ASSIGN_OR_RETURN(node->filter, ParseFilter(nullptr, false));
    }
    PS_RETURN_IF_ERROR(ParseBodyOutsideLoop({"endset"}, &node->body, nullptr));
    return node;
  }

  // A body with its own frame (macro, caller, set block): break/continue of an
  // enclosing loop do not reach into it. `def`, when given, learns whether the
  // body reads varargs, kwargs or caller.
  absl::Status ParseBodyOutsideLoop(const Names& end, Body* body, MacroDef* def) {
    const int saved_loop_depth = loop_depth_;
    loop_depth_ = 0;
    names_used_.emplace_back();
    absl::Status status = ParseStatements(end, true, body);
    loop_depth_ = saved_loop_depth;
    const std::set<std::string> used = std::move(names_used_.back());
    names_used_.pop_back();
    if (def != nullptr) {
      def->uses_varargs = used.count("varargs") > 0;
      def->uses_kwargs = used.count("kwargs") > 0;
      def->uses_caller = used.count("caller") > 0;
    }
    return status;
  }

  absl::StatusOr<StmtPtr> ParseMacro() {
    auto node = std::make_unique<MacroStmt>(cur().line);
    Advance();
    PS_ASSIGN_OR_RETURN(node->def.name, ExpectName());
    PS_RETURN_IF_ERROR(ParseSignature(&node->def));
    PS_RETURN_IF_ERROR(ParseBodyOutsideLoop({"endmacro"}, &node->def.body, &node->def));
    return node;
  }

  absl::Status ParseSignature(MacroDef* def) {
    PS_RETURN_IF_ERROR(ExpectOp("("));
    while (!IsOp(")")) {
      if (!def->params.empty()) PS_RETURN_IF_ERROR(ExpectOp(","));
      PS_ASSIGN_OR_RETURN(std::string name, ExpectName());
      if (std::find(def->params.begin(), def->params.end(), name) != def->params.end()) {
        return Error(Cat("duplicate argument '", name, "' in macro definition"));
      }
      if (SkipOp("=")) {
        PS_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        def->defaults.push_back(std::move(value));
      } else if (!def->defaults.empty()) {
        return Error("non-default argument follows default argument");
      }
      def->params.push_back(std::move(name));
    }
    return ExpectOp(")");
  }

  absl::StatusOr<StmtPtr> ParseCallBlock() {
    auto node = std::make_unique<CallBlockStmt>(cur().line);
    Advance();
    node->caller.name = "caller";
    if (IsOp("(")) PS_RETURN_IF_ERROR(ParseSignature(&node->caller));
    PS_ASSIGN_OR_RETURN(node->call, ParseExpression(true));
    if (node->call->kind != Expr::Kind::kCall) return Error("expected call");
    PS_RETURN_IF_ERROR(ParseBodyOutsideLoop({"endcall"}, &node->caller.body, &node->caller));
    return node;
  }

  absl::StatusOr<StmtPtr> ParseFilterBlock() {
    auto node = std::make_unique<FilterBlockStmt>(cur().line);
    Advance();
    PS_ASSIGN_OR_RETURN(node->filter, ParseFilter(nullptr, true));
    PS_RETURN_IF_ERROR(ParseBodyOutsideLoop({"endfilter"}, &node->body, nullptr));
    return node;
  }

  absl::StatusOr<StmtPtr> ParseWith() {
    auto node = std::make_unique<WithStmt>(cur().line);
    Advance();
    while (cur().type != TokenType::kBlockEnd) {
      if (!node->assignments.empty()) PS_RETURN_IF_ERROR(ExpectOp(","));
      PS_ASSIGN_OR_RETURN(Target target, ParseAssignTarget({}, false));
      PS_RETURN_IF_ERROR(ExpectOp("="));
      PS_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      node->assignments.emplace_back(std::move(target), std::move(value));
    }
    PS_RETURN_IF_ERROR(ParseStatements({"endwith"}, true, &node->body));
    return node;
  }

  absl::StatusOr<StmtPtr> ParseScope(std::string_view end) {
    auto node = std::make_unique<ScopeStmt>(cur().line);
    Advance();
    PS_RETURN_IF_ERROR(ParseBodyOutsideLoop({end}, &node->body, nullptr));
    return node;
  }

  absl::Status ParsePrint(Body* body) {
    Advance();
    bool first = true;
    while (cur().type != TokenType::kBlockEnd) {
      if (!first) PS_RETURN_IF_ERROR(ExpectOp(","));
      first = false;
      const int line = cur().line;
      PS_ASSIGN_OR_RETURN(ExprPtr e, ParseExpression(true));
      body->push_back(std::make_unique<PrintStmt>(std::move(e), line));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<StmtPtr> ParseLoopControl() {
    const bool is_break = IsName("break");
    if (loop_depth_ == 0) return Error(Cat("'", cur().text, "' outside a for loop"));
    auto node =
        std::make_unique<Stmt>(is_break ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, cur().line);
    Advance();
    return node;
  }

  // ------------------------------------------------------------ assignment targets

  absl::StatusOr<Target> ParseAssignTarget(const Names& extra_end, bool with_namespace) {
    const int line = cur().line;
    PS_ASSIGN_OR_RETURN(ExprPtr e, ParseTuple(Simplified(extra_end, with_namespace)));
    return ToTarget(*e, line);
  }

  absl::StatusOr<Target> ToTarget(const Expr& e, int line) const {
    Target t;
    if (e.kind == Expr::Kind::kConst) {
      return absl::InvalidArgumentError(Cat("line ", line, ": can't assign to 'const'"));
    }
    if (e.kind == Expr::Kind::kName) {
      t.name = static_cast<const NameExpr&>(e).name;
      return t;
    }
    if (e.kind == Expr::Kind::kGetAttr) {  // ns.attr, only made by ParsePrimary(with_namespace)
      const auto& g = static_cast<const GetAttrExpr&>(e);
      t.kind = Target::Kind::kNamespaceAttr;
      t.name = static_cast<const NameExpr&>(*g.object).name;
      t.attr = g.attr;
      return t;
    }
    if (e.kind == Expr::Kind::kTuple) {
      t.kind = Target::Kind::kTuple;
      for (const ExprPtr& item : static_cast<const SeqExpr&>(e).items) {
        PS_ASSIGN_OR_RETURN(Target sub, ToTarget(*item, line));
        t.items.push_back(std::move(sub));
      }
      return t;
    }
    return absl::InvalidArgumentError(Cat("line ", line, ": can't assign to this expression"));
  }

  // ------------------------------------------------------------ expressions

  absl::StatusOr<ExprPtr> ParseExpression(bool with_condexpr) {
    Nest nest(this);
    PS_RETURN_IF_ERROR(nest.Check());
    return with_condexpr ? ParseCondExpr() : ParseOr();
  }

  absl::StatusOr<ExprPtr> ParseCondExpr() {
    PS_ASSIGN_OR_RETURN(ExprPtr expr1, ParseOr());
    while (IsName("if")) {
      auto node = std::make_unique<CondExpr>(cur().line);
      Advance();
      PS_ASSIGN_OR_RETURN(node->test, ParseOr());
      if (SkipName("else")) {
        PS_ASSIGN_OR_RETURN(node->otherwise, ParseCondExpr());
      }
      node->then = std::move(expr1);
      expr1 = std::move(node);
    }
    return expr1;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    PS_ASSIGN_OR_RETURN(ExprPtr left, ParseAnd());
    while (IsName("or")) {
      const int line = cur().line;
      Advance();
      PS_ASSIGN_OR_RETURN(ExprPtr right, ParseAnd());
      left = std::make_unique<BinaryExpr>(BinaryOp::kOr, std::move(left), std::move(right), line);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    PS_ASSIGN_OR_RETURN(ExprPtr left, ParseNot());
    while (IsName("and")) {
      const int line = cur().line;
      Advance();
      PS_ASSIGN_OR_RETURN(ExprPtr right, ParseNot());
      left = std::make_unique<BinaryExpr>(BinaryOp::kAnd, std::move(left), std::move(right), line);
    }
    return left;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (!IsName("not")) return ParseCompare();
    const int line = cur().line;
    Advance();
    Nest nest(this);
    PS_RETURN_IF_ERROR(nest.Check());
    PS_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
    return std::make_unique<UnaryExpr>(Expr::Kind::kNot, std::move(operand), line);
  }

  std::optional<CompareOp> CompareOperator() const {
    if (cur().type == TokenType::kOperator) {
      const std::string& t = cur().text;
      if (t == "==") return CompareOp::kEq;
      if (t == "!=") return CompareOp::kNe;
      if (t == "<") return CompareOp::kLt;
      if (t == "<=") return CompareOp::kLe;
      if (t == ">") return CompareOp::kGt;
      if (t == ">=") return CompareOp::kGe;
      return std::nullopt;
    }
    if (IsName("in")) return CompareOp::kIn;
    if (IsName("not") && peek().type == TokenType::kName && peek().text == "in")
      return CompareOp::kNotIn;
    return std::nullopt;
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    const int line = cur().line;
    PS_ASSIGN_OR_RETURN(ExprPtr first, ParseMath1());
    std::unique_ptr<CompareExpr> node;
    while (std::optional<CompareOp> op = CompareOperator()) {
      Advance();
      if (*op == CompareOp::kNotIn) Advance();
      PS_ASSIGN_OR_RETURN(ExprPtr operand, ParseMath1());
      if (!node) node = std::make_unique<CompareExpr>(std::move(first), line);
      node->rest.emplace_back(*op, std::move(operand));
    }
    if (!node) return first;
    return node;
  }

  // One left-associative level: operators `ops` (token text -> BinaryOp) over `next`.
  template <typename Next>
  absl::StatusOr<ExprPtr> ParseBinaryLevel(
      std::initializer_list<std::pair<std::string_view, BinaryOp>> ops, Next next) {
    PS_ASSIGN_OR_RETURN(ExprPtr left, (this->*next)());
    while (true) {
      const auto it =
          std::find_if(ops.begin(), ops.end(), [&](const auto& p) { return IsOp(p.first); });
      if (it == ops.end()) return left;
      const int line = cur().line;
      Advance();
      PS_ASSIGN_OR_RETURN(ExprPtr right, (this->*next)());
      left = std::make_unique<BinaryExpr>(it->second, std::move(left), std::move(right), line);
    }
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    return ParseBinaryLevel({{"+", BinaryOp::kAdd}, {"-", BinaryOp::kSub}}, &Parser::ParseConcat);
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    const int line = cur().line;
    PS_ASSIGN_OR_RETURN(ExprPtr first, ParseMath2());
    if (!IsOp("~")) return first;
    auto node = std::make_unique<ConcatExpr>(line);
    node->parts.push_back(std::move(first));
    while (SkipOp("~")) {
      PS_ASSIGN_OR_RETURN(ExprPtr part, ParseMath2());
      node->parts.push_back(std::move(part));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    return ParseBinaryLevel({{"*", BinaryOp::kMul},
                             {"/", BinaryOp::kDiv},
                             {"//", BinaryOp::kFloorDiv},
                             {"%", BinaryOp::kMod}},
                            &Parser::ParsePow);
  }

  absl::StatusOr<ExprPtr> ParsePow() {
    return ParseBinaryLevel({{"**", BinaryOp::kPow}}, &Parser::ParseUnaryFiltered);
  }

  absl::StatusOr<ExprPtr> ParseUnaryFiltered() { return ParseUnary(true); }

  absl::StatusOr<ExprPtr> ParseUnary(bool with_filter) {
    Nest nest(this);
    PS_RETURN_IF_ERROR(nest.Check());
    const int line = cur().line;
    ExprPtr node;
    if (IsOp("-") || IsOp("+")) {
      const Expr::Kind kind = IsOp("-") ? Expr::Kind::kNeg : Expr::Kind::kPos;
      Advance();
      PS_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
      node = std::make_unique<UnaryExpr>(kind, std::move(operand), line);
    } else {
      PS_ASSIGN_OR_RETURN(node, ParsePrimary(false));
    }
    PS_ASSIGN_OR_RETURN(node, ParsePostfix(std::move(node)));
    if (with_filter) {
      PS_ASSIGN_OR_RETURN(node, ParseFilterExpr(std::move(node)));
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePrimary(bool with_namespace) {
    const Token& t = cur();
    const int line = t.line;
    switch (t.type) {
      case TokenType::kName: return ParseNamePrimary(with_namespace);
      case TokenType::kString: {
        std::string text;
        while (cur().type == TokenType::kString) {
          text += cur().text;
          Advance();
        }
        return std::make_unique<ConstExpr>(Value(std::move(text)), line);
      }
      case TokenType::kInteger:
        Advance();
        return std::make_unique<ConstExpr>(Value(tokens_[pos_ - 1].int_value), line);
      case TokenType::kFloat:
        Advance();
        return std::make_unique<ConstExpr>(Value(tokens_[pos_ - 1].float_value), line);
      default: break;
    }
    if (SkipOp("(")) {
      PS_ASSIGN_OR_RETURN(ExprPtr node, ParseTuple(Parenthesized()));
      PS_RETURN_IF_ERROR(ExpectOp(")"));
      return node;
    }
    if (IsOp("[")) return ParseList();
    if (IsOp("{")) return ParseDict();
    return Error(Cat("unexpected '", Describe(t), "'"));
  }

  absl::StatusOr<ExprPtr> ParseNamePrimary(bool with_namespace) {
    const std::string name = cur().text;
    const int line = cur().line;
    Advance();
    if (name == "true" || name == "True") return std::make_unique<ConstExpr>(Value(true), line);
    if (name == "false" || name == "False") return std::make_unique<ConstExpr>(Value(false), line);
    if (name == "none" || name == "None") return std::make_unique<ConstExpr>(Value(nullptr), line);
    if (with_namespace && IsOp(".")) {
      Advance();
      PS_ASSIGN_OR_RETURN(std::string attr, ExpectName());
      return std::make_unique<GetAttrExpr>(std::make_unique<NameExpr>(name, line), std::move(attr),
                                           line);
    }
    if (!names_used_.empty()) names_used_.back().insert(name);
    return std::make_unique<NameExpr>(name, line);
  }

  struct TupleMode {
    bool simplified = false;
    bool with_condexpr = true;
    Names extra_end;
    bool explicit_parentheses = false;
    bool with_namespace = false;
  };

  static TupleMode NoCondExpr(Names extra_end) {
    TupleMode mode;
    mode.with_condexpr = false;
    mode.extra_end = std::move(extra_end);
    return mode;
  }
  static TupleMode Simplified(Names extra_end, bool with_namespace) {
    TupleMode mode;
    mode.simplified = true;
    mode.extra_end = std::move(extra_end);
    mode.with_namespace = with_namespace;
    return mode;
  }
  static TupleMode Parenthesized() {
    TupleMode mode;
    mode.explicit_parentheses = true;
    return mode;
  }

  bool IsTupleEnd(const Names& extra_end) const {
    const TokenType t = cur().type;
    if (t == TokenType::kVariableEnd || t == TokenType::kBlockEnd || IsOp(")")) return true;
    return !extra_end.empty() && IsAnyName(extra_end);
  }

  absl::StatusOr<ExprPtr> ParseTuple(const TupleMode& mode) {
    const int line = cur().line;
    std::vector<ExprPtr> args;
    bool is_tuple = false;
    while (true) {
      if (!args.empty()) PS_RETURN_IF_ERROR(ExpectOp(","));
      if (IsTupleEnd(mode.extra_end)) break;
      absl::StatusOr<ExprPtr> item =
          mode.simplified ? ParsePrimary(mode.with_namespace) : ParseExpression(mode.with_condexpr);
      if (!item.ok()) return item.status();
      args.push_back(std::move(*item));
      if (!IsOp(",")) break;
      is_tuple = true;
    }
    if (!is_tuple) {
      if (!args.empty()) return std::move(args[0]);
      if (!mode.explicit_parentheses) {
        return Error(Cat("Expected an expression, got '", Describe(cur()), "'"));
      }
    }
    auto node = std::make_unique<SeqExpr>(Expr::Kind::kTuple, line);
    node->items = std::move(args);
    return node;
  }

  absl::StatusOr<ExprPtr> ParseList() {
    auto node = std::make_unique<SeqExpr>(Expr::Kind::kList, cur().line);
    PS_RETURN_IF_ERROR(ExpectOp("["));
    while (!IsOp("]")) {
      if (!node->items.empty()) PS_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("]")) break;
      PS_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression(true));
      node->items.push_back(std::move(item));
    }
    PS_RETURN_IF_ERROR(ExpectOp("]"));
    return node;
  }

  absl::StatusOr<ExprPtr> ParseDict() {
    auto node = std::make_unique<DictExpr>(cur().line);
    PS_RETURN_IF_ERROR(ExpectOp("{"));
    while (!IsOp("}")) {
      if (!node->items.empty()) PS_RETURN_IF_ERROR(ExpectOp(","));
      if (IsOp("}")) break;
      PS_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression(true));
      PS_RETURN_IF_ERROR(ExpectOp(":"));
      PS_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
      node->items.emplace_back(std::move(key), std::move(value));
    }
    PS_RETURN_IF_ERROR(ExpectOp("}"));
    return node;
  }

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr node) {
    while (true) {
      if (IsOp(".") || IsOp("[")) {
        PS_ASSIGN_OR_RETURN(node, ParseSubscript(std::move(node)));
      } else if (IsOp("(")) {
        PS_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseFilterExpr(ExprPtr node) {
    while (true) {
      if (IsOp("|")) {
        PS_ASSIGN_OR_RETURN(node, ParseFilter(std::move(node), false));
      } else if (IsName("is")) {
        PS_ASSIGN_OR_RETURN(node, ParseTest(std::move(node)));
      } else if (IsOp("(")) {
        PS_ASSIGN_OR_RETURN(node, ParseCall(std::move(node)));
      } else {
        return node;
      }
    }
  }

  absl::StatusOr<ExprPtr> ParseSubscript(ExprPtr node) {
    const int line = cur().line;
    if (SkipOp(".")) {
      const Token& attr = cur();
      if (attr.type == TokenType::kName) {
        Advance();
        return std::make_unique<GetAttrExpr>(std::move(node), tokens_[pos_ - 1].text, line);
      }
      if (attr.type != TokenType::kInteger) return Error("expected name or number");
      Advance();
      auto index = std::make_unique<ConstExpr>(Value(tokens_[pos_ - 1].int_value), line);
      return std::make_unique<GetItemExpr>(std::move(node), std::move(index), line);
    }
    PS_RETURN_IF_ERROR(ExpectOp("["));
    std::vector<ExprPtr> args;
    while (!IsOp("]")) {
      if (!args.empty()) PS_RETURN_IF_ERROR(ExpectOp(","));
      PS_ASSIGN_OR_RETURN(ExprPtr arg, ParseSubscribed());
      args.push_back(std::move(arg));
    }
    PS_RETURN_IF_ERROR(ExpectOp("]"));
    ExprPtr index;
    if (args.size() == 1) {
      index = std::move(args[0]);
    } else {
      auto tuple = std::make_unique<SeqExpr>(Expr::Kind::kTuple, line);
      tuple->items = std::move(args);
      index = std::move(tuple);
    }
    return std::make_unique<GetItemExpr>(std::move(node), std::move(index), line);
  }

  bool AtSliceEnd() const { return IsOp("]") || IsOp(","); }

  absl::StatusOr<ExprPtr> ParseSubscribed() {
    const int line = cur().line;
    auto slice = std::make_unique<SliceExpr>(line);
    if (!SkipOp(":")) {
      PS_ASSIGN_OR_RETURN(ExprPtr node, ParseExpression(true));
      if (!SkipOp(":")) return node;
      slice->start = std::move(node);
    }
    if (!IsOp(":") && !AtSliceEnd()) {
      PS_ASSIGN_OR_RETURN(slice->stop, ParseExpression(true));
    }
    if (SkipOp(":") && !AtSliceEnd()) {
      PS_ASSIGN_OR_RETURN(slice->step, ParseExpression(true));
    }
    return slice;
  }

  absl::Status ParseCallArgs(CallArgsExpr* args) {
    const int line = cur().line;
    PS_RETURN_IF_ERROR(ExpectOp("("));
    bool require_comma = false;
    auto invalid = [&]() {
      return absl::InvalidArgumentError(
          Cat("line ", line, ": invalid syntax for function call expression"));
    };
    while (!IsOp(")")) {
      if (require_comma) {
        PS_RETURN_IF_ERROR(ExpectOp(","));
        if (IsOp(")")) break;
      }
      if (SkipOp("*")) {
        if (args->star_args || args->star_kwargs) return invalid();
        PS_ASSIGN_OR_RETURN(args->star_args, ParseExpression(true));
      } else if (SkipOp("**")) {
        if (args->star_kwargs) return invalid();
        PS_ASSIGN_OR_RETURN(args->star_kwargs, ParseExpression(true));
      } else if (cur().type == TokenType::kName && peek().type == TokenType::kOperator &&
                 peek().text == "=") {
        if (args->star_kwargs) return invalid();
        std::string key = cur().text;
        Advance();
        Advance();
        PS_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        args->keywords.emplace_back(std::move(key), std::move(value));
      } else {
        if (args->star_args || args->star_kwargs || !args->keywords.empty()) return invalid();
        PS_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression(true));
        args->positional.push_back(std::move(value));
      }
      require_comma = true;
    }
    return ExpectOp(")");
  }

  absl::StatusOr<ExprPtr> ParseCall(ExprPtr callee) {
    auto node = std::make_unique<CallExpr>(std::move(callee), cur().line);
    PS_RETURN_IF_ERROR(ParseCallArgs(&node->args));
    return node;
  }

  absl::StatusOr<std::string> ParseDottedName() {
    PS_ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (SkipOp(".")) {
      PS_ASSIGN_OR_RETURN(std::string part, ExpectName());
      CatAppend(&name, ".", part);
    }
    return name;
  }

  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr node, bool start_inline) {
    while (IsOp("|") || start_inline) {
      if (!start_inline) Advance();
      start_inline = false;
      const int line = cur().line;
      PS_ASSIGN_OR_RETURN(std::string name, ParseDottedName());
      auto filter =
          std::make_unique<FilterExpr>(Expr::Kind::kFilter, std::move(node), std::move(name), line);
      if (IsOp("(")) PS_RETURN_IF_ERROR(ParseCallArgs(&filter->args));
      node = std::move(filter);
    }
    return node;
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr node) {
    const int line = cur().line;
    Advance();  // is
    const bool negated = SkipName("not");
    PS_ASSIGN_OR_RETURN(std::string name, ParseDottedName());
    auto test =
        std::make_unique<FilterExpr>(Expr::Kind::kTest, std::move(node), std::move(name), line);
    const TokenType t = cur().type;
    if (IsOp("(")) {
      PS_RETURN_IF_ERROR(ParseCallArgs(&test->args));
    } else if ((t == TokenType::kName || t == TokenType::kString || t == TokenType::kInteger ||
                t == TokenType::kFloat || IsOp("[") || IsOp("{")) &&
               !IsName("else") && !IsName("or") && !IsName("and")) {
      if (IsName("is")) return Error("You cannot chain multiple tests with is");
      PS_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary(false));
      PS_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
      test->args.positional.push_back(std::move(arg));
    }
    if (!negated) return test;
    return std::make_unique<UnaryExpr>(Expr::Kind::kNot, std::move(test), line);
  }

  std::vector<Token> tokens_;
  const ParseOptions& options_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  // Names read in the bodies of the macros being parsed, innermost last.
  std::vector<std::set<std::string>> names_used_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TemplateAst>> Parse(std::vector<Token> tokens,
                                                   const ParseOptions& options) {
  if (tokens.empty() || tokens.back().type != TokenType::kEof)
    tokens.push_back(Token{TokenType::kEof, ""});
  return Parser(std::move(tokens), options).Run();
}

}  // namespace pagedserve::chat
