// The main() of every GTest binary registered with pagedserve_add_test: runs
// the tests and makes a skip visible instead of passing it off as a pass
// (exit status: tests/common/skip_policy.h; 77 = skipped, CTest
// SKIP_RETURN_CODE).
#include "gtest/gtest.h"
#include "tests/common/skip_policy.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  return pagedserve::testing::ExitCodeAfterRun(rc);
}
