// Chat messages -> prompt text, following the model's chat template.
//
// Debian 12 packages no C++ Jinja engine, so the template source stored with the
// model (GGUF tokenizer.chat_template, tokenizer_config.json chat_template) is
// not interpreted; it is recognised by distinctive markers and rendered by a
// built-in implementation of that family:
//   "<|im_start|>"          ChatML (SmolLM2, Qwen2): "<|im_start|>{role}\n{content}<|im_end|>\n";
//                           when the source contains a literal default system
//                           turn ("<|im_start|>system\n...<|im_end|>") it is
//                           inserted before a first message that is not a system one.
//   "<|start_header_id|>"   Llama 3: bos + "<|start_header_id|>{role}<|end_header_id|>\n\n"
//                           + trimmed content + "<|eot_id|>".
//   "<<SYS>>" and "[INST]"  Llama 2 chat: system folded into the first user turn,
//                           "{bos}[INST] {user} [/INST] {assistant} {eos}", roles must alternate.
//   "[INST]"                Mistral instruct: "{bos}[INST] {user} [/INST]{assistant}{eos}".
// Output is identical to the reference templates of these families as rendered
// by HF transformers' apply_chat_template (checked in tests/tokenizer). Other
// templates fail with Unimplemented naming the problem; a template of a known
// family with extra logic (tools, date strings) is rendered without that logic.
// Whitespace trimming (Llama 2/3 strip) removes ASCII whitespace only.
#ifndef PAGEDSERVE_RUNTIME_TOKENIZER_CHAT_TEMPLATE_H_
#define PAGEDSERVE_RUNTIME_TOKENIZER_CHAT_TEMPLATE_H_

#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace pagedserve {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

enum class ChatTemplateFamily { kChatMl, kLlama2, kLlama3, kMistral };

class ChatTemplate {
 public:
  // FailedPrecondition for an empty source (the model has no template),
  // Unimplemented when no family is recognised.
  static absl::StatusOr<ChatTemplate> Create(std::string_view source, std::string bos_token,
                                             std::string eos_token);

  ChatTemplateFamily family() const { return family_; }
  // ChatML only: the default system prompt found in the source ("" if none).
  const std::string& default_system_prompt() const { return default_system_; }

  // InvalidArgument (with the template's own message) when the conversation
  // breaks the family's rules, e.g. roles that do not alternate for Llama 2.
  absl::StatusOr<std::string> Render(std::span<const ChatMessage> messages,
                                     bool add_generation_prompt) const;

 private:
  ChatTemplate() = default;
  ChatTemplateFamily family_ = ChatTemplateFamily::kChatMl;
  bool has_default_system_ = false;
  std::string default_system_;
  std::string bos_;
  std::string eos_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_TOKENIZER_CHAT_TEMPLATE_H_
