// Decode attention over the paged KV cache: one query token per sequence.
//
// PagedAttention v1 and v2 as in vLLM (csrc/attention/attention_kernels.cu):
// v1 makes one pass over the whole context per (head, sequence); v2 splits the
// context into partitions of kPartitionSize tokens (a context-length partition,
// not a number of GPUs), each writing its max logit, exp-sum and partial output,
// and a reduce step combines them with the usual log-sum-exp rescaling.
#ifndef PAGEDSERVE_KERNELS_PAGED_ATTENTION_H_
#define PAGEDSERVE_KERNELS_PAGED_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kernels/partition.h"  // kPartitionSize, NumPartitions
#include "kernels/types.h"

namespace pagedserve::kernels {

struct PagedAttentionParams {
  void* out = nullptr;          // [num_seqs, num_heads, head_size], io_dtype
  const void* query = nullptr;  // [num_seqs, num_heads, head_size], io_dtype
  int num_seqs = 0;
  int num_heads = 0;  // query heads; a multiple of cache.shape.num_kv_heads.
                      // GQA/MQA: kv_head = head / (num_heads / num_kv_heads).
  KVCacheView cache;
  // Element type of query and out. Unset means cache.shape.dtype (the only
  // choice for fp32/fp16/bf16 caches). An fp8 cache requires kFloat32,
  // kFloat16 or kBFloat16 here; its elements are read as stored * k_scale
  // (keys) and stored * v_scale (values) (kernels/types.h), converted in
  // registers as they are loaded. The kernels fold the scales into the softmax
  // scale (logit = scale * k_scale * q . stored_k) and into the output
  // normalization (out = v_scale * sum p_j stored_v_j / sum p_j), equal to
  // scaling every element up to fp32 rounding.
  std::optional<DType> io_dtype;
  // block_tables[s * max_blocks_per_seq + i] = physical block of sequence s's
  // i-th logical block. int32, same device as the cache.
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  const int32_t* seq_lens = nullptr;  // [num_seqs], context tokens incl. the current one; >= 1
  int max_seq_len = 0;                // >= every seq_lens[s]; sizes the v2 partitions
  float scale = 1.0f;                 // softmax scale, usually 1/sqrt(head_size)
  const float* alibi_slopes = nullptr;  // [num_heads] fp32 or null (no ALiBi)
  // Host-readable copies used only for validation on kCUDA (optional there; on
  // CPU the device arrays are host-readable and are checked directly).
  const int32_t* host_block_tables = nullptr;
  const int32_t* host_seq_lens = nullptr;
  // v2 scratch space of PagedAttentionV2WorkspaceBytes() bytes on the cache's
  // device; may be null on CPU (then allocated internally).
  void* workspace = nullptr;
  void* stream = nullptr;  // cudaStream_t for kCUDA; ignored on CPU
};

// Checks shapes, io_dtype against the cache dtype (ValidateIoDType) and, where host-readable, every block id (< num_blocks, >= 0)
// and seq_len (1 <= seq_len <= max_blocks_per_seq * block_size, <= max_seq_len).
// Returns InvalidArgument naming the offending field and index.
absl::Status ValidatePagedAttention(const PagedAttentionParams& p);

// out[s, h] = softmax(scale * q[s,h] . K[s, kv(h)]^T + alibi) V[s, kv(h)] over
// the seq_lens[s] cached tokens. Validates first; nothing is written on error.
absl::Status PagedAttentionV1(const PagedAttentionParams& p);

// Same result as v1, computed per kPartitionSize-token partition then reduced.
absl::Status PagedAttentionV2(const PagedAttentionParams& p);

// Bytes of v2 scratch: fp32 max_logits and exp_sums [num_seqs, num_heads,
// num_partitions] and fp32 partial outputs [num_seqs, num_heads,
// num_partitions, head_size], with num_partitions = ceil(max_seq_len / 512).
size_t PagedAttentionV2WorkspaceBytes(int num_seqs, int num_heads, int head_size,
                                      int max_seq_len);

// vLLM's heuristic: v1 when max_seq_len <= 8192 and either the context fits in
// one partition or num_seqs * num_heads > 512 (enough parallelism without
// splitting the context); v2 otherwise.
bool ShouldUsePagedAttentionV1(int num_seqs, int num_heads, int max_seq_len);

// Runs v1 or v2 according to ShouldUsePagedAttentionV1.
absl::Status PagedAttention(const PagedAttentionParams& p);

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_PAGED_ATTENTION_H_
