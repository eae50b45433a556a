// Internal helpers of the CPU backend.
#ifndef PAGEDSERVE_KERNELS_CPU_COMMON_H_
#define PAGEDSERVE_KERNELS_CPU_COMMON_H_

#include <cstddef>
#include <cstdint>

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
  }
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
