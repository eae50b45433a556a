// cuBLAS loaded at run time (dlopen) instead of linked.
//
// Why: libcublasLt carries a large static thread-local storage block. Linked
// into the `pagedserve` binary it is loaded into every process, including the
// coordinator, and glibc then refuses to create threads with small explicit
// stacks (pthread_create returns EINVAL when the stack cannot hold the static
// TLS). civetweb, under prometheus-cpp's Exposer, creates its worker threads
// with such stacks, so a CUDA build could not serve /metrics. Loading cuBLAS
// with dlopen only in a process that builds a CUDA worker keeps its TLS
// dynamic and out of every other process.
#ifndef PAGEDSERVE_RUNTIME_WORKER_CUDA_CUBLAS_LOADER_H_
#define PAGEDSERVE_RUNTIME_WORKER_CUDA_CUBLAS_LOADER_H_

#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace pagedserve {

// The cuBLAS entry points the CUDA worker uses (same signatures as cublas_v2.h).
struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*) = nullptr;
  cublasStatus_t (*destroy)(cublasHandle_t) = nullptr;
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t) = nullptr;
  cublasStatus_t (*set_math_mode)(cublasHandle_t, cublasMath_t) = nullptr;
  // A user-owned workspace, so that GEMMs captured into CUDA graphs do not
  // allocate one per capture.
  cublasStatus_t (*set_workspace)(cublasHandle_t, void*, size_t) = nullptr;
  cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                          const float*, const float*, int, const float*, int, const float*, float*,
                          int) = nullptr;
  // cublasGemmEx: mixed precision (here bf16/fp16 A and B, fp32 C, fp32
  // compute on tensor cores).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t) = nullptr;
};

// Loads libcublas.so.<major of the toolkit built against> once per process
// (thread-safe) and resolves the entry points. FailedPrecondition naming the
// library or symbol (dlerror) when it cannot.
absl::StatusOr<const CublasApi*> LoadCublas();

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_CUDA_CUBLAS_LOADER_H_
