# Tokenizer encode throughput (results in docs/benchmarks.md, section Tokenizer).
add_executable(bench_tokenizer ${CMAKE_CURRENT_LIST_DIR}/tokenizer_bench.cc)
target_link_libraries(bench_tokenizer PRIVATE pagedserve_options pagedserve_tokenizer
                      benchmark::benchmark)
