# Model throughput (issue 3): prefill and decode tokens/s of a real GGUF model
# through the Worker with hand-made step plans. Compared with llama.cpp by
# bench/model_side_by_side.sh; results: docs/benchmarks.md (current) and docs/benchmarks-history.md, section
# "Model (CPU): pagedserve vs llama.cpp".
add_executable(bench_model ${CMAKE_CURRENT_LIST_DIR}/model_bench.cc)
target_link_libraries(bench_model PRIVATE pagedserve_options pagedserve_worker pagedserve_tokenizer
  pagedserve_distributed OpenMP::OpenMP_CXX benchmark::benchmark absl::strings)
