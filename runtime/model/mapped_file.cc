#include "runtime/model/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pagedserve {

absl::StatusOr<MappedFile> MappedFile::Open(const std::string& path) {
  // O_NONBLOCK: a FIFO (or a device) given as a model must not block the
  // open waiting for a writer; it is refused below. No effect on a regular file.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    std::string msg = absl::StrCat(path, ": cannot open: ", std::strerror(e));
    return e == ENOENT ? absl::NotFoundError(msg) : absl::PermissionDeniedError(msg);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  MappedFile f;
  f.size_ = static_cast<uint64_t>(st.st_size);
  if (f.size_ > 0) {
    void* m = mmap(nullptr, f.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": mmap of ", f.size_, " bytes failed: ", std::strerror(e)));
    }
    f.mapping_ = m;
    f.data_ = static_cast<const uint8_t*>(m);
  }
  ::close(fd);
  return f;
}

MappedFile MappedFile::FromBytes(std::vector<uint8_t> bytes) {
  MappedFile f;
  f.owned_ = std::move(bytes);
  f.data_ = f.owned_.data();
  f.size_ = f.owned_.size();
  return f;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Release();
    // A moved std::vector keeps its buffer, so data_ stays valid for owned bytes.
    mapping_ = std::exchange(other.mapping_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    owned_ = std::move(other.owned_);
    other.owned_.clear();
  }
  return *this;
}

MappedFile::~MappedFile() { Release(); }

void MappedFile::DropResident(const uint8_t* p, uint64_t bytes) const {
  if (mapping_ == nullptr || p < data_ || bytes > size_ ||
      static_cast<uint64_t>(p - data_) > size_ - bytes)
    return;
  // Page-aligned inward, as offsets from the (page-aligned) mapping.
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const auto offset = static_cast<uint64_t>(p - data_);
  const uint64_t first = (offset + page - 1) / page * page;
  const uint64_t end = (offset + bytes) / page * page;
  if (end <= first) return;
  madvise(static_cast<uint8_t*>(mapping_) + first, end - first, MADV_DONTNEED);
}

void MappedFile::Release() {
  if (mapping_ != nullptr) munmap(mapping_, size_);
  mapping_ = nullptr;
  data_ = nullptr;
  size_ = 0;
  owned_.clear();
}

}  // namespace pagedserve
