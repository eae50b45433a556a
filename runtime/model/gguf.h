// GGUF reader: the file format of llama.cpp / ggml (versions 2 and 3).
//
// Layout (little-endian; spec: ggml's docs/gguf.md):
//   magic "GGUF" | uint32 version | uint64 tensor_count | uint64 metadata_kv_count
//   metadata_kv_count x { gguf_string key | uint32 value_type | value }
//   tensor_count x { gguf_string name | uint32 n_dims | n_dims x uint64 ne
//                    | uint32 ggml_type | uint64 offset }
//   padding to general.alignment (default 32) | tensor data
// where gguf_string = uint64 length + bytes (no terminator) and an array value
// = uint32 element_type + uint64 count + elements (arrays may nest).
// Version 1 (32-bit counts) is not supported.
//
// Robustness contract: every read is bounds-checked against the file size, and
// no allocation is sized by a count that was not first capped by the bytes left
// in the file. A malformed or truncated file yields absl::InvalidArgumentError
// (or NotFound / Unimplemented where stated) whose message names the file, the
// field and the byte offset, e.g.
//   "model.gguf: tensor 'blk.0.attn_q.weight' offset 123456: data extends past end
//    of file (size 999)".
// Tensor data is memory-mapped read-only; spans returned by TensorData() stay
// valid as long as the GgufFile lives. A GgufFile is immutable after Open and
// safe to read from several threads.
#ifndef PAGEDSERVE_RUNTIME_MODEL_GGUF_H_
#define PAGEDSERVE_RUNTIME_MODEL_GGUF_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/model/mapped_file.h"

namespace pagedserve {

// Metadata value types (numbering fixed by the GGUF spec).
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint8", "float32", "array", ...; "type(N)" for an unknown N.
std::string GgufValueTypeName(GgufValueType type);

// ggml tensor element types (numbering fixed by ggml's enum ggml_type). Only the
// types listed here are accepted in tensor infos; dequant.h says which of them
// can be converted to fp32.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

// "F32", "Q4_1", "Q6_K", ...; "type(N)" for an unknown N.
std::string GgmlTypeName(GgmlType type);

// Block geometry of a ggml type: a row of n elements (n a multiple of
// block_elements) takes n / block_elements * block_bytes bytes. Returns false
// for a type number this reader does not know.
struct GgmlBlockInfo {
  uint32_t block_elements = 0;  // elements per block (1 for F32/F16/BF16)
  uint32_t block_bytes = 0;     // bytes per block
};
bool GetGgmlBlockInfo(GgmlType type, GgmlBlockInfo* info);

// One metadata value. Scalars, strings and arrays (possibly nested).
class GgufValue {
 public:
  GgufValueType type() const { return type_; }
  bool is_array() const { return type_ == GgufValueType::kArray; }

  // Scalar accessors. Each fails with InvalidArgument (naming the expected and
  // the actual type) when the value has another type:
  //   AsInt: any integer type whose value fits in int64 (not bool);
  //   AsUint: any integer type whose value is >= 0;
  //   AsFloat: float32, float64 and any integer type;
  //   AsBool: bool only;  AsString: string only.
  absl::StatusOr<int64_t> AsInt() const;
  absl::StatusOr<uint64_t> AsUint() const;
  absl::StatusOr<double> AsFloat() const;
  absl::StatusOr<bool> AsBool() const;
  absl::StatusOr<std::string_view> AsString() const;

  // Arrays: element type and count (0 / kUint8 for a non-array).
  GgufValueType array_type() const { return array_type_; }
  size_t array_size() const { return array_size_; }
  // Element i of an array as a standalone value (InvalidArgument when this is
  // not an array or i is out of range).
  absl::StatusOr<GgufValue> At(size_t i) const;

  // Whole-array conversions (InvalidArgument if not an array of a convertible
  // element type; OutOfRange if an element does not fit the result type).
  absl::StatusOr<std::vector<std::string>> AsStringArray() const;
  absl::StatusOr<std::vector<float>> AsFloatArray() const;    // float/int elements
  absl::StatusOr<std::vector<int32_t>> AsInt32Array() const;  // integer elements
  absl::StatusOr<std::vector<int64_t>> AsInt64Array() const;  // integer elements

 private:
  friend class GgufParser;
  GgufValueType type_ = GgufValueType::kUint8;
  uint64_t scalar_bits_ = 0;  // raw little-endian bits of a scalar
  std::string string_;
  // Arrays: numeric/bool elements as raw bytes, strings, or nested arrays.
  GgufValueType array_type_ = GgufValueType::kUint8;
  size_t array_size_ = 0;
  std::vector<uint8_t> raw_;
  std::vector<std::string> strings_;
  std::vector<GgufValue> nested_;
};

// One tensor info. Dimensions are in ggml order: dims[0] (ne0) is the fastest
// varying one. For a 2-D weight of a Linear layer dims = {in_features,
// out_features}, i.e. the data is row-major [out_features, in_features] as in
// PyTorch / Hugging Face.
struct GgufTensorInfo {
  std::string name;
  std::vector<uint64_t> dims;  // 1..4 entries, each >= 1
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;       // relative to the start of the data section (aligned)
  uint64_t file_offset = 0;  // absolute byte offset in the file
  uint64_t num_elements = 0;
  uint64_t size_bytes = 0;  // bytes of data in the file
  uint64_t row_bytes = 0;   // bytes of one row of dims[0] elements
  // Rows as ggml sees them: num_elements / dims[0].
  uint64_t num_rows() const { return dims.empty() ? 0 : num_elements / dims[0]; }
};

class GgufFile {
 public:
  // Maps `path` read-only and parses header, metadata and tensor infos. All
  // tensor infos are validated (known type, dims a multiple of the block size,
  // offsets aligned and data inside the file, no duplicate names).
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Same, over bytes in memory (tests, fuzzing). `name` is used in messages.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::string name,
                                                             std::vector<uint8_t> bytes);

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }      // general.alignment or 32
  uint64_t data_offset() const { return data_offset_; }  // start of the data section
  uint64_t file_size() const { return size_; }

  // All metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  // nullptr when absent.
  const GgufValue* Find(std::string_view key) const;

  // Typed metadata getters. NotFound when the key is absent (message names the
  // file and key); InvalidArgument on a type mismatch (names key and types).
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<uint64_t> GetUint(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  absl::StatusOr<std::vector<std::string>> GetStringArray(std::string_view key) const;
  absl::StatusOr<std::vector<float>> GetFloatArray(std::string_view key) const;
  absl::StatusOr<std::vector<int32_t>> GetIntArray(std::string_view key) const;

  // Tensor infos in file order; FindTensor returns nullptr when absent.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;
  // The tensor's bytes inside the mapping (size_bytes long; validated at Open).
  // `info` must come from this file's tensors() / FindTensor().
  std::span<const uint8_t> TensorData(const GgufTensorInfo& info) const;
  // MappedFile::DropResident on this file's bytes.
  void DropResident(const uint8_t* p, uint64_t bytes) const { file_.DropResident(p, bytes); }

 private:
  friend class GgufParser;
  GgufFile() = default;
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromMapped(std::string name, MappedFile file);
  absl::Status Parse();
  absl::StatusOr<const GgufValue*> FindOrError(std::string_view key) const;

  std::string path_;
  MappedFile file_;
  const uint8_t* data_ = nullptr;  // file_.data()
  uint64_t size_ = 0;              // file_.size()
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  absl::flat_hash_map<std::string, size_t> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> tensor_index_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_MODEL_GGUF_H_
