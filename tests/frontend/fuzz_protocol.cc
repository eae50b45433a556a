// libFuzzer target for the protocol v1 request parser. Built only with clang and
// -DPAGEDSERVE_FUZZ=ON (see tests/frontend/CMakeLists.txt, scripts/fuzz protocol).
#include <cstdio>
#include <cstdlib>

#include "tests/frontend/protocol_fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string problem = pagedserve::protocol::ProtocolFuzzOneInput(data, size);
  if (!problem.empty()) {
    std::fprintf(stderr, "protocol invariant violated: %s\n", problem.c_str());
    std::abort();
  }
  return 0;
}
