#include "runtime/frontend/request_log.h"

#include <utility>
#include <variant>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "spdlog/spdlog.h"

namespace pagedserve {

RequestLogRecord LogRecordOf(std::string front_end, std::string request_id,
                             const OutputAccumulator& output, bool client_disconnected,
                             std::optional<std::string> prompt) {
  RequestLogRecord r;
  r.front_end = std::move(front_end);
  r.request_id = std::move(request_id);
  r.prompt_tokens = output.usage().prompt_tokens;
  r.completion_tokens = output.usage().completion_tokens;
  r.cached_prompt_tokens = output.usage().cached_prompt_tokens;
  r.first_output_s = output.first_token_s();
  r.e2e_s = output.elapsed_s();
  r.client_disconnected = client_disconnected;
  for (const CompletionOutput& c : output.completions()) {
    r.finish_reasons.emplace_back(FinishReasonName(c.finish_reason));
    if (prompt.has_value()) r.completions.push_back(c.text);
  }
  r.prompt = std::move(prompt);
  return r;
}

std::string FormatRequestLog(const RequestLogRecord& r) {
  std::string line = absl::StrFormat(
      "request %s: id=\"%s\" prompt_tokens=%d completion_tokens=%d cached_prompt_tokens=%d "
      "finish_reason=%s e2e_s=%.4f",
      r.front_end, absl::CEscape(r.request_id), r.prompt_tokens, r.completion_tokens,
      r.cached_prompt_tokens, absl::StrJoin(r.finish_reasons, ","), r.e2e_s);
  if (r.first_output_s >= 0) absl::StrAppendFormat(&line, " first_output_s=%.4f", r.first_output_s);
  if (r.client_disconnected) absl::StrAppend(&line, " client_disconnected");
  if (r.prompt.has_value()) absl::StrAppend(&line, " prompt=\"", absl::CEscape(*r.prompt), "\"");
  for (size_t i = 0; i < r.completions.size(); ++i) {
    absl::StrAppend(&line, " completion[", i, "]=\"", absl::CEscape(r.completions[i]), "\"");
  }
  return line;
}

void LogRequest(const RequestLogRecord& record) { spdlog::info("{}", FormatRequestLog(record)); }

std::string DescribePrompt(const protocol::Prompt& prompt) {
  if (const auto* text = std::get_if<std::string>(&prompt)) return *text;
  if (const auto* ids = std::get_if<std::vector<int32_t>>(&prompt)) {
    return absl::StrCat("token_ids=[", absl::StrJoin(*ids, ","), "]");
  }
  std::vector<std::string> turns;
  for (const protocol::ChatMessage& m : std::get<std::vector<protocol::ChatMessage>>(prompt)) {
    turns.push_back(absl::StrCat(m.role, ": ", m.content));
  }
  return absl::StrJoin(turns, " | ");
}

}  // namespace pagedserve
