// Where a worker rank runs: CPU with MPI collectives or a CUDA device with
// NCCL collectives (the policy RunWorkerRank documents in worker_rank.h), and
// which local device. Internal to runtime/launch/.
#ifndef PAGEDSERVE_RUNTIME_LAUNCH_WORKER_DEVICE_H_
#define PAGEDSERVE_RUNTIME_LAUNCH_WORKER_DEVICE_H_

#include <string>

#include <mpi.h>

#include "absl/status/statusor.h"
#include "kernels/types.h"
#include "runtime/worker/worker.h"

namespace pagedserve::launch_internal {

// The device this rank would like, from the environment variable
// PAGEDSERVE_WORKER_DEVICE = auto (default) | cpu | cuda. auto picks CUDA when
// options.device already says kCUDA or when the build has CUDA and a device
// answers (kernels::CudaDeviceAvailable), else CPU. *why: the reason, for the
// log. InvalidArgument for any other value of the variable. No MPI call.
absl::StatusOr<kernels::Device> ChooseWorkerDevice(const WorkerOptions& options, std::string* why);

// The CUDA device of this worker rank: its rank among the worker ranks on the
// same host (MPI_Comm_split_type SHARED over the TP group `tp_comm`, a
// collective over it) modulo the number of visible devices. FailedPrecondition
// when the CUDA runtime sees no device; Internal when the split fails. In a
// build without CUDA the device count is taken as 1 (Worker::Create then
// reports that the build has no CUDA).
absl::StatusOr<int> LocalCudaDevice(MPI_Comm tp_comm);

// A CPU worker ignores the flags only CUDA workers read: logs a warning
// naming those that differ from their defaults in `o` (--gpu-memory-
// utilization, --enforce-eager, --max-seq-len-to-capture), nothing when none
// does. Call once per TP group.
void WarnOfCudaOnlyFlags(const WorkerOptions& o);

}  // namespace pagedserve::launch_internal

#endif  // PAGEDSERVE_RUNTIME_LAUNCH_WORKER_DEVICE_H_
