// The CUDA forward pass is the one LlamaModel over the CUDA backend; this
// header only forwards to runtime/worker/cuda/cuda_backend.h (kept for the
// callers of CudaLlamaModel::Create).
#ifndef PAGEDSERVE_RUNTIME_WORKER_CUDA_LLAMA_MODEL_CUDA_H_
#define PAGEDSERVE_RUNTIME_WORKER_CUDA_LLAMA_MODEL_CUDA_H_

#include "runtime/worker/cuda/cuda_backend.h"

#endif  // PAGEDSERVE_RUNTIME_WORKER_CUDA_LLAMA_MODEL_CUDA_H_
