#include "runtime/launch/worker_rank.h"

#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <utility>

#include <mpi.h>

#include "absl/strings/str_cat.h"
#include "distributed/communicator.h"
#include "distributed/liveness.h"
#include "distributed/plan_transport.h"
#include "runtime/common/status_macros.h"
#include "runtime/launch/process_state.h"
#include "runtime/launch/worker_device.h"
#include "runtime/launch/worker_watchdog.h"

namespace pagedserve {
namespace {

using launch_internal::ChooseWorkerDevice;
using launch_internal::kAbortStepId;
using launch_internal::LocalCudaDevice;
using launch_internal::Log;
using launch_internal::State;
using launch_internal::WarnOfCudaOnlyFlags;
using launch_internal::Watchdog;

// The TP group: every world rank but the coordinator, in world-rank order.
// MPI_Comm_create_group is collective only over the members, so the
// coordinator takes no part.
absl::StatusOr<MPI_Comm> MakeWorkerComm(const LaunchInfo& info) {
  MPI_Group world_group, worker_group;
  MPI_Comm_group(MPI_COMM_WORLD, &world_group);
  int range[1][3] = {{1, info.world_size - 1, 1}};
  MPI_Group_range_incl(world_group, 1, range, &worker_group);
  MPI_Comm comm = MPI_COMM_NULL;
  int rc = MPI_Comm_create_group(MPI_COMM_WORLD, worker_group, /*tag=*/7, &comm);
  MPI_Group_free(&worker_group);
  MPI_Group_free(&world_group);
  if (rc != MPI_SUCCESS || comm == MPI_COMM_NULL)
    return absl::InternalError("MPI_Comm_create_group for the worker ranks failed");
  MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
  return comm;
}

// One worker rank after MPI start-up, in the order RunWorkerRank calls its
// phases: SetUp (TP group, device, communicator, model shard), ConnectLiveness
// (the link to the coordinator), Report (the hello), then ServePlans until a
// shutdown plan. Members are destroyed in reverse order: the beacon first,
// then the worker, then the communicator it uses.
class WorkerRank {
 public:
  WorkerRank(const LaunchInfo& info, const WorkerOptions& options, const char* host,
             Watchdog* watchdog)
      : info_(info), options_(options), host_(host), watchdog_(watchdog) {}

  // Collective over the worker ranks (every one must enter it): the TP
  // communicator (NCCL on CUDA when every rank chose CUDA, else MPI) and the
  // shard (Worker::Create).
  absl::Status SetUp() {
    PS_ASSIGN_OR_RETURN(MPI_Comm tp_comm, MakeWorkerComm(info_));
    std::string why;
    PS_ASSIGN_OR_RETURN(kernels::Device device, ChooseWorkerDevice(options_, &why));
    // Every rank of the TP group must take the same path (the NCCL setup is
    // collective): CUDA only when all ranks chose it.
    const int want_cuda = device == kernels::Device::kCUDA ? 1 : 0;
    int all_cuda = 0;
    if (MPI_Allreduce(&want_cuda, &all_cuda, 1, MPI_INT, MPI_MIN, tp_comm) != MPI_SUCCESS)
      return absl::InternalError("MPI_Allreduce of the worker device choice failed");
    if (want_cuda && !all_cuda) {
      device = kernels::Device::kCPU;
      why = "another worker rank has no CUDA device";
    }
    WorkerOptions o = options_;
    o.device = device;
    if (device == kernels::Device::kCUDA) {
      // Activations and KV pools in device memory: NCCL collectives.
      PS_ASSIGN_OR_RETURN(o.cuda_device, LocalCudaDevice(tp_comm));
      PS_ASSIGN_OR_RETURN(comm_, MakeNcclCommunicator(tp_comm, o.cuda_device));
      Log().info("worker rank {}: CUDA device {} ({}), NCCL collectives", info_.world_rank,
                 o.cuda_device, why);
    } else {
      // Host memory: MPI collectives.
      comm_ = MakeMpiCommunicator(tp_comm);
      Log().info("worker rank {}: CPU ({}), MPI collectives", info_.world_rank, why);
      if (comm_->rank() == 0) WarnOfCudaOnlyFlags(o);
    }
    PS_ASSIGN_OR_RETURN(worker_, Worker::Create(o, comm_.get()));
    return absl::OkStatus();
  }

  // The liveness link to the coordinator (after the collective setup above,
  // which every worker must enter): without it a lost coordinator or a
  // partitioned host would leave this rank waiting forever. OK without an
  // endpoint (the coordinator's monitor did not start).
  absl::Status ConnectLiveness() {
    if (State().liveness_endpoint[0] == '\0') return absl::OkStatus();
    absl::StatusOr<std::unique_ptr<LivenessBeacon>> b =
        LivenessBeacon::Connect(State().liveness_endpoint, info_.world_rank);
    if (!b.ok()) return b.status();
    beacon_ = std::move(*b);
    return absl::OkStatus();
  }

  // Tells the coordinator this rank's block counts, or why `setup` failed.
  // The error of the send, if any (logged here).
  absl::Status Report(const absl::Status& setup) {
    tp_rank_ = comm_ ? comm_->rank() : info_.world_rank - 1;
    WorkerHello hello;
    hello.world_rank = info_.world_rank;
    hello.block_size = options_.block_size;
    hello.pid = getpid();
    hello.host = host_;
    if (setup.ok()) {
      hello.ok = true;
      hello.num_device_blocks = worker_->num_device_blocks();
      hello.num_cpu_blocks = worker_->num_cpu_blocks();
      Log().info(
          "worker rank {} (TP rank {} of {}, pid {}): {} KV blocks, {} swap blocks, {} "
          "bytes/block",
          info_.world_rank, tp_rank_, info_.world_size - 1, getpid(), hello.num_device_blocks,
          hello.num_cpu_blocks, worker_->bytes_per_block());
    } else {
      hello.ok = false;
      hello.error = std::string(setup.message());
      Log().error("worker rank {}: setup failed: {}", info_.world_rank, setup.ToString());
    }
    if (auto s = receiver_.SendHello(hello); !s.ok()) {
      Log().error("worker rank {}: cannot report to the coordinator: {}", info_.world_rank,
                  s.ToString());
      return s;
    }
    return absl::OkStatus();
  }

  // Runs plans until a shutdown plan; returns the rank's exit code. `broken`:
  // the setup status; once not OK, every step plan is refused.
  int ServePlans(absl::Status broken) {
    while (true) {
      absl::StatusOr<StepPlan> plan = receiver_.Receive();
      watchdog_->Progress();
      if (!plan.ok()) {
        Log().error("worker rank {}: bad step plan: {}", info_.world_rank,
                    plan.status().ToString());
        if (broken.ok()) broken = plan.status();
        receiver_.SendError(std::string(plan.status().message())).IgnoreError();
        continue;
      }
      if (plan->shutdown) return Stop(*plan, broken);
      if (!broken.ok()) {
        receiver_
            .SendError(absl::StrCat("step ", plan->step_id, " refused: rank ", info_.world_rank,
                                    " failed earlier: ", broken.message()))
            .IgnoreError();
        continue;
      }
      if (absl::Status s = RunStep(*plan); !s.ok()) broken = s;
    }
  }

 private:
  // Runs one plan; TP rank 0 sends the result. Returns the error that breaks
  // this rank (already reported to the coordinator when the step failed).
  absl::Status RunStep(const StepPlan& plan) {
    absl::StatusOr<StepResult> result = worker_->Execute(plan);
    watchdog_->Progress();
    if (!result.ok()) {
      Log().error("worker rank {}: step {} failed: {}", info_.world_rank, plan.step_id,
                  result.status().ToString());
      receiver_
          .SendError(absl::StrCat("rank ", info_.world_rank, " step ", plan.step_id, ": ",
                                  result.status().message()))
          .IgnoreError();
      return result.status();
    }
    if (tp_rank_ == 0) {
      if (auto s = receiver_.SendResult(*result); !s.ok()) {
        Log().error("worker rank {}: cannot send the result: {}", info_.world_rank, s.ToString());
        return s;
      }
    }
    return absl::OkStatus();
  }

  // A shutdown plan: acknowledged unless it is the coordinator's abort plan.
  // Exit code 0 after a clean shutdown, 1 after an abort or an earlier failure
  // of this rank (which also makes FinalizeMpi abort).
  int Stop(const StepPlan& plan, const absl::Status& broken) {
    if (beacon_) beacon_->Stop();
    const bool aborted = plan.step_id == kAbortStepId;
    if (!aborted) {
      StepResult ack;
      ack.step_id = plan.step_id;
      receiver_.SendResult(ack).IgnoreError();
    }
    if (aborted || !broken.ok()) {
      Log().info("worker rank {}: stopped by the coordinator after a failure", info_.world_rank);
      State().failed.store(true);
      return 1;
    }
    return 0;
  }

  const LaunchInfo info_;
  const WorkerOptions& options_;
  const std::string host_;
  Watchdog* const watchdog_;
  PlanReceiver receiver_{MPI_COMM_WORLD};
  int tp_rank_ = 0;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<LivenessBeacon> beacon_;
};

}  // namespace

int RunWorkerRank(const LaunchInfo& info, const WorkerOptions& options) {
  if (info.coordinator() || info.world_size < 2) {
    Log().error("RunWorkerRank called on rank {} of {}", info.world_rank, info.world_size);
    return 2;
  }
  launch_internal::InstallWorkerSignals();
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  int host_len = 0;
  MPI_Get_processor_name(host, &host_len);
  const bool same_host = std::strncmp(host, State().coordinator_host, MPI_MAX_PROCESSOR_NAME) == 0;
  Watchdog watchdog(kDefaultStepTimeout, same_host);

  WorkerRank rank(info, options, host, &watchdog);
  absl::Status setup = rank.SetUp();
  if (setup.ok()) setup = rank.ConnectLiveness();
  if (!rank.Report(setup).ok()) {
    State().failed.store(true);
    return 1;
  }
  watchdog.Progress();
  return rank.ServePlans(setup);
}

}  // namespace pagedserve
