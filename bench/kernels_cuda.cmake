# GPU decode-attention benchmark (CUDA-event timed, not Google Benchmark: the
# figures are device times). Built when CUDA is enabled; run by scripts/gpu-check.
# See docs/benchmarks-history.md, "Kernels (CUDA)".
if(PAGEDSERVE_WITH_CUDA)
  add_executable(paged_attention_cuda_bench ${CMAKE_CURRENT_LIST_DIR}/paged_attention_cuda_bench.cc)
  target_link_libraries(paged_attention_cuda_bench PRIVATE pagedserve_options pagedserve_kernels
    CUDA::cudart)
endif()
