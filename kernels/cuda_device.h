// Detecting a usable CUDA device.
#ifndef PAGEDSERVE_KERNELS_CUDA_DEVICE_H_
#define PAGEDSERVE_KERNELS_CUDA_DEVICE_H_

#include <string>

namespace pagedserve::kernels {

// True when the build has the CUDA backend and at least one device answers.
// Otherwise false, and *reason (if given) says why: "built without CUDA",
// "CUDA driver version is insufficient for CUDA runtime version" (no driver, as
// on CPU-only machines), "no CUDA device".
bool CudaDeviceAvailable(std::string* reason = nullptr);

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_CUDA_DEVICE_H_
