#include "distributed/liveness.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace pagedserve {
namespace {

using Clock = std::chrono::steady_clock;

absl::Status Errno(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

void SetNonBlocking(int fd) { fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK); }

// IPv4 addresses of the interfaces that are up, non-loopback first.
std::vector<std::string> HostAddresses() {
  std::vector<std::string> outer, loopback;
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return {"127.0.0.1"};
  for (ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if (!(a->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
    ((a->ifa_flags & IFF_LOOPBACK) ? loopback : outer).push_back(text);
  }
  freeifaddrs(list);
  outer.insert(outer.end(), loopback.begin(), loopback.end());
  return outer;
}

// Sends one heartbeat byte; false when the connection is broken. A full send
// buffer (peer not reading) is not an error here: silence is judged by the peer.
bool SendBeat(int fd) {
  const char beat = 'h';
  ssize_t n = send(fd, &beat, 1, MSG_NOSIGNAL | MSG_DONTWAIT);
  return n == 1 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

// Drains what arrived. Returns false at EOF or on an error.
bool Drain(int fd, std::string* bytes = nullptr) {
  char buf[256];
  while (true) {
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_DONTWAIT);
    if (n > 0) {
      if (bytes) bytes->append(buf, n);
      continue;
    }
    if (n == 0) return false;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
  }
}

int Millis(absl::Duration d) { return static_cast<int>(absl::ToInt64Milliseconds(d)); }

}  // namespace

// ---------------------------------------------------------------------------
// LivenessMonitor
// ---------------------------------------------------------------------------
absl::StatusOr<std::unique_ptr<LivenessMonitor>> LivenessMonitor::Start(absl::Duration interval,
                                                                        absl::Duration timeout) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("liveness: socket");
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 64) != 0) {
    absl::Status s = Errno("liveness: bind/listen");
    close(fd);
    return s;
  }
  SetNonBlocking(fd);
  return std::unique_ptr<LivenessMonitor>(new LivenessMonitor(fd, interval, timeout));
}

LivenessMonitor::LivenessMonitor(int listen_fd, absl::Duration interval, absl::Duration timeout)
    : listen_fd_(listen_fd), interval_(interval), timeout_(timeout) {
  sockaddr_in addr = {};
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  endpoint_ = absl::StrCat(ntohs(addr.sin_port), " ", absl::StrJoin(HostAddresses(), ","));
  if (endpoint_.size() >= static_cast<size_t>(kLivenessEndpointBytes))
    endpoint_.resize(endpoint_.rfind(',', kLivenessEndpointBytes - 1));
  if (pipe2(wake_fds_, O_CLOEXEC) != 0) wake_fds_[0] = wake_fds_[1] = -1;
  thread_ = std::thread([this] { Run(); });
}

LivenessMonitor::~LivenessMonitor() {
  if (wake_fds_[1] >= 0) {
    const char c = 'q';
    (void)!write(wake_fds_[1], &c, 1);
  }
  thread_.join();
  close(listen_fd_);
  if (wake_fds_[0] >= 0) close(wake_fds_[0]);
  if (wake_fds_[1] >= 0) close(wake_fds_[1]);
}

absl::Status LivenessMonitor::Check(const std::vector<int>& ignore) const {
  std::lock_guard<std::mutex> l(mu_);
  for (const auto& [rank, why] : lost_)
    if (std::find(ignore.begin(), ignore.end(), rank) == ignore.end())
      return absl::UnavailableError(absl::StrCat("worker rank ", rank, " lost: ", why));
  return absl::OkStatus();
}

absl::Status LivenessMonitor::Probe(const std::vector<int>& ignore) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (!expect_exits_) {
      std::vector<pollfd> fds;
      std::vector<int> ranks;
      for (const auto& [rank, fd] : fds_) {
        if (std::find(ignore.begin(), ignore.end(), rank) != ignore.end()) continue;
        fds.push_back({fd, POLLRDHUP, 0});
        ranks.push_back(rank);
      }
      // fds_ only holds open sockets: Run closes them with mu_ held.
      if (!fds.empty() && poll(fds.data(), fds.size(), 0) > 0) {
        for (size_t i = 0; i < fds.size(); ++i) {
          if (!(fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR))) continue;
          connected_[ranks[i]] = false;
          lost_.emplace(ranks[i], "its connection closed (process exited or host unreachable)");
        }
      }
    }
  }
  return Check(ignore);
}

std::vector<int> LivenessMonitor::Gone() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<int> ranks;
  for (const auto& [rank, open] : connected_)
    if (!open) ranks.push_back(rank);
  return ranks;
}

std::vector<int> LivenessMonitor::Connected() const {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<int> ranks;
  for (const auto& [rank, open] : connected_) ranks.push_back(rank);
  return ranks;
}

void LivenessMonitor::ExpectExits() {
  std::lock_guard<std::mutex> l(mu_);
  expect_exits_ = true;
}

void LivenessMonitor::Run() {
  struct Conn {
    int fd;
    int rank = -1;  // known once its 4-byte hello (world rank) arrived
    std::string hello;
    Clock::time_point last_rx;
  };
  std::vector<Conn> conns;
  // Records the loss and closes the socket (under mu_: Probe polls fds_).
  auto lose = [&](const Conn& c, const std::string& why) {
    std::lock_guard<std::mutex> l(mu_);
    if (c.rank >= 0) {
      connected_[c.rank] = false;
      fds_.erase(c.rank);
    }
    if (!expect_exits_ && c.rank >= 0) lost_.emplace(c.rank, why);
    close(c.fd);
  };
  auto next_beat = Clock::now();
  while (true) {
    std::vector<pollfd> fds = {{wake_fds_[0], POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    for (const Conn& c : conns) fds.push_back({c.fd, POLLIN, 0});
    const int wait_ms = static_cast<int>(std::max<int64_t>(
        0,
        std::chrono::duration_cast<std::chrono::milliseconds>(next_beat - Clock::now()).count()));
    poll(fds.data(), fds.size(), wait_ms);
    if (fds[0].revents) break;
    const auto now = Clock::now();
    if (fds[1].revents & POLLIN) {
      while (true) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        conns.push_back({fd, -1, "", now});
      }
    }
    for (size_t i = 0; i < conns.size();) {
      Conn& c = conns[i];
      short rev = 0;
      for (size_t k = 2; k < fds.size(); ++k)
        if (fds[k].fd == c.fd) rev = fds[k].revents;
      bool open = true;
      std::string why;
      if (rev) {
        std::string bytes;
        open = Drain(c.fd, &bytes);
        if (!bytes.empty()) c.last_rx = now;
        if (c.rank < 0) {
          c.hello += bytes;
          if (c.hello.size() >= 4) {
            int32_t rank = 0;
            std::memcpy(&rank, c.hello.data(), 4);
            c.rank = rank;
            std::lock_guard<std::mutex> l(mu_);
            connected_[rank] = true;
            fds_[rank] = c.fd;
          }
        }
        if (!open) why = "its connection closed (process exited or host unreachable)";
      }
      if (open && now - c.last_rx > absl::ToChronoNanoseconds(timeout_)) {
        open = false;
        why = absl::StrCat("no heartbeat for ", absl::FormatDuration(timeout_),
                           " (host or link down, or the process stopped?)");
      }
      if (!open) {
        lose(c, why);
        conns.erase(conns.begin() + i);
        continue;
      }
      ++i;
    }
    if (now >= next_beat) {
      for (const Conn& c : conns) SendBeat(c.fd);
      next_beat = now + absl::ToChronoNanoseconds(interval_);
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  fds_.clear();
  for (const Conn& c : conns) close(c.fd);
}

// ---------------------------------------------------------------------------
// LivenessBeacon
// ---------------------------------------------------------------------------
absl::StatusOr<std::unique_ptr<LivenessBeacon>> LivenessBeacon::Connect(
    const std::string& endpoint, int world_rank, absl::Duration connect_timeout,
    absl::Duration interval, absl::Duration timeout) {
  std::vector<std::string> parts = absl::StrSplit(endpoint, ' ');
  int port = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &port) || port <= 0 || port > 65535)
    return absl::InvalidArgumentError(
        absl::StrCat("liveness endpoint '", endpoint, "' is not 'PORT ADDR,...'"));
  std::vector<std::string> addrs = absl::StrSplit(parts[1], ',', absl::SkipEmpty());
  const auto deadline = Clock::now() + absl::ToChronoNanoseconds(connect_timeout);
  std::string last_error = "no address";
  while (Clock::now() < deadline) {
    for (const std::string& a : addrs) {
      sockaddr_in addr = {};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      if (inet_pton(AF_INET, a.c_str(), &addr.sin_addr) != 1) continue;
      int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) return Errno("liveness: socket");
      int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
      if (rc != 0 && errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        int err = ETIMEDOUT;
        if (poll(&p, 1, 2000) == 1) {
          socklen_t len = sizeof(err);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        }
        rc = err == 0 ? 0 : -1;
        errno = err;
      }
      if (rc != 0) {
        last_error = absl::StrCat(a, ":", port, ": ", std::strerror(errno));
        close(fd);
        continue;
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      const int32_t rank = world_rank;
      if (send(fd, &rank, sizeof(rank), MSG_NOSIGNAL) != sizeof(rank)) {
        last_error = absl::StrCat(a, ":", port, ": send: ", std::strerror(errno));
        close(fd);
        continue;
      }
      return std::unique_ptr<LivenessBeacon>(
          new LivenessBeacon(fd, absl::StrCat(a, ":", port), interval, timeout));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  return absl::UnavailableError(
      absl::StrCat("cannot reach the coordinator's liveness port (", endpoint, "): ", last_error));
}

LivenessBeacon::LivenessBeacon(int fd, std::string peer, absl::Duration interval,
                               absl::Duration timeout)
    : fd_(fd), peer_(std::move(peer)), interval_(interval), timeout_(timeout) {
  if (pipe2(wake_fds_, O_CLOEXEC) != 0) wake_fds_[0] = wake_fds_[1] = -1;
  thread_ = std::thread([this] { Run(); });
}

LivenessBeacon::~LivenessBeacon() {
  stopping_.store(true);
  if (wake_fds_[1] >= 0) {
    const char c = 'q';
    (void)!write(wake_fds_[1], &c, 1);
  }
  thread_.join();
  close(fd_);
  if (wake_fds_[0] >= 0) close(wake_fds_[0]);
  if (wake_fds_[1] >= 0) close(wake_fds_[1]);
}

void LivenessBeacon::Run() {
  auto last_rx = Clock::now();
  auto next_beat = Clock::now();
  while (true) {
    pollfd fds[2] = {{wake_fds_[0], POLLIN, 0}, {fd_, POLLIN, 0}};
    const int wait_ms = static_cast<int>(std::max<int64_t>(
        0,
        std::chrono::duration_cast<std::chrono::milliseconds>(next_beat - Clock::now()).count()));
    poll(fds, 2, std::min(wait_ms, Millis(interval_)));
    if (fds[0].revents) return;
    const auto now = Clock::now();
    std::string why;
    if (fds[1].revents) {
      std::string bytes;
      const bool open = Drain(fd_, &bytes);
      if (!bytes.empty()) last_rx = now;
      if (!open) why = "its connection closed (process exited or host unreachable)";
    }
    if (why.empty() && now - last_rx > absl::ToChronoNanoseconds(timeout_))
      why = absl::StrCat("no heartbeat for ", absl::FormatDuration(timeout_),
                         " (host or link down, or the process stopped?)");
    if (!why.empty()) {
      if (stopping_.load()) return;
      std::fprintf(stderr, "pagedserve worker (pid %d): coordinator at %s lost: %s; exiting\n",
                   static_cast<int>(getpid()), peer_.c_str(), why.c_str());
      std::fflush(nullptr);
      _exit(3);
    }
    if (now >= next_beat) {
      SendBeat(fd_);
      next_beat = now + absl::ToChronoNanoseconds(interval_);
    }
  }
}

}  // namespace pagedserve
