// MappedFile: the read-only file mapping shared by the GGUF and safetensors
// readers (errors by kind, empty files, ownership across moves).
#include "runtime/model/mapped_file.h"

#include <cstring>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "tests/model/test_util.h"

namespace pagedserve {
namespace {

std::string WriteFile(const std::string& dir, const std::string& name, const std::string& text) {
  std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(MappedFileTest, MapsTheFileContents) {
  std::string path = WriteFile(testing::MakeTempDir(), "a.bin", "hello, mapping");
  absl::StatusOr<MappedFile> f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->size(), 14u);
  EXPECT_EQ(std::memcmp(f->data(), "hello, mapping", 14), 0);

  MappedFile moved = *std::move(f);
  ASSERT_EQ(moved.size(), 14u);
  EXPECT_EQ(std::memcmp(moved.data(), "hello, mapping", 14), 0);
}

TEST(MappedFileTest, EmptyFileHasNoData) {
  std::string path = WriteFile(testing::MakeTempDir(), "empty.bin", "");
  absl::StatusOr<MappedFile> f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->size(), 0u);
  EXPECT_EQ(f->data(), nullptr);
}

TEST(MappedFileTest, ErrorsNameThePathAndKind) {
  std::string dir = testing::MakeTempDir();
  absl::StatusOr<MappedFile> missing = MappedFile::Open(dir + "/missing.bin");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir + "/missing.bin"), std::string::npos);

  absl::StatusOr<MappedFile> directory = MappedFile::Open(dir);
  EXPECT_EQ(directory.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos);
}

TEST(MappedFileTest, FromBytesKeepsDataAcrossMoves) {
  MappedFile a = MappedFile::FromBytes({1, 2, 3});
  const uint8_t* before = a.data();
  MappedFile b = std::move(a);
  EXPECT_EQ(b.data(), before);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b.data()[2], 3);
  EXPECT_EQ(a.size(), 0u);  // NOLINT(bugprone-use-after-move): documented empty state
  b = MappedFile::FromBytes({9});
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b.data()[0], 9);
}

}  // namespace
}  // namespace pagedserve
