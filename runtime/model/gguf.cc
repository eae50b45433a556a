#include "runtime/model/gguf.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"

namespace pagedserve {

namespace {

constexpr uint32_t kMaxDims = 4;
// Nested arrays deeper than this are rejected (bounds the recursion).
constexpr int kMaxArrayDepth = 8;

// Size in bytes of a fixed-size GGUF value type; 0 for string and array.
size_t ScalarSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool: return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16: return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32: return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64: return 8;
    default: return 0;
  }
}

bool KnownValueType(uint32_t t) { return t <= 12; }

bool IsIntegerType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64: return true;
    default: return false;
  }
}

bool IsSignedType(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}

// Raw little-endian bits of a scalar of `size` bytes, sign-extended for signed
// integer types so that int64 reinterpretation gives the value.
uint64_t LoadScalar(const uint8_t* p, GgufValueType t) {
  size_t n = ScalarSize(t);
  uint64_t v = 0;
  std::memcpy(&v, p, n);  // host is little-endian (x86-64 / aarch64)
  if (IsSignedType(t) && n < 8) {
    uint64_t sign = uint64_t{1} << (n * 8 - 1);
    if (v & sign) v |= ~((sign << 1) - 1);
  }
  return v;
}

}  // namespace

std::string GgufValueTypeName(GgufValueType type) {
  static const char* const kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                       "int32",  "float32", "bool",   "string", "array",
                                       "uint64", "int64",   "float64"};
  uint32_t t = static_cast<uint32_t>(type);
  if (t < 13) return kNames[t];
  return absl::StrCat("type(", t, ")");
}

std::string GgmlTypeName(GgmlType type) {
  switch (type) {
    case GgmlType::kF32: return "F32";
    case GgmlType::kF16: return "F16";
    case GgmlType::kQ4_0: return "Q4_0";
    case GgmlType::kQ4_1: return "Q4_1";
    case GgmlType::kQ5_0: return "Q5_0";
    case GgmlType::kQ5_1: return "Q5_1";
    case GgmlType::kQ8_0: return "Q8_0";
    case GgmlType::kQ8_1: return "Q8_1";
    case GgmlType::kQ2_K: return "Q2_K";
    case GgmlType::kQ3_K: return "Q3_K";
    case GgmlType::kQ4_K: return "Q4_K";
    case GgmlType::kQ5_K: return "Q5_K";
    case GgmlType::kQ6_K: return "Q6_K";
    case GgmlType::kQ8_K: return "Q8_K";
    case GgmlType::kIQ2_XXS: return "IQ2_XXS";
    case GgmlType::kIQ2_XS: return "IQ2_XS";
    case GgmlType::kIQ3_XXS: return "IQ3_XXS";
    case GgmlType::kIQ1_S: return "IQ1_S";
    case GgmlType::kIQ4_NL: return "IQ4_NL";
    case GgmlType::kIQ3_S: return "IQ3_S";
    case GgmlType::kIQ2_S: return "IQ2_S";
    case GgmlType::kIQ4_XS: return "IQ4_XS";
    case GgmlType::kIQ1_M: return "IQ1_M";
    case GgmlType::kTQ1_0: return "TQ1_0";
    case GgmlType::kTQ2_0: return "TQ2_0";
    case GgmlType::kMXFP4: return "MXFP4";
    case GgmlType::kI8: return "I8";
    case GgmlType::kI16: return "I16";
    case GgmlType::kI32: return "I32";
    case GgmlType::kI64: return "I64";
    case GgmlType::kF64: return "F64";
    case GgmlType::kBF16: return "BF16";
  }
  return absl::StrCat("type(", static_cast<uint32_t>(type), ")");
}

bool GetGgmlBlockInfo(GgmlType type, GgmlBlockInfo* info) {
  // Block sizes from ggml's type traits (QK_K = 256 super-blocks for K-quants).
  switch (type) {
    case GgmlType::kF32: *info = {1, 4}; return true;
    case GgmlType::kF16:
    case GgmlType::kBF16: *info = {1, 2}; return true;
    case GgmlType::kF64: *info = {1, 8}; return true;
    case GgmlType::kI8: *info = {1, 1}; return true;
    case GgmlType::kI16: *info = {1, 2}; return true;
    case GgmlType::kI32: *info = {1, 4}; return true;
    case GgmlType::kI64: *info = {1, 8}; return true;
    case GgmlType::kQ4_0: *info = {32, 2 + 16}; return true;
    case GgmlType::kQ4_1: *info = {32, 2 + 2 + 16}; return true;
    case GgmlType::kQ5_0: *info = {32, 2 + 4 + 16}; return true;
    case GgmlType::kQ5_1: *info = {32, 2 + 2 + 4 + 16}; return true;
    case GgmlType::kQ8_0: *info = {32, 2 + 32}; return true;
    case GgmlType::kQ8_1: *info = {32, 4 + 32}; return true;
    case GgmlType::kQ2_K: *info = {256, 16 + 64 + 2 + 2}; return true;
    case GgmlType::kQ3_K: *info = {256, 32 + 64 + 12 + 2}; return true;
    case GgmlType::kQ4_K: *info = {256, 2 + 2 + 12 + 128}; return true;
    case GgmlType::kQ5_K: *info = {256, 2 + 2 + 12 + 32 + 128}; return true;
    case GgmlType::kQ6_K: *info = {256, 128 + 64 + 16 + 2}; return true;
    case GgmlType::kQ8_K: *info = {256, 4 + 256 + 32}; return true;
    // IQ, TQ and MXFP4 types (gguf-py GGML_QUANT_SIZES): known, so a file
    // holding them opens and the loader can name the tensor it refuses.
    case GgmlType::kIQ2_XXS: *info = {256, 66}; return true;
    case GgmlType::kIQ2_XS: *info = {256, 74}; return true;
    case GgmlType::kIQ3_XXS: *info = {256, 98}; return true;
    case GgmlType::kIQ1_S: *info = {256, 50}; return true;
    case GgmlType::kIQ4_NL: *info = {32, 18}; return true;
    case GgmlType::kIQ3_S: *info = {256, 110}; return true;
    case GgmlType::kIQ2_S: *info = {256, 82}; return true;
    case GgmlType::kIQ4_XS: *info = {256, 136}; return true;
    case GgmlType::kIQ1_M: *info = {256, 56}; return true;
    case GgmlType::kTQ1_0: *info = {256, 54}; return true;
    case GgmlType::kTQ2_0: *info = {256, 66}; return true;
    case GgmlType::kMXFP4: *info = {32, 17}; return true;
  }
  return false;
}

// ---------------------------------------------------------------------------
// GgufValue
// ---------------------------------------------------------------------------

namespace {
absl::Status TypeMismatch(absl::string_view want, GgufValueType got) {
  return absl::InvalidArgumentError(
      absl::StrCat("expected ", want, ", value has type ", GgufValueTypeName(got)));
}

}  // namespace

absl::StatusOr<int64_t> GgufValue::AsInt() const {
  if (!IsIntegerType(type_)) return TypeMismatch("an integer", type_);
  if (type_ == GgufValueType::kUint64 && scalar_bits_ > uint64_t{INT64_MAX}) {
    return absl::OutOfRangeError(
        absl::StrCat("uint64 value ", scalar_bits_, " does not fit in int64"));
  }
  return static_cast<int64_t>(scalar_bits_);
}

absl::StatusOr<uint64_t> GgufValue::AsUint() const {
  if (!IsIntegerType(type_)) return TypeMismatch("an integer", type_);
  if (IsSignedType(type_) && static_cast<int64_t>(scalar_bits_) < 0) {
    return absl::OutOfRangeError(absl::StrCat("negative value ", static_cast<int64_t>(scalar_bits_),
                                              " where an unsigned integer is expected"));
  }
  return scalar_bits_;
}

absl::StatusOr<double> GgufValue::AsFloat() const {
  if (type_ == GgufValueType::kFloat32) {
    float f;
    uint32_t b = static_cast<uint32_t>(scalar_bits_);
    std::memcpy(&f, &b, 4);
    return f;
  }
  if (type_ == GgufValueType::kFloat64) {
    double d;
    std::memcpy(&d, &scalar_bits_, 8);
    return d;
  }
  if (IsIntegerType(type_)) {
    if (IsSignedType(type_)) return static_cast<double>(static_cast<int64_t>(scalar_bits_));
    return static_cast<double>(scalar_bits_);
  }
  return TypeMismatch("a number", type_);
}

absl::StatusOr<bool> GgufValue::AsBool() const {
  if (type_ != GgufValueType::kBool) return TypeMismatch("bool", type_);
  return scalar_bits_ != 0;
}

absl::StatusOr<std::string_view> GgufValue::AsString() const {
  if (type_ != GgufValueType::kString) return TypeMismatch("string", type_);
  return std::string_view(string_);
}

absl::StatusOr<GgufValue> GgufValue::At(size_t i) const {
  if (!is_array()) return TypeMismatch("array", type_);
  if (i >= array_size_) {
    return absl::OutOfRangeError(
        absl::StrCat("index ", i, " out of range for array of ", array_size_, " elements"));
  }
  GgufValue v;
  v.type_ = array_type_;
  if (array_type_ == GgufValueType::kString) {
    v.string_ = strings_[i];
  } else if (array_type_ == GgufValueType::kArray) {
    return nested_[i];
  } else {
    v.scalar_bits_ = LoadScalar(raw_.data() + i * ScalarSize(array_type_), array_type_);
  }
  return v;
}

absl::StatusOr<std::vector<std::string>> GgufValue::AsStringArray() const {
  if (!is_array()) return TypeMismatch("array of string", type_);
  if (array_type_ != GgufValueType::kString) {
    return absl::InvalidArgumentError(absl::StrCat("expected array of string, value is array of ",
                                                   GgufValueTypeName(array_type_)));
  }
  return strings_;
}

absl::StatusOr<std::vector<float>> GgufValue::AsFloatArray() const {
  if (!is_array()) return TypeMismatch("array of numbers", type_);
  if (ScalarSize(array_type_) == 0 || array_type_ == GgufValueType::kBool) {
    return absl::InvalidArgumentError(absl::StrCat("expected array of numbers, value is array of ",
                                                   GgufValueTypeName(array_type_)));
  }
  std::vector<float> out(array_size_);
  size_t es = ScalarSize(array_type_);
  for (size_t i = 0; i < array_size_; ++i) {
    const uint8_t* p = raw_.data() + i * es;
    if (array_type_ == GgufValueType::kFloat32) {
      std::memcpy(&out[i], p, 4);
    } else if (array_type_ == GgufValueType::kFloat64) {
      double d;
      std::memcpy(&d, p, 8);
      out[i] = static_cast<float>(d);
    } else {
      uint64_t b = LoadScalar(p, array_type_);
      out[i] = IsSignedType(array_type_) ? static_cast<float>(static_cast<int64_t>(b))
                                         : static_cast<float>(b);
    }
  }
  return out;
}

absl::StatusOr<std::vector<int64_t>> GgufValue::AsInt64Array() const {
  if (!is_array()) return TypeMismatch("array of integers", type_);
  if (!IsIntegerType(array_type_)) {
    return absl::InvalidArgumentError(absl::StrCat("expected array of integers, value is array of ",
                                                   GgufValueTypeName(array_type_)));
  }
  std::vector<int64_t> out(array_size_);
  size_t es = ScalarSize(array_type_);
  for (size_t i = 0; i < array_size_; ++i) {
    uint64_t b = LoadScalar(raw_.data() + i * es, array_type_);
    if (array_type_ == GgufValueType::kUint64 && b > uint64_t{INT64_MAX}) {
      return absl::OutOfRangeError(
          absl::StrCat("array element ", i, " = ", b, " does not fit in int64"));
    }
    out[i] = static_cast<int64_t>(b);
  }
  return out;
}

absl::StatusOr<std::vector<int32_t>> GgufValue::AsInt32Array() const {
  auto wide = AsInt64Array();
  if (!wide.ok()) return wide.status();
  std::vector<int32_t> out(wide->size());
  for (size_t i = 0; i < wide->size(); ++i) {
    int64_t v = (*wide)[i];
    if (v < INT32_MIN || v > INT32_MAX) {
      return absl::OutOfRangeError(
          absl::StrCat("array element ", i, " = ", v, " does not fit in int32"));
    }
    out[i] = static_cast<int32_t>(v);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Parser
// ---------------------------------------------------------------------------

class GgufParser {
 public:
  explicit GgufParser(GgufFile* f) : f_(f), p_(f->data_), size_(f->size_) {}

  // The file in the order it is laid out: header, metadata key/values (then
  // general.alignment from them), tensor infos, then the tensor data placed
  // after the infos at the alignment.
  absl::Status Run() {
    uint64_t n_tensors = 0, n_kv = 0;
    PS_RETURN_IF_ERROR(ReadHeader(&n_tensors, &n_kv));
    PS_RETURN_IF_ERROR(ReadMetadata(n_kv));
    PS_RETURN_IF_ERROR(ReadAlignment());
    PS_RETURN_IF_ERROR(ReadTensorInfos(n_tensors));
    return PlaceTensorData();
  }

 private:
  // Magic, version (2 or 3) and the two counts, each bounded by the bytes left.
  absl::Status ReadHeader(uint64_t* n_tensors, uint64_t* n_kv) {
    uint8_t magic[4];
    if (auto s = ReadBytes("magic", magic, 4); !s.ok()) return s;
    if (std::memcmp(magic, "GGUF", 4) != 0) {
      return Error(0, "magic",
                   absl::StrCat("bad magic (expected \"GGUF\", got bytes ", Hex(magic, 4), ")"));
    }
    uint32_t version = 0;
    if (auto s = ReadU32("version", &version); !s.ok()) return s;
    if (version != 2 && version != 3) {
      return Error(4, "version",
                   absl::StrCat("unsupported GGUF version ", version, " (supported: 2, 3)"));
    }
    f_->version_ = version;
    if (auto s = ReadU64("tensor_count", n_tensors); !s.ok()) return s;
    if (auto s = ReadU64("metadata_kv_count", n_kv); !s.ok()) return s;
    // Each key/value takes at least 8 (key length) + 4 (type) + 1 bytes; each
    // tensor info at least 8 + 4 + 8 + 4 + 8 bytes.
    if (*n_kv > Remaining() / 13) {
      return Error(16, "metadata_kv_count",
                   absl::StrCat("count ", *n_kv, " cannot fit in the ", Remaining(),
                                " bytes left in the file"));
    }
    if (*n_tensors > Remaining() / 32) {
      return Error(8, "tensor_count",
                   absl::StrCat("count ", *n_tensors, " cannot fit in the ", Remaining(),
                                " bytes left in the file"));
    }
    return absl::OkStatus();
  }

  // `n_kv` key/value pairs; a key may appear once.
  absl::Status ReadMetadata(uint64_t n_kv) {
    f_->metadata_.reserve(n_kv);
    for (uint64_t i = 0; i < n_kv; ++i) {
      uint64_t at = pos_;
      std::string key;
      if (auto s = ReadString(absl::StrCat("metadata key #", i), &key); !s.ok()) return s;
      std::string field = absl::StrCat("metadata '", key, "'");
      uint32_t type = 0;
      if (auto s = ReadU32(field + " type", &type); !s.ok()) return s;
      GgufValue v;
      if (auto s = ReadValue(field, type, pos_ - 4, 0, &v); !s.ok()) return s;
      if (f_->metadata_index_.contains(key)) {
        return Error(at, field, "duplicate metadata key");
      }
      f_->metadata_index_.emplace(key, f_->metadata_.size());
      f_->metadata_.emplace_back(std::move(key), std::move(v));
    }
    return absl::OkStatus();
  }

  // general.alignment when present: an unsigned power of two up to 2^30.
  absl::Status ReadAlignment() {
    const GgufValue* a = f_->Find("general.alignment");
    if (a == nullptr) return absl::OkStatus();
    auto al = a->AsUint();
    if (!al.ok() || *al == 0 || (*al & (*al - 1)) != 0 || *al > (uint64_t{1} << 30)) {
      return absl::InvalidArgumentError(absl::StrCat(
          f_->path_, ": metadata 'general.alignment': must be an unsigned power of two, got ",
          al.ok() ? absl::StrCat(*al) : std::string(al.status().message())));
    }
    f_->alignment_ = *al;
    return absl::OkStatus();
  }

  // `n_tensors` tensor infos; a name may appear once.
  absl::Status ReadTensorInfos(uint64_t n_tensors) {
    f_->tensors_.reserve(n_tensors);
    for (uint64_t i = 0; i < n_tensors; ++i) {
      GgufTensorInfo t;
      uint64_t at = pos_;
      if (auto s = ReadString(absl::StrCat("tensor info #", i, " name"), &t.name); !s.ok())
        return s;
      std::string field = absl::StrCat("tensor '", t.name, "'");
      if (auto s = ReadDims(field, &t); !s.ok()) return s;
      if (auto s = ReadTensorType(field, &t); !s.ok()) return s;
      if (auto s = ReadU64(field + " offset", &t.offset); !s.ok()) return s;
      if (f_->tensor_index_.contains(t.name)) {
        return Error(at, field, "duplicate tensor name");
      }
      f_->tensor_index_.emplace(t.name, f_->tensors_.size());
      f_->tensors_.push_back(std::move(t));
    }
    return absl::OkStatus();
  }

  // n_dims in [1, kMaxDims] and the dimensions, each in [1, 2^40], their
  // product (t->num_elements) at most 2^62.
  absl::Status ReadDims(const std::string& field, GgufTensorInfo* t) {
    uint32_t n_dims = 0;
    if (auto s = ReadU32(field + " n_dims", &n_dims); !s.ok()) return s;
    if (n_dims == 0 || n_dims > kMaxDims) {
      return Error(pos_ - 4, field + " n_dims",
                   absl::StrCat("n_dims ", n_dims, " outside [1, ", kMaxDims, "]"));
    }
    t->dims.resize(n_dims);
    uint64_t n_el = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      if (auto s = ReadU64(absl::StrCat(field, " dim ", d), &t->dims[d]); !s.ok()) return s;
      if (t->dims[d] == 0 || t->dims[d] > (uint64_t{1} << 40)) {
        return Error(pos_ - 8, absl::StrCat(field, " dim ", d),
                     absl::StrCat("dimension ", t->dims[d], " outside [1, 2^40]"));
      }
      if (n_el > (uint64_t{1} << 62) / t->dims[d]) {
        return Error(pos_ - 8, absl::StrCat(field, " dim ", d), "element count overflows");
      }
      n_el *= t->dims[d];
    }
    t->num_elements = n_el;
    return absl::OkStatus();
  }

  // The ggml type (known, rows a whole number of its blocks) and the sizes
  // that follow from it (t->row_bytes, t->size_bytes).
  absl::Status ReadTensorType(const std::string& field, GgufTensorInfo* t) {
    uint32_t type = 0;
    if (auto s = ReadU32(field + " type", &type); !s.ok()) return s;
    t->type = static_cast<GgmlType>(type);
    GgmlBlockInfo bi;
    if (!GetGgmlBlockInfo(t->type, &bi)) {
      return Error(pos_ - 4, field + " type", absl::StrCat("unknown ggml type ", type));
    }
    if (t->dims[0] % bi.block_elements != 0) {
      return Error(pos_ - 4, field + " type",
                   absl::StrCat("row length ", t->dims[0], " is not a multiple of the ",
                                GgmlTypeName(t->type), " block size ", bi.block_elements));
    }
    t->row_bytes = t->dims[0] / bi.block_elements * bi.block_bytes;
    t->size_bytes = t->num_elements / bi.block_elements * bi.block_bytes;
    return absl::OkStatus();
  }

  // The data section starts after the infos at the alignment; every tensor's
  // offset must be aligned and its data must lie inside the file.
  absl::Status PlaceTensorData() {
    uint64_t al = f_->alignment_;
    uint64_t data_start = (pos_ + al - 1) / al * al;
    f_->data_offset_ = data_start;
    for (GgufTensorInfo& t : f_->tensors_) {
      std::string field = absl::StrCat("tensor '", t.name, "'");
      if (t.offset % al != 0) {
        return absl::InvalidArgumentError(absl::StrCat(f_->path_, ": ", field, " offset ", t.offset,
                                                       ": not a multiple of the alignment ", al));
      }
      if (t.offset > size_ || data_start > size_ - t.offset ||
          t.size_bytes > size_ - data_start - t.offset) {
        return absl::InvalidArgumentError(absl::StrCat(
            f_->path_, ": ", field, " offset ", data_start + std::min(t.offset, size_), ": data (",
            t.size_bytes, " bytes) extends past end of file (size ", size_, ")"));
      }
      t.file_offset = data_start + t.offset;
    }
    return absl::OkStatus();
  }

  uint64_t Remaining() const { return size_ - pos_; }

  absl::Status Error(uint64_t offset, absl::string_view field, absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(f_->path_, ": ", field, " at offset ", offset, ": ", what));
  }
  absl::Status Truncated(absl::string_view field, uint64_t need) const {
    return Error(pos_, field,
                 absl::StrCat("need ", need, " bytes but only ", Remaining(),
                              " remain (truncated file, size ", size_, ")"));
  }

  static std::string Hex(const uint8_t* b, size_t n) {
    static const char* d = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < n; ++i) {
      s += d[b[i] >> 4];
      s += d[b[i] & 15];
    }
    return s;
  }

  absl::Status ReadBytes(absl::string_view field, void* out, uint64_t n) {
    if (n > Remaining()) return Truncated(field, n);
    if (n == 0) return absl::OkStatus();  // `out` may be null (an empty array's storage)
    std::memcpy(out, p_ + pos_, n);
    pos_ += n;
    return absl::OkStatus();
  }
  absl::Status ReadU32(absl::string_view field, uint32_t* v) { return ReadBytes(field, v, 4); }
  absl::Status ReadU64(absl::string_view field, uint64_t* v) { return ReadBytes(field, v, 8); }

  absl::Status ReadString(absl::string_view field, std::string* out) {
    uint64_t len = 0;
    if (auto s = ReadU64(absl::StrCat(field, " length"), &len); !s.ok()) return s;
    if (len > Remaining()) {
      return Error(pos_ - 8, field,
                   absl::StrCat("string length ", len, " extends past end of file (", Remaining(),
                                " bytes remain, size ", size_, ")"));
    }
    out->assign(reinterpret_cast<const char*>(p_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

  // Reads a value of wire type `type` (whose type field started at type_at).
  absl::Status ReadValue(const std::string& field, uint32_t type, uint64_t type_at, int depth,
                         GgufValue* v) {
    if (!KnownValueType(type)) {
      return Error(type_at, field, absl::StrCat("unknown value type ", type));
    }
    v->type_ = static_cast<GgufValueType>(type);
    if (v->type_ == GgufValueType::kString) return ReadString(field, &v->string_);
    if (v->type_ != GgufValueType::kArray) {
      size_t n = ScalarSize(v->type_);
      uint8_t buf[8];
      if (auto s = ReadBytes(field, buf, n); !s.ok()) return s;
      v->scalar_bits_ = LoadScalar(buf, v->type_);
      return absl::OkStatus();
    }
    if (depth >= kMaxArrayDepth) {
      return Error(type_at, field, absl::StrCat("arrays nested deeper than ", kMaxArrayDepth));
    }
    uint32_t et = 0;
    uint64_t et_at = pos_;
    if (auto s = ReadU32(field + " array type", &et); !s.ok()) return s;
    if (!KnownValueType(et)) {
      return Error(et_at, field, absl::StrCat("unknown array element type ", et));
    }
    uint64_t count = 0;
    if (auto s = ReadU64(field + " array count", &count); !s.ok()) return s;
    v->array_type_ = static_cast<GgufValueType>(et);
    // Smallest encoding of one element: scalars their size, strings 8 bytes
    // (length), arrays 12 bytes (type + count).
    size_t min_size = ScalarSize(v->array_type_);
    if (v->array_type_ == GgufValueType::kString) min_size = 8;
    if (v->array_type_ == GgufValueType::kArray) min_size = 12;
    if (count > Remaining() / min_size) {
      return Error(pos_ - 8, field,
                   absl::StrCat("array count ", count, " of ", GgufValueTypeName(v->array_type_),
                                " extends past end of file (", Remaining(), " bytes remain, size ",
                                size_, ")"));
    }
    v->array_size_ = count;
    if (v->array_type_ == GgufValueType::kString) {
      v->strings_.resize(count);
      for (uint64_t i = 0; i < count; ++i) {
        if (auto s = ReadString(absl::StrCat(field, "[", i, "]"), &v->strings_[i]); !s.ok())
          return s;
      }
    } else if (v->array_type_ == GgufValueType::kArray) {
      v->nested_.resize(count);
      for (uint64_t i = 0; i < count; ++i) {
        if (auto s =
                ReadValue(absl::StrCat(field, "[", i, "]"), et, et_at, depth + 1, &v->nested_[i]);
            !s.ok())
          return s;
      }
    } else {
      v->raw_.resize(count * min_size);
      if (auto s = ReadBytes(field, v->raw_.data(), count * min_size); !s.ok()) return s;
    }
    return absl::OkStatus();
  }

  GgufFile* f_;
  const uint8_t* p_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// ---------------------------------------------------------------------------
// GgufFile
// ---------------------------------------------------------------------------

absl::Status GgufFile::Parse() { return GgufParser(this).Run(); }

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  PS_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  return FromMapped(path, std::move(file));
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::string name,
                                                              std::vector<uint8_t> bytes) {
  return FromMapped(std::move(name), MappedFile::FromBytes(std::move(bytes)));
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromMapped(std::string name, MappedFile file) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = std::move(name);
  f->file_ = std::move(file);
  f->data_ = f->file_.data();
  f->size_ = f->file_.size();
  PS_RETURN_IF_ERROR(f->Parse());
  return f;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = metadata_index_.find(absl::string_view(key.data(), key.size()));
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

absl::StatusOr<const GgufValue*> GgufFile::FindOrError(std::string_view key_sv) const {
  absl::string_view key(key_sv.data(), key_sv.size());
  const GgufValue* v = Find(key_sv);
  if (v == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": metadata key '", key, "' not found"));
  }
  return v;
}

namespace {
template <typename T>
absl::StatusOr<T> Annotate(const std::string& path, std::string_view key_sv, absl::StatusOr<T> r) {
  if (r.ok()) return r;
  absl::string_view key(key_sv.data(), key_sv.size());
  return absl::Status(r.status().code(),
                      absl::StrCat(path, ": metadata '", key, "': ", r.status().message()));
}
}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  PS_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(key));
  auto s = v->AsString();
  if (!s.ok()) return Annotate<std::string>(path_, key, s.status());
  return std::string(*s);
}
absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  PS_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(key));
  return Annotate(path_, key, v->AsInt());
}
absl::StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  PS_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(key));
  return Annotate(path_, key, v->AsUint());
}
absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  PS_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(key));
  return Annotate(path_, key, v->AsFloat());
}
absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  PS_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(key));
  return Annotate(path_, key, v->AsBool());
}
absl::StatusOr<std::vector<std::string>> GgufFile::GetStringArray(std::string_view key) const {
  PS_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(key));
  return Annotate(path_, key, v->AsStringArray());
}
absl::StatusOr<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  PS_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(key));
  return Annotate(path_, key, v->AsFloatArray());
}
absl::StatusOr<std::vector<int32_t>> GgufFile::GetIntArray(std::string_view key) const {
  PS_ASSIGN_OR_RETURN(const GgufValue* v, FindOrError(key));
  return Annotate(path_, key, v->AsInt32Array());
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(absl::string_view(name.data(), name.size()));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> GgufFile::TensorData(const GgufTensorInfo& info) const {
  return std::span<const uint8_t>(data_ + info.file_offset, info.size_bytes);
}

}  // namespace pagedserve
