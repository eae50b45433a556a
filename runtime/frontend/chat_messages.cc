#include "runtime/frontend/chat_messages.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/common/field_error.h"
#include "runtime/common/json_limits.h"

namespace pagedserve {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

constexpr size_t kMaxToolCallsPerMessage = 64;

absl::Status Bad(const std::string& message) { return FieldError("messages", message); }

std::string KindOf(const json& j) {
  if (j.is_number_integer()) return "integer";
  if (j.is_number_float()) return "number";
  return j.type_name();
}

// A role as given, or "" when it is not one of the accepted ones.
std::string CanonicalRole(const std::string& role) {
  if (role == "developer") return "system";
  if (role == "system" || role == "user" || role == "assistant" || role == "tool") return role;
  return "";
}

// `content` of message `name` into *out: a string, text parts, or null/absent
// (`present` false) for an assistant turn.
absl::Status ReadContent(const json* content, const std::string& name, const std::string& role,
                         std::string* out) {
  if (content == nullptr || content->is_null()) {
    if (role == "assistant") return absl::OkStatus();
    return Bad(absl::StrCat("field '", name, ".content' is required for a '", role,
                            "' message (a string or an array of text parts; only assistant "
                            "messages may omit it)"));
  }
  if (content->is_string()) {
    *out = content->get<std::string>();
    return absl::OkStatus();
  }
  if (!content->is_array()) {
    return Bad(absl::StrCat("field '", name,
                            ".content' must be a string or an array of text parts, got ",
                            KindOf(*content)));
  }
  for (size_t k = 0; k < content->size(); ++k) {
    const json& part = (*content)[k];
    const std::string part_name = absl::StrCat(name, ".content[", k, "]");
    const auto type = part.is_object() ? part.find("type") : part.end();
    if (!part.is_object() || type == part.end() || *type != "text") {
      return Bad(absl::StrCat("field '", part_name,
                              "' must be a text part {\"type\": \"text\", \"text\": ...}; only "
                              "text content is supported"));
    }
    const auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      return Bad(absl::StrCat("field '", part_name, ".text' must be a string"));
    }
    *out += text->get_ref<const std::string&>();
  }
  return absl::OkStatus();
}

absl::Status ReadString(const json& m, const char* key, const std::string& name, std::string* out) {
  const auto it = m.find(key);
  if (it == m.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return Bad(absl::StrCat("field '", name, ".", key, "' must be a string"));
  *out = it->get<std::string>();
  return absl::OkStatus();
}

// One OpenAI tool call {"id", "type": "function", "function": {"name",
// "arguments": JSON text}} as the template sees it (arguments parsed).
absl::Status ReadToolCall(const json& call, const std::string& name, ordered_json* out) {
  if (!call.is_object()) return Bad(absl::StrCat("field '", name, "' must be an object"));
  std::string id, type = "function", fn_name;
  if (absl::Status s = ReadString(call, "id", name, &id); !s.ok()) return s;
  if (absl::Status s = ReadString(call, "type", name, &type); !s.ok()) return s;
  if (type != "function") {
    return Bad(absl::StrCat("field '", name, ".type' must be \"function\""));
  }
  const auto fn = call.find("function");
  if (fn == call.end() || !fn->is_object()) {
    return Bad(absl::StrCat("field '", name, ".function' must be an object"));
  }
  const std::string fn_path = name + ".function";
  if (absl::Status s = ReadString(*fn, "name", fn_path, &fn_name); !s.ok()) return s;
  if (fn_name.empty()) return Bad(absl::StrCat("field '", fn_path, ".name' is required"));
  ordered_json arguments = ordered_json::object();
  if (const auto a = fn->find("arguments"); a != fn->end() && !a->is_null()) {
    if (!a->is_string()) {
      return Bad(absl::StrCat("field '", fn_path, ".arguments' must be a string of JSON"));
    }
    const std::string& text = a->get_ref<const std::string&>();
    bool ok = CheckJsonText(text).ok();
    if (ok) {
      try {
        arguments = ordered_json::parse(text);
      } catch (const ordered_json::exception&) {
        ok = false;
      }
    }
    if (!ok || !arguments.is_object()) {
      return Bad(absl::StrCat("field '", fn_path, ".arguments' must be a JSON object as text"));
    }
  }
  *out = {{"id", id}, {"type", type}, {"function", {{"name", fn_name}, {"arguments", arguments}}}};
  return absl::OkStatus();
}

// tool_calls (assistant), tool_call_id and name.
absl::Status ReadToolFields(const json& m, const std::string& name, ChatMessage* cm) {
  if (absl::Status s = ReadString(m, "tool_call_id", name, &cm->tool_call_id); !s.ok()) return s;
  if (absl::Status s = ReadString(m, "name", name, &cm->name); !s.ok()) return s;
  const auto calls = m.find("tool_calls");
  if (calls == m.end() || calls->is_null()) return absl::OkStatus();
  if (cm->role != "assistant") {
    return Bad(absl::StrCat("field '", name, ".tool_calls' is allowed on assistant messages only"));
  }
  if (!calls->is_array() || calls->size() > kMaxToolCallsPerMessage) {
    return Bad(absl::StrCat("field '", name, ".tool_calls' must be an array of at most ",
                            kMaxToolCallsPerMessage, " calls"));
  }
  ordered_json list = ordered_json::array();
  for (size_t k = 0; k < calls->size(); ++k) {
    ordered_json call;
    const std::string path = absl::StrCat(name, ".tool_calls[", k, "]");
    if (absl::Status s = ReadToolCall((*calls)[k], path, &call); !s.ok()) return s;
    list.push_back(std::move(call));
  }
  if (!list.empty())
    cm->tool_calls = list.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadChatMessages(const json& messages, bool strict, std::vector<ChatMessage>* out) {
  if (!messages.is_array() || messages.empty()) {
    return Bad("field 'messages' must be a non-empty array of {role, content} objects");
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string name = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) {
      return Bad(absl::StrCat("field '", name,
                              "' must be an object with 'role' and 'content', got ", KindOf(m)));
    }
    if (strict) {
      for (auto it = m.begin(); it != m.end(); ++it) {
        const std::string& k = it.key();
        if (k != "role" && k != "content" && k != "tool_calls" && k != "tool_call_id" &&
            k != "name") {
          return Bad(absl::StrCat("unknown field in ", name,
                                  " (expected 'role', 'content', 'tool_calls', 'tool_call_id', "
                                  "'name')"));
        }
      }
    }
    const auto role_it = m.find("role");
    if (role_it == m.end() || !role_it->is_string()) {
      return Bad(absl::StrCat("field '", name, ".role' must be a string"));
    }
    ChatMessage cm;
    cm.role = CanonicalRole(role_it->get_ref<const std::string&>());
    if (cm.role.empty()) {
      const json shown = role_it->get_ref<const std::string&>().substr(0, 32);
      return Bad(absl::StrCat("field '", name,
                              ".role' must be one of system, developer, user, assistant, tool, "
                              "got ",
                              shown.dump(-1, ' ', false, json::error_handler_t::replace)));
    }
    const auto content_it = m.find("content");
    const json* content = content_it == m.end() ? nullptr : &*content_it;
    if (absl::Status s = ReadContent(content, name, cm.role, &cm.content); !s.ok()) return s;
    if (absl::Status s = ReadToolFields(m, name, &cm); !s.ok()) return s;
    out->push_back(std::move(cm));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> EncodeChat(const ChatTemplate* chat_template,
                                                const Tokenizer& tokenizer,
                                                std::span<const ChatMessage> messages,
                                                std::string_view tools_json,
                                                std::string_view kwargs_json) {
  if (chat_template == nullptr) {
    return FieldError("messages",
                      "this model has no chat template: send a prompt (text or token ids) instead");
  }
  absl::StatusOr<std::string> rendered =
      chat_template->Render(messages, /*add_generation_prompt=*/true, tools_json, kwargs_json);
  if (!rendered.ok()) {
    // The kwargs are to blame when the same conversation renders without them
    // (a template's own error only: a render that ran into the interpreter's
    // limits, ResourceExhausted, is not run twice).
    const bool kwargs_fault =
        !kwargs_json.empty() && absl::IsInvalidArgument(rendered.status()) &&
        chat_template->Render(messages, /*add_generation_prompt=*/true, tools_json, "").ok();
    const char* field = kwargs_fault ? "chat_template_kwargs" : "messages";
    return FieldError(field, absl::StrCat(field, ": ", rendered.status().message()));
  }
  EncodeOptions eo;
  eo.add_special_tokens = false;  // the template holds them
  eo.parse_special = true;
  return tokenizer.Encode(*rendered, eo);
}

}  // namespace pagedserve
