// NCCL implementation of Communicator (built only with the CUDA backend).
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "distributed/communicator.h"
#include "kernels/cuda/cuda_status.h"
#include "runtime/common/status_macros.h"

namespace pagedserve {
namespace {

absl::Status NcclStatus(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " failed: ", ncclGetErrorString(r)));
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, cudaStream_t stream, int rank, int size)
      : comm_(comm), stream_(stream), rank_(rank), size_(size) {}
  ~NcclCommunicator() override {
    if (!aborted_) ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }

  absl::Status AllReduceSum(float* data, size_t count) override {
    PS_RETURN_IF_ERROR(error_);
    auto start = std::chrono::steady_clock::now();
    absl::Status s = NcclStatus(
        ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
    if (s.ok()) s = CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    collective_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return s;
  }

  // Only the enqueue is timed (collective_seconds): the collective itself
  // overlaps with the stream's other work.
  absl::Status AllReduceSumAsync(void* data, size_t count, ReduceType type, void* stream) override {
    PS_RETURN_IF_ERROR(error_);
    const ncclDataType_t t = type == ReduceType::kFloat16    ? ncclFloat16
                             : type == ReduceType::kBFloat16 ? ncclBfloat16
                                                             : ncclFloat32;
    auto start = std::chrono::steady_clock::now();
    absl::Status s = NcclStatus(
        ncclAllReduce(data, data, count, t, ncclSum, comm_, static_cast<cudaStream_t>(stream)),
        "ncclAllReduce");
    collective_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return s;
  }

  absl::Status CheckAsyncError() override {
    if (!error_.ok()) return error_;
    ncclResult_t r = ncclSuccess;
    absl::Status s = NcclStatus(ncclCommGetAsyncError(comm_, &r), "ncclCommGetAsyncError");
    if (s.ok() && (r == ncclSuccess || r == ncclInProgress)) return absl::OkStatus();
    if (s.ok()) s = NcclStatus(r, "NCCL communicator (asynchronous error)");
    ncclCommAbort(comm_);
    aborted_ = true;
    error_ = absl::UnavailableError(absl::StrCat(
        s.message(), "; the communicator was aborted (a peer rank died or its link failed?)"));
    return error_;
  }

  absl::Status AllGather(const float* in, float* out, size_t count) override {
    PS_RETURN_IF_ERROR(error_);
    auto start = std::chrono::steady_clock::now();
    absl::Status s =
        NcclStatus(ncclAllGather(in, out, count, ncclFloat32, comm_, stream_), "ncclAllGather");
    if (s.ok()) s = CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    collective_seconds_ +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return s;
  }

 private:
  ncclComm_t comm_;
  cudaStream_t stream_;
  absl::Status error_;  // set once by CheckAsyncError
  bool aborted_ = false;
  int rank_;
  int size_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(MPI_Comm comm, int device) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (auto s = CudaStatus(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
  ncclUniqueId id;
  if (rank == 0) {
    if (auto s = NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) return s;
  }
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, comm);
  ncclComm_t nccl = nullptr;
  if (auto s = NcclStatus(ncclCommInitRank(&nccl, size, id, rank), "ncclCommInitRank"); !s.ok())
    return s;
  cudaStream_t stream = nullptr;
  if (auto s =
          CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
      !s.ok()) {
    ncclCommDestroy(nccl);
    return s;
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(nccl, stream, rank, size));
}

}  // namespace pagedserve
