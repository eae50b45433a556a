// The process model under mpirun: world rank 0 is the coordinator, ranks
// 1..TP are the tensor-parallel workers. Without mpirun (world size 1) the
// coordinator runs one in-process worker.
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

// MPI_Init_thread (MPI_THREAD_FUNNELED: only the main thread calls MPI) and
// the rank/size. Safe without mpirun (singleton MPI, world size 1).
absl::StatusOr<LaunchInfo> InitMpi(int* argc, char*** argv);
// MPI_Finalize (or MPI_Abort with `exit_code` when `abort`).
void FinalizeMpi(bool abort = false, int exit_code = 1);

// Checks world_size == 1 + tensor_parallel_size, or world_size == 1 with
// tensor_parallel_size == 1. InvalidArgument with a message every rank prints.
absl::Status CheckWorldSize(const LaunchInfo& info, int tensor_parallel_size);

// Worker ranks: loads the shard (Worker::Create over a TP communicator: MPI on
// CPU, NCCL on GPU), reports its block counts to the coordinator, then runs
// plans until a shutdown plan. Returns the process exit code.
int RunWorkerRank(const LaunchInfo& info, const WorkerOptions& options);

// Coordinator rank with world_size > 1: an Executor over the worker ranks.
// Waits up to `startup_timeout` for every worker's report; block counts are
// the minimum over ranks. Every later step waits at most `step_timeout` for the
// workers (a dead or stuck worker becomes an error, not a hang).
absl::StatusOr<std::unique_ptr<Executor>> MakeMpiExecutor(const LaunchInfo& info,
                                                          absl::Duration startup_timeout,
                                                          absl::Duration step_timeout);

}  // namespace pagedserve

#endif  // PAGEDSERVE_DISTRIBUTED_LAUNCH_H_
