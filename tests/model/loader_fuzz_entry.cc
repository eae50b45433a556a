#include "tests/model/loader_fuzz_entry.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/model/dequant.h"
#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weights.h"
#include "runtime/tokenizer/loaders.h"
#include "runtime/tokenizer/tokenizer.h"

namespace pagedserve {
namespace {

// Elements converted per tensor at most (keeps one iteration cheap; rows past
// the budget are still bounds-checked by DequantizeRows over a single row).
constexpr uint64_t kMaxDequantElements = uint64_t{1} << 18;

// "" when `s` is an error whose message starts with `prefix`.
std::string CheckError(const absl::Status& s, absl::string_view prefix, absl::string_view what) {
  if (s.ok()) return absl::StrCat(what, ": expected an error");
  if (!absl::StartsWith(s.message(), prefix)) {
    return absl::StrCat(what, ": error does not start with '", prefix, "': ", s.ToString());
  }
  if (s.message().size() <= prefix.size()) return absl::StrCat(what, ": empty error message");
  return "";
}

bool Inside(const uint8_t* base, size_t size, std::span<const uint8_t> span) {
  if (span.empty()) return true;
  return span.data() >= base && span.size() <= size &&
         span.data() - base <= static_cast<ptrdiff_t>(size - span.size());
}

// Encodes a few texts and decodes the ids back.
std::string ExerciseTokenizer(const Tokenizer& tok) {
  const int32_t n = tok.vocab_size();
  if (n <= 0) return "tokenizer: vocab_size <= 0";
  static const char* const kTexts[] = {"", "Hello world", " 123  x\n\ty",
                                       "\xE2\x96\x81\xC3\xA9\xF0\x9F\x98\x80",
                                       "\xFF\xFE<s></s><|im_start|>"};
  for (const char* text : kTexts) {
    for (bool special : {false, true}) {
      EncodeOptions eo;
      eo.parse_special = special;
      eo.add_special_tokens = special;
      std::vector<int32_t> ids = tok.Encode(text, eo);
      for (int32_t id : ids) {
        if (id < 0 || id >= n) {
          return absl::StrCat("tokenizer: Encode(\"", text, "\") gave id ", id, " outside [0, ", n,
                              ")");
        }
      }
      auto decoded = tok.Decode(ids);
      if (!decoded.ok())
        return absl::StrCat("tokenizer: Decode failed: ", decoded.status().ToString());
    }
  }
  const int32_t bad[] = {n};
  if (tok.Decode(bad).ok()) return "tokenizer: Decode accepted an out-of-range id";
  return "";
}

// The input as an anonymous in-memory file (memfd), for the loaders that take
// a path; path() is /proc/self/fd/N. Nothing touches the disk.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("fuzz.gguf", MFD_CLOEXEC);
    if (fd_ < 0) return;
    size_t done = 0;
    while (done < size) {
      ssize_t n = write(fd_, data + done, size - done);
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ok_ = done == size;
  }
  ~MemFile() {
    if (fd_ >= 0) close(fd_);
  }
  bool ok() const { return ok_; }
  std::string path() const { return absl::StrCat("/proc/self/fd/", fd_); }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

// LoadLlamaWeights over the whole file, as the server loads it: all of it in
// fp32 at tensor-parallel size 1, and rank 1 of 2 in the stored formats
// (mapped rows, column slices, permuted Q/K rows). An accepted model has the
// config's layer count and matrix shapes, and every row of every matrix
// converts to fp32; a rejection names the file.
std::string CheckWeights(const std::string& path, const ModelConfig& c) {
  struct Variant {
    int rank, size;
    WeightDType dtype;
  };
  for (Variant v : {Variant{0, 1, WeightDType::kFloat32}, Variant{1, 2, WeightDType::kAuto}}) {
    const std::string what =
        absl::StrCat("weights (rank ", v.rank, " of ", v.size, ", ", WeightDTypeName(v.dtype), ")");
    auto w = LoadLlamaWeights(path, v.rank, v.size, v.dtype);
    if (!w.ok()) {
      if (!absl::StartsWith(w.status().message(), path + ": ")) {
        return absl::StrCat(what, ": error does not name the file: ", w.status().ToString());
      }
      continue;
    }
    if (static_cast<int>(w->layers.size()) != c.num_layers) return what + ": layer count";
    std::vector<const Matrix*> matrices = {&w->embed_tokens};
    if (!c.tie_word_embeddings) matrices.push_back(&w->lm_head);
    for (const LayerWeights& l : w->layers) {
      for (const Matrix* m : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj}) matrices.push_back(m);
      if (c.moe.enabled()) {  // the router and every expert instead of the dense MLP
        if (l.expert_gate.size() != static_cast<size_t>(c.moe.num_experts) ||
            l.expert_up.size() != l.expert_gate.size() ||
            l.expert_down.size() != l.expert_gate.size() || !l.gate_proj.empty())
          return what + ": expert count";
        matrices.push_back(&l.router);
        for (const auto* experts : {&l.expert_gate, &l.expert_up, &l.expert_down})
          for (const Matrix& m : *experts) matrices.push_back(&m);
      } else {
        for (const Matrix* m : {&l.gate_proj, &l.up_proj, &l.down_proj}) matrices.push_back(m);
      }
    }
    if (w->embed_tokens.rows != c.vocab_size || w->embed_tokens.cols != c.hidden_size) {
      return what + ": embed_tokens shape";
    }
    for (const Matrix* m : matrices) {
      if (m->rows <= 0 || m->cols <= 0 || m->empty()) return what + ": empty matrix";
      std::vector<float> row(m->cols);
      for (int64_t r = 0; r < m->rows; ++r) {
        if (absl::Status s = m->RowToFloat(r, row.data()); !s.ok()) {
          return absl::StrCat(what, ": RowToFloat(", r, ") failed: ", s.ToString());
        }
      }
    }
  }
  return "";
}

// `base`: the first byte of the file's bytes (FromBytes keeps its own copy).
std::string CheckGgufTensors(const GgufFile& f, const uint8_t* base, size_t size) {
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const GgufTensorInfo& t = f.tensors()[i];
    const std::string what = absl::StrCat("gguf tensor '", t.name, "'");
    if (f.FindTensor(t.name) != &t) return what + ": FindTensor does not return it";
    if (t.dims.empty() || t.dims.size() > 4) return what + ": dims count outside [1, 4]";
    uint64_t n = 1;
    for (uint64_t d : t.dims) {
      if (d == 0) return what + ": zero dimension";
      n *= d;  // bounded by the parser (<= 2^62)
    }
    if (n != t.num_elements) return what + ": num_elements != product(dims)";
    GgmlBlockInfo bi;
    if (!GetGgmlBlockInfo(t.type, &bi)) return what + ": unknown type accepted";
    if (t.dims[0] % bi.block_elements != 0) return what + ": row not a multiple of the block";
    if (t.row_bytes != t.dims[0] / bi.block_elements * bi.block_bytes) return what + ": row_bytes";
    if (t.size_bytes != t.num_elements / bi.block_elements * bi.block_bytes) {
      return what + ": size_bytes disagrees with dims and type";
    }
    if (t.row_bytes * t.num_rows() != t.size_bytes) return what + ": rows x row_bytes != size";
    if (t.file_offset != f.data_offset() + t.offset) return what + ": file_offset";
    if (t.file_offset % f.alignment() != 0) return what + ": data not aligned";
    if (t.file_offset > size || t.size_bytes > size - t.file_offset) {
      return what + ": data outside the file";
    }
    std::span<const uint8_t> data = f.TensorData(t);
    if (data.size() != t.size_bytes) return what + ": TensorData size";
    if (!Inside(base, size, data)) return what + ": TensorData outside the file";
    if (!CanDequantize(t.type)) continue;
    if (t.dims[0] > kMaxDequantElements) continue;  // one row is over the budget
    const uint64_t rows = t.num_rows();
    const uint64_t take = std::min(rows, kMaxDequantElements / t.dims[0]);  // >= 1
    std::vector<float> out(take * t.dims[0]);
    absl::Status s = DequantizeRows(t, data, 0, take, out.data());
    if (!s.ok()) {
      return absl::StrCat(what, ": DequantizeRows of a valid tensor failed: ", s.ToString());
    }
    if (rows > take) {
      s = DequantizeRows(t, data, rows - 1, rows, out.data());
      if (!s.ok()) {
        return absl::StrCat(what, ": DequantizeRows of the last row failed: ", s.ToString());
      }
    }
    if (DequantizeRows(t, data, 0, rows + 1, out.data()).ok()) {
      return what + ": DequantizeRows accepted rows past the end";
    }
    if (DequantizeRows(t, data.first(data.size() - 1), 0, 1, out.data()).ok()) {
      return what + ": DequantizeRows accepted data shorter than the tensor";
    }
  }
  for (const auto& [key, value] : f.metadata()) {
    if (f.Find(key) != &value)
      return absl::StrCat("gguf metadata '", key, "': Find does not return it");
    // Every typed getter either succeeds or names the file and the key.
    const std::string prefix = absl::StrCat(f.path(), ": metadata ");
    for (const absl::Status& s :
         {f.GetString(key).status(), f.GetInt(key).status(), f.GetUint(key).status(),
          f.GetFloat(key).status(), f.GetBool(key).status(), f.GetStringArray(key).status(),
          f.GetFloatArray(key).status(), f.GetIntArray(key).status()}) {
      if (!s.ok() &&
          (!absl::StartsWith(s.message(), prefix) || !absl::StrContains(s.message(), key))) {
        return absl::StrCat("gguf metadata '", key,
                            "': getter error does not name file and key: ", s.ToString());
      }
    }
  }
  return "";
}

}  // namespace

std::string GgufFuzzOneInput(const uint8_t* data, size_t size) {
  constexpr absl::string_view kName = "fuzz.gguf";
  auto file = GgufFile::FromBytes(std::string(kName), std::vector<uint8_t>(data, data + size));
  if (!file.ok()) {
    if (file.status().code() != absl::StatusCode::kInvalidArgument) {
      return "gguf: rejection is not InvalidArgument: " + file.status().ToString();
    }
    return CheckError(file.status(), "fuzz.gguf: ", "gguf");
  }
  const GgufFile& f = **file;
  if (f.file_size() != size) return "gguf: file_size != input size";
  if (f.version() != 2 && f.version() != 3) return "gguf: unsupported version accepted";
  if (f.alignment() == 0 || (f.alignment() & (f.alignment() - 1)) != 0) {
    return "gguf: alignment not a power of two";
  }
  if (f.data_offset() % f.alignment() != 0) return "gguf: data offset not aligned";
  // A tensor info with file_offset 0 and no bytes gives the start of the file.
  const uint8_t* base = f.TensorData(GgufTensorInfo{}).data();
  if (std::string p = CheckGgufTensors(f, base, size); !p.empty()) return p;

  auto config = ModelConfigFromGguf(f);
  if (config.ok()) {
    if (absl::Status v = config->Validate(); !v.ok()) {
      return "gguf: accepted model config does not validate: " + v.ToString();
    }
    MemFile mem(data, size);
    if (!mem.ok()) return "gguf: cannot create the in-memory file (memfd_create)";
    if (std::string p = CheckWeights(mem.path(), *config); !p.empty()) return p;
  } else if (std::string p = CheckError(config.status(), "fuzz.gguf: ", "gguf model config");
             !p.empty()) {
    return p;
  }

  auto spec = TokenizerSpecFromGguf(f);
  if (!spec.ok()) return CheckError(spec.status(), "fuzz.gguf: ", "gguf tokenizer");
  if (spec->bos_id < -1 || spec->bos_id >= static_cast<int64_t>(spec->tokens.size())) {
    return "gguf tokenizer: bos id outside the vocabulary";
  }
  auto tok = Tokenizer::Create(std::move(*spec));
  if (!tok.ok()) return "";
  return ExerciseTokenizer(**tok);
}

std::string SafetensorsFuzzOneInput(const uint8_t* data, size_t size) {
  auto file =
      SafetensorsFile::FromBytes("fuzz.safetensors", std::vector<uint8_t>(data, data + size));
  if (!file.ok()) {
    if (file.status().code() != absl::StatusCode::kInvalidArgument) {
      return "safetensors: rejection is not InvalidArgument: " + file.status().ToString();
    }
    return CheckError(file.status(), "fuzz.safetensors: ", "safetensors");
  }
  const SafetensorsFile& f = **file;
  uint64_t header = 0;
  std::memcpy(&header, data, 8);  // accepted, so size >= 8
  const uint64_t base = 8 + header;
  for (const SafetensorsTensorInfo& t : f.tensors()) {
    const std::string what = absl::StrCat("safetensors tensor '", t.name, "'");
    if (f.Find(t.name) != &t) return what + ": Find does not return it";
    uint64_t es = 0;
    if (t.dtype == "F64" || t.dtype == "I64" || t.dtype == "U64") es = 8;
    if (t.dtype == "F32" || t.dtype == "I32" || t.dtype == "U32") es = 4;
    if (t.dtype == "F16" || t.dtype == "BF16" || t.dtype == "I16" || t.dtype == "U16") es = 2;
    if (t.dtype == "I8" || t.dtype == "U8" || t.dtype == "BOOL" || t.dtype == "F8_E4M3" ||
        t.dtype == "F8_E5M2") {
      es = 1;
    }
    if (es == 0) return what + ": unknown dtype accepted: " + t.dtype;
    uint64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0) return absl::StrCat(what, ": negative dimension ", d, " in shape");
      n *= static_cast<uint64_t>(d);
    }
    if (n != t.num_elements) return what + ": num_elements != product(shape)";
    if (t.size_bytes != t.num_elements * es) return what + ": size_bytes != elements x dtype size";
    if (t.file_offset < base || t.file_offset > size || t.size_bytes > size - t.file_offset) {
      return what + ": data outside the data section";
    }
    if (f.TensorData(t).size() != t.size_bytes) return what + ": TensorData size";
    if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16") continue;
    const uint64_t rows = t.shape.empty() ? 1 : static_cast<uint64_t>(t.shape[0]);
    if (t.num_elements > (uint64_t{1} << 20)) continue;
    std::vector<float> out(t.num_elements + 1);
    if (absl::Status s = f.ReadRows(t, 0, rows, out.data()); !s.ok()) {
      return absl::StrCat(what, ": ReadRows of all rows failed: ", s.ToString());
    }
    if (f.ReadRows(t, 0, rows + 1, out.data()).ok()) return what + ": ReadRows past the end";
  }
  return "";
}

std::string HfConfigFuzzOneInput(const uint8_t* data, size_t size) {
  constexpr std::string_view kSource = "fuzz/config.json";
  auto config =
      ModelConfigFromHfJson(std::string_view(reinterpret_cast<const char*>(data), size), kSource);
  if (!config.ok()) {
    if (config.status().code() != absl::StatusCode::kInvalidArgument &&
        config.status().code() != absl::StatusCode::kUnimplemented) {
      return "config.json: unexpected error code: " + config.status().ToString();
    }
    return CheckError(config.status(), "fuzz/config.json: ", "config.json");
  }
  if (absl::Status v = config->Validate(); !v.ok()) {
    return "config.json: accepted config does not validate: " + v.ToString();
  }
  if (config->head_size <= (1 << 16)) {
    for (double f : RopeInverseFrequencies(*config)) {
      if (!std::isfinite(f) || !(f > 0)) {
        return absl::StrCat("config.json: accepted config gives rotary frequency ", f);
      }
    }
  }
  return "";
}

std::string HfTokenizerFuzzOneInput(const uint8_t* data, size_t size) {
  std::string_view all(reinterpret_cast<const char*>(data), size);
  std::string_view tokenizer_json = all, config_json;
  if (size_t nul = all.find('\0'); nul != std::string_view::npos) {
    tokenizer_json = all.substr(0, nul);
    config_json = all.substr(nul + 1);
  }
  auto spec = TokenizerSpecFromHfJson(tokenizer_json, config_json);
  if (!spec.ok()) {
    if (absl::StartsWith(spec.status().message(), "tokenizer_config.json: ")) {
      return CheckError(spec.status(), "tokenizer_config.json: ", "tokenizer_config.json");
    }
    return CheckError(spec.status(), "tokenizer.json: ", "tokenizer.json");
  }
  const int64_t n = static_cast<int64_t>(spec->tokens.size());
  for (const AddedToken& t : spec->added_tokens) {
    if (t.id < 0 || t.id >= n || spec->tokens[t.id] != t.content) {
      return absl::StrCat("tokenizer.json: added token id ", t.id, " does not hold '", t.content,
                          "' in the vocabulary");
    }
  }
  auto tok = Tokenizer::Create(std::move(*spec));
  if (!tok.ok()) return "";
  return ExerciseTokenizer(**tok);
}

}  // namespace pagedserve
