// Tokens -> syntax tree, following jinja2's grammar (jinja2/parser.py):
// statements if/elif/else, for (tuple targets, `if` filter, else), set (also
// ns.attr and block form), macro, call blocks, filter blocks, with, raw,
// break/continue (the loopcontrols extension), generation (transformers'
// AssistantTracker tag, rendered as its body) and print; expressions with
// jinja2's precedence, filters, tests, slices, calls with keyword, *args and
// **kwargs.
//
// As jinja2's compiler: an unknown filter or test is a syntax error unless it
// sits inside an {% if %} or an inline if (there it fails only if reached);
// break/continue outside a loop is an error. Tags that need a template loader
// (extends, block, include, import, from) and autoescape are refused with
// Unimplemented naming the tag.
#ifndef PAGEDSERVE_RUNTIME_CHAT_PARSER_H_
#define PAGEDSERVE_RUNTIME_CHAT_PARSER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/chat/ast.h"
#include "runtime/chat/lexer.h"

namespace pagedserve::chat {

struct ParseOptions {
  // Expressions and statements nested inside one another; the parser and the
  // interpreter recurse once per level, so this bounds their stack.
  int max_nesting = 64;
};

// InvalidArgument "line N: ..." for a syntax error; ResourceExhausted when the
// nesting limit is crossed; Unimplemented for a construct not supported.
absl::StatusOr<std::unique_ptr<TemplateAst>> Parse(std::vector<Token> tokens,
                                                   const ParseOptions& options = {});

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_PARSER_H_
