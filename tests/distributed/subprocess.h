// A child process (mpirun) with its output captured, for the distributed
// tests: hard timeouts so that a hung job can never hang CI.
#ifndef PAGEDSERVE_TESTS_DISTRIBUTED_SUBPROCESS_H_
#define PAGEDSERVE_TESTS_DISTRIBUTED_SUBPROCESS_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pagedserve::subprocess {

using Clock = std::chrono::steady_clock;

inline std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// PAGEDSERVE_TEST_TIME_SCALE (default 1, values below 1 ignored): the factor
// every latency bound of the process tests is multiplied by, for a loaded
// shared machine (CTest -j, sanitizers). Tests assert the order of events
// wherever they can and keep wall-clock bounds only where the bound is the
// property under test (a failure noticed within the step timeout).
inline double TimeScale() {
  const char* v = std::getenv("PAGEDSERVE_TEST_TIME_SCALE");
  const double s = v != nullptr ? std::atof(v) : 1.0;
  return s > 1.0 ? s : 1.0;
}

// Waits up to `timeout_s` for each pid to be gone (Alive below); returns the
// pids still running.
inline std::vector<int> StillAlive(const std::vector<int>& pids, double timeout_s);

struct Result {
  int exit_code = -1;  // -1: killed by the test's timeout
  bool timed_out = false;
  std::string out;  // stdout and stderr interleaved
  double seconds = 0.0;
};

// A child process (mpirun) with its output on a pipe.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      setsid();
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      close(fds[0]);
      close(fds[1]);
      std::vector<char*> args;
      args.reserve(argv.size() + 1);
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      execvp(args[0], args.data());
      _exit(127);
    }
    close(fds[1]);
    fd_ = fds[0];
    fcntl(fd_, F_SETFL, O_NONBLOCK);
    start_ = Clock::now();
  }
  ~Child() {
    if (pid_ > 0 && !reaped_) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }

  // Reads output until `pattern` matches the text so far or `timeout` passes.
  std::optional<std::smatch> WaitFor(const std::regex& pattern, double timeout_s) {
    const auto deadline = start_ + std::chrono::duration<double>(Elapsed() + timeout_s);
    while (Clock::now() < deadline) {
      std::smatch m;
      if (std::regex_search(out_, m, pattern)) return m;
      if (!Pump(100)) break;
    }
    std::smatch m;
    if (std::regex_search(out_, m, pattern)) return m;
    return std::nullopt;
  }

  // Waits for the exit; on timeout SIGTERM (mpirun stops its ranks), then SIGKILL.
  Result Wait(double timeout_s) {
    Result r;
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    int status = 0;
    while (true) {
      Pump(50);
      pid_t w = waitpid(pid_, &status, WNOHANG);
      if (w == pid_) break;
      if (Clock::now() > deadline) {
        r.timed_out = true;
        kill(pid_, SIGTERM);
        std::this_thread::sleep_for(std::chrono::seconds(3));
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
    }
    reaped_ = true;
    // What the child wrote before it exited. A grandchild that inherited the
    // pipe (an mpirun daemon on an unreachable host) may keep it open: stop
    // once nothing arrives for a moment instead of waiting for EOF.
    for (size_t before = out_.size() + 1; before != out_.size();) {
      before = out_.size();
      if (!Pump(200)) break;
    }
    r.seconds = Elapsed();
    r.exit_code = r.timed_out         ? -1
                  : WIFEXITED(status) ? WEXITSTATUS(status)
                                      : 128 + WTERMSIG(status);
    r.out = out_;
    return r;
  }

  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }
  const std::string& out() const { return out_; }

 private:
  // Reads what is available (waiting up to `ms`); false at EOF.
  bool Pump(int ms) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, ms) <= 0) return true;
    char buf[4096];
    ssize_t n = read(fd_, buf, sizeof(buf));
    if (n > 0) {
      out_.append(buf, n);
      return true;
    }
    return n < 0 && errno == EAGAIN;
  }

  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  std::string out_;
  Clock::time_point start_;
};

// Running (a zombie waiting for its reaper does not count).
inline bool Alive(int pid) {
  FILE* f = std::fopen(absl::StrCat("/proc/", pid, "/stat").c_str(), "r");
  if (f == nullptr) return false;
  char state = '?';
  int scanned = std::fscanf(f, "%*d (%*[^)]) %c", &state);
  std::fclose(f);
  return scanned == 1 && state != 'Z';
}

inline std::vector<int> StillAlive(const std::vector<int>& pids, double timeout_s) {
  const auto until = Clock::now() + std::chrono::duration<double>(timeout_s);
  std::vector<int> alive;
  for (int pid : pids) {
    while (Alive(pid) && Clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (Alive(pid)) alive.push_back(pid);
  }
  return alive;
}

inline Result RunChild(const std::vector<std::string>& argv, double timeout_s) {
  Child c(argv);
  return c.Wait(timeout_s);
}

}  // namespace pagedserve::subprocess

#endif  // PAGEDSERVE_TESTS_DISTRIBUTED_SUBPROCESS_H_
