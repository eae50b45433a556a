#include "runtime/tokenizer/chat_template.h"

#include <algorithm>
#include <iterator>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/chat/json_value.h"
#include "runtime/common/status_macros.h"

namespace pagedserve {
namespace {

bool Contains(std::string_view s, std::string_view needle) {
  return s.find(needle) != std::string_view::npos;
}

// Text of a Jinja string literal with the escapes \n, \t, \', \" and \\ resolved.
std::string Unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      char c = s[++i];
      out.push_back(c == 'n' ? '\n' : c == 't' ? '\t' : c);
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

ChatTemplateFamily FamilyOf(std::string_view source) {
  if (Contains(source, "<|im_start|>")) return ChatTemplateFamily::kChatMl;
  if (Contains(source, "<|start_header_id|>")) return ChatTemplateFamily::kLlama3;
  if (Contains(source, "[INST]") && Contains(source, "<<SYS>>")) return ChatTemplateFamily::kLlama2;
  if (Contains(source, "[INST]")) return ChatTemplateFamily::kMistral;
  return ChatTemplateFamily::kOther;
}

// A literal default system turn of a ChatML template: '<|im_start|>system\n...<|im_end|>'
// inside one quoted string (not followed by a concatenated message['content']).
std::string DefaultSystemPrompt(std::string_view source) {
  for (std::string_view marker :
       {std::string_view("<|im_start|>system\n"), std::string_view("<|im_start|>system\\n")}) {
    for (size_t at = source.find(marker); at != std::string_view::npos;
         at = source.find(marker, at + marker.size())) {
      const size_t start = at + marker.size();
      const size_t end = source.find("<|im_end|>", start);
      const size_t quote = source.find_first_of("'\"", start);
      if (end != std::string_view::npos && (quote == std::string_view::npos || end < quote)) {
        return Unescape(source.substr(start, end - start));
      }
    }
  }
  return "";
}

// JSON text -> a template value, objects in their key order (json_value.h).
absl::StatusOr<chat::Value> OrderedJsonValue(std::string_view text, std::string_view what) {
  try {
    return chat::FromJson(nlohmann::ordered_json::parse(text.begin(), text.end()));
  } catch (const nlohmann::ordered_json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template: ", std::string(what), ": ", e.what()));
  }
}

// The variables Render() sets itself, which a request's kwargs may not replace.
constexpr std::string_view kReservedVariables[] = {
    "messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"};

// Adds the members of the JSON object `kwargs_json` to `vars`, in the
// client's order. InvalidArgument for text that is not a JSON object or a
// member named like a reserved variable.
absl::Status AddTemplateKwargs(std::string_view kwargs_json, chat::Dict* vars) {
  nlohmann::ordered_json kwargs;
  try {
    kwargs = nlohmann::ordered_json::parse(kwargs_json.begin(), kwargs_json.end());
  } catch (const nlohmann::ordered_json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("chat template: kwargs: ", e.what()));
  }
  if (!kwargs.is_object()) {
    return absl::InvalidArgumentError("chat template: kwargs must be a JSON object");
  }
  for (const auto& [key, value] : kwargs.items()) {
    if (IsReservedTemplateVariable(key)) {
      return absl::InvalidArgumentError(absl::StrCat("chat template: kwargs may not set '", key,
                                                     "' (the server sets it from the request)"));
    }
    vars->Set(chat::Value(key), chat::FromJson(value));
  }
  return absl::OkStatus();
}

absl::Status Prefixed(const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("chat template: ", status.message()));
}

}  // namespace

bool IsReservedTemplateVariable(std::string_view name) {
  return std::find(std::begin(kReservedVariables), std::end(kReservedVariables), name) !=
         std::end(kReservedVariables);
}

absl::StatusOr<ChatTemplate> ChatTemplate::Create(std::string_view source, std::string bos_token,
                                                  std::string eos_token) {
  if (source.empty()) {
    return absl::FailedPreconditionError("chat template: the model has no chat template");
  }
  absl::StatusOr<chat::Template> engine = chat::Template::Parse(source);
  if (!engine.ok()) return Prefixed(engine.status());
  ChatTemplate t(*std::move(engine));
  t.family_ = FamilyOf(source);
  if (t.family_ == ChatTemplateFamily::kChatMl) t.default_system_ = DefaultSystemPrompt(source);
  t.bos_ = std::move(bos_token);
  t.eos_ = std::move(eos_token);
  t.source_ = std::string(source);
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(std::span<const ChatMessage> messages,
                                                 bool add_generation_prompt,
                                                 std::string_view tools_json,
                                                 std::string_view kwargs_json) const {
  std::vector<chat::Value> list;
  list.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    chat::Dict message;
    message.Set("role", chat::Value(m.role));
    message.Set("content", chat::Value(m.content));
    if (!m.tool_calls.empty()) {
      absl::StatusOr<chat::Value> calls = OrderedJsonValue(m.tool_calls, "tool_calls");
      if (!calls.ok()) return calls.status();
      message.Set("tool_calls", *std::move(calls));
    }
    if (!m.tool_call_id.empty()) message.Set("tool_call_id", chat::Value(m.tool_call_id));
    if (!m.name.empty()) message.Set("name", chat::Value(m.name));
    list.push_back(chat::Value::FromDict(std::move(message)));
  }
  chat::Dict vars;
  vars.Set("messages", chat::Value::List(std::move(list)));
  if (tools_json.empty()) {
    vars.Set("tools", chat::Value(nullptr));
  } else {
    absl::StatusOr<chat::Value> tools = OrderedJsonValue(tools_json, "tools");
    if (!tools.ok()) return tools.status();
    vars.Set("tools", *std::move(tools));
  }
  vars.Set("documents", chat::Value(nullptr));
  vars.Set("add_generation_prompt", chat::Value(add_generation_prompt));
  vars.Set("bos_token", chat::Value(bos_));
  vars.Set("eos_token", chat::Value(eos_));
  if (!kwargs_json.empty()) {
    PS_RETURN_IF_ERROR(AddTemplateKwargs(kwargs_json, &vars));
  }
  absl::StatusOr<std::string> text = engine_.Render(vars);
  if (!text.ok()) return Prefixed(text.status());
  return text;
}

}  // namespace pagedserve
