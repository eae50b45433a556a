#include "kernels/types.h"

#include "absl/strings/str_cat.h"

namespace pagedserve::kernels {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32: return "f32";
    case DType::kFloat16: return "f16";
    case DType::kBFloat16: return "bf16";
  }
  return "?";
}

const char* DeviceName(Device d) { return d == Device::kCPU ? "cpu" : "cuda"; }

bool IsSupportedHeadSize(int h) {
  return h == 64 || h == 80 || h == 96 || h == 112 || h == 128 || h == 256;
}

bool IsSupportedBlockSize(int b) { return b == 8 || b == 16 || b == 32; }

absl::Status ValidateCacheView(const KVCacheView& c) {
  const KVCacheShape& s = c.shape;
  if (s.num_blocks <= 0)
    return absl::InvalidArgumentError(absl::StrCat("cache.num_blocks must be > 0, got ", s.num_blocks));
  if (s.num_kv_heads <= 0)
    return absl::InvalidArgumentError(absl::StrCat("cache.num_kv_heads must be > 0, got ", s.num_kv_heads));
  if (!IsSupportedHeadSize(s.head_size))
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported head_size ", s.head_size, " (supported: 64, 80, 96, 112, 128, 256)"));
  if (!IsSupportedBlockSize(s.block_size))
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported block_size ", s.block_size, " (supported: 8, 16, 32)"));
  if (s.head_size % s.x() != 0)
    return absl::InvalidArgumentError(absl::StrCat("head_size ", s.head_size,
                                                   " is not a multiple of x=", s.x()));
  if (c.key_cache == nullptr || c.value_cache == nullptr)
    return absl::InvalidArgumentError("cache.key_cache and cache.value_cache must be non-null");
  return absl::OkStatus();
}

}  // namespace pagedserve::kernels
