// Tensor-parallel collectives behind one interface, with an MPI implementation
// for CPU workers and an NCCL implementation for GPU workers. The communicator
// spans the worker ranks of one tensor-parallel group (not the coordinator).
#ifndef PAGEDSERVE_DISTRIBUTED_COMMUNICATOR_H_
#define PAGEDSERVE_DISTRIBUTED_COMMUNICATOR_H_

#include <cstddef>
#include <memory>

#include <mpi.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace pagedserve {

class Communicator {
 public:
  virtual ~Communicator() = default;

  // This rank's index in the group, 0..size()-1.
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "single", "mpi" or "nccl".
  virtual const char* backend() const = 0;

  // In-place elementwise sum of `count` fp32 values across the group. The
  // buffer is host memory for MPI, device memory for NCCL.
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;

  // Element type of an asynchronous all-reduce's buffer.
  enum class ReduceType { kFloat32, kFloat16, kBFloat16 };

  // The same sum over `count` elements of `type`, ordered on `stream` (a
  // cudaStream_t on this rank's device; ignored by host communicators).
  // Device communicators (NCCL) enqueue the collective on that stream and
  // return without waiting: the result is visible to work enqueued later on
  // the stream, and an error of the collective itself (a peer that died or a
  // broken link) surfaces through CheckAsyncError, not here. 16-bit sums are
  // accumulated by NCCL in the element type. Host communicators run
  // AllReduceSum for kFloat32; a group of one does nothing; other 16-bit
  // calls are Unimplemented.
  virtual absl::Status AllReduceSumAsync(void* data, size_t count, ReduceType type, void* stream) {
    (void)stream;
    if (size() <= 1) return absl::OkStatus();
    if (type == ReduceType::kFloat32) return AllReduceSum(static_cast<float*>(data), count);
    return absl::UnimplementedError(absl::StrCat("16-bit all-reduce on the '", backend(),
                                                 "' communicator (device communicators only)"));
  }

  // OK, or the asynchronous error a device communicator has recorded (NCCL:
  // ncclCommGetAsyncError). After an error the communicator is aborted
  // (ncclCommAbort, which also ends collectives stuck waiting for a dead
  // peer) and every later call fails with the same error. Host
  // communicators: always OK. Poll it while waiting for a stream that holds
  // collectives. Not thread-safe with other calls on this communicator.
  virtual absl::Status CheckAsyncError() { return absl::OkStatus(); }

  // Gathers `count` fp32 values from every rank: out[r * count + i] = in_r[i].
  // `out` holds size() * count values; `in` and `out` must not overlap.
  virtual absl::Status AllGather(const float* in, float* out, size_t count) = 0;

  // Seconds spent inside collectives since construction (for metrics).
  double collective_seconds() const { return collective_seconds_; }

 protected:
  double collective_seconds_ = 0.0;
};

// A group of one: collectives are no-ops (AllGather copies).
std::unique_ptr<Communicator> MakeSingleRankCommunicator();

// MPI collectives over `comm` (not duplicated: the caller keeps it alive).
std::unique_ptr<Communicator> MakeMpiCommunicator(MPI_Comm comm);

// NCCL collectives among the ranks of `comm`, each on CUDA device `device`;
// the unique id is distributed with MPI_Bcast from rank 0 of `comm`. Returns
// FailedPrecondition in builds without CUDA.
absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(MPI_Comm comm, int device);

}  // namespace pagedserve

#endif  // PAGEDSERVE_DISTRIBUTED_COMMUNICATOR_H_
