#include "kernels/weight_format.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/linear_cpu.h"

namespace pagedserve::kernels {

bool IsWeightType(uint32_t id) {
  switch (id) {
    case 0:
    case 1:
    case 2:
    case 3:
    case 6:
    case 7:
    case 8:
    case 10:
    case 11:
    case 12:
    case 13:
    case 14:
    case 20:
    case 23:
    case 30: return true;
    default: return false;
  }
}

const char* WeightTypeName(WeightType type) {
  switch (type) {
    case WeightType::kF32: return "F32";
    case WeightType::kF16: return "F16";
    case WeightType::kQ4_0: return "Q4_0";
    case WeightType::kQ4_1: return "Q4_1";
    case WeightType::kQ5_0: return "Q5_0";
    case WeightType::kQ5_1: return "Q5_1";
    case WeightType::kQ8_0: return "Q8_0";
    case WeightType::kQ2_K: return "Q2_K";
    case WeightType::kQ3_K: return "Q3_K";
    case WeightType::kQ4_K: return "Q4_K";
    case WeightType::kQ5_K: return "Q5_K";
    case WeightType::kQ6_K: return "Q6_K";
    case WeightType::kIQ4_NL: return "IQ4_NL";
    case WeightType::kIQ4_XS: return "IQ4_XS";
    case WeightType::kBF16: return "BF16";
    case WeightType::kQ4_0x8: return "Q4_0x8";
    case WeightType::kQ4_1x8: return "Q4_1x8";
  }
  return "?";
}

int64_t BlockElems(WeightType type) {
  switch (type) {
    case WeightType::kF32:
    case WeightType::kF16:
    case WeightType::kBF16: return 1;
    case WeightType::kQ4_0:
    case WeightType::kQ4_1:
    case WeightType::kQ5_0:
    case WeightType::kQ5_1:
    case WeightType::kQ8_0:
    case WeightType::kQ4_0x8:
    case WeightType::kQ4_1x8:
    case WeightType::kIQ4_NL: return 32;
    case WeightType::kQ2_K:
    case WeightType::kQ3_K:
    case WeightType::kQ4_K:
    case WeightType::kQ5_K:
    case WeightType::kQ6_K:
    case WeightType::kIQ4_XS: return 256;
  }
  return 0;
}

size_t BlockBytes(WeightType type) {
  switch (type) {
    case WeightType::kF32: return 4;
    case WeightType::kF16:
    case WeightType::kBF16: return 2;  // both 16-bit
    case WeightType::kQ4_0:
    case WeightType::kQ4_0x8: return 18;
    case WeightType::kQ4_1:
    case WeightType::kQ4_1x8: return 20;
    case WeightType::kQ5_0: return 22;
    case WeightType::kQ5_1: return 24;
    case WeightType::kQ8_0: return 34;
    case WeightType::kQ2_K: return 84;
    case WeightType::kQ3_K: return 110;
    case WeightType::kQ4_K: return 144;
    case WeightType::kQ5_K: return 176;
    case WeightType::kQ6_K: return 210;
    case WeightType::kIQ4_NL: return 18;
    case WeightType::kIQ4_XS: return 136;
  }
  return 0;
}

absl::StatusOr<size_t> RowBytes(WeightType type, int64_t cols) {
  const int64_t block = BlockElems(type);
  if (block == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight type id ", static_cast<int>(type), " is not a supported format"));
  }
  if (cols < 0 || cols % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(WeightTypeName(type), ": ", cols,
                                                   " columns is not a multiple of the block of ",
                                                   block, " elements"));
  }
  return static_cast<size_t>(cols / block) * BlockBytes(type);
}

absl::Status ValidateWeightView(const WeightView& w) {
  if (BlockElems(w.type) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("w.type: id ", static_cast<int>(w.type), " is not a supported format"));
  }
  if (w.rows <= 0)
    return absl::InvalidArgumentError(absl::StrCat("w.rows must be > 0, got ", w.rows));
  if (w.cols <= 0)
    return absl::InvalidArgumentError(absl::StrCat("w.cols must be > 0, got ", w.cols));
  absl::StatusOr<size_t> row_bytes = RowBytes(w.type, w.cols);
  if (!row_bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("w.cols: ", row_bytes.status().message()));
  }
  if (w.data == nullptr) return absl::InvalidArgumentError("w.data is null");
  if (w.row_stride_bytes < *row_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("w.row_stride_bytes ", w.row_stride_bytes, " is less than the ", *row_bytes,
                     " bytes of one ", WeightTypeName(w.type), " row of ", w.cols, " columns"));
  }
  if (IsInterleavedRows8(w.type) && (w.rows % 8 != 0 || w.row_stride_bytes != *row_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(WeightTypeName(w.type), " interleaves 8 contiguous rows: w.rows (", w.rows,
                     ") must be a multiple of 8 and w.row_stride_bytes (", w.row_stride_bytes,
                     ") the row's ", *row_bytes, " bytes"));
  }
  if (w.type == WeightType::kF32 &&
      (reinterpret_cast<uintptr_t>(w.data) % 4 != 0 || w.row_stride_bytes % 4 != 0)) {
    return absl::InvalidArgumentError(
        "w.data and w.row_stride_bytes must be 4-byte aligned for F32");
  }
  return absl::OkStatus();
}

absl::Status DequantizeRowToFloat(WeightType type, const void* row, int64_t cols, float* dst) {
  if (BlockElems(type) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("type: id ", static_cast<int>(type), " is not a supported format"));
  }
  if (cols <= 0) return absl::InvalidArgumentError(absl::StrCat("cols must be > 0, got ", cols));
  absl::StatusOr<size_t> row_bytes = RowBytes(type, cols);
  if (!row_bytes.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("cols: ", row_bytes.status().message()));
  }
  if (row == nullptr) return absl::InvalidArgumentError("row is null");
  if (dst == nullptr) return absl::InvalidArgumentError("dst is null");
  if (IsInterleavedRows8(type))
    return absl::InvalidArgumentError(
        absl::StrCat("type: ", WeightTypeName(type), " rows are interleaved, not one row's bytes"));
  cpu::DequantizeWeightRow(type, static_cast<const uint8_t*>(row), cols, dst);
  return absl::OkStatus();
}

}  // namespace pagedserve::kernels
