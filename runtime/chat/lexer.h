// Template text -> tokens, as jinja2's lexer with Hugging Face's settings:
// trim_blocks (the first newline after a block or comment tag is dropped),
// lstrip_blocks (spaces and tabs before a block or comment tag at the start of
// a line are dropped), `{%-` / `-%}` (all whitespace on that side dropped) and
// `{%+` / `+%}` (none), {% raw %} ... {% endraw %}, comments, newlines
// normalised to "\n" and one trailing newline of the source removed
// (keep_trailing_newline=False).
#ifndef PAGEDSERVE_RUNTIME_CHAT_LEXER_H_
#define PAGEDSERVE_RUNTIME_CHAT_LEXER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pagedserve::chat {

enum class TokenType : uint8_t {
  kData,           // text outside tags (text: the text)
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,           // identifiers and keywords (text)
  kString,         // text: the unescaped value
  kInteger,        // int_value
  kFloat,          // float_value
  kOperator,       // text: "+", "//", "==", "(", ...
  kEof,
};

struct Token {
  TokenType type;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// InvalidArgument "line N: ..." for text jinja2's lexer refuses (a missing end
// of comment or raw block, an unexpected character, unbalanced brackets, an
// integer that does not fit in 64 bits).
absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_LEXER_H_
