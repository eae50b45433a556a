// The SmolLM2 tokenizer of tests/fixtures/smollm2-tokenizer (a Hugging Face
// tokenizer.json), loaded once per test binary and never freed. The source
// tree is $PAGEDSERVE_SOURCE_DIR (set by CTest; "." when unset). A fixture
// that does not load fails the current test and aborts the binary: every
// test using it would fail anyway. Thread-safe (a function-local static).
#ifndef PAGEDSERVE_TESTS_COMMON_FIXTURE_TOKENIZER_H_
#define PAGEDSERVE_TESTS_COMMON_FIXTURE_TOKENIZER_H_

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "runtime/tokenizer/loaders.h"

namespace pagedserve::testing {

inline const Tokenizer& FixtureTokenizer() {
  static const Tokenizer* t = [] {
    const char* d = std::getenv("PAGEDSERVE_SOURCE_DIR");
    auto r = LoadHfTokenizer(std::string(d ? d : ".") + "/tests/fixtures/smollm2-tokenizer");
    if (!r.ok()) {
      ADD_FAILURE() << r.status();
      std::abort();
    }
    return r->release();
  }();
  return *t;
}

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_COMMON_FIXTURE_TOKENIZER_H_
