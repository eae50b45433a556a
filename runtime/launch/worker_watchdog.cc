#include "runtime/launch/worker_watchdog.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "runtime/launch/process_state.h"

namespace pagedserve::launch_internal {
namespace {

std::atomic<bool> g_sigterm{false};

extern "C" void OnSigterm(int) { g_sigterm.store(true); }

}  // namespace

void InstallWorkerSignals() {
  // The coordinator decides when ranks stop: Ctrl-C reaches it through mpirun.
  signal(SIGINT, SIG_IGN);
  struct sigaction sa = {};
  sa.sa_handler = OnSigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
}

Watchdog::Watchdog(absl::Duration grace, bool check_coordinator)
    : grace_(grace),
      check_coordinator_(check_coordinator),
      last_progress_(std::chrono::steady_clock::now().time_since_epoch().count()),
      thread_([this] { Run(); }) {}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Watchdog::Progress() {
  last_progress_.store(std::chrono::steady_clock::now().time_since_epoch().count());
}

void Watchdog::Run() {
  const auto grace = absl::ToChronoNanoseconds(grace_);
  std::unique_lock<std::mutex> l(mu_);
  std::chrono::steady_clock::time_point term_seen{};
  while (!cv_.wait_for(l, std::chrono::milliseconds(200), [this] { return stop_; })) {
    const auto now = std::chrono::steady_clock::now();
    if (check_coordinator_ && State().coordinator_pid > 0 && ProcessGone(State().coordinator_pid)) {
      Log().error("coordinator process {} is gone; worker rank exits", State().coordinator_pid);
      std::fflush(nullptr);
      _exit(3);
    }
    if (g_sigterm.load()) {
      if (term_seen == std::chrono::steady_clock::time_point{}) term_seen = now;
      const auto last = std::chrono::steady_clock::time_point(
          std::chrono::steady_clock::duration(last_progress_.load()));
      if (now - std::max(last, term_seen) > grace) {
        Log().error("SIGTERM and no step progress for {}; worker rank exits",
                    absl::FormatDuration(grace_));
        std::fflush(nullptr);
        _exit(128 + SIGTERM);
      }
    }
  }
}

}  // namespace pagedserve::launch_internal
