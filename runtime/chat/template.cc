#include "runtime/chat/template.h"

#include <ctime>

#include "absl/status/status.h"
#include "runtime/chat/lexer.h"
#include "runtime/chat/py_text.h"
#include "runtime/common/status_macros.h"

namespace pagedserve::chat {
namespace {

bool IsValidUtf8(std::string_view s) {
  for (char32_t c : DecodeUtf8(s)) {
    if (c >= 0xDC80 && c <= 0xDCFF) return false;
  }
  return true;
}

}  // namespace

std::tm LocalTimeNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  return tm;
}

absl::StatusOr<Template> Template::Parse(std::string_view source, const ParseOptions& options) {
  if (!IsValidUtf8(source)) return absl::InvalidArgumentError("the template is not valid UTF-8");
  PS_ASSIGN_OR_RETURN(std::vector<Token> tokens, Tokenize(source));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<TemplateAst> ast, chat::Parse(std::move(tokens), options));
  return Template(std::shared_ptr<const TemplateAst>(std::move(ast)));
}

absl::StatusOr<std::string> Template::Render(const Dict& context, const RenderLimits& limits,
                                             const Clock& clock) const {
  Interpreter interpreter(limits, clock ? clock : Clock(LocalTimeNow));
  return interpreter.Render(*ast_, context);
}

}  // namespace pagedserve::chat
