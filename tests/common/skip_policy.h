// The exit status of a GTest binary after RUN_ALL_TESTS(), shared by the
// main() of the plain binaries (test_main.cc) and of those run under mpirun
// (mpi_test_main.cc), so that a skip is visible instead of passing it off as
// a pass:
//   1   a test failed, or a test skipped for a reason that
//       PAGEDSERVE_ALLOWED_SKIPS (an ECMAScript regex searched in the skip
//       message) does not match, when that variable is set (CI sets it to the
//       "no GPU" reasons only: scripts/test);
//   77  no failure, but at least one test skipped (CTest SKIP_RETURN_CODE, so
//       `ctest` lists the binary as skipped, never as passed);
//   0   every selected test ran and passed.
// Each skip is printed with its message on stderr.
#ifndef PAGEDSERVE_TESTS_COMMON_SKIP_POLICY_H_
#define PAGEDSERVE_TESTS_COMMON_SKIP_POLICY_H_

#include <cstdio>
#include <cstdlib>
#include <regex>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pagedserve::testing {

inline constexpr int kSkipExitCode = 77;

struct Skip {
  std::string test;
  std::string reason;
};

inline std::vector<Skip> CollectSkips() {
  std::vector<Skip> skips;
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j) {
      const ::testing::TestInfo& info = *suite.GetTestInfo(j);
      if (!info.should_run() || !info.result()->Skipped()) continue;
      std::string reason;
      const ::testing::TestResult& r = *info.result();
      for (int k = 0; k < r.total_part_count(); ++k)
        if (r.GetTestPartResult(k).skipped()) reason += r.GetTestPartResult(k).message();
      skips.push_back({std::string(suite.name()) + "." + info.name(), reason});
    }
  }
  return skips;
}

// `run_all_tests_rc`: what RUN_ALL_TESTS() returned. `who` prefixes the
// printed skips (e.g. "rank 1: "; empty for a plain binary).
inline int ExitCodeAfterRun(int run_all_tests_rc, const std::string& who = "") {
  if (run_all_tests_rc != 0) return 1;
  const std::vector<Skip> skips = CollectSkips();
  if (skips.empty()) return 0;
  const char* allowed = std::getenv("PAGEDSERVE_ALLOWED_SKIPS");
  bool disallowed = false;
  for (const Skip& s : skips) {
    bool ok = true;
    if (allowed != nullptr) ok = std::regex_search(s.reason, std::regex(allowed));
    std::fprintf(stderr, "%s%s: %s: %s\n", who.c_str(),
                 ok ? "SKIPPED" : "SKIP NOT ALLOWED (PAGEDSERVE_ALLOWED_SKIPS)", s.test.c_str(),
                 s.reason.c_str());
    disallowed |= !ok;
  }
  return disallowed ? 1 : kSkipExitCode;
}

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_COMMON_SKIP_POLICY_H_
