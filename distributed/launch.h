// The process model under mpirun: world rank 0 is the coordinator, ranks
// 1..TP are the tensor-parallel workers. Without mpirun (world size 1) the
// coordinator runs one in-process worker. docs/distributed.md describes the
// protocol, the timeouts, the failure behaviour and the mpirun flags.
//
// Typical use in a command:
//   auto info = InitMpi(&argc, &argv);               // every rank
//   if (auto s = CheckWorldSize(*info, tp); !s.ok()) { print s; FinalizeMpi(); return 2; }
//   if (!info->coordinator()) { int rc = RunWorkerRank(*info, opts); FinalizeMpi(rc != 0, rc);
//   return rc; } auto exec = info->world_size > 1 ? MakeMpiExecutor(*info, block_size,
//   kDefaultStartupTimeout,
//                                                      kDefaultStepTimeout)
//                                    : MakeLocalExecutor(...);
//   ... engine loop; on an executor error fail every request ...
//   exec->Shutdown(); FinalizeMpi(/*abort=*/failed, 1);
#ifndef PAGEDSERVE_DISTRIBUTED_LAUNCH_H_
#define PAGEDSERVE_DISTRIBUTED_LAUNCH_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/engine/executor.h"
#include "runtime/worker/worker.h"

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

// Worker ranks: loads the shard (Worker::Create over a TP communicator of the
// worker ranks), reports its block counts (or its setup error)
// to the coordinator, then runs plans until a shutdown plan. TP rank 0 returns
// each step's result; any rank that fails a step sends the error and refuses
// every later step plan (the coordinator stops). Signals: SIGINT is ignored
// (the coordinator decides); after SIGTERM the rank keeps serving plans but
// exits if it makes no progress for kDefaultStepTimeout (a rank stuck in a
// collective with a dead peer), and a rank whose coordinator process is gone
// (same host) exits. Returns 0 after a shutdown plan, non-zero after a setup
// failure or an abort from the coordinator.
//
// Device: with PAGEDSERVE_WORKER_DEVICE unset or "auto", a rank runs on CUDA
// when options.device is kCUDA or when the build has CUDA and a device answers
// (kernels::CudaDeviceAvailable); its device is its rank among the worker
// ranks on the same host (MPI_Comm_split_type SHARED) modulo the device count,
// and its collectives are NCCL (device buffers). Otherwise, or with
// PAGEDSERVE_WORKER_DEVICE=cpu, it runs on the CPU with MPI collectives.
// PAGEDSERVE_WORKER_DEVICE=cuda forces CUDA (a setup error without a device).
// Under mpirun pass the variable to the ranks (-x PAGEDSERVE_WORKER_DEVICE).
int RunWorkerRank(const LaunchInfo& info, const WorkerOptions& options);

// Coordinator rank with world_size > 1: an Executor over the worker ranks.
// Waits up to `startup_timeout` for every worker's report; block counts are
// the minimum over ranks. Every later step waits at most `step_timeout` for the
// workers (a dead or stuck worker becomes an error, not a hang).
// Logs (spdlog) the block counts of every rank and the capacity in tokens.
// Errors: FailedPrecondition naming the rank and its setup error (e.g. a
// tensor-parallel size that does not divide the query heads), DeadlineExceeded
// when a worker does not report in time. On any error (here or in Execute)
// the workers are told to abort and FinalizeMpi aborts the job.
// Shutdown() waits for every worker to acknowledge (step timeout) and fails
// if one does not (a dead rank), so a clean exit code means every rank ended.
// block_size is the coordinator's --block-size: every worker confirms it in
// its hello (FailedPrecondition naming the rank otherwise), since workers
// derive the slot mapping from the plans' block tables with it.
absl::StatusOr<std::unique_ptr<Executor>> MakeMpiExecutor(const LaunchInfo& info,
                                                          int32_t block_size,
                                                          absl::Duration startup_timeout,
                                                          absl::Duration step_timeout);

// Time the MPI executor spent per phase, summed over steps (for metrics and
// the benchmark). send = serializing and handing the plan to every worker;
// wait = from the end of the send to TP rank 0's result; worker_* = TP rank
// 0's own figures (StepResult.forward_seconds / collective_seconds).
struct MpiExecutorStats {
  int64_t steps = 0;
  double send_seconds = 0.0;
  double wait_seconds = 0.0;
  double worker_forward_seconds = 0.0;
  double worker_collective_seconds = 0.0;
};
// Stats of an executor made by MakeMpiExecutor; NotFound for any other.
absl::StatusOr<MpiExecutorStats> GetMpiExecutorStats(const Executor& executor);

}  // namespace pagedserve

#endif  // PAGEDSERVE_DISTRIBUTED_LAUNCH_H_
