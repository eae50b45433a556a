// Weight storage formats of linear layers and a non-owning view of a weight.
//
// A weight is the matrix W[rows, cols] of y = x W^T: rows = out_features,
// cols = in_features. Each row is stored in ggml's block layout, i.e. exactly the
// bytes a GGUF file holds for that row (little-endian; ggml-common.h / gguf-py
// GGML_QUANT_SIZES): F32, F16 and BF16 are plain element arrays; the legacy
// formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 are 32-element blocks with an fp16 scale
// (and an fp16 min for the _1 variants); the K-quants Q2_K, Q3_K, Q4_K, Q5_K,
// Q6_K are 256-element super-blocks; IQ4_NL (32-element blocks) and IQ4_XS
// (256-element super-blocks) hold 4-bit indices into ggml's 16-entry
// non-linear codebook (kvalues_iq4nl). Block byte layouts are spelled out in
// kernels/cpu/quant_blocks.h.
#ifndef PAGEDSERVE_KERNELS_WEIGHT_FORMAT_H_
#define PAGEDSERVE_KERNELS_WEIGHT_FORMAT_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pagedserve::kernels {

// Values are ggml's type ids (enum ggml_type), so a GGUF tensor's type field
// converts with static_cast after IsWeightType() accepts it.
enum class WeightType : uint8_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kIQ4_NL = 20,
  kIQ4_XS = 23,
  kBF16 = 30,
  // Not ggml types (no file holds them): Q4_0 / Q4_1 blocks of 8 consecutive
  // rows interleaved in memory, made at load by InterleaveRows8
  // (kernels/linear.h) for the x86 paths of Linear. Rows [8g, 8g + 8) occupy
  // the 8 * RowBytes bytes at data + 8g * row_stride_bytes; there, block b of
  // the 8 rows is 8 * BlockBytes bytes (144, Q4_1x8 160) at offset
  // 8 * BlockBytes * b: the 8 rows' fp16 scales d (row 0 first), for Q4_1x8
  // then their fp16 minimums m, then 4 chunks of 32 bytes, chunk c holding
  // bytes [4c, 4c + 4) of the 16 code bytes of rows 0..7 in turn (so that each
  // 32-bit lane of a 256-bit load is one row: its low nibbles are elements
  // 4c..4c+3, its high nibbles 16+4c..). Values as Q4_0 (d * (code - 8)) and
  // Q4_1 (d * code + m). A view of them needs rows % 8 == 0 and
  // row_stride_bytes == RowBytes (ValidateWeightView).
  kQ4_0x8 = 200,
  kQ4_1x8 = 201,
};

// True for kQ4_0x8 and kQ4_1x8.
inline bool IsInterleavedRows8(WeightType t) {
  return t == WeightType::kQ4_0x8 || t == WeightType::kQ4_1x8;
}
// The interleaved layout of `t`: kQ4_0x8 for kQ4_0, kQ4_1x8 for kQ4_1, `t` itself
// for every other type.
inline WeightType InterleavedRows8Of(WeightType t) {
  return t == WeightType::kQ4_0   ? WeightType::kQ4_0x8
         : t == WeightType::kQ4_1 ? WeightType::kQ4_1x8
                                  : t;
}

// True when `ggml_type_id` is one of the WeightType values above.
bool IsWeightType(uint32_t ggml_type_id);

// "F32", "F16", "BF16", "Q4_0", ..., "Q6_K", "IQ4_NL", "IQ4_XS" (ggml's names),
// "Q4_0x8", "Q4_1x8"; "?" for other values.
const char* WeightTypeName(WeightType type);

// Elements per block: 1 for F32/F16/BF16, 32 for Q4_0..Q8_0, Q4_0x8, Q4_1x8 and IQ4_NL, 256 for
// the K-quants and IQ4_XS; 0 for a value that is not a WeightType.
int64_t BlockElems(WeightType type);

// Bytes per block (ggml's type_size): 4, 2, 2, 18 (Q4_0), 20 (Q4_1), 22 (Q5_0),
// 24 (Q5_1), 34 (Q8_0), 84 (Q2_K), 110 (Q3_K), 144 (Q4_K), 176 (Q5_K), 210 (Q6_K),
// 18 (IQ4_NL), 136 (IQ4_XS), 18 / 20 (Q4_0x8 / Q4_1x8: per row, as Q4_0 / Q4_1); 0 for a
// non-WeightType.
size_t BlockBytes(WeightType type);

// Bytes of one row of `cols` elements. InvalidArgument when cols is negative or
// not a multiple of BlockElems(type), or type is not a WeightType.
absl::StatusOr<size_t> RowBytes(WeightType type, int64_t cols);

// A non-owning, read-only, row-major view of W[rows, cols]. Row r starts at
// static_cast<const uint8_t*>(data) + r * row_stride_bytes and holds
// RowBytes(type, cols) bytes in the block layout of `type`. The memory must stay
// valid and unmodified while a kernel reads it (e.g. an mmap'd GGUF file).
// No alignment is required except for kF32, whose data and stride must be
// multiples of 4 bytes.
struct WeightView {
  WeightType type = WeightType::kF32;
  int64_t rows = 0;  // out_features
  int64_t cols = 0;  // in_features; a multiple of BlockElems(type)
  const void* data = nullptr;
  size_t row_stride_bytes = 0;  // >= RowBytes(type, cols)
};

// OK when: type is a WeightType, rows > 0, cols > 0 and a multiple of the block,
// data non-null, row_stride_bytes >= RowBytes(type, cols), for kF32 data and
// row_stride_bytes 4-byte aligned, and for kQ4_0x8 / kQ4_1x8 rows % 8 == 0 and
// row_stride_bytes == RowBytes(type, cols). Otherwise InvalidArgument naming the field
// ("w.cols", "w.row_stride_bytes", ...). Reads no weight bytes.
absl::Status ValidateWeightView(const WeightView& w);

// Converts one row of `cols` elements stored as `type` (RowBytes(type, cols) bytes
// at `row`, no alignment required) to fp32 in dst[0, cols). F32/F16/BF16 are
// exact; a block format gives scale * code (- or + min) in fp32, element for
// element what ggml's dequantize_row_* computes (checked against gguf-py by
// tests/model/dequant_test.cc through runtime/model/dequant.h, which calls this).
// InvalidArgument naming the argument for a non-WeightType, Q4_0x8 / Q4_1x8 (whose rows
// are not contiguous), cols <= 0 or not a multiple of the block, or a null pointer. Thread-safe
// (reads and writes only its arguments).
absl::Status DequantizeRowToFloat(WeightType type, const void* row, int64_t cols, float* dst);

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_WEIGHT_FORMAT_H_
