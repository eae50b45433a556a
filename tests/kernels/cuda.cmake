# CUDA backend tests (label `kernels`), included by tests/kernels/CMakeLists.txt
# when the build has CUDA. Without a usable device the tests report themselves
# as skipped with the CUDA runtime's reason.
pagedserve_add_test(kernels_cuda_kernels_test
  SOURCES cuda_kernels_test.cc
  LIBS pagedserve_kernels CUDA::cudart absl::strings
  LABELS kernels
  TIMEOUT 600)
# GTest reports GTEST_SKIP() as "[  SKIPPED ]"; make CTest list the test as skipped.
set_tests_properties(kernels_cuda_kernels_test PROPERTIES
  SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]")
