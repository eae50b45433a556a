// The coordinator's executor without mpirun (TP = 1): the worker runs in the
// coordinator's process and each step plan is a function call.
#ifndef PAGEDSERVE_RUNTIME_LAUNCH_LOCAL_EXECUTOR_H_
#define PAGEDSERVE_RUNTIME_LAUNCH_LOCAL_EXECUTOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "distributed/communicator.h"
#include "runtime/engine/executor.h"
#include "runtime/worker/worker.h"

namespace pagedserve {

// Runs plans on an in-process worker (TP = 1, no MPI). Takes ownership.
// Shutdown() is local bookkeeping: later Execute calls fail with
// FailedPrecondition. The worker's communicator must outlive the executor, or
// be handed over with the second overload (destroyed after the worker).
// Threads: not thread-safe; the engine calls it from its one thread.
std::unique_ptr<Executor> MakeLocalExecutor(std::unique_ptr<Worker> worker);
std::unique_ptr<Executor> MakeLocalExecutor(std::unique_ptr<Worker> worker,
                                            std::unique_ptr<Communicator> comm);
// Loads the model on a single-rank communicator (Worker::Create, whose errors
// it returns) and wraps it in a local executor that owns both.
absl::StatusOr<std::unique_ptr<Executor>> CreateLocalExecutor(const WorkerOptions& options);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_LAUNCH_LOCAL_EXECUTOR_H_
