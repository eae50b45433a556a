// The CUDA backend of the forward pass (runtime/worker/model_backend.h): one
// tensor-parallel rank on one CUDA device, with the rank's paged KV pool in
// device memory and its swap pool in pinned host memory. The same math and
// tensor-parallel split as the CPU backend (the one forward pass of
// runtime/worker/llama_model.h drives both), so that a CUDA worker and a CPU
// worker produce the same greedy tokens.
//
// Precision: weights are held as LoadWeights receives them: fp32 matrices
// run cuBLAS SGEMM in CUBLAS_DEFAULT_MATH (no TF32; the exact path the CPU
// fp32 reference is compared with), fp16 / bf16 matrices (LoadLlamaWeights
// with WeightDType kFloat16 / kBFloat16; the worker's default on CUDA) run
// cublasGemmEx with 16-bit A and B and CUBLAS_COMPUTE_32F (tensor cores,
// fp32 accumulation). GEMM inputs (gemm_input_type) are in the weights'
// 16-bit type when every matrix has it, written so by the norm, attention
// and SiLU-and-mul kernels (each rounds its fp32 result once); GEMM outputs
// are fp32, except the row-parallel partial sums under tensor parallelism
// (partial_sum_type: the weights' type, the all-reduce payload). q/k/v and
// gate/up are uploaded stacked by rows; up to kFusedGemmMaxTokens (256)
// tokens each stack runs as one GEMM whose output the next kernels read in
// place (QkvRopeAndAttention; GateUpSiluMul: SiLU-and-mul reads both
// halves); larger steps run a GEMM per matrix over row ranges of the same
// allocation. Q/K/V biases are added by the RoPE and cache-write kernels as
// they read q, k and v, at any step size (no bias kernel). The residual stream
// and q/k/v stay fp32; the elementwise kernels
// (runtime/worker/cuda/model_kernels.cuh) sum RMSNorm squares in double as
// on the CPU; rotary tables come from the plan (host, angles in double).
// The KV cache may be fp32, fp16, bf16 (q converted to the cache type for
// attention, the output written in it and converted only when the GEMM-input
// type differs) or fp8_e4m3 / fp8_e5m2 (fp32 queries, converted in the
// kernels; per-layer scales from the view).
// RopeAndAttention fuses RoPE into two kernels (model_kernels.cuh): one
// rotates q and converts it to the attention operand type, one rotates k and
// writes k and v into the cache (reshape_and_cache's layout and rounding).
// Attention kernels are kernels/cuda's.
// Gemma 2/3: the post-norm residual add, the embedding scale, GeGLU and the
// final logit soft cap are model_kernels.cuh kernels (the cap runs after the
// LM-head GEMM, before the argmax / sampling kernels and the download); the
// local layers' rotary tables go up with the global ones; attention
// soft-capping is the v1/v2 and SIMT prefill kernels' logit_softcap.
// Mixture-of-experts models are refused at LoadWeights (Unimplemented).
//
// Per step, BeginStep uploads the plan once (slot mapping, token ids,
// seq_lens, prefill query_start_loc, logits rows and the rotary tables in
// one packed copy from a pinned staging buffer; of the block tables, which
// the device keeps from step to step, only the rows that changed:
// runtime/worker/block_table_update.h) and sizes the decode workspace (v2
// partitions or GQA context splits); no operation uploads or allocates
// anything per layer. The attention kernels' host-side checks of block
// tables, lengths and query offsets run once per step (the first layer's
// call). Rows other than beam search are reduced on the
// device (LmHeadSample: an argmax kernel for greedy rows, a sampling kernel
// with penalties, temperature, top-k, top-p, min-p and logprobs for the
// others; only ids, the logprobs asked for and the rows that need logits
// come back).
//
// CUDA graphs: decode steps padded to a DecodeGraphKey (the forward pass
// pads them; runtime/worker/decode_graph.h) have their body (embedding to
// final norm) captured on the compute stream at the key's second step and
// replayed from then on (ModelBackend::BeginBody / EndBody); the step-input
// upload, the LM head and the sampling stay eager. A graph is replayed only
// over the addresses it was captured with and captured again otherwise;
// LlamaModel::set_graph_options (WorkerOptions::graphs, --enforce-eager)
// turns it off. Each capture logs the device memory it took (graph_bytes:
// the total, which the KV budget's kRuntimeReserveBytes must cover).
//
// Streams: every kernel, GEMM, copy and NCCL all-reduce of this backend runs
// on one compute stream, created blocking so that it is ordered with the
// legacy default stream on which the worker's swap and copy-on-write block
// operations run. AllReduceSum enqueues the collective without a host
// synchronisation (Communicator::AllReduceSumAsync), in place on the partial
// sums (bf16/fp16 when the weights are 16-bit); the only host wait is
// LmHead's, at the end of the step, which with a multi-rank group polls the
// communicator's asynchronous error so that a dead peer fails the step
// (the communicator is aborted) instead of hanging it.
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

// vLLM's --gpu-memory-utilization: the fraction of the device's total memory
// the worker may hold in all (weights, activations, KV cache, runtime). The
// KV budget in bytes = total_bytes * utilization - (total_bytes -
// free_bytes) - activation_reserve - runtime_reserve, where total - free is
// what the device holds when asked (after the weights are loaded: the
// weights, this process's context, and anything other processes hold). May be
// <= 0 (nothing fits). Plain arithmetic (every build; tested without a GPU).
inline int64_t GpuKvBudgetBytes(int64_t total_bytes, int64_t free_bytes, double utilization,
                                int64_t activation_reserve, int64_t runtime_reserve) {
  const int64_t allowed = static_cast<int64_t>(static_cast<double>(total_bytes) * utilization);
  return allowed - (total_bytes - free_bytes) - activation_reserve - runtime_reserve;
}

#ifdef PAGEDSERVE_WITH_CUDA
// Selects `cuda_device` (cudaSetDevice; the calling thread keeps it) and
// creates the compute stream and the cuBLAS handle; weights are uploaded by
// LoadWeights (fp32, F16 or BF16 matrices: Unimplemented for a quantized
// stored format). `comm` (not
// owned) must be a group of one or an NCCL communicator on the same device
// (AllReduceSum on device buffers); it must outlive the backend.
// Errors: InvalidArgument for a non-NCCL communicator with more than one
// rank; FailedPrecondition when no device answers or the index is outside
// [0, device count); Internal for other CUDA or cuBLAS errors (with the
// runtime's message).
absl::StatusOr<std::unique_ptr<ModelBackend>> MakeCudaBackend(Communicator* comm, int cuda_device);

// The forward pass over MakeCudaBackend(comm, cuda_device): a LlamaModel
// whose weights (fp32, fp16 or bf16: LoadLlamaWeights(..., WeightDType::
// kFloat32 / kFloat16 / kBFloat16)) live on the device. Allocate its pools with
// LlamaModel::AllocateCaches.
struct CudaLlamaModel {
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(LlamaWeights weights,
                                                            Communicator* comm, int cuda_device);
};
#endif

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_CUDA_CUDA_BACKEND_H_
