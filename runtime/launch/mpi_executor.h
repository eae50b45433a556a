// The coordinator's side of the process model under mpirun (world rank 0 of
// at least 2; see mpi_process.h and docs/distributed.md): an Executor that
// sends each step plan to the worker ranks (distributed/plan_transport.h) and
// returns TP rank 0's result.
#ifndef PAGEDSERVE_RUNTIME_LAUNCH_MPI_EXECUTOR_H_
#define PAGEDSERVE_RUNTIME_LAUNCH_MPI_EXECUTOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/engine/executor.h"
#include "runtime/launch/mpi_process.h"

namespace pagedserve {

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
// Threads: the executor calls MPI, so it is made and used on the thread that
// called InitMpi; it is not thread-safe.
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

#endif  // PAGEDSERVE_RUNTIME_LAUNCH_MPI_EXECUTOR_H_
