// Internal helpers of the CPU backend.
#ifndef PAGEDSERVE_KERNELS_CPU_COMMON_H_
#define PAGEDSERVE_KERNELS_CPU_COMMON_H_

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/half.h"
#include "kernels/types.h"

namespace pagedserve::kernels::cpu {

// Reads n elements of dtype `t` at src into fp32.
inline void LoadRow(DType t, const void* src, int n, float* dst) {
  switch (t) {
    case DType::kFloat32: {
      const float* s = static_cast<const float*>(src);
      for (int i = 0; i < n; ++i) dst[i] = s[i];
      break;
    }
    case DType::kFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = HalfBitsToFloat(s[i]);
      break;
    }
    case DType::kBFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = BFloat16BitsToFloat(s[i]);
      break;
    }
    case DType::kFloat8E4M3: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = Fp8E4M3BitsToFloat(s[i]);
      break;
    }
    case DType::kFloat8E5M2: {
      const uint8_t* s = static_cast<const uint8_t*>(src);
      for (int i = 0; i < n; ++i) dst[i] = Fp8E5M2BitsToFloat(s[i]);
      break;
    }
  }
}

// Writes n fp32 values times `mul` as dtype `t` (round to nearest even).
inline void StoreRow(DType t, const float* src, float mul, int n, void* dst) {
  switch (t) {
    case DType::kFloat32: {
      float* d = static_cast<float*>(dst);
      for (int i = 0; i < n; ++i) d[i] = src[i] * mul;
      break;
    }
    case DType::kFloat16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = FloatToHalfBits(src[i] * mul);
      break;
    }
    case DType::kBFloat16: {
      uint16_t* d = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = FloatToBFloat16Bits(src[i] * mul);
      break;
    }
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: {
      // Not used for fp8 (reshape_and_cache divides by the scale; see
      // StoreFp8Row); kept total so that every DType has a store.
      uint8_t* d = static_cast<uint8_t*>(dst);
      const bool e4 = t == DType::kFloat8E4M3;
      for (int i = 0; i < n; ++i)
        d[i] = e4 ? FloatToFp8E4M3Bits(src[i] * mul) : FloatToFp8E5M2Bits(src[i] * mul);
      break;
    }
  }
}

// fp8 cache store (vLLM semantics): dst[i] = fp8(src[i] / scale), rounded to
// nearest even and saturated (kernels/cpu/fp8.h). t is kFloat8E4M3 or kFloat8E5M2.
inline void StoreFp8Row(DType t, const float* src, float scale, int n, uint8_t* dst) {
  if (t == DType::kFloat8E4M3) {
    for (int i = 0; i < n; ++i) dst[i] = FloatToFp8E4M3Bits(src[i] / scale);
  } else {
    for (int i = 0; i < n; ++i) dst[i] = FloatToFp8E5M2Bits(src[i] / scale);
  }
}

// The scales the kernels apply: the view's k_scale / v_scale for an fp8
// cache, 1 otherwise (kernels/types.h: ignored for fp32/fp16/bf16).
inline float EffectiveKScale(const KVCacheView& c) {
  return IsFp8(c.shape.dtype) ? c.k_scale : 1.0f;
}
inline float EffectiveVScale(const KVCacheView& c) {
  return IsFp8(c.shape.dtype) ? c.v_scale : 1.0f;
}

// Byte offset helpers.
inline const void* ElemPtr(const void* base, int64_t elems, DType t) {
  return static_cast<const char*>(base) + elems * static_cast<int64_t>(DTypeSize(t));
}
inline void* ElemPtr(void* base, int64_t elems, DType t) {
  return static_cast<char*>(base) + elems * static_cast<int64_t>(DTypeSize(t));
}

}  // namespace pagedserve::kernels::cpu

#endif  // PAGEDSERVE_KERNELS_CPU_COMMON_H_
