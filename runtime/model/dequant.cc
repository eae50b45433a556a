#include "runtime/model/dequant.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/weight_format.h"

namespace pagedserve {

namespace {

// kernels::WeightType repeats ggml's ids for the formats the kernels run (the
// kernels layer cannot see this one); the casts here rely on the two agreeing.
#define PS_SAME_ID(name)                                 \
  static_assert(static_cast<uint32_t>(GgmlType::name) == \
                static_cast<uint32_t>(kernels::WeightType::name))
PS_SAME_ID(kF32);
PS_SAME_ID(kF16);
PS_SAME_ID(kBF16);
PS_SAME_ID(kQ4_0);
PS_SAME_ID(kQ4_1);
PS_SAME_ID(kQ5_0);
PS_SAME_ID(kQ5_1);
PS_SAME_ID(kQ8_0);
PS_SAME_ID(kQ4_K);
PS_SAME_ID(kQ5_K);
PS_SAME_ID(kQ6_K);
PS_SAME_ID(kQ2_K);
PS_SAME_ID(kQ3_K);
PS_SAME_ID(kIQ4_NL);
PS_SAME_ID(kIQ4_XS);
#undef PS_SAME_ID

bool IsKernelFormat(GgmlType type) { return kernels::IsWeightType(static_cast<uint32_t>(type)); }

}  // namespace

float Fp16ToFp32(uint16_t h) {
  uint32_t sign = (h >> 15) & 1, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);
  } else if (exp == 31) {
    v = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

float Bf16ToFp32(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

bool CanDequantize(GgmlType type) { return IsKernelFormat(type); }

absl::Status DequantizeRow(GgmlType type, std::span<const uint8_t> src, float* dst, size_t n) {
  if (!CanDequantize(type)) {
    return absl::UnimplementedError(
        absl::StrCat("dequantization of ggml type ", GgmlTypeName(type), " is not supported"));
  }
  GgmlBlockInfo bi;
  GetGgmlBlockInfo(type, &bi);
  if (n % bi.block_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat(GgmlTypeName(type), ": ", n,
                                                   " elements is not a multiple of the block size ",
                                                   bi.block_elements));
  }
  size_t blocks = n / bi.block_elements;
  if (src.size() != blocks * bi.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(GgmlTypeName(type), ": ", n, " elements need ",
                                                   blocks * bi.block_bytes, " bytes, got ",
                                                   src.size()));
  }
  const uint8_t* p = src.data();
  if (n == 0) return absl::OkStatus();
  return kernels::DequantizeRowToFloat(static_cast<kernels::WeightType>(type), p,
                                       static_cast<int64_t>(n), dst);
}

absl::Status DequantizeRows(const GgufTensorInfo& info, std::span<const uint8_t> data,
                            uint64_t row_begin, uint64_t row_end, float* dst) {
  if (row_begin > row_end || row_end > info.num_rows()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", info.name, "': rows [", row_begin,
                                                   ", ", row_end, ") out of range (",
                                                   info.num_rows(), " rows)"));
  }
  if (data.size() < info.size_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", info.name, "': ", data.size(),
                                                   " bytes of data, need ", info.size_bytes));
  }
  const uint64_t cols = info.dims[0];
  for (uint64_t r = row_begin; r < row_end; ++r) {
    auto row = data.subspan(r * info.row_bytes, info.row_bytes);
    absl::Status s = DequantizeRow(info.type, row, dst + (r - row_begin) * cols, cols);
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("tensor '", info.name, "' row ", r, ": ", s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedserve
