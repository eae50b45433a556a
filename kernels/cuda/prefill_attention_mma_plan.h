// Sizes of the tensor-core prefill attention kernel
// (prefill_attention_mma_kernels.cuh), in plain C++ for the dispatcher and
// the launcher.
#ifndef PAGEDSERVE_KERNELS_CUDA_PREFILL_ATTENTION_MMA_PLAN_H_
#define PAGEDSERVE_KERNELS_CUDA_PREFILL_ATTENTION_MMA_PLAN_H_

#include <cstddef>

#include "kernels/cuda/gqa_decode_plan.h"

namespace pagedserve::kernels::cuda {

inline constexpr int kPrefillMmaThreads = 128;
inline constexpr int kPrefillMmaRows = 64;  // query rows per block: 16 per warp
// Key tiles, shared-memory strides and layout are the GQA tensor-core
// kernel's (gqa_decode_plan.h), with 64 query rows instead of 16.
inline constexpr int kPrefillMmaKeyTile = kGqaTileTokens;

// Head sizes the CUDA build instantiates it for (as GqaMmaBuiltFor).
constexpr bool PrefillMmaBuiltFor(int head_size) { return head_size == 64 || head_size == 128; }

// Dynamic shared memory of one block (MmaAttentionSharedBytes): 87,808 bytes
// at head 128, 55,040 at head 64, above the 48 KiB default (opted in at
// launch).
constexpr size_t PrefillMmaSharedBytes(int head_size) {
  return MmaAttentionSharedBytes(head_size, kPrefillMmaRows);
}

}  // namespace pagedserve::kernels::cuda

#endif  // PAGEDSERVE_KERNELS_CUDA_PREFILL_ATTENTION_MMA_PLAN_H_
