# Structured output: schema compile time, token-mask cost per decode step, and the
# sampler with / without a mask at batch 32 (docs/benchmarks.md, "Structured output").
add_executable(bench_grammar ${CMAKE_CURRENT_LIST_DIR}/grammar_bench.cc)
target_link_libraries(bench_grammar PRIVATE pagedserve_options pagedserve_grammar pagedserve_tokenizer
                      pagedserve_sampling nlohmann_json::nlohmann_json benchmark::benchmark)
