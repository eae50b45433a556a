#include "runtime/cli/load_progress.h"

#include <unistd.h>

#include <algorithm>
#include <memory>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/cli/common_flags.h"
#include "spdlog/spdlog.h"

namespace pagedserve::cli {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr int kBarWidth = 20;

double MiB(uint64_t bytes) { return static_cast<double>(bytes) / kMiB; }

// Lines go to stderr (the "launch" logger ConfigureLogging sets up), so that
// `generate`'s stdout holds only the generated text.
void LogLine(const std::string& text) {
  std::shared_ptr<spdlog::logger> stderr_logger = spdlog::get("launch");
  (stderr_logger ? stderr_logger : spdlog::default_logger())->info("{}", text);
}

int Percent(uint64_t loaded, uint64_t total) {
  return total == 0 ? 100 : static_cast<int>(100.0 * static_cast<double>(loaded) / total);
}

}  // namespace

LoadProgressPrinter::LoadProgressPrinter(bool bar, double every_seconds, std::FILE* terminal)
    : bar_(bar), every_seconds_(every_seconds), terminal_(terminal) {}

std::string LoadProgressPrinter::BarText(uint64_t loaded, uint64_t total, double seconds) {
  const int percent = Percent(loaded, total);
  const int filled = percent * kBarWidth / 100;
  return absl::StrFormat("Loading weights [%s%s] %3d%%  %.1f / %.1f MiB  %.1f s",
                         std::string(filled, '#'), std::string(kBarWidth - filled, '-'), percent,
                         MiB(loaded), MiB(total), seconds);
}

std::string LoadProgressPrinter::LineText(uint64_t loaded, uint64_t total, double seconds) {
  return absl::StrFormat("Loading weights: %.1f / %.1f MiB (%d%%), %.1f s", MiB(loaded), MiB(total),
                         Percent(loaded, total), seconds);
}

std::string LoadProgressPrinter::DoneText(uint64_t total, double seconds) {
  return absl::StrFormat("Loaded weights: %.1f MiB in %.1f s", MiB(total), seconds);
}

void LoadProgressPrinter::Update(uint64_t loaded_bytes, uint64_t total_bytes) {
  if (done_) return;  // LoadLlamaWeights may report the total twice
  const Clock::time_point now = Clock::now();
  if (!started_) {
    started_ = true;
    start_ = last_shown_ = now;
  }
  const double seconds = std::chrono::duration<double>(now - start_).count();
  const bool done = loaded_bytes >= total_bytes;
  done_ = done;
  if (bar_) {
    // Redrawn at most every 100 ms, and once when done.
    if (!done && now - last_shown_ < std::chrono::milliseconds(100)) return;
    last_shown_ = now;
    const std::string text =
        done ? DoneText(total_bytes, seconds) : BarText(loaded_bytes, total_bytes, seconds);
    std::fprintf(terminal_, "\r%-72s%s", text.c_str(), done ? "\n" : "");
    std::fflush(terminal_);
    return;
  }
  if (done) {
    LogLine(DoneText(total_bytes, seconds));
    return;
  }
  const int quarter = Percent(loaded_bytes, total_bytes) / 25;
  const bool due = std::chrono::duration<double>(now - last_shown_).count() >= every_seconds_;
  if (quarter > last_quarter_ || due) {
    last_quarter_ = std::max(last_quarter_, quarter);
    last_shown_ = now;
    LogLine(LineText(loaded_bytes, total_bytes, seconds));
  }
}

bool UseLoadProgressBar(bool is_terminal, bool under_mpirun, bool json_logs) {
  return is_terminal && !under_mpirun && !json_logs;
}

LoadProgressFn MakeLoadProgress() {
  const bool bar = UseLoadProgressBar(isatty(STDERR_FILENO) == 1, StartedByMpirun(),
                                      absl::GetFlag(FLAGS_log_format) == "json");
  auto printer = std::make_shared<LoadProgressPrinter>(bar, /*every_seconds=*/5.0);
  return [printer](uint64_t loaded, uint64_t total) { printer->Update(loaded, total); };
}

}  // namespace pagedserve::cli
