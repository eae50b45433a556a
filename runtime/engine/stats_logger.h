// The periodic stats log line of a server (as vLLM's "Avg prompt throughput"
// line), from EngineLoop snapshots:
//
//   Avg prompt throughput: 812.4 tokens/s, Avg generation throughput: 95.0 tokens/s,
//   Running: 3 reqs, Waiting: 0 reqs, Swapped: 0 reqs, Device KV cache usage: 4.7%,
//   CPU swap usage: 0.0%, Prefix cache hit rate: 37.5%
//
// Throughputs are over the interval since the previous line; requests and
// usages are as of the newest snapshot; the prefix-cache hit rate is over every
// lookup since the server started (hit tokens / looked-up tokens).
//
// Level (as vLLM): info while the server is busy (tokens were processed in the
// interval, or requests are running, waiting or swapped) and for the first
// idle line after a busy one (it shows the drop to zero); debug while idle,
// so an idle server's log stays quiet unless --log-level debug.
#ifndef PAGEDSERVE_RUNTIME_ENGINE_STATS_LOGGER_H_
#define PAGEDSERVE_RUNTIME_ENGINE_STATS_LOGGER_H_

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "absl/time/time.h"
#include "runtime/engine/engine_loop.h"

namespace pagedserve {

// The line for the interval from `prev` to `cur`, `seconds` long (> 0).
std::string FormatStatsLine(const EngineSnapshot& prev, const EngineSnapshot& cur, double seconds);

// Busy in the interval from `prev` to `cur`: tokens were prefilled or sampled,
// or `cur` has running, waiting (queued adds included) or swapped requests.
bool StatsIntervalBusy(const EngineSnapshot& prev, const EngineSnapshot& cur);

// A thread that logs FormatStatsLine every `interval` (spdlog's default
// logger) until destroyed. It reads only EngineLoop::Snapshot, which copies
// published figures under the loop's mutex: it never waits for an engine step.
// Thread safety: construct and destroy on one thread; nothing else is public.
class StatsLogger {
 public:
  // `loop` (not owned) must outlive the logger; `interval` > 0.
  StatsLogger(const EngineLoop* loop, absl::Duration interval);
  StatsLogger(const StatsLogger&) = delete;
  StatsLogger& operator=(const StatsLogger&) = delete;
  // Stops the thread (wakes it at once) and joins it.
  ~StatsLogger();

 private:
  void Run();

  const EngineLoop* const loop_;
  const absl::Duration interval_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;  // guarded by mu_
  std::thread thread_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_ENGINE_STATS_LOGGER_H_
