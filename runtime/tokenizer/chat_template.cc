#include "runtime/tokenizer/chat_template.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pagedserve {
namespace {

bool Contains(std::string_view s, std::string_view needle) {
  return s.find(needle) != std::string_view::npos;
}

std::string Strip(std::string_view s) {
  auto space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
  };
  size_t b = 0, e = s.size();
  while (b < e && space(s[b])) ++b;
  while (e > b && space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
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

absl::Status AlternationError() {
  return absl::InvalidArgumentError(
      "chat template: Conversation roles must alternate user/assistant/user/assistant/...");
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Create(std::string_view source, std::string bos_token,
                                                  std::string eos_token) {
  if (source.empty()) {
    return absl::FailedPreconditionError("chat template: the model has no chat template");
  }
  ChatTemplate t;
  t.bos_ = std::move(bos_token);
  t.eos_ = std::move(eos_token);
  if (Contains(source, "<|im_start|>")) {
    t.family_ = ChatTemplateFamily::kChatMl;
    // A literal default system turn: '<|im_start|>system\n...<|im_end|>' inside one
    // quoted string (not followed by a concatenated message['content']).
    for (std::string_view marker :
         {std::string_view("<|im_start|>system\n"), std::string_view("<|im_start|>system\\n")}) {
      size_t at = source.find(marker);
      while (at != std::string_view::npos) {
        size_t start = at + marker.size();
        size_t end = source.find("<|im_end|>", start);
        size_t quote = source.find_first_of("'\"", start);
        if (end != std::string_view::npos && (quote == std::string_view::npos || end < quote)) {
          t.has_default_system_ = true;
          t.default_system_ = Unescape(source.substr(start, end - start));
          break;
        }
        at = source.find(marker, start);
      }
      if (t.has_default_system_) break;
    }
  } else if (Contains(source, "<|start_header_id|>")) {
    t.family_ = ChatTemplateFamily::kLlama3;
  } else if (Contains(source, "[INST]") && Contains(source, "<<SYS>>")) {
    t.family_ = ChatTemplateFamily::kLlama2;
  } else if (Contains(source, "[INST]")) {
    t.family_ = ChatTemplateFamily::kMistral;
  } else {
    return absl::UnimplementedError(absl::StrCat(
        "chat template: not recognised (no ChatML '<|im_start|>', Llama-3 "
        "'<|start_header_id|>', Llama-2 '<<SYS>>' or Mistral '[INST]' markers); it begins: ",
        std::string(source.substr(0, 80))));
  }
  return t;
}

absl::StatusOr<std::string> ChatTemplate::Render(std::span<const ChatMessage> messages,
                                                 bool add_generation_prompt) const {
  std::string out;
  switch (family_) {
    case ChatTemplateFamily::kChatMl:
      for (size_t i = 0; i < messages.size(); ++i) {
        if (i == 0 && has_default_system_ && messages[0].role != "system") {
          absl::StrAppend(&out, "<|im_start|>system\n", default_system_, "<|im_end|>\n");
        }
        absl::StrAppend(&out, "<|im_start|>", messages[i].role, "\n", messages[i].content,
                        "<|im_end|>\n");
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case ChatTemplateFamily::kLlama3:
      for (size_t i = 0; i < messages.size(); ++i) {
        absl::StrAppend(&out, i == 0 ? bos_ : "", "<|start_header_id|>", messages[i].role,
                        "<|end_header_id|>\n\n", Strip(messages[i].content), "<|eot_id|>");
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatTemplateFamily::kLlama2: {
      std::span<const ChatMessage> loop = messages;
      const std::string* system = nullptr;
      if (!messages.empty() && messages[0].role == "system") {
        system = &messages[0].content;
        loop = messages.subspan(1);
      }
      for (size_t i = 0; i < loop.size(); ++i) {
        if ((loop[i].role == "user") != (i % 2 == 0)) return AlternationError();
        std::string content =
            (i == 0 && system != nullptr)
                ? absl::StrCat("<<SYS>>\n", *system, "\n<</SYS>>\n\n", loop[i].content)
                : loop[i].content;
        if (loop[i].role == "user") {
          absl::StrAppend(&out, bos_, "[INST] ", Strip(content), " [/INST]");
        } else if (loop[i].role == "assistant") {
          absl::StrAppend(&out, " ", Strip(content), " ", eos_);
        }
      }
      return out;
    }
    case ChatTemplateFamily::kMistral:
      out = bos_;
      for (size_t i = 0; i < messages.size(); ++i) {
        if ((messages[i].role == "user") != (i % 2 == 0)) return AlternationError();
        if (messages[i].role == "user") {
          absl::StrAppend(&out, "[INST] ", messages[i].content, " [/INST]");
        } else if (messages[i].role == "assistant") {
          absl::StrAppend(&out, messages[i].content, eos_);
        } else {
          return absl::InvalidArgumentError(
              "chat template: Only user and assistant roles are supported!");
        }
      }
      return out;
  }
  return absl::InternalError("chat template: unknown family");
}

}  // namespace pagedserve
