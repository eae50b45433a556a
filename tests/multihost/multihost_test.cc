// Ranks on separate network hosts: every host is a network namespace with its
// own address, host name and veth link to a bridge (tests/multihost/
// netns_hosts.sh, which runs this binary with the hosts made and deletes them
// afterwards). mpirun runs on host 0 and starts its daemons on the other hosts
// through an rsh agent that enters their namespace; OpenMPI is restricted to
// its TCP transport on the hosts' subnet (`--mca btl tcp,self`), so every byte
// between ranks on different hosts crosses a veth link. Checks:
//  - greedy tokens at TP = 2 with the workers on two other hosts equal TP = 1 on
//    one host (random Llama, 8/2 heads), and TP = 3 across hosts equals TP = 1
//    on SmolLM2 (9/3 heads);
//  - a swap-out / swap-in under TP = 2 across hosts changes no token;
//  - bytes on the links per decode step (sum of what every host sent) are at
//    least what the all-reduces must move: traffic really crosses the network;
//  - a worker killed on its host, or a host whose link goes down mid-step:
//    the client gets an error and every rank exits within 10 s, no hang
//    (mpirun itself may linger: see ServeBreakAndCheck).
// Time bounds scale with PAGEDSERVE_TEST_TIME_SCALE (default 1) for slow
// machines (sanitizers, valgrind).
//
// Environment (tests/multihost/CMakeLists.txt and netns_hosts.sh run):
// PAGEDSERVE_NETNS_SCRIPT, PAGEDSERVE_NETNS_PREFIX, PAGEDSERVE_NETNS_HOSTS,
// PAGEDSERVE_TP_DRIVER, PAGEDSERVE_BIN, PAGEDSERVE_MPIEXEC,
// PAGEDSERVE_TEST_MODEL (random model dir), PAGEDSERVE_SMOLLM2 (optional).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "tests/distributed/subprocess.h"

namespace {

using namespace pagedserve::subprocess;  // NOLINT

double TimeScale() {
  double s = 1.0;
  const std::string v = Env("PAGEDSERVE_TEST_TIME_SCALE");
  return !v.empty() && absl::SimpleAtod(v, &s) && s >= 1.0 ? s : 1.0;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

int ConfigInt(const std::string& config_json, const std::string& key) {
  std::smatch m;
  std::regex re("\"" + key + "\"\\s*:\\s*(\\d+)");
  return std::regex_search(config_json, m, re) ? std::stoi(m[1]) : -1;
}

// Coordinator on host 0, TP rank 0 on host 1, TP rank 1 on host 2.
const std::vector<std::pair<int, int>> kTp2AcrossHosts = {{0, 1}, {1, 1}, {2, 1}};

class MultiHostTest : public ::testing::Test {
 protected:
  void SetUp() override {
    script_ = Env("PAGEDSERVE_NETNS_SCRIPT");
    prefix_ = Env("PAGEDSERVE_NETNS_PREFIX");
    driver_ = Env("PAGEDSERVE_TP_DRIVER");
    bin_ = Env("PAGEDSERVE_BIN");
    mpiexec_ = Env("PAGEDSERVE_MPIEXEC");
    model_ = Env("PAGEDSERVE_TEST_MODEL");
    ASSERT_FALSE(script_.empty() || prefix_.empty() || driver_.empty() || mpiexec_.empty() ||
                 model_.empty())
        << "run through tests/multihost/netns_hosts.sh run (see CMakeLists.txt)";
    ASSERT_TRUE(absl::SimpleAtoi(Env("PAGEDSERVE_NETNS_HOSTS"), &hosts_) && hosts_ >= 3);
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    for (int i = 0; i < hosts_; ++i) {
      Result r = RunChild({script_, "addr", prefix_, std::to_string(i)}, 10);
      ASSERT_EQ(r.exit_code, 0) << r.out;
      addr_.push_back(std::string(absl::StripTrailingAsciiWhitespace(r.out)));
    }
    subnet_ = addr_[0].substr(0, addr_[0].rfind('.')) + ".0/24";
  }

  // Restores links a test took down, so that the next test starts whole.
  void TearDown() override {
    std::remove((::testing::TempDir() + prefix_ + "-hostfile").c_str());
    KillHostProcesses();
    RunChild({script_, "unimpair", prefix_}, 30);
    for (int i = 0; i < hosts_; ++i)
      RunChild({"ip", "-n", Host(i), "link", "set", "eth0", "up"}, 10);
  }

  std::string Host(int i) const { return absl::StrCat(prefix_, "-h", i); }

  // mpirun on host 0 over `slots` (host index -> ranks there, in rank order
  // of the map), TCP only, on the hosts' subnet.
  std::vector<std::string> Mpirun(const std::vector<std::pair<int, int>>& slots,
                                  const std::vector<std::string>& cmd) {
    const std::string hostfile = ::testing::TempDir() + prefix_ + "-hostfile";
    std::ofstream f(hostfile);
    int np = 0;
    for (auto [host, n] : slots) {
      f << addr_[host] << " slots=" << n << "\n";
      np += n;
    }
    f.close();
    std::vector<std::string> argv = {
        script_, "on", prefix_, "0", mpiexec_, "-np", std::to_string(np), "--hostfile", hostfile,
        "--map-by", "slot", "--bind-to", "none", "--mca", "plm_rsh_agent", script_ + " agent",
        "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", subnet_, "--mca",
        "oob_tcp_if_include", subnet_, "--mca", "odls_base_sigkill_timeout", "3",
        // As deploy/docker/entrypoint.sh: when a rank dies mpirun SIGTERMs the
        // others and SIGKILLs them only this many seconds later, so that the
        // coordinator can fail its requests first (it sees the death at once).
        // mpirun's daemons notice a lost peer host within ~5 s (TCP keepalive).
        "--mca", "oob_tcp_keepalive_time", "2", "--mca", "oob_tcp_keepalive_intvl", "1", "--mca",
        "oob_tcp_keepalive_probes", "3", "-x", "OMP_NUM_THREADS", "-x", "OPENBLAS_NUM_THREADS",
        "-x", "OMP_WAIT_POLICY"};
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    return argv;
  }

  std::vector<std::string> Driver(const std::string& model, int tp,
                                  const std::vector<std::string>& extra) {
    std::vector<std::string> cmd = {driver_, "--model", model, "--tp", std::to_string(tp)};
    cmd.insert(cmd.end(), extra.begin(), extra.end());
    return cmd;
  }

  static std::map<int, std::string> Tokens(const Result& r) {
    std::map<int, std::string> seqs;
    std::regex line(R"(seq (\d+): ([\d ]+))");
    for (auto it = std::sregex_iterator(r.out.begin(), r.out.end(), line);
         it != std::sregex_iterator(); ++it)
      seqs[std::stoi((*it)[1])] = (*it)[2];
    return seqs;
  }

  Result RunDriver(const std::vector<std::pair<int, int>>& slots, const std::string& model, int tp,
                   const std::vector<std::string>& extra) {
    Result r = RunChild(Mpirun(slots, Driver(model, tp, extra)), 300 * TimeScale());
    EXPECT_EQ(r.exit_code, 0) << "TP " << tp << ":\n" << r.out;
    return r;
  }

  // Bytes host `i` has sent on its link so far (its namespace's sysfs).
  int64_t TxBytes(int i) {
    Result r = RunChild(
        {"ip", "netns", "exec", Host(i), "cat", "/sys/class/net/eth0/statistics/tx_bytes"}, 10);
    int64_t v = -1;
    EXPECT_TRUE(absl::SimpleAtoi(absl::StripTrailingAsciiWhitespace(r.out), &v)) << r.out;
    return v;
  }
  int64_t TotalTxBytes() {
    int64_t sum = 0;
    for (int i = 0; i < hosts_; ++i) sum += TxBytes(i);
    return sum;
  }

  // The network namespace process `pid` runs in (`ip netns identify`), "" if none.
  std::string NetnsOf(int pid) {
    Result r = RunChild({"ip", "netns", "identify", std::to_string(pid)}, 10);
    return std::string(absl::StripTrailingAsciiWhitespace(r.out));
  }

  // Every rank ran where the map put it: "worker rank R (pid P on HOST)".
  void ExpectWorkerHosts(const std::string& out, const std::map<int, int>& rank_host) {
    for (auto [rank, host] : rank_host)
      EXPECT_TRUE(std::regex_search(
          out,
          std::regex(absl::StrCat("worker rank ", rank, R"( \(pid \d+ on )", Host(host), R"(\))"))))
          << "rank " << rank << " not on " << Host(host) << ":\n"
          << out;
  }

  // `pagedserve serve` at TP = 2 across hosts (coordinator on host 0, TP
  // ranks on hosts 1 and 2), ZeroMQ at kEndpoint inside host 0, once healthy.
  static constexpr const char* kEndpoint = "tcp://127.0.0.1:5555";
  struct ServeJob {
    std::unique_ptr<Child> mpirun;
    std::vector<int> pids;  // world rank 2 (host 2), world rank 1 (host 1), coordinator
  };
  void StartServe(ServeJob* job) {
    ASSERT_FALSE(bin_.empty()) << "PAGEDSERVE_BIN not set (no pagedserve target)";
    const std::string pid_file = ::testing::TempDir() + prefix_ + "-coordinator.pid";
    job->mpirun = std::make_unique<Child>(
        Mpirun(kTp2AcrossHosts, {bin_, "serve", "--model", model_, "--tensor-parallel-size", "2",
                                 "--zmq-endpoint", kEndpoint, "--pid-file", pid_file,
                                 "--kv-cache-memory", "67108864", "--swap-space", "0.01"}));
    Child& server = *job->mpirun;
    auto ready = server.WaitFor(std::regex(R"(worker rank 2 \(pid (\d+) on )" + Host(2) + R"(\))"),
                                180 * TimeScale());
    ASSERT_TRUE(ready.has_value()) << server.out();
    job->pids = {std::stoi((*ready)[1])};
    std::smatch w;
    std::string out = server.out();
    ASSERT_TRUE(std::regex_search(out, w, std::regex(R"(worker rank 1 \(pid (\d+) on )"))) << out;
    job->pids.push_back(std::stoi(w[1]));
    // The coordinator has written its pid file by the time it serves.
    Result health = RunChild(Client({"--health", "--client-timeout", "30"}), 60 * TimeScale());
    ASSERT_EQ(health.exit_code, 0) << health.out << "\n" << server.out();
    int coordinator = 0;
    ASSERT_TRUE(
        absl::SimpleAtoi(absl::StripTrailingAsciiWhitespace(ReadFile(pid_file)), &coordinator))
        << pid_file;
    job->pids.push_back(coordinator);
    // Not only the host names the ranks report: each process lives in its
    // host's network namespace (its only route to the others is that host's link).
    EXPECT_EQ(NetnsOf(job->pids[0]), Host(2)) << "TP rank 1 (world rank 2)";
    EXPECT_EQ(NetnsOf(job->pids[1]), Host(1)) << "TP rank 0 (world rank 1)";
    EXPECT_EQ(NetnsOf(coordinator), Host(0)) << "coordinator";
  }

  // `pagedserve client` on host 0, against StartServe's server.
  std::vector<std::string> Client(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {script_, "on",     prefix_,          "0",
                                     bin_,    "client", "--zmq-endpoint", kEndpoint};
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  // From now on the hosts' frames go through tests/multihost/impair_switch.py
  // (netns_hosts.sh impair) run with `args`, not the bridge; returns the path
  // of the switch's counters file. TearDown puts the bridge back.
  std::string Impair(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {script_, "impair", prefix_};
    argv.insert(argv.end(), args.begin(), args.end());
    Result r = RunChild(argv, 30);
    EXPECT_EQ(r.exit_code, 0) << r.out;
    if (r.exit_code != 0) return "";
    // The path is the last line (stdout and stderr come interleaved).
    const std::string out(absl::StripTrailingAsciiWhitespace(r.out));
    return out.substr(out.rfind('\n') + 1);
  }

  // Every process left in the hosts' namespaces (ranks, orted daemons of a
  // job a test broke or stopped early), killed and waited for.
  void KillHostProcesses() {
    for (int i = 0; i < hosts_; ++i) {
      RunChild({"sh", "-c",
                "for t in 1 2 3 4 5 6 7 8 9 10; do p=$(ip netns pids " + Host(i) +
                    "); [ -z \"$p\" ] && exit 0; kill -9 $p; sleep 0.2; done"},
               10);
    }
  }

  // The switch's counters in frames (impair_switch.py's docstring names
  // them), as it last wrote them (every second).
  static std::map<std::string, int64_t> SwitchCounters(const std::string& stats_file) {
    std::map<std::string, int64_t> c;
    const std::string text = ReadFile(stats_file);
    std::regex kv(R"re("(\w+)": (\d+))re");
    for (auto it = std::sregex_iterator(text.begin(), text.end(), kv); it != std::sregex_iterator();
         ++it)
      c[(*it)[1]] = std::stoll((*it)[2]);
    return c;
  }

  int hosts_ = 0;
  std::string script_, prefix_, driver_, bin_, mpiexec_, model_, subnet_;
  std::vector<std::string> addr_;
};

TEST_F(MultiHostTest, GreedyTokensTp2AcrossHostsEqualTp1OnOneHost) {
  auto tp1 = Tokens(RunDriver({{0, 2}}, model_, 1, {"--max-tokens", "10"}));
  Result r = RunDriver(kTp2AcrossHosts, model_, 2, {"--max-tokens", "10"});
  ExpectWorkerHosts(r.out, {{1, 1}, {2, 2}});
  auto tp2 = Tokens(r);
  ASSERT_EQ(tp1.size(), 3u);
  EXPECT_EQ(tp1, tp2);
  EXPECT_NE(tp1[0], tp1[1]) << "degenerate output";
}

// Sequence 0's blocks go to the CPU swap pool at decode step 2 and come back
// into other device blocks a step later (the workers on hosts 1 and 2 copy
// them); every token must stay what the run without a swap produced.
TEST_F(MultiHostTest, SwapOutAndInUnderTp2AcrossHostsKeepsTokens) {
  auto plain = Tokens(RunDriver(kTp2AcrossHosts, model_, 2, {"--max-tokens", "10"}));
  Result r = RunDriver(kTp2AcrossHosts, model_, 2, {"--max-tokens", "10", "--swap-at", "2"});
  // The swap happened (a --swap-at that did nothing would pass the comparison).
  std::smatch out, in;
  ASSERT_TRUE(
      std::regex_search(r.out, out, std::regex(R"(swap out: (\d+) blocks at decode step 2)")))
      << r.out;
  ASSERT_TRUE(std::regex_search(r.out, in, std::regex(R"(swap in: (\d+) blocks at decode step 3)")))
      << r.out;
  EXPECT_GT(std::stoi(out[1]), 0);
  EXPECT_EQ(out[1], in[1]);
  ExpectWorkerHosts(r.out, {{1, 1}, {2, 2}});
  auto swapped = Tokens(r);
  ASSERT_EQ(plain.size(), 3u);
  EXPECT_EQ(plain, swapped);
}

TEST_F(MultiHostTest, SmolLM2Tp3AcrossHostsEqualsTp1) {
  const std::string smol = Env("PAGEDSERVE_SMOLLM2");
  if (smol.empty() || access(smol.c_str(), R_OK) != 0)
    GTEST_SKIP() << "SmolLM2 GGUF not found (scripts/fetch-model; PAGEDSERVE_SMOLLM2=" << smol
                 << ")";
  const std::vector<std::string> args = {"--max-tokens", "6",      "--kv-cache-memory", "33554432",
                                         "--swap-space", "8388608"};
  auto tp1 = Tokens(RunDriver({{0, 2}}, smol, 1, args));
  // Host 0: coordinator + TP rank 0 (as a LeaderWorkerSet leader); hosts 1, 2: TP ranks 1, 2.
  Result r = RunDriver({{0, 2}, {1, 1}, {2, 1}}, smol, 3, args);
  ExpectWorkerHosts(r.out, {{1, 0}, {2, 1}, {3, 2}});
  auto tp3 = Tokens(r);
  ASSERT_EQ(tp1.size(), 3u);
  EXPECT_EQ(tp1, tp3);
}

// Two runs that differ only in the number of decode steps: the difference in
// bytes sent on all links, over the difference in steps, is what one decode
// step costs on the network (start-up, prefill and shutdown cancel out).
TEST_F(MultiHostTest, BytesPerDecodeStepCoverTheAllReduces) {
  const std::string config = ReadFile(model_ + "/config.json");
  const int hidden = ConfigInt(config, "hidden_size");
  const int layers = ConfigInt(config, "num_hidden_layers");
  ASSERT_GT(hidden, 0);
  ASSERT_GT(layers, 0);
  auto run = [&](int tokens, std::string* out) {
    const int64_t before = TotalTxBytes();
    Result r = RunDriver(kTp2AcrossHosts, model_, 2, {"--max-tokens", std::to_string(tokens)});
    *out = r.out;
    return TotalTxBytes() - before;
  };
  std::string short_out, long_out;
  const int64_t short_bytes = run(4, &short_out);
  const int64_t long_bytes = run(20, &long_out);
  ExpectWorkerHosts(long_out, {{1, 1}, {2, 2}});
  const int extra_steps = 16;
  const double per_step = static_cast<double>(long_bytes - short_bytes) / extra_steps;
  // 3 sequences decode together: 2 all-reduces per layer of 3 x hidden fp32
  // values; with 2 ranks each must send at least its whole vector (half in the
  // reduce-scatter, half in the all-gather), or the other rank cannot have the sum.
  const double allreduce_floor = 2.0 * layers * 2 * 3 * hidden * sizeof(float);
  const std::regex plan_re(R"(plan bytes prefill=(\d+) decode_mean=([\d.]+))");
  std::smatch plan, short_plan;
  ASSERT_TRUE(std::regex_search(long_out, plan, plan_re)) << long_out;
  ASSERT_TRUE(std::regex_search(short_out, short_plan, plan_re)) << short_out;
  std::printf(
      "bytes between hosts per decode step (TP = 2, 3 sequences): %.0f; all-reduce "
      "floor %.0f; decode step plan %s bytes (%s in the 4-token run)\n",
      per_step, allreduce_floor, plan[2].str().c_str(), short_plan[2].str().c_str());
  // Incremental plans: a decode step's plan carries each running sequence's
  // fed token and no block table, so it is as large after 20 tokens as after
  // 4 (a plan with full block-table rows grows with the context: the rows here
  // are allocated for prompt + max tokens).
  EXPECT_EQ(plan[2].str(), short_plan[2].str()) << "the decode plan grows with the context";
  EXPECT_GE(per_step, allreduce_floor) << "traffic does not cross the links";
  // Start-up, prefill and the plans should not be larger than the all-reduces
  // by orders of magnitude (a runaway protocol would show here).
  EXPECT_LT(per_step, 8 * allreduce_floor);
}

// Network faults (issue 36), made by tests/multihost/impair_switch.py since the
// kernel here has no sch_netem: 50 ms +- 10 ms each way, then 5% of frames
// lost. Both only slow the all-reduces (TCP retransmits what is lost): every
// token must stay what the unimpaired run gave.
TEST_F(MultiHostTest, DelayWithJitterBetweenHostsChangesNoToken) {
  Result plain = RunDriver(kTp2AcrossHosts, model_, 2, {"--max-tokens", "10"});
  const std::string stats = Impair({"--delay-ms", "50", "--jitter-ms", "10"});
  ASSERT_FALSE(stats.empty());
  Result r = RunDriver(kTp2AcrossHosts, model_, 2, {"--max-tokens", "10"});
  ExpectWorkerHosts(r.out, {{1, 1}, {2, 2}});
  ASSERT_EQ(Tokens(plain).size(), 3u);
  EXPECT_EQ(Tokens(plain), Tokens(r));
  // The delay reached the ranks' traffic: each decode step's all-reduces (two
  // per layer, each waiting for the other host) cross the switch one after
  // the other, 40 ms at least each.
  const int layers = ConfigInt(ReadFile(model_ + "/config.json"), "num_hidden_layers");
  const double floor_s = 10 * 2 * layers * 0.040;
  std::printf(
      "TP 2 across hosts, 10 tokens: %.2f s unimpaired, %.2f s at 50 +- 10 ms (floor %.2f s)\n",
      plain.seconds, r.seconds, floor_s);
  EXPECT_GE(r.seconds - plain.seconds, floor_s) << "the delay did not apply";
}

TEST_F(MultiHostTest, FivePercentFrameLossBetweenHostsChangesNoToken) {
  Result plain = RunDriver(kTp2AcrossHosts, model_, 2, {"--max-tokens", "10"});
  const std::string stats = Impair({"--loss", "0.05", "--seed", "7"});
  ASSERT_FALSE(stats.empty());
  Result r = RunDriver(kTp2AcrossHosts, model_, 2, {"--max-tokens", "10"});
  ExpectWorkerHosts(r.out, {{1, 1}, {2, 2}});
  ASSERT_EQ(Tokens(plain).size(), 3u);
  EXPECT_EQ(Tokens(plain), Tokens(r));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the counters' next write
  auto c = SwitchCounters(stats);
  const double lost =
      static_cast<double>(c["dropped"]) / std::max<int64_t>(1, c["dropped"] + c["sent"]);
  std::printf("5%% loss: %lld frames sent, %lld dropped (%.1f%%), run %.2f s (%.2f s unimpaired)\n",
              static_cast<long long>(c["sent"]), static_cast<long long>(c["dropped"]), 100 * lost,
              r.seconds, plain.seconds);
  EXPECT_GT(c["sent"], 1000) << "the ranks' traffic did not cross the switch";
  EXPECT_EQ(c["oversize"], 0) << "offloads on: frames the switch cannot forward";
  EXPECT_EQ(c["send_errors"], 0);
  EXPECT_GT(lost, 0.02);
  EXPECT_LT(lost, 0.10);
}

// The server under 50 +- 10 ms and 5% loss at once: concurrent requests
// complete with the text the unimpaired server gave, the KV pool is empty
// afterwards, and the job still shuts down cleanly on SIGTERM.
TEST_F(MultiHostTest, ServeUnderDelayAndLossCompletesRequestsAndFreesKv) {
  ServeJob job;
  ASSERT_NO_FATAL_FAILURE(StartServe(&job));
  // The client waits longer than the coordinator's step timeout (120 s), so a
  // step that stalls ends in the coordinator's error naming the rank and the
  // stage, not in the client's silence (a CI run on 2026-12-07 saw every
  // stream stop at ~20 tokens and the client give up first; not reproduced
  // in 3 runs since).
  const std::vector<std::string> request = {
      "--temperature",    "0",   "--ignore-eos",    "--max-tokens", "24",
      "--client-timeout", "200", "Once upon a time"};
  Result reference = RunChild(Client(request), 120 * TimeScale());
  ASSERT_EQ(reference.exit_code, 0) << reference.out << "\n" << job.mpirun->out();
  const std::string stats = Impair({"--delay-ms", "50", "--jitter-ms", "10", "--loss", "0.05"});
  ASSERT_FALSE(stats.empty());
  std::vector<std::unique_ptr<Child>> clients;
  clients.reserve(3);
  for (int i = 0; i < 3; ++i) clients.push_back(std::make_unique<Child>(Client(request)));
  // The generated text: what the client prints before its summary line (whose
  // cached-token count differs once the prefix cache holds the prompt).
  auto text = [](const std::string& out) { return out.substr(0, out.find("pagedserve client:")); };
  ASSERT_NE(reference.out.find("completion_tokens=24"), std::string::npos) << reference.out;
  for (auto& c : clients) {
    Result r = c->Wait(300 * TimeScale());
    EXPECT_EQ(r.exit_code, 0) << r.out << "\n" << job.mpirun->out();
    EXPECT_EQ(text(r.out), text(reference.out));
    EXPECT_NE(r.out.find("completion_tokens=24"), std::string::npos) << r.out;
  }
  Result kv = RunChild(Client({"--stats", "--client-timeout", "30"}), 60 * TimeScale());
  ASSERT_EQ(kv.exit_code, 0) << kv.out;
  EXPECT_TRUE(std::regex_search(kv.out, std::regex(R"("kv_blocks_used"\s*:\s*0\b)"))) << kv.out;
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  auto c = SwitchCounters(stats);
  EXPECT_GT(c["dropped"], 0) << "no frame was lost";
  ASSERT_EQ(kill(job.pids[2], SIGTERM), 0);
  Result m = job.mpirun->Wait(120 * TimeScale());
  EXPECT_FALSE(m.timed_out) << m.out;
  // Our ranks stop cleanly; mpirun itself may exit 205 when its own daemons'
  // out-of-band link (orted to orted, not our traffic) misses a heartbeat
  // under the 5% loss while the job winds down ("ORTE has lost communication
  // with a remote daemon": once in a CI run on 2026-12-06, after every request
  // had completed; docs/distributed.md saw 205 after link faults too).
  const bool orte_lost =
      m.exit_code == 205 && absl::StrContains(m.out, "ORTE has lost communication");
  EXPECT_TRUE(m.exit_code == 0 || orte_lost) << m.out;
  EXPECT_TRUE(absl::StrContains(m.out, "pagedserve serve: stopped")) << m.out;
  EXPECT_TRUE(StillAlive(job.pids, 10).empty());
}

// `pagedserve serve` at TP = 2 across hosts with one streaming client on host
// 0; `fail` breaks host 2 mid-generation. The client must get an error and
// every rank must be gone within 10 s (scaled).
class MultiHostFailureTest : public MultiHostTest {
 protected:
  // mpirun itself is not required to exit within the budget: with OpenMPI 4.1
  // it often stays ("abort is already in progress") when a rank's death and
  // the coordinator's abort race, and after a partition it waits for the
  // daemon on the cut-off host. The test stops it; on Kubernetes the leader's
  // liveness probe (the coordinator's /metrics) restarts the group.
  void ServeBreakAndCheck(const std::string& what, const std::function<void(int victim)>& fail) {
    ServeJob job;
    ASSERT_NO_FATAL_FAILURE(StartServe(&job));
    Child& server = *job.mpirun;
    const int victim = job.pids[0];
    const std::vector<int> pids = job.pids;

    Child client(Client({"--temperature", "0", "--ignore-eos", "--max-tokens", "1500",
                         "--client-timeout", "120", "Once upon a time"}));
    // Generation under way: some text streamed.
    ASSERT_TRUE(client.WaitFor(std::regex(R"(\S{8})"), 60 * TimeScale()).has_value())
        << client.out() << "\n"
        << server.out();
    const auto broken_at = Clock::now();
    fail(victim);
    const double budget = 10 * TimeScale();
    Result c = client.Wait(budget + 5);
    const double client_s = std::chrono::duration<double>(Clock::now() - broken_at).count();
    // Every rank gone by the deadline: checked while mpirun still runs, since
    // stopping it (below) would kill what is left.
    // By when each rank was gone (rank 2, rank 1, coordinator), for the log.
    std::vector<double> gone_s(pids.size(), -1);
    auto since_break = [&] {
      return std::chrono::duration<double>(Clock::now() - broken_at).count();
    };
    while (since_break() < budget) {
      bool any = false;
      for (size_t i = 0; i < pids.size(); ++i) {
        if (gone_s[i] >= 0) continue;
        if (Alive(pids[i]))
          any = true;
        else
          gone_s[i] = since_break();
      }
      if (!any) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::vector<int> alive;
    for (size_t i = 0; i < pids.size(); ++i) {
      if (gone_s[i] >= 0) continue;
      if (Alive(pids[i]))
        alive.push_back(pids[i]);
      else
        gone_s[i] = since_break();  // bound
    }
    // mpirun is given kMpirunGrace more to exit by itself (measured, not
    // asserted: see the class comment), then the test stops it.
    constexpr double kMpirunGrace = 20;
    Result m = server.Wait(std::max(0.0, budget + kMpirunGrace - since_break()));
    const double mpirun_s = std::chrono::duration<double>(Clock::now() - broken_at).count();
    // Processes still in the hosts' namespaces once mpirun is gone (orted
    // daemons that outlive it), for the log.
    std::string left;
    for (int i = 0; i < hosts_; ++i) {
      Result p = RunChild({"ip", "netns", "pids", Host(i)}, 10);
      const int n = static_cast<int>(std::count(p.out.begin(), p.out.end(), '\n'));
      absl::StrAppend(&left, i == 0 ? "" : ", ", Host(i), ": ", n);
    }
    EXPECT_TRUE(alive.empty()) << what << ": " << alive.size() << " rank(s) still alive after "
                               << budget << " s (pid " << (alive.empty() ? 0 : alive[0]) << ")\n"
                               << m.out;
    EXPECT_FALSE(c.timed_out) << what << ": the client hung\n" << c.out << "\nserver:\n" << m.out;
    EXPECT_LT(client_s, budget) << what << ": the client's error came late\n" << m.out;
    EXPECT_EQ(c.exit_code, 1) << what << ":\n" << c.out;
    EXPECT_NE(c.out.find("error"), std::string::npos) << what << ": client output:\n" << c.out;
    // The error names the lost rank (the client's copy: the coordinator's own
    // log line may be cut off by mpirun's teardown of its output forwarding).
    EXPECT_NE((c.out + m.out).find("worker rank 2 lost"), std::string::npos)
        << what << ": the error does not name the lost rank\nclient:\n"
        << c.out << "\nserver:\n"
        << m.out;
    std::printf(
        "%s: client done after %.2f s; ranks gone by %.2f (rank 2), %.2f (rank 1), "
        "%.2f (coordinator) s (-1: alive at %.0f s); mpirun %s after %.2f s (code %d); "
        "processes left in the hosts after mpirun: %s; client:\n%s\n",
        what.c_str(), client_s, gone_s[0], gone_s[1], gone_s[2], budget,
        m.timed_out ? "killed by the test" : "exited", mpirun_s, m.exit_code, left.c_str(),
        c.out.c_str());
  }

  // What an orchestrator does after the group failed: every process left on
  // the hosts killed (its pods replaced) and the group started again, which
  // must serve a request and shut down cleanly.
  void RestartAndServe() {
    KillHostProcesses();
    ServeJob job;
    ASSERT_NO_FATAL_FAILURE(StartServe(&job));
    Result r = RunChild(Client({"--temperature", "0", "--max-tokens", "8", "--ignore-eos",
                                "--client-timeout", "60", "Once upon a time"}),
                        120 * TimeScale());
    EXPECT_EQ(r.exit_code, 0) << r.out << "\n" << job.mpirun->out();
    EXPECT_NE(r.out.find("completion_tokens=8"), std::string::npos) << r.out;
    ASSERT_EQ(kill(job.pids[2], SIGTERM), 0);
    Result m = job.mpirun->Wait(60 * TimeScale());
    EXPECT_EQ(m.exit_code, 0) << m.out;
  }
};

TEST_F(MultiHostFailureTest, WorkerKilledOnItsHostFailsClientsAndEveryRankExits) {
  ServeBreakAndCheck("worker killed", [&](int victim) {
    Result r = RunChild({script_, "on", prefix_, "2", "kill", "-KILL", std::to_string(victim)}, 10);
    ASSERT_EQ(r.exit_code, 0) << r.out;
  });
}

// A worker's link down for 10 s mid-generation (issue 36): the client has its
// error and every rank is gone within the budget (no heartbeat for 4 s); once
// the link is back the group starts again and serves.
TEST_F(MultiHostFailureTest, LinkDownFor10sMidStepFailsClientsThenTheGroupRestarts) {
  std::thread restore;
  ServeBreakAndCheck("link down", [&](int) {
    Result r = RunChild({"ip", "-n", Host(2), "link", "set", "eth0", "down"}, 10);
    ASSERT_EQ(r.exit_code, 0) << r.out;
    // Back after 10 s, or after the scaled failure budget when it is longer,
    // so that the link never returns before the deadline.
    restore = std::thread([this] {
      std::this_thread::sleep_for(std::chrono::duration<double>(10 * TimeScale()));
      RunChild({"ip", "-n", Host(2), "link", "set", "eth0", "up"}, 10);
    });
  });
  if (restore.joinable()) restore.join();
  RestartAndServe();
}

// Host 2 partitioned away: its link stays up (no carrier loss for its kernel
// to report), but no frame reaches it or leaves it. Only the heartbeat's
// silence can tell: the client has its error and every rank is gone within
// the budget; once the partition heals the group starts again and serves.
TEST_F(MultiHostFailureTest, PartitionedWorkerFailsClientsThenTheGroupRestarts) {
  std::string stats;
  ServeBreakAndCheck("partition", [&](int) { stats = Impair({"--cut", "p2"}); });
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // the counters' next write
  ASSERT_FALSE(stats.empty());
  EXPECT_GT(SwitchCounters(stats)["cut_from"], 0) << "host 2 sent nothing that was cut";
  Result r = RunChild({script_, "unimpair", prefix_}, 30);
  ASSERT_EQ(r.exit_code, 0) << r.out;
  RestartAndServe();
}

}  // namespace
