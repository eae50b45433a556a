// The mpirun process model end to end: runs pagedserve_tp_driver (rank 0
// coordinator over MakeMpiExecutor, ranks 1..TP RunWorkerRank) under
// `mpirun --oversubscribe` and checks
//  - greedy tokens identical for TP = 1 and TP = 2 (and 4: KV heads replicated)
//    on the random-weight model, and TP = 1 vs TP = 3 on SmolLM2 when present;
//  - Qwen2's Q/K/V biases split across ranks: the qwen2_bias feature model at
//    TP = 2 (and 4: each rank one query head, KV heads replicated) gives the
//    transformers reference's greedy tokens (tests/fixtures/qwen2_bias); so
//    does Qwen3's per-head q/k RMSNorm (qwen3_qk_norm);
//  - a swap-out / swap-in of a sequence mid-generation under TP = 2 changes
//    no token;
//  - a wrong rank count, a TP size that does not divide the query heads and a
//    worker block size other than the coordinator's (the start-up handshake)
//    give a clear error and a non-zero exit, no hang;
//  - killing a worker mid-generation: the coordinator reports the failure and
//    everything exits non-zero within the documented time, no rank left.
// Every child runs under a hard timeout, so the test cannot hang CI.
//
// Environment (set by tests/distributed/CMakeLists.txt): PAGEDSERVE_TP_DRIVER,
// PAGEDSERVE_MPIEXEC, PAGEDSERVE_TEST_MODEL (random model dir),
// PAGEDSERVE_SMOLLM2 (optional GGUF path), PAGEDSERVE_QWEN2_BIAS_MODEL and
// PAGEDSERVE_QWEN3_MODEL (the make_random_variant.py qwen2_bias and
// qwen3_qk_norm dirs), PAGEDSERVE_SOURCE_DIR.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/distributed/subprocess.h"
#include "tests/worker/reference_fixture.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace {

using namespace pagedserve::subprocess;  // NOLINT

class LaunchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    driver_ = Env("PAGEDSERVE_TP_DRIVER");
    mpiexec_ = Env("PAGEDSERVE_MPIEXEC");
    model_ = Env("PAGEDSERVE_TEST_MODEL");
    ASSERT_FALSE(driver_.empty() || mpiexec_.empty() || model_.empty())
        << "set PAGEDSERVE_TP_DRIVER, PAGEDSERVE_MPIEXEC and PAGEDSERVE_TEST_MODEL";
    // OpenMPI refuses to run as root without these (containers, CI).
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  }

  // mpirun -np `np` with the flags a small machine needs (docs/distributed.md).
  std::vector<std::string> Mpirun(int np, const std::string& model, int tp,
                                  std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {mpiexec_,
                                     "-np",
                                     std::to_string(np),
                                     "--oversubscribe",
                                     "--bind-to",
                                     "none",
                                     driver_,
                                     "--model",
                                     model,
                                     "--tp",
                                     std::to_string(tp)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

  Result Run(const std::vector<std::string>& argv, double timeout_s = 240) {
    Child c(argv);
    Result r = c.Wait(timeout_s);
    return r;
  }

  // "seq I: tokens" lines of a successful run.
  static std::map<int, std::string> Tokens(const Result& r) {
    std::map<int, std::string> seqs;
    std::regex line(R"(seq (\d+): ([\d ]+))");
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), line);
         it != std::sregex_iterator(); ++it)
      seqs[std::stoi((*it)[1])] = (*it)[2];
    return seqs;
  }

  std::map<int, std::string> Generate(const std::string& model, int tp,
                                      std::vector<std::string> extra = {}) {
    Result r = Run(Mpirun(tp + 1, model, tp, std::move(extra)));
    EXPECT_EQ(r.exit_code, 0) << "TP " << tp << " run failed:\n" << r.out;
    auto t = Tokens(r);
    EXPECT_FALSE(t.empty()) << r.out;
    return t;
  }

  void ExpectTransformersGreedyAtTp(const std::string& model, const std::string& name,
                                    const std::string& arch);

  std::string driver_, mpiexec_, model_;
};

TEST_F(LaunchTest, GreedyTokensIdenticalForTp1Tp2Tp4OnRandomModel) {
  const std::vector<std::string> args = {"--max-tokens", "10"};
  auto tp1 = Generate(model_, 1, args);
  auto tp2 = Generate(model_, 2, args);
  ASSERT_EQ(tp1.size(), 3u);
  EXPECT_EQ(tp1, tp2);
  // 4 ranks, 2 KV heads: each KV head is replicated on two ranks.
  auto tp4 = Generate(model_, 4, args);
  EXPECT_EQ(tp1, tp4);
  // Not degenerate: the sequences differ from each other.
  EXPECT_NE(tp1[0], tp1[1]);
}

TEST_F(LaunchTest, SwapOutAndInUnderTp2KeepsTokens) {
  const std::vector<std::string> args = {"--max-tokens", "10"};
  auto plain = Generate(model_, 2, args);
  auto swapped = Generate(model_, 2, {"--max-tokens", "10", "--swap-at", "2"});
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(plain, swapped);
}

TEST_F(LaunchTest, SmolLM2GreedyTokensIdenticalForTp1AndTp3) {
  const std::string smol = Env("PAGEDSERVE_SMOLLM2");
  if (smol.empty() || access(smol.c_str(), R_OK) != 0)
    GTEST_SKIP() << "SmolLM2 GGUF not found (scripts/fetch-model; PAGEDSERVE_SMOLLM2=" << smol
                 << ")";
  const std::vector<std::string> args = {"--max-tokens", "8",      "--kv-cache-memory", "33554432",
                                         "--swap-space", "8388608"};
  auto tp1 = Generate(smol, 1, args);
  auto tp3 = Generate(smol, 3, args);
  ASSERT_EQ(tp1.size(), 3u);
  EXPECT_EQ(tp1, tp3);
}

// The feature model `model` (tests/fixtures/<name>/reference.json, HF
// architecture `arch`) at TP = 2 and TP = 4 gives the greedy tokens of
// transformers, with the near-tie rule of llama_reference_test.cc: at the first
// token that differs, the reference's own top-1 margin must be below 1e-3.
void LaunchTest::ExpectTransformersGreedyAtTp(const std::string& model, const std::string& name,
                                              const std::string& arch) {
  const nlohmann::json ref = pagedserve::testing::ReadJson(
      pagedserve::testing::SourceDir() + "/tests/fixtures/" + name + "/reference.json");
  ASSERT_TRUE(ref.at("model").at("config").at("architectures").at(0) == arch);
  constexpr size_t kTokens = 16;
  std::vector<std::string> prompts;
  std::vector<std::vector<int32_t>> want;
  std::vector<std::vector<double>> margins;
  std::vector<std::string> names;
  for (const nlohmann::json& p : ref.at("prompts")) {
    prompts.push_back(absl::StrJoin(p.at("prompt_ids").get<std::vector<int32_t>>(), " "));
    auto ids = p.at("greedy_ids").get<std::vector<int32_t>>();
    auto m = p.at("greedy_margins").get<std::vector<double>>();
    ASSERT_GE(ids.size(), kTokens);
    want.emplace_back(ids.begin(), ids.begin() + kTokens);
    margins.emplace_back(m.begin(), m.begin() + kTokens);
    names.push_back(p.at("name").get<std::string>());
  }
  ASSERT_GE(prompts.size(), 4u);
  const std::vector<std::string> args = {"--max-tokens", std::to_string(kTokens), "--prompts",
                                         absl::StrJoin(prompts, ",")};
  for (int tp : {2, 4}) {
    auto got = Generate(model, tp, args);
    ASSERT_EQ(got.size(), want.size()) << "TP " << tp;
    for (size_t i = 0; i < want.size(); ++i) {
      std::vector<int32_t> ids;
      for (absl::string_view t : absl::StrSplit(got[static_cast<int>(i)], ' ', absl::SkipEmpty()))
        ids.push_back(std::stoi(std::string(t)));
      ASSERT_EQ(ids.size(), kTokens) << names[i] << " TP " << tp;
      for (size_t k = 0; k < kTokens; ++k) {
        if (ids[k] == want[i][k]) continue;
        EXPECT_LT(margins[i][k], 1e-3)
            << names[i] << " TP " << tp << ": greedy token " << k << " is " << ids[k]
            << ", transformers " << want[i][k] << " with a clear margin " << margins[i][k];
        break;
      }
    }
  }
}

// Qwen2's Q/K/V biases are column-parallel like their projections: each rank
// must add the slice of its own heads. The qwen2_bias model (4 query heads,
// 2 KV heads, biases of std 0.5; the smallest margin of these 16 steps is
// 4e-3). Checked to fail when every rank adds rank 0's query-bias slice (a
// TP = 1 run cannot see that).
TEST_F(LaunchTest, Qwen2BiasSplitAcrossRanksMatchesTransformers) {
  const std::string model = Env("PAGEDSERVE_QWEN2_BIAS_MODEL");
  ASSERT_FALSE(model.empty()) << "set PAGEDSERVE_QWEN2_BIAS_MODEL";
  ExpectTransformersGreedyAtTp(model, "qwen2_bias", "Qwen2ForCausalLM");
}

// Qwen3's q/k norms are per head and replicated: every rank norms its own
// query heads and its KV heads (at TP = 4 the 2 KV heads are replicated) with
// the same weights. The qwen3_qk_norm model (4 query heads of 128, 2 KV
// heads; the smallest margin of these 16 steps is 2.9e-3).
TEST_F(LaunchTest, Qwen3QkNormAcrossRanksMatchesTransformers) {
  const std::string model = Env("PAGEDSERVE_QWEN3_MODEL");
  ASSERT_FALSE(model.empty()) << "set PAGEDSERVE_QWEN3_MODEL";
  ExpectTransformersGreedyAtTp(model, "qwen3_qk_norm", "Qwen3ForCausalLM");
}

TEST_F(LaunchTest, WrongRankCountFailsOnEveryRank) {
  Result r = Run(Mpirun(3, model_, 1), 60);
  EXPECT_FALSE(r.timed_out) << r.out;
  EXPECT_NE(r.exit_code, 0) << r.out;
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_NE(r.out.find(absl::StrCat("rank ", rank,
                                      ": INVALID_ARGUMENT: mpirun started 3 ranks "
                                      "but --tensor-parallel-size 1 needs 2")),
              std::string::npos)
        << "rank " << rank << ":\n"
        << r.out;
}

TEST_F(LaunchTest, TpNotDividingQueryHeadsFailsClearly) {
  // The random model has 8 query heads: TP = 3 cannot shard it.
  Result r = Run(Mpirun(4, model_, 3), 120);
  EXPECT_FALSE(r.timed_out) << r.out;
  EXPECT_NE(r.exit_code, 0) << r.out;
  // The coordinator reports the workers' setup error.
  EXPECT_NE(r.out.find("driver: cannot start the workers: FAILED_PRECONDITION: worker rank 1:"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("tensor parallel size 3 does not divide num_heads 8"), std::string::npos)
      << r.out;
}

// The start-up handshake: a worker whose block size is not the coordinator's
// would derive other slots from the same block tables (silently wrong K/V), so
// the coordinator refuses to start, naming the rank and both sizes.
TEST_F(LaunchTest, WorkerWithAnotherBlockSizeFailsTheHandshake) {
  Result r = Run(Mpirun(3, model_, 2, {"--worker-block-size", "8"}), 120);
  EXPECT_FALSE(r.timed_out) << r.out;
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("driver: cannot start the workers: FAILED_PRECONDITION: worker rank 1 runs "
                       "with --block-size 8 but the coordinator with 16"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("seq 0:"), std::string::npos) << "generated despite the mismatch";
}

TEST_F(LaunchTest, KillingAWorkerFailsTheCoordinatorInTime) {
  // Slow steps so that the kill lands mid-generation; step timeout 3 s.
  Child c(Mpirun(3, model_, 2,
                 {"--max-tokens", "200", "--step-delay-ms", "100", "--step-timeout-ms",
                  std::to_string(static_cast<int>(3000 * TimeScale()))}));
  auto m = c.WaitFor(std::regex(R"(step 5\b)"), 180);
  ASSERT_TRUE(m.has_value()) << c.out();
  std::vector<int> pids;
  std::smatch w;
  ASSERT_TRUE(std::regex_search(c.out(), w, std::regex(R"(coordinator pid (\d+))"))) << c.out();
  pids.push_back(std::stoi(w[1]));
  std::map<int, int> worker_pid;  // world rank -> pid
  std::regex wl(R"(worker rank (\d+) \(TP rank \d+ of \d+, pid (\d+)\))");
  for (auto it = std::sregex_iterator(c.out().begin(), c.out().end(), wl);
       it != std::sregex_iterator(); ++it)
    worker_pid[std::stoi((*it)[1])] = std::stoi((*it)[2]);
  ASSERT_EQ(worker_pid.size(), 2u) << c.out();
  for (auto [rank, pid] : worker_pid) pids.push_back(pid);

  // Kill TP rank 1 (world rank 2): TP rank 0 then waits in an all-reduce forever.
  const auto killed_at = Clock::now();
  ASSERT_EQ(kill(worker_pid[2], SIGKILL), 0);
  Result r = c.Wait(60);
  const double exit_s = std::chrono::duration<double>(Clock::now() - killed_at).count();
  EXPECT_FALSE(r.timed_out) << r.out;
  EXPECT_NE(r.exit_code, 0) << r.out;
  // The coordinator itself reported the failure (not only mpirun): on one host
  // it watches the worker pids, so it names the dead rank.
  EXPECT_NE(r.out.find("driver: step"), std::string::npos) << r.out;
  EXPECT_NE(
      r.out.find("UNAVAILABLE: worker rank 2 (pid " + std::to_string(worker_pid[2]) + ") exited"),
      std::string::npos)
      << r.out;
  // Detection (~20 ms) + abort, and mpirun's own teardown (2 x its
  // odls_base_sigkill_timeout of 1 s): well within the 10 s budget.
  EXPECT_LT(exit_s, 10.0 * TimeScale()) << r.out;
  // mpirun has exited; its ranks must be gone too (allow a moment for the
  // kernel to finish tearing them down).
  EXPECT_EQ(StillAlive(pids, 2.0 * TimeScale()), std::vector<int>{}) << "left behind\n" << r.out;
  std::printf("worker killed -> mpirun exited after %.2f s (exit code %d)\n", exit_s, r.exit_code);
}

}  // namespace
