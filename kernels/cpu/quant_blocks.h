// Byte layouts of ggml's weight blocks and of the 8-bit activation blocks that
// the quantized Linear kernels multiply them with. Internal to the CPU backend.
//
// Weight blocks (ggml-common.h; all fields little-endian, fp16 = IEEE binary16).
// Offsets are in bytes from the start of a block; blocks are packed back to back
// with no alignment, so every multi-byte field is read with memcpy (LoadU16/32).
//   Q4_0 (18 B, 32 el.): d@0; qs[16]@2: element j is the low nibble of qs[j],
//        element j+16 its high nibble; value = d * (q - 8).
//   Q4_1 (20 B): d@0, m@2, qs[16]@4; value = d * q + m.
//   Q5_0 (22 B): d@0, qh(u32)@2, qs[16]@6; bit j of qh is bit 4 of element j;
//        value = d * (q - 16).
//   Q5_1 (24 B): d@0, m@2, qh@4, qs[16]@8; value = d * q + m.
//   Q8_0 (34 B): d@0, int8 qs[32]@2; value = d * q.
//   Q4_K (144 B, 256 el.): d@0, dmin@2, scales[12]@4 (eight 6-bit scales and
//        mins, ScaleMinK4), qs[128]@16: sub-block 2k (32 el.) is the low
//        nibbles of qs[32k..32k+32), sub-block 2k+1 the high nibbles;
//        value = d * scale_j * q - dmin * min_j.
//   Q5_K (176 B): d@0, dmin@2, scales[12]@4, qh[32]@16, qs[128]@48; as Q4_K with
//        bit 4 of element l of sub-block j in bit j of qh[l].
//   Q6_K (210 B): ql[128]@0, qh[64]@128, int8 scales[16]@192, d@208; element
//        128h + 32k + l (h < 2, k < 4, l < 32) has low 4 bits in ql[64h + l +
//        32 (k & 1)] (low nibble for k < 2, high for k >= 2), high 2 bits in
//        bits 2k..2k+1 of qh[32h + l]; value = d * scales[e / 16] * (q - 32).
//   Q2_K (84 B, 256 el.): scales[16]@0 (low nibble: scale, high nibble: min of
//        elements 16g..16g+15), qs[64]@16, d@80, dmin@82; element 128h + 32k +
//        l (h < 2, k < 4, l < 32) is bits 2k..2k+1 of qs[32h + l];
//        value = d * scale_{e/16} * q - dmin * min_{e/16}.
//   Q3_K (110 B, 256 el.): hmask[32]@0, qs[64]@32, scales[12]@96 (sixteen
//        6-bit scales, ScalesQ3K), d@108; element 128h + 32k + l has low 2 bits
//        in bits 2k..2k+1 of qs[32h + l] and high bit in bit 4h + k of
//        hmask[l]; q = low | high << 2 (0..7); value = d * s_{e/16} * (q - 4).
//   IQ4_NL (18 B, 32 el.): d@0, qs[16]@2 (nibbles as Q4_0);
//        value = d * kIq4nlValues[nibble].
//   IQ4_XS (136 B, 256 el.): d@0, scales_h(u16)@2, scales_l[4]@4, qs[128]@8;
//        sub-block j (32 el.) has nibbles qs[16j..16j+16) as Q4_0 and the
//        6-bit scale ls_j = (nibble j of scales_l, low first) | (bits 2j..2j+1
//        of scales_h) << 4; value = d * (ls_j - 32) * kIq4nlValues[nibble].
#ifndef PAGEDSERVE_KERNELS_CPU_QUANT_BLOCKS_H_
#define PAGEDSERVE_KERNELS_CPU_QUANT_BLOCKS_H_

#include <cstdint>
#include <cstring>

#include "kernels/cpu/half.h"

namespace pagedserve::kernels::cpu {

inline uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}
inline uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}
inline float LoadF16(const uint8_t* p) { return HalfBitsToFloat(LoadU16(p)); }

// 6-bit scale and min number j (0..7) of the 12-byte field of Q4_K and Q5_K.
inline void ScaleMinK4(int j, const uint8_t* q, int* sc, int* mn) {
  if (j < 4) {
    *sc = q[j] & 63;
    *mn = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    *mn = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// The sixteen 6-bit scales of Q3_K minus 32 (-32..31): scale j has low 4 bits
// in nibble j % 8 of bytes 0..7 (low nibbles for j < 8, high for j >= 8) and
// high 2 bits in bits 2 (j / 4) of byte 8 + j % 4.
inline void ScalesQ3K(const uint8_t* q, int8_t out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? (q[j] & 15) : (q[j - 8] >> 4);
    const int high = (q[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
}

// The 16-entry non-linear codebook of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

// The 6-bit scale of sub-block j (0..7) of an IQ4_XS super-block at b, minus 32.
inline int ScaleIq4Xs(const uint8_t* b, int j) {
  const int lo = (b[4 + j / 2] >> (4 * (j % 2))) & 15;
  const int hi = (LoadU16(b + 2) >> (2 * j)) & 3;
  return (lo | (hi << 4)) - 32;
}

// Activations of one 32-element block quantized to 8 bits: x ~= d * qs[i],
// d = max|x| / 127, |qs[i]| <= 127; sum = sum of qs (for the offset and min
// terms of Q4_0/Q5_0 and Q4_1/Q5_1).
struct ActBlock32 {
  float d;
  int32_t sum;
  int8_t qs[32];
};
static_assert(sizeof(ActBlock32) == 40);

// Activations of one 256-element super-block: x ~= d * qs[i]; bsums[k] is the sum
// of qs[16k..16k+16) (for the mins of Q4_K/Q5_K and the -32 offset of Q6_K).
struct ActBlock256 {
  float d;
  int16_t bsums[16];
  int8_t qs[256];
};
static_assert(sizeof(ActBlock256) == 292);

}  // namespace pagedserve::kernels::cpu

#endif  // PAGEDSERVE_KERNELS_CPU_QUANT_BLOCKS_H_
