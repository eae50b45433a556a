// The operations of Python (and of jinja2's sandboxed environment) on values:
// arithmetic, comparison, `in`, iteration, len(), attribute and item access
// (environment.getattr / getitem: `d.key` is a dict method when one has that
// name, else the key; a missing attribute or item is an undefined value,
// using an undefined is an error) and slicing.
#ifndef PAGEDSERVE_RUNTIME_CHAT_OPERATORS_H_
#define PAGEDSERVE_RUNTIME_CHAT_OPERATORS_H_

#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/chat/ast.h"
#include "runtime/chat/value.h"

namespace pagedserve::chat {

class Interpreter;

// The error jinja2's Undefined raises when used ("'x' is undefined", "'dict
// object' has no attribute 'y'").
absl::Status UndefinedError(const Value& undefined);

// + - * / // % ** (not and/or, which short-circuit in the interpreter).
absl::StatusOr<Value> BinaryOperation(BinaryOp op, const Value& a, const Value& b,
                                      Interpreter& interpreter);
// -v (negate) or +v.
absl::StatusOr<Value> UnarySign(const Value& v, bool negate);
// Python's a < b (TypeError for values that have no order).
absl::StatusOr<bool> LessThan(const Value& a, const Value& b);
absl::StatusOr<bool> CompareValues(CompareOp op, const Value& a, const Value& b);
// item in container.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);
// The items a for loop visits: list items, dict keys, string characters,
// nothing for an undefined.
absl::StatusOr<std::vector<Value>> Iterate(const Value& v);
absl::StatusOr<int64_t> Length(const Value& v);
absl::StatusOr<Value> GetAttribute(const Value& obj, std::string_view name);
absl::StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step]; each bound may be None / undefined (absent).
absl::StatusOr<Value> SliceValue(const Value& obj, const Value& start, const Value& stop,
                                 const Value& step);

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_OPERATORS_H_
