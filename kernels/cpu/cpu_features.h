#pragma once
// Run-time x86 feature checks for the CPU kernels' instruction-set dispatch
// (kernels/cpu/linear.cc, kernels/cpu/attention_core.cc). Thread-safe: each call
// reads CPUID; callers cache the answer.

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

namespace pagedserve::kernels::cpu {

// True when the CPU (and the OS, for the YMM state) supports AVX2, FMA and F16C:
// the AVX2 paths use all three. F16C is read from CPUID leaf 1 (ECX bit 29)
// because clang 14's __builtin_cpu_supports does not accept "f16c".
inline bool CpuHasAvx2FmaF16c() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
}

}  // namespace pagedserve::kernels::cpu
#endif  // x86
