// libFuzzer target over one model-file loader. The same source builds
// fuzz_gguf, fuzz_safetensors, fuzz_hf_config and fuzz_hf_tokenizer: CMake
// defines PAGEDSERVE_FUZZ_ENTRY (a function of loader_fuzz_entry.h) and
// PAGEDSERVE_FUZZ_TARGET (its name in messages). Built only with clang and
// -DPAGEDSERVE_FUZZ=ON (tests/model/CMakeLists.txt); run with scripts/fuzz.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/model/loader_fuzz_entry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string problem = pagedserve::PAGEDSERVE_FUZZ_ENTRY(data, size);
  if (!problem.empty()) {
    std::fprintf(stderr, "%s invariant violated: %s\n", PAGEDSERVE_FUZZ_TARGET, problem.c_str());
    std::abort();
  }
  return 0;
}
