# Sampler throughput: batch x vocab logits -> tokens (see docs/benchmarks.md, "Sampling").
add_executable(bench_sampling ${CMAKE_CURRENT_LIST_DIR}/sampling_bench.cc)
target_link_libraries(bench_sampling PRIVATE pagedserve_options pagedserve_sampling benchmark::benchmark)
