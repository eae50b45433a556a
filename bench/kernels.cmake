# Kernel benchmarks (CPU): decode attention, paged vs contiguous KV, against a
# measured memory copy bandwidth. Results: docs/benchmarks-history.md, "Kernels (CPU)".
add_executable(bench_paged_attention ${CMAKE_CURRENT_LIST_DIR}/paged_attention_bench.cc)
target_link_libraries(bench_paged_attention PRIVATE pagedserve_kernels benchmark::benchmark
  OpenMP::OpenMP_CXX)

# Linear over stored weight formats vs the fp32 OpenBLAS path. Results:
# docs/benchmarks.md and docs/benchmarks-history.md, "Linear kernels (CPU)".
add_executable(bench_linear ${CMAKE_CURRENT_LIST_DIR}/linear_bench.cc)
target_link_libraries(bench_linear PRIVATE pagedserve_kernels benchmark::benchmark
  OpenMP::OpenMP_CXX BLAS::BLAS)
