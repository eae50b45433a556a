// Helpers shared by the model tests.
#ifndef PAGEDSERVE_TESTS_MODEL_TEST_UTIL_H_
#define PAGEDSERVE_TESTS_MODEL_TEST_UTIL_H_

#include <string>
#include <vector>

#include "runtime/model/gguf.h"

namespace pagedserve::testing {

// $PAGEDSERVE_SOURCE_DIR/tests/model/fixtures/dequant_fixtures.gguf.
std::string FixturePath();
// $PAGEDSERVE_MODEL, or "" when the variable is unset.
std::string ModelPath();
// A fresh empty directory under $TMPDIR (or /tmp), removed with its contents
// when the test process exits.
std::string MakeTempDir();
// fp32 contents of an F32 tensor of `file` (fails the test if absent).
std::vector<float> F32Tensor(const GgufFile& file, const std::string& name);

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_MODEL_TEST_UTIL_H_
