#include "distributed/plan_transport.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "distributed/step_plan_codec.h"
#include "distributed/wire.h"
#include "runtime/common/status_macros.h"

namespace pagedserve {
namespace {

constexpr int kTagHello = 101;
constexpr int kTagPlan = 102;
constexpr int kTagResult = 103;
constexpr int kTagError = 104;

// How often a wait runs the liveness check.
constexpr absl::Duration kLivenessPeriod = absl::Milliseconds(20);

// Waits for `req` to complete, sleeping between polls (starting at 20 us and
// backing off to 1 ms). Returns OK when done; DeadlineExceeded (no message) at
// the deadline, or the liveness check's error; the request is then released
// (MPI cannot cancel a send: the caller keeps its buffer alive).
absl::Status WaitRequest(MPI_Request* req, MPI_Status* status, absl::Time deadline,
                         const PlanSender::LivenessCheck* check = nullptr) {
  auto sleep = std::chrono::microseconds(20);
  absl::Time next_check = absl::Now() + kLivenessPeriod;
  while (true) {
    int done = 0;
    MPI_Test(req, &done, status);
    if (done) return absl::OkStatus();
    absl::Time now = absl::Now();
    absl::Status failure;
    if (check != nullptr && *check && now >= next_check) {
      failure = (*check)();
      next_check = now + kLivenessPeriod;
    }
    if (!failure.ok() || now >= deadline) {
      MPI_Cancel(req);
      MPI_Request_free(req);
      return failure.ok() ? absl::DeadlineExceededError("") : failure;
    }
    std::this_thread::sleep_for(sleep);
    if (sleep < std::chrono::milliseconds(1)) sleep *= 2;
  }
}

// Probes without spinning for a message from `source` with `tag`; same
// outcomes as WaitRequest.
absl::Status WaitProbe(MPI_Comm comm, int source, int tag, MPI_Status* status, absl::Time deadline,
                       const PlanSender::LivenessCheck* check = nullptr) {
  auto sleep = std::chrono::microseconds(20);
  absl::Time next_check = absl::Now() + kLivenessPeriod;
  while (true) {
    int flag = 0;
    MPI_Iprobe(source, tag, comm, &flag, status);
    if (flag) return absl::OkStatus();
    absl::Time now = absl::Now();
    if (check != nullptr && *check && now >= next_check) {
      if (absl::Status failure = (*check)(); !failure.ok()) return failure;
      next_check = now + kLivenessPeriod;
    }
    if (now >= deadline) return absl::DeadlineExceededError("");
    std::this_thread::sleep_for(sleep);
    if (sleep < std::chrono::milliseconds(1)) sleep *= 2;
  }
}

// A wait's error: the liveness failure as is, a deadline with `what`.
absl::Status WaitError(const absl::Status& s, const std::string& what) {
  if (absl::IsDeadlineExceeded(s) && s.message().empty()) return absl::DeadlineExceededError(what);
  return s;
}

absl::StatusOr<std::string> RecvBytes(MPI_Comm comm, const MPI_Status& probed) {
  int count = 0;
  MPI_Get_count(&probed, MPI_BYTE, &count);
  std::string buf(static_cast<size_t>(count), '\0');
  MPI_Status st;
  int rc = MPI_Recv(buf.data(), count, MPI_BYTE, probed.MPI_SOURCE, probed.MPI_TAG, comm, &st);
  if (rc != MPI_SUCCESS) return absl::InternalError("MPI_Recv failed");
  return buf;
}

std::string EncodeHello(const WorkerHello& h) {
  wire::Writer w;
  w.Put<int32_t>(h.world_rank);
  w.Put<uint8_t>(h.ok);
  w.PutString(h.error);
  w.Put<int64_t>(h.num_device_blocks);
  w.Put<int64_t>(h.num_cpu_blocks);
  w.Put<int32_t>(h.block_size);
  w.Put<int64_t>(h.pid);
  w.PutString(h.host);
  return std::move(w.buffer());
}

absl::StatusOr<WorkerHello> DecodeHello(std::string_view bytes) {
  wire::Reader r(bytes);
  WorkerHello h;
  uint8_t ok = 0;
  PS_RETURN_IF_ERROR(r.Get(&h.world_rank, "hello.world_rank"));
  PS_RETURN_IF_ERROR(r.Get(&ok, "hello.ok"));
  PS_RETURN_IF_ERROR(r.GetString(&h.error, "hello.error"));
  PS_RETURN_IF_ERROR(r.Get(&h.num_device_blocks, "hello.num_device_blocks"));
  PS_RETURN_IF_ERROR(r.Get(&h.num_cpu_blocks, "hello.num_cpu_blocks"));
  PS_RETURN_IF_ERROR(r.Get(&h.block_size, "hello.block_size"));
  PS_RETURN_IF_ERROR(r.Get(&h.pid, "hello.pid"));
  PS_RETURN_IF_ERROR(r.GetString(&h.host, "hello.host"));
  if (!r.done()) return absl::DataLossError("worker hello: trailing bytes after 'host'");
  h.ok = ok != 0;
  return h;
}

absl::Status SendBytes(MPI_Comm comm, int dest, int tag, const std::string& bytes,
                       absl::Time deadline) {
  if (bytes.size() > static_cast<size_t>(INT_MAX))
    return absl::InvalidArgumentError("message larger than 2 GiB");
  MPI_Request req;
  MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, dest, tag, comm, &req);
  MPI_Status st;
  if (absl::Status s = WaitRequest(&req, &st, deadline); !s.ok())
    return WaitError(s, absl::StrCat("sending to rank ", dest, " timed out"));
  return absl::OkStatus();
}

}  // namespace

PlanSender::PlanSender(MPI_Comm world, int num_workers, absl::Duration timeout)
    : world_(world), num_workers_(num_workers), timeout_(timeout) {}

PlanSender::~PlanSender() {
  if (!abandoned_.empty()) new std::vector<std::string>(std::move(abandoned_));
}

absl::StatusOr<std::vector<WorkerHello>> PlanSender::GatherHellos(absl::Duration timeout) {
  std::vector<WorkerHello> hellos;
  absl::Time deadline = absl::Now() + timeout;
  for (int r = 1; r <= num_workers_; ++r) {
    MPI_Status st;
    if (absl::Status s = WaitProbe(world_, r, kTagHello, &st, deadline); !s.ok())
      return WaitError(s, absl::StrCat("worker rank ", r, " did not report within ",
                                       absl::FormatDuration(timeout)));
    PS_ASSIGN_OR_RETURN(std::string bytes, RecvBytes(world_, st));
    PS_ASSIGN_OR_RETURN(WorkerHello h, DecodeHello(bytes));
    if (!h.ok) return absl::FailedPreconditionError(absl::StrCat("worker rank ", r, ": ", h.error));
    hellos.push_back(std::move(h));
  }
  return hellos;
}

absl::Status PlanSender::Send(const StepPlan& plan) { return Send(plan, timeout_); }

absl::Status PlanSender::Send(const StepPlan& plan, absl::Duration timeout,
                              const std::vector<int>& skip) {
  std::string bytes = EncodeStepPlan(plan);
  if (bytes.size() > static_cast<size_t>(INT_MAX))
    return absl::InvalidArgumentError(
        absl::StrCat("step plan ", plan.step_id, " is larger than 2 GiB"));
  // Liveness first: a send to a dead worker can block or abort this process
  // (see LivenessMonitor::Probe), so a loss already visible must end the step
  // here, before MPI is asked to send anything.
  if (liveness_) PS_RETURN_IF_ERROR(liveness_());
  absl::Time deadline = absl::Now() + timeout;
  std::vector<MPI_Request> reqs(num_workers_, MPI_REQUEST_NULL);
  for (int r = 1; r <= num_workers_; ++r)
    if (std::find(skip.begin(), skip.end(), r) == skip.end())
      MPI_Isend(bytes.data(), static_cast<int>(bytes.size()), MPI_BYTE, r, kTagPlan, world_,
                &reqs[r - 1]);
  for (int r = 1; r <= num_workers_; ++r) {
    if (reqs[r - 1] == MPI_REQUEST_NULL) continue;  // skipped
    MPI_Status st;
    if (absl::Status s = WaitRequest(&reqs[r - 1], &st, deadline, &liveness_); !s.ok()) {
      // MPI cannot cancel a send reliably: release the other pending requests
      // too and keep the buffer alive, since MPI may still read it.
      for (int q = r + 1; q <= num_workers_; ++q)
        if (reqs[q - 1] != MPI_REQUEST_NULL) MPI_Request_free(&reqs[q - 1]);
      abandoned_.push_back(std::move(bytes));
      return WaitError(s, absl::StrCat("worker rank ", r, " did not take step plan ", plan.step_id,
                                       " within ", absl::FormatDuration(timeout)));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> PlanSender::Receive() {
  absl::Time deadline = absl::Now() + timeout_;
  MPI_Status st;
  // A result comes from TP rank 0 (world rank 1); an error from any worker.
  if (absl::Status s = WaitProbe(world_, MPI_ANY_SOURCE, MPI_ANY_TAG, &st, deadline, &liveness_);
      !s.ok())
    return WaitError(
        s, absl::StrCat("no step result from the workers within ", absl::FormatDuration(timeout_)));
  PS_ASSIGN_OR_RETURN(std::string bytes, RecvBytes(world_, st));
  if (st.MPI_TAG == kTagError)
    return absl::InternalError(absl::StrCat("worker rank ", st.MPI_SOURCE, ": ", bytes));
  if (st.MPI_TAG != kTagResult)
    return absl::InternalError(
        absl::StrCat("unexpected message tag ", st.MPI_TAG, " from rank ", st.MPI_SOURCE));
  return DecodeStepResult(bytes);
}

PlanReceiver::PlanReceiver(MPI_Comm world) : world_(world) {}

absl::Status PlanReceiver::SendHello(const WorkerHello& hello) {
  return SendBytes(world_, 0, kTagHello, EncodeHello(hello), absl::InfiniteFuture());
}

absl::StatusOr<StepPlan> PlanReceiver::Receive() {
  MPI_Status st;
  WaitProbe(world_, 0, kTagPlan, &st, absl::InfiniteFuture()).IgnoreError();
  PS_ASSIGN_OR_RETURN(std::string bytes, RecvBytes(world_, st));
  return DecodeStepPlan(bytes);
}

absl::Status PlanReceiver::SendResult(const StepResult& result) {
  return SendBytes(world_, 0, kTagResult, EncodeStepResult(result), absl::InfiniteFuture());
}

absl::Status PlanReceiver::SendError(const std::string& message) {
  return SendBytes(world_, 0, kTagError, message, absl::InfiniteFuture());
}

}  // namespace pagedserve
