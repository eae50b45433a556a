// Moving step plans and step results between the coordinator (world rank 0)
// and the worker ranks (world ranks 1..TP) over MPI point-to-point messages.
//
// Point-to-point sends with deadlines are used instead of MPI_Bcast so that a
// dead or stuck worker turns into a DeadlineExceeded error on the coordinator
// rather than a hang. Waiting polls MPI_Test with a short sleep, so an idle
// rank does not spin a core (this matters when ranks share few cores).
#ifndef PAGEDSERVE_DISTRIBUTED_PLAN_TRANSPORT_H_
#define PAGEDSERVE_DISTRIBUTED_PLAN_TRANSPORT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <mpi.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/common/step_plan.h"

namespace pagedserve {

// What a worker reports once its model and KV pools are set up.
struct WorkerHello {
  int32_t world_rank = 0;
  bool ok = false;
  std::string error;              // why setup failed when !ok
  int64_t num_device_blocks = 0;  // KV blocks that fit this rank's budget
  int64_t num_cpu_blocks = 0;     // swap blocks that fit --swap-space
  int32_t block_size = 0;         // tokens per block (for the capacity log)
  int64_t pid = 0;                // the worker's process id on `host`
  std::string host;               // MPI_Get_processor_name of the worker
};

// Coordinator side (world rank 0).
class PlanSender {
 public:
  // `num_workers` = world size - 1. `timeout` bounds every wait for a worker.
  PlanSender(MPI_Comm world, int num_workers, absl::Duration timeout);
  // Buffers of abandoned sends are leaked on purpose (MPI may still read them).
  ~PlanSender();
  PlanSender(const PlanSender&) = delete;
  PlanSender& operator=(const PlanSender&) = delete;

  // Called about every 20 ms while Send / Receive wait; a non-OK status ends
  // the wait with that error (e.g. "worker rank 2 (pid 123) exited"), so a
  // dead worker is noticed before the timeout where it can be observed. Send
  // also runs it before posting its sends. An empty check turns it off.
  using LivenessCheck = std::function<absl::Status()>;
  void SetLivenessCheck(LivenessCheck check) { liveness_ = std::move(check); }

  // Collects one WorkerHello per worker (within `timeout`); error if any worker
  // failed setup (its message is included) or did not answer.
  absl::StatusOr<std::vector<WorkerHello>> GatherHellos(absl::Duration timeout);

  // Sends the plan to every worker; DeadlineExceeded if a send does not finish
  // within the constructor's timeout (or `timeout`). A send given up on stays
  // posted: its bytes are kept alive until the sender is destroyed. The
  // liveness check runs once before anything is posted (its error is returned
  // and nothing is sent): with OpenMPI 4.1 a send to a dead peer can block or
  // abort this process, so a worker known to be lost must not be sent to.
  absl::Status Send(const StepPlan& plan);
  // As Send, to every worker but the world ranks in `skip` (e.g. dead ones:
  // a send to a dead peer can block or abort this process in OpenMPI 4.1).
  absl::Status Send(const StepPlan& plan, absl::Duration timeout,
                    const std::vector<int>& skip = {});

  // Waits for the result of the last plan from the TP rank 0 worker (world
  // rank 1). DeadlineExceeded after the timeout; Internal if a worker reported
  // an error instead of a result.
  absl::StatusOr<StepResult> Receive();

 private:
  MPI_Comm world_;
  int num_workers_;
  absl::Duration timeout_;
  std::vector<std::string> abandoned_;  // buffers of sends that timed out
  LivenessCheck liveness_;
};

// Worker side (world ranks 1..TP).
class PlanReceiver {
 public:
  explicit PlanReceiver(MPI_Comm world);

  absl::Status SendHello(const WorkerHello& hello);

  // Blocks (polling, without spinning) until the next plan arrives.
  absl::StatusOr<StepPlan> Receive();

  // TP rank 0 sends the result of the plan it just ran.
  absl::Status SendResult(const StepResult& result);
  // Any worker reports a failure of a step (the coordinator fails the step).
  absl::Status SendError(const std::string& message);

 private:
  MPI_Comm world_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_DISTRIBUTED_PLAN_TRANSPORT_H_
