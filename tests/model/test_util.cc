#include "tests/model/test_util.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pagedserve::testing {

std::string FixturePath() {
  const char* src = std::getenv("PAGEDSERVE_SOURCE_DIR");
  std::string root = src ? src : ".";
  return root + "/tests/model/fixtures/dequant_fixtures.gguf";
}

std::string ModelPath() {
  const char* m = std::getenv("PAGEDSERVE_MODEL");
  return m ? m : "";
}

namespace {

// The directories MakeTempDir made, removed with their contents at exit.
class TempDirs {
 public:
  ~TempDirs() {
    for (const std::string& d : dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(d, ec);
    }
  }
  void Add(std::string d) {
    std::lock_guard<std::mutex> lock(mu_);
    dirs_.push_back(std::move(d));
  }

 private:
  std::mutex mu_;
  std::vector<std::string> dirs_;
};

TempDirs& Registry() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::string MakeTempDir() {
  const char* t = std::getenv("TMPDIR");
  std::string tmpl = std::string(t && *t ? t : "/tmp") + "/pagedserve_model_XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* d = mkdtemp(buf.data());
  EXPECT_NE(d, nullptr) << "mkdtemp failed";
  if (d == nullptr) return std::string();
  Registry().Add(d);
  return std::string(d);
}

std::vector<float> F32Tensor(const GgufFile& file, const std::string& name) {
  const GgufTensorInfo* t = file.FindTensor(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  EXPECT_EQ(t->type, GgmlType::kF32) << name;
  auto data = file.TensorData(*t);
  std::vector<float> out(t->num_elements);
  std::memcpy(out.data(), data.data(), out.size() * sizeof(float));
  return out;
}

}  // namespace pagedserve::testing
