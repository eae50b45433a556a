// Sizes of the tensor-core prefill attention kernel
// (prefill_attention_mma_kernels.cuh), in plain C++ for the dispatcher and
// the launcher.
#ifndef PAGEDSERVE_KERNELS_CUDA_PREFILL_ATTENTION_MMA_PLAN_H_
#define PAGEDSERVE_KERNELS_CUDA_PREFILL_ATTENTION_MMA_PLAN_H_

#include <cstddef>

namespace pagedserve::kernels::cuda {

inline constexpr int kPrefillMmaThreads = 128;
inline constexpr int kPrefillMmaRows = 64;  // query rows per block: 16 per warp
inline constexpr int kPrefillMmaKeyTile = 32;
// Shared-memory row strides (elements): 16-bit K, V and Q rows padded by 8
// (16 bytes, keeps WMMA's 32-byte alignment of 16-row steps and spreads
// banks), P rows by 8, fp32 accumulator rows by 4.
constexpr int PrefillMmaKvStride(int head_size) { return head_size + 8; }
inline constexpr int kPrefillMmaPStride = kPrefillMmaKeyTile + 8;
constexpr int PrefillMmaAccStride(int head_size) { return head_size + 4; }

// Head sizes the CUDA build instantiates it for (as GqaMmaBuiltFor).
constexpr bool PrefillMmaBuiltFor(int head_size) { return head_size == 64 || head_size == 128; }

// Dynamic shared memory of one block, in bytes, in its layout order: 16-bit
// K and V tiles [32][head + 8], 16-bit queries [64][head + 8], 16-bit P_hi
// and P_lo [64][40], fp32 logits [64][32], fp32 accumulators [64][head + 4],
// fp32 running max, sum and rescale factor [64] each (87,808 bytes at head
// 128, 55,040 at head 64: above the 48 KiB default, opted in at launch).
constexpr size_t PrefillMmaSharedBytes(int head_size) {
  return 2 * (2 * static_cast<size_t>(kPrefillMmaKeyTile) * PrefillMmaKvStride(head_size) +
              static_cast<size_t>(kPrefillMmaRows) * PrefillMmaKvStride(head_size) +
              2 * static_cast<size_t>(kPrefillMmaRows) * kPrefillMmaPStride) +
         4 * (static_cast<size_t>(kPrefillMmaRows) * kPrefillMmaKeyTile +
              static_cast<size_t>(kPrefillMmaRows) * PrefillMmaAccStride(head_size) +
              3 * kPrefillMmaRows);
}

}  // namespace pagedserve::kernels::cuda

#endif  // PAGEDSERVE_KERNELS_CUDA_PREFILL_ATTENTION_MMA_PLAN_H_
