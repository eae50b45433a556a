// Faults of a `pagedserve serve` job under mpirun on one host (coordinator +
// one worker rank), seen from a real client (`pagedserve client` over ZeroMQ):
//  - a worker that hangs but stays alive (SIGSTOP): the client's request ends
//    with an error naming the step timeout (the coordinator's
//    DEADLINE_EXCEEDED) within --worker-step-timeout, and every rank exits;
//  - a coordinator killed with SIGKILL: every worker rank exits (the workers
//    watch the coordinator's pid; mpirun tears the job down).
// Latency bounds are multiplied by PAGEDSERVE_TEST_TIME_SCALE (subprocess.h);
// CTest runs this binary alone (RUN_SERIAL).
// Environment: PAGEDSERVE_BIN, PAGEDSERVE_MPIEXEC, PAGEDSERVE_TEST_MODEL.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/distributed/subprocess.h"

namespace {

using namespace pagedserve::subprocess;  // NOLINT

// A loopback TCP port that was free a moment ago.
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  close(fd);
  return ntohs(a.sin_port);
}

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class FaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    bin_ = Env("PAGEDSERVE_BIN");
    mpiexec_ = Env("PAGEDSERVE_MPIEXEC");
    model_ = Env("PAGEDSERVE_TEST_MODEL");
    ASSERT_FALSE(bin_.empty() || mpiexec_.empty() || model_.empty())
        << "set PAGEDSERVE_BIN, PAGEDSERVE_MPIEXEC and PAGEDSERVE_TEST_MODEL";
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    const int port = FreePort();
    ASSERT_GT(port, 0);
    endpoint_ = "tcp://127.0.0.1:" + std::to_string(port);
    pid_file_ = ::testing::TempDir() + "fault_test_" + std::to_string(getpid()) + ".pid";
    std::remove(pid_file_.c_str());
  }
  void TearDown() override { std::remove(pid_file_.c_str()); }

  // mpirun -np 2 pagedserve serve with a step timeout of `step_timeout_s`.
  std::vector<std::string> Serve(double step_timeout_s) const {
    return {mpiexec_,
            "-np",
            "2",
            "--oversubscribe",
            "--bind-to",
            "none",
            bin_,
            "serve",
            "--model",
            model_,
            "--zmq-endpoint",
            endpoint_,
            "--metrics-port",
            "0",
            "--port",
            "0",
            "--max-model-len",
            "256",
            "--kv-cache-memory",
            "67108864",
            "--worker-step-timeout",
            std::to_string(step_timeout_s),
            "--pid-file",
            pid_file_};
  }
  // A client request long enough to be running when the fault lands.
  std::vector<std::string> Client() const {
    return {bin_,
            "client",
            "--zmq-endpoint",
            endpoint_,
            "--client-timeout",
            "600",
            "--max-tokens",
            "200",
            "--temperature",
            "0",
            "--ignore-eos",
            "Once upon a time"};
  }

  // Waits for the server to serve and returns {coordinator pid, worker pid}.
  std::pair<int, int> StartedPids(Child& server) {
    auto ready = server.WaitFor(std::regex("pagedserve serve: serving"), 240);
    EXPECT_TRUE(ready.has_value()) << server.out();
    // mpirun forwards each rank's output on its own: the worker's line may
    // come after the coordinator's.
    auto w = server.WaitFor(std::regex(R"(worker rank 1 \(TP rank 0 of 1, pid (\d+)\))"), 60);
    const int worker = w.has_value() ? std::stoi((*w)[1]) : -1;
    // The coordinator's pid from --pid-file (written before it serves).
    int coordinator = -1;
    std::ifstream f(pid_file_);
    f >> coordinator;
    return {coordinator, worker};
  }

  std::string bin_, mpiexec_, model_, endpoint_, pid_file_;
};

TEST_F(FaultTest, StoppedWorkerGivesClientsDeadlineExceededAndEveryRankExits) {
  const double step_timeout = 3.0 * TimeScale();
  Child server(Serve(step_timeout));
  const auto [coordinator, worker] = StartedPids(server);
  ASSERT_GT(worker, 0) << server.out();
  ASSERT_GT(coordinator, 0) << server.out();
  // A first request completes: the job works before the fault.
  Result ok = RunChild({bin_, "client", "--zmq-endpoint", endpoint_, "--client-timeout", "120",
                        "--max-tokens", "4", "--temperature", "0", "hello"},
                       180);
  ASSERT_EQ(ok.exit_code, 0) << ok.out << "\nserver:\n" << server.out();

  Child client(Client());
  // A short wait lets generation start; the order does not matter for the
  // outcome (a request that arrives after the stop fails the same way).
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto stopped_at = Clock::now();
  ASSERT_EQ(kill(worker, SIGSTOP), 0);
  Result c = client.Wait(120);
  const double client_s = Since(stopped_at);
  Result s = server.Wait(120);
  const double server_s = Since(stopped_at);
  kill(worker, SIGKILL);  // never leave a stopped process behind
  // The client's request ended with an error, not a hang or a truncated success.
  EXPECT_FALSE(c.timed_out) << c.out;
  EXPECT_EQ(c.exit_code, 1) << c.out;
  EXPECT_NE(c.out.find("finish_reason=error"), std::string::npos) << c.out;
  EXPECT_NE(c.out.find("within"), std::string::npos) << "no timeout named:\n" << c.out;
  // The coordinator classified it as the step timeout.
  EXPECT_NE(s.out.find("DEADLINE_EXCEEDED"), std::string::npos) << s.out;
  // Within the step timeout (+ one step of slack for the step in flight and
  // the reply), and the job ended after the client was answered.
  EXPECT_LT(client_s, step_timeout + 2.0 * TimeScale()) << c.out;
  EXPECT_LE(client_s, server_s);
  EXPECT_FALSE(s.timed_out) << s.out;
  EXPECT_NE(s.exit_code, 0) << s.out;
  EXPECT_EQ(StillAlive({worker, coordinator}, 5.0 * TimeScale()), std::vector<int>{}) << s.out;
  std::printf(
      "worker stopped -> client error after %.2f s (step timeout %.1f s), job ended after %.2f s\n",
      client_s, step_timeout, server_s);
}

TEST_F(FaultTest, KilledCoordinatorMakesEveryWorkerExit) {
  Child server(Serve(120));
  const auto [coordinator, worker] = StartedPids(server);
  ASSERT_GT(worker, 0) << server.out();
  ASSERT_GT(coordinator, 0) << server.out();
  Child client(Client());
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto killed_at = Clock::now();
  ASSERT_EQ(kill(coordinator, SIGKILL), 0);
  // The worker goes first (it polls the coordinator's pid), then mpirun.
  const std::vector<int> left = StillAlive({worker}, 10.0 * TimeScale());
  const double worker_s = Since(killed_at);
  Result s = server.Wait(60);
  EXPECT_EQ(left, std::vector<int>{}) << "worker still running\n" << s.out;
  EXPECT_FALSE(s.timed_out) << s.out;
  EXPECT_NE(s.exit_code, 0) << s.out;
  // The client learns that the server is gone (no reply) rather than hanging:
  // its own timeout is long, so stop it here; what matters is the ranks.
  std::printf("coordinator killed -> worker gone after %.2f s\n", worker_s);
}

}  // namespace
