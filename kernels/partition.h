// The context partition of PagedAttention v2 (vLLM's PARTITION_SIZE): decode
// attention splits a sequence's context into partitions of kPartitionSize
// tokens, each reduced separately and then combined. A context-length
// partition, not a number of GPUs. Plain constexpr C++ so that the CPU
// kernels, the CUDA kernels (nvcc) and their dispatch share one definition.
#ifndef PAGEDSERVE_KERNELS_PARTITION_H_
#define PAGEDSERVE_KERNELS_PARTITION_H_

namespace pagedserve::kernels {

// Tokens per context partition of paged_attention_v2.
inline constexpr int kPartitionSize = 512;

// Partitions covering a context of context_len >= 0 tokens (0 for 0).
constexpr int NumPartitions(int context_len) {
  return (context_len + kPartitionSize - 1) / kPartitionSize;
}

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_PARTITION_H_
