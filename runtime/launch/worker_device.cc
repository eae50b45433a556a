#include "runtime/launch/worker_device.h"

#include <cstdlib>
#include <string>
#include <vector>

#ifdef PAGEDSERVE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda_device.h"
#include "runtime/launch/process_state.h"

namespace pagedserve::launch_internal {

absl::StatusOr<kernels::Device> ChooseWorkerDevice(const WorkerOptions& options, std::string* why) {
  const char* env = std::getenv("PAGEDSERVE_WORKER_DEVICE");
  const std::string policy = env != nullptr && *env != '\0' ? env : "auto";
  if (policy == "cpu") {
    *why = "PAGEDSERVE_WORKER_DEVICE=cpu";
    return kernels::Device::kCPU;
  }
  if (policy == "cuda") {
    *why = "PAGEDSERVE_WORKER_DEVICE=cuda";
    return kernels::Device::kCUDA;
  }
  if (policy != "auto")
    return absl::InvalidArgumentError(
        absl::StrCat("PAGEDSERVE_WORKER_DEVICE must be auto, cpu or cuda, got '", policy, "'"));
  if (options.device == kernels::Device::kCUDA) {
    *why = "WorkerOptions.device";
    return kernels::Device::kCUDA;
  }
  std::string reason;
  if (kernels::CudaDeviceAvailable(&reason)) {
    *why = "a CUDA device is available";
    return kernels::Device::kCUDA;
  }
  *why = absl::StrCat("no CUDA device: ", reason);
  return kernels::Device::kCPU;
}

absl::StatusOr<int> LocalCudaDevice(MPI_Comm tp_comm) {
#ifdef PAGEDSERVE_WITH_CUDA
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device: ", cudaGetErrorString(e)));
  }
  if (count <= 0) return absl::FailedPreconditionError("no CUDA device is visible");
#else
  const int count = 1;  // Worker::Create reports that the build has no CUDA
#endif
  MPI_Comm node = MPI_COMM_NULL;
  if (MPI_Comm_split_type(tp_comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) != MPI_SUCCESS ||
      node == MPI_COMM_NULL)
    return absl::InternalError("MPI_Comm_split_type(MPI_COMM_TYPE_SHARED) failed");
  int local_rank = 0;
  MPI_Comm_rank(node, &local_rank);
  MPI_Comm_free(&node);
  return local_rank % count;
}

void WarnOfCudaOnlyFlags(const WorkerOptions& o) {
  const WorkerOptions defaults;
  std::vector<std::string> set;
  if (o.gpu_memory_utilization != defaults.gpu_memory_utilization)
    set.push_back("--gpu-memory-utilization");
  if (o.graphs.enforce_eager != defaults.graphs.enforce_eager) set.push_back("--enforce-eager");
  if (o.graphs.max_seq_len_to_capture != defaults.graphs.max_seq_len_to_capture)
    set.push_back("--max-seq-len-to-capture");
  if (set.empty()) return;
  Log().warn("{} only appl{} to CUDA workers: no effect on the CPU", absl::StrJoin(set, ", "),
             set.size() == 1 ? "ies" : "y");
}

}  // namespace pagedserve::launch_internal
