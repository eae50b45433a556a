// Chat messages of a request, one reader and one render-and-encode for every
// front end: the OpenAI HTTP API (openai_api.cc), ZeroMQ protocol v1
// (protocol.cc, server.cc) and `pagedserve generate --chat`.
//
// Accepted (the same on every front end, docs/protocol.md and docs/http.md):
// a non-empty array of objects with
//   role     "system", "developer" (OpenAI's newer name for system: rendered
//            as "system"), "user", "assistant" or "tool";
//   content  a string; or an array of text parts {"type": "text", "text": s}
//            (concatenated, as vLLM does for text-only models); or null /
//            absent for an assistant turn only.
//   tool_calls    assistant only: OpenAI's calls, each {"id", "type":
//                 "function", "function": {"name", "arguments": a JSON object
//                 as text}}, at most 64 (ChatMessage::tool_calls);
//   tool_call_id, name   strings (a tool turn's call id and function name).
// Other keys of a message are ignored by the OpenAI API and refused by
// protocol v1, whose requests are strict (`strict`).
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_CHAT_MESSAGES_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_CHAT_MESSAGES_H_

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"

namespace pagedserve {

// Reads `messages` (the request's "messages" value) into `out` (appended).
// Errors: InvalidArgument naming the field "messages" (field_error.h), the
// message the path, e.g. "field 'messages[1].role' must be one of system,
// developer, user, assistant, tool, got \"wizard\"". Never copies or recurses
// into the JSON beyond the parts' level. Thread-safe.
absl::Status ReadChatMessages(const nlohmann::json& messages, bool strict,
                              std::vector<ChatMessage>* out);

// Renders `messages` (and `tools_json`, the OpenAI `tools` array as JSON text,
// "" for none) and `kwargs_json` (more template variables, a JSON object as
// text, "" for none: ChatTemplate::Render) through the model's chat template with the generation
// prompt and encodes the text without adding special tokens (the template
// holds them, as Hugging Face's apply_chat_template does; special-token text
// in the template is parsed as special). Errors: InvalidArgument naming
// "messages" when the template refuses the conversation (its message), or
// when `chat_template` is null (the model ships none); naming
// "chat_template_kwargs" instead when the conversation renders without the
// kwargs (they caused the refusal; reasoning_effort is one of them; found by a
// second render on this error path only). Thread-safe.
absl::StatusOr<std::vector<int32_t>> EncodeChat(const ChatTemplate* chat_template,
                                                const Tokenizer& tokenizer,
                                                std::span<const ChatMessage> messages,
                                                std::string_view tools_json = {},
                                                std::string_view kwargs_json = {});

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_CHAT_MESSAGES_H_
