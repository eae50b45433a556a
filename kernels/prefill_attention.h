// Prefill attention over the paged KV cache: several new query tokens per
// sequence attend, causally, to the sequence's cached tokens plus themselves.
// One flattened variable-length batch serves whole prompts, chunks of a chunked
// prefill and prompts whose prefix is already in the cache (prefix caching).
#ifndef PAGEDSERVE_KERNELS_PREFILL_ATTENTION_H_
#define PAGEDSERVE_KERNELS_PREFILL_ATTENTION_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kernels/types.h"

namespace pagedserve::kernels {

// The prefill attention kernels (kCUDA): kSimt, the fp32-FMA tiled kernel
// (kernels/cuda/prefill_attention_kernels.cuh, every dtype and head size),
// and kMma, its tensor-core variant (prefill_attention_mma_kernels.cuh:
// FlashAttention-2 tiles on WMMA, fp16/bf16 caches with operands of the same
// type, head sizes 64 and 128; PrefillMmaFits). kAuto = kSimt: no device has
// run kMma yet, so it runs only when requested. The CPU backend has one
// kernel and ignores the choice.
enum class PrefillKernel : uint8_t { kAuto, kSimt, kMma };
// "auto", "simt", "mma".
const char* PrefillKernelName(PrefillKernel k);
// Parses a PrefillKernelName() string; false (and *k untouched) otherwise.
bool ParsePrefillKernel(const char* name, PrefillKernel* k);
// Whether the tensor-core kernel takes a `cache_dtype` cache with operands of
// `io_dtype` and this head size.
bool PrefillMmaFits(DType cache_dtype, DType io_dtype, int head_size);

struct PrefillAttentionParams {
  // Query tokens of all sequences back to back; sequence s owns rows
  // [query_start_loc[s], query_start_loc[s+1]). num_tokens = query_start_loc[num_seqs].
  void* out = nullptr;             // [num_tokens, num_heads, head_size], io_dtype
  const void* query = nullptr;     // [num_tokens, num_heads, head_size], io_dtype
  int64_t query_token_stride = 0;  // elements between tokens; 0 = num_heads * head_size
  int num_seqs = 0;
  int num_heads = 0;  // multiple of cache.shape.num_kv_heads (GQA/MQA as in decode)
  const int32_t* query_start_loc = nullptr;  // [num_seqs + 1], int32, non-decreasing
  // Total context of sequence s after this step, new tokens included. The new
  // tokens' K/V must already be in the cache (ReshapeAndCache). Query row i of
  // sequence s sits at position seq_lens[s] - q_len(s) + i and attends to keys
  // at positions [0, that position].
  const int32_t* seq_lens = nullptr;  // [num_seqs]
  KVCacheView cache;
  // As PagedAttentionParams::io_dtype (kernels/paged_attention.h).
  std::optional<DType> io_dtype;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  int max_query_len = 0;  // >= every q_len(s)
  int max_seq_len = 0;    // >= every seq_lens[s]
  float scale = 1.0f;
  const float* alibi_slopes = nullptr;  // [num_heads] or null
  // Sliding-window attention (as PagedAttentionParams::sliding_window): > 0
  // limits query row i at position pos to the keys at (pos - sliding_window,
  // pos]; 0 = causal over the whole context. Keys wholly before every row's
  // window are not read. On kCUDA a windowed call runs kSimt.
  int sliding_window = 0;
  // Soft-capping of the scores (Gemma 2's attn_logit_softcapping): > 0
  // replaces each scaled score s by logit_softcap * tanh(s / logit_softcap)
  // before the window mask and the softmax (HF eager_attention_forward). 0 =
  // none. On kCUDA a soft-capped call runs kSimt.
  float logit_softcap = 0.0f;
  const int32_t* host_query_start_loc = nullptr;  // validation copies for kCUDA
  const int32_t* host_seq_lens = nullptr;
  const int32_t* host_block_tables = nullptr;
  void* stream = nullptr;
  // Which kernel runs on kCUDA: kAuto = the environment variable
  // PAGEDSERVE_PREFILL_KERNEL (auto|simt|mma, read once) or else kSimt. A
  // kMma request that does not fit (PrefillMmaFits), or a windowed or
  // soft-capped call, runs kSimt.
  PrefillKernel kernel = PrefillKernel::kAuto;
};

// Checks shapes, io_dtype (ValidateIoDType), q_len(s) <= seq_lens[s], block ids and lengths (where
// host-readable). InvalidArgument naming the field and index.
absl::Status ValidatePrefillAttention(const PrefillAttentionParams& p);

// Causal attention of every query row to its sequence's cached keys/values.
// Validates first; nothing is written on error. An unknown
// PAGEDSERVE_PREFILL_KERNEL value is InvalidArgument.
absl::Status PrefillAttention(const PrefillAttentionParams& p);

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_PREFILL_ATTENTION_H_
