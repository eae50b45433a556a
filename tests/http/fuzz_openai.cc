// libFuzzer target for the HTTP API's request path (openai_fuzz_entry.h). Built
// only with clang and -DPAGEDSERVE_FUZZ=ON (tests/http/CMakeLists.txt,
// scripts/fuzz openai).
#include <cstdio>
#include <cstdlib>

#include "tests/http/openai_fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string problem = pagedserve::openai::OpenAiFuzzOneInput(data, size);
  if (!problem.empty()) {
    std::fprintf(stderr, "openai request invariant violated: %s\n", problem.c_str());
    std::abort();
  }
  return 0;
}
