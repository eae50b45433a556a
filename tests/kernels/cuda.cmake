# CUDA backend tests (label `kernels`), included by tests/kernels/CMakeLists.txt
# when the build has CUDA.
#  - kernels_cuda_kernels_test runs the kernels on the device; without a usable
#    device every test reports itself as skipped with the CUDA runtime's reason.
#  - kernels_cuda_emulation_test runs the same kernel source on the CPU through
#    simt_emulator.h (needs the CUDA headers only), so the kernels' indexing and
#    reductions are checked on every CI run, GPU or not.
pagedserve_add_test(kernels_cuda_kernels_test
  SOURCES cuda_kernels_test.cc
  LIBS pagedserve_kernels CUDA::cudart absl::strings
  LABELS kernels
  TIMEOUT 600)
# GTest reports GTEST_SKIP() as "[  SKIPPED ]"; make CTest list the test as skipped.
set_tests_properties(kernels_cuda_kernels_test PROPERTIES
  SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")

pagedserve_add_test(kernels_cuda_emulation_test
  SOURCES cuda_emulation_test.cc
  LIBS pagedserve_kernels CUDA::cudart
  LABELS kernels
  TIMEOUT 600)
