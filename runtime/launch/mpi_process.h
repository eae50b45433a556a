// The process model under mpirun: world rank 0 is the coordinator, ranks
// 1..TP are the tensor-parallel workers. Without mpirun (world size 1) the
// coordinator runs one in-process worker. docs/distributed.md describes the
// protocol, the timeouts, the failure behaviour and the mpirun flags.
//
// This header: starting and ending MPI, the rank roles and the checks every
// command makes. The worker ranks' loop is in worker_rank.h, the coordinator's
// executors in mpi_executor.h (world size > 1) and local_executor.h (TP = 1,
// in-process).
//
// Typical use in a command:
//   auto info = InitMpi(&argc, &argv);               // every rank
//   if (auto s = CheckWorldSize(*info, tp); !s.ok()) { print s; FinalizeMpi(); return 2; }
//   if (!info->coordinator()) {
//     int rc = RunWorkerRank(*info, opts);           // worker_rank.h
//     FinalizeMpi(rc != 0, rc);
//     return rc;
//   }
//   auto exec = info->world_size > 1
//       ? MakeMpiExecutor(*info, block_size, kDefaultStartupTimeout,
//                         kDefaultStepTimeout)       // mpi_executor.h
//       : CreateLocalExecutor(opts);                 // local_executor.h
//   ... engine loop; on an executor error fail every request ...
//   exec->Shutdown(); FinalizeMpi(/*abort=*/failed, 1);
//
// Threads: MPI is initialized MPI_THREAD_FUNNELED; every function here that
// calls MPI must run on the thread that called InitMpi (CheckWorkerLiveness
// makes no MPI call).
#ifndef PAGEDSERVE_RUNTIME_LAUNCH_MPI_PROCESS_H_
#define PAGEDSERVE_RUNTIME_LAUNCH_MPI_PROCESS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pagedserve {

struct LaunchInfo {
  int world_rank = 0;
  int world_size = 1;
  bool coordinator() const { return world_rank == 0; }
};

// Recommended timeouts. Startup covers loading and dequantizing the shard on a
// loaded machine. The step timeout bounds how long the coordinator waits for
// the workers to take a plan and for TP rank 0's result: a worker that died or
// hangs becomes an error on the coordinator within this time, so it must stay
// below 10 s (the failure budget) and above the longest legitimate step.
inline constexpr absl::Duration kDefaultStartupTimeout = absl::Seconds(600);
inline constexpr absl::Duration kDefaultStepTimeout = absl::Seconds(120);

// MPI_Init_thread (MPI_THREAD_FUNNELED: only the main thread calls MPI) and
// the rank/size. Safe without mpirun (singleton MPI, world size 1).
absl::StatusOr<LaunchInfo> InitMpi(int* argc, char*** argv);
// MPI_Finalize (or MPI_Abort with `exit_code` when `abort`). After an MPI
// executor reported a worker failure, or when a worker rank gave up, this
// aborts even when `abort` is false (MPI_Finalize would wait for a dead or
// stuck rank), so that mpirun stops every rank. No-op before InitMpi or after
// a previous call. Bounded: before MPI_Abort the coordinator closes its
// liveness links (workers that were not told to stop exit at once), and a
// rank whose MPI_Abort has not returned after 2 s (it waits for mpirun's
// daemon, which may never answer once the job is already being torn down or
// a host is lost) ends itself with _exit(exit_code); MPI_Finalize likewise
// after 30 s (_exit(1)). Call it last: the process is expected to exit.
void FinalizeMpi(bool abort = false, int exit_code = 1);

// Coordinator, any thread, no MPI call: the liveness links' verdict
// (LivenessMonitor::Probe): OK, or Unavailable naming the first lost worker
// rank ("worker rank 2 lost: ..."). OK when there are no links (world size 1,
// or the monitor could not start). A loss seen before the workers were told to
// stop stays reported. For a watchdog that must not depend on the thread
// that runs the executor: that thread can block inside MPI once a peer died
// (seen with OpenMPI 4.1 over TCP after a worker was killed: no step error
// for 6 s, until mpirun's SIGKILL), so serve_command fails the clients from
// another thread when the executor has not reported a loss in time.
// Thread-safe; not after FinalizeMpi (which closes the links).
absl::Status CheckWorkerLiveness();

// Checks world_size == 1 + tensor_parallel_size, or world_size == 1 with
// tensor_parallel_size == 1. InvalidArgument with a message every rank prints.
absl::Status CheckWorldSize(const LaunchInfo& info, int tensor_parallel_size);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_LAUNCH_MPI_PROCESS_H_
