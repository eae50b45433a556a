// jinja2's built-in filters (jinja2/filters.py FILTERS) with Hugging Face's
// tojson (json.dumps with ensure_ascii=False, indent, separators, sort_keys).
// Filters that return generators in jinja2 (map, select, reject, selectattr,
// rejectattr, unique, items, reverse of a list) return generator values here
// too (runtime/chat/value.h SeqKind::kGenerator), so that `|length` of one
// fails and `if` of one is true, as in jinja2.
//
// Known but not implemented (calling one is Unimplemented naming it):
// filesizeformat, groupby, pprint, random, striptags, urlencode, urlize,
// wordwrap, xmlattr.
#ifndef PAGEDSERVE_RUNTIME_CHAT_FILTERS_H_
#define PAGEDSERVE_RUNTIME_CHAT_FILTERS_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/chat/value.h"

namespace pagedserve::chat {

class Interpreter;

// Whether jinja2 (with Hugging Face's environment) has a filter of this name.
bool IsKnownFilter(std::string_view name);

absl::StatusOr<Value> ApplyBuiltinFilter(Interpreter& interpreter, std::string_view name,
                                         const Value& operand, const CallArgs& args);

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_FILTERS_H_
