# CUDA backend tests (label `kernels`), included by tests/kernels/CMakeLists.txt
# when the build has CUDA.
#  - kernels_cuda_kernels_test runs the kernels on the device; without a usable
#    device every test skips with the CUDA runtime's reason and CTest lists the
#    binary as skipped (tests/common/test_main.cc, exit code 77).
#  - kernels_cuda_emulation_test runs the same kernel source on the CPU through
#    simt_emulator.h (needs the CUDA headers only), so the kernels' indexing and
#    reductions are checked on every CI run, GPU or not.
pagedserve_add_test(kernels_cuda_kernels_test
  SOURCES cuda_kernels_test.cc
  LIBS pagedserve_kernels CUDA::cudart absl::strings
  LABELS kernels
  TIMEOUT 600)

pagedserve_add_test(kernels_cuda_emulation_test
  SOURCES cuda_emulation_test.cc
  LIBS pagedserve_kernels CUDA::cudart
  LABELS kernels
  TIMEOUT 600)

# The GQA decode kernel (kernels/cuda/gqa_decode_kernels.cuh) through the same
# emulator, against the double reference and the CPU backend.
pagedserve_add_test(kernels_cuda_gqa_emulation_test
  SOURCES cuda_gqa_emulation_test.cc
  LIBS pagedserve_kernels CUDA::cudart
  LABELS kernels
  TIMEOUT 600)

# The emulator as a memory profiler: coalescing, global bytes per useful KV
# byte and shared-memory bank conflicts of every attention kernel, against
# limits from today's measurement (docs/attention_kernels.md). A few seconds.
pagedserve_add_test(kernels_cuda_profile_test
  SOURCES cuda_profile_test.cc
  LIBS pagedserve_kernels CUDA::cudart
  LABELS kernels
  TIMEOUT 300)

# fp8 KV-cache conversions (kernels/cpu/fp8.h) against cuda_fp8.h's
# host-callable conversions: needs the CUDA headers only.
pagedserve_add_test(kernels_fp8_conversion_test
  SOURCES fp8_conversion_test.cc
  LIBS CUDA::cudart
  LABELS kernels
  TIMEOUT 300)

# The emulation tests compile CUDA kernel source with the host compiler, which does
# not know nvcc's `#pragma unroll` (GCC spells it `#pragma GCC unroll`).
foreach(t kernels_cuda_emulation_test kernels_cuda_gqa_emulation_test kernels_cuda_profile_test)
  target_compile_options(${t} PRIVATE -Wno-unknown-pragmas)
endforeach()
