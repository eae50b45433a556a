// Read-only bytes of a model file: mmapped from disk, or held in memory (tests,
// fuzzing). Shared by the GGUF and safetensors readers.
#ifndef PAGEDSERVE_RUNTIME_MODEL_MAPPED_FILE_H_
#define PAGEDSERVE_RUNTIME_MODEL_MAPPED_FILE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pagedserve {

class MappedFile {
 public:
  // Maps the regular file `path` read-only (MAP_PRIVATE); an empty file gives
  // size() == 0 and data() == nullptr. Errors name the path: NotFound when it
  // does not exist, PermissionDenied when it cannot be opened otherwise,
  // InvalidArgument when it is not a regular file, ResourceExhausted when mmap
  // fails (the message gives the size in bytes).
  static absl::StatusOr<MappedFile> Open(const std::string& path);
  // Takes ownership of `bytes`; data() points into them.
  static MappedFile FromBytes(std::vector<uint8_t> bytes);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();  // unmaps
  // A moved-from MappedFile is empty: size() == 0, data() == nullptr.

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }  // bytes

  // Drops the pages wholly inside [p, p + bytes) from this process's
  // resident set (madvise MADV_DONTNEED on the read-only private mapping):
  // for bytes the loader copied elsewhere (e.g. Q/K rows unpermuted into
  // their own memory), so that the model is not resident twice. The mapping
  // stays valid: a later read faults the pages back in from the file. A
  // no-op for FromBytes files (heap bytes would be zeroed), for ranges not
  // wholly inside this file, and where madvise fails (it only saves memory).
  // Thread-safe (no state changes).
  void DropResident(const uint8_t* p, uint64_t bytes) const;

 private:
  void Release();

  void* mapping_ = nullptr;  // mmap base; nullptr for FromBytes and empty files
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::vector<uint8_t> owned_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_MODEL_MAPPED_FILE_H_
