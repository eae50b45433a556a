// Where step plans run. The engine hands each plan to an Executor and gets the
// sampled tokens back; it does not know whether the worker is in-process or a
// set of MPI ranks.
#ifndef PAGEDSERVE_RUNTIME_ENGINE_EXECUTOR_H_
#define PAGEDSERVE_RUNTIME_ENGINE_EXECUTOR_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "runtime/common/step_plan.h"

namespace pagedserve {

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs one plan on every worker and returns TP rank 0's result. An error
  // means the workers are unusable (dead rank, timeout, kernel failure): the
  // engine fails every in-flight request and stops.
  virtual absl::StatusOr<StepResult> Execute(const StepPlan& plan) = 0;
  // Stops the workers (sends a shutdown plan). Idempotent.
  virtual absl::Status Shutdown() = 0;
  // KV blocks every rank can hold (the minimum over ranks), and swap blocks.
  virtual int64_t num_device_blocks() const = 0;
  virtual int64_t num_cpu_blocks() const = 0;
};

// Implementations: MakeLocalExecutor / CreateLocalExecutor (in-process worker,
// runtime/launch/local_executor.h) and MakeMpiExecutor (worker ranks under
// mpirun, runtime/launch/mpi_executor.h); tests use scripted executors.

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_ENGINE_EXECUTOR_H_
