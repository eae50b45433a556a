// Host-side planning of the GQA decode attention kernel
// (kernels/cuda/gqa_decode_kernels.cuh): its tile size, its shared-memory
// footprint and how many context splits it runs. Plain C++ (no CUDA headers,
// no Abseil) so that the dispatcher (kernels/dispatch.cc, also built without
// CUDA), the CUDA launcher (nvcc) and host-only unit tests share one
// definition; nothing here touches a device.
//
// Split planning (PlanGqaSplits): the kernel runs one thread block per
// (sequence, KV head, context split). With few sequences x KV heads the device
// is mostly idle unless each context is split, so the number of splits is
// chosen to fill the device once:
//
//   slots   = num_sms * blocks_per_sm          (blocks_per_sm from
//             cudaOccupancyMaxActiveBlocksPerMultiprocessor for this kernel's
//             threads and dynamic shared memory)
//   want    = ceil(slots / (num_seqs * num_kv_heads))
//   splits  = min(want, tiles / kGqaMinTilesPerSplit, max_splits), >= 1
//
// where tiles = ceil(max_seq_len / kGqaTileTokens), so every split holds at
// least kGqaMinTilesPerSplit tiles (the partial outputs and the reduce cost
// about as much as a few tiles of K/V), and max_splits is what the caller's
// workspace holds. The splits are then rebalanced to whole tiles
// (split_tokens = ceil(tiles / splits) tiles) and splits that would be empty
// are dropped. One split means a single pass that writes the output directly
// (no workspace, no reduce). Idea after FlashInfer's split-KV decode
// scheduling (flashinfer/include/flashinfer/attention/scheduler.cuh), reduced
// to a per-launch rule on max_seq_len.
#ifndef PAGEDSERVE_KERNELS_CUDA_GQA_DECODE_PLAN_H_
#define PAGEDSERVE_KERNELS_CUDA_GQA_DECODE_PLAN_H_

#include <cstddef>
#include <cstdint>

namespace pagedserve::kernels::cuda {

// Tokens per K/V tile held in shared memory (one warp lane per token in the
// softmax step). A multiple of every supported block size (8, 16, 32), so a
// tile covers whole 16-byte V vectors of one physical block.
inline constexpr int kGqaTileTokens = 32;
// Fewest tiles a context split may hold (when the context has that many).
inline constexpr int kGqaMinTilesPerSplit = 4;
// Most context splits of one launch (sizes the reduce's shared memory and
// PagedAttentionGqaWorkspaceBytes).
inline constexpr int kGqaMaxSplits = 64;
// Largest dynamic shared memory the dispatcher lets the GQA kernel ask for:
// below the opt-in limit of every architecture the build targets (sm_80: 163
// KiB, sm_90: 227 KiB) and of the consumer parts sm_86/89 (99 KiB).
inline constexpr size_t kGqaMaxSharedBytes = 96 * 1024;

// Row stride, in cache elements, of the K tile in shared memory (kept as
// stored, elem_bytes per element): head_size + one 16-byte vector keeps rows
// 16-byte aligned and shifts consecutive rows by 4 banks, so 16-byte stores or
// reads of one chunk of 8 consecutive rows hit 8 different bank groups.
constexpr int GqaKRowStride(int head_size, int elem_bytes) { return head_size + 16 / elem_bytes; }

// Dynamic shared memory of one GQA decode block, in bytes, for a cache of
// elem_bytes per element (4: fp32, 2: fp16/bf16; the default 4 is the
// largest, so it bounds every dtype): K tile [32][head_size + 16 bytes] and V
// tile [head_size][32] as stored; fp32 queries and accumulators
// [group][head_size] each, logits [group][32], running max / sum / rescale
// factor [group] each.
constexpr size_t GqaDecodeSharedBytes(int head_size, int group_size, int elem_bytes = 4) {
  return static_cast<size_t>(elem_bytes) * kGqaTileTokens *
             (GqaKRowStride(head_size, elem_bytes) + head_size) +
         sizeof(float) * static_cast<size_t>(group_size) * (2 * head_size + kGqaTileTokens + 3);
}

// The tensor-core variant (GqaDecodeMmaKernel, gqa_decode_mma_kernels.cuh):
// the group's query heads are the 16 rows of one m16n16k16 MMA tile, so it
// takes groups of at most kGqaMmaMaxGroup heads, head sizes that are a
// multiple of 16, and fp16/bf16 caches with operands of the same type.
inline constexpr int kGqaMmaRows = 16;
inline constexpr int kGqaMmaMaxGroup = kGqaMmaRows;
// 16-bit row stride of its K, V and query tiles (head_size + 8: rows stay
// 16-byte aligned and tile starts 32-byte aligned, as WMMA loads need), of its
// probability tile (32 + 8), and the fp32 stride of its accumulators.
constexpr int GqaMmaKvStride(int head_size) { return head_size + 8; }
inline constexpr int kGqaMmaPStride = kGqaTileTokens + 8;
constexpr int GqaMmaAccStride(int head_size) { return head_size + 4; }
constexpr bool GqaMmaSupports(int head_size, int group_size) {
  return head_size % 16 == 0 && head_size >= 16 && group_size >= 1 && group_size <= kGqaMmaMaxGroup;
}
// Head sizes the CUDA build instantiates the tensor-core kernel for (the
// common ones: Llama, Mistral, Qwen 128, SmolLM2 64). Each instantiation adds
// its fatbin to every binary, and the GPU check's bundle has a size limit.
constexpr bool GqaMmaBuiltFor(int head_size) { return head_size == 64 || head_size == 128; }
// Dynamic shared memory of a tensor-core attention block with `rows` query
// rows (the GQA decode kernel: 16; the prefill kernel,
// prefill_attention_mma_kernels.cuh: 64), in bytes, in its layout order
// (every piece a multiple of 32 bytes; MmaAttentionSmem places them): 16-bit
// K and V tiles [32][head + 8], 16-bit queries [rows][head + 8], 16-bit
// probabilities as two tiles (high and low parts) [rows][40] each, fp32
// logits [rows][32], fp32 accumulators [rows][head + 4], running max / sum /
// rescale factor [rows] each.
constexpr size_t MmaAttentionSharedBytes(int head_size, int rows) {
  return 2 * (2 * static_cast<size_t>(kGqaTileTokens) * GqaMmaKvStride(head_size) +
              static_cast<size_t>(rows) * GqaMmaKvStride(head_size) +
              2 * static_cast<size_t>(rows) * kGqaMmaPStride) +
         4 * (static_cast<size_t>(rows) * kGqaTileTokens +
              static_cast<size_t>(rows) * GqaMmaAccStride(head_size) +
              3 * static_cast<size_t>(rows));
}
// The GQA decode kernel's block.
constexpr size_t GqaMmaSharedBytes(int head_size) {
  return MmaAttentionSharedBytes(head_size, kGqaMmaRows);
}

struct GqaSplitPlan {
  int num_splits = 1;    // grid z; 1 = single pass, output written directly
  int split_tokens = 0;  // context tokens per split, a multiple of kGqaTileTokens; 0 iff 1 split
};

// The plan for a launch (see the file comment). num_sms and blocks_per_sm
// describe the device (values < 1 count as 1); num_seqs, num_kv_heads >= 1;
// max_seq_len >= 1; max_splits < 1 counts as 1. Deterministic, no device access.
inline GqaSplitPlan PlanGqaSplits(int num_sms, int blocks_per_sm, int num_seqs, int num_kv_heads,
                                  int max_seq_len, int max_splits) {
  const int64_t slots =
      static_cast<int64_t>(num_sms < 1 ? 1 : num_sms) * (blocks_per_sm < 1 ? 1 : blocks_per_sm);
  int64_t base = static_cast<int64_t>(num_seqs) * num_kv_heads;
  if (base < 1) base = 1;
  const int64_t tiles = max_seq_len < 1 ? 1 : (max_seq_len + kGqaTileTokens - 1) / kGqaTileTokens;
  int64_t splits = (slots + base - 1) / base;
  const int64_t by_tiles = tiles / kGqaMinTilesPerSplit;
  if (splits > by_tiles) splits = by_tiles;
  if (splits > max_splits) splits = max_splits;
  if (splits > kGqaMaxSplits) splits = kGqaMaxSplits;
  if (splits <= 1) return {1, 0};
  const int64_t tiles_per_split = (tiles + splits - 1) / splits;
  splits = (tiles + tiles_per_split - 1) / tiles_per_split;  // no empty trailing split
  if (splits <= 1) return {1, 0};
  return {static_cast<int>(splits), static_cast<int>(tiles_per_split * kGqaTileTokens)};
}

// fp32 scratch of a GQA launch with `num_splits` splits: max_logits and
// exp_sums [num_seqs, num_heads, num_splits], partial outputs [num_seqs,
// num_heads, num_splits, head_size] -- the v2 workspace layout with num_splits
// in place of the v2 partition count.
constexpr size_t GqaWorkspaceBytes(int num_seqs, int num_heads, int head_size, int num_splits) {
  return static_cast<size_t>(num_seqs) * static_cast<size_t>(num_heads) *
         static_cast<size_t>(num_splits) * (2 + static_cast<size_t>(head_size)) * sizeof(float);
}

// Most splits a workspace of `bytes` bytes holds for this shape (0 if none).
constexpr int GqaSplitsThatFit(size_t bytes, int num_seqs, int num_heads, int head_size) {
  const size_t per_split = GqaWorkspaceBytes(num_seqs, num_heads, head_size, 1);
  if (per_split == 0) return 0;
  const size_t n = bytes / per_split;
  return n > static_cast<size_t>(kGqaMaxSplits) ? kGqaMaxSplits : static_cast<int>(n);
}

}  // namespace pagedserve::kernels::cuda

#endif  // PAGEDSERVE_KERNELS_CUDA_GQA_DECODE_PLAN_H_
