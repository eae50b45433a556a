#include "kernels/cuda_device.h"

#include <cuda_runtime_api.h>

namespace pagedserve::kernels {

bool CudaDeviceAvailable(std::string* reason) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    // On machines without a driver this is cudaErrorInsufficientDriver ("CUDA
    // driver version is insufficient for CUDA runtime version").
    if (reason != nullptr) *reason = cudaGetErrorString(e);
    cudaGetLastError();  // clear the error so later runtime calls start clean
    return false;
  }
  if (count == 0) {
    if (reason != nullptr) *reason = "no CUDA device";
    return false;
  }
  return true;
}

}  // namespace pagedserve::kernels
