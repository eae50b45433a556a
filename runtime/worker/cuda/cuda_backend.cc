// The CUDA backend (contract in cuda_backend.h and model_backend.h). Host
// C++: device memory, weight upload, cuBLAS GEMMs, the per-step upload and
// the operations; the elementwise kernels are model_kernels.cuh (launched
// through model_kernels.h) and attention/cache kernels come from kernels/
// (device kCUDA).
#include "runtime/worker/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <deque>
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
  return absl::InternalError(
      absl::StrCat("cuBLAS error in ", what, ": status ", static_cast<int>(s)));
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

// A weight matrix [rows, cols] row-major in device memory (BackendMatrix::handle).
struct DeviceMatrix {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

constexpr size_t kAlign = 256;  // byte alignment of the packed step inputs
size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

class CudaBackend final : public ModelBackend {
 public:
  CudaBackend(Communicator* comm, int device) : comm_(comm), device_(device) {}

  ~CudaBackend() override {
    if (cublas_ != nullptr) {
      cudaSetDevice(device_);
      blas_->destroy(cublas_);
    }
  }

  absl::Status Init() {
    PS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    PS_ASSIGN_OR_RETURN(blas_, LoadCublas());
    PS_RETURN_IF_ERROR(CublasStatus(blas_->create(&cublas_), "cublasCreate"));
    PS_RETURN_IF_ERROR(CublasStatus(blas_->set_stream(cublas_, nullptr), "cublasSetStream"));
    // Full fp32 SGEMM (no TF32 tensor-core rounding).
    return CublasStatus(blas_->set_math_mode(cublas_, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  }

  kernels::Device device() const override { return kernels::Device::kCUDA; }
  const char* name() const override { return "cuda"; }

  absl::StatusOr<BackendWeights> LoadWeights(LlamaWeights w) override {
    config_ = w.config;
    shard_ = w.shard;
    PS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    BackendWeights h;
    PS_ASSIGN_OR_RETURN(h.embed_tokens, UploadMatrix(w.embed_tokens, "embed_tokens"));
    if (w.config.tie_word_embeddings) {
      h.lm_head = h.embed_tokens;
    } else {
      PS_ASSIGN_OR_RETURN(h.lm_head, UploadMatrix(w.output_embeddings(), "lm_head"));
    }
    PS_ASSIGN_OR_RETURN(h.final_norm, UploadVector(w.final_norm, "final_norm"));
    h.layers.resize(w.layers.size());
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const LayerWeights& src = w.layers[l];
      BackendLayer& d = h.layers[l];
      const std::string p = absl::StrCat("layers.", l, ".");
      PS_ASSIGN_OR_RETURN(d.input_layernorm,
                          UploadVector(src.input_layernorm, p + "input_layernorm"));
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
      PS_ASSIGN_OR_RETURN(d.post_attention_layernorm, UploadVector(src.post_attention_layernorm,
                                                                   p + "post_attention_layernorm"));
      PS_ASSIGN_OR_RETURN(d.gate_proj, UploadMatrix(src.gate_proj, p + "gate_proj"));
      PS_ASSIGN_OR_RETURN(d.up_proj, UploadMatrix(src.up_proj, p + "up_proj"));
      PS_ASSIGN_OR_RETURN(d.down_proj, UploadMatrix(src.down_proj, p + "down_proj"));
    }
    PS_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "weight upload"));
    return h;  // the host copy `w` is dropped here
  }

  int64_t weight_bytes() const override { return weight_bytes_; }

  absl::StatusOr<int64_t> KvCacheBudgetBytes(int64_t,
                                             double gpu_memory_utilization) const override {
    if (!(gpu_memory_utilization > 0.0 && gpu_memory_utilization <= 1.0))
      return absl::InvalidArgumentError(
          absl::StrCat("gpu_memory_utilization must be in (0, 1], got ", gpu_memory_utilization));
    PS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    size_t free_bytes = 0, total_bytes = 0;
    PS_RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
    const int64_t usable =
        static_cast<int64_t>(static_cast<double>(free_bytes) * gpu_memory_utilization);
    return usable -
           ActivationBytes(CudaBackendLimits::kActivationReserveTokens,
                           CudaBackendLimits::kActivationReserveLogitRows) -
           CudaBackendLimits::kRuntimeReserveBytes;
  }

  absl::Status AllocateCaches(const kernels::KVCacheShape& shape, int64_t num_device_blocks,
                              int64_t num_cpu_blocks) override {
    if (!device_views_.empty() || !cpu_views_.empty())
      return absl::FailedPreconditionError("CudaBackend::AllocateCaches called twice");
    if (shape.dtype != kernels::DType::kFloat32)
      return absl::InvalidArgumentError("CudaBackend: the KV cache must be fp32");
    PS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    const int num_layers = config_.num_layers;
    if (num_device_blocks > 0) {
      kernels::KVCacheShape s = shape;
      s.num_blocks = num_device_blocks;
      const size_t bytes = s.block_bytes() * static_cast<size_t>(num_device_blocks);
      for (int l = 0; l < num_layers; ++l) {
        DeviceBuffer k, v;
        PS_RETURN_IF_ERROR(k.Reserve(
            bytes, absl::StrCat("KV pool (", num_device_blocks, " blocks) layer ", l, " keys")));
        PS_RETURN_IF_ERROR(v.Reserve(
            bytes, absl::StrCat("KV pool (", num_device_blocks, " blocks) layer ", l, " values")));
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

  absl::Status CheckKvCache(const kernels::KVCacheView& view) const override {
    if (view.device != kernels::Device::kCUDA || view.shape.dtype != kernels::DType::kFloat32)
      return absl::InvalidArgumentError("must be an fp32 kCUDA view");
    return absl::OkStatus();
  }

  // The plan's index arrays and rotary tables in one packed host buffer, one
  // upload: int64 slot mapping first (8-byte aligned), then the int32 arrays
  // and the fp32 tables, each section 256-byte aligned.
  absl::Status BeginStep(const ForwardPlan& plan) override {
    PS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    plan_ = &plan;
    const ForwardBatch& b = *plan.batch;
    const size_t n = static_cast<size_t>(plan.num_tokens);
    struct Section {
      const void* src;
      size_t bytes;
    };
    const std::array<Section, kInputCount> sections = {{
        {b.slot_mapping.data(), n * sizeof(int64_t)},
        {b.token_ids.data(), n * sizeof(int32_t)},
        {b.seq_lens.data(), b.seq_lens.size() * sizeof(int32_t)},
        {b.block_tables.data(), b.block_tables.size() * sizeof(int32_t)},
        {plan.prefill_query_start_loc.data(),
         plan.prefill_query_start_loc.size() * sizeof(int32_t)},
        {b.logits_rows.data(), b.logits_rows.size() * sizeof(int32_t)},
        {plan.rope_cos.data(), plan.rope_cos.size() * sizeof(float)},
        {plan.rope_sin.data(), plan.rope_sin.size() * sizeof(float)},
    }};
    size_t total = 0;
    std::array<size_t, kInputCount> offsets{};
    for (int i = 0; i < kInputCount; ++i) {
      offsets[i] = total;
      total = AlignUp(total + sections[i].bytes, kAlign);
    }
    host_inputs_.resize(std::max<size_t>(total, kAlign));
    for (int i = 0; i < kInputCount; ++i)
      if (sections[i].bytes > 0)
        std::memcpy(host_inputs_.data() + offsets[i], sections[i].src, sections[i].bytes);
    PS_RETURN_IF_ERROR(inputs_.Reserve(host_inputs_.size(), "step input allocation"));
    // From pageable memory: returns once the data is staged, so host_inputs_
    // may be reused by the next step.
    PS_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(inputs_.get(), host_inputs_.data(), total, cudaMemcpyHostToDevice, nullptr),
        "step input upload"));
    for (int i = 0; i < kInputCount; ++i) d_in_[i] = static_cast<char*>(inputs_.get()) + offsets[i];

    const int heads = shard_.num_heads;
    if (plan.num_decode > 0 &&
        !kernels::ShouldUsePagedAttentionV1(plan.num_decode, heads, plan.max_decode_len))
      PS_RETURN_IF_ERROR(
          workspace_.Reserve(kernels::PagedAttentionV2WorkspaceBytes(
                                 plan.num_decode, heads, config_.head_size, plan.max_decode_len),
                             "paged_attention_v2 workspace allocation"));
    return absl::OkStatus();
  }

  absl::StatusOr<float*> Buffer(BufferId id, int64_t elems) override {
    DeviceBuffer& b = buffers_[static_cast<size_t>(id)];
    PS_RETURN_IF_ERROR(b.Reserve(std::max<size_t>(static_cast<size_t>(elems) * sizeof(float), 4),
                                 "activation buffer allocation"));
    return static_cast<float*>(b.get());
  }

  absl::Status EmbeddingGather(const BackendMatrix& table, float* out) override {
    return CudaStatus(cuda_model::LaunchEmbeddingGather(M(table).data, In<int32_t>(kTokens),
                                                        static_cast<int>(plan_->num_tokens),
                                                        static_cast<int>(table.cols), out, nullptr),
                      "embedding launch");
  }

  absl::Status Linear(const float* x, int64_t n, const BackendMatrix& w, const BackendVector& bias,
                      float* y) override {
    PS_RETURN_IF_ERROR(Gemm(x, n, M(w), y));
    if (bias.data == nullptr || n == 0) return absl::OkStatus();
    return CudaStatus(cuda_model::LaunchAddBias(y, bias.data, static_cast<int>(n),
                                                static_cast<int>(w.rows), nullptr),
                      "add_bias launch");
  }

  absl::Status AddRmsNorm(float* residual, const float* add, int64_t n, int dim,
                          const BackendVector& weight, double eps, bool logits_rows,
                          float* out) override {
    return CudaStatus(cuda_model::LaunchAddRmsNorm(
                          residual, add, logits_rows ? In<int32_t>(kLogitsRows) : nullptr,
                          weight.data, static_cast<int>(n), dim, eps, out, nullptr),
                      "add_rms_norm launch");
  }

  absl::Status ApplyRope(float* x, int64_t n, int heads, int head_size,
                         int64_t token_stride) override {
    return CudaStatus(
        cuda_model::LaunchApplyRope(x, static_cast<int>(n), heads, head_size, token_stride,
                                    In<float>(kRopeCos), In<float>(kRopeSin), nullptr),
        "rope launch");
  }

  absl::Status SiluMul(float* gate, const float* up, int64_t count) override {
    return CudaStatus(cuda_model::LaunchSiluMul(gate, up, count, nullptr), "silu_mul launch");
  }

  // fp32 cache only (CheckKvCache): the operands go to the kernels as they are.
  absl::Status Attention(const kernels::KVCacheView& cache, int num_heads, float* q, float* k,
                         float* v, float* out) override {
    const ForwardPlan& plan = *plan_;
    const ForwardBatch& b = *plan.batch;
    const int64_t q_dim = static_cast<int64_t>(num_heads) * cache.shape.head_size;
    const int M = b.max_blocks_per_seq;
    kernels::ReshapeAndCacheParams rc;
    rc.key = k;
    rc.value = v;
    rc.slot_mapping = In<int64_t>(kSlots);
    rc.num_tokens = static_cast<int>(plan.num_tokens);
    rc.cache = cache;
    rc.stream = nullptr;
    PS_RETURN_IF_ERROR(kernels::ReshapeAndCache(rc));

    if (plan.num_decode > 0) {
      kernels::PagedAttentionParams pa;
      pa.out = out;
      pa.query = q;
      pa.num_seqs = plan.num_decode;
      pa.num_heads = num_heads;
      pa.cache = cache;
      pa.block_tables = In<int32_t>(kBlockTables);
      pa.max_blocks_per_seq = M;
      pa.seq_lens = In<int32_t>(kSeqLens);
      pa.max_seq_len = plan.max_decode_len;
      pa.scale = plan.attention_scale;
      pa.host_block_tables = b.block_tables.data();
      pa.host_seq_lens = b.seq_lens.data();
      pa.workspace = workspace_.get();
      pa.stream = nullptr;
      PS_RETURN_IF_ERROR(kernels::PagedAttention(pa));
    }
    if (plan.num_prefill > 0) {
      const int64_t bt_off = static_cast<int64_t>(plan.num_decode) * M;
      const int64_t row_off = static_cast<int64_t>(plan.prefill_row0) * q_dim;
      kernels::PrefillAttentionParams pf;
      pf.out = out + row_off;
      pf.query = q + row_off;
      pf.num_seqs = plan.num_prefill;
      pf.num_heads = num_heads;
      pf.query_start_loc = In<int32_t>(kPrefillQsl);
      pf.seq_lens = In<int32_t>(kSeqLens) + plan.num_decode;
      pf.cache = cache;
      pf.block_tables = In<int32_t>(kBlockTables) + bt_off;
      pf.max_blocks_per_seq = M;
      pf.max_query_len = plan.max_prefill_query_len;
      pf.max_seq_len = plan.max_prefill_len;
      pf.scale = plan.attention_scale;
      pf.host_query_start_loc = plan.prefill_query_start_loc.data();
      pf.host_seq_lens = b.seq_lens.data() + plan.num_decode;
      pf.host_block_tables = b.block_tables.data() + bt_off;
      pf.stream = nullptr;
      PS_RETURN_IF_ERROR(kernels::PrefillAttention(pf));
    }
    return absl::OkStatus();
  }

  absl::Status AllReduceSum(float* data, int64_t count) override {
    if (comm_->size() > 1)  // NCCL works on its own stream: our kernels must be done
      PS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(nullptr), "sync before all-reduce"));
    return comm_->AllReduceSum(data, static_cast<size_t>(count));
  }

  absl::Status LmHead(const float* x, int64_t n, const BackendMatrix& w,
                      std::vector<float>* logits) override {
    host_logits_.resize(static_cast<size_t>(n) * w.rows);
    if (n > 0) {
      PS_RETURN_IF_ERROR(logits_.Reserve(host_logits_.size() * sizeof(float), "logits allocation"));
      float* d_logits = static_cast<float*>(logits_.get());
      PS_RETURN_IF_ERROR(Gemm(x, n, M(w), d_logits));
      // Synchronous on the legacy default stream: waits for the whole step.
      PS_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpy(host_logits_.data(), d_logits, host_logits_.size() * sizeof(float),
                                cudaMemcpyDeviceToHost),
                     "logits download"));
    } else {
      PS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(nullptr), "forward pass"));
    }
    logits->swap(host_logits_);
    return absl::OkStatus();
  }

 private:
  // Sections of the packed step inputs (BeginStep).
  enum Input {
    kSlots,
    kTokens,
    kSeqLens,
    kBlockTables,
    kPrefillQsl,
    kLogitsRows,
    kRopeCos,
    kRopeSin,
    kInputCount
  };
  template <typename T>
  const T* In(Input i) const {
    return static_cast<const T*>(d_in_[i]);
  }

  static const DeviceMatrix& M(const BackendMatrix& h) {
    return *static_cast<const DeviceMatrix*>(h.handle);
  }

  // Bytes of activations for a step of `n` tokens and `r` logit rows (the
  // buffers the forward pass asks for, the logits, the step inputs).
  int64_t ActivationBytes(int64_t n, int64_t r) const {
    const int64_t hidden = config_.hidden_size, D = config_.head_size;
    const int64_t q_dim = static_cast<int64_t>(shard_.num_heads) * D;
    const int64_t kv_dim = static_cast<int64_t>(shard_.num_kv_heads) * D;
    const int64_t inter = shard_.intermediate_size;
    const int64_t per_token = 3 * hidden + 2 * q_dim + 2 * kv_dim + 2 * inter + D;
    return static_cast<int64_t>((n * per_token + r * (hidden + config_.vocab_size)) *
                                    sizeof(float) +
                                (kInputCount + static_cast<int>(BufferId::kCount) + 1) * kAlign);
  }

  absl::StatusOr<BackendVector> UploadVector(const std::vector<float>& v, const std::string& name) {
    DeviceBuffer buf;
    const size_t bytes = v.size() * sizeof(float);
    PS_RETURN_IF_ERROR(buf.Reserve(std::max<size_t>(bytes, 4), absl::StrCat("upload of ", name)));
    if (bytes > 0)
      PS_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(buf.get(), v.data(), bytes, cudaMemcpyHostToDevice),
                                    absl::StrCat("upload of ", name)));
    weight_bytes_ += static_cast<int64_t>(bytes);
    const float* p = static_cast<const float*>(buf.get());
    weights_.push_back(std::move(buf));
    return BackendVector{p, static_cast<int64_t>(v.size())};
  }

  absl::StatusOr<BackendMatrix> UploadMatrix(const Matrix& m, const std::string& name) {
    if (static_cast<int64_t>(m.data.size()) != m.rows * m.cols)
      return absl::InvalidArgumentError(absl::StrCat("weight ", name, " has ", m.data.size(),
                                                     " fp32 values for [", m.rows, ", ", m.cols,
                                                     "] (the CUDA backend runs fp32 weights)"));
    PS_ASSIGN_OR_RETURN(const BackendVector v, UploadVector(m.data, name));
    matrices_.push_back(DeviceMatrix{v.data, m.rows, m.cols});
    return BackendMatrix{&matrices_.back(), m.rows, m.cols};
  }

  // y[n, W.rows] = x[n, W.cols] W^T, row-major. In cuBLAS' column-major
  // terms: Y^T (W.rows x n, ld W.rows) = op_T(W as cols x rows, ld cols) * X^T
  // (cols x n, ld cols).
  absl::Status Gemm(const float* x, int64_t n, const DeviceMatrix& w, float* y) {
    if (n == 0) return absl::OkStatus();
    const float alpha = 1.0f, beta = 0.0f;
    return CublasStatus(blas_->sgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows),
                                     static_cast<int>(n), static_cast<int>(w.cols), &alpha, w.data,
                                     static_cast<int>(w.cols), x, static_cast<int>(w.cols), &beta,
                                     y, static_cast<int>(w.rows)),
                        "cublasSgemm");
  }

  Communicator* comm_;
  int device_;
  ModelConfig config_;
  ShardLayout shard_;
  cublasHandle_t cublas_ = nullptr;
  const CublasApi* blas_ = nullptr;  // dlopen-ed cuBLAS (cublas_loader.h)
  int64_t weight_bytes_ = 0;
  std::vector<DeviceBuffer> weights_;
  std::deque<DeviceMatrix> matrices_;  // stable addresses (BackendMatrix::handle)
  std::vector<DeviceBuffer> pool_;
  std::vector<PinnedBuffer> swap_pool_;
  std::vector<kernels::KVCacheView> device_views_, cpu_views_;
  // Per-step state: the plan, its device copy, buffers grown as needed.
  const ForwardPlan* plan_ = nullptr;
  std::array<const void*, kInputCount> d_in_{};
  std::array<DeviceBuffer, static_cast<size_t>(BufferId::kCount)> buffers_;
  DeviceBuffer inputs_, workspace_, logits_;
  std::vector<char> host_inputs_;
  std::vector<float> host_logits_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<ModelBackend>> MakeCudaBackend(Communicator* comm, int cuda_device) {
  if (comm == nullptr) return absl::InvalidArgumentError("CudaBackend: null communicator");
  if (comm->size() > 1 && std::string_view(comm->backend()) != "nccl")
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaBackend: a tensor-parallel group of ", comm->size(),
        " ranks needs the NCCL communicator (device buffers), got '", comm->backend(), "'"));
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("CudaBackend: no usable CUDA device: ", cudaGetErrorString(e)));
  }
  if (cuda_device < 0 || cuda_device >= count)
    return absl::FailedPreconditionError(
        absl::StrCat("CudaBackend: CUDA device ", cuda_device, " outside [0, ", count, ")"));
  auto backend = std::make_unique<CudaBackend>(comm, cuda_device);
  PS_RETURN_IF_ERROR(backend->Init());
  return std::unique_ptr<ModelBackend>(std::move(backend));
}

absl::StatusOr<std::unique_ptr<LlamaModel>> CudaLlamaModel::Create(LlamaWeights weights,
                                                                   Communicator* comm,
                                                                   int cuda_device) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ModelBackend> backend, MakeCudaBackend(comm, cuda_device));
  return LlamaModel::Create(std::move(weights), comm, std::move(backend));
}

}  // namespace pagedserve
