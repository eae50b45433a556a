// Reader for Hugging Face safetensors files and sharded checkpoints.
//
// Format (https://github.com/huggingface/safetensors): uint64 little-endian
// header length N | N bytes of JSON {name: {"dtype", "shape", "data_offsets":
// [begin, end]}, "__metadata__": {...}} | data, offsets relative to 8 + N.
// The header length is capped by the file size before anything is allocated;
// every tensor's offsets, dtype size and shape are checked for consistency.
// Errors name the file, the tensor and the field. Data is mmapped read-only.
#ifndef PAGEDSERVE_RUNTIME_MODEL_SAFETENSORS_H_
#define PAGEDSERVE_RUNTIME_MODEL_SAFETENSORS_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "runtime/model/mapped_file.h"

namespace pagedserve {

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;           // "F32", "F16", "BF16", "I64", ... as in the file
  std::vector<int64_t> shape;  // PyTorch order (row-major, last dim fastest)
  uint64_t num_elements = 0;
  uint64_t file_offset = 0;  // absolute offset of the first byte
  uint64_t size_bytes = 0;
};

class SafetensorsFile {
 public:
  // Maps `path` read-only (MappedFile: NotFound / PermissionDenied /
  // InvalidArgument / ResourceExhausted naming the path) and parses the header;
  // InvalidArgument naming the file, tensor and field for a bad header (length
  // past the end, not JSON, unknown dtype, shape/dtype/data_offsets that
  // disagree or point outside the file).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Same, over bytes in memory (tests, fuzzing). `name` is used in messages.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::string name,
                                                                    std::vector<uint8_t> bytes);
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const SafetensorsTensorInfo* Find(std::string_view name) const;  // nullptr if absent
  // The tensor's raw little-endian bytes (size_bytes long, validated at Open).
  // `info` must come from this file's tensors() / Find().
  std::span<const uint8_t> TensorData(const SafetensorsTensorInfo& info) const;

  // Converts rows [row_begin, row_end) along dimension 0 to fp32 (a 1-D tensor
  // has rows of one element; a row of a k-D tensor is the product of
  // shape[1..]). dtypes F32, F16, BF16; Unimplemented for others.
  absl::Status ReadRows(const SafetensorsTensorInfo& info, uint64_t row_begin, uint64_t row_end,
                        float* dst) const;
  // MappedFile::DropResident on this file's bytes.
  void DropResident(const uint8_t* p, uint64_t bytes) const { file_.DropResident(p, bytes); }

 private:
  SafetensorsFile() = default;
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromMapped(std::string name,
                                                                     MappedFile file);
  absl::Status Parse();
  std::string path_;
  MappedFile file_;
  const uint8_t* data_ = nullptr;  // file_.data()
  uint64_t size_ = 0;              // file_.size()
  std::vector<SafetensorsTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> index_;
};

// A Hugging Face checkpoint directory: model.safetensors, or the shards listed
// in model.safetensors.index.json ({"weight_map": {tensor: file}}).
class SafetensorsCheckpoint {
 public:
  // Opens every file of the checkpoint in `dir`. NotFound when neither
  // model.safetensors nor the index exists; InvalidArgument naming the index
  // for a malformed weight_map; the errors of SafetensorsFile::Open otherwise.
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir);

  // The tensor and the file that holds it; NotFound naming the checkpoint.
  absl::StatusOr<std::pair<const SafetensorsFile*, const SafetensorsTensorInfo*>> Find(
      std::string_view name) const;
  bool Contains(std::string_view name) const;
  const std::string& dir() const { return dir_; }
  // Bytes of tensor data in all of the checkpoint's files (the sum of every
  // tensor's size_bytes), e.g. the total of a load progress report.
  uint64_t tensor_bytes() const;

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  absl::flat_hash_map<std::string, size_t> owner_;  // tensor -> files_ index
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_MODEL_SAFETENSORS_H_
