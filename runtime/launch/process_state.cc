#include "runtime/launch/process_state.h"

#include <signal.h>

#include <cerrno>
#include <cstdio>

#include <spdlog/sinks/stdout_color_sinks.h>

#include "absl/strings/str_cat.h"

namespace pagedserve::launch_internal {

MpiState& State() {
  static MpiState* state = new MpiState();
  return *state;
}

spdlog::logger& Log() {
  static std::shared_ptr<spdlog::logger> logger = [] {
    std::shared_ptr<spdlog::logger> l = spdlog::get("launch");
    return l ? l : spdlog::stderr_color_mt("launch");
  }();
  return *logger;
}

bool ProcessGone(int64_t pid) {
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return true;
  std::FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr) return false;  // no procfs: only the kill() check
  char state = '?';
  const int scanned = std::fscanf(f, "%*d (%*[^)]) %c", &state);
  std::fclose(f);
  return scanned == 1 && (state == 'Z' || state == 'X');
}

}  // namespace pagedserve::launch_internal
