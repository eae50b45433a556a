# HTTP front end (issue 31): HttpServer + EngineLoop + Engine over an engine
# stand-in (no model), server and client pinned to their own CPUs: streamed
# tokens/s, and TTFT with thousands of connections open. Results:
# docs/benchmarks.md, "HTTP front end".
add_executable(bench_http_frontend ${CMAKE_CURRENT_LIST_DIR}/http_frontend_bench.cc)
target_link_libraries(bench_http_frontend PRIVATE pagedserve_options pagedserve_frontend
  pagedserve_engine pagedserve_tokenizer absl::flags absl::flags_parse absl::strings)
