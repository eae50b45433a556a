// A chat template engine: Jinja2 templates as Hugging Face's
// apply_chat_template runs them (jinja2's ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks, the loopcontrols extension, the generation tag,
// and the globals raise_exception, strftime_now, namespace, dict and the
// tojson filter transformers installs), rendering byte for byte what jinja2
// renders (tests/chat: every template of llama.cpp's corpus).
//
//   absl::StatusOr<chat::Template> t = chat::Template::Parse(source);
//   chat::Dict vars;  vars.Set("messages", ...);  vars.Set("add_generation_prompt", true);
//   absl::StatusOr<std::string> prompt = t->Render(vars);
//
// Layers: lexer.h (text -> tokens), parser.h (tokens -> ast.h), interpreter.h
// (walks the tree over value.h values), with operators.h, filters.h,
// jinja_tests.h, methods.h, globals.h, py_format.h and py_text.h giving
// Python's and jinja2's semantics.
//
// Sandbox: a template reads only the variables it is given; no file access,
// no imports, no other template; lists and dicts cannot be changed; loops,
// macro recursion, nesting, output and work are bounded (RenderLimits).
// Unsupported constructs fail with Unimplemented naming them.
#ifndef PAGEDSERVE_RUNTIME_CHAT_TEMPLATE_H_
#define PAGEDSERVE_RUNTIME_CHAT_TEMPLATE_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/chat/interpreter.h"
#include "runtime/chat/parser.h"
#include "runtime/chat/value.h"

namespace pagedserve::chat {

class Template {
 public:
  // InvalidArgument "line N: ..." for text jinja2 refuses to compile (or text
  // that is not UTF-8), Unimplemented for a construct not supported,
  // ResourceExhausted past options.max_nesting.
  static absl::StatusOr<Template> Parse(std::string_view source, const ParseOptions& options = {});

  // Renders with the variables `context`. `clock` is what strftime_now reads
  // (nullptr: the local time now). Errors: InvalidArgument "line N: ..." for
  // the template's own errors (raise_exception's message, an undefined value
  // used, a type error), ResourceExhausted naming the RenderLimits field
  // crossed, Unimplemented for a construct not supported. Thread-safe.
  absl::StatusOr<std::string> Render(const Dict& context, const RenderLimits& limits = {},
                                     const Clock& clock = nullptr) const;

 private:
  explicit Template(std::shared_ptr<const TemplateAst> ast) : ast_(std::move(ast)) {}
  std::shared_ptr<const TemplateAst> ast_;
};

// The local time now (what strftime_now reads by default).
std::tm LocalTimeNow();

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_TEMPLATE_H_
