// Internal to the CPU backend and its benchmark: decode attention over a
// contiguous (non-paged) KV cache, the baseline that paged_attention_v1 is
// measured against in bench/paged_attention_bench.cc.
//
// It runs exactly the same code as cpu::PagedAttentionV1 (same inner loop,
// threading over (sequence, KV head), vectorization); only the addressing
// differs: every (sequence, KV head) owns one contiguous stretch of memory
// instead of blocks found through a block table. Within that stretch tokens
// are grouped by block_size with the per-block element order of
// kernels/types.h, so the arithmetic is identical and the comparison isolates
// the cost of paging (indirection and scattered blocks).
#ifndef PAGEDSERVE_KERNELS_CPU_CONTIGUOUS_ATTENTION_H_
#define PAGEDSERVE_KERNELS_CPU_CONTIGUOUS_ATTENTION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/types.h"

namespace pagedserve::kernels::cpu {

struct ContiguousDecodeParams {
  void* out = nullptr;          // [num_seqs, num_heads, head_size]
  const void* query = nullptr;  // [num_seqs, num_heads, head_size]
  int num_seqs = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_size = 0;
  int block_size = 16;  // token grouping of the layout (8, 16, 32)
  DType dtype = DType::kFloat32;
  // key:   [num_seqs, num_kv_heads, capacity / block_size, head_size / x, block_size, x]
  // value: [num_seqs, num_kv_heads, capacity / block_size, head_size, block_size]
  const void* key = nullptr;
  const void* value = nullptr;
  int capacity = 0;                   // tokens per (sequence, KV head); multiple of block_size
  const int32_t* seq_lens = nullptr;  // [num_seqs], 1 <= seq_len <= capacity
  float scale = 1.0f;
};

// Validates the shape fields (InvalidArgument) and computes
// out = softmax(scale * q K^T) V per (sequence, head), GQA as in decode.
absl::Status ContiguousDecodeAttention(const ContiguousDecodeParams& p);

}  // namespace pagedserve::kernels::cpu

#endif  // PAGEDSERVE_KERNELS_CPU_CONTIGUOUS_ATTENTION_H_
