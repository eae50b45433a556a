// jinja2's built-in tests (`x is defined`, `x is string` ...; jinja2/tests.py).
#ifndef PAGEDSERVE_RUNTIME_CHAT_JINJA_TESTS_H_
#define PAGEDSERVE_RUNTIME_CHAT_JINJA_TESTS_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/chat/value.h"

namespace pagedserve::chat {

class Interpreter;

bool IsKnownTest(std::string_view name);

absl::StatusOr<bool> ApplyBuiltinTest(Interpreter& interpreter, std::string_view name,
                                      const Value& operand, const CallArgs& args);

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_JINJA_TESTS_H_
