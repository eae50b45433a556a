#include "runtime/model/dequant.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace pagedserve {

namespace {

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
float LoadHalf(const uint8_t* p) { return Fp16ToFp32(LoadU16(p)); }

// Legacy 32-element blocks. Low nibbles hold elements 0..15, high nibbles 16..31.
void DequantQ4_0(const uint8_t* b, float* y) {
  float d = LoadHalf(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

void DequantQ4_1(const uint8_t* b, float* y) {
  float d = LoadHalf(b), m = LoadHalf(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// Q5: the fifth bit of element j is bit j of the 32-bit qh field.
void DequantQ5_0(const uint8_t* b, float* y) {
  float d = LoadHalf(b);
  uint32_t qh = LoadU32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < 16; ++j) {
    int x0 = (qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
    int x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = static_cast<float>(x0 - 16) * d;
    y[j + 16] = static_cast<float>(x1 - 16) * d;
  }
}

void DequantQ5_1(const uint8_t* b, float* y) {
  float d = LoadHalf(b), m = LoadHalf(b + 2);
  uint32_t qh = LoadU32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < 16; ++j) {
    int x0 = (qs[j] & 0x0f) | (((qh >> j) & 1) << 4);
    int x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
    y[j] = static_cast<float>(x0) * d + m;
    y[j + 16] = static_cast<float>(x1) * d + m;
  }
}

void DequantQ8_0(const uint8_t* b, float* y) {
  float d = LoadHalf(b);
  const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

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

// 6-bit scale and min number j (0..7) of the 12-byte field shared by Q4_K, Q5_K.
void ScaleMinK4(int j, const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K: d, dmin, scales[12], qs[128]; 8 sub-blocks of 32.
void DequantQ4_K(const uint8_t* b, float* y) {
  float d = LoadHalf(b), dmin = LoadHalf(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int is = 0; is < 8; is += 2) {
    uint8_t sc, mn;
    ScaleMinK4(is, scales, &sc, &mn);
    float d1 = d * sc, m1 = dmin * mn;
    ScaleMinK4(is + 1, scales, &sc, &mn);
    float d2 = d * sc, m2 = dmin * mn;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
  }
}

// Q5_K: d, dmin, scales[12], qh[32], qs[128].
void DequantQ5_K(const uint8_t* b, float* y) {
  float d = LoadHalf(b), dmin = LoadHalf(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int is = 0; is < 8; is += 2) {
    uint8_t sc, mn;
    ScaleMinK4(is, scales, &sc, &mn);
    float d1 = d * sc, m1 = dmin * mn;
    ScaleMinK4(is + 1, scales, &sc, &mn);
    float d2 = d * sc, m2 = dmin * mn;
    for (int l = 0; l < 32; ++l) {
      *y++ = d1 * static_cast<float>((ql[l] & 0x0f) + ((qh[l] & u1) ? 16 : 0)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    }
    ql += 32;
    u1 <<= 2;
    u2 <<= 2;
  }
}

// Q6_K: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 scales[16], d.
void DequantQ6_K(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  float d = LoadHalf(b + 208);
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      int is = l / 16;
      int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn BlockFunction(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0: return DequantQ4_0;
    case GgmlType::kQ4_1: return DequantQ4_1;
    case GgmlType::kQ5_0: return DequantQ5_0;
    case GgmlType::kQ5_1: return DequantQ5_1;
    case GgmlType::kQ8_0: return DequantQ8_0;
    case GgmlType::kQ2_K: return DequantQ2_K;
    case GgmlType::kQ3_K: return DequantQ3_K;
    case GgmlType::kQ4_K: return DequantQ4_K;
    case GgmlType::kQ5_K: return DequantQ5_K;
    case GgmlType::kQ6_K: return DequantQ6_K;
    default: return nullptr;
  }
}

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

bool CanDequantize(GgmlType type) {
  return type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16 ||
         BlockFunction(type) != nullptr;
}

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
  switch (type) {
    case GgmlType::kF32:
      if (n > 0) std::memcpy(dst, p, n * 4);
      return absl::OkStatus();
    case GgmlType::kF16:
      for (size_t i = 0; i < n; ++i) dst[i] = Fp16ToFp32(LoadU16(p + 2 * i));
      return absl::OkStatus();
    case GgmlType::kBF16:
      for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToFp32(LoadU16(p + 2 * i));
      return absl::OkStatus();
    default:
      break;
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
      return absl::Status(s.code(), absl::StrCat("tensor '", info.name, "' row ", r, ": ",
                                                 s.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedserve
