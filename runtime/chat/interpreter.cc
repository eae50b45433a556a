#include "runtime/chat/interpreter.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "runtime/chat/filters.h"
#include "runtime/chat/globals.h"
#include "runtime/chat/jinja_tests.h"
#include "runtime/chat/operators.h"
#include "runtime/chat/py_format.h"
#include "runtime/chat/str_cat.h"
#include "runtime/common/status_macros.h"

namespace pagedserve::chat {

struct Interpreter::Scope {
  std::shared_ptr<Scope> parent;
  absl::flat_hash_map<std::string, Value> vars;
};

namespace {

// "line N: " in front of an error that does not name a line yet.
absl::Status Annotate(absl::Status status, int line) {
  if (status.ok() || absl::StartsWith(status.message(), "line ")) return status;
  return absl::Status(status.code(), Cat("line ", line, ": ", status.message()));
}

template <typename T>
absl::StatusOr<T> Annotate(absl::StatusOr<T> result, int line) {
  if (result.ok()) return result;
  return Annotate(result.status(), line);
}

// A {% macro %} (or the body of a {% call %} block): runs its body in a scope
// whose parent is the scope it was defined in.
class MacroCallable final : public Callable {
 public:
  MacroCallable(const MacroDef* def, std::shared_ptr<Interpreter::Scope> closure, Value caller)
      : def_(def), closure_(std::move(closure)), caller_(std::move(caller)) {}
  std::string Describe() const override { return Cat("Macro '", def_->name, "'"); }
  absl::StatusOr<Value> Call(Interpreter& interpreter, CallArgs args) const override {
    return interpreter.CallMacro(*def_, closure_, std::move(args), caller_);
  }

 private:
  const MacroDef* def_;
  std::shared_ptr<Interpreter::Scope> closure_;
  Value caller_;
};

// loop.cycle(a, b, ...): the argument at loop.index0 modulo their number.
class LoopCycle final : public Callable {
 public:
  explicit LoopCycle(int64_t index0) : index0_(index0) {}
  std::string Describe() const override { return "loop.cycle"; }
  absl::StatusOr<Value> Call(Interpreter&, CallArgs args) const override {
    if (args.positional.empty()) return absl::InvalidArgumentError("no items for cycling given");
    return args.positional[index0_ % static_cast<int64_t>(args.positional.size())];
  }

 private:
  int64_t index0_;
};

Value MakeLoop(const std::vector<Value>& items, size_t i) {
  const auto n = static_cast<int64_t>(items.size());
  const auto index0 = static_cast<int64_t>(i);
  Dict loop;
  loop.Set("index0", Value(index0));
  loop.Set("index", Value(index0 + 1));
  loop.Set("revindex0", Value(n - index0 - 1));
  loop.Set("revindex", Value(n - index0));
  loop.Set("first", Value(i == 0));
  loop.Set("last", Value(index0 == n - 1));
  loop.Set("length", Value(n));
  loop.Set("depth", Value(1));
  loop.Set("depth0", Value(0));
  loop.Set("previtem", i > 0 ? items[i - 1] : Value::Undefined("there is no previous item"));
  loop.Set("nextitem", index0 + 1 < n ? items[i + 1] : Value::Undefined("there is no next item"));
  loop.Set("cycle", Value::Function(std::make_shared<LoopCycle>(index0)));
  return Value::FromDict(std::move(loop));
}

}  // namespace

// RAII: one level of evaluation, refused past max_eval_depth.
class Interpreter::DepthGuard {
 public:
  explicit DepthGuard(Interpreter* in) : in_(in) { ++in_->eval_depth_; }
  ~DepthGuard() { --in_->eval_depth_; }
  absl::Status Check() const {
    if (in_->eval_depth_ <= in_->limits_.max_eval_depth) return absl::OkStatus();
    return absl::ResourceExhaustedError(
        Cat("the template evaluates expressions nested deeper than ", in_->limits_.max_eval_depth,
            " levels (max_eval_depth)"));
  }

 private:
  Interpreter* in_;
};

Interpreter::Interpreter(const RenderLimits& limits, Clock clock)
    : limits_(limits), clock_(std::move(clock)) {}

Interpreter::~Interpreter() = default;

absl::StatusOr<std::string> Interpreter::Render(const TemplateAst& ast, const Dict& context) {
  auto globals = std::make_shared<Scope>();
  AddGlobals(&globals->vars);
  scope_ = std::make_shared<Scope>();
  scope_->parent = globals;
  for (const auto& [key, value] : context.entries()) {
    if (key.is_string()) scope_->vars[key.str()] = value;
  }
  std::string out;
  out_ = &out;
  const absl::StatusOr<Flow> flow = ExecBody(ast.body);
  out_ = nullptr;
  scope_.reset();
  ReleaseCapturedScopes();
  if (!flow.ok()) return flow.status();
  return out;
}

void Interpreter::ReleaseCapturedScopes() {
  for (const std::weak_ptr<Scope>& weak : captured_scopes_) {
    if (std::shared_ptr<Scope> scope = weak.lock()) {
      absl::flat_hash_map<std::string, Value> vars;
      vars.swap(scope->vars);  // destroyed here, after the scope no longer refers to them
    }
  }
  captured_scopes_.clear();
}

// ---------------------------------------------------------------- limits

absl::Status Interpreter::CountIterations(int64_t n) {
  iterations_ += n;
  if (n >= 0 && iterations_ <= limits_.max_loop_iterations) return absl::OkStatus();
  return absl::ResourceExhaustedError(Cat("the template runs more than ",
                                          limits_.max_loop_iterations,
                                          " loop iterations (max_loop_iterations)"));
}

absl::Status Interpreter::ChargeBytes(size_t bytes) {
  if (bytes > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError(Cat("the template builds a string longer than ",
                                            limits_.max_output_bytes, " bytes (max_output_bytes)"));
  }
  work_bytes_ += bytes;
  if (work_bytes_ <= limits_.max_work_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(Cat("the template builds more than ", limits_.max_work_bytes,
                                          " bytes of text in all (max_work_bytes)"));
}

absl::Status Interpreter::CheckDepth(const Value& v) const {
  if (v.depth() <= limits_.max_value_depth) return absl::OkStatus();
  return absl::ResourceExhaustedError(Cat("the template builds lists or dicts nested deeper than ",
                                          limits_.max_value_depth, " levels (max_value_depth)"));
}

// ---------------------------------------------------------------- calls

absl::StatusOr<Value> Interpreter::CallValue(const Value& callee, CallArgs args) {
  if (callee.is_undefined()) return UndefinedError(callee);
  if (!callee.is_callable()) {
    return absl::InvalidArgumentError(Cat("'", callee.TypeName(), "' object is not callable"));
  }
  PS_ASSIGN_OR_RETURN(Value result, callee.callable().Call(*this, std::move(args)));
  PS_RETURN_IF_ERROR(CheckDepth(result));
  return result;
}

absl::StatusOr<Value> Interpreter::ApplyFilter(std::string_view name, const Value& operand,
                                               const CallArgs& args) {
  if (!IsKnownFilter(name)) return absl::InvalidArgumentError(Cat("No filter named '", name, "'."));
  PS_ASSIGN_OR_RETURN(Value result, ApplyBuiltinFilter(*this, name, operand, args));
  PS_RETURN_IF_ERROR(CheckDepth(result));
  return result;
}

absl::StatusOr<bool> Interpreter::ApplyTest(std::string_view name, const Value& operand,
                                            const CallArgs& args) {
  if (!IsKnownTest(name)) return absl::InvalidArgumentError(Cat("No test named '", name, "'."));
  return ApplyBuiltinTest(*this, name, operand, args);
}

absl::StatusOr<Value> Interpreter::CallMacro(const MacroDef& def,
                                             const std::shared_ptr<Scope>& closure, CallArgs args,
                                             const Value& caller) {
  PS_RETURN_IF_ERROR(CountIterations(1));  // a call repeats work as a loop iteration does
  if (call_depth_ >= limits_.max_call_depth) {
    return absl::ResourceExhaustedError(
        Cat("macro calls nest deeper than ", limits_.max_call_depth, " levels (max_call_depth)"));
  }
  auto scope = std::make_shared<Scope>();
  scope->parent = closure;
  const size_t n = def.params.size();
  if (args.positional.size() > n && !def.uses_varargs) {
    return absl::InvalidArgumentError(
        Cat("macro '", def.name, "' takes not more than ", n, " argument(s)"));
  }
  std::vector<bool> bound(n, false);
  for (size_t i = 0; i < std::min(n, args.positional.size()); ++i) {
    scope->vars[def.params[i]] = args.positional[i];
    bound[i] = true;
  }
  std::vector<Value> varargs(args.positional.begin() + std::min(n, args.positional.size()),
                             args.positional.end());
  Dict kwargs;
  Value caller_value = caller;
  for (auto& [key, value] : args.keywords) {
    const auto it = std::find(def.params.begin(), def.params.end(), key);
    if (it != def.params.end()) {
      const size_t i = it - def.params.begin();
      if (bound[i]) {
        return absl::InvalidArgumentError(
            Cat("macro '", def.name, "' got multiple values for argument '", key, "'"));
      }
      scope->vars[key] = std::move(value);
      bound[i] = true;
    } else if (key == "caller" && def.uses_caller) {
      caller_value = std::move(value);
    } else if (def.uses_kwargs) {
      kwargs.Set(Value(key), std::move(value));
    } else {
      return absl::InvalidArgumentError(
          Cat("macro '", def.name, "' takes no keyword argument '", key, "'"));
    }
  }
  ++call_depth_;
  std::shared_ptr<Scope> saved = std::move(scope_);
  scope_ = scope;
  absl::Status status;
  const size_t first_default = n - def.defaults.size();
  for (size_t i = 0; i < n && status.ok(); ++i) {
    if (bound[i]) continue;
    if (i >= first_default) {
      absl::StatusOr<Value> v = Eval(*def.defaults[i - first_default]);
      if (!v.ok()) {
        status = v.status();
        break;
      }
      scope->vars[def.params[i]] = std::move(*v);
    } else {
      scope->vars[def.params[i]] =
          Value::Undefined(Cat("parameter '", def.params[i], "' was not provided"));
    }
  }
  if (def.uses_varargs) scope->vars["varargs"] = Value::Tuple(std::move(varargs));
  if (def.uses_kwargs) scope->vars["kwargs"] = Value::FromDict(std::move(kwargs));
  if (def.uses_caller) {
    scope->vars["caller"] =
        caller_value.is_undefined() ? Value::Undefined("No caller defined") : caller_value;
  }
  absl::StatusOr<std::string> text =
      status.ok() ? RenderToString(def.body) : absl::StatusOr<std::string>(status);
  scope_ = std::move(saved);
  --call_depth_;
  if (!text.ok()) return text.status();
  return Value(std::move(*text));
}

// ---------------------------------------------------------------- scopes

std::shared_ptr<Interpreter::Scope> Interpreter::PushScope() {
  auto scope = std::make_shared<Scope>();
  scope->parent = scope_;
  return scope;
}

const Value* Interpreter::Lookup(std::string_view name) const {
  for (const Scope* s = scope_.get(); s != nullptr; s = s->parent.get()) {
    const auto it = s->vars.find(absl::string_view(name.data(), name.size()));
    if (it != s->vars.end()) return &it->second;
  }
  return nullptr;
}

void Interpreter::SetVariable(const std::string& name, Value value) {
  scope_->vars[name] = std::move(value);
}

// ---------------------------------------------------------------- statements

absl::StatusOr<Interpreter::Flow> Interpreter::ExecBody(const Body& body) {
  for (const StmtPtr& s : body) {
    DepthGuard guard(this);
    PS_RETURN_IF_ERROR(guard.Check());
    PS_ASSIGN_OR_RETURN(Flow flow, Annotate(ExecStmt(*s), s->line));
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecStmt(const Stmt& s) {
  switch (s.kind) {
    case Stmt::Kind::kText:
      PS_RETURN_IF_ERROR(Write(static_cast<const TextStmt&>(s).text));
      return Flow::kNormal;
    case Stmt::Kind::kPrint: {
      PS_ASSIGN_OR_RETURN(Value v, Eval(*static_cast<const PrintStmt&>(s).expr));
      PS_RETURN_IF_ERROR(Print(v));
      return Flow::kNormal;
    }
    case Stmt::Kind::kIf: return ExecIf(static_cast<const IfStmt&>(s));
    case Stmt::Kind::kFor: return ExecFor(static_cast<const ForStmt&>(s));
    case Stmt::Kind::kSet:
      PS_RETURN_IF_ERROR(ExecSet(static_cast<const SetStmt&>(s)));
      return Flow::kNormal;
    case Stmt::Kind::kSetBlock:
      PS_RETURN_IF_ERROR(ExecSetBlock(static_cast<const SetBlockStmt&>(s)));
      return Flow::kNormal;
    case Stmt::Kind::kMacro:
      PS_RETURN_IF_ERROR(ExecMacro(static_cast<const MacroStmt&>(s)));
      return Flow::kNormal;
    case Stmt::Kind::kCallBlock:
      PS_RETURN_IF_ERROR(ExecCallBlock(static_cast<const CallBlockStmt&>(s)));
      return Flow::kNormal;
    case Stmt::Kind::kFilterBlock:
      PS_RETURN_IF_ERROR(ExecFilterBlock(static_cast<const FilterBlockStmt&>(s)));
      return Flow::kNormal;
    case Stmt::Kind::kWith: return ExecWith(static_cast<const WithStmt&>(s));
    case Stmt::Kind::kBreak: return Flow::kBreak;
    case Stmt::Kind::kContinue: return Flow::kContinue;
    case Stmt::Kind::kScope: return ExecInScope(static_cast<const ScopeStmt&>(s).body);
  }
  return Flow::kNormal;
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecIf(const IfStmt& s) {
  for (const auto& [test, body] : s.branches) {
    PS_ASSIGN_OR_RETURN(Value v, Eval(*test));
    if (v.Truthy()) return ExecBody(body);
  }
  return ExecBody(s.else_body);
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecFor(const ForStmt& s) {
  PS_ASSIGN_OR_RETURN(Value iterable, Eval(*s.iter));
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(iterable));
  if (s.filter) {
    std::vector<Value> kept;
    std::shared_ptr<Scope> saved = scope_;
    for (Value& item : items) {
      PS_RETURN_IF_ERROR(CountIterations(1));
      scope_ = PushScope();
      absl::Status assigned = Assign(s.target, item, s.line);
      absl::StatusOr<Value> keep =
          assigned.ok() ? Eval(*s.filter) : absl::StatusOr<Value>(assigned);
      scope_ = saved;
      if (!keep.ok()) return keep.status();
      if (keep->Truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  return ExecForItems(s, items);
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecForItems(const ForStmt& s,
                                                            const std::vector<Value>& items) {
  std::shared_ptr<Scope> saved = scope_;
  for (size_t i = 0; i < items.size(); ++i) {
    PS_RETURN_IF_ERROR(CountIterations(1));
    scope_ = PushScope();
    scope_->vars["loop"] = MakeLoop(items, i);
    absl::Status assigned = Assign(s.target, items[i], s.line);
    absl::StatusOr<Flow> flow = assigned.ok() ? ExecBody(s.body) : absl::StatusOr<Flow>(assigned);
    scope_ = saved;
    if (!flow.ok()) return flow.status();
    if (*flow == Flow::kBreak) break;
  }
  if (items.empty()) return ExecInScope(s.else_body);
  return Flow::kNormal;
}

absl::Status Interpreter::ExecSet(const SetStmt& s) {
  PS_ASSIGN_OR_RETURN(Value v, Eval(*s.value));
  return Assign(s.target, v, s.line);
}

absl::Status Interpreter::ExecSetBlock(const SetBlockStmt& s) {
  std::shared_ptr<Scope> saved = scope_;
  scope_ = PushScope();
  absl::StatusOr<std::string> text = RenderToString(s.body);
  scope_ = saved;
  if (!text.ok()) return text.status();
  Value v(std::move(*text));
  if (s.filter) {
    PS_ASSIGN_OR_RETURN(v, EvalFilter(static_cast<const FilterExpr&>(*s.filter), &v));
  }
  return Assign(s.target, v, s.line);
}

absl::Status Interpreter::ExecMacro(const MacroStmt& s) {
  captured_scopes_.push_back(scope_);
  SetVariable(s.def.name,
              Value::Function(std::make_shared<MacroCallable>(&s.def, scope_, Value())));
  return absl::OkStatus();
}

absl::Status Interpreter::ExecCallBlock(const CallBlockStmt& s) {
  const auto& call = static_cast<const CallExpr&>(*s.call);
  PS_ASSIGN_OR_RETURN(Value callee, Eval(*call.callee));
  PS_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(call.args));
  captured_scopes_.push_back(scope_);
  args.keywords.emplace_back(
      "caller", Value::Function(std::make_shared<MacroCallable>(&s.caller, scope_, Value())));
  PS_ASSIGN_OR_RETURN(Value result, CallValue(callee, std::move(args)));
  return Print(result);
}

absl::Status Interpreter::ExecFilterBlock(const FilterBlockStmt& s) {
  std::shared_ptr<Scope> saved = scope_;
  scope_ = PushScope();
  absl::StatusOr<std::string> text = RenderToString(s.body);
  scope_ = saved;
  if (!text.ok()) return text.status();
  const Value input(std::move(*text));
  PS_ASSIGN_OR_RETURN(Value result, EvalFilter(static_cast<const FilterExpr&>(*s.filter), &input));
  return Print(result);
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecWith(const WithStmt& s) {
  std::vector<Value> values;
  for (const auto& [target, expr] : s.assignments) {
    PS_ASSIGN_OR_RETURN(Value v, Eval(*expr));
    values.push_back(std::move(v));
  }
  std::shared_ptr<Scope> saved = scope_;
  scope_ = PushScope();
  absl::Status status;
  for (size_t i = 0; i < values.size() && status.ok(); ++i) {
    status = Assign(s.assignments[i].first, values[i], s.line);
  }
  absl::StatusOr<Flow> flow = status.ok() ? ExecBody(s.body) : absl::StatusOr<Flow>(status);
  scope_ = saved;
  return flow;
}

absl::StatusOr<Interpreter::Flow> Interpreter::ExecInScope(const Body& body) {
  if (body.empty()) return Flow::kNormal;
  std::shared_ptr<Scope> saved = scope_;
  scope_ = PushScope();
  absl::StatusOr<Flow> flow = ExecBody(body);
  scope_ = saved;
  return flow;
}

absl::StatusOr<std::string> Interpreter::RenderToString(const Body& body) {
  std::string text;
  std::string* saved = out_;
  out_ = &text;
  const absl::StatusOr<Flow> flow = ExecBody(body);
  out_ = saved;
  if (!flow.ok()) return flow.status();
  return text;
}

absl::Status Interpreter::Print(const Value& v) {
  if (v.is_callable()) {
    return absl::InvalidArgumentError(
        Cat("cannot print ", v.callable().Describe(),
            " (jinja2 would print its memory address); call it instead"));
  }
  if (v.is_generator()) {
    return absl::InvalidArgumentError(
        "cannot print a generator (jinja2 would print its memory address); convert it with |list");
  }
  if (v.is_string()) return Write(v.str());
  return Write(PyStr(v));
}

absl::Status Interpreter::Write(std::string_view text) {
  if (out_->size() + text.size() > limits_.max_output_bytes) {
    return absl::ResourceExhaustedError(
        Cat("the rendered text exceeds ", limits_.max_output_bytes, " bytes (max_output_bytes)"));
  }
  PS_RETURN_IF_ERROR(ChargeBytes(text.size()));
  out_->append(text);
  return absl::OkStatus();
}

absl::Status Interpreter::Assign(const Target& target, const Value& value, int line) {
  switch (target.kind) {
    case Target::Kind::kName: SetVariable(target.name, value); return absl::OkStatus();
    case Target::Kind::kTuple: {
      PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(value));
      if (items.size() != target.items.size()) {
        return absl::InvalidArgumentError(
            items.size() > target.items.size()
                ? Cat("too many values to unpack (expected ", target.items.size(), ")")
                : Cat("not enough values to unpack (expected ", target.items.size(), ", got ",
                      items.size(), ")"));
      }
      for (size_t i = 0; i < items.size(); ++i)
        PS_RETURN_IF_ERROR(Assign(target.items[i], items[i], line));
      return absl::OkStatus();
    }
    case Target::Kind::kNamespaceAttr: {
      const Value* ns = Lookup(target.name);
      if (ns == nullptr || !ns->is_namespace()) {
        return absl::InvalidArgumentError("cannot assign attribute on non-namespace object");
      }
      if (!target.attr.empty() && target.attr[0] == '_') {
        return absl::InvalidArgumentError(
            Cat("cannot store underscore-prefixed attribute '", target.attr, "' on a namespace"));
      }
      if (value.has_namespace()) {
        return absl::UnimplementedError("a namespace holding another namespace is not supported");
      }
      ns->namespace_attrs().Set(Value(target.attr), value);
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------- expressions

absl::StatusOr<Value> Interpreter::Eval(const Expr& e) {
  DepthGuard guard(this);
  PS_RETURN_IF_ERROR(guard.Check());
  return Annotate(EvalInner(e), e.line);
}

absl::StatusOr<Value> Interpreter::EvalInner(const Expr& e) {
  switch (e.kind) {
    case Expr::Kind::kConst: return static_cast<const ConstExpr&>(e).value;
    case Expr::Kind::kName: return EvalName(static_cast<const NameExpr&>(e));
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: return EvalSeq(static_cast<const SeqExpr&>(e));
    case Expr::Kind::kDict: return EvalDict(static_cast<const DictExpr&>(e));
    case Expr::Kind::kGetAttr: return EvalGetAttr(static_cast<const GetAttrExpr&>(e));
    case Expr::Kind::kGetItem: return EvalGetItem(static_cast<const GetItemExpr&>(e));
    case Expr::Kind::kSlice: return absl::InvalidArgumentError("a slice outside [ ]");
    case Expr::Kind::kCall: return EvalCall(static_cast<const CallExpr&>(e));
    case Expr::Kind::kFilter: return EvalFilter(static_cast<const FilterExpr&>(e), nullptr);
    case Expr::Kind::kTest: return EvalTest(static_cast<const FilterExpr&>(e));
    case Expr::Kind::kNot:
    case Expr::Kind::kNeg:
    case Expr::Kind::kPos: return EvalUnary(static_cast<const UnaryExpr&>(e));
    case Expr::Kind::kBinary: return EvalBinary(static_cast<const BinaryExpr&>(e));
    case Expr::Kind::kConcat: return EvalConcat(static_cast<const ConcatExpr&>(e));
    case Expr::Kind::kCompare: return EvalCompare(static_cast<const CompareExpr&>(e));
    case Expr::Kind::kCondExpr: return EvalCondExpr(static_cast<const CondExpr&>(e));
  }
  return absl::InternalError("unknown expression");
}

absl::StatusOr<Value> Interpreter::EvalName(const NameExpr& e) {
  if (const Value* v = Lookup(e.name)) return *v;
  return Value::Undefined(Cat("'", e.name, "' is undefined"));
}

absl::StatusOr<Value> Interpreter::EvalSeq(const SeqExpr& e) {
  std::vector<Value> items;
  items.reserve(e.items.size());
  for (const ExprPtr& item : e.items) {
    PS_ASSIGN_OR_RETURN(Value v, Eval(*item));
    items.push_back(std::move(v));
  }
  Value result =
      e.kind == Expr::Kind::kTuple ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
  PS_RETURN_IF_ERROR(CheckDepth(result));
  return result;
}

absl::StatusOr<Value> Interpreter::EvalDict(const DictExpr& e) {
  Dict dict;
  for (const auto& [key_expr, value_expr] : e.items) {
    PS_ASSIGN_OR_RETURN(Value key, Eval(*key_expr));
    PS_ASSIGN_OR_RETURN(Value value, Eval(*value_expr));
    if (!IsHashable(key))
      return absl::InvalidArgumentError(Cat("unhashable type: '", key.TypeName(), "'"));
    dict.Set(std::move(key), std::move(value));
  }
  Value result = Value::FromDict(std::move(dict));
  PS_RETURN_IF_ERROR(CheckDepth(result));
  return result;
}

absl::StatusOr<Value> Interpreter::EvalGetAttr(const GetAttrExpr& e) {
  PS_ASSIGN_OR_RETURN(Value obj, Eval(*e.object));
  return GetAttribute(obj, e.attr);
}

absl::StatusOr<Value> Interpreter::EvalGetItem(const GetItemExpr& e) {
  PS_ASSIGN_OR_RETURN(Value obj, Eval(*e.object));
  if (e.index->kind != Expr::Kind::kSlice) {
    PS_ASSIGN_OR_RETURN(Value key, Eval(*e.index));
    return GetItem(obj, key);
  }
  const auto& slice = static_cast<const SliceExpr&>(*e.index);
  Value bounds[3];
  const Expr* parts[3] = {slice.start.get(), slice.stop.get(), slice.step.get()};
  for (int i = 0; i < 3; ++i) {
    if (parts[i] != nullptr) {
      PS_ASSIGN_OR_RETURN(bounds[i], Eval(*parts[i]));
    }
  }
  return SliceValue(obj, bounds[0], bounds[1], bounds[2]);
}

absl::StatusOr<CallArgs> Interpreter::EvalArgs(const CallArgsExpr& args) {
  CallArgs out;
  for (const ExprPtr& e : args.positional) {
    PS_ASSIGN_OR_RETURN(Value v, Eval(*e));
    out.positional.push_back(std::move(v));
  }
  for (const auto& [name, e] : args.keywords) {
    PS_ASSIGN_OR_RETURN(Value v, Eval(*e));
    out.keywords.emplace_back(name, std::move(v));
  }
  if (args.star_args) {
    PS_ASSIGN_OR_RETURN(Value v, Eval(*args.star_args));
    PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    for (Value& item : items) out.positional.push_back(std::move(item));
  }
  if (args.star_kwargs) {
    PS_ASSIGN_OR_RETURN(Value v, Eval(*args.star_kwargs));
    if (!v.is_dict()) return absl::InvalidArgumentError("argument after ** must be a mapping");
    for (const auto& [key, value] : v.dict().entries()) {
      if (!key.is_string()) return absl::InvalidArgumentError("keywords must be strings");
      out.keywords.emplace_back(key.str(), value);
    }
  }
  return out;
}

absl::StatusOr<Value> Interpreter::EvalCall(const CallExpr& e) {
  PS_ASSIGN_OR_RETURN(Value callee, Eval(*e.callee));
  PS_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args));
  return CallValue(callee, std::move(args));
}

absl::StatusOr<Value> Interpreter::EvalFilter(const FilterExpr& e, const Value* block_input) {
  Value operand;
  if (e.operand == nullptr) {
    if (block_input == nullptr) return absl::InternalError("a filter without an operand");
    operand = *block_input;
  } else if (e.operand->kind == Expr::Kind::kFilter && block_input != nullptr) {
    PS_ASSIGN_OR_RETURN(operand,
                        EvalFilter(static_cast<const FilterExpr&>(*e.operand), block_input));
  } else {
    PS_ASSIGN_OR_RETURN(operand, Eval(*e.operand));
  }
  PS_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args));
  return ApplyFilter(e.name, operand, args);
}

absl::StatusOr<Value> Interpreter::EvalTest(const FilterExpr& e) {
  PS_ASSIGN_OR_RETURN(Value operand, Eval(*e.operand));
  PS_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e.args));
  PS_ASSIGN_OR_RETURN(bool result, ApplyTest(e.name, operand, args));
  return Value(result);
}

absl::StatusOr<Value> Interpreter::EvalUnary(const UnaryExpr& e) {
  PS_ASSIGN_OR_RETURN(Value v, Eval(*e.operand));
  if (e.kind == Expr::Kind::kNot) return Value(!v.Truthy());
  return UnarySign(v, e.kind == Expr::Kind::kNeg);
}

absl::StatusOr<Value> Interpreter::EvalBinary(const BinaryExpr& e) {
  PS_ASSIGN_OR_RETURN(Value left, Eval(*e.left));
  if (e.op == BinaryOp::kAnd) return left.Truthy() ? Eval(*e.right) : left;
  if (e.op == BinaryOp::kOr) return left.Truthy() ? left : Eval(*e.right);
  PS_ASSIGN_OR_RETURN(Value right, Eval(*e.right));
  PS_ASSIGN_OR_RETURN(Value result, BinaryOperation(e.op, left, right, *this));
  PS_RETURN_IF_ERROR(CheckDepth(result));
  return result;
}

absl::StatusOr<Value> Interpreter::EvalConcat(const ConcatExpr& e) {
  std::string out;
  for (const ExprPtr& part : e.parts) {
    PS_ASSIGN_OR_RETURN(Value v, Eval(*part));
    if (v.is_callable() || v.is_generator()) {
      return absl::InvalidArgumentError(Cat("cannot concatenate a ", v.TypeName(),
                                            " with ~ (jinja2 would insert its memory address)"));
    }
    const std::string text = v.is_string() ? v.str() : PyStr(v);
    PS_RETURN_IF_ERROR(ChargeBytes(text.size()));
    out += text;
  }
  PS_RETURN_IF_ERROR(ChargeBytes(out.size()));
  return Value(std::move(out));
}

absl::StatusOr<Value> Interpreter::EvalCompare(const CompareExpr& e) {
  PS_ASSIGN_OR_RETURN(Value left, Eval(*e.first));
  for (const auto& [op, expr] : e.rest) {
    PS_ASSIGN_OR_RETURN(Value right, Eval(*expr));
    if (op == CompareOp::kIn || op == CompareOp::kNotIn) {  // a scan: counted as work
      if (right.is_list())
        PS_RETURN_IF_ERROR(CountIterations(static_cast<int64_t>(right.items().size())));
      if (right.is_string()) PS_RETURN_IF_ERROR(ChargeBytes(right.str().size()));
    }
    PS_ASSIGN_OR_RETURN(bool holds, CompareValues(op, left, right));
    if (!holds) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

absl::StatusOr<Value> Interpreter::EvalCondExpr(const CondExpr& e) {
  PS_ASSIGN_OR_RETURN(Value test, Eval(*e.test));
  if (test.Truthy()) return Eval(*e.then);
  if (e.otherwise) return Eval(*e.otherwise);
  return Value::Undefined(Cat("the inline if-expression on line ", e.line,
                              " evaluated to false and no else section was defined."));
}

}  // namespace pagedserve::chat
