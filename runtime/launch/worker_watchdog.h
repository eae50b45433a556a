// Worker-rank watchdog: a plain thread (no MPI calls; MPI is FUNNELED) that
// ends the process when the rank can no longer be told to stop over MPI, and
// the worker rank's signal handling it relies on. Used by RunWorkerRank
// (worker_rank.h); internal to runtime/launch/.
#ifndef PAGEDSERVE_RUNTIME_LAUNCH_WORKER_WATCHDOG_H_
#define PAGEDSERVE_RUNTIME_LAUNCH_WORKER_WATCHDOG_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>

#include "absl/time/time.h"

namespace pagedserve::launch_internal {

// Signals of a worker rank: SIGINT is ignored (the coordinator decides when
// ranks stop; Ctrl-C reaches it through mpirun) and SIGTERM only sets a flag
// that every Watchdog reads. Process-wide; call once, from the main thread.
void InstallWorkerSignals();

// Every 200 ms, the watchdog thread ends the process with _exit when
//  - `check_coordinator` (the coordinator runs on this host) and the
//    coordinator's process (State().coordinator_pid) is gone: _exit(3);
//  - a SIGTERM arrived and no Progress() was reported for `grace` since the
//    later of the signal and the last progress (a rank stuck in a collective
//    with a dead peer): _exit(128 + SIGTERM).
// Progress() is thread-safe. The destructor stops and joins the thread.
class Watchdog {
 public:
  Watchdog(absl::Duration grace, bool check_coordinator);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // The rank made progress (received a plan, finished a step).
  void Progress();

 private:
  void Run();

  const absl::Duration grace_;
  const bool check_coordinator_;
  std::atomic<int64_t> last_progress_;  // steady_clock ticks since its epoch
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after the fields above are set
};

}  // namespace pagedserve::launch_internal

#endif  // PAGEDSERVE_RUNTIME_LAUNCH_WORKER_WATCHDOG_H_
