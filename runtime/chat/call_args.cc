#include "runtime/chat/call_args.h"

#include "absl/status/status.h"
#include "runtime/chat/str_cat.h"

namespace pagedserve::chat {

absl::StatusOr<std::vector<Value>> BindArgs(std::string_view function, const CallArgs& args,
                                            std::initializer_list<Param> params) {
  if (args.positional.size() > params.size()) {
    return absl::InvalidArgumentError(Cat(function, "() takes at most ", params.size(),
                                          " arguments (", args.positional.size(), " given)"));
  }
  std::vector<std::optional<Value>> bound(params.size());
  for (size_t i = 0; i < args.positional.size(); ++i) bound[i] = args.positional[i];
  for (const auto& [key, value] : args.keywords) {
    size_t i = 0;
    for (const Param& p : params) {
      if (p.name == key) break;
      ++i;
    }
    if (i == params.size()) {
      return absl::InvalidArgumentError(
          Cat(function, "() got an unexpected keyword argument '", key, "'"));
    }
    if (bound[i]) {
      return absl::InvalidArgumentError(
          Cat(function, "() got multiple values for argument '", key, "'"));
    }
    bound[i] = value;
  }
  std::vector<Value> out;
  out.reserve(params.size());
  size_t i = 0;
  for (const Param& p : params) {
    if (bound[i]) {
      out.push_back(std::move(*bound[i]));
    } else if (p.default_value) {
      out.push_back(*p.default_value);
    } else {
      return absl::InvalidArgumentError(
          Cat(function, "() missing required argument '", p.name, "'"));
    }
    ++i;
  }
  return out;
}

absl::StatusOr<std::string> StringArg(std::string_view function, std::string_view what,
                                      const Value& v) {
  if (v.is_string()) return v.str();
  return absl::InvalidArgumentError(
      Cat(function, ": argument '", what, "' must be str, not ", v.TypeName()));
}

absl::StatusOr<int64_t> IntArg(std::string_view function, std::string_view what, const Value& v) {
  if (v.is_integral()) return v.as_int();
  return absl::InvalidArgumentError(
      Cat(function, ": argument '", what, "' must be an integer, not ", v.TypeName()));
}

absl::StatusOr<std::optional<std::string>> OptionalStringArg(std::string_view function,
                                                             std::string_view what,
                                                             const Value& v) {
  if (v.is_none() || v.is_undefined()) return std::optional<std::string>();
  if (v.is_string()) return std::optional<std::string>(v.str());
  return absl::InvalidArgumentError(
      Cat(function, ": argument '", what, "' must be str or None, not ", v.TypeName()));
}

}  // namespace pagedserve::chat
