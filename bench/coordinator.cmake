# Coordinator: one scheduling step (schedule + block manager + step plan + result
# processing) with N running decode sequences. Results: docs/benchmarks.md,
# section "Coordinator" (the dated runs: docs/benchmarks-history.md).
add_executable(bench_coordinator ${CMAKE_CURRENT_LIST_DIR}/coordinator_bench.cc)
target_link_libraries(bench_coordinator PRIVATE pagedserve_options pagedserve_coordinator
  pagedserve_distributed benchmark::benchmark)
