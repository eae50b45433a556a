// Decode attention over the paged KV cache: one query token per sequence.
//
// PagedAttention v1 and v2 as in vLLM (csrc/attention/attention_kernels.cu):
// v1 makes one pass over the whole context per (head, sequence); v2 splits the
// context into partitions of kPartitionSize tokens (a context-length partition,
// not a number of GPUs), each writing its max logit, exp-sum and partial output,
// and a reduce step combines them with the usual log-sum-exp rescaling. On
// CUDA a third kernel, GQA decode, serves all query heads of a KV head from one
// read of the K/V (PagedAttentionGqa), with a tensor-core variant taken only
// when asked (kGqaMma); ChooseDecodeKernel picks among them.
#ifndef PAGEDSERVE_KERNELS_PAGED_ATTENTION_H_
#define PAGEDSERVE_KERNELS_PAGED_ATTENTION_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/partition.h"  // kPartitionSize, NumPartitions
#include "kernels/types.h"

namespace pagedserve::kernels {

// The decode attention kernels PagedAttention() chooses from (see
// ChooseDecodeKernel). kAuto = let the dispatcher decide. kGqaMma, the GQA
// kernel with its dot products on tensor cores
// (kernels/cuda/gqa_decode_mma_kernels.cuh), runs only when requested: no
// device has run it yet, so kAuto never picks it.
enum class DecodeKernel : uint8_t { kAuto, kV1, kV2, kGqa, kGqaMma };
// "auto", "v1", "v2", "gqa", "gqa_mma".
const char* DecodeKernelName(DecodeKernel k);
// Parses a DecodeKernelName() string; false (and *k untouched) otherwise.
bool ParseDecodeKernel(const char* name, DecodeKernel* k);

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
  const int32_t* seq_lens = nullptr;    // [num_seqs], context tokens incl. the current one; >= 1
  int max_seq_len = 0;                  // >= every seq_lens[s]; sizes the v2 partitions
  float scale = 1.0f;                   // softmax scale, usually 1/sqrt(head_size)
  const float* alibi_slopes = nullptr;  // [num_heads] fp32 or null (no ALiBi)
  // Sliding-window attention (Mistral's sliding_window, Gemma's local layers;
  // Beltagy et al. 2020, "Longformer"): > 0 limits the query at position p
  // (= seq_len - 1) to the keys at positions (p - sliding_window, p], i.e. the
  // last sliding_window tokens, itself included -- Hugging Face's
  // sliding-window causal mask. 0 = the whole context. Blocks wholly before
  // the window are not read (nor need they hold anything finite); on kCUDA a
  // windowed call runs v1/v2 (ChooseDecodeKernel), not the GQA kernels.
  int sliding_window = 0;
  // Soft-capping of the scores (Gemma 2's attn_logit_softcapping): > 0
  // replaces each scaled score s by logit_softcap * tanh(s / logit_softcap)
  // before the window mask and the softmax (HF eager_attention_forward). 0 =
  // none. On kCUDA a soft-capped call runs v1/v2 (ChooseDecodeKernel), not
  // the GQA kernels (which refuse it with InvalidArgument).
  float logit_softcap = 0.0f;
  // Host-readable copies used only for validation on kCUDA (optional there; on
  // CPU the device arrays are host-readable and are checked directly).
  const int32_t* host_block_tables = nullptr;
  const int32_t* host_seq_lens = nullptr;
  // v2 scratch space of PagedAttentionV2WorkspaceBytes() bytes on the cache's
  // device; may be null on CPU (then allocated internally). The GQA kernel
  // (kCUDA) uses it too, for its context splits; null there means a temporary
  // stream-ordered allocation.
  void* workspace = nullptr;
  // Bytes at `workspace`; 0 means PagedAttentionV2WorkspaceBytes(num_seqs,
  // num_heads, head_size, max_seq_len). The GQA kernel runs at most as many
  // context splits as fit (PagedAttentionGqaWorkspaceBytes() holds its most).
  size_t workspace_bytes = 0;
  void* stream = nullptr;  // cudaStream_t for kCUDA; ignored on CPU
  // Which kernel PagedAttention() runs: kAuto = ChooseDecodeKernel's rule,
  // unless the environment variable PAGEDSERVE_DECODE_KERNEL (auto, v1, v2,
  // gqa) names one. Ignored by PagedAttentionV1/V2/Gqa.
  DecodeKernel kernel = DecodeKernel::kAuto;
};

// Checks shapes, io_dtype against the cache dtype (ValidateIoDType) and, where host-readable, every
// block id (< num_blocks, >= 0) and seq_len (1 <= seq_len <= max_blocks_per_seq * block_size, <=
// max_seq_len). Returns InvalidArgument naming the offending field and index.
absl::Status ValidatePagedAttention(const PagedAttentionParams& p);

// out[s, h] = softmax(scale * q[s,h] . K[s, kv(h)]^T + alibi) V[s, kv(h)] over
// the seq_lens[s] cached tokens. Validates first; nothing is written on error.
absl::Status PagedAttentionV1(const PagedAttentionParams& p);

// Same result as v1, computed per kPartitionSize-token partition then reduced.
absl::Status PagedAttentionV2(const PagedAttentionParams& p);

// Bytes of v2 scratch: fp32 max_logits and exp_sums [num_seqs, num_heads,
// num_partitions] and fp32 partial outputs [num_seqs, num_heads,
// num_partitions, head_size], with num_partitions = ceil(max_seq_len / 512).
size_t PagedAttentionV2WorkspaceBytes(int num_seqs, int num_heads, int head_size, int max_seq_len);

// vLLM's heuristic: v1 when max_seq_len <= 8192 and either the context fits in
// one partition or num_seqs * num_heads > 512 (enough parallelism without
// splitting the context); v2 otherwise.
bool ShouldUsePagedAttentionV1(int num_seqs, int num_heads, int max_seq_len);

// GQA-aware decode kernel (kCUDA only; kernels/cuda/gqa_decode_kernels.cuh):
// one thread block per (KV head, sequence, context split) loads each K/V tile
// once into shared memory for all num_heads / num_kv_heads query heads of the
// group (FlashInfer's decode approach), online softmax in fp32 across tiles,
// then the v2 log-sum-exp reduce across splits. The number of splits comes
// from the device's occupancy (kernels/cuda/gqa_decode_plan.h). Same result as
// v1; any group size >= 1 whose shared memory fits (GqaDecodeFits).
// InvalidArgument for a sliding window or a soft cap (v1/v2 take them). On
// kCPU: FailedPrecondition (the CPU backend has no separate GQA kernel).
absl::Status PagedAttentionGqa(const PagedAttentionParams& p);

// The same decode with the GQA kernel's two dot products (Q K^T and P V) on
// tensor cores (WMMA m16n16k16, fp32 accumulation; P split into two 16-bit
// parts so that the result meets v1's accuracy standard):
// kernels/cuda/gqa_decode_mma_kernels.cuh. Takes fp16/bf16 caches with
// operands of the same type, head sizes 64 and 128 (the instantiations the
// build carries; the kernel itself takes any multiple of 16) and groups of at
// most 16 heads (GqaMmaFits), without a window or soft cap; InvalidArgument otherwise,
// FailedPrecondition on kCPU. Verified through the CPU emulator only.
absl::Status PagedAttentionGqaMma(const PagedAttentionParams& p);

// Whether the tensor-core GQA kernel takes this cache element type, head
// size and group size (within the dispatcher's shared-memory limit).
bool GqaMmaFits(DType dtype, int head_size, int group_size);

// Whether the GQA kernel's shared memory for this head size and group size
// (num_heads / num_kv_heads) is within the limit the dispatcher allows.
bool GqaDecodeFits(int head_size, int group_size);

// Bytes of scratch the GQA kernel uses at most for this shape (its largest
// split count for max_seq_len; 0 when the context is too short to split);
// passing that much (and workspace_bytes) lets it split as finely as the
// device wants. The kernel's plan also costs a few host-side CUDA runtime
// calls per launch (occupancy and attribute queries; no synchronization).
size_t PagedAttentionGqaWorkspaceBytes(int num_seqs, int num_heads, int head_size, int max_seq_len);

struct DecodeKernelChoice {
  DecodeKernel kernel = DecodeKernel::kV1;  // never kAuto
  std::string reason;                       // one line: why this kernel
};

// THE decode-kernel choice (PagedAttention() follows it; tests assert on it):
//  - `requested` v1 or v2: that kernel (comparison and fallback path).
//  - `requested` gqa_mma: the tensor-core GQA kernel when the call fits it
//    (kCUDA, GqaMmaFits; the device-level overload, which has no dtype,
//    answers gqa instead); otherwise the rules below.
//  - kCPU: v1/v2 by ShouldUsePagedAttentionV1 (the CPU v1/v2 already run one
//    task per (sequence, KV head) for the whole group; a kGqa request too).
//  - kCUDA, group size num_heads / num_kv_heads >= 2 and GqaDecodeFits (or
//    `requested` kGqa and it fits): the GQA kernel -- v1/v2 would stream the
//    same K/V group_size times, once per query head.
//  - kCUDA, group size 1 (MHA): v1/v2 by ShouldUsePagedAttentionV1; nothing
//    to share, and v1/v2 are the reference kernels.
//  - kCUDA, group too large for the GQA shared memory: v1/v2.
// Pure: no device access. Arguments as in PagedAttentionParams.
DecodeKernelChoice ChooseDecodeKernel(Device device, int num_seqs, int num_heads, int num_kv_heads,
                                      int head_size, int max_seq_len,
                                      DecodeKernel requested = DecodeKernel::kAuto);

// The rule above for one concrete call (what PagedAttention() runs): an fp8
// cache, or operands in another type than the cache (io_dtype), stays on v1/v2
// whatever was requested, because only they convert in registers; the GQA
// kernel reads fp32/fp16/bf16 caches with operands of the same type. A
// sliding window (sliding_window > 0) or a soft cap (logit_softcap > 0) also
// stays on v1/v2: only they take them.
DecodeKernelChoice ChooseDecodeKernel(const PagedAttentionParams& p, DecodeKernel requested);

// The kernel the environment variable PAGEDSERVE_DECODE_KERNEL names
// (auto|v1|v2|gqa|gqa_mma; kAuto when unset or empty), read once per
// process. InvalidArgument for another value. Thread-safe.
absl::StatusOr<DecodeKernel> DecodeKernelFromEnvironment();

// Runs the kernel ChooseDecodeKernel picks for p (p.kernel, else
// PAGEDSERVE_DECODE_KERNEL=auto|v1|v2|gqa|gqa_mma, else kAuto). An unknown
// PAGEDSERVE_DECODE_KERNEL value is InvalidArgument.
absl::Status PagedAttention(const PagedAttentionParams& p);

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_PAGED_ATTENTION_H_
