// CUDA implementation of CudaLlamaModel (contract in llama_model_cuda.h). Host
// C++: device memory, cuBLAS GEMMs, the batch upload and the layer loop; the
// elementwise kernels are in model_kernels.cu and attention/cache kernels come
// from kernels/ (device kCUDA). The order of operations is that of
// LlamaModel::Forward (runtime/worker/llama_model.cc).
#include "runtime/worker/cuda/llama_model_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"
#include "kernels/reshape_and_cache.h"
#include "runtime/common/status_macros.h"
#include "runtime/worker/cuda/cublas_loader.h"
#include "runtime/worker/cuda/model_kernels.h"

namespace pagedserve {
namespace {

absl::Status CublasStatus(cublasStatus_t s, absl::string_view what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("cuBLAS error in ", what, ": status ",
                                          static_cast<int>(s)));
}

// Owning device allocation that only grows.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  // Ensures at least `bytes` bytes (contents are not preserved on growth;
  // cudaFree waits for the device, so no kernel still uses the old buffer).
  absl::Status Reserve(size_t bytes, absl::string_view what) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    PS_RETURN_IF_ERROR(CudaStatus(cudaMalloc(&ptr_, bytes), what));
    bytes_ = bytes;
    return absl::OkStatus();
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Owning pinned host allocation (cudaHostAlloc).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_) { o.ptr_ = nullptr; }
  ~PinnedBuffer() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }
  absl::Status Allocate(size_t bytes, absl::string_view what) {
    return CudaStatus(cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault), what);
  }
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

// A weight matrix [rows, cols] row-major in device memory.
struct DeviceMatrix {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

struct DeviceLayer {
  const float* input_layernorm = nullptr;
  DeviceMatrix q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
  const float* q_bias = nullptr;  // null when the model has no QKV bias
  const float* k_bias = nullptr;
  const float* v_bias = nullptr;
  const float* post_attention_layernorm = nullptr;
};

constexpr size_t kAlignFloats = 64;  // 256-byte alignment of scratch slices
size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

class CudaLlamaModelImpl final : public CudaLlamaModel {
 public:
  CudaLlamaModelImpl(const ModelConfig& config, const ShardLayout& shard, Communicator* comm,
                     int device)
      : config_(config), shard_(shard), comm_(comm), device_(device) {}

  ~CudaLlamaModelImpl() override {
    if (cublas_ != nullptr) {
      cudaSetDevice(device_);
      blas_->destroy(cublas_);
    }
  }

  absl::Status Init(const LlamaWeights& w) {
    PS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    PS_ASSIGN_OR_RETURN(blas_, LoadCublas());
    PS_RETURN_IF_ERROR(CublasStatus(blas_->create(&cublas_), "cublasCreate"));
    PS_RETURN_IF_ERROR(CublasStatus(blas_->set_stream(cublas_, nullptr), "cublasSetStream"));
    // Full fp32 SGEMM (no TF32 tensor-core rounding).
    PS_RETURN_IF_ERROR(
        CublasStatus(blas_->set_math_mode(cublas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));

    PS_ASSIGN_OR_RETURN(embed_, UploadMatrix(w.embed_tokens, "embed_tokens"));
    if (w.config.tie_word_embeddings) {
      lm_head_ = embed_;
    } else {
      PS_ASSIGN_OR_RETURN(lm_head_, UploadMatrix(w.output_embeddings(), "lm_head"));
    }
    PS_ASSIGN_OR_RETURN(final_norm_, UploadVector(w.final_norm, "final_norm"));
    layers_.resize(w.layers.size());
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const LayerWeights& src = w.layers[l];
      DeviceLayer& d = layers_[l];
      const std::string p = absl::StrCat("layers.", l, ".");
      PS_ASSIGN_OR_RETURN(d.input_layernorm, UploadVector(src.input_layernorm, p + "input_layernorm"));
      PS_ASSIGN_OR_RETURN(d.q_proj, UploadMatrix(src.q_proj, p + "q_proj"));
      PS_ASSIGN_OR_RETURN(d.k_proj, UploadMatrix(src.k_proj, p + "k_proj"));
      PS_ASSIGN_OR_RETURN(d.v_proj, UploadMatrix(src.v_proj, p + "v_proj"));
      if (!src.q_bias.empty()) {
        PS_ASSIGN_OR_RETURN(d.q_bias, UploadVector(src.q_bias, p + "q_bias"));
      }
      if (!src.k_bias.empty()) {
        PS_ASSIGN_OR_RETURN(d.k_bias, UploadVector(src.k_bias, p + "k_bias"));
      }
      if (!src.v_bias.empty()) {
        PS_ASSIGN_OR_RETURN(d.v_bias, UploadVector(src.v_bias, p + "v_bias"));
      }
      PS_ASSIGN_OR_RETURN(d.o_proj, UploadMatrix(src.o_proj, p + "o_proj"));
      PS_ASSIGN_OR_RETURN(d.post_attention_layernorm,
                          UploadVector(src.post_attention_layernorm, p + "post_attention_layernorm"));
      PS_ASSIGN_OR_RETURN(d.gate_proj, UploadMatrix(src.gate_proj, p + "gate_proj"));
      PS_ASSIGN_OR_RETURN(d.up_proj, UploadMatrix(src.up_proj, p + "up_proj"));
      PS_ASSIGN_OR_RETURN(d.down_proj, UploadMatrix(src.down_proj, p + "down_proj"));
    }
    const std::vector<double> inv_freq = RopeInverseFrequencies(config_);
    PS_RETURN_IF_ERROR(inv_freq_.Reserve(inv_freq.size() * sizeof(double), "inv_freq allocation"));
    PS_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(inv_freq_.get(), inv_freq.data(),
                                             inv_freq.size() * sizeof(double),
                                             cudaMemcpyHostToDevice),
                                  "inv_freq upload"));
    return CudaStatus(cudaDeviceSynchronize(), "weight upload");
  }

  const ModelConfig& config() const override { return config_; }
  int cuda_device() const override { return device_; }
  int64_t weight_bytes() const override { return weight_bytes_; }

  absl::StatusOr<int64_t> KvCacheBudgetBytes(double gpu_memory_utilization) const override {
    if (!(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0))
      return absl::InvalidArgumentError(absl::StrCat(
          "gpu_memory_utilization must be in (0, 1], got ", gpu_memory_utilization));
    PS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    size_t free_bytes = 0, total_bytes = 0;
    PS_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
    const int64_t usable =
        static_cast<int64_t>(static_cast<double>(free_bytes) * gpu_memory_utilization);
    return usable - ScratchBytes(kActivationReserveTokens, kActivationReserveLogitRows) -
           kRuntimeReserveBytes;
  }

  absl::Status AllocateCaches(const kernels::KVCacheShape& shape, int64_t num_device_blocks,
                              int64_t num_cpu_blocks) override {
    if (!device_views_.empty() || !cpu_views_.empty())
      return absl::FailedPreconditionError("CudaLlamaModel::AllocateCaches called twice");
    if (shape.dtype != kernels::DType::kFloat32)
      return absl::InvalidArgumentError("CudaLlamaModel: the KV cache must be fp32");
    PS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    const int num_layers = config_.num_layers;
    if (num_device_blocks > 0) {
      kernels::KVCacheShape s = shape;
      s.num_blocks = num_device_blocks;
      const size_t bytes = s.block_bytes() * static_cast<size_t>(num_device_blocks);
      for (int l = 0; l < num_layers; ++l) {
        DeviceBuffer k, v;
        PS_RETURN_IF_ERROR(k.Reserve(bytes, absl::StrCat("KV pool (", num_device_blocks,
                                                         " blocks) layer ", l, " keys")));
        PS_RETURN_IF_ERROR(v.Reserve(bytes, absl::StrCat("KV pool (", num_device_blocks,
                                                         " blocks) layer ", l, " values")));
        device_views_.push_back(kernels::KVCacheView{k.get(), v.get(), s, kernels::Device::kCUDA});
        pool_.push_back(std::move(k));
        pool_.push_back(std::move(v));
      }
    }
    if (num_cpu_blocks > 0) {
      kernels::KVCacheShape s = shape;
      s.num_blocks = num_cpu_blocks;
      const size_t bytes = s.block_bytes() * static_cast<size_t>(num_cpu_blocks);
      for (int l = 0; l < num_layers; ++l) {
        PinnedBuffer k, v;
        PS_RETURN_IF_ERROR(k.Allocate(bytes, absl::StrCat("pinned swap pool (", num_cpu_blocks,
                                                          " blocks) layer ", l, " keys")));
        PS_RETURN_IF_ERROR(v.Allocate(bytes, absl::StrCat("pinned swap pool (", num_cpu_blocks,
                                                          " blocks) layer ", l, " values")));
        cpu_views_.push_back(kernels::KVCacheView{k.get(), v.get(), s, kernels::Device::kCPU});
        swap_pool_.push_back(std::move(k));
        swap_pool_.push_back(std::move(v));
      }
    }
    return absl::OkStatus();
  }

  std::span<const kernels::KVCacheView> device_cache() const override { return device_views_; }
  std::span<const kernels::KVCacheView> cpu_cache() const override { return cpu_views_; }

  absl::Status Forward(const ForwardBatch& b, std::span<const kernels::KVCacheView> kv_layers,
                       std::vector<float>* logits) override;

 private:
  // Bytes of scratch for a step of `n` tokens and `r` logit rows (the slices
  // of Forward, each rounded up to kAlignFloats).
  int64_t ScratchBytes(int64_t n, int64_t r) const {
    const int64_t hidden = config_.hidden_size, D = config_.head_size;
    const int64_t q_dim = static_cast<int64_t>(shard_.num_heads) * D;
    const int64_t kv_dim = static_cast<int64_t>(shard_.num_kv_heads) * D;
    const int64_t inter = shard_.intermediate_size;
    const int64_t per_token = 3 * hidden + 2 * q_dim + 2 * kv_dim + 2 * inter + D;
    return static_cast<int64_t>(
        (AlignUp(n * per_token, kAlignFloats) + AlignUp(r * (hidden + config_.vocab_size), kAlignFloats) +
         16 * kAlignFloats) * sizeof(float));
  }

  absl::StatusOr<const float*> UploadVector(const std::vector<float>& v, const std::string& name) {
    DeviceBuffer buf;
    const size_t bytes = v.size() * sizeof(float);
    PS_RETURN_IF_ERROR(buf.Reserve(std::max<size_t>(bytes, 4), absl::StrCat("upload of ", name)));
    if (bytes > 0)
      PS_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy(buf.get(), v.data(), bytes, cudaMemcpyHostToDevice), absl::StrCat("upload of ", name)));
    weight_bytes_ += static_cast<int64_t>(bytes);
    const float* p = static_cast<const float*>(buf.get());
    weights_.push_back(std::move(buf));
    return p;
  }

  absl::StatusOr<DeviceMatrix> UploadMatrix(const Matrix& m, const std::string& name) {
    if (static_cast<int64_t>(m.data.size()) != m.rows * m.cols)
      return absl::InvalidArgumentError(absl::StrCat("weight ", name, " has ", m.data.size(),
                                                     " values for [", m.rows, ", ", m.cols, "]"));
    PS_ASSIGN_OR_RETURN(const float* p, UploadVector(m.data, name));
    return DeviceMatrix{p, m.rows, m.cols};
  }

  // y[n, W.rows] = x[n, W.cols] W^T, row-major. In cuBLAS' column-major
  // terms: Y^T (W.rows x n, ld W.rows) = op_T(W as cols x rows, ld cols) * X^T
  // (cols x n, ld cols).
  absl::Status Gemm(const float* x, int64_t n, const DeviceMatrix& w, float* y) {
    if (n == 0) return absl::OkStatus();
    const float alpha = 1.0f, beta = 0.0f;
    return CublasStatus(
        blas_->sgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows),
                    static_cast<int>(n), static_cast<int>(w.cols), &alpha, w.data,
                    static_cast<int>(w.cols), x, static_cast<int>(w.cols), &beta, y,
                    static_cast<int>(w.rows)),
        "cublasSgemm");
  }

  absl::Status Linear(const float* x, int64_t n, const DeviceMatrix& w, const float* bias,
                      float* y) {
    PS_RETURN_IF_ERROR(Gemm(x, n, w, y));
    if (bias == nullptr || n == 0) return absl::OkStatus();
    return CudaStatus(cuda_model::LaunchAddBias(y, bias, static_cast<int>(n),
                                                static_cast<int>(w.rows), nullptr),
                      "add_bias launch");
  }

  // The TP all-reduce of a row-parallel layer's output (device buffer).
  absl::Status AllReduce(float* data, size_t count) {
    if (comm_->size() > 1)  // NCCL works on its own stream: our kernels must be done
      PS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(nullptr), "sync before all-reduce"));
    return comm_->AllReduceSum(data, count);
  }

  absl::Status ValidateBatch(const ForwardBatch& b,
                             std::span<const kernels::KVCacheView> kv_layers) const;

  ModelConfig config_;
  ShardLayout shard_;
  Communicator* comm_;
  int device_;
  cublasHandle_t cublas_ = nullptr;
  const CublasApi* blas_ = nullptr;  // dlopen-ed cuBLAS (cublas_loader.h)
  int64_t weight_bytes_ = 0;
  std::vector<DeviceBuffer> weights_;
  DeviceMatrix embed_, lm_head_;
  const float* final_norm_ = nullptr;
  std::vector<DeviceLayer> layers_;
  DeviceBuffer inv_freq_;
  std::vector<DeviceBuffer> pool_;
  std::vector<PinnedBuffer> swap_pool_;
  std::vector<kernels::KVCacheView> device_views_, cpu_views_;
  // Per-step buffers, grown as needed.
  DeviceBuffer scratch_, inputs_, workspace_;
  std::vector<char> host_inputs_;
  std::vector<float> host_logits_;
};

absl::Status CudaLlamaModelImpl::ValidateBatch(
    const ForwardBatch& b, std::span<const kernels::KVCacheView> kv_layers) const {
  const int n = b.num_tokens();
  if (b.positions.size() != static_cast<size_t>(n) || b.slot_mapping.size() != static_cast<size_t>(n))
    return absl::InvalidArgumentError(
        "ForwardBatch: token_ids, positions and slot_mapping differ in length");
  if (b.query_start_loc.size() != static_cast<size_t>(b.num_seqs() + 1) ||
      b.query_start_loc.front() != 0 || b.query_start_loc.back() != n)
    return absl::InvalidArgumentError(
        "ForwardBatch: query_start_loc must have num_seqs + 1 entries from 0 to num_tokens");
  if (b.block_tables.size() != static_cast<size_t>(b.num_seqs()) * b.max_blocks_per_seq)
    return absl::InvalidArgumentError(
        "ForwardBatch: block_tables must be num_seqs * max_blocks_per_seq");
  if (kv_layers.size() != static_cast<size_t>(config_.num_layers))
    return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: ", kv_layers.size(),
                                                   " KV cache layers for a model of ",
                                                   config_.num_layers));
  for (size_t l = 0; l < kv_layers.size(); ++l)
    if (kv_layers[l].device != kernels::Device::kCUDA ||
        kv_layers[l].shape.dtype != kernels::DType::kFloat32)
      return absl::InvalidArgumentError(
          absl::StrCat("ForwardBatch: KV cache layer ", l, " must be an fp32 kCUDA view"));
  const int vocab = config_.vocab_size;
  for (int t = 0; t < n; ++t)
    if (b.token_ids[t] < 0 || b.token_ids[t] >= vocab)
      return absl::InvalidArgumentError(absl::StrCat("ForwardBatch: token id ", b.token_ids[t],
                                                     " at row ", t, " outside vocabulary [0, ",
                                                     vocab, ")"));
  for (int32_t r : b.logits_rows)
    if (r < 0 || r >= n)
      return absl::InvalidArgumentError(
          absl::StrCat("ForwardBatch: logits row ", r, " outside [0, ", n, ")"));
  // The CUDA reshape_and_cache skips out-of-pool slots silently; the CPU one
  // rejects them. Reject here so both backends fail the same way.
  if (!kv_layers.empty()) {
    const int64_t slots = kv_layers[0].shape.num_blocks * kv_layers[0].shape.block_size;
    for (int t = 0; t < n; ++t)
      if (b.slot_mapping[t] >= slots)
        return absl::InvalidArgumentError(absl::StrCat(
            "reshape_and_cache: slot_mapping[", t, "] = ", b.slot_mapping[t],
            " is outside the pool (num_blocks * block_size = ", slots, ")"));
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaModelImpl::Forward(const ForwardBatch& b,
                                         std::span<const kernels::KVCacheView> kv_layers,
                                         std::vector<float>* logits) {
  PS_RETURN_IF_ERROR(ValidateBatch(b, kv_layers));
  PS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
  const ModelConfig& cfg = config_;
  const int64_t n = b.num_tokens();
  const int hidden = cfg.hidden_size;
  const int D = cfg.head_size;
  const int half = D / 2;
  const int local_heads = shard_.num_heads;
  const int local_kv_heads = shard_.num_kv_heads;
  const int q_dim = local_heads * D;
  const int kv_dim = local_kv_heads * D;
  const int inter = shard_.intermediate_size;
  const int64_t r = static_cast<int64_t>(b.logits_rows.size());
  const int num_seqs = b.num_seqs();
  const int M = b.max_blocks_per_seq;

  // Decode / prefill split, exactly as LlamaModel::Forward.
  int num_decode = 0;
  int max_decode_len = 0;
  while (num_decode < num_seqs &&
         b.query_start_loc[num_decode + 1] - b.query_start_loc[num_decode] == 1 &&
         b.seq_lens[num_decode] > 1) {
    max_decode_len = std::max(max_decode_len, b.seq_lens[num_decode]);
    ++num_decode;
  }
  const int num_prefill = num_seqs - num_decode;
  const int prefill_row0 = b.query_start_loc[num_decode];
  std::vector<int32_t> prefill_qsl;
  int max_prefill_q = 0, max_prefill_len = 0;
  if (num_prefill > 0) {
    prefill_qsl.resize(num_prefill + 1);
    for (int s = 0; s <= num_prefill; ++s)
      prefill_qsl[s] = b.query_start_loc[num_decode + s] - prefill_row0;
    for (int s = 0; s < num_prefill; ++s) {
      max_prefill_q = std::max(max_prefill_q, prefill_qsl[s + 1] - prefill_qsl[s]);
      max_prefill_len = std::max(max_prefill_len, b.seq_lens[num_decode + s]);
    }
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));

  // Batch inputs: one packed host buffer, one upload. int64 slot mapping
  // first (8-byte aligned), then the int32 arrays.
  const size_t off_slots = 0;
  const size_t off_tokens = off_slots + static_cast<size_t>(n) * sizeof(int64_t);
  const size_t off_positions = off_tokens + static_cast<size_t>(n) * sizeof(int32_t);
  const size_t off_seq_lens = off_positions + static_cast<size_t>(n) * sizeof(int32_t);
  const size_t off_block_tables = off_seq_lens + static_cast<size_t>(num_seqs) * sizeof(int32_t);
  const size_t off_prefill_qsl = off_block_tables + b.block_tables.size() * sizeof(int32_t);
  const size_t off_logits_rows = off_prefill_qsl + prefill_qsl.size() * sizeof(int32_t);
  const size_t input_bytes = off_logits_rows + static_cast<size_t>(r) * sizeof(int32_t);
  host_inputs_.resize(std::max<size_t>(input_bytes, 8));
  auto put = [&](size_t off, const void* src, size_t bytes) {
    if (bytes > 0) std::memcpy(host_inputs_.data() + off, src, bytes);
  };
  put(off_slots, b.slot_mapping.data(), n * sizeof(int64_t));
  put(off_tokens, b.token_ids.data(), n * sizeof(int32_t));
  put(off_positions, b.positions.data(), n * sizeof(int32_t));
  put(off_seq_lens, b.seq_lens.data(), num_seqs * sizeof(int32_t));
  put(off_block_tables, b.block_tables.data(), b.block_tables.size() * sizeof(int32_t));
  put(off_prefill_qsl, prefill_qsl.data(), prefill_qsl.size() * sizeof(int32_t));
  put(off_logits_rows, b.logits_rows.data(), r * sizeof(int32_t));
  PS_RETURN_IF_ERROR(inputs_.Reserve(host_inputs_.size(), "batch input allocation"));
  // From pageable memory: returns once the data is staged, so host_inputs_ may
  // be reused by the next step.
  PS_RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(inputs_.get(), host_inputs_.data(), input_bytes,
                                                cudaMemcpyHostToDevice, nullptr),
                                "batch input upload"));
  char* in = static_cast<char*>(inputs_.get());
  const auto* d_slots = reinterpret_cast<const int64_t*>(in + off_slots);
  const auto* d_tokens = reinterpret_cast<const int32_t*>(in + off_tokens);
  const auto* d_positions = reinterpret_cast<const int32_t*>(in + off_positions);
  const auto* d_seq_lens = reinterpret_cast<const int32_t*>(in + off_seq_lens);
  const auto* d_block_tables = reinterpret_cast<const int32_t*>(in + off_block_tables);
  const auto* d_prefill_qsl = reinterpret_cast<const int32_t*>(in + off_prefill_qsl);
  const auto* d_logits_rows = reinterpret_cast<const int32_t*>(in + off_logits_rows);

  // Scratch slices (fp32), each 256-byte aligned.
  PS_RETURN_IF_ERROR(scratch_.Reserve(ScratchBytes(n, r), "activation scratch allocation"));
  float* next = static_cast<float*>(scratch_.get());
  auto take = [&](int64_t floats) {
    float* p = next;
    next += AlignUp(static_cast<size_t>(floats), kAlignFloats);
    return p;
  };
  float* x = take(n * hidden);
  float* h = take(n * hidden);
  float* o = take(n * hidden);
  float* q = take(n * q_dim);
  float* attn = take(n * q_dim);
  float* k = take(n * kv_dim);
  float* v = take(n * kv_dim);
  float* gate = take(n * inter);
  float* up = take(n * inter);
  float* cos_t = take(n * half);
  float* sin_t = take(n * half);
  float* normed = take(r * hidden);
  float* d_logits = take(r * static_cast<int64_t>(cfg.vocab_size));

  if (num_decode > 0 && !kernels::ShouldUsePagedAttentionV1(num_decode, local_heads, max_decode_len))
    PS_RETURN_IF_ERROR(workspace_.Reserve(
        kernels::PagedAttentionV2WorkspaceBytes(num_decode, local_heads, D, max_decode_len),
        "paged_attention_v2 workspace allocation"));

  const int ni = static_cast<int>(n);
  PS_RETURN_IF_ERROR(CudaStatus(
      cuda_model::LaunchEmbeddingGather(embed_.data, d_tokens, ni, hidden, x, nullptr),
      "embedding launch"));
  PS_RETURN_IF_ERROR(CudaStatus(
      cuda_model::LaunchRopeTables(d_positions, static_cast<const double*>(inv_freq_.get()), ni,
                                   half, cos_t, sin_t, nullptr),
      "rope tables launch"));

  for (int l = 0; l < cfg.num_layers; ++l) {
    const DeviceLayer& w = layers_[l];
    PS_RETURN_IF_ERROR(CudaStatus(cuda_model::LaunchRmsNorm(x, nullptr, w.input_layernorm, ni,
                                                            hidden, cfg.rms_norm_eps, h, nullptr),
                                  "rms_norm launch"));
    PS_RETURN_IF_ERROR(Linear(h, n, w.q_proj, w.q_bias, q));
    PS_RETURN_IF_ERROR(Linear(h, n, w.k_proj, w.k_bias, k));
    PS_RETURN_IF_ERROR(Linear(h, n, w.v_proj, w.v_bias, v));
    PS_RETURN_IF_ERROR(CudaStatus(
        cuda_model::LaunchApplyRope(q, ni, local_heads, D, q_dim, cos_t, sin_t, nullptr),
        "rope launch (q)"));
    PS_RETURN_IF_ERROR(CudaStatus(
        cuda_model::LaunchApplyRope(k, ni, local_kv_heads, D, kv_dim, cos_t, sin_t, nullptr),
        "rope launch (k)"));

    kernels::ReshapeAndCacheParams rc;
    rc.key = k;
    rc.value = v;
    rc.slot_mapping = d_slots;
    rc.num_tokens = ni;
    rc.cache = kv_layers[l];
    rc.stream = nullptr;
    PS_RETURN_IF_ERROR(kernels::ReshapeAndCache(rc));

    if (num_decode > 0) {
      kernels::PagedAttentionParams pa;
      pa.out = attn;
      pa.query = q;
      pa.num_seqs = num_decode;
      pa.num_heads = local_heads;
      pa.cache = kv_layers[l];
      pa.block_tables = d_block_tables;
      pa.max_blocks_per_seq = M;
      pa.seq_lens = d_seq_lens;
      pa.max_seq_len = max_decode_len;
      pa.scale = scale;
      pa.host_block_tables = b.block_tables.data();
      pa.host_seq_lens = b.seq_lens.data();
      pa.workspace = workspace_.get();
      pa.stream = nullptr;
      PS_RETURN_IF_ERROR(kernels::PagedAttention(pa));
    }
    if (num_prefill > 0) {
      const int64_t bt_off = static_cast<int64_t>(num_decode) * M;
      kernels::PrefillAttentionParams pf;
      pf.out = attn + static_cast<int64_t>(prefill_row0) * q_dim;
      pf.query = q + static_cast<int64_t>(prefill_row0) * q_dim;
      pf.num_seqs = num_prefill;
      pf.num_heads = local_heads;
      pf.query_start_loc = d_prefill_qsl;
      pf.seq_lens = d_seq_lens + num_decode;
      pf.cache = kv_layers[l];
      pf.block_tables = d_block_tables + bt_off;
      pf.max_blocks_per_seq = M;
      pf.max_query_len = max_prefill_q;
      pf.max_seq_len = max_prefill_len;
      pf.scale = scale;
      pf.host_query_start_loc = prefill_qsl.data();
      pf.host_seq_lens = b.seq_lens.data() + num_decode;
      pf.host_block_tables = b.block_tables.data() + bt_off;
      pf.stream = nullptr;
      PS_RETURN_IF_ERROR(kernels::PrefillAttention(pf));
    }

    // o_proj (row-parallel) + all-reduce, residual.
    PS_RETURN_IF_ERROR(Gemm(attn, n, w.o_proj, o));
    PS_RETURN_IF_ERROR(AllReduce(o, static_cast<size_t>(n) * hidden));
    PS_RETURN_IF_ERROR(
        CudaStatus(cuda_model::LaunchAdd(x, o, n * hidden, nullptr), "residual add launch"));

    // SwiGLU MLP, down_proj row-parallel + all-reduce, residual.
    PS_RETURN_IF_ERROR(CudaStatus(
        cuda_model::LaunchRmsNorm(x, nullptr, w.post_attention_layernorm, ni, hidden,
                                  cfg.rms_norm_eps, h, nullptr),
        "rms_norm launch"));
    PS_RETURN_IF_ERROR(Gemm(h, n, w.gate_proj, gate));
    PS_RETURN_IF_ERROR(Gemm(h, n, w.up_proj, up));
    PS_RETURN_IF_ERROR(CudaStatus(cuda_model::LaunchSiluMul(gate, up, n * inter, nullptr),
                                  "silu_mul launch"));
    PS_RETURN_IF_ERROR(Gemm(gate, n, w.down_proj, o));
    PS_RETURN_IF_ERROR(AllReduce(o, static_cast<size_t>(n) * hidden));
    PS_RETURN_IF_ERROR(
        CudaStatus(cuda_model::LaunchAdd(x, o, n * hidden, nullptr), "residual add launch"));
  }

  // Final norm of the requested rows (gathered by the kernel) and LM head.
  host_logits_.resize(static_cast<size_t>(r) * cfg.vocab_size);
  if (r > 0) {
    PS_RETURN_IF_ERROR(CudaStatus(
        cuda_model::LaunchRmsNorm(x, d_logits_rows, final_norm_, static_cast<int>(r), hidden,
                                  cfg.rms_norm_eps, normed, nullptr),
        "final rms_norm launch"));
    PS_RETURN_IF_ERROR(Gemm(normed, r, lm_head_, d_logits));
    // Synchronous on the legacy default stream: waits for the whole step.
    PS_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(host_logits_.data(), d_logits,
                                             host_logits_.size() * sizeof(float),
                                             cudaMemcpyDeviceToHost),
                                  "logits download"));
  } else {
    PS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(nullptr), "forward pass"));
  }
  logits->swap(host_logits_);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaLlamaModel>> CudaLlamaModel::Create(LlamaWeights weights,
                                                                       Communicator* comm,
                                                                       int cuda_device) {
  PS_RETURN_IF_ERROR(weights.config.Validate());
  if (comm == nullptr) return absl::InvalidArgumentError("CudaLlamaModel: null communicator");
  if (weights.shard.tp_size != comm->size() || weights.shard.tp_rank != comm->rank())
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaLlamaModel: weights are shard ", weights.shard.tp_rank, "/", weights.shard.tp_size,
        " but the communicator is rank ", comm->rank(), "/", comm->size()));
  if (comm->size() > 1 && std::string_view(comm->backend()) != "nccl")
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaLlamaModel: a tensor-parallel group of ", comm->size(),
        " ranks needs the NCCL communicator (device buffers), got '", comm->backend(), "'"));
  if (static_cast<int>(weights.layers.size()) != weights.config.num_layers)
    return absl::InvalidArgumentError("CudaLlamaModel: layer count does not match the config");
  if (!kernels::IsSupportedHeadSize(weights.config.head_size))
    return absl::UnimplementedError(absl::StrCat("CudaLlamaModel: head size ",
                                                 weights.config.head_size,
                                                 " is not supported by the attention kernels"));
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("CudaLlamaModel: no usable CUDA device: ", cudaGetErrorString(e)));
  }
  if (cuda_device < 0 || cuda_device >= count)
    return absl::FailedPreconditionError(absl::StrCat("CudaLlamaModel: CUDA device ", cuda_device,
                                                      " outside [0, ", count, ")"));
  auto model = std::make_unique<CudaLlamaModelImpl>(weights.config, weights.shard, comm,
                                                    cuda_device);
  PS_RETURN_IF_ERROR(model->Init(weights));
  return std::unique_ptr<CudaLlamaModel>(std::move(model));
}

}  // namespace pagedserve
