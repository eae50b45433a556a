// JSON (nlohmann::json, as the front ends parse requests) -> template values,
// as Python's json.loads gives them: objects keep their key order (nlohmann's
// ordered_json does; a plain json's keys come sorted), integers stay ints.
#ifndef PAGEDSERVE_RUNTIME_CHAT_JSON_VALUE_H_
#define PAGEDSERVE_RUNTIME_CHAT_JSON_VALUE_H_

#include <nlohmann/json.hpp>

#include "runtime/chat/value.h"

namespace pagedserve::chat {

// Unsigned integers above INT64_MAX become floats; binary values become None.
Value FromJson(const nlohmann::ordered_json& json);
Value FromJson(const nlohmann::json& json);

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_JSON_VALUE_H_
