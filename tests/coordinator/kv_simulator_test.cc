#include "runtime/coordinator/kv_simulator.h"

#include <cstdio>
#include <fstream>

#include "gtest/gtest.h"

namespace pagedserve {
namespace {

TEST(KvSimulatorTest, DefaultWorkloadComparesAllocators) {
  auto w = RandomSimWorkload(100, 50, 500, 0.5, 0.0, 1);
  ASSERT_EQ(w.size(), 100u);
  for (const SimRequest& r : w) {
    EXPECT_GE(r.prompt_len + r.output_len, 50);
    EXPECT_LE(r.prompt_len + r.output_len, 500);
  }
  SimConfig c;
  auto rep = RunKvSimulation(c, w);
  ASSERT_TRUE(rep.ok()) << rep.status();
  ASSERT_EQ(rep->allocators.size(), 3u);
  const AllocatorReport& naive = rep->allocators[0];
  const AllocatorReport& paged = rep->allocators[2];
  EXPECT_EQ(naive.completed, 100);
  EXPECT_EQ(paged.completed, 100);
  EXPECT_EQ(naive.generated_tokens, paged.generated_tokens);
  EXPECT_EQ(naive.max_concurrent, 16);  // 8192 / 512
  EXPECT_GT(paged.max_concurrent, 2 * naive.max_concurrent);
  EXPECT_LT(paged.internal_fragmentation, 0.1);
  EXPECT_GT(naive.internal_fragmentation, 0.3);
  EXPECT_EQ(naive.external_fragmentation, 0.0);  // equal-size regions never strand memory
  EXPECT_LT(paged.steps, naive.steps);
  const std::string table = FormatSimTable(*rep);
  EXPECT_NE(table.find("paged, block_size=16"), std::string::npos);
  const std::string svg = RenderSimSvg(*rep);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
}

TEST(KvSimulatorTest, TightPoolForcesPreemptionAndStillFinishes) {
  auto w =
      RandomSimWorkload(60, 50, 500, 0.3, 0.0, 2);  // long outputs: memory grows after admission
  SimConfig c;
  c.capacity_tokens = 2048;
  auto rep = RunKvSimulation(c, w);
  ASSERT_TRUE(rep.ok()) << rep.status();
  const AllocatorReport& paged = rep->allocators[2];
  EXPECT_EQ(paged.completed, 60);
  EXPECT_GT(paged.preemptions_swap + paged.preemptions_recompute, 0);
}

TEST(KvSimulatorTest, TraceFileAndParsers) {
  const std::string path = ::testing::TempDir() + "/trace.csv";
  {
    std::ofstream f(path);
    f << "arrival,prompt_len,output_len\n0,10,5\n# comment\n2, 20, 3\n";
  }
  auto t = LoadSimTrace(path);
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->size(), 2u);
  EXPECT_EQ((*t)[1].prompt_len, 20);
  {
    std::ofstream f(path);
    f << "0,10,5\n1,x,3\n";
  }
  auto bad = LoadSimTrace(path);
  EXPECT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(":2:"), std::string::npos) << bad.status();
  EXPECT_FALSE(LoadSimTrace(path + ".missing").ok());
  std::remove(path.c_str());

  auto shape = ParseModelShape("30,3,64,2");
  ASSERT_TRUE(shape.ok());
  EXPECT_EQ(shape->BytesPerToken(), 2 * 30 * 3 * 64 * 2);
  EXPECT_FALSE(ParseModelShape("30,3,64").ok());
  EXPECT_EQ(*ParseByteSize("1GiB"), 1073741824);
  EXPECT_EQ(*ParseByteSize("512MB"), 512000000);
  EXPECT_EQ(*ParseByteSize("1000"), 1000);
  EXPECT_FALSE(ParseByteSize("12 parsecs").ok());
}

TEST(KvSimulatorTest, ExactSizeNaiveShowsExternalFragmentation) {
  // Short and long requests interleaved: exact-size regions leave holes.
  std::vector<SimRequest> w;
  w.reserve(200);
  for (int i = 0; i < 200; ++i) w.push_back({0.0, i % 2 ? 40 : 300, i % 2 ? 200 : 20});
  SimConfig c;
  c.capacity_tokens = 4096;
  auto rep = RunKvSimulation(c, w);
  ASSERT_TRUE(rep.ok());
  EXPECT_GT(rep->allocators[1].external_blocked_steps, 0);
  EXPECT_GT(rep->allocators[1].external_fragmentation, 0.0);
  EXPECT_EQ(rep->allocators[2].external_fragmentation, 0.0);
}

TEST(KvSimulatorTest, BadConfigIsRejected) {
  SimConfig c;
  c.capacity_tokens = 8;
  EXPECT_FALSE(RunKvSimulation(c, {{0, 10, 10}}).ok());
  EXPECT_FALSE(RunKvSimulation(SimConfig{}, {}).ok());
}

}  // namespace
}  // namespace pagedserve
