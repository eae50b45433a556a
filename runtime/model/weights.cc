#include "runtime/model/weights.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "runtime/model/dequant.h"
#include "runtime/model/gguf.h"
#include "runtime/model/safetensors.h"

namespace pagedserve {

absl::StatusOr<ShardLayout> ComputeShardLayout(const ModelConfig& c, int tp_rank, int tp_size) {
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallel rank ", tp_rank, " of size ", tp_size, " is invalid"));
  }
  if (c.num_heads % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel size ", tp_size,
                                                   " does not divide num_heads ", c.num_heads));
  }
  if (c.intermediate_size % tp_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("tensor parallel size ", tp_size,
                                                   " does not divide intermediate_size ",
                                                   c.intermediate_size));
  }
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads ", c.num_heads,
                                                   " is not a multiple of num_kv_heads ",
                                                   c.num_kv_heads));
  }
  if (tp_size <= c.num_kv_heads ? c.num_kv_heads % tp_size != 0 : tp_size % c.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallel size ", tp_size, " and num_kv_heads ", c.num_kv_heads,
        " must divide one another"));
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
  // True when Q/K rows are stored in llama.cpp's permuted order.
  virtual bool qk_permuted() const { return false; }
};

class GgufSource : public TensorSource {
 public:
  GgufSource(std::unique_ptr<GgufFile> f, bool permuted) : f_(std::move(f)), permuted_(permuted) {}

  // HF -> GGUF tensor names (llama.cpp's tensor name map).
  static std::string GgufName(const std::string& hf) {
    if (hf == "model.embed_tokens.weight") return "token_embd.weight";
    if (hf == "model.norm.weight") return "output_norm.weight";
    if (hf == "lm_head.weight") return "output.weight";
    std::string n = absl::StrReplaceAll(
        hf, {{"model.layers.", "blk."},
             {".self_attn.q_proj.", ".attn_q."},
             {".self_attn.k_proj.", ".attn_k."},
             {".self_attn.v_proj.", ".attn_v."},
             {".self_attn.o_proj.", ".attn_output."},
             {".input_layernorm.", ".attn_norm."},
             {".post_attention_layernorm.", ".ffn_norm."},
             {".mlp.gate_proj.", ".ffn_gate."},
             {".mlp.up_proj.", ".ffn_up."},
             {".mlp.down_proj.", ".ffn_down."}});
    return n;
  }

  bool Has(const std::string& name) const override {
    return f_->FindTensor(GgufName(name)) != nullptr;
  }
  absl::StatusOr<std::vector<int64_t>> Shape(const std::string& name) const override {
    auto info = Info(name);
    if (!info.ok()) return info.status();
    std::vector<int64_t> s;
    for (auto it = (*info)->dims.rbegin(); it != (*info)->dims.rend(); ++it) {
      s.push_back(static_cast<int64_t>(*it));
    }
    return s;
  }
  absl::Status ReadRows(const std::string& name, int64_t r0, int64_t r1,
                        float* dst) const override {
    auto info = Info(name);
    if (!info.ok()) return info.status();
    const GgufTensorInfo& t = **info;
    auto data = f_->TensorData(t);
    absl::Status s;
    if (t.dims.size() == 1) {
      std::vector<float> all(t.dims[0]);
      s = DequantizeRows(t, data, 0, 1, all.data());
      if (s.ok()) std::copy(all.begin() + r0, all.begin() + r1, dst);
    } else {
      s = DequantizeRows(t, data, r0, r1, dst);
    }
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat(f_->path(), ": ", s.message()));
    return absl::OkStatus();
  }
  bool qk_permuted() const override { return permuted_; }
  const GgufFile& file() const { return *f_; }

 private:
  absl::StatusOr<const GgufTensorInfo*> Info(const std::string& name) const {
    std::string g = GgufName(name);
    const GgufTensorInfo* t = f_->FindTensor(g);
    if (t == nullptr) {
      return absl::NotFoundError(absl::StrCat(f_->path(), ": tensor '", g, "' not found"));
    }
    if (!CanDequantize(t->type)) {
      return absl::UnimplementedError(absl::StrCat(f_->path(), ": tensor '", g, "' has type ",
                                                   GgmlTypeName(t->type),
                                                   ", which cannot be dequantized"));
    }
    return t;
  }
  std::unique_ptr<GgufFile> f_;
  bool permuted_;
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

 private:
  std::unique_ptr<SafetensorsCheckpoint> ck_;
};

class Loader {
 public:
  Loader(const TensorSource& src, const ModelConfig& c, const ShardLayout& s)
      : src_(src), c_(c), s_(s) {}

  absl::Status CheckShape(const std::string& name, std::vector<int64_t> want) {
    auto shape = src_.Shape(name);
    if (!shape.ok()) return shape.status();
    if (*shape != want) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "': shape ",
                                                     ShapeString(*shape), ", expected ",
                                                     ShapeString(want)));
    }
    return absl::OkStatus();
  }

  // Rows [r0, r1) of a [rows, cols] matrix.
  absl::StatusOr<Matrix> Rows(const std::string& name, int64_t rows, int64_t cols, int64_t r0,
                              int64_t r1) {
    if (auto s = CheckShape(name, {rows, cols}); !s.ok()) return s;
    Matrix m;
    m.rows = r1 - r0;
    m.cols = cols;
    m.data.resize(m.rows * m.cols);
    if (auto s = src_.ReadRows(name, r0, r1, m.data.data()); !s.ok()) return s;
    return m;
  }

  // Columns [c0, c1) of a [rows, cols] matrix, converted a chunk of rows at a time.
  absl::StatusOr<Matrix> Cols(const std::string& name, int64_t rows, int64_t cols, int64_t c0,
                              int64_t c1) {
    if (auto s = CheckShape(name, {rows, cols}); !s.ok()) return s;
    Matrix m;
    m.rows = rows;
    m.cols = c1 - c0;
    m.data.resize(m.rows * m.cols);
    const int64_t chunk = 64;
    std::vector<float> tmp(chunk * cols);
    for (int64_t r = 0; r < rows; r += chunk) {
      int64_t n = std::min(chunk, rows - r);
      if (auto s = src_.ReadRows(name, r, r + n, tmp.data()); !s.ok()) return s;
      for (int64_t i = 0; i < n; ++i) {
        std::memcpy(m.row(r + i), tmp.data() + i * cols + c0, m.cols * sizeof(float));
      }
    }
    return m;
  }

  absl::StatusOr<std::vector<float>> Vector(const std::string& name, int64_t n, int64_t r0,
                                            int64_t r1) {
    if (auto s = CheckShape(name, {n}); !s.ok()) return s;
    std::vector<float> v(r1 - r0);
    if (auto s = src_.ReadRows(name, r0, r1, v.data()); !s.ok()) return s;
    return v;
  }

  // Undoes llama.cpp's Q/K permutation on consecutive heads of `rows_per_row`
  // values each row (rows of a matrix, or 1 for a bias vector).
  void Unpermute(float* data, int64_t heads, int64_t row_len) {
    if (!src_.qk_permuted()) return;
    const int64_t d = c_.head_size, half = d / 2;
    std::vector<float> head(d * row_len);
    for (int64_t h = 0; h < heads; ++h) {
      float* base = data + h * d * row_len;
      std::memcpy(head.data(), base, head.size() * sizeof(float));
      // stored row 2b + a holds HF row a * half + b
      for (int64_t a = 0; a < 2; ++a) {
        for (int64_t b = 0; b < half; ++b) {
          std::memcpy(base + (a * half + b) * row_len, head.data() + (2 * b + a) * row_len,
                      row_len * sizeof(float));
        }
      }
    }
  }

  absl::Status Layer(int i, LayerWeights* L) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    const int64_t h = c_.hidden_size, d = c_.head_size;
    const int64_t q0 = s_.first_head * d, q1 = (s_.first_head + s_.num_heads) * d;
    const int64_t k0 = s_.first_kv_head * d, k1 = (s_.first_kv_head + s_.num_kv_heads) * d;
    const int64_t i0 = s_.first_intermediate, i1 = i0 + s_.intermediate_size;
    const int64_t qn = int64_t{c_.num_heads} * d, kn = int64_t{c_.num_kv_heads} * d;
    auto assign = [](auto& dst, auto r) -> absl::Status {
      if (!r.ok()) return r.status();
      dst = std::move(*r);
      return absl::OkStatus();
    };
    absl::Status s;
    if (!(s = assign(L->input_layernorm, Vector(p + "input_layernorm.weight", h, 0, h))).ok())
      return s;
    if (!(s = assign(L->q_proj, Rows(p + "self_attn.q_proj.weight", qn, h, q0, q1))).ok())
      return s;
    Unpermute(L->q_proj.data.data(), s_.num_heads, h);
    if (!(s = assign(L->k_proj, Rows(p + "self_attn.k_proj.weight", kn, h, k0, k1))).ok())
      return s;
    Unpermute(L->k_proj.data.data(), s_.num_kv_heads, h);
    if (!(s = assign(L->v_proj, Rows(p + "self_attn.v_proj.weight", kn, h, k0, k1))).ok())
      return s;
    if (c_.qkv_bias) {
      if (!(s = assign(L->q_bias, Vector(p + "self_attn.q_proj.bias", qn, q0, q1))).ok())
        return s;
      Unpermute(L->q_bias.data(), s_.num_heads, 1);
      if (!(s = assign(L->k_bias, Vector(p + "self_attn.k_proj.bias", kn, k0, k1))).ok())
        return s;
      Unpermute(L->k_bias.data(), s_.num_kv_heads, 1);
      if (!(s = assign(L->v_bias, Vector(p + "self_attn.v_proj.bias", kn, k0, k1))).ok())
        return s;
    }
    if (!(s = assign(L->o_proj, Cols(p + "self_attn.o_proj.weight", h, qn, q0, q1))).ok())
      return s;
    if (!(s = assign(L->post_attention_layernorm,
                     Vector(p + "post_attention_layernorm.weight", h, 0, h)))
             .ok())
      return s;
    const int64_t in = c_.intermediate_size;
    if (!(s = assign(L->gate_proj, Rows(p + "mlp.gate_proj.weight", in, h, i0, i1))).ok())
      return s;
    if (!(s = assign(L->up_proj, Rows(p + "mlp.up_proj.weight", in, h, i0, i1))).ok()) return s;
    if (!(s = assign(L->down_proj, Cols(p + "mlp.down_proj.weight", h, in, i0, i1))).ok())
      return s;
    return absl::OkStatus();
  }

 private:
  const TensorSource& src_;
  const ModelConfig& c_;
  const ShardLayout& s_;
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
  return std::unique_ptr<TensorSource>(new GgufSource(std::move(*g), permuted));
}

}  // namespace

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  if (IsDirectory(path)) return LoadHfConfig(path);
  auto g = GgufFile::Open(path);
  if (!g.ok()) return g.status();
  return ModelConfigFromGguf(**g);
}

absl::StatusOr<LlamaWeights> LoadLlamaWeights(const std::string& path, int tp_rank,
                                              int tp_size) {
  LlamaWeights w;
  auto src = OpenSource(path, &w.config);
  if (!src.ok()) return src.status();
  auto shard = ComputeShardLayout(w.config, tp_rank, tp_size);
  if (!shard.ok()) return shard.status();
  w.shard = *shard;
  const ModelConfig& c = w.config;
  Loader loader(**src, c, w.shard);
  auto embed = loader.Rows("model.embed_tokens.weight", c.vocab_size, c.hidden_size, 0,
                           c.vocab_size);
  if (!embed.ok()) return embed.status();
  w.embed_tokens = std::move(*embed);
  auto norm = loader.Vector("model.norm.weight", c.hidden_size, 0, c.hidden_size);
  if (!norm.ok()) return norm.status();
  w.final_norm = std::move(*norm);
  if (!c.tie_word_embeddings) {
    auto head = loader.Rows("lm_head.weight", c.vocab_size, c.hidden_size, 0, c.vocab_size);
    if (!head.ok()) return head.status();
    w.lm_head = std::move(*head);
  }
  w.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    if (auto s = loader.Layer(i, &w.layers[i]); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat(path, ": layer ", i, ": ", s.message()));
    }
  }
  return w;
}

}  // namespace pagedserve
