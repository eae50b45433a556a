#include "runtime/model/dequant.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "kernels/weight_format.h"

namespace pagedserve {

namespace {

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
float LoadHalf(const uint8_t* p) { return Fp16ToFp32(LoadU16(p)); }

// K-quants: 256-element super-blocks.
// Q2_K: scales[16] (low nibble scale, high nibble min, per 16 elements),
// qs[64] (2-bit), d, dmin.
void DequantQ2_K(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* q = b + 16;
  float d = LoadHalf(b + 80), dmin = LoadHalf(b + 82);
  int is = 0;
  for (int n = 0; n < 256; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        uint8_t sc = scales[is++];
        float dl = d * static_cast<float>(sc & 0x0f);
        float ml = dmin * static_cast<float>(sc >> 4);
        for (int l = 0; l < 16; ++l) {
          *y++ = dl * static_cast<float>((q[l + 16 * half] >> shift) & 3) - ml;
        }
      }
      shift += 2;
    }
    q += 32;
  }
}

// Q3_K: hmask[32] (third bit), qs[64] (low 2 bits), 12 bytes of packed 6-bit
// scales (16 of them, offset by 32), d.
void DequantQ3_K(const uint8_t* b, float* y) {
  const uint8_t* hm = b;
  const uint8_t* q = b + 32;
  const uint8_t* packed = b + 96;
  float d = LoadHalf(b + 108);
  int8_t scales[16];
  for (int i = 0; i < 16; ++i) {
    // Low 4 bits: nibble i%8 of bytes 0..7 (low nibbles for i<8, high for i>=8);
    // high 2 bits: bits 2*(i/4)..+1 ... of bytes 8..11, byte 8 + i%4.
    int low = (i < 8) ? (packed[i] & 0x0f) : (packed[i - 8] >> 4);
    int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 3;
    scales[i] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
  int is = 0;
  uint8_t m = 1;
  for (int n = 0; n < 256; n += 128) {
    int shift = 0;
    for (int j = 0; j < 4; ++j) {
      for (int half = 0; half < 2; ++half) {
        float dl = d * static_cast<float>(scales[is++]);
        for (int l = 0; l < 16; ++l) {
          int idx = l + 16 * half;
          int v = ((q[idx] >> shift) & 3) - ((hm[idx] & m) ? 0 : 4);
          *y++ = dl * static_cast<float>(v);
        }
      }
      shift += 2;
      m <<= 1;
    }
    q += 32;
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

// Formats dequantized here; the others (the formats Linear runs) by
// kernels::DequantizeRowToFloat, so that their block layouts live in one place.
BlockFn BlockFunction(GgmlType type) {
  switch (type) {
    case GgmlType::kQ2_K: return DequantQ2_K;
    case GgmlType::kQ3_K: return DequantQ3_K;
    default: return nullptr;
  }
}

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

bool CanDequantize(GgmlType type) { return IsKernelFormat(type) || BlockFunction(type) != nullptr; }

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
  if (IsKernelFormat(type)) {
    return kernels::DequantizeRowToFloat(static_cast<kernels::WeightType>(type), p,
                                         static_cast<int64_t>(n), dst);
  }
  BlockFn fn = BlockFunction(type);
  for (size_t i = 0; i < blocks; ++i) {
    fn(p + i * bi.block_bytes, dst + i * bi.block_elements);
  }
  return absl::OkStatus();
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
