// --log-format json: spdlog lines as one JSON object per line,
//
//   {"time":"2026-12-04T23:03:31.386Z","level":"info","message":"engine: drained"}
//
// time in UTC (ISO 8601, milliseconds), level as spdlog names it (trace, debug,
// info, warning, error, critical), message JSON-escaped (quotes, backslashes,
// control characters; other bytes, UTF-8 included, as they are). No colour.
// Thread safety: the formatter is cloned into each sink by spdlog, which
// serializes its use per sink.
#ifndef PAGEDSERVE_RUNTIME_CLI_JSON_LOG_FORMAT_H_
#define PAGEDSERVE_RUNTIME_CLI_JSON_LOG_FORMAT_H_

#include <memory>
#include <string>
#include <string_view>

#include "spdlog/formatter.h"

namespace pagedserve::cli {

// Appends `text` to `out` as the inside of a JSON string literal (RFC 8259).
void AppendJsonEscaped(std::string_view text, std::string* out);

// The formatter of --log-format json (see the header comment).
std::unique_ptr<spdlog::formatter> MakeJsonLogFormatter();

}  // namespace pagedserve::cli

#endif  // PAGEDSERVE_RUNTIME_CLI_JSON_LOG_FORMAT_H_
