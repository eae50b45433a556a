#include "runtime/model/weights.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "kernels/cpu/half.h"
#include "kernels/weight_format.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/dequant.h"
#include "runtime/model/gguf.h"
#include "runtime/model/safetensors.h"

namespace pagedserve {

const char* WeightDTypeName(WeightDType d) {
  switch (d) {
    case WeightDType::kAuto: return "auto";
    case WeightDType::kFloat32: return "float32";
    case WeightDType::kFloat16: return "float16";
    case WeightDType::kBFloat16: return "bfloat16";
  }
  return "?";
}

absl::StatusOr<WeightDType> ParseWeightDType(std::string_view name) {
  for (WeightDType d :
       {WeightDType::kAuto, WeightDType::kFloat32, WeightDType::kFloat16, WeightDType::kBFloat16}) {
    if (name == WeightDTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "dtype '", std::string(name), "' is not one of auto, float32, float16, bfloat16"));
}

absl::Status Matrix::RowToFloat(int64_t r, float* dst) const {
  if (is_fp32()) {
    std::copy_n(row(r), cols, dst);
    return absl::OkStatus();
  }
  return DequantizeRow(type, std::span<const uint8_t>(bytes() + r * row_bytes, row_bytes), dst,
                       static_cast<size_t>(cols));
}

uint64_t Matrix::size_bytes() const {
  return is_fp32() ? data.size() * sizeof(float) : static_cast<uint64_t>(rows) * row_bytes;
}

absl::StatusOr<ShardLayout> ComputeShardLayout(const ModelConfig& c, int tp_rank, int tp_size) {
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel rank ", tp_rank, " of size ", tp_size, " is invalid"));
  }
  if (c.num_heads % tp_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel size ", tp_size, " does not divide num_heads ", c.num_heads));
  }
  if (c.intermediate_size % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel size ", tp_size,
                                                   " does not divide intermediate_size ",
                                                   c.intermediate_size));
  }
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_heads ", c.num_heads, " is not a multiple of num_kv_heads ", c.num_kv_heads));
  }
  if (tp_size <= c.num_kv_heads ? c.num_kv_heads % tp_size != 0 : tp_size % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel size ", tp_size,
                                                   " and num_kv_heads ", c.num_kv_heads,
                                                   " must divide one another"));
  }
  if (c.moe.enabled() && c.moe.expert_intermediate_size % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallel size ", tp_size, " does not divide the experts' intermediate size ",
        c.moe.expert_intermediate_size));
  }
  if (c.moe.shared_expert_intermediate_size % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallel size ", tp_size, " does not divide the shared expert's intermediate size ",
        c.moe.shared_expert_intermediate_size));
  }
  ShardLayout s;
  s.tp_rank = tp_rank;
  s.tp_size = tp_size;
  s.num_heads = c.num_heads / tp_size;
  s.first_head = tp_rank * s.num_heads;
  if (tp_size <= c.num_kv_heads) {
    s.num_kv_heads = c.num_kv_heads / tp_size;
    s.first_kv_head = tp_rank * s.num_kv_heads;
  } else {
    s.num_kv_heads = 1;
    s.first_kv_head = s.first_head / (c.num_heads / c.num_kv_heads);
  }
  s.intermediate_size = c.intermediate_size / tp_size;
  s.first_intermediate = tp_rank * s.intermediate_size;
  if (c.moe.enabled()) {
    s.expert_intermediate_size = c.moe.expert_intermediate_size / tp_size;
    s.first_expert_intermediate = tp_rank * s.expert_intermediate_size;
    s.shared_expert_intermediate_size = c.moe.shared_expert_intermediate_size / tp_size;
    s.first_shared_expert_intermediate = tp_rank * s.shared_expert_intermediate_size;
  }
  return s;
}

namespace {

bool IsDirectory(const std::string& p) {
  struct stat st;
  return stat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string ShapeString(const std::vector<int64_t>& s) {
  return absl::StrCat("[", absl::StrJoin(s, ", "), "]");
}

// Uniform access to named tensors in Hugging Face naming and orientation.
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual bool Has(const std::string& name) const = 0;
  // HF order: [rows, cols] or [n]. NotFound naming the file when absent.
  virtual absl::StatusOr<std::vector<int64_t>> Shape(const std::string& name) const = 0;
  // Rows [r0, r1) along dimension 0 (elements for a 1-D tensor), fp32.
  virtual absl::Status ReadRows(const std::string& name, int64_t r0, int64_t r1,
                                float* dst) const = 0;
  // The stored bytes of a 2-D tensor: row r is row_bytes bytes at data + r * row_bytes
  // (inside the file mapping). Unimplemented for a type that has no ggml layout.
  struct Stored {
    GgmlType type = GgmlType::kF32;
    const uint8_t* data = nullptr;
    uint64_t row_bytes = 0;
    GgmlBlockInfo block;
  };
  virtual absl::StatusOr<Stored> StoredRows(const std::string& name) const = 0;
  // True when Q/K rows are stored in llama.cpp's permuted order.
  virtual bool qk_permuted() const { return false; }
  // Bytes [p, p + bytes) of tensor `name`'s stored data were copied (or
  // converted) into memory of their own: their pages leave the resident
  // set (MappedFile::DropResident), so the model is not held twice.
  virtual void DropResident(const std::string& name, const uint8_t* p, uint64_t bytes) const = 0;
  // The same for bytes of any tensor (LlamaWeights::drop_resident).
  virtual void DropResidentBytes(const uint8_t* p, uint64_t bytes) const = 0;
  // Stored bytes of tensor `name` (0 when absent), and of all tensors.
  virtual uint64_t TensorBytes(const std::string& name) const = 0;
  virtual uint64_t TotalBytes() const = 0;
};

// An HF per-expert tensor name (Mixtral block_sparse_moe.experts.E.w1/w3/w2,
// Qwen3-MoE mlp.experts.E.gate_proj/up_proj/down_proj) as the GGUF 3-D tensor
// that holds every expert of the layer (blk.N.ffn_{gate,up,down}_exps) and
// the expert's index in it; nullopt for any other name.
struct GgufExpertName {
  std::string tensor;
  uint64_t expert = 0;
};
std::optional<GgufExpertName> GgufExpert(const std::string& hf) {
  constexpr std::string_view kLayers = "model.layers.";
  constexpr std::string_view kExperts = ".experts.";
  const size_t at = hf.find(kExperts);
  if (hf.rfind(kLayers, 0) != 0 || at == std::string::npos) return std::nullopt;
  const size_t layer_end = hf.find('.', kLayers.size());
  const std::string layer = hf.substr(kLayers.size(), layer_end - kLayers.size());
  const std::string rest = hf.substr(at + kExperts.size());  // "E.kind.weight"
  const size_t dot = rest.find('.');
  if (dot == std::string::npos || dot == 0 || dot > 9) return std::nullopt;
  uint64_t e = 0;
  for (size_t i = 0; i < dot; ++i) {
    if (rest[i] < '0' || rest[i] > '9') return std::nullopt;
    e = e * 10 + static_cast<uint64_t>(rest[i] - '0');
  }
  const std::string kind = rest.substr(dot + 1);
  const char* gguf = nullptr;
  if (kind == "gate_proj.weight" || kind == "w1.weight") gguf = "ffn_gate_exps";
  if (kind == "up_proj.weight" || kind == "w3.weight") gguf = "ffn_up_exps";
  if (kind == "down_proj.weight" || kind == "w2.weight") gguf = "ffn_down_exps";
  if (gguf == nullptr) return std::nullopt;
  return GgufExpertName{absl::StrCat("blk.", layer, ".", gguf, ".weight"), e};
}

class GgufSource : public TensorSource {
 public:
  // post_norms: Gemma's names (HF post_attention_layernorm is the norm
  // after attention, GGUF post_attention_norm; pre_feedforward_layernorm is
  // GGUF ffn_norm).
  GgufSource(std::unique_ptr<GgufFile> f, bool permuted, bool post_norms)
      : f_(std::move(f)), permuted_(permuted), post_norms_(post_norms) {}

  // HF -> GGUF tensor names (llama.cpp's tensor name map); experts: GgufExpert.
  std::string GgufName(const std::string& hf) const {
    if (hf == "model.embed_tokens.weight") return "token_embd.weight";
    if (hf == "model.norm.weight") return "output_norm.weight";
    if (hf == "lm_head.weight") return "output.weight";
    if (post_norms_) {
      const std::string n =
          absl::StrReplaceAll(hf, {{".post_attention_layernorm.", ".post_attention_norm."},
                                   {".pre_feedforward_layernorm.", ".ffn_norm."},
                                   {".post_feedforward_layernorm.", ".post_ffw_norm."}});
      if (n != hf) return GgufName(n);
    }
    if (auto e = GgufExpert(hf)) return e->tensor;
    if (hf.find(".mlp.shared_expert") != std::string::npos) {  // Qwen2-MoE
      return absl::StrReplaceAll(hf, {{"model.layers.", "blk."},
                                      {".mlp.shared_expert_gate.", ".ffn_gate_inp_shexp."},
                                      {".mlp.shared_expert.gate_proj.", ".ffn_gate_shexp."},
                                      {".mlp.shared_expert.up_proj.", ".ffn_up_shexp."},
                                      {".mlp.shared_expert.down_proj.", ".ffn_down_shexp."}});
    }
    std::string n = absl::StrReplaceAll(hf, {{"model.layers.", "blk."},
                                             {".self_attn.q_proj.", ".attn_q."},
                                             {".self_attn.k_proj.", ".attn_k."},
                                             {".self_attn.v_proj.", ".attn_v."},
                                             {".self_attn.o_proj.", ".attn_output."},
                                             {".self_attn.qkv_proj.", ".attn_qkv."},
                                             {".mlp.gate_up_proj.", ".ffn_up."},
                                             {".self_attn.q_norm.", ".attn_q_norm."},
                                             {".self_attn.k_norm.", ".attn_k_norm."},
                                             {".input_layernorm.", ".attn_norm."},
                                             {".post_attention_layernorm.", ".ffn_norm."},
                                             {".mlp.gate_proj.", ".ffn_gate."},
                                             {".mlp.up_proj.", ".ffn_up."},
                                             {".mlp.down_proj.", ".ffn_down."},
                                             {".mlp.gate.", ".ffn_gate_inp."},
                                             {".block_sparse_moe.gate.", ".ffn_gate_inp."}});
    return n;
  }

  bool Has(const std::string& name) const override { return Info(name).ok(); }
  absl::StatusOr<std::vector<int64_t>> Shape(const std::string& name) const override {
    auto info = Info(name);
    if (!info.ok()) return info.status();
    const std::vector<uint64_t>& dims = info->t->dims;
    if (info->expert.has_value()) {  // one expert's [out, in] of ne [in, out, E]
      return std::vector<int64_t>{static_cast<int64_t>(dims[1]), static_cast<int64_t>(dims[0])};
    }
    std::vector<int64_t> s;
    for (auto it = dims.rbegin(); it != dims.rend(); ++it) s.push_back(static_cast<int64_t>(*it));
    // llama.cpp writes Qwen2-MoE's shared expert gate ([1, h] in HF) as 1-D.
    if (s.size() == 1 && absl::EndsWith(info->t->name, ".ffn_gate_inp_shexp.weight"))
      s.insert(s.begin(), 1);
    return s;
  }
  absl::Status ReadRows(const std::string& name, int64_t r0, int64_t r1,
                        float* dst) const override {
    auto info = Info(name);
    if (!info.ok()) return info.status();
    const GgufTensorInfo& t = *info->t;
    auto data = f_->TensorData(t);
    absl::Status s;
    if (t.dims.size() == 1) {
      std::vector<float> all(t.dims[0]);
      s = DequantizeRows(t, data, 0, 1, all.data());
      if (s.ok()) std::copy(all.begin() + r0, all.begin() + r1, dst);
    } else {
      const int64_t skip = ExpertRow0(*info);
      s = DequantizeRows(t, data, skip + r0, skip + r1, dst);
    }
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(f_->path(), ": ", s.message()));
    return absl::OkStatus();
  }
  absl::StatusOr<Stored> StoredRows(const std::string& name) const override {
    auto info = Info(name);
    if (!info.ok()) return info.status();
    Stored st;
    st.type = info->t->type;
    st.row_bytes = info->t->row_bytes;
    st.data = f_->TensorData(*info->t).data() + ExpertRow0(*info) * st.row_bytes;
    GetGgmlBlockInfo(st.type, &st.block);  // known: validated at Open
    return st;
  }
  bool qk_permuted() const override { return permuted_; }
  void DropResident(const std::string& name, const uint8_t* p, uint64_t bytes) const override {
    f_->DropResident(p, bytes);
  }
  void DropResidentBytes(const uint8_t* p, uint64_t bytes) const override {
    f_->DropResident(p, bytes);
  }
  uint64_t TensorBytes(const std::string& name) const override {
    auto info = Info(name);
    if (!info.ok()) return 0;
    return info->expert.has_value() ? info->t->size_bytes / info->t->dims[2] : info->t->size_bytes;
  }
  uint64_t TotalBytes() const override {
    uint64_t total = 0;
    for (const GgufTensorInfo& t : f_->tensors()) total += t.size_bytes;
    return total;
  }
  const GgufFile& file() const { return *f_; }

 private:
  struct Found {
    const GgufTensorInfo* t = nullptr;
    std::optional<uint64_t> expert;  // an expert's slice of a 3-D tensor
  };
  absl::StatusOr<Found> Info(const std::string& name) const {
    const std::optional<GgufExpertName> expert = GgufExpert(name);
    std::string g = GgufName(name);
    const GgufTensorInfo* t = f_->FindTensor(g);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat(f_->path(), ": tensor '", g, "' not found"));
    }
    if (!CanDequantize(t->type)) {
      return absl::UnimplementedError(absl::StrCat(
          f_->path(), ": tensor '", g, "' has type ", GgmlTypeName(t->type),
          ", which pagedserve does not run (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
          "Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS); llama-quantize can convert the "
          "file to one of them"));
    }
    if (!expert.has_value()) return Found{t, std::nullopt};
    if (t->dims.size() != 3 || expert->expert >= t->dims[2]) {
      return absl::InvalidArgumentError(absl::StrCat(
          f_->path(), ": tensor '", g, "' has ", t->dims.size(), " dimensions; expert ",
          expert->expert, " needs a 3-D [in, out, experts] tensor with more experts"));
    }
    return Found{t, expert->expert};
  }
  // The first ggml row of the expert's slice (0 for a whole tensor).
  static int64_t ExpertRow0(const Found& f) {
    return f.expert.has_value() ? static_cast<int64_t>(*f.expert * f.t->dims[1]) : 0;
  }
  std::unique_ptr<GgufFile> f_;
  bool permuted_;
  bool post_norms_;
};

class SafetensorsSource : public TensorSource {
 public:
  explicit SafetensorsSource(std::unique_ptr<SafetensorsCheckpoint> ck) : ck_(std::move(ck)) {}
  bool Has(const std::string& name) const override { return ck_->Contains(name); }
  absl::StatusOr<std::vector<int64_t>> Shape(const std::string& name) const override {
    auto t = ck_->Find(name);
    if (!t.ok()) return t.status();
    return t->second->shape;
  }
  absl::Status ReadRows(const std::string& name, int64_t r0, int64_t r1,
                        float* dst) const override {
    auto t = ck_->Find(name);
    if (!t.ok()) return t.status();
    return t->first->ReadRows(*t->second, r0, r1, dst);
  }
  void DropResident(const std::string& name, const uint8_t* p, uint64_t bytes) const override {
    if (auto t = ck_->Find(name); t.ok()) t->first->DropResident(p, bytes);
  }
  // No backend copies safetensors bytes (F32/F16/BF16 are used in place or
  // converted by the loader, which drops them by name).
  void DropResidentBytes(const uint8_t* p, uint64_t bytes) const override {}
  absl::StatusOr<Stored> StoredRows(const std::string& name) const override {
    auto t = ck_->Find(name);
    if (!t.ok()) return t.status();
    const SafetensorsTensorInfo& info = *t->second;
    Stored st;
    if (info.dtype == "F32") {
      st.type = GgmlType::kF32;
    } else if (info.dtype == "F16") {
      st.type = GgmlType::kF16;
    } else if (info.dtype == "BF16") {
      st.type = GgmlType::kBF16;
    } else {
      return absl::UnimplementedError(absl::StrCat(t->first->path(), ": tensor '", name,
                                                   "': dtype ", info.dtype,
                                                   " is not supported (F32, F16, BF16)"));
    }
    GetGgmlBlockInfo(st.type, &st.block);
    st.data = t->first->TensorData(info).data();
    st.row_bytes = info.shape.size() == 2 ? info.shape[1] * st.block.block_bytes : 0;
    return st;
  }
  uint64_t TensorBytes(const std::string& name) const override {
    auto t = ck_->Find(name);
    return t.ok() ? t->second->size_bytes : 0;
  }
  uint64_t TotalBytes() const override { return ck_->tensor_bytes(); }

 private:
  std::unique_ptr<SafetensorsCheckpoint> ck_;
};

// Types the CPU linear kernels (kernels/weight_format.h) run in place: every
// type the loader reads (CanDequantize) is one of them.
bool KeepsStored(GgmlType t) { return kernels::IsWeightType(static_cast<uint32_t>(t)); }

class Loader {
 public:
  Loader(const TensorSource& src, const ModelConfig& c, const ShardLayout& s, WeightDType dtype)
      : src_(src), c_(c), s_(s), dtype_(dtype) {}

  // Whether some matrix points into the source's mapping.
  bool uses_mapping() const { return uses_mapping_; }

  // Stored bytes of the distinct tensors read so far (CheckShape sees each).
  uint64_t bytes_read() const { return bytes_read_; }

  absl::Status CheckShape(const std::string& name, const std::vector<int64_t>& want) {
    if (counted_.insert(name).second) bytes_read_ += src_.TensorBytes(name);
    auto shape = src_.Shape(name);
    if (!shape.ok()) return shape.status();
    if (*shape != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "': shape ", ShapeString(*shape), ", expected ", ShapeString(want)));
    }
    return absl::OkStatus();
  }

  // Rows [r0, r1) of a [rows, cols] matrix; `qk_heads` > 0 undoes the Q/K
  // permutation over that many heads (when the source is permuted).
  absl::StatusOr<Matrix> Rows(const std::string& name, int64_t rows, int64_t cols, int64_t r0,
                              int64_t r1, int64_t qk_heads = 0) {
    PS_RETURN_IF_ERROR(CheckShape(name, {rows, cols}));
    PS_ASSIGN_OR_RETURN(std::optional<TensorSource::Stored> st, KeptStored(name));
    if (st.has_value()) {
      Matrix m = StoredShell(*st, r1 - r0, cols);
      const uint8_t* base = st->data + r0 * st->row_bytes;
      if ((qk_heads > 0 && src_.qk_permuted()) || !Aligned(base, st->block)) {
        m.owned.assign(base, base + m.rows * m.row_bytes);
        src_.DropResident(name, base, m.rows * m.row_bytes);
        if (qk_heads > 0) Unpermute(m.owned.data(), qk_heads, m.row_bytes);
      } else {
        m.mapped = base;
        uses_mapping_ = true;
      }
      return m;
    }
    Matrix m;
    m.rows = r1 - r0;
    m.cols = cols;
    m.data.resize(m.rows * m.cols);
    PS_RETURN_IF_ERROR(src_.ReadRows(name, r0, r1, m.data.data()));
    DropConverted(name, r0, r1);
    if (qk_heads > 0) Unpermute(m.data.data(), qk_heads, cols * sizeof(float));
    return ToHalfIfAsked(std::move(m));
  }

  // Columns [c0, c1) of a [rows, cols] matrix.
  absl::StatusOr<Matrix> Cols(const std::string& name, int64_t rows, int64_t cols, int64_t c0,
                              int64_t c1) {
    PS_RETURN_IF_ERROR(CheckShape(name, {rows, cols}));
    PS_ASSIGN_OR_RETURN(std::optional<TensorSource::Stored> st, KeptStored(name));
    const int64_t be = st.has_value() ? st->block.block_elements : 1;
    if (st.has_value() && c0 == 0 && c1 == cols) return Rows(name, rows, cols, 0, rows);
    if (st.has_value() && c0 % be == 0 && c1 % be == 0) {
      // Each row's sub-range is whole blocks: copy those bytes.
      Matrix m = StoredShell(*st, rows, c1 - c0);
      const uint64_t skip = c0 / be * st->block.block_bytes;
      m.owned.resize(m.rows * m.row_bytes);
      for (int64_t r = 0; r < rows; ++r) {
        std::memcpy(m.owned.data() + r * m.row_bytes, st->data + r * st->row_bytes + skip,
                    m.row_bytes);
      }
      // The other columns are other ranks' (never read here).
      src_.DropResident(name, st->data, rows * st->row_bytes);
      return m;
    }
    Matrix m;
    m.rows = rows;
    m.cols = c1 - c0;
    m.data.resize(m.rows * m.cols);
    const int64_t chunk = 64;
    std::vector<float> tmp(chunk * cols);
    for (int64_t r = 0; r < rows; r += chunk) {
      int64_t n = std::min(chunk, rows - r);
      PS_RETURN_IF_ERROR(src_.ReadRows(name, r, r + n, tmp.data()));
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(m.row(r + i), tmp.data() + i * cols + c0, m.cols * sizeof(float));
      }
    }
    DropConverted(name, 0, rows);
    return ToHalfIfAsked(std::move(m));
  }

  // Rows [r0, r1) of `name` were converted to fp32: their stored bytes leave
  // the resident set (a type without a row layout keeps them).
  void DropConverted(const std::string& name, int64_t r0, int64_t r1) {
    absl::StatusOr<TensorSource::Stored> st = src_.StoredRows(name);
    if (st.ok() && st->data != nullptr)
      src_.DropResident(name, st->data + r0 * st->row_bytes, (r1 - r0) * st->row_bytes);
  }

  absl::StatusOr<std::vector<float>> Vector(const std::string& name, int64_t n, int64_t r0,
                                            int64_t r1) {
    if (auto s = CheckShape(name, {n}); !s.ok()) return s;
    std::vector<float> v(r1 - r0);
    if (auto s = src_.ReadRows(name, r0, r1, v.data()); !s.ok()) return s;
    return v;
  }

  // Undoes llama.cpp's Q/K permutation on consecutive heads of head_size rows
  // of `row_bytes` bytes each (matrix rows in any format, or single bias values).
  void Unpermute(void* data, int64_t heads, uint64_t row_bytes) {
    if (!src_.qk_permuted()) return;
    const int64_t d = c_.head_size, half = d / 2;
    std::vector<uint8_t> head(d * row_bytes);
    for (int64_t h = 0; h < heads; ++h) {
      uint8_t* base = static_cast<uint8_t*>(data) + h * d * row_bytes;
      std::memcpy(head.data(), base, head.size());
      // stored row 2b + a holds HF row a * half + b
      for (int64_t a = 0; a < 2; ++a) {
        for (int64_t b = 0; b < half; ++b) {
          std::memcpy(base + (a * half + b) * row_bytes, head.data() + (2 * b + a) * row_bytes,
                      row_bytes);
        }
      }
    }
  }

  // An RMSNorm weight of n values; with config.norm_weight_plus_one (Gemma
  // from HF) the stored w becomes 1 + w (fp32, as HF's (1.0 + w.float())).
  absl::StatusOr<std::vector<float>> Norm(const std::string& name, int64_t n) {
    PS_ASSIGN_OR_RETURN(std::vector<float> w, Vector(name, n, 0, n));
    if (c_.norm_weight_plus_one) {
      for (float& x : w) x = 1.0f + x;
    }
    return w;
  }

  absl::Status Layer(int i, LayerWeights* L) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const int64_t h = c_.hidden_size, d = c_.head_size;
    const int64_t q0 = s_.first_head * d, q1 = (s_.first_head + s_.num_heads) * d;
    const int64_t k0 = s_.first_kv_head * d, k1 = (s_.first_kv_head + s_.num_kv_heads) * d;
    const int64_t i0 = s_.first_intermediate, i1 = i0 + s_.intermediate_size;
    const int64_t qn = int64_t{c_.num_heads} * d, kn = int64_t{c_.num_kv_heads} * d;
    PS_ASSIGN_OR_RETURN(L->input_layernorm, Norm(p + "input_layernorm.weight", h));
    if (c_.fused_projections) {  // Phi-3: rows [q | k | v] of one qkv_proj
      const std::string qkv = p + "self_attn.qkv_proj.weight";
      const int64_t rows = qn + 2 * kn;
      PS_ASSIGN_OR_RETURN(L->q_proj, Rows(qkv, rows, h, q0, q1, s_.num_heads));
      PS_ASSIGN_OR_RETURN(L->k_proj, Rows(qkv, rows, h, qn + k0, qn + k1, s_.num_kv_heads));
      PS_ASSIGN_OR_RETURN(L->v_proj, Rows(qkv, rows, h, qn + kn + k0, qn + kn + k1));
    } else {
      PS_ASSIGN_OR_RETURN(L->q_proj,
                          Rows(p + "self_attn.q_proj.weight", qn, h, q0, q1, s_.num_heads));
      PS_ASSIGN_OR_RETURN(L->k_proj,
                          Rows(p + "self_attn.k_proj.weight", kn, h, k0, k1, s_.num_kv_heads));
      PS_ASSIGN_OR_RETURN(L->v_proj, Rows(p + "self_attn.v_proj.weight", kn, h, k0, k1));
    }
    if (c_.qkv_bias) {
      PS_ASSIGN_OR_RETURN(L->q_bias, Vector(p + "self_attn.q_proj.bias", qn, q0, q1));
      Unpermute(L->q_bias.data(), s_.num_heads, sizeof(float));
      PS_ASSIGN_OR_RETURN(L->k_bias, Vector(p + "self_attn.k_proj.bias", kn, k0, k1));
      Unpermute(L->k_bias.data(), s_.num_kv_heads, sizeof(float));
      PS_ASSIGN_OR_RETURN(L->v_bias, Vector(p + "self_attn.v_proj.bias", kn, k0, k1));
    }
    if (c_.qk_norm) {
      PS_ASSIGN_OR_RETURN(L->q_norm, Norm(p + "self_attn.q_norm.weight", d));
      PS_ASSIGN_OR_RETURN(L->k_norm, Norm(p + "self_attn.k_norm.weight", d));
    }
    PS_ASSIGN_OR_RETURN(L->o_proj, Cols(p + "self_attn.o_proj.weight", h, qn, q0, q1));
    if (c_.post_norms) {  // Gemma: norms after attention and MLP, pre_feedforward before it
      PS_ASSIGN_OR_RETURN(L->attn_post_norm, Norm(p + "post_attention_layernorm.weight", h));
      PS_ASSIGN_OR_RETURN(L->post_attention_layernorm,
                          Norm(p + "pre_feedforward_layernorm.weight", h));
      PS_ASSIGN_OR_RETURN(L->mlp_post_norm, Norm(p + "post_feedforward_layernorm.weight", h));
    } else {
      PS_ASSIGN_OR_RETURN(L->post_attention_layernorm,
                          Norm(p + "post_attention_layernorm.weight", h));
    }
    if (c_.moe.enabled()) return Experts(p, L);
    const int64_t in = c_.intermediate_size;
    if (c_.fused_projections) {  // Phi-3: rows [gate | up] of one gate_up_proj
      const std::string gu = p + "mlp.gate_up_proj.weight";
      PS_ASSIGN_OR_RETURN(L->gate_proj, Rows(gu, 2 * in, h, i0, i1));
      PS_ASSIGN_OR_RETURN(L->up_proj, Rows(gu, 2 * in, h, in + i0, in + i1));
    } else {
      PS_ASSIGN_OR_RETURN(L->gate_proj, Rows(p + "mlp.gate_proj.weight", in, h, i0, i1));
      PS_ASSIGN_OR_RETURN(L->up_proj, Rows(p + "mlp.up_proj.weight", in, h, i0, i1));
    }
    PS_ASSIGN_OR_RETURN(L->down_proj, Cols(p + "mlp.down_proj.weight", h, in, i0, i1));
    return absl::OkStatus();
  }

  // The router and every expert's shard (weights.h) of the layer whose
  // tensor names start with `p`, in Mixtral's names for a Mixtral config
  // and Qwen3-MoE's otherwise (a GGUF source maps both to its own).
  absl::Status Experts(const std::string& p, LayerWeights* L) {
    const bool mixtral = c_.arch == ModelArch::kMixtral;
    const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
    const int64_t h = c_.hidden_size, e_count = c_.moe.num_experts;
    const int64_t ie = c_.moe.expert_intermediate_size;
    const int64_t i0 = s_.first_expert_intermediate, i1 = i0 + s_.expert_intermediate_size;
    PS_ASSIGN_OR_RETURN(L->router, Rows(moe + "gate.weight", e_count, h, 0, e_count));
    for (int64_t e = 0; e < e_count; ++e) {
      const std::string x = absl::StrCat(moe, "experts.", e, ".");
      PS_ASSIGN_OR_RETURN(Matrix gate,
                          Rows(x + (mixtral ? "w1" : "gate_proj") + ".weight", ie, h, i0, i1));
      PS_ASSIGN_OR_RETURN(Matrix up,
                          Rows(x + (mixtral ? "w3" : "up_proj") + ".weight", ie, h, i0, i1));
      PS_ASSIGN_OR_RETURN(Matrix down,
                          Cols(x + (mixtral ? "w2" : "down_proj") + ".weight", h, ie, i0, i1));
      L->expert_gate.push_back(std::move(gate));
      L->expert_up.push_back(std::move(up));
      L->expert_down.push_back(std::move(down));
    }
    if (const int64_t is = c_.moe.shared_expert_intermediate_size; is > 0) {
      const int64_t s0 = s_.first_shared_expert_intermediate;
      const int64_t s1 = s0 + s_.shared_expert_intermediate_size;
      const std::string x = moe + "shared_expert.";
      PS_ASSIGN_OR_RETURN(L->shared_gate, Rows(x + "gate_proj.weight", is, h, s0, s1));
      PS_ASSIGN_OR_RETURN(L->shared_up, Rows(x + "up_proj.weight", is, h, s0, s1));
      PS_ASSIGN_OR_RETURN(L->shared_down, Cols(x + "down_proj.weight", h, is, s0, s1));
      PS_ASSIGN_OR_RETURN(L->shared_expert_gate,
                          Rows(moe + "shared_expert_gate.weight", 1, h, 0, 1));
    }
    return absl::OkStatus();
  }

 private:
  // The stored layout of `name` when the dtype keeps it as stored, else nullopt.
  absl::StatusOr<std::optional<TensorSource::Stored>> KeptStored(const std::string& name) {
    if (dtype_ == WeightDType::kFloat32) return std::nullopt;
    PS_ASSIGN_OR_RETURN(TensorSource::Stored st, src_.StoredRows(name));
    const bool keep = dtype_ == WeightDType::kAuto      ? KeepsStored(st.type)
                      : dtype_ == WeightDType::kFloat16 ? st.type == GgmlType::kF16
                                                        : st.type == GgmlType::kBF16;
    if (!keep) return std::nullopt;
    return st;
  }

  static Matrix StoredShell(const TensorSource::Stored& st, int64_t rows, int64_t cols) {
    Matrix m;
    m.rows = rows;
    m.cols = cols;
    m.type = st.type;
    m.row_bytes = cols / st.block.block_elements * st.block.block_bytes;
    return m;
  }

  // Plain element types are read in place only at their natural alignment.
  static bool Aligned(const uint8_t* p, const GgmlBlockInfo& b) {
    return b.block_elements != 1 || reinterpret_cast<uintptr_t>(p) % b.block_bytes == 0;
  }

  // fp32 values -> the fp16 / bf16 rows kFloat16 / kBFloat16 ask for.
  Matrix ToHalfIfAsked(Matrix m) const {
    if (dtype_ != WeightDType::kFloat16 && dtype_ != WeightDType::kBFloat16) return m;
    const bool bf = dtype_ == WeightDType::kBFloat16;
    m.type = bf ? GgmlType::kBF16 : GgmlType::kF16;
    m.row_bytes = m.cols * 2;
    m.owned.resize(m.data.size() * 2);
    for (size_t i = 0; i < m.data.size(); ++i) {
      const uint16_t v =
          bf ? kernels::FloatToBFloat16Bits(m.data[i]) : kernels::FloatToHalfBits(m.data[i]);
      std::memcpy(m.owned.data() + 2 * i, &v, 2);
    }
    m.data = {};
    return m;
  }

  const TensorSource& src_;
  const ModelConfig& c_;
  const ShardLayout& s_;
  WeightDType dtype_;
  bool uses_mapping_ = false;
  absl::flat_hash_set<std::string> counted_;
  uint64_t bytes_read_ = 0;
};

absl::StatusOr<std::unique_ptr<TensorSource>> OpenSource(const std::string& path,
                                                         ModelConfig* config) {
  if (IsDirectory(path)) {
    auto c = LoadHfConfig(path);
    if (!c.ok()) return c.status();
    auto ck = SafetensorsCheckpoint::Open(path);
    if (!ck.ok()) return ck.status();
    *config = *c;
    return std::unique_ptr<TensorSource>(new SafetensorsSource(std::move(*ck)));
  }
  auto g = GgufFile::Open(path);
  if (!g.ok()) return g.status();
  auto c = ModelConfigFromGguf(**g);
  if (!c.ok()) return c.status();
  *config = *c;
  bool permuted = c->arch == ModelArch::kLlama;
  return std::unique_ptr<TensorSource>(new GgufSource(std::move(*g), permuted, c->post_norms));
}

}  // namespace

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  if (IsDirectory(path)) return LoadHfConfig(path);
  auto g = GgufFile::Open(path);
  if (!g.ok()) return g.status();
  return ModelConfigFromGguf(**g);
}

absl::StatusOr<LlamaWeights> LoadLlamaWeights(const std::string& path, int tp_rank, int tp_size,
                                              WeightDType dtype, const LoadProgressFn& progress) {
  LlamaWeights w;
  w.dtype = dtype;
  auto src = OpenSource(path, &w.config);
  if (!src.ok()) return src.status();
  // Every error names the file: the loader's own messages (a shape mismatch,
  // the shard layout) get the path in front; the source's already start with it.
  auto named = [&](const absl::Status& s) {
    if (absl::StartsWith(s.message(), path)) return s;
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };
  auto shard = ComputeShardLayout(w.config, tp_rank, tp_size);
  if (!shard.ok()) return named(shard.status());
  w.shard = *shard;
  const ModelConfig& c = w.config;
  Loader loader(**src, c, w.shard, dtype);
  const uint64_t total = (*src)->TotalBytes();
  auto report = [&](uint64_t loaded) {
    if (progress) progress(std::min(loaded, total), total);
  };
  report(0);
  auto embed =
      loader.Rows("model.embed_tokens.weight", c.vocab_size, c.hidden_size, 0, c.vocab_size);
  if (!embed.ok()) return named(embed.status());
  w.embed_tokens = std::move(*embed);
  auto norm = loader.Norm("model.norm.weight", c.hidden_size);
  if (!norm.ok()) return named(norm.status());
  w.final_norm = std::move(*norm);
  if (!c.tie_word_embeddings) {
    auto head = loader.Rows("lm_head.weight", c.vocab_size, c.hidden_size, 0, c.vocab_size);
    if (!head.ok()) return named(head.status());
    w.lm_head = std::move(*head);
  }
  report(loader.bytes_read());
  // Grown layer by layer: num_layers comes from the file and is only known to
  // be right once every layer's tensors are there (a block_count of 2^31 - 1
  // must fail on the first missing tensor, not allocate 2^31 layers first).
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights layer;
    if (auto s = loader.Layer(i, &layer); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(path, ": layer ", i, ": ", s.message()));
    }
    w.layers.push_back(std::move(layer));
    report(loader.bytes_read());
  }
  if (loader.uses_mapping()) {
    auto source = std::shared_ptr<const TensorSource>(std::move(*src));
    w.drop_resident = [raw = source.get()](const uint8_t* p, uint64_t bytes) {
      raw->DropResidentBytes(p, bytes);
    };
    w.mapping = std::move(source);
  }
  report(total);
  return w;
}

}  // namespace pagedserve
