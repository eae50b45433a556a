#include "runtime/cli/json_log_format.h"

#include <cstdio>

#include "spdlog/pattern_formatter.h"

namespace pagedserve::cli {
namespace {

// The pattern flag '*': the message, JSON-escaped.
class JsonMessageFlag final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm& /*tm_time*/,
              spdlog::memory_buf_t& dest) override {
    std::string escaped;
    AppendJsonEscaped(std::string_view(msg.payload.data(), msg.payload.size()), &escaped);
    dest.append(escaped.data(), escaped.data() + escaped.size());
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessageFlag>();
  }
};

}  // namespace

void AppendJsonEscaped(std::string_view text, std::string* out) {
  for (const char c : text) {
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char u[8];
          std::snprintf(u, sizeof(u), "\\u%04x", static_cast<unsigned>(c));
          out->append(u);
        } else {
          out->push_back(c);
        }
    }
  }
}

std::unique_ptr<spdlog::formatter> MakeJsonLogFormatter() {
  auto f = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
  f->add_flag<JsonMessageFlag>('*');
  f->set_pattern(R"({"time":"%Y-%m-%dT%H:%M:%S.%eZ","level":"%l","message":"%*"})");
  return f;
}

}  // namespace pagedserve::cli
