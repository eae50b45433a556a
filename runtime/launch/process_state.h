// State and helpers shared by the files of the launch module (runtime/launch/):
// the one MPI world of this process, the "launch" logger, the process check the
// watchdogs use and the step id of an abort plan. Not for use outside
// runtime/launch/; the module's public headers are mpi_process.h,
// worker_rank.h, mpi_executor.h and local_executor.h.
#ifndef PAGEDSERVE_RUNTIME_LAUNCH_PROCESS_STATE_H_
#define PAGEDSERVE_RUNTIME_LAUNCH_PROCESS_STATE_H_

#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>

#include <mpi.h>
#include <spdlog/spdlog.h>

#include "distributed/liveness.h"

namespace pagedserve::launch_internal {

// A shutdown plan with this step id tells the workers that the coordinator
// gave up (setup or step failure): they exit non-zero instead of 0.
inline constexpr uint64_t kAbortStepId = std::numeric_limits<uint64_t>::max();

// Process-wide MPI state (one MPI world per process). Written by InitMpi and
// FinalizeMpi on the main thread; `failed` may be set from any thread; the
// other fields are read-only after InitMpi returns.
struct MpiState {
  bool initialized_here = false;  // MPI_Init_thread was called by InitMpi
  bool finalized = false;
  // Set when a worker failure was seen (coordinator) or a worker rank gave up:
  // FinalizeMpi must abort since MPI_Finalize waits for every rank.
  std::atomic<bool> failed{false};
  // The coordinator's host name and pid (for the workers' liveness check).
  char coordinator_host[MPI_MAX_PROCESSOR_NAME] = {};
  int64_t coordinator_pid = 0;
  // Liveness links (distributed/liveness.h): the coordinator's monitor and
  // the endpoint every rank learns at start-up ("" when the monitor failed).
  std::unique_ptr<LivenessMonitor> liveness;
  char liveness_endpoint[kLivenessEndpointBytes] = {};
};
// The process's MpiState (created on first use, never destroyed).
MpiState& State();

// Launch messages go to stderr: stdout belongs to the command (generated text).
// The spdlog logger "launch" (created on first use unless registered earlier).
spdlog::logger& Log();

// True when `pid` (on this host) has exited: no such process, or a zombie that
// its parent (mpirun's daemon, busy stopping the job) has not reaped yet.
// No MPI call; safe from any thread.
bool ProcessGone(int64_t pid);

}  // namespace pagedserve::launch_internal

#endif  // PAGEDSERVE_RUNTIME_LAUNCH_PROCESS_STATE_H_
