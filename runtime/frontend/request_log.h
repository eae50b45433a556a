// The request log of the front ends: one line per finished request (spdlog,
// info level) that says what was served without saying what was said.
//
// A line carries the request id, the token counts, the finish reasons and the
// timings; never prompt or completion text, token ids or chat messages, unless
// the operator passes --log-request-content (then, on the same line, the
// prompt and each completion, C-escaped so that one request is one line and a
// client cannot forge log lines with newlines). Client-controlled strings that
// are always logged (the request id) are C-escaped too.
//
// Thread-safe (spdlog's default logger is).
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_REQUEST_LOG_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_REQUEST_LOG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/engine/output_accumulator.h"
#include "runtime/frontend/protocol.h"

namespace pagedserve {

struct RequestLogRecord {
  std::string front_end;   // "zmq" (the HTTP front end: "http")
  std::string request_id;  // the engine request id
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  std::vector<std::string> finish_reasons;  // by sample index
  double first_output_s = -1;               // admission -> first output sent; < 0 when none
  double e2e_s = 0;                         // admission -> final message
  bool client_disconnected = false;         // the client went away before the end
  // Filled only with --log-request-content.
  std::optional<std::string> prompt;     // DescribePrompt()
  std::vector<std::string> completions;  // by sample index
};

// The record of a finished client request (every front end builds it here):
// usage, one finish reason per completion (OutputAccumulator's order) and the
// timings from `output` (first_output_s: its first token); the completions'
// text only when `prompt` is set (--log-request-content).
RequestLogRecord LogRecordOf(std::string front_end, std::string request_id,
                             const OutputAccumulator& output, bool client_disconnected,
                             std::optional<std::string> prompt);

// The line (without the logger's prefix), for tests and for LogRequest.
std::string FormatRequestLog(const RequestLogRecord& record);
// Writes FormatRequestLog(record) at info level.
void LogRequest(const RequestLogRecord& record);

// A prompt as logged with --log-request-content: the text, "token_ids=[...]",
// or the chat messages as "role: content" turns separated by " | ".
std::string DescribePrompt(const protocol::Prompt& prompt);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_REQUEST_LOG_H_
