// Test helper shared by the CUDA worker tests: counts elements that differ
// beyond a tolerance.
#ifndef PAGEDSERVE_TESTS_WORKER_MISMATCHES_H_
#define PAGEDSERVE_TESTS_WORKER_MISMATCHES_H_

#include <algorithm>
#include <cmath>
#include <vector>

namespace pagedserve::testing {

// Number of elements where got and want differ by more than
// rel * |want| + abs (rel = abs = 0: bit-exact; a NaN always differs); a
// size mismatch counts as the larger size.
inline int Mismatches(const std::vector<float>& got, const std::vector<float>& want, double rel,
                      double abs) {
  if (got.size() != want.size()) return static_cast<int>(std::max(got.size(), want.size()));
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= rel * std::abs(static_cast<double>(want[i])) + abs)) ++bad;
  }
  return bad;
}

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_WORKER_MISMATCHES_H_
