// Chat messages -> prompt text, by running the chat template the model ships
// (GGUF tokenizer.chat_template, tokenizer_config.json chat_template) or the
// one given with --chat-template, through runtime/chat: a sandboxed Jinja2
// engine that renders what Hugging Face's apply_chat_template renders, byte
// for byte (tests/chat: llama.cpp's corpus of real templates).
//
// The template sees what transformers passes it: `messages` (a list of
// {"role", "content"} dicts, with "tool_calls", "tool_call_id" and "name"
// where the message has them), `tools` (the request's list, JSON objects
// in the client's key order, or None) and `documents` (None),
// `add_generation_prompt`, `bos_token` and `eos_token`; strftime_now reads the
// local time. family() and default_system_prompt() describe the template
// (from marker strings) and do not change how it renders.
#ifndef PAGEDSERVE_RUNTIME_TOKENIZER_CHAT_TEMPLATE_H_
#define PAGEDSERVE_RUNTIME_TOKENIZER_CHAT_TEMPLATE_H_

#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/chat/template.h"

namespace pagedserve {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool" ...
  std::string content;
  // Tool calling (OpenAI's message fields, as Hugging Face templates read
  // them). tool_calls: an assistant turn's calls as JSON text, an array of
  // {"id", "type": "function", "function": {"name", "arguments": {...}}} with
  // the arguments as an object (the front end parses OpenAI's string, as vLLM
  // does), keys in the client's order; "" for none. tool_call_id and name: a
  // tool turn's call id and function name; "" for none.
  std::string tool_calls = {};
  std::string tool_call_id = {};
  std::string name = {};
};

// The family a template's markers suggest: "<|im_start|>" ChatML (SmolLM2,
// Qwen), "<|start_header_id|>" Llama 3, "[INST]" with "<<SYS>>" Llama 2,
// "[INST]" Mistral; kOther for any other template (it renders all the same).
enum class ChatTemplateFamily { kChatMl, kLlama2, kLlama3, kMistral, kOther };

// Whether `name` is a variable ChatTemplate::Render sets itself (messages,
// tools, documents, add_generation_prompt, bos_token, eos_token), which
// kwargs may not replace.
bool IsReservedTemplateVariable(std::string_view name);

class ChatTemplate {
 public:
  // FailedPrecondition for an empty source (the model has no template);
  // InvalidArgument "chat template: line N: ..." for a template jinja2 would
  // refuse to compile, Unimplemented for one using a construct the engine does
  // not support (both name it).
  static absl::StatusOr<ChatTemplate> Create(std::string_view source, std::string bos_token,
                                             std::string eos_token);

  ChatTemplateFamily family() const { return family_; }
  // ChatML only: the literal default system turn in the source ("" if none).
  const std::string& default_system_prompt() const { return default_system_; }

  // InvalidArgument "chat template: line N: <message>" when the template
  // refuses the conversation (raise_exception, e.g. roles that do not
  // alternate) or fails on it; ResourceExhausted when it crosses the engine's
  // limits. Thread-safe.
  // tools_json: the OpenAI `tools` array as JSON text ("" = None). A
  // ChatMessage::tool_calls or tools_json that is not valid JSON is
  // InvalidArgument.
  // kwargs_json: a JSON object whose members become more template variables
  // (vLLM's chat_template_kwargs, e.g. Qwen3's {"enable_thinking": false}, and
  // reasoning_effort), "" for none; InvalidArgument for text that is not an
  // object or a member named like a variable above (messages, tools, ...).
  absl::StatusOr<std::string> Render(std::span<const ChatMessage> messages,
                                     bool add_generation_prompt, std::string_view tools_json = {},
                                     std::string_view kwargs_json = {}) const;
  // The template's text (the tool-call format is chosen from its markers).
  const std::string& source() const { return source_; }

 private:
  explicit ChatTemplate(chat::Template engine) : engine_(std::move(engine)) {}
  chat::Template engine_;
  ChatTemplateFamily family_ = ChatTemplateFamily::kOther;
  std::string default_system_;
  std::string bos_;
  std::string eos_;
  std::string source_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_TOKENIZER_CHAT_TEMPLATE_H_
