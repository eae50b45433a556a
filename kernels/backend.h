// Internal: the functions each backend implements. The public entry points in
// kernels/*.h validate their arguments, then call the backend that matches
// KVCacheView::device (see dispatch.cc). Backend functions may assume valid
// arguments. Not part of the public interface.
#ifndef PAGEDSERVE_KERNELS_BACKEND_H_
#define PAGEDSERVE_KERNELS_BACKEND_H_

#include <span>

#include "absl/status/status.h"
#include "kernels/cache_ops.h"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"
#include "kernels/reshape_and_cache.h"

namespace pagedserve::kernels {

namespace cpu {
absl::Status ReshapeAndCache(const ReshapeAndCacheParams& p);
absl::Status PagedAttentionV1(const PagedAttentionParams& p);
absl::Status PagedAttentionV2(const PagedAttentionParams& p);
absl::Status PrefillAttention(const PrefillAttentionParams& p);
absl::Status CopyBlocks(std::span<const KVCacheView> layers, std::span<const BlockCopy> pairs);
// src/dst both host memory here.
absl::Status SwapBlocks(std::span<const KVCacheView> src, std::span<const KVCacheView> dst,
                        std::span<const BlockCopy> pairs);
}  // namespace cpu

#ifdef PAGEDSERVE_WITH_CUDA
namespace cuda {
absl::Status ReshapeAndCache(const ReshapeAndCacheParams& p);
absl::Status PagedAttentionV1(const PagedAttentionParams& p);
absl::Status PagedAttentionV2(const PagedAttentionParams& p);
// Group size within GqaDecodeFits (checked by the caller); tensor_cores:
// the WMMA variant (GqaMmaFits, checked by the caller).
absl::Status PagedAttentionGqa(const PagedAttentionParams& p, bool tensor_cores = false);
// tensor_cores: the WMMA variant (PrefillMmaFits, checked by the caller).
absl::Status PrefillAttention(const PrefillAttentionParams& p, bool tensor_cores = false);
absl::Status CopyBlocks(std::span<const KVCacheView> layers, std::span<const BlockCopy> pairs,
                        void* stream);
// Any mix of kCPU / kCUDA views (cudaMemcpyAsync with the right kind).
absl::Status SwapBlocks(std::span<const KVCacheView> src, std::span<const KVCacheView> dst,
                        std::span<const BlockCopy> pairs, void* stream);
}  // namespace cuda
#endif

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_BACKEND_H_
