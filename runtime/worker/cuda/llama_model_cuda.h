// The Llama-family forward pass of one tensor-parallel rank on one CUDA device,
// with the rank's paged KV pool in device memory and its swap pool in pinned
// host memory. The same math and tensor-parallel split as the CPU model
// (runtime/worker/llama_model.h, Megatron-LM column/row-parallel layers, the
// embedding and LM head replicated), so that a CUDA worker and a CPU worker
// produce the same greedy tokens.
//
// Precision: weights, activations and the KV cache are fp32 on the device
// (KVCacheView dtype kFloat32, device kCUDA). This costs twice the memory of
// fp16 but keeps the CUDA worker within float rounding of the CPU reference.
// GEMMs are cuBLAS SGEMM in CUBLAS_DEFAULT_MATH (no TF32). RMSNorm sums and
// rotary angles are computed in double as on the CPU.
//
// Streams: every kernel, GEMM and copy of this model, and the worker's
// swap/copy block operations, run on the legacy default stream of the chosen
// device. NCCL collectives run on the communicator's own stream, so the model
// synchronizes the device before each all-reduce (only when the group has more
// than one rank); the NCCL communicator synchronizes its stream afterwards.
//
// This header is plain C++ (no CUDA headers); Create() exists only in builds
// with PAGEDSERVE_WITH_CUDA (runtime/worker/cuda/llama_model_cuda.cc).
#ifndef PAGEDSERVE_RUNTIME_WORKER_CUDA_LLAMA_MODEL_CUDA_H_
#define PAGEDSERVE_RUNTIME_WORKER_CUDA_LLAMA_MODEL_CUDA_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "distributed/communicator.h"
#include "kernels/types.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weights.h"
#include "runtime/worker/llama_model.h"

namespace pagedserve {

class CudaLlamaModel {
 public:
  virtual ~CudaLlamaModel() = default;

#ifdef PAGEDSERVE_WITH_CUDA
  // Selects `cuda_device` (cudaSetDevice; the calling thread keeps it),
  // uploads this rank's weight shard (fp32) and creates the cuBLAS handle.
  // `comm` (not owned) must be a group of one or an NCCL communicator on the
  // same device (AllReduceSum on device buffers); it must outlive the model.
  // Errors: InvalidArgument for a shard/communicator mismatch, a non-NCCL
  // communicator with more than one rank or an unsupported head size;
  // FailedPrecondition for a device index outside [0, device count);
  // ResourceExhausted when the weights do not fit; Internal for other CUDA or
  // cuBLAS errors (with the runtime's message).
  static absl::StatusOr<std::unique_ptr<CudaLlamaModel>> Create(LlamaWeights weights,
                                                                Communicator* comm,
                                                                int cuda_device);
#endif

  virtual const ModelConfig& config() const = 0;
  virtual int cuda_device() const = 0;
  // Bytes of device memory the weights occupy.
  virtual int64_t weight_bytes() const = 0;

  // The KV-pool budget in bytes, vLLM-style: free device memory now (after
  // the weights) times `gpu_memory_utilization`, minus a reserve for the
  // activations of one step (sized for kActivationReserveTokens tokens and
  // kActivationReserveLogitRows logit rows) and for CUDA/cuBLAS/NCCL
  // internals (kRuntimeReserveBytes). May be <= 0 (then nothing fits).
  // InvalidArgument unless 0 < gpu_memory_utilization <= 1.
  static constexpr int kActivationReserveTokens = 8192;
  static constexpr int kActivationReserveLogitRows = 256;
  static constexpr int64_t kRuntimeReserveBytes = int64_t{256} << 20;
  virtual absl::StatusOr<int64_t> KvCacheBudgetBytes(double gpu_memory_utilization) const = 0;

  // Allocates the per-layer pools: num_device_blocks blocks of `shape` in
  // device memory (cudaMalloc, kCUDA views) and num_cpu_blocks blocks in
  // pinned host memory (cudaHostAlloc, kCPU views, for SwapBlocks); zero
  // blocks gives no views. shape.num_blocks is ignored; shape.dtype must be
  // kFloat32. Buffers live as long as the model. Call once.
  // Errors: ResourceExhausted naming the pool when an allocation fails.
  virtual absl::Status AllocateCaches(const kernels::KVCacheShape& shape,
                                      int64_t num_device_blocks, int64_t num_cpu_blocks) = 0;
  virtual std::span<const kernels::KVCacheView> device_cache() const = 0;
  virtual std::span<const kernels::KVCacheView> cpu_cache() const = 0;

  // As LlamaModel::Forward: host batch in, host fp32 logits
  // [logits_rows.size(), vocab] out. The batch's index arrays are copied to
  // the device each call; `kv_layers` must be kCUDA views on this device.
  // Errors: the InvalidArgument checks of LlamaModel::Forward, kernel
  // validation errors, Internal for CUDA/cuBLAS errors, ResourceExhausted when
  // scratch memory for the batch cannot be allocated. Nothing is written to
  // `logits` on error.
  virtual absl::Status Forward(const ForwardBatch& batch,
                               std::span<const kernels::KVCacheView> kv_layers,
                               std::vector<float>* logits) = 0;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_CUDA_LLAMA_MODEL_CUDA_H_
