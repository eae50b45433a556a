#include "kernels/types.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pagedserve::kernels {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32: return "f32";
    case DType::kFloat16: return "f16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat8E4M3: return "fp8_e4m3";
    case DType::kFloat8E5M2: return "fp8_e5m2";
  }
  return "?";
}

const char* DeviceName(Device d) { return d == Device::kCPU ? "cpu" : "cuda"; }

bool IsSupportedHeadSize(int h) {
  return h == 64 || h == 80 || h == 96 || h == 112 || h == 128 || h == 256;
}

bool IsSupportedBlockSize(int b) { return b == 8 || b == 16 || b == 32; }

absl::Status ValidateIoDType(const std::optional<DType>& io_dtype, DType cache, const char* field) {
  if (static_cast<int>(cache) > static_cast<int>(DType::kFloat8E5M2))
    return absl::InvalidArgumentError(
        absl::StrCat("cache dtype ", static_cast<int>(cache), " is not a DType"));
  if (IsFp8(cache)) {
    if (!io_dtype.has_value())
      return absl::InvalidArgumentError(absl::StrCat(
          field, " must be set (f32, f16 or bf16) for an ", DTypeName(cache), " cache"));
    if (static_cast<int>(*io_dtype) > static_cast<int>(DType::kBFloat16))
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must be f32, f16 or bf16 for an ", DTypeName(cache), " cache, got ",
                       static_cast<int>(*io_dtype) <= static_cast<int>(DType::kFloat8E5M2)
                           ? DTypeName(*io_dtype)
                           : "an unknown dtype"));
    return absl::OkStatus();
  }
  if (io_dtype.has_value() && *io_dtype != cache)
    return absl::InvalidArgumentError(absl::StrCat(
        field, " (",
        static_cast<int>(*io_dtype) <= static_cast<int>(DType::kFloat8E5M2) ? DTypeName(*io_dtype)
                                                                            : "an unknown dtype",
        ") must equal the cache dtype (", DTypeName(cache), ") for a non-fp8 cache"));
  return absl::OkStatus();
}

absl::Status ValidateCacheView(const KVCacheView& c) {
  const KVCacheShape& s = c.shape;
  if (static_cast<int>(s.dtype) > static_cast<int>(DType::kFloat8E5M2))
    return absl::InvalidArgumentError(
        absl::StrCat("cache.dtype ", static_cast<int>(s.dtype), " is not a DType"));
  if (s.num_blocks <= 0)
    return absl::InvalidArgumentError(
        absl::StrCat("cache.num_blocks must be > 0, got ", s.num_blocks));
  if (s.num_kv_heads <= 0)
    return absl::InvalidArgumentError(
        absl::StrCat("cache.num_kv_heads must be > 0, got ", s.num_kv_heads));
  if (!IsSupportedHeadSize(s.head_size))
    return absl::InvalidArgumentError(absl::StrCat("unsupported head_size ", s.head_size,
                                                   " (supported: 64, 80, 96, 112, 128, 256)"));
  if (!IsSupportedBlockSize(s.block_size))
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported block_size ", s.block_size, " (supported: 8, 16, 32)"));
  if (s.head_size % s.x() != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("head_size ", s.head_size, " is not a multiple of x=", s.x()));
  if (c.key_cache == nullptr || c.value_cache == nullptr)
    return absl::InvalidArgumentError("cache.key_cache and cache.value_cache must be non-null");
  if (!std::isfinite(c.k_scale) || !(c.k_scale > 0.0f))
    return absl::InvalidArgumentError(
        absl::StrCat("cache.k_scale must be finite and > 0, got ", c.k_scale));
  if (!std::isfinite(c.v_scale) || !(c.v_scale > 0.0f))
    return absl::InvalidArgumentError(
        absl::StrCat("cache.v_scale must be finite and > 0, got ", c.v_scale));
  return absl::OkStatus();
}

}  // namespace pagedserve::kernels
