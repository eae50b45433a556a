#include "runtime/model/safetensors.h"

#include <sys/stat.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "runtime/common/status_macros.h"
#include "runtime/model/dequant.h"

namespace pagedserve {

namespace {

using nlohmann::json;

// Element size of a safetensors dtype; 0 when unknown.
uint64_t DtypeSize(const std::string& d) {
  if (d == "F64" || d == "I64" || d == "U64") return 8;
  if (d == "F32" || d == "I32" || d == "U32") return 4;
  if (d == "F16" || d == "BF16" || d == "I16" || d == "U16") return 2;
  if (d == "I8" || d == "U8" || d == "BOOL" || d == "F8_E4M3" || d == "F8_E5M2") return 1;
  return 0;
}

bool FileExists(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  PS_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  return FromMapped(path, std::move(file));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(
    std::string name, std::vector<uint8_t> bytes) {
  return FromMapped(std::move(name), MappedFile::FromBytes(std::move(bytes)));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromMapped(std::string name,
                                                                             MappedFile file) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = std::move(name);
  f->file_ = std::move(file);
  f->data_ = f->file_.data();
  f->size_ = f->file_.size();
  PS_RETURN_IF_ERROR(f->Parse());
  return f;
}

absl::Status SafetensorsFile::Parse() {
  auto err = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", what));
  };
  if (size_ < 8)
    return err(absl::StrCat("header length at offset 0: file too short (size ", size_, ")"));
  uint64_t n;
  std::memcpy(&n, data_, 8);
  if (n > size_ - 8) {
    return err(absl::StrCat("header length ", n, " at offset 0 extends past end of file (size ",
                            size_, ")"));
  }
  const char* h = reinterpret_cast<const char*>(data_ + 8);
  json j = json::parse(h, h + n, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return err("header at offset 8 is not a JSON object");
  const uint64_t base = 8 + n;
  const uint64_t data_size = size_ - base;
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (it.key() == "__metadata__") continue;
    std::string field = absl::StrCat("tensor '", it.key(), "'");
    const json& t = it.value();
    if (!t.is_object()) return err(field + ": entry is not an object");
    SafetensorsTensorInfo info;
    info.name = it.key();
    if (!t.contains("dtype") || !t["dtype"].is_string())
      return err(field + ": field 'dtype' missing");
    info.dtype = t["dtype"].get<std::string>();
    uint64_t es = DtypeSize(info.dtype);
    if (es == 0) return err(absl::StrCat(field, ": unknown dtype '", info.dtype, "'"));
    if (!t.contains("shape") || !t["shape"].is_array())
      return err(field + ": field 'shape' missing");
    uint64_t numel = 1;
    for (const json& d : t["shape"]) {
      if (!d.is_number_unsigned()) return err(field + ": field 'shape' must hold integers >= 0");
      uint64_t v = d.get<uint64_t>();
      // shape holds int64: a dimension past INT64_MAX would turn negative (it
      // passes the size check below when an earlier dimension is 0).
      if (v > static_cast<uint64_t>(INT64_MAX)) {
        return err(absl::StrCat(field, ": field 'shape': dimension ", v, " exceeds 2^63 - 1"));
      }
      if (v != 0 && numel > data_size / v) {
        return err(absl::StrCat(field, ": shape has more elements than the file can hold"));
      }
      numel *= v;
      info.shape.push_back(static_cast<int64_t>(v));
    }
    info.num_elements = numel;
    const json* off = t.contains("data_offsets") ? &t["data_offsets"] : nullptr;
    if (off == nullptr || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned()) {
      return err(field + ": field 'data_offsets' must be [begin, end]");
    }
    uint64_t b = (*off)[0].get<uint64_t>(), e = (*off)[1].get<uint64_t>();
    if (b > e || e > data_size) {
      return err(absl::StrCat(field, " data_offsets [", b, ", ", e, "] (file offset ", base + b,
                              "): data extends past end of file (size ", size_, ")"));
    }
    if (e - b != numel * es) {
      return err(absl::StrCat(field, ": data_offsets span ", e - b, " bytes but shape and dtype ",
                              info.dtype, " need ", numel * es));
    }
    info.file_offset = base + b;
    info.size_bytes = e - b;
    index_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
  }
  return absl::OkStatus();
}

const SafetensorsTensorInfo* SafetensorsFile::Find(std::string_view name_sv) const {
  auto it = index_.find(absl::string_view(name_sv.data(), name_sv.size()));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::span<const uint8_t> SafetensorsFile::TensorData(const SafetensorsTensorInfo& info) const {
  return std::span<const uint8_t>(data_ + info.file_offset, info.size_bytes);
}

absl::Status SafetensorsFile::ReadRows(const SafetensorsTensorInfo& info, uint64_t row_begin,
                                       uint64_t row_end, float* dst) const {
  uint64_t rows = info.shape.empty() ? 1 : static_cast<uint64_t>(info.shape[0]);
  uint64_t row_len = rows == 0 ? 0 : info.num_elements / rows;
  if (row_begin > row_end || row_end > rows) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", info.name, "': rows [",
                                                   row_begin, ", ", row_end, ") out of range (",
                                                   rows, " rows)"));
  }
  const uint8_t* p = data_ + info.file_offset;
  uint64_t first = row_begin * row_len, count = (row_end - row_begin) * row_len;
  if (info.dtype == "F32") {
    if (count) std::memcpy(dst, p + first * 4, count * 4);
  } else if (info.dtype == "F16" || info.dtype == "BF16") {
    bool bf = info.dtype == "BF16";
    for (uint64_t i = 0; i < count; ++i) {
      uint16_t v;
      std::memcpy(&v, p + (first + i) * 2, 2);
      dst[i] = bf ? Bf16ToFp32(v) : Fp16ToFp32(v);
    }
  } else {
    return absl::UnimplementedError(absl::StrCat(path_, ": tensor '", info.name, "': dtype ",
                                                 info.dtype, " is not supported (F32, F16, BF16)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& dir) {
  auto ck = std::make_unique<SafetensorsCheckpoint>();
  ck->dir_ = dir;
  std::vector<std::string> files;
  std::string index_path = dir + "/model.safetensors.index.json";
  if (FileExists(index_path)) {
    std::ifstream in(index_path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    json j = json::parse(ss.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(index_path, ": field 'weight_map' missing or not an object"));
    }
    absl::flat_hash_map<std::string, size_t> file_ids;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": weight_map['", it.key(), "'] is not a string"));
      }
      std::string f = it.value().get<std::string>();
      if (f.find('/') != std::string::npos || f == "..") {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": shard name '", f, "' must be a plain file name"));
      }
      if (!file_ids.contains(f)) {
        file_ids.emplace(f, files.size());
        files.push_back(f);
      }
    }
  } else if (FileExists(dir + "/model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir, ": neither model.safetensors nor model.safetensors.index.json found"));
  }
  for (const std::string& f : files) {
    auto sf = SafetensorsFile::Open(absl::StrCat(dir, "/", f));
    if (!sf.ok()) return sf.status();
    for (const SafetensorsTensorInfo& t : (*sf)->tensors()) {
      if (ck->owner_.contains(t.name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, "/", f, ": tensor '", t.name, "' also appears in another shard"));
      }
      ck->owner_.emplace(t.name, ck->files_.size());
    }
    ck->files_.push_back(std::move(*sf));
  }
  return ck;
}

absl::StatusOr<std::pair<const SafetensorsFile*, const SafetensorsTensorInfo*>>
SafetensorsCheckpoint::Find(std::string_view name_sv) const {
  absl::string_view name(name_sv.data(), name_sv.size());
  auto it = owner_.find(name);
  if (it == owner_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": tensor '", name, "' not found"));
  }
  const SafetensorsFile* f = files_[it->second].get();
  return std::make_pair(f, f->Find(name_sv));
}

bool SafetensorsCheckpoint::Contains(std::string_view name) const {
  return owner_.contains(absl::string_view(name.data(), name.size()));
}

uint64_t SafetensorsCheckpoint::tensor_bytes() const {
  uint64_t total = 0;
  for (const auto& f : files_) {
    for (const SafetensorsTensorInfo& t : f->tensors()) total += t.size_bytes;
  }
  return total;
}

}  // namespace pagedserve
