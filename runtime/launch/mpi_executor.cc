#include "runtime/launch/mpi_executor.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>
#include <vector>

#include <mpi.h>

#include "absl/strings/str_cat.h"
#include "distributed/liveness.h"
#include "distributed/plan_transport.h"
#include "runtime/launch/process_state.h"

namespace pagedserve {
namespace {

using launch_internal::kAbortStepId;
using launch_internal::Log;
using launch_internal::ProcessGone;
using launch_internal::State;

// How long the coordinator tries to hand the abort plan to the workers.
constexpr absl::Duration kAbortSendTimeout = absl::Milliseconds(500);

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

class MpiExecutor final : public Executor {
 public:
  MpiExecutor(int num_workers, absl::Duration step_timeout, int64_t device_blocks,
              int64_t cpu_blocks, const std::vector<WorkerHello>& workers = {})
      : sender_(MPI_COMM_WORLD, num_workers, step_timeout),
        num_workers_(num_workers),
        step_timeout_(step_timeout),
        device_blocks_(device_blocks),
        cpu_blocks_(cpu_blocks) {
    // Workers on this host are watched directly: a dead one is an error within
    // ~20 ms instead of at the step timeout.
    // Workers on other hosts are watched through their liveness links: a dead
    // process is seen at once, a dead host or link within kLivenessTimeout.
    std::vector<int> local_ranks;
    for (const WorkerHello& h : workers)
      if (h.pid > 0 && h.host == State().coordinator_host) {
        local_workers_.push_back({h.world_rank, h.pid});
        local_ranks.push_back(h.world_rank);
      }
    if (!local_workers_.empty() || State().liveness != nullptr) {
      sender_.SetLivenessCheck([this, local_ranks]() -> absl::Status {
        for (const auto& [rank, pid] : local_workers_)
          if (ProcessGone(pid))
            return absl::UnavailableError(
                absl::StrCat("worker rank ", rank, " (pid ", pid, ") exited"));
        if (State().liveness != nullptr) return State().liveness->Probe(local_ranks);
        return absl::OkStatus();
      });
    }
  }

  ~MpiExecutor() override {
    if (failed_ && !abort_sent_) SendAbortPlan();
    if (!shut_down_ && !failed_) {
      // Not shut down by the owner: stop the workers anyway (no hang at exit).
      Abort(absl::CancelledError("executor destroyed without Shutdown")).IgnoreError();
    }
  }

  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    if (failed_)
      return absl::FailedPreconditionError(
          absl::StrCat("MPI executor failed earlier: ", error_.message()));
    if (shut_down_) return absl::FailedPreconditionError("MPI executor is shut down");
    if (plan.shutdown) return absl::InvalidArgumentError("use Shutdown() to stop the workers");
    const auto t0 = std::chrono::steady_clock::now();
    if (auto s = sender_.Send(plan); !s.ok()) return Fail(s);
    const auto t1 = std::chrono::steady_clock::now();
    absl::StatusOr<StepResult> result = sender_.Receive();
    if (!result.ok()) return Fail(result.status());
    if (result->step_id != plan.step_id)
      return Fail(absl::InternalError(absl::StrCat("result for step ", result->step_id,
                                                   " while waiting for step ", plan.step_id)));
    const auto t2 = std::chrono::steady_clock::now();
    ++stats_.steps;
    stats_.send_seconds += Seconds(t1 - t0);
    stats_.wait_seconds += Seconds(t2 - t1);
    stats_.worker_forward_seconds += result->forward_seconds;
    stats_.worker_collective_seconds += result->collective_seconds;
    return result;
  }

  absl::Status Shutdown() override {
    if (shut_down_) return absl::OkStatus();
    if (failed_) return error_;
    StepPlan plan;
    plan.step_id = kShutdownStepId;
    plan.shutdown = true;
    if (State().liveness != nullptr) State().liveness->ExpectExits();
    if (auto s = sender_.Send(plan); !s.ok()) return Abort(s);
    // Every worker acknowledges: a missing one is dead or stuck.
    for (int i = 0; i < num_workers_; ++i) {
      absl::StatusOr<StepResult> ack = sender_.Receive();
      if (!ack.ok())
        return Abort(absl::Status(ack.status().code(),
                                  absl::StrCat("shutdown: ", i, " of ", num_workers_,
                                               " workers acknowledged; ", ack.status().message())));
    }
    shut_down_ = true;
    Log().info("all {} worker ranks stopped", num_workers_);
    return absl::OkStatus();
  }

  int64_t num_device_blocks() const override { return device_blocks_; }
  int64_t num_cpu_blocks() const override { return cpu_blocks_; }
  const MpiExecutorStats& stats() const { return stats_; }

  // Marks the executor and the process failed and tells every worker to exit
  // non-zero (best effort: a dead or stuck worker is stopped by mpirun once
  // FinalizeMpi aborts the job).
  absl::Status Abort(absl::Status error) {
    Fail(error).IgnoreError();
    SendAbortPlan();
    return error;
  }

  // A failed step: marks the executor and the process failed and returns the
  // error at once, so that the engine fails its requests before anything else
  // (mpirun may kill this process within a second of a rank's death). The
  // abort plan follows in the destructor.
  absl::Status Fail(absl::Status error) {
    failed_ = true;
    error_ = error;
    State().failed.store(true);
    Log().error("worker ranks failed: {}", error.ToString());
    if (State().liveness != nullptr) State().liveness->ExpectExits();
    return error;
  }

  // Best effort, after the clients were told (the engine failed its requests
  // and the front ends sent the replies before the executor is destroyed):
  // the liveness check is off here, since a known loss would stop the plan
  // from reaching the ranks that are still alive.
  void SendAbortPlan() {
    abort_sent_ = true;
    sender_.SetLivenessCheck({});
    StepPlan abort;
    abort.step_id = kAbortStepId;
    abort.shutdown = true;
    // Not to ranks known dead: MPI would try to reconnect to them, which can
    // block this process (seen: "failed to TCP connect to a peer", then the
    // coordinator stuck until mpirun's SIGKILL 6 s later) or abort it.
    std::vector<int> gone;
    if (State().liveness != nullptr) gone = State().liveness->Gone();
    for (const auto& [rank, pid] : local_workers_)
      if (ProcessGone(pid)) gone.push_back(rank);
    sender_.Send(abort, kAbortSendTimeout, gone).IgnoreError();
  }

 private:
  static constexpr uint64_t kShutdownStepId = kAbortStepId - 1;
  PlanSender sender_;
  int num_workers_;
  absl::Duration step_timeout_;
  int64_t device_blocks_;
  int64_t cpu_blocks_;
  bool shut_down_ = false;
  bool failed_ = false;
  bool abort_sent_ = false;
  absl::Status error_;
  MpiExecutorStats stats_;
  std::vector<std::pair<int, int64_t>> local_workers_;  // (world rank, pid) on this host
};

}  // namespace

absl::StatusOr<std::unique_ptr<Executor>> MakeMpiExecutor(const LaunchInfo& info,
                                                          int32_t block_size,
                                                          absl::Duration startup_timeout,
                                                          absl::Duration step_timeout) {
  if (!info.coordinator() || info.world_size < 2)
    return absl::FailedPreconditionError(
        absl::StrCat("MakeMpiExecutor needs world rank 0 of at least 2 ranks (rank ",
                     info.world_rank, " of ", info.world_size, ")"));
  const int num_workers = info.world_size - 1;
  PlanSender sender(MPI_COMM_WORLD, num_workers, step_timeout);
  absl::StatusOr<std::vector<WorkerHello>> hellos = sender.GatherHellos(startup_timeout);
  if (!hellos.ok()) {
    // Tell every worker (those that are set up wait for plans) to exit.
    MpiExecutor failed(num_workers, step_timeout, 0, 0);
    return failed.Abort(hellos.status());
  }
  int64_t device_blocks = std::numeric_limits<int64_t>::max();
  int64_t cpu_blocks = std::numeric_limits<int64_t>::max();
  for (const WorkerHello& h : *hellos) {
    Log().info("worker rank {} (pid {} on {}): {} KV blocks, {} swap blocks", h.world_rank, h.pid,
               h.host, h.num_device_blocks, h.num_cpu_blocks);
    device_blocks = std::min(device_blocks, h.num_device_blocks);
    cpu_blocks = std::min(cpu_blocks, h.num_cpu_blocks);
    if (h.block_size != block_size) {
      MpiExecutor failed(num_workers, step_timeout, 0, 0);
      return failed.Abort(absl::FailedPreconditionError(
          absl::StrCat("worker rank ", h.world_rank, " runs with --block-size ", h.block_size,
                       " but the coordinator with ", block_size,
                       ": step plans carry block tables whose slots depend on it")));
    }
  }
  Log().info(
      "KV capacity (minimum over {} worker ranks): {} blocks x {} tokens = {} tokens; swap {} "
      "blocks = {} tokens",
      num_workers, device_blocks, block_size, device_blocks * block_size, cpu_blocks,
      cpu_blocks * block_size);
  return std::unique_ptr<Executor>(
      new MpiExecutor(num_workers, step_timeout, device_blocks, cpu_blocks, *hellos));
}

absl::StatusOr<MpiExecutorStats> GetMpiExecutorStats(const Executor& executor) {
  const auto* mpi = dynamic_cast<const MpiExecutor*>(&executor);
  if (mpi == nullptr) return absl::NotFoundError("not an MPI executor");
  return mpi->stats();
}

}  // namespace pagedserve
