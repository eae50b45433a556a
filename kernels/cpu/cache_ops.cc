// CPU copy_blocks (copy-on-write) and swap_blocks (between two host pools):
// whole-block memcpy of K and V, byte-exact.
#include <cstring>

#include "kernels/backend.h"

namespace pagedserve::kernels::cpu {
namespace {

void CopyBlock(const KVCacheView& src, const KVCacheView& dst, const BlockCopy& pair) {
  const size_t bytes = src.shape.block_bytes();
  std::memcpy(static_cast<char*>(dst.key_cache) + pair.dst * bytes,
              static_cast<const char*>(src.key_cache) + pair.src * bytes, bytes);
  std::memcpy(static_cast<char*>(dst.value_cache) + pair.dst * bytes,
              static_cast<const char*>(src.value_cache) + pair.src * bytes, bytes);
}

}  // namespace

absl::Status CopyBlocks(std::span<const KVCacheView> layers, std::span<const BlockCopy> pairs) {
  const int64_t n = static_cast<int64_t>(layers.size()) * static_cast<int64_t>(pairs.size());
  // Pairs are applied in order within a layer (a later pair may read a block an
  // earlier one wrote), so parallelize over layers only.
#pragma omp parallel for schedule(static) if (n > 64 && layers.size() > 1)
  for (size_t i = 0; i < layers.size(); ++i)
    for (const BlockCopy& pair : pairs) CopyBlock(layers[i], layers[i], pair);
  return absl::OkStatus();
}

absl::Status SwapBlocks(std::span<const KVCacheView> src, std::span<const KVCacheView> dst,
                        std::span<const BlockCopy> pairs) {
  const int64_t n = static_cast<int64_t>(src.size()) * static_cast<int64_t>(pairs.size());
#pragma omp parallel for schedule(static) if (n > 64 && src.size() > 1)
  for (size_t i = 0; i < src.size(); ++i)
    for (const BlockCopy& pair : pairs) CopyBlock(src[i], dst[i], pair);
  return absl::OkStatus();
}

}  // namespace pagedserve::kernels::cpu
