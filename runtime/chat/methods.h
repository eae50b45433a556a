// The methods of Python's str, dict and list that templates call
// (message.content.strip(), tool.get('function'), '{}'.format(x) ...).
#ifndef PAGEDSERVE_RUNTIME_CHAT_METHODS_H_
#define PAGEDSERVE_RUNTIME_CHAT_METHODS_H_

#include <optional>
#include <string_view>

#include "runtime/chat/value.h"

namespace pagedserve::chat {

// The attribute `name` of `obj` when Python's str, dict or list has a method
// of that name: a callable bound to `obj`; for a method that changes a list
// or dict (append, pop, update ...) an undefined whose use fails, as in
// jinja2's ImmutableSandboxedEnvironment; for a method not implemented here a
// callable that fails with Unimplemented naming it. nullopt when the type has
// no such attribute.
std::optional<Value> LookupMethod(const Value& obj, std::string_view name);

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_METHODS_H_
