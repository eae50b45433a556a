// Liveness links between the coordinator and the worker ranks, outside MPI.
//
// MPI cannot tell a slow step from a dead peer: a worker blocked in an
// all-reduce with a killed rank waits forever, and a host whose link went down
// sends no FIN. Each worker rank therefore keeps one plain TCP connection to
// the coordinator, and both ends send a one-byte heartbeat every
// kLivenessInterval from a thread of their own (no MPI calls: MPI is
// FUNNELED). An end declares the other lost when the connection closes (the
// peer process died: its kernel closes the socket at once) or when nothing
// arrived for kLivenessTimeout (host down, link down, partition):
//  - the coordinator turns a lost worker into an error of the step in flight
//    (LivenessMonitor::Check, polled by PlanSender), so that requests fail and
//    the job aborts within seconds instead of at the step timeout;
//  - a worker whose coordinator is lost ends its process (_exit(3)): a rank
//    stuck in a collective could not otherwise be stopped.
// Same idea as the heartbeats of gloo/torch.distributed's TCPStore and of
// ZeroMQ's ZMTP 3.1 PING, reduced to one byte each way.
//
// Addresses: the coordinator listens on an ephemeral TCP port of every IPv4
// address of its host (INADDR_ANY) and tells the workers the port and its
// addresses (MPI broadcast at start-up, see runtime/launch/mpi_process.cc); a worker tries them in
// order until one connects. Both ends are thread-safe.
#ifndef PAGEDSERVE_DISTRIBUTED_LIVENESS_H_
#define PAGEDSERVE_DISTRIBUTED_LIVENESS_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pagedserve {

// Heartbeat period, and the silence after which the peer counts as lost. The
// timeout bounds failure detection for a dead host (the failure budget is
// 10 s including mpirun's teardown); a dead process is seen at once.
inline constexpr absl::Duration kLivenessInterval = absl::Milliseconds(500);
inline constexpr absl::Duration kLivenessTimeout = absl::Seconds(4);

// Where the workers reach the coordinator: "PORT ADDR1,ADDR2,..." (IPv4, the
// non-loopback addresses first). Fits kLivenessEndpointBytes with its NUL.
inline constexpr int kLivenessEndpointBytes = 512;

// Coordinator side: accepts one connection per worker rank and watches them.
class LivenessMonitor {
 public:
  // Listens on INADDR_ANY, an ephemeral port. Errors: Internal (socket, bind).
  static absl::StatusOr<std::unique_ptr<LivenessMonitor>> Start(
      absl::Duration interval = kLivenessInterval, absl::Duration timeout = kLivenessTimeout);
  ~LivenessMonitor();  // stops the thread and closes every connection

  // "PORT ADDR1,ADDR2,..." for the workers (see kLivenessEndpointBytes).
  const std::string& endpoint() const { return endpoint_; }

  // OK while every worker rank that connected is alive, ranks in `ignore`
  // aside; else Unavailable naming the first lost rank (its world rank and
  // what was seen). Ranks that have not connected yet are not checked.
  absl::Status Check(const std::vector<int>& ignore = {}) const;
  // As Check, but first asks the kernel (poll with no wait, POLLRDHUP) whether
  // a connection has been closed by its peer, instead of relying on the
  // monitor thread having run since: a worker process that died a moment ago
  // is reported even when this machine is too loaded to schedule that thread.
  // The coordinator calls it right before it hands a step plan to MPI, since
  // with OpenMPI 4.1 over TCP a send to a dead peer can block the sender
  // (reconnect attempts) or abort it (a failed fragment is fatal in pml ob1),
  // either way before its clients hear why.
  // Closures found here are recorded as if the thread had seen them. Cheap
  // (one poll over the open connections); safe from any thread.
  absl::Status Probe(const std::vector<int>& ignore = {});
  // World ranks connected so far (ascending).
  std::vector<int> Connected() const;
  // World ranks whose connection has closed or gone silent (ascending), lost
  // or expected: no MPI message should be sent to them any more.
  std::vector<int> Gone() const;
  // From now on closed connections are expected (the workers are being shut
  // down or aborted): they are not errors.
  void ExpectExits();

 private:
  LivenessMonitor(int listen_fd, absl::Duration interval, absl::Duration timeout);
  void Run();

  const int listen_fd_;
  const absl::Duration interval_, timeout_;
  std::string endpoint_;
  int wake_fds_[2] = {-1, -1};  // pipe: the destructor wakes the thread
  mutable std::mutex mu_;
  std::map<int, bool> connected_;    // world rank -> connection open
  std::map<int, int> fds_;           // world rank -> its open socket (closed under mu_)
  std::map<int, std::string> lost_;  // world rank -> what was seen
  bool expect_exits_ = false;
  std::thread thread_;
};

// Worker side: connects to the coordinator and exchanges heartbeats until
// destroyed. When the coordinator is lost (closed or silent for `timeout`)
// it logs the reason on stderr and ends the process with _exit(3), unless
// Stop() was called first (shutdown plan received).
class LivenessBeacon {
 public:
  // Tries each address of `endpoint` for up to `connect_timeout` in all.
  // Errors: InvalidArgument (endpoint text), Unavailable (no address connects).
  static absl::StatusOr<std::unique_ptr<LivenessBeacon>> Connect(
      const std::string& endpoint, int world_rank,
      absl::Duration connect_timeout = absl::Seconds(30),
      absl::Duration interval = kLivenessInterval, absl::Duration timeout = kLivenessTimeout);
  ~LivenessBeacon();  // closes the connection (the coordinator expects it by then)
  // The coordinator is shutting this rank down: losing it is no longer fatal.
  void Stop() { stopping_.store(true); }
  // Address that connected, e.g. "10.0.0.1:43521".
  const std::string& peer() const { return peer_; }

 private:
  LivenessBeacon(int fd, std::string peer, absl::Duration interval, absl::Duration timeout);
  void Run();

  const int fd_;
  const std::string peer_;
  const absl::Duration interval_, timeout_;
  int wake_fds_[2] = {-1, -1};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_DISTRIBUTED_LIVENESS_H_
