#include "runtime/launch/local_executor.h"

#include <utility>

#include "absl/status/status.h"
#include "runtime/launch/worker_device.h"

namespace pagedserve {
namespace {

class LocalExecutor : public Executor {
 public:
  LocalExecutor(std::unique_ptr<Worker> worker, std::unique_ptr<Communicator> comm)
      : comm_(std::move(comm)), worker_(std::move(worker)) {}
  ~LocalExecutor() override {
    worker_.reset();  // before the communicator it uses
    comm_.reset();
  }

  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    if (shut_down_) return absl::FailedPreconditionError("the local executor has been shut down");
    return worker_->Execute(plan);
  }
  absl::Status Shutdown() override {
    shut_down_ = true;
    return absl::OkStatus();
  }
  int64_t num_device_blocks() const override { return worker_->num_device_blocks(); }
  int64_t num_cpu_blocks() const override { return worker_->num_cpu_blocks(); }

 private:
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Worker> worker_;
  bool shut_down_ = false;
};

}  // namespace

std::unique_ptr<Executor> MakeLocalExecutor(std::unique_ptr<Worker> worker) {
  return std::make_unique<LocalExecutor>(std::move(worker), nullptr);
}

std::unique_ptr<Executor> MakeLocalExecutor(std::unique_ptr<Worker> worker,
                                            std::unique_ptr<Communicator> comm) {
  return std::make_unique<LocalExecutor>(std::move(worker), std::move(comm));
}

absl::StatusOr<std::unique_ptr<Executor>> CreateLocalExecutor(const WorkerOptions& options) {
  if (options.device == kernels::Device::kCPU) launch_internal::WarnOfCudaOnlyFlags(options);
  std::unique_ptr<Communicator> comm = MakeSingleRankCommunicator();
  absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Create(options, comm.get());
  if (!worker.ok()) return worker.status();
  return MakeLocalExecutor(*std::move(worker), std::move(comm));
}

}  // namespace pagedserve
