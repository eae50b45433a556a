// Shared helpers of the tokenizer tests: fixture and model paths.
#ifndef PAGEDSERVE_TESTS_TOKENIZER_FIXTURE_UTIL_H_
#define PAGEDSERVE_TESTS_TOKENIZER_FIXTURE_UTIL_H_

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace pagedserve::testing {

inline std::string SourceDir() {
  const char* dir = std::getenv("PAGEDSERVE_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

inline std::string ModelPath() {
  const char* path = std::getenv("PAGEDSERVE_MODEL");
  return path != nullptr ? path : "";
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline nlohmann::json LoadFixture(const std::string& name) {
  return nlohmann::json::parse(ReadFile(SourceDir() + "/tests/tokenizer/fixtures/" + name));
}

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_TOKENIZER_FIXTURE_UTIL_H_
