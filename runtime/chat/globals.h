// The global functions of Hugging Face's chat template environment: range,
// dict, namespace (refuses underscore-prefixed names, as transformers'
// TemplateNamespace), raise_exception(message) (an InvalidArgument error with
// the template's message), strftime_now(format) (the interpreter's clock,
// formatted by C strftime as Python's datetime.strftime does), joiner and
// cycler. lipsum is known but not implemented.
#ifndef PAGEDSERVE_RUNTIME_CHAT_GLOBALS_H_
#define PAGEDSERVE_RUNTIME_CHAT_GLOBALS_H_

#include <string>

#include "absl/container/flat_hash_map.h"
#include "runtime/chat/value.h"

namespace pagedserve::chat {

// jinja2's sandbox refuses range() longer than this (MAX_RANGE).
inline constexpr int64_t kMaxRange = 100000;

void AddGlobals(absl::flat_hash_map<std::string, Value>* vars);

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_GLOBALS_H_
