// Block-level cache operations driven by the block manager's decisions:
// copy_blocks (copy-on-write) and swap_blocks (device pool <-> host swap pool).
#ifndef PAGEDSERVE_KERNELS_CACHE_OPS_H_
#define PAGEDSERVE_KERNELS_CACHE_OPS_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "kernels/types.h"

namespace pagedserve::kernels {

// A (source block, destination block) pair.
struct BlockCopy {
  int64_t src = 0;
  int64_t dst = 0;
};

// Copy-on-write: for every layer in `layers` and every pair, copies block
// pair.src to block pair.dst within the same pool, for both K and V. All views
// share one shape and device. Pairs are host memory. Errors: InvalidArgument
// for a block id outside [0, num_blocks) or mismatched layer shapes; nothing is
// copied on error.
absl::Status CopyBlocks(std::span<const KVCacheView> layers, std::span<const BlockCopy> pairs,
                        void* stream = nullptr);

// Swap in or out: for every layer i and pair, copies block pair.src of src[i]
// to block pair.dst of dst[i], K and V. src and dst may live on different
// devices (kCUDA <-> kCPU: host buffers should be pinned for speed); their
// shapes must match except num_blocks. Byte-exact. Errors as CopyBlocks.
absl::Status SwapBlocks(std::span<const KVCacheView> src, std::span<const KVCacheView> dst,
                        std::span<const BlockCopy> pairs, void* stream = nullptr);

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_CACHE_OPS_H_
