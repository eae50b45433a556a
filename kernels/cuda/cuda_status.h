// absl::Status from a CUDA runtime error code: one definition for every host
// file that calls the CUDA runtime (kernels/cuda, the CUDA worker, the NCCL
// communicator). Header-only so that it adds no link dependency. Host code
// only (not for .cu device code).
#ifndef PAGEDSERVE_KERNELS_CUDA_CUDA_STATUS_H_
#define PAGEDSERVE_KERNELS_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pagedserve {

// OK for cudaSuccess. Otherwise clears the thread's last error (so that a
// sticky launch error does not fail the next, unrelated call) and returns
// ResourceExhausted for cudaErrorMemoryAllocation, Internal for any other
// code, naming `what` (the call or operation), the CUDA message and the code.
inline absl::Status CudaStatus(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  if (e == cudaErrorMemoryAllocation) {
    return absl::ResourceExhaustedError(
        absl::StrCat("CUDA out of memory in ", what, ": ", cudaGetErrorString(e)));
  }
  return absl::InternalError(absl::StrCat("CUDA error in ", what, ": ", cudaGetErrorString(e), " (",
                                          static_cast<int>(e), ")"));
}

}  // namespace pagedserve

#endif  // PAGEDSERVE_KERNELS_CUDA_CUDA_STATUS_H_
