// MappedFile: the read-only file mapping shared by the GGUF and safetensors
// readers (errors by kind, empty files, ownership across moves).
#include "runtime/model/mapped_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
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

  // A FIFO with no writer: refused at once, not an open that waits for ever
  // (the test's timeout catches a regression).
  const std::string fifo = dir + "/model.gguf";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << std::strerror(errno);
  absl::StatusOr<MappedFile> pipe = MappedFile::Open(fifo);
  EXPECT_EQ(pipe.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pipe.status().message().find("not a regular file"), std::string::npos);
}

// Resident pages of this process (/proc/self/statm, second field).
int64_t ResidentPages() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = -1;
  statm >> size >> resident;
  return resident;
}

// Bytes copied elsewhere leave the resident set and read back the same; heap
// bytes (FromBytes) and ranges outside the file are left alone.
TEST(MappedFileTest, DropResidentReleasesPagesAndKeepsTheData) {
  constexpr size_t kBytes = 32 << 20;
  std::string text(kBytes, '\0');
  for (size_t i = 0; i < kBytes; ++i) text[i] = static_cast<char>(i * 131 % 251);
  std::string path = WriteFile(testing::MakeTempDir(), "big.bin", text);
  absl::StatusOr<MappedFile> f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t before = ResidentPages();
  ASSERT_GE(before, 0);
  ASSERT_EQ(std::memcmp(f->data(), text.data(), kBytes), 0);  // faults every page in
  const int64_t touched = ResidentPages();
  const int64_t file_pages = static_cast<int64_t>(kBytes) / page;
  EXPECT_GE(touched - before, file_pages * 9 / 10) << "the mapping did not become resident";
  // Unaligned ends: only the pages wholly inside go.
  f->DropResident(f->data() + 1, kBytes - 1);
  const int64_t dropped = ResidentPages();
  EXPECT_LE(dropped, touched - file_pages * 9 / 10) << touched << " -> " << dropped;
  EXPECT_EQ(std::memcmp(f->data(), text.data(), kBytes), 0);  // faulted back from the file
  // Ranges not wholly inside the file: nothing happens (and nothing breaks).
  f->DropResident(f->data() + kBytes - 10, 20);
  f->DropResident(nullptr, 1);
  EXPECT_EQ(std::memcmp(f->data(), text.data(), kBytes), 0);

  MappedFile heap = MappedFile::FromBytes(std::vector<uint8_t>(text.begin(), text.end()));
  heap.DropResident(heap.data(), kBytes);
  EXPECT_EQ(std::memcmp(heap.data(), text.data(), kBytes), 0);  // not zeroed
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
