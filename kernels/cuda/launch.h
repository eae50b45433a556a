// Internal: launchers of the CUDA kernels, callable from host C++ (C++20) and
// from nvcc (C++17). Deliberately free of Abseil and of kernels/types.h so that
// nvcc parses as little as possible; kernels/cuda/cuda_backend.cc turns the
// cudaError_t results into absl::Status and owns argument checking.
//
// Layouts are those of kernels/types.h (vLLM's PagedAttention layout):
//   key_cache   [num_blocks, num_kv_heads, head_size / x, block_size, x]
//   value_cache [num_blocks, num_kv_heads, head_size, block_size]
// with x = 16 / sizeof(element). Element codes: 0 = fp32, 1 = fp16, 2 = bf16,
// 3 = fp8 e4m3, 4 = fp8 e5m2 (the order of kernels::DType). An fp8 cache
// pairs with an fp32/fp16/bf16 io element type (queries, new K/V, outputs)
// and carries k_scale / v_scale (kernels/types.h); otherwise io == cache
// element and the scales are ignored.
#ifndef PAGEDSERVE_KERNELS_CUDA_LAUNCH_H_
#define PAGEDSERVE_KERNELS_CUDA_LAUNCH_H_

#include <cstdint>

#include <cuda_runtime_api.h>

#include "kernels/cuda/gqa_decode_plan.h"  // GqaSplitPlan
#include "kernels/partition.h"             // kPartitionSize, NumPartitions: the v2 partition

namespace pagedserve::kernels::cuda {

// Threads per block of the decode attention kernels (4 warps, as vLLM).
inline constexpr int kDecodeThreads = 128;

enum class Elem : int { kF32 = 0, kF16 = 1, kBF16 = 2, kFp8E4M3 = 3, kFp8E5M2 = 4 };

struct CacheArgs {
  const void* key_cache = nullptr;
  const void* value_cache = nullptr;
  int num_kv_heads = 0;
  int head_size = 0;
  int block_size = 0;
  Elem elem = Elem::kF32;
  float k_scale = 1.0f;  // fp8 only
  float v_scale = 1.0f;  // fp8 only
};

struct DecodeArgs {
  void* out = nullptr;          // [num_seqs, num_heads, head_size]
  const void* query = nullptr;  // [num_seqs, num_heads, head_size]
  int num_seqs = 0;
  int num_heads = 0;
  CacheArgs cache;
  Elem io = Elem::kF32;                   // element type of query and out
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq], device
  int max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;  // [num_seqs], device
  int max_seq_len = 0;
  float scale = 1.0f;
  const float* alibi_slopes = nullptr;  // [num_heads] device, or null
  int sliding_window = 0;               // PagedAttentionParams::sliding_window (v1/v2 only)
  float logit_softcap = 0.0f;           // PagedAttentionParams::logit_softcap (v1/v2 only)
  cudaStream_t stream = nullptr;
};

// Dynamic shared memory bytes v1 needs for its logits (one fp32 per context
// token, rounded up to 8 tokens).
size_t DecodeV1SharedBytes(int max_seq_len);
// Largest dynamic shared memory v1 may use on the current device for the given
// io / cache element types and head size (opt-in limit minus the kernel's
// static shared memory). Returns an error code from the runtime if it cannot
// be queried, cudaErrorInvalidValue for an unsupported combination.
cudaError_t DecodeV1MaxSharedBytes(Elem io, Elem cache, int head_size, size_t* bytes);

// v1: one thread block per (head, sequence) over the whole context; the logits
// of the context live in shared memory (DecodeV1SharedBytes must not exceed
// DecodeV1MaxSharedBytes).
cudaError_t LaunchPagedAttentionV1(const DecodeArgs& a);

// v2: grid (num_heads, num_seqs, ceil(max_seq_len / 512)); each block writes
// max_logits / exp_sums [num_seqs, num_heads, P] and tmp_out [num_seqs,
// num_heads, P, head_size] (fp32, P = ceil(max_seq_len / 512)), then a reduce
// kernel combines the partitions into out.
cudaError_t LaunchPagedAttentionV2(const DecodeArgs& a, float* max_logits, float* exp_sums,
                                   float* tmp_out);

// GQA decode (kernels/cuda/gqa_decode_kernels.cuh): one thread block per (KV
// head, sequence, context split) serving all num_heads / num_kv_heads query
// heads of the group from shared-memory K/V tiles. The caller plans the splits
// (PlanGqaSplits, gqa_decode_plan.h). plan.num_splits == 1 writes out directly
// (the three scratch pointers may be null); otherwise max_logits / exp_sums
// [num_seqs, num_heads, num_splits] and tmp_out [num_seqs, num_heads,
// num_splits, head_size] (fp32) are written and the v2 reduce kernel merges
// them into out. Fails with cudaErrorInvalidValue for an unsupported head size
// or a plan that is not a valid PlanGqaSplits result, or for a sliding window
// or a soft cap (v1/v2 take those). tensor_cores: the WMMA
// variant (gqa_decode_mma_kernels.cuh; same arguments and outputs), which
// also fails with cudaErrorInvalidValue outside GqaMmaSupports or for fp32.
cudaError_t LaunchGqaDecode(const DecodeArgs& a, const GqaSplitPlan& plan, float* max_logits,
                            float* exp_sums, float* tmp_out, bool tensor_cores = false);

// The device facts PlanGqaSplits needs for the GQA kernel of this element type,
// head size and group size on the current device: its multiprocessor count and
// how many blocks of the kernel (kDecodeThreads threads, GqaDecodeSharedBytes
// of dynamic shared memory, opted in above 48 KiB) are resident per
// multiprocessor (cudaOccupancyMaxActiveBlocksPerMultiprocessor; 0 when the
// shared memory does not fit the device). Queried once per (device, element
// type, head size, group size, variant) and cached; thread-safe.
// tensor_cores: the WMMA variant (GqaMmaSharedBytes).
cudaError_t GqaDecodeOccupancy(Elem elem, int head_size, int group_size, int* num_sms,
                               int* blocks_per_sm, bool tensor_cores = false);

struct PrefillArgs {
  void* out = nullptr;          // [num_tokens, num_heads, head_size]
  const void* query = nullptr;  // rows query_token_stride elements apart
  int64_t query_token_stride = 0;
  int num_seqs = 0;
  int num_heads = 0;
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1], device
  const int32_t* seq_lens = nullptr;         // [num_seqs], device
  CacheArgs cache;
  Elem io = Elem::kF32;  // element type of query and out
  const int32_t* block_tables = nullptr;
  int max_blocks_per_seq = 0;
  int max_query_len = 0;
  float scale = 1.0f;
  const float* alibi_slopes = nullptr;
  int sliding_window = 0;      // PrefillAttentionParams::sliding_window (kSimt only)
  float logit_softcap = 0.0f;  // PrefillAttentionParams::logit_softcap (kSimt only)
  cudaStream_t stream = nullptr;
};

// Causal prefill attention over the paged cache: grid (num_heads, num_seqs,
// ceil(max_query_len / 8)), online softmax over tiles of 16 keys.
cudaError_t LaunchPrefillAttention(const PrefillArgs& a);

// The tensor-core variant (prefill_attention_mma_kernels.cuh): grid
// (num_heads, num_seqs, ceil(max_query_len / 64)), WMMA over 32-key tiles.
// io must equal the cache's element type, fp16 or bf16, and the head size be
// 64 or 128 (PrefillMmaBuiltFor), without a sliding window or a soft cap
// (LaunchPrefillAttention takes those): cudaErrorInvalidValue otherwise.
cudaError_t LaunchPrefillAttentionMma(const PrefillArgs& a);

// reshape_and_cache: one thread block per token; negative slots (padding) and
// slots >= num_slots (= num_blocks * block_size; out of the pool) are skipped.
// key/value are of element type `io`; the cache of `elem` (= io unless fp8:
// then stored = fp8(x / k_scale) resp. fp8(x / v_scale)).
cudaError_t LaunchReshapeAndCache(const void* key, const void* value, int64_t key_token_stride,
                                  int64_t value_token_stride, const int64_t* slot_mapping,
                                  int64_t num_slots, int num_tokens, void* key_cache,
                                  void* value_cache, int num_kv_heads, int head_size,
                                  int block_size, Elem elem, Elem io, float k_scale, float v_scale,
                                  cudaStream_t stream);

// copy_blocks: grid (num_pairs, num_layers). key_ptrs / value_ptrs are device
// arrays of num_layers cache base addresses, pairs a device array of
// 2 * num_pairs int64 (src, dst, src, dst, ...). block_bytes is the size of one
// block of K (= of V); when every address and block_bytes are 16-byte aligned
// the copy uses 16-byte vectors, else bytes.
cudaError_t LaunchCopyBlocks(const uint64_t* key_ptrs, const uint64_t* value_ptrs,
                             const int64_t* pairs, int num_layers, int num_pairs,
                             int64_t block_bytes, bool aligned16, cudaStream_t stream);

}  // namespace pagedserve::kernels::cuda

#endif  // PAGEDSERVE_KERNELS_CUDA_LAUNCH_H_
