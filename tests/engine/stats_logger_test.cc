// The stats log line (runtime/engine/stats_logger.h) and the engine-wide
// default seed (DefaultRequestSeed): pure functions, no engine. The thread
// that writes the line is checked end to end in tests/frontend/serve_test.py
// (OperateTest).
#include "runtime/engine/stats_logger.h"

#include <set>

#include "gtest/gtest.h"
#include "runtime/engine/engine.h"

namespace pagedserve {
namespace {

EngineSnapshot Snap(int64_t prompt, int64_t generation) {
  EngineSnapshot s;
  s.tokens.prompt_tokens = prompt;
  s.tokens.generation_tokens = generation;
  return s;
}

TEST(StatsLoggerTest, LineHasVllmFieldsOverTheInterval) {
  const EngineSnapshot prev = Snap(100, 40);
  EngineSnapshot cur = Snap(500, 240);
  cur.scheduler.num_running = 3;
  cur.scheduler.num_waiting = 1;
  cur.queued_adds = 1;
  cur.scheduler.num_swapped = 2;
  cur.scheduler.device_kv_usage = 0.125;
  cur.scheduler.cpu_kv_usage = 0.5;
  cur.scheduler.prefix_cache_queries = 64;
  cur.scheduler.prefix_cache_hits = 16;
  EXPECT_EQ(FormatStatsLine(prev, cur, 4.0),
            "Avg prompt throughput: 100.0 tokens/s, Avg generation throughput: 50.0 tokens/s, "
            "Running: 3 reqs, Waiting: 2 reqs, Swapped: 2 reqs, Device KV cache usage: 12.5%, "
            "CPU swap usage: 50.0%, Prefix cache hit rate: 25.0%");
}

TEST(StatsLoggerTest, NoLookupsIsAZeroHitRate) {
  EXPECT_NE(FormatStatsLine(Snap(0, 0), Snap(0, 0), 10.0).find("Prefix cache hit rate: 0.0%"),
            std::string::npos);
}

TEST(StatsLoggerTest, BusyWhenTokensMovedOrRequestsAreHeld) {
  EXPECT_FALSE(StatsIntervalBusy(Snap(10, 10), Snap(10, 10)));
  EXPECT_TRUE(StatsIntervalBusy(Snap(10, 10), Snap(11, 10)));
  EXPECT_TRUE(StatsIntervalBusy(Snap(10, 10), Snap(10, 11)));
  for (int field = 0; field < 4; ++field) {
    EngineSnapshot cur = Snap(10, 10);
    if (field == 0) cur.scheduler.num_running = 1;
    if (field == 1) cur.scheduler.num_waiting = 1;
    if (field == 2) cur.scheduler.num_swapped = 1;
    if (field == 3) cur.queued_adds = 1;
    EXPECT_TRUE(StatsIntervalBusy(Snap(10, 10), cur)) << field;
  }
}

TEST(DefaultRequestSeedTest, DeterministicAndDistinct) {
  EXPECT_EQ(DefaultRequestSeed(7, 3), DefaultRequestSeed(7, 3));
  std::set<uint64_t> seen;
  for (uint64_t seed : {0ULL, 1ULL, 2ULL}) {
    for (uint64_t ordinal = 0; ordinal < 100; ++ordinal) {
      seen.insert(DefaultRequestSeed(seed, ordinal));
    }
  }
  EXPECT_EQ(seen.size(), 300u);  // no two (seed, ordinal) pairs share a stream
}

}  // namespace
}  // namespace pagedserve
