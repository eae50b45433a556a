#include "distributed/communicator.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace pagedserve {
namespace {

class ScopedTimer {
 public:
  explicit ScopedTimer(double* acc) : acc_(acc), start_(std::chrono::steady_clock::now()) {}
  ~ScopedTimer() {
    *acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  double* acc_;
  std::chrono::steady_clock::time_point start_;
};

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "single"; }
  absl::Status AllReduceSum(float*, size_t) override { return absl::OkStatus(); }
  absl::Status AllGather(const float* in, float* out, size_t count) override {
    std::memcpy(out, in, count * sizeof(float));
    return absl::OkStatus();
  }
};

absl::Status MpiError(int code, const char* what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, msg, &len);
  return absl::InternalError(absl::StrCat(what, " failed: ", std::string(msg, len)));
}

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  absl::Status AllReduceSum(float* data, size_t count) override {
    ScopedTimer t(&collective_seconds_);
    // MPI counts are int: reduce in chunks for very large buffers.
    for (size_t off = 0; off < count; off += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, count - off));
      int rc = MPI_Allreduce(MPI_IN_PLACE, data + off, n, MPI_FLOAT, MPI_SUM, comm_);
      if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allreduce");
    }
    return absl::OkStatus();
  }

  absl::Status AllGather(const float* in, float* out, size_t count) override {
    ScopedTimer t(&collective_seconds_);
    if (count > static_cast<size_t>(INT_MAX))
      return absl::InvalidArgumentError(
          absl::StrCat("AllGather count ", count, " exceeds INT_MAX"));
    int rc = MPI_Allgather(in, static_cast<int>(count), MPI_FLOAT, out, static_cast<int>(count),
                           MPI_FLOAT, comm_);
    if (rc != MPI_SUCCESS) return MpiError(rc, "MPI_Allgather");
    return absl::OkStatus();
  }

 private:
  static constexpr size_t kMaxChunk = size_t{1} << 30;
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> MakeSingleRankCommunicator() {
  return std::make_unique<SingleRankCommunicator>();
}

std::unique_ptr<Communicator> MakeMpiCommunicator(MPI_Comm comm) {
  return std::make_unique<MpiCommunicator>(comm);
}

#ifndef PAGEDSERVE_WITH_CUDA
absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(MPI_Comm, int) {
  return absl::FailedPreconditionError("NCCL communicator: built without CUDA");
}
#endif

}  // namespace pagedserve
