// `pagedserve generate` under mpirun (rank 0 the engine over MakeMpiExecutor,
// ranks 1..TP RunWorkerRank): greedy text identical without mpirun, at TP = 1
// and TP = 2; a wrong rank count fails clearly; killing a worker fails
// generate in time. (Swap preemption under TP = 2 is in launch_test: generate
// runs one request, and the engine admits a request only when all of its
// samples fit, so one request never preempts.)
// Environment: PAGEDSERVE_BIN, PAGEDSERVE_MPIEXEC, PAGEDSERVE_TEST_MODEL.
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <gtest/gtest.h>

#include "tests/distributed/subprocess.h"

namespace {

using namespace pagedserve::subprocess;  // NOLINT

class GenerateTpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = Env("PAGEDSERVE_BIN");
    mpiexec_ = Env("PAGEDSERVE_MPIEXEC");
    model_ = Env("PAGEDSERVE_TEST_MODEL");
    ASSERT_FALSE(bin_.empty() || mpiexec_.empty() || model_.empty());
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
  }

  // Runs generate (under mpirun when tp > 0) and returns {exit code, stdout, stderr}.
  struct Out {
    int code;
    std::string out, err;
  };
  Out Generate(int tp, const std::string& flags, double timeout_s = 240) {
    std::string err_file = ::testing::TempDir() + "generate_tp_err.txt";
    std::string cmd;
    if (tp > 0)
      cmd = mpiexec_ + " -np " + std::to_string(tp + 1) + " --oversubscribe --bind-to none ";
    cmd += bin_ + " generate --model " + model_ + " --tensor-parallel-size " +
           std::to_string(tp > 0 ? tp : 1) + " --prompt 'The quick brown fox jumps' " +
           "--temperature 0 --ignore-eos " + flags + " 2>" + err_file;
    Result r = RunChild({"/bin/bash", "-c", cmd}, timeout_s);
    std::ifstream f(err_file);
    std::stringstream ss;
    ss << f.rdbuf();
    EXPECT_FALSE(r.timed_out) << cmd;
    // mpirun gives ranks a pseudo-terminal, on which generate ends with a
    // newline: compare the text without it.
    std::string out = r.out;
    while (!out.empty() && (out.back() == '\n' || out.back() == '\r')) out.pop_back();
    return {r.exit_code, out, ss.str()};
  }

  std::string bin_, mpiexec_, model_;
};

TEST_F(GenerateTpTest, GreedyTextIdenticalInProcessTp1Tp2) {
  // The exact fp32 path: TP changes only fp32 summation order there.
  Out local = Generate(0, "--max-tokens 12 --dtype float32");
  ASSERT_EQ(local.code, 0) << local.err;
  ASSERT_FALSE(local.out.empty()) << local.err;
  Out tp1 = Generate(1, "--max-tokens 12 --dtype float32");
  ASSERT_EQ(tp1.code, 0) << tp1.err;
  Out tp2 = Generate(2, "--max-tokens 12 --dtype float32");
  ASSERT_EQ(tp2.code, 0) << tp2.err;
  EXPECT_EQ(local.out, tp1.out);
  EXPECT_EQ(local.out, tp2.out);
  EXPECT_NE(tp2.err.find("KV capacity (minimum over 2 worker ranks)"), std::string::npos)
      << tp2.err;
}

// --dtype / --kv-cache-dtype reach the worker ranks: the stored-format path
// gives the in-process text on one worker rank, and a 16-bit KV cache holds
// twice (an fp8 one four times) the blocks of an fp32 one in the same
// --kv-cache-memory.
TEST_F(GenerateTpTest, DtypeFlagsReachTheWorkerRanks) {
  Out local = Generate(0, "--max-tokens 8 --dtype auto");
  ASSERT_EQ(local.code, 0) << local.err;
  Out tp1 = Generate(1, "--max-tokens 8 --dtype auto");
  ASSERT_EQ(tp1.code, 0) << tp1.err;
  EXPECT_EQ(local.out, tp1.out);
  auto blocks = [](const std::string& err) -> long {
    const std::string key = "worker ranks): ";
    const size_t at = err.find(key);
    return at == std::string::npos ? -1 : std::stol(err.substr(at + key.size()));
  };
  Out f32 = Generate(2, "--max-tokens 2 --kv-cache-dtype float32");
  ASSERT_EQ(f32.code, 0) << f32.err;
  Out f16 = Generate(2, "--max-tokens 2 --kv-cache-dtype float16");
  ASSERT_EQ(f16.code, 0) << f16.err;
  ASSERT_GT(blocks(f32.err), 0) << f32.err;
  EXPECT_EQ(blocks(f16.err), 2 * blocks(f32.err)) << f16.err;
  // fp8 (= fp8_e4m3, as vLLM): 1-byte elements, four times the fp32 blocks.
  Out f8 = Generate(2, "--max-tokens 2 --kv-cache-dtype fp8");
  ASSERT_EQ(f8.code, 0) << f8.err;
  EXPECT_EQ(blocks(f8.err), 4 * blocks(f32.err)) << f8.err;
  Out bad = Generate(1, "--max-tokens 2 --kv-cache-dtype fp4", 60);
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("kv-cache-dtype"), std::string::npos) << bad.err;
}

// Speculative decoding with a draft model across ranks: every worker rank
// runs its shard of the draft (the target cut to 3 of its 4 layers: drafts
// accepted and rejected) and all feed rank 0's proposals; the greedy text is
// the in-process text without speculation.
TEST_F(GenerateTpTest, DraftModelAtTp2GivesThePlainGreedyText) {
  const std::string draft = ::testing::TempDir() + "generate_tp_draft";
  std::filesystem::create_directories(draft);
  for (const auto& f : std::filesystem::directory_iterator(model_)) {
    const std::filesystem::path link = draft / f.path().filename();
    if (f.path().filename() == "config.json" || std::filesystem::exists(link)) continue;
    std::filesystem::create_symlink(std::filesystem::absolute(f.path()), link);
  }
  std::ifstream in(model_ + "/config.json");
  std::stringstream config;
  config << in.rdbuf();
  const std::regex layers(R"("num_hidden_layers"\s*:\s*\d+)");
  std::ofstream(draft + "/config.json")
      << std::regex_replace(config.str(), layers, "\"num_hidden_layers\": 3");
  Out plain = Generate(0, "--max-tokens 24 --dtype float32");
  ASSERT_EQ(plain.code, 0) << plain.err;
  Out spec = Generate(2, "--max-tokens 24 --dtype float32 --speculative-config '{\"model\": \"" +
                             draft + "\", \"num_speculative_tokens\": 4}'");
  ASSERT_EQ(spec.code, 0) << spec.err;
  EXPECT_EQ(spec.out, plain.out);
  std::smatch m;
  const std::string& err = spec.err;
  ASSERT_TRUE(std::regex_search(err, m, std::regex(R"(draft_tokens=(\d+) accepted=(\d+))"))) << err;
  EXPECT_GT(std::stoi(m[2]), 0) << err;
  EXPECT_GT(std::stoi(m[1]), std::stoi(m[2])) << err;
}

TEST_F(GenerateTpTest, WrongRankCountIsAClearErrorNotAHang) {
  Out r = Generate(2, "--max-tokens 4 --tensor-parallel-size 3", 60);
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--tensor-parallel-size 3 needs 4"), std::string::npos) << r.err;
}

TEST_F(GenerateTpTest, KillingAWorkerFailsGenerateInTime) {
  Child c({mpiexec_, "-np", "3", "--oversubscribe", "--bind-to", "none", bin_, "generate",
           "--model", model_, "--tensor-parallel-size", "2", "--prompt", "Once upon a time",
           "--temperature", "0", "--ignore-eos", "--max-tokens", "2000"});
  auto m = c.WaitFor(std::regex(R"(worker rank 2 \(TP rank 1 of 2, pid (\d+)\))"), 180);
  ASSERT_TRUE(m.has_value()) << c.out();
  const int victim = std::stoi((*m)[1]);
  // Let generation run for a moment, then kill TP rank 1.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const auto killed_at = Clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  Result r = c.Wait(60);
  const double exit_s = std::chrono::duration<double>(Clock::now() - killed_at).count();
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("worker rank 2 (pid " + std::to_string(victim) + ") exited"),
            std::string::npos)
      << r.out;
  EXPECT_LT(exit_s, 10.0 * TimeScale()) << r.out;
}

}  // namespace
