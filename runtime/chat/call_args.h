// Binding a call's arguments to a Python-style signature, for the filters,
// tests, methods and globals implemented in C++.
#ifndef PAGEDSERVE_RUNTIME_CHAT_CALL_ARGS_H_
#define PAGEDSERVE_RUNTIME_CHAT_CALL_ARGS_H_

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/chat/value.h"

namespace pagedserve::chat {

struct Param {
  std::string_view name;
  std::optional<Value> default_value;  // nullopt: required
};

// The arguments in the order of `params` (positional first, then by keyword,
// then defaults). InvalidArgument naming `function` for too many positional
// arguments, an unknown keyword or a missing required argument.
absl::StatusOr<std::vector<Value>> BindArgs(std::string_view function, const CallArgs& args,
                                            std::initializer_list<Param> params);

// Checks a value's type for an argument: InvalidArgument "function: argument
// `what` must be ..., not <type>".
absl::StatusOr<std::string> StringArg(std::string_view function, std::string_view what,
                                      const Value& v);
absl::StatusOr<int64_t> IntArg(std::string_view function, std::string_view what, const Value& v);
// nullopt for None (Python's "no value" default).
absl::StatusOr<std::optional<std::string>> OptionalStringArg(std::string_view function,
                                                             std::string_view what, const Value& v);

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_CALL_ARGS_H_
