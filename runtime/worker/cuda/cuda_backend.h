// The CUDA backend of the forward pass (runtime/worker/model_backend.h): one
// tensor-parallel rank on one CUDA device, with the rank's paged KV pool in
// device memory and its swap pool in pinned host memory. The same math and
// tensor-parallel split as the CPU backend (the one forward pass of
// runtime/worker/llama_model.h drives both), so that a CUDA worker and a CPU
// worker produce the same greedy tokens.
//
// Precision: weights, activations and the KV cache are fp32 on the device
// (KVCacheView dtype kFloat32, device kCUDA; LoadWeights dequantizes nothing,
// the weights must be loaded as fp32). This costs twice the memory of fp16
// but keeps the CUDA worker within float rounding of the CPU reference.
// Linear layers are cuBLAS SGEMM in CUBLAS_DEFAULT_MATH (no TF32); the
// elementwise kernels (runtime/worker/cuda/model_kernels.cuh) sum RMSNorm
// squares in double as on the CPU; rotary tables come from the plan (host,
// angles in double). Attention and cache kernels are kernels/cuda's.
//
// Per step, BeginStep uploads the plan once (slot mapping, token ids,
// seq_lens, block tables, prefill query_start_loc, logits rows and the
// rotary tables in one packed copy) and sizes the paged_attention_v2
// workspace; no operation uploads anything per layer.
//
// Streams: every kernel, GEMM and copy of this backend, and the worker's
// swap/copy block operations, run on the legacy default stream of the chosen
// device. NCCL collectives run on the communicator's own stream, so
// AllReduceSum synchronizes the device before the all-reduce (only when the
// group has more than one rank); the NCCL communicator synchronizes its
// stream afterwards.
//
// This header is plain C++ (no CUDA headers); the functions exist only in
// builds with PAGEDSERVE_WITH_CUDA (runtime/worker/cuda/cuda_backend.cc).
#ifndef PAGEDSERVE_RUNTIME_WORKER_CUDA_CUDA_BACKEND_H_
#define PAGEDSERVE_RUNTIME_WORKER_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "distributed/communicator.h"
#include "runtime/model/weights.h"
#include "runtime/worker/llama_model.h"
#include "runtime/worker/model_backend.h"

namespace pagedserve {

// The reserve KvCacheBudgetBytes subtracts: the activations of one step
// (sized for kActivationReserveTokens tokens and kActivationReserveLogitRows
// logit rows) and CUDA/cuBLAS/NCCL internals (kRuntimeReserveBytes).
struct CudaBackendLimits {
  static constexpr int kActivationReserveTokens = 8192;
  static constexpr int kActivationReserveLogitRows = 256;
  static constexpr int64_t kRuntimeReserveBytes = int64_t{256} << 20;
};

#ifdef PAGEDSERVE_WITH_CUDA
// Selects `cuda_device` (cudaSetDevice; the calling thread keeps it) and
// creates the cuBLAS handle; weights are uploaded by LoadWeights (fp32
// matrices only: InvalidArgument for a stored-format matrix). `comm` (not
// owned) must be a group of one or an NCCL communicator on the same device
// (AllReduceSum on device buffers); it must outlive the backend.
// Errors: InvalidArgument for a non-NCCL communicator with more than one
// rank; FailedPrecondition when no device answers or the index is outside
// [0, device count); Internal for other CUDA or cuBLAS errors (with the
// runtime's message).
absl::StatusOr<std::unique_ptr<ModelBackend>> MakeCudaBackend(Communicator* comm, int cuda_device);

// The forward pass over MakeCudaBackend(comm, cuda_device): a LlamaModel
// whose weights (fp32, e.g. LoadLlamaWeights(..., WeightDType::kFloat32))
// live on the device. Allocate its pools with LlamaModel::AllocateCaches.
struct CudaLlamaModel {
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(LlamaWeights weights,
                                                            Communicator* comm, int cuda_device);
};
#endif

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_CUDA_CUDA_BACKEND_H_
