#include "runtime/launch/mpi_process.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <thread>
#include <utility>

#include <mpi.h>

#include "absl/strings/str_cat.h"
#include "distributed/liveness.h"
#include "runtime/launch/process_state.h"

namespace pagedserve {
namespace {

using launch_internal::Log;
using launch_internal::MpiState;
using launch_internal::State;

// Bounds on FinalizeMpi (see mpi_process.h): MPI_Abort, then MPI_Finalize.
constexpr absl::Duration kAbortExitGrace = absl::Seconds(2);
constexpr absl::Duration kFinalizeExitGrace = absl::Seconds(30);

// Ends the process with `code` after `grace` unless it has exited (or the
// returned flag was set) by then: a detached plain thread (no MPI), so that no
// MPI call on an exit path can keep a rank alive. Exiting without
// MPI_Finalize makes mpirun tear the job down, which is what an exit path
// that hangs needs anyway.
std::shared_ptr<std::atomic<bool>> ExitAfter(absl::Duration grace, int code, const char* what) {
  auto cancelled = std::make_shared<std::atomic<bool>>(false);
  std::thread([grace, code, what, cancelled] {
    std::this_thread::sleep_for(absl::ToChronoNanoseconds(grace));
    if (cancelled->load()) return;
    std::fprintf(stderr, "pagedserve (pid %d): %s did not return within %s; exiting (code %d)\n",
                 static_cast<int>(getpid()), what, absl::FormatDuration(grace).c_str(), code);
    std::fflush(nullptr);
    _exit(code);
  }).detach();
  return cancelled;
}

}  // namespace

absl::StatusOr<LaunchInfo> InitMpi(int* argc, char*** argv) {
  MpiState& st = State();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      return absl::InternalError("MPI_Init_thread failed");
    st.initialized_here = true;
    if (provided < MPI_THREAD_FUNNELED)
      return absl::FailedPreconditionError(
          absl::StrCat("MPI provides thread level ", provided, " below MPI_THREAD_FUNNELED"));
  }
  // Errors come back as return codes (turned into absl::Status), not aborts.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  LaunchInfo info;
  MPI_Comm_rank(MPI_COMM_WORLD, &info.world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &info.world_size);
  if (info.world_size > 1) {
    // Every rank learns where the coordinator runs (workers watch its pid).
    int len = 0;
    if (info.world_rank == 0) {
      MPI_Get_processor_name(st.coordinator_host, &len);
      st.coordinator_pid = getpid();
    }
    MPI_Bcast(st.coordinator_host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
    MPI_Bcast(&st.coordinator_pid, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);
    // ... and where to open its liveness link.
    if (info.world_rank == 0) {
      absl::StatusOr<std::unique_ptr<LivenessMonitor>> m = LivenessMonitor::Start();
      if (m.ok()) {
        st.liveness = std::move(*m);
        std::snprintf(st.liveness_endpoint, sizeof(st.liveness_endpoint), "%s",
                      st.liveness->endpoint().c_str());
      } else {
        Log().warn(
            "no liveness links (workers on other hosts are watched only by the step "
            "timeout): {}",
            m.status().ToString());
      }
    }
    MPI_Bcast(st.liveness_endpoint, kLivenessEndpointBytes, MPI_CHAR, 0, MPI_COMM_WORLD);
  }
  return info;
}

void FinalizeMpi(bool abort, int exit_code) {
  MpiState& st = State();
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized || st.finalized) return;
  st.finalized = true;
  if (abort || st.failed.load()) {
    const int code = exit_code == 0 ? 1 : exit_code;
    std::fflush(nullptr);
    Log().flush();
    // The coordinator closes its liveness links first: every worker that was
    // not told to stop (e.g. blocked in an all-reduce with a lost rank) sees
    // them close and exits at once, whatever MPI_Abort and mpirun do next.
    st.liveness.reset();
    // MPI_Abort waits for the local mpirun daemon to acknowledge (PMIx_Abort);
    // after a lost host, or while mpirun is already tearing the job down
    // ("abort is already in progress"), that answer may never come.
    ExitAfter(kAbortExitGrace, code, "MPI_Abort");
    MPI_Abort(MPI_COMM_WORLD, code);
    return;
  }
  // Reached only when every rank was told to stop and acknowledged: a bound
  // for a peer that dies meanwhile, not a wait anybody should hit.
  std::shared_ptr<std::atomic<bool>> done = ExitAfter(kFinalizeExitGrace, 1, "MPI_Finalize");
  MPI_Finalize();
  done->store(true);
}

absl::Status CheckWorkerLiveness() {
  LivenessMonitor* links = State().liveness.get();
  return links != nullptr ? links->Probe() : absl::OkStatus();
}

absl::Status CheckWorldSize(const LaunchInfo& info, int tensor_parallel_size) {
  if (tensor_parallel_size < 1)
    return absl::InvalidArgumentError(
        absl::StrCat("--tensor-parallel-size must be >= 1, got ", tensor_parallel_size));
  if (info.world_size == 1 && tensor_parallel_size == 1) return absl::OkStatus();
  if (info.world_size == 1 + tensor_parallel_size) return absl::OkStatus();
  if (info.world_size == 1)
    return absl::InvalidArgumentError(absl::StrCat(
        "--tensor-parallel-size ", tensor_parallel_size, " needs one coordinator and ",
        tensor_parallel_size, " worker ranks: run under `mpirun -np ", tensor_parallel_size + 1,
        "` (started without mpirun, only TP = 1 runs in-process)"));
  return absl::InvalidArgumentError(
      absl::StrCat("mpirun started ", info.world_size, " ranks but --tensor-parallel-size ",
                   tensor_parallel_size, " needs ", tensor_parallel_size + 1,
                   " (rank 0 the coordinator, ranks 1..", tensor_parallel_size,
                   " the workers): use `mpirun -np ", tensor_parallel_size + 1,
                   "` or --tensor-parallel-size ", info.world_size - 1));
}

}  // namespace pagedserve
