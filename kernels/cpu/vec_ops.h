#pragma once
// Elementwise loops of the CPU forward pass (runtime/worker/cpu_backend.cc),
// vectorized for AVX2+FMA+F16C and chosen at run time from CPUID (the portable
// loops run everywhere else). Internal to the CPU backend: plain pointers, no
// validation; the caller owns every buffer. Thread-safe (no shared state but
// the cached CPUID answer); each call runs on the calling thread.

#include <cstdint>

#include "kernels/types.h"

namespace pagedserve::kernels::cpu {

// SwiGLU's activation: out[i] = silu(gate[i]) * up[i] for i < n, where
// silu(g) = g / (1 + exp(-g)) (Shazeer 2020, "GLU Variants Improve
// Transformer"). fp32 [n] each; out may be gate itself (in place), otherwise
// none of the three overlap. The AVX2 path's
// exp has a relative error of at most 1.2e-7 (kernels/cpu/vec_math_avx2.h), so
// results may differ from the portable loop (libm expf) in the last bits.
void SiluAndMul(const float* gate, const float* up, int64_t n, float* out);

// fp32 [n] -> 16-bit [n] of type t (kFloat16 or kBFloat16), round to nearest
// even: bit-identical to FloatToHalfBits / FloatToBFloat16Bits
// (kernels/cpu/half.h) for every input, NaN included (a quiet NaN with the
// sign kept).
void FloatsTo16(const float* src, int64_t n, DType t, uint16_t* dst);

// 16-bit [n] of type t (kFloat16 or kBFloat16) -> fp32 [n], exact:
// bit-identical to HalfBitsToFloat / BFloat16BitsToFloat for every finite and
// infinite input; a NaN gives a NaN.
void Floats16ToFloat(const uint16_t* src, int64_t n, DType t, float* dst);

// The variants behind the calls above, for tests: `avx2` true runs the AVX2
// path (callers check Avx2VecOpsAvailable() first), false the portable loops.
bool Avx2VecOpsAvailable();
void SiluAndMulVariant(const float* gate, const float* up, int64_t n, float* out, bool avx2);
void FloatsTo16Variant(const float* src, int64_t n, DType t, uint16_t* dst, bool avx2);
void Floats16ToFloatVariant(const uint16_t* src, int64_t n, DType t, float* dst, bool avx2);

}  // namespace pagedserve::kernels::cpu
