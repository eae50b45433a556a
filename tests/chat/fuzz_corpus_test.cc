// Replays the committed seeds of fuzz_chat_template (tests/chat/corpus/, and
// the regression inputs the fuzzer found, regress-*) through its entry point
// (chat_fuzz_entry.h), whole and cut short, so that its invariants run on every
// build, with any compiler.
#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/chat/chat_fuzz_entry.h"

namespace pagedserve::chat {
namespace {

std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string Fuzz(const std::string& bytes, size_t n) {
  return ChatTemplateFuzzOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), n);
}

TEST(ChatFuzzCorpus, SeedsAndTheirPrefixesHoldEveryInvariant) {
  const char* root = std::getenv("PAGEDSERVE_SOURCE_DIR");
  const std::filesystem::path dir = std::filesystem::path(root ? root : ".") / "tests/chat/corpus";
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string bytes = ReadAll(e.path());
    EXPECT_EQ(Fuzz(bytes, bytes.size()), "") << e.path();
    const size_t step = std::max<size_t>(1, bytes.size() / 128);
    for (size_t n = 0; n < bytes.size(); n += step)
      EXPECT_EQ(Fuzz(bytes, n), "") << e.path() << " prefix " << n;
    ++files;
  }
  EXPECT_GE(files, 5);
}

TEST(ChatFuzzCorpus, HostileTemplatesStayWithinTheLimits) {
  const std::vector<std::string> sources = {
      "{% for i in range(100000) %}{% for j in range(100000) %}{{ i }}{% endfor %}{% endfor %}",
      "{% macro f() %}{{ f() }}{{ f() }}{% endmacro %}{{ f() }}",
      "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
      "{{ 'x' * 100000000 }}",
      "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(23) }}",
      "{% set ns = namespace(l=[]) %}{% for i in range(60) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}",
      "{{ " + std::string(5000, '[') + std::string(5000, ']') + " }}",
      "{% for m in messages %}{% for n in messages %}{% for o in range(99999) %}{% endfor %}{% endfor %}{% endfor %}",
  };
  for (const std::string& source : sources) {
    EXPECT_EQ(Fuzz(source, source.size()), "") << source.substr(0, 80);
  }
}

}  // namespace
}  // namespace pagedserve::chat
