// libFuzzer target over the chat template engine: template text, NUL, the
// variables as JSON (chat_fuzz_entry.h). Built only with clang and
// -DPAGEDSERVE_FUZZ=ON (tests/chat/CMakeLists.txt); run with scripts/fuzz chat_template.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/chat/chat_fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string problem = pagedserve::chat::ChatTemplateFuzzOneInput(data, size);
  if (!problem.empty()) {
    std::fprintf(stderr, "fuzz_chat_template invariant violated: %s\n", problem.c_str());
    std::abort();
  }
  return 0;
}
