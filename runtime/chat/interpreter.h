// Walks a template's syntax tree and writes its output, with jinja2's
// semantics: scopes (a for loop's body gets a fresh scope per iteration, an
// if does not; macros see their defining scope at call time), undefined
// values, loop variables, macros with defaults/varargs/kwargs/caller, break
// and continue.
//
// Sandbox: the interpreter reaches nothing outside the values it is given
// (no attribute of Python objects, no files, no imports), lists and dicts are
// immutable (append, update, pop ... fail as in ImmutableSandboxedEnvironment),
// and every render is bounded by RenderLimits: each limit crossed is a
// ResourceExhausted error naming it. Errors of the template itself
// (raise_exception, undefined values used, type errors) are InvalidArgument
// with "line N: " and the message; unsupported constructs are Unimplemented.
#ifndef PAGEDSERVE_RUNTIME_CHAT_INTERPRETER_H_
#define PAGEDSERVE_RUNTIME_CHAT_INTERPRETER_H_

#include <cstdint>
#include <ctime>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/chat/ast.h"
#include "runtime/chat/value.h"

namespace pagedserve::chat {

struct RenderLimits {
  // Bytes of the rendered text (and of any one string the template builds).
  size_t max_output_bytes = size_t{16} << 20;
  // Bytes of all the text the render creates, output and intermediate strings
  // together: bounds its time and memory.
  size_t max_work_bytes = size_t{256} << 20;
  // Iterations of all loops together, macro calls and the items of lists that
  // filters and range() build counted as iterations too.
  int64_t max_loop_iterations = 1'000'000;
  // Macro calls nested inside one another.
  int max_call_depth = 64;
  // Expressions and statements being evaluated inside one another, macro
  // calls included: bounds the interpreter's stack.
  int max_eval_depth = 512;
  // Lists, dicts and namespaces nested inside one another in a value.
  uint32_t max_value_depth = 128;
};

// What strftime_now() reads: the local time now by default.
using Clock = std::function<std::tm()>;

class Interpreter {
 public:
  Interpreter(const RenderLimits& limits, Clock clock);
  ~Interpreter();
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  // Renders `ast` with the variables `context` (messages, tools, ...) on top of
  // the globals (range, namespace, dict, raise_exception, strftime_now ...).
  absl::StatusOr<std::string> Render(const TemplateAst& ast, const Dict& context);

  // ---- services for filters, tests, methods and globals

  absl::StatusOr<Value> CallValue(const Value& callee, CallArgs args);
  absl::StatusOr<Value> ApplyFilter(std::string_view name, const Value& operand,
                                    const CallArgs& args);
  absl::StatusOr<bool> ApplyTest(std::string_view name, const Value& operand, const CallArgs& args);
  // Counts `n` loop iterations (or list items built) against max_loop_iterations.
  absl::Status CountIterations(int64_t n);
  // Counts a string of `bytes` being built: refused past max_output_bytes for
  // one string, and past max_work_bytes for all of them together.
  absl::Status ChargeBytes(size_t bytes);
  // Refuses a value nested deeper than max_value_depth.
  absl::Status CheckDepth(const Value& v) const;
  std::tm Now() const { return clock_(); }
  const RenderLimits& limits() const { return limits_; }

  // ---- used by the macro callables

  struct Scope;
  absl::StatusOr<Value> CallMacro(const MacroDef& def, const std::shared_ptr<Scope>& closure,
                                  CallArgs args, const Value& caller);

 private:
  enum class Flow { kNormal, kBreak, kContinue };
  class DepthGuard;

  // statements
  absl::StatusOr<Flow> ExecBody(const Body& body);
  absl::StatusOr<Flow> ExecStmt(const Stmt& s);
  absl::StatusOr<Flow> ExecIf(const IfStmt& s);
  absl::StatusOr<Flow> ExecFor(const ForStmt& s);
  absl::StatusOr<Flow> ExecForItems(const ForStmt& s, const std::vector<Value>& items);
  absl::Status ExecSet(const SetStmt& s);
  absl::Status ExecSetBlock(const SetBlockStmt& s);
  absl::Status ExecMacro(const MacroStmt& s);
  absl::Status ExecCallBlock(const CallBlockStmt& s);
  absl::Status ExecFilterBlock(const FilterBlockStmt& s);
  absl::StatusOr<Flow> ExecWith(const WithStmt& s);
  absl::StatusOr<Flow> ExecInScope(const Body& body);
  absl::StatusOr<std::string> RenderToString(const Body& body);
  absl::Status Print(const Value& v);
  absl::Status Write(std::string_view text);
  absl::Status Assign(const Target& target, const Value& value, int line);

  // expressions
  absl::StatusOr<Value> Eval(const Expr& e);
  absl::StatusOr<Value> EvalInner(const Expr& e);
  absl::StatusOr<Value> EvalName(const NameExpr& e);
  absl::StatusOr<Value> EvalSeq(const SeqExpr& e);
  absl::StatusOr<Value> EvalDict(const DictExpr& e);
  absl::StatusOr<Value> EvalGetAttr(const GetAttrExpr& e);
  absl::StatusOr<Value> EvalGetItem(const GetItemExpr& e);
  absl::StatusOr<Value> EvalCall(const CallExpr& e);
  absl::StatusOr<CallArgs> EvalArgs(const CallArgsExpr& args);
  absl::StatusOr<Value> EvalFilter(const FilterExpr& e, const Value* block_input);
  absl::StatusOr<Value> EvalTest(const FilterExpr& e);
  absl::StatusOr<Value> EvalUnary(const UnaryExpr& e);
  absl::StatusOr<Value> EvalBinary(const BinaryExpr& e);
  absl::StatusOr<Value> EvalConcat(const ConcatExpr& e);
  absl::StatusOr<Value> EvalCompare(const CompareExpr& e);
  absl::StatusOr<Value> EvalCondExpr(const CondExpr& e);

  // scopes
  std::shared_ptr<Scope> PushScope();
  const Value* Lookup(std::string_view name) const;
  void SetVariable(const std::string& name, Value value);

  // Breaks the reference cycles macros make (a scope holds a macro that holds
  // the scope) once the render is over.
  void ReleaseCapturedScopes();

  const RenderLimits limits_;
  Clock clock_;
  std::shared_ptr<Scope> scope_;
  // The scopes macros were defined in.
  std::vector<std::weak_ptr<Scope>> captured_scopes_;
  std::string* out_ = nullptr;
  int64_t iterations_ = 0;
  size_t work_bytes_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
};

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_INTERPRETER_H_
