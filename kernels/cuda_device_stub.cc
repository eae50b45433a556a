// CudaDeviceAvailable() for builds without the CUDA backend. The CUDA backend
// (kernels/cuda/) provides the real implementation when PAGEDSERVE_WITH_CUDA.
#include "kernels/cuda_device.h"

namespace pagedserve::kernels {

bool CudaDeviceAvailable(std::string* reason) {
  if (reason != nullptr) *reason = "built without CUDA";
  return false;
}

}  // namespace pagedserve::kernels
