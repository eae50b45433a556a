#include "runtime/chat/jinja_tests.h"

#include <algorithm>

#include "absl/status/status.h"
#include "runtime/chat/call_args.h"
#include "runtime/chat/filters.h"
#include "runtime/chat/interpreter.h"
#include "runtime/chat/operators.h"
#include "runtime/chat/py_format.h"
#include "runtime/chat/py_text.h"
#include "runtime/chat/str_cat.h"
#include "runtime/common/status_macros.h"

namespace pagedserve::chat {
namespace {

using TestFn = absl::StatusOr<bool> (*)(Interpreter&, const Value&, const CallArgs&);

struct Test {
  std::string_view name;
  TestFn fn;
};

// A test of the value alone (no arguments).
template <bool (*Pred)(const Value&)>
absl::StatusOr<bool> Unary(Interpreter&, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("test", args, {}).status());
  return Pred(v);
}

bool IsDefined(const Value& v) { return !v.is_undefined(); }
bool IsUndefinedValue(const Value& v) { return v.is_undefined(); }
bool IsNone(const Value& v) { return v.is_none(); }
bool IsBoolean(const Value& v) { return v.is_bool(); }
bool IsFalse(const Value& v) { return v.is_bool() && !v.as_bool(); }
bool IsTrue(const Value& v) { return v.is_bool() && v.as_bool(); }
bool IsInteger(const Value& v) { return v.is_int(); }
bool IsFloat(const Value& v) { return v.is_float(); }
bool IsNumber(const Value& v) { return v.is_number(); }
bool IsString(const Value& v) { return v.is_string(); }
bool IsMapping(const Value& v) { return v.is_dict(); }
bool IsEscaped(const Value& v) { return v.is_markup(); }
// iter(v) works: strings, sequences, dicts, generators, views and (jinja2's) undefined.
bool IsIterable(const Value& v) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
// len(v) and v.__getitem__ exist.
bool IsSequence(const Value& v) {
  return v.is_undefined() || v.is_string() || v.is_list_or_tuple() || v.is_dict();
}
// callable(v): functions, and jinja2's Undefined (it defines __call__).
bool IsCallableValue(const Value& v) { return v.is_callable() || v.is_undefined(); }

bool CaseOf(const Value& v, bool upper) {
  bool cased = false;
  for (char32_t c : DecodeUtf8(PyStr(v))) {
    if (upper ? IsLowerChar(c) : IsUpperChar(c)) return false;
    cased = cased || IsCased(c);
  }
  return cased;
}
bool IsLower(const Value& v) { return CaseOf(v, false); }
bool IsUpper(const Value& v) { return CaseOf(v, true); }

absl::StatusOr<Value> OneArg(std::string_view name, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {{"other", std::nullopt}}));
  return a[0];
}

absl::StatusOr<bool> Parity(const Value& v, int64_t want) {
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_integral()) {
    if (v.is_float())
      return std::fmod(std::fmod(v.as_double(), 2.0) + 2.0, 2.0) == static_cast<double>(want);
    return absl::InvalidArgumentError(
        Cat("unsupported operand type(s) for %: '", v.TypeName(), "' and 'int'"));
  }
  return ((v.as_int() % 2) + 2) % 2 == want;
}
absl::StatusOr<bool> Odd(Interpreter&, const Value& v, const CallArgs&) { return Parity(v, 1); }
absl::StatusOr<bool> Even(Interpreter&, const Value& v, const CallArgs&) { return Parity(v, 0); }

absl::StatusOr<bool> DivisibleBy(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(Value num, OneArg("divisibleby", args));
  PS_ASSIGN_OR_RETURN(Value rem, BinaryOperation(BinaryOp::kMod, v, num, in));
  return Equals(rem, Value(0));
}

template <CompareOp Op>
absl::StatusOr<bool> Compare(Interpreter&, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(Value other, OneArg("comparison", args));
  return CompareValues(Op, v, other);
}

absl::StatusOr<bool> In(Interpreter&, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(Value seq, OneArg("in", args));
  return Contains(seq, v);
}

absl::StatusOr<bool> SameAs(Interpreter&, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(Value other, OneArg("sameas", args));
  if (v.kind() != other.kind()) return false;
  if (v.identity() != nullptr) return v.identity() == other.identity();
  return Equals(v, other);
}

absl::StatusOr<bool> FilterTest(Interpreter&, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("filter", args, {}).status());
  return v.is_string() && IsKnownFilter(v.str());
}

absl::StatusOr<bool> TestTest(Interpreter&, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("test", args, {}).status());
  return v.is_string() && IsKnownTest(v.str());
}

constexpr Test kTests[] = {
    {"defined", Unary<IsDefined>},
    {"undefined", Unary<IsUndefinedValue>},
    {"none", Unary<IsNone>},
    {"boolean", Unary<IsBoolean>},
    {"false", Unary<IsFalse>},
    {"true", Unary<IsTrue>},
    {"integer", Unary<IsInteger>},
    {"float", Unary<IsFloat>},
    {"number", Unary<IsNumber>},
    {"string", Unary<IsString>},
    {"mapping", Unary<IsMapping>},
    {"iterable", Unary<IsIterable>},
    {"sequence", Unary<IsSequence>},
    {"callable", Unary<IsCallableValue>},
    {"escaped", Unary<IsEscaped>},
    {"lower", Unary<IsLower>},
    {"upper", Unary<IsUpper>},
    {"odd", Odd},
    {"even", Even},
    {"divisibleby", DivisibleBy},
    {"sameas", SameAs},
    {"in", In},
    {"filter", FilterTest},
    {"test", TestTest},
    {"eq", Compare<CompareOp::kEq>},
    {"equalto", Compare<CompareOp::kEq>},
    {"==", Compare<CompareOp::kEq>},
    {"ne", Compare<CompareOp::kNe>},
    {"!=", Compare<CompareOp::kNe>},
    {"lt", Compare<CompareOp::kLt>},
    {"lessthan", Compare<CompareOp::kLt>},
    {"<", Compare<CompareOp::kLt>},
    {"le", Compare<CompareOp::kLe>},
    {"<=", Compare<CompareOp::kLe>},
    {"gt", Compare<CompareOp::kGt>},
    {"greaterthan", Compare<CompareOp::kGt>},
    {">", Compare<CompareOp::kGt>},
    {"ge", Compare<CompareOp::kGe>},
    {">=", Compare<CompareOp::kGe>},
};

const Test* FindTest(std::string_view name) {
  const auto it = std::find_if(std::begin(kTests), std::end(kTests),
                               [&](const Test& t) { return t.name == name; });
  return it == std::end(kTests) ? nullptr : it;
}

}  // namespace

bool IsKnownTest(std::string_view name) { return FindTest(name) != nullptr; }

absl::StatusOr<bool> ApplyBuiltinTest(Interpreter& interpreter, std::string_view name,
                                      const Value& operand, const CallArgs& args) {
  const Test* test = FindTest(name);
  if (test == nullptr) return absl::InvalidArgumentError(Cat("No test named '", name, "'."));
  return test->fn(interpreter, operand, args);
}

}  // namespace pagedserve::chat
