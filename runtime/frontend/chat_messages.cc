#include "runtime/frontend/chat_messages.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/common/field_error.h"

namespace pagedserve {
namespace {

using json = nlohmann::json;

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
        if (it.key() != "role" && it.key() != "content") {
          return Bad(absl::StrCat("unknown field in ", name, " (expected 'role' and 'content')"));
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
    out->push_back(std::move(cm));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> EncodeChat(const ChatTemplate* chat_template,
                                                const Tokenizer& tokenizer,
                                                std::span<const ChatMessage> messages) {
  if (chat_template == nullptr) {
    return FieldError("messages",
                      "this model has no chat template: send a prompt (text or token ids) instead");
  }
  absl::StatusOr<std::string> rendered =
      chat_template->Render(messages, /*add_generation_prompt=*/true);
  if (!rendered.ok()) {
    return FieldError("messages", absl::StrCat("messages: ", rendered.status().message()));
  }
  EncodeOptions eo;
  eo.add_special_tokens = false;  // the template holds them
  eo.parse_special = true;
  return tokenizer.Encode(*rendered, eo);
}

}  // namespace pagedserve
