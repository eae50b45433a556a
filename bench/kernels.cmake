# Kernel benchmarks (CPU): decode attention, paged vs contiguous KV, against a
# measured memory copy bandwidth. Results: docs/benchmarks.md, "Kernels (CPU)".
add_executable(bench_paged_attention ${CMAKE_CURRENT_LIST_DIR}/paged_attention_bench.cc)
target_link_libraries(bench_paged_attention PRIVATE pagedserve_kernels benchmark::benchmark
  OpenMP::OpenMP_CXX)
