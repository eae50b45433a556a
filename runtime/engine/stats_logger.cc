#include "runtime/engine/stats_logger.h"

#include <chrono>
#include <cstdint>

#include "absl/strings/str_format.h"
#include "spdlog/spdlog.h"

namespace pagedserve {
namespace {

double Percent(double fraction) { return 100.0 * fraction; }

}  // namespace

std::string FormatStatsLine(const EngineSnapshot& prev, const EngineSnapshot& cur, double seconds) {
  const double prompt_tps =
      static_cast<double>(cur.tokens.prompt_tokens - prev.tokens.prompt_tokens) / seconds;
  const double generation_tps =
      static_cast<double>(cur.tokens.generation_tokens - prev.tokens.generation_tokens) / seconds;
  const SchedulerStats& s = cur.scheduler;
  const double hit_rate =
      s.prefix_cache_queries > 0
          ? static_cast<double>(s.prefix_cache_hits) / static_cast<double>(s.prefix_cache_queries)
          : 0.0;
  return absl::StrFormat(
      "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
      "Running: %d reqs, Waiting: %d reqs, Swapped: %d reqs, Device KV cache usage: %.1f%%, "
      "CPU swap usage: %.1f%%, Prefix cache hit rate: %.1f%%",
      prompt_tps, generation_tps, s.num_running, s.num_waiting + cur.queued_adds, s.num_swapped,
      Percent(s.device_kv_usage), Percent(s.cpu_kv_usage), Percent(hit_rate));
}

bool StatsIntervalBusy(const EngineSnapshot& prev, const EngineSnapshot& cur) {
  const SchedulerStats& s = cur.scheduler;
  return cur.tokens.prompt_tokens != prev.tokens.prompt_tokens ||
         cur.tokens.generation_tokens != prev.tokens.generation_tokens || s.num_running > 0 ||
         s.num_waiting > 0 || cur.queued_adds > 0 || s.num_swapped > 0;
}

StatsLogger::StatsLogger(const EngineLoop* loop, absl::Duration interval)
    : loop_(loop), interval_(interval), thread_([this] { Run(); }) {}

StatsLogger::~StatsLogger() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StatsLogger::Run() {
  using Clock = std::chrono::steady_clock;
  const auto interval = absl::ToChronoNanoseconds(interval_);
  EngineSnapshot prev = loop_->Snapshot();
  Clock::time_point prev_time = Clock::now();
  bool prev_busy = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!wake_.wait_until(lock, prev_time + interval, [this] { return stop_; })) {
    lock.unlock();
    const EngineSnapshot cur = loop_->Snapshot();
    const Clock::time_point now = Clock::now();
    const double seconds = std::chrono::duration<double>(now - prev_time).count();
    const bool busy = StatsIntervalBusy(prev, cur);
    const std::string line = FormatStatsLine(prev, cur, seconds);
    if (busy || prev_busy) {
      spdlog::info("{}", line);
    } else {
      spdlog::debug("{}", line);
    }
    prev = cur;
    prev_time = now;
    prev_busy = busy;
    lock.lock();
  }
}

}  // namespace pagedserve
