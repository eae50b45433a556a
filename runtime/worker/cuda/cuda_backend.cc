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
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"
#include "kernels/reshape_and_cache.h"
#include "runtime/common/status_macros.h"
#include "runtime/worker/block_table_update.h"
#include "runtime/worker/cuda/cublas_loader.h"
#include "runtime/worker/cuda/model_kernels.h"
#include "runtime/worker/cuda/sample_penalties.h"
#include "runtime/worker/moe_routing.h"
#include "spdlog/spdlog.h"

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
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(o.ptr_), bytes_(o.bytes_), before_free_(std::move(o.before_free_)) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  // Called before Reserve frees the allocation to grow it (the CUDA graphs
  // captured over it are dropped first).
  void set_before_free(std::function<void()> f) { before_free_ = std::move(f); }
  // Ensures at least `bytes` bytes (contents are not preserved on growth;
  // cudaFree waits for the device, so no kernel still uses the old buffer).
  absl::Status Reserve(size_t bytes, absl::string_view what) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (ptr_ != nullptr && before_free_) before_free_();
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
  std::function<void()> before_free_;
};

// Owning pinned host allocation (cudaHostAlloc).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) {
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  ~PinnedBuffer() {
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
  }
  absl::Status Allocate(size_t bytes, absl::string_view what) {
    return CudaStatus(cudaHostAlloc(&ptr_, bytes, cudaHostAllocDefault), what);
  }
  // Ensures at least `bytes` bytes (contents are not preserved on growth;
  // the caller makes sure no copy still reads the old buffer).
  absl::Status Reserve(size_t bytes, absl::string_view what) {
    if (bytes <= bytes_) return absl::OkStatus();
    if (ptr_ != nullptr) cudaFreeHost(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
    PS_RETURN_IF_ERROR(Allocate(bytes, what));
    bytes_ = bytes;
    return absl::OkStatus();
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

using cuda_model::Elem;

// A weight matrix [rows, cols] row-major in device memory, fp32, fp16 or bf16
// (BackendMatrix::handle).
struct DeviceMatrix {
  const void* data = nullptr;
  Elem type = Elem::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  // Set when the matrix is rows [fused_row0, fused_row0 + rows) of a stacked
  // upload (q/k/v, gate/up) that runs as one GEMM (StackedGemm).
  const DeviceMatrix* fused = nullptr;
  int64_t fused_row0 = 0;
};

// GEMMs over stacked q/k/v or gate/up rows (read in place by the kernels
// after them) run for at most this many tokens: they save launches and
// small-GEMM inefficiency in decode-sized steps, and would need an
// [n, stacked rows] fp32 scratch in large prefill steps.
constexpr int64_t kFusedGemmMaxTokens = 256;

// MoeMlp runs the experts over chunks of at most this many tokens: its
// scratch (the gathered rows and every pair's output, top_k rows per token)
// stays bounded for long prefills, and an expert's weights are read once per
// chunk.
constexpr int64_t kMoeChunkTokens = 512;

cudaDataType CudaType(Elem e) {
  switch (e) {
    case Elem::kF16: return CUDA_R_16F;
    case Elem::kBF16: return CUDA_R_16BF;
    case Elem::kF32: break;
  }
  return CUDA_R_32F;
}

// The element type activations are converted to for attention over a cache
// of element type `t`: the cache's own type for 16-bit caches; fp8 caches
// take fp32 operands (converted in the kernels), as fp32 caches do.
Elem AttentionIoElem(kernels::DType t) {
  switch (t) {
    case kernels::DType::kFloat16: return Elem::kF16;
    case kernels::DType::kBFloat16: return Elem::kBF16;
    default: return Elem::kF32;
  }
}

cuda_model::CacheType CacheTypeOf(kernels::DType t) {
  switch (t) {
    case kernels::DType::kFloat16: return cuda_model::CacheType::kF16;
    case kernels::DType::kBFloat16: return cuda_model::CacheType::kBF16;
    case kernels::DType::kFloat8E4M3: return cuda_model::CacheType::kFp8E4M3;
    case kernels::DType::kFloat8E5M2: return cuda_model::CacheType::kFp8E5M2;
    default: return cuda_model::CacheType::kF32;
  }
}

bool CudaKvDType(kernels::DType t) {
  switch (t) {
    case kernels::DType::kFloat32:
    case kernels::DType::kFloat16:
    case kernels::DType::kBFloat16:
    case kernels::DType::kFloat8E4M3:
    case kernels::DType::kFloat8E5M2: return true;
  }
  return false;
}

constexpr size_t kAlign = 256;  // byte alignment of the packed step inputs
// cuBLAS' workspace (its documentation recommends 32 MiB on Hopper).
constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;
// Graphs kept at most (batch x context buckets seen); further keys run eagerly.
constexpr size_t kMaxGraphs = 96;
// Copies per step for the changed rows of the block table; more runs of
// changed rows go up as one copy from the first to the last.
constexpr int kMaxBlockTableCopies = 4;
size_t AlignUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

class CudaBackend final : public ModelBackend {
 public:
  CudaBackend(Communicator* comm, int device) : comm_(comm), device_(device) {
    // A buffer a graph was captured over is freed only after the graph
    // (NCCL may have registered it for the captured collectives).
    for (DeviceBuffer* b : StepBuffers()) b->set_before_free([this] { DropGraphs(); });
  }

  ~CudaBackend() override {
    cudaSetDevice(device_);
    // Not after an abandoned step of a multi-rank group: its collectives may
    // wait for a peer that is gone (cudaStreamDestroy does not wait).
    if (capturing_) AbandonCapture();
    if (stream_ != nullptr && !(step_pending_ && comm_->size() > 1)) cudaStreamSynchronize(stream_);
    DropGraphs();
    if (cublas_ != nullptr) blas_->destroy(cublas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    PS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    // A blocking stream: ordered with the legacy default stream, on which
    // the worker's swap and copy-on-write block operations run.
    PS_RETURN_IF_ERROR(CudaStatus(cudaStreamCreate(&stream_), "cudaStreamCreate"));
    PS_ASSIGN_OR_RETURN(blas_, LoadCublas());
    PS_RETURN_IF_ERROR(CublasStatus(blas_->create(&cublas_), "cublasCreate"));
    PS_RETURN_IF_ERROR(CublasStatus(blas_->set_stream(cublas_, stream_), "cublasSetStream"));
    // After cublasSetStream, which resets the workspace to cuBLAS' own.
    PS_RETURN_IF_ERROR(cublas_workspace_.Reserve(kCublasWorkspaceBytes, "cuBLAS workspace"));
    PS_RETURN_IF_ERROR(CublasStatus(
        blas_->set_workspace(cublas_, cublas_workspace_.get(), cublas_workspace_.bytes()),
        "cublasSetWorkspace"));
    // Full fp32 SGEMM for fp32 weights (no TF32 rounding); GemmEx with
    // 16-bit inputs uses tensor cores regardless.
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
      {
        BackendMatrix* qkv[3] = {&d.q_proj, &d.k_proj, &d.v_proj};
        PS_RETURN_IF_ERROR(UploadStacked({&src.q_proj, &src.k_proj, &src.v_proj},
                                         {p + "q_proj", p + "k_proj", p + "v_proj"}, qkv));
      }
      if (!src.q_bias.empty()) {
        PS_ASSIGN_OR_RETURN(d.q_bias, UploadVector(src.q_bias, p + "q_bias"));
      }
      if (!src.k_bias.empty()) {
        PS_ASSIGN_OR_RETURN(d.k_bias, UploadVector(src.k_bias, p + "k_bias"));
      }
      if (!src.v_bias.empty()) {
        PS_ASSIGN_OR_RETURN(d.v_bias, UploadVector(src.v_bias, p + "v_bias"));
      }
      if (!src.q_norm.empty()) {
        PS_ASSIGN_OR_RETURN(d.q_norm, UploadVector(src.q_norm, p + "q_norm"));
        PS_ASSIGN_OR_RETURN(d.k_norm, UploadVector(src.k_norm, p + "k_norm"));
      }
      PS_ASSIGN_OR_RETURN(d.o_proj, UploadMatrix(src.o_proj, p + "o_proj"));
      PS_ASSIGN_OR_RETURN(d.post_attention_layernorm, UploadVector(src.post_attention_layernorm,
                                                                   p + "post_attention_layernorm"));
      if (w.config.post_norms) {  // Gemma's sandwich norms ((1 + w) folded at load)
        PS_ASSIGN_OR_RETURN(d.attn_post_norm,
                            UploadVector(src.attn_post_norm, p + "attn_post_norm"));
        PS_ASSIGN_OR_RETURN(d.mlp_post_norm, UploadVector(src.mlp_post_norm, p + "mlp_post_norm"));
      }
      if (!src.expert_gate.empty()) {
        PS_RETURN_IF_ERROR(UploadExperts(src, p, &d.experts));
        continue;
      }
      {
        BackendMatrix* gate_up[2] = {&d.gate_proj, &d.up_proj};
        PS_RETURN_IF_ERROR(UploadStacked({&src.gate_proj, &src.up_proj},
                                         {p + "gate_proj", p + "up_proj"}, gate_up));
      }
      PS_ASSIGN_OR_RETURN(d.down_proj, UploadMatrix(src.down_proj, p + "down_proj"));
    }
    PS_RETURN_IF_ERROR(CudaStatus(cudaDeviceSynchronize(), "weight upload"));
    gemm_elem_ = matrices_.front().type;
    for (const DeviceMatrix& m : matrices_)
      if (m.type != gemm_elem_) gemm_elem_ = Elem::kF32;
    sum_elem_ = comm_->size() > 1 ? gemm_elem_ : Elem::kF32;
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
    return GpuKvBudgetBytes(static_cast<int64_t>(total_bytes), static_cast<int64_t>(free_bytes),
                            gpu_memory_utilization,
                            ActivationBytes(CudaBackendLimits::kActivationReserveTokens,
                                            CudaBackendLimits::kActivationReserveLogitRows),
                            CudaBackendLimits::kRuntimeReserveBytes);
  }

  absl::Status AllocateCaches(const kernels::KVCacheShape& shape, int64_t num_device_blocks,
                              int64_t num_cpu_blocks) override {
    if (!device_views_.empty() || !cpu_views_.empty())
      return absl::FailedPreconditionError("CudaBackend::AllocateCaches called twice");
    if (!CudaKvDType(shape.dtype))
      return absl::InvalidArgumentError(absl::StrCat(
          "CudaBackend: KV cache dtype ", kernels::DTypeName(shape.dtype), " is not supported"));
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
    if (view.device != kernels::Device::kCUDA || !CudaKvDType(view.shape.dtype))
      return absl::InvalidArgumentError(
          "must be a kCUDA view of float32, float16, bfloat16, fp8_e4m3 or fp8_e5m2");
    return absl::OkStatus();
  }

  // The plan's index arrays and rotary tables in one packed pinned host
  // buffer, one asynchronous upload: int64 slot mapping first (8-byte
  // aligned), then the int32 arrays and the fp32 tables, each section
  // 256-byte aligned. The previous step's LmHead waited for the stream, so
  // no copy still reads the staging buffer.
  absl::Status BeginStep(const ForwardPlan& plan) override {
    PS_RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device_), "cudaSetDevice"));
    // A body that failed while it was being captured left the stream
    // capturing: end that first (nothing of it ran).
    if (capturing_) AbandonCapture();
    if (step_pending_) {
      // The previous step ended in an error before its LmHead: its work may
      // still read the staging buffer (and, with NCCL, wait for peers).
      PS_RETURN_IF_ERROR(WaitForStep());
    }
    PS_RETURN_IF_ERROR(ReserveStepScratch(plan));
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
        {nullptr, 0},  // block tables: UploadBlockTables
        {plan.prefill_query_start_loc.data(),
         plan.prefill_query_start_loc.size() * sizeof(int32_t)},
        {b.logits_rows.data(), b.logits_rows.size() * sizeof(int32_t)},
        {plan.rope_cos.data(), plan.rope_cos.size() * sizeof(float)},
        {plan.rope_sin.data(), plan.rope_sin.size() * sizeof(float)},
        {plan.rope_cos_local.data(), plan.rope_cos_local.size() * sizeof(float)},
        {plan.rope_sin_local.data(), plan.rope_sin_local.size() * sizeof(float)},
    }};
    size_t total = 0;
    std::array<size_t, kInputCount> offsets{};
    for (int i = 0; i < kInputCount; ++i) {
      offsets[i] = total;
      total = AlignUp(total + sections[i].bytes, kAlign);
    }
    total = std::max<size_t>(total, kAlign);
    PS_RETURN_IF_ERROR(host_inputs_.Reserve(total, "pinned step input allocation"));
    char* staging = static_cast<char*>(host_inputs_.get());
    for (int i = 0; i < kInputCount; ++i)
      if (sections[i].bytes > 0)
        std::memcpy(staging + offsets[i], sections[i].src, sections[i].bytes);
    PS_RETURN_IF_ERROR(inputs_.Reserve(total, "step input allocation"));
    PS_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(inputs_.get(), staging, total, cudaMemcpyHostToDevice, stream_),
                   "step input upload"));
    step_pending_ = true;
    step_validated_ = false;
    for (int i = 0; i < kInputCount; ++i) d_in_[i] = static_cast<char*>(inputs_.get()) + offsets[i];
    PS_RETURN_IF_ERROR(UploadBlockTables(b));
    d_in_[kBlockTables] = block_tables_.get();

    return absl::OkStatus();
  }

  absl::StatusOr<float*> Buffer(BufferId id, int64_t elems) override {
    if (!IsFp32Buffer(id)) return absl::InvalidArgumentError("Buffer: not an fp32 buffer id");
    PS_ASSIGN_OR_RETURN(void* p, GrowBuffer(id, elems * static_cast<int64_t>(sizeof(float))));
    return static_cast<float*>(p);
  }

  // The weights' 16-bit type when every matrix has it (GEMMs then read the
  // activations as the producing kernels wrote them), else fp32 (inputs are
  // converted for each 16-bit matrix).
  ActivationType gemm_input_type() const override { return TypeOf(gemm_elem_); }

  absl::StatusOr<GemmInput> GemmInputBuffer(BufferId id, int64_t elems) override {
    if (!IsGemmInput(id)) return absl::InvalidArgumentError("GemmInputBuffer: an fp32 buffer id");
    PS_ASSIGN_OR_RETURN(void* p, GrowBuffer(id, elems * cuda_model::ElemBytes(gemm_elem_)));
    return GemmInput{p};
  }

  // The GEMM-input type under tensor parallelism (the all-reduce payload),
  // fp32 on one rank (no rounding of the residual's updates).
  ActivationType partial_sum_type() const override { return TypeOf(sum_elem_); }

  absl::StatusOr<PartialSums> PartialSumBuffer(int64_t elems) override {
    PS_ASSIGN_OR_RETURN(
        void* p, GrowBuffer(BufferId::kProjection, elems * cuda_model::ElemBytes(sum_elem_)));
    return PartialSums{p};
  }

  absl::Status RowParallelLinear(GemmInput x, int64_t n, const BackendMatrix& w,
                                 PartialSums y) override {
    if (n == 0) return absl::OkStatus();
    const DeviceMatrix& m = M(w);
    PS_ASSIGN_OR_RETURN(const void* xin, ConvertActivations(x.data, gemm_elem_, n * m.cols, m.type,
                                                            &gemm_input_, "GEMM input conversion"));
    return Gemm(xin, n, m, y.data, sum_elem_);
  }

  absl::Status EmbeddingGather(const BackendMatrix& table, float* out) override {
    return CudaStatus(
        cuda_model::LaunchEmbeddingGather(M(table).data, M(table).type, In<int32_t>(kTokens),
                                          static_cast<int>(plan_->num_tokens),
                                          static_cast<int>(table.cols), out, stream_),
        "embedding launch");
  }

  absl::Status Linear(GemmInput x, int64_t n, const BackendMatrix& w, const BackendVector& bias,
                      float* y) override {
    const LinearOut out{w, bias, y};
    return LinearGroup(x, n, std::span<const LinearOut>(&out, 1));
  }

  // One conversion of x per weight element type in the group that differs
  // from the GEMM-input type (none unless the weights mix types), then one
  // GEMM (and bias add) per output. (Stacked q/k/v and gate/up run as one
  // GEMM in QkvRopeAndAttention and GateUpSiluMul, whose consumers read the
  // stacked rows.)
  absl::Status LinearGroup(GemmInput x, int64_t n, std::span<const LinearOut> outs) override {
    if (n == 0 || outs.empty()) return absl::OkStatus();
    const int64_t cols = outs[0].w.cols;
    const void* converted[3] = {};  // by Elem
    converted[static_cast<int>(gemm_elem_)] = x.data;
    for (const LinearOut& o : outs) {
      const DeviceMatrix& w = M(o.w);
      const int e = static_cast<int>(w.type);
      if (converted[e] == nullptr) {
        PS_ASSIGN_OR_RETURN(converted[e],
                            ConvertActivations(x.data, gemm_elem_, n * cols, w.type, &gemm_input_,
                                               "GEMM input conversion"));
        // One conversion buffer: a conversion replaces the one before.
        for (int other = 0; other < 3; ++other)
          if (other != e && other != static_cast<int>(gemm_elem_)) converted[other] = nullptr;
      }
      PS_RETURN_IF_ERROR(Gemm(converted[e], n, w, o.y));
      if (o.bias.data != nullptr)
        PS_RETURN_IF_ERROR(
            CudaStatus(cuda_model::LaunchAddBias(o.y, o.bias.data, static_cast<int>(n),
                                                 static_cast<int>(w.rows), stream_),
                       "add_bias launch"));
    }
    return absl::OkStatus();
  }

  // Up to kFusedGemmMaxTokens: one GEMM over the stacked gate/up rows and
  // one kernel that reads both halves of each row (no split, gate and up
  // untouched); otherwise the default (LinearGroup, SiluMul).
  absl::Status GateUpSiluMul(GemmInput x, int64_t n, const BackendMatrix& gate_proj,
                             const BackendMatrix& up_proj, float* gate, float* up,
                             GemmInput out) override {
    const LinearOut outs[2] = {{gate_proj, BackendVector{}, gate}, {up_proj, BackendVector{}, up}};
    const DeviceMatrix* parent = FusedParent(outs);
    if (parent == nullptr || n > kFusedGemmMaxTokens || gate_proj.rows != up_proj.rows)
      return ModelBackend::GateUpSiluMul(x, n, gate_proj, up_proj, gate, up, out);
    if (n == 0) return absl::OkStatus();
    PS_ASSIGN_OR_RETURN(float* y, StackedGemm(x, n, *parent));
    return CudaStatus(cuda_model::LaunchSiluMulStacked(y, n, static_cast<int>(gate_proj.rows),
                                                       out.data, gemm_elem_, stream_),
                      "silu_mul (stacked) launch");
  }

  absl::Status AddRmsNorm(float* residual, PartialSums add, int64_t n, int dim,
                          const BackendVector& weight, double eps, bool logits_rows,
                          GemmInput out) override {
    return CudaStatus(
        cuda_model::LaunchAddRmsNorm(residual, add.data, sum_elem_,
                                     logits_rows ? In<int32_t>(kLogitsRows) : nullptr, weight.data,
                                     static_cast<int>(n), dim, eps, out.data, gemm_elem_, stream_),
        "add_rms_norm launch");
  }

  // The fused add + norm kernel over the n * heads rows of head_size (no
  // add, no write-back) into fp32 scratch (reserved at BeginStep), copied
  // back over x.
  absl::Status HeadRmsNorm(float* x, int64_t n, int heads, int head_size,
                           const BackendVector& weight, double eps) override {
    if (weight.size != head_size)
      return absl::InvalidArgumentError(absl::StrCat("HeadRmsNorm: weight of ", weight.size,
                                                     " values for head_size ", head_size));
    const int64_t rows = n * heads;
    const size_t bytes = static_cast<size_t>(rows * head_size) * sizeof(float);
    if (rows <= 0) return absl::OkStatus();
    if (head_norm_.bytes() < bytes)
      return absl::InternalError("HeadRmsNorm: q/k norm scratch not reserved for this step");
    PS_RETURN_IF_ERROR(
        CudaStatus(cuda_model::LaunchAddRmsNorm(x, nullptr, Elem::kF32, nullptr, weight.data,
                                                static_cast<int>(rows), head_size, eps,
                                                head_norm_.get(), Elem::kF32, stream_),
                   "q/k norm launch"));
    return CudaStatus(
        cudaMemcpyAsync(x, head_norm_.get(), bytes, cudaMemcpyDeviceToDevice, stream_),
        "q/k norm copy");
  }

  absl::Status ApplyRope(float* x, int64_t n, int heads, int head_size, int64_t token_stride,
                         bool local) override {
    PS_ASSIGN_OR_RETURN(const RopeTables tables, Rope(local, n));
    return CudaStatus(
        cuda_model::LaunchApplyRope(x, static_cast<int>(n), heads, head_size, RotHalf(),
                                    token_stride, tables.cos, tables.sin, stream_),
        "rope launch");
  }

  // The residual add of the normed o_proj / MLP output (Gemma), one kernel.
  absl::Status AddPostRmsNorm(float* residual, PartialSums add, int64_t n, int dim,
                              const BackendVector& weight, double eps) override {
    if (weight.size != dim)
      return absl::InvalidArgumentError(
          absl::StrCat("AddPostRmsNorm: weight of ", weight.size, " values for dim ", dim));
    if (add.data == nullptr && n > 0)
      return absl::InvalidArgumentError("AddPostRmsNorm: no output to add");
    return CudaStatus(cuda_model::LaunchAddPostRmsNorm(residual, add.data, sum_elem_, weight.data,
                                                       static_cast<int>(n), dim, eps, stream_),
                      "add_post_rms_norm launch");
  }

  absl::Status Scale(float* x, int64_t count, float factor) override {
    return CudaStatus(cuda_model::LaunchScale(x, count, factor, stream_), "scale launch");
  }

  absl::Status GeluTanhMul(const float* gate, const float* up, int64_t count,
                           GemmInput out) override {
    return CudaStatus(cuda_model::LaunchGeluTanhMul(gate, up, count, out.data, gemm_elem_, stream_),
                      "gelu_tanh_mul launch");
  }

  absl::Status SiluMul(const float* gate, const float* up, int64_t count, GemmInput out) override {
    return CudaStatus(cuda_model::LaunchSiluMul(gate, up, count, out.data, gemm_elem_, stream_),
                      "silu_mul launch");
  }

  // fp32 and fp8 caches take the fp32 operands as they are (fp8: io_dtype
  // fp32, converted inside the kernels); a 16-bit cache gets converted
  // copies of q, k and v. The output is written in the GEMM-input type
  // (RunAttention).
  absl::Status Attention(const kernels::KVCacheView& cache, const LayerAttention& layer,
                         int num_heads, float* q, float* k, float* v, GemmInput out) override {
    const int64_t n = plan_->num_tokens;
    const int64_t q_dim = static_cast<int64_t>(num_heads) * cache.shape.head_size;
    const int64_t kv_dim = static_cast<int64_t>(cache.shape.num_kv_heads) * cache.shape.head_size;
    const Elem io = AttentionIoElem(cache.shape.dtype);
    const void* qa = q;
    const void* ka = k;
    const void* va = v;
    if (io != Elem::kF32) {
      PS_ASSIGN_OR_RETURN(
          qa, ConvertActivations(q, Elem::kF32, n * q_dim, io, &attn_q_, "query conversion"));
      PS_ASSIGN_OR_RETURN(
          ka, ConvertActivations(k, Elem::kF32, n * kv_dim, io, &attn_k_, "key conversion"));
      PS_ASSIGN_OR_RETURN(
          va, ConvertActivations(v, Elem::kF32, n * kv_dim, io, &attn_v_, "value conversion"));
    }
    kernels::ReshapeAndCacheParams rc;
    rc.key = ka;
    rc.value = va;
    rc.slot_mapping = In<int64_t>(kSlots);
    rc.num_tokens = static_cast<int>(n);
    rc.cache = cache;
    rc.io_dtype = AttentionIoDType(cache);
    rc.stream = stream_;
    PS_RETURN_IF_ERROR(kernels::ReshapeAndCache(rc));
    return RunAttention(cache, layer, num_heads, qa, out);
  }

  // Fused: one kernel rotates q and converts it to the attention operand
  // type, one rotates k and writes k and v into the cache (in place of
  // ApplyRope x 2, three conversions and reshape_and_cache).
  absl::Status RopeAndAttention(const kernels::KVCacheView& cache, const LayerAttention& layer,
                                int64_t n, int num_heads, float* q, float* k, float* v,
                                GemmInput out) override {
    const int64_t q_dim = static_cast<int64_t>(num_heads) * cache.shape.head_size;
    const QkvRows rows{q, k, v, q_dim,
                       static_cast<int64_t>(cache.shape.num_kv_heads) * cache.shape.head_size};
    return RopeAttentionFrom(cache, layer, n, num_heads, rows, q, out);
  }

  // Up to kFusedGemmMaxTokens with q/k/v stacked at load: one GEMM, then the
  // RoPE and cache-write kernels read its rows (no split; the q scratch
  // receives the rotated fp32 queries of an fp32 or fp8 cache). Otherwise
  // a GEMM per projection into its own output. Either way the RoPE and
  // cache-write kernels add the biases as they read q, k and v: no bias
  // kernel and no extra pass over q/k/v (the job of a GEMM bias epilogue).
  absl::Status QkvRopeAndAttention(GemmInput x, int64_t n, std::span<const LinearOut, 3> qkv,
                                   const kernels::KVCacheView& cache, const LayerAttention& layer,
                                   int num_heads, GemmInput out) override {
    const int64_t q_dim = static_cast<int64_t>(num_heads) * cache.shape.head_size;
    const int64_t kv_dim = static_cast<int64_t>(cache.shape.num_kv_heads) * cache.shape.head_size;
    if (qkv[0].w.rows != q_dim || qkv[1].w.rows != kv_dim || qkv[2].w.rows != kv_dim)
      return absl::InvalidArgumentError(absl::StrCat(
          "QkvRopeAndAttention: projections of ", qkv[0].w.rows, ", ", qkv[1].w.rows, " and ",
          qkv[2].w.rows, " rows for ", num_heads, " query heads and a cache of ",
          cache.shape.num_kv_heads, " KV heads of ", cache.shape.head_size));
    if (n == 0) return absl::OkStatus();
    const DeviceMatrix* parent = FusedParent(qkv);
    if (parent == nullptr || n > kFusedGemmMaxTokens) {
      const LinearOut unbiased[3] = {{qkv[0].w, BackendVector{}, qkv[0].y},
                                     {qkv[1].w, BackendVector{}, qkv[1].y},
                                     {qkv[2].w, BackendVector{}, qkv[2].y}};
      PS_RETURN_IF_ERROR(LinearGroup(x, n, unbiased));
      const QkvRows rows{qkv[0].y, qkv[1].y,         qkv[2].y,         q_dim,
                         kv_dim,   qkv[0].bias.data, qkv[1].bias.data, qkv[2].bias.data};
      return RopeAttentionFrom(cache, layer, n, num_heads, rows, qkv[0].y, out);
    }
    PS_ASSIGN_OR_RETURN(float* y, StackedGemm(x, n, *parent));
    const QkvRows rows{y,
                       y + q_dim,
                       y + q_dim + kv_dim,
                       parent->rows,
                       parent->rows,
                       qkv[0].bias.data,
                       qkv[1].bias.data,
                       qkv[2].bias.data};
    return RopeAttentionFrom(cache, layer, n, num_heads, rows, qkv[0].y, out);
  }

  bool SupportsBodyGraphs() const override { return true; }

  // The first step of a key runs eagerly (lazy module loading, cuBLAS
  // heuristics and kernel attributes settle outside a capture), the second
  // is captured, later ones replay. A graph is kept with the addresses it
  // was captured over (BodyAddresses); when a buffer has grown since, it is
  // captured again.
  absl::StatusOr<bool> BeginBody(std::span<const kernels::KVCacheView> kv_layers) override {
    const DecodeGraphKey key = *plan_->graph;
    warming_up_.reset();
    // MoeMlp waits for the router's logits on the host: not capturable.
    if (config_.moe.enabled()) return false;
    std::vector<uintptr_t> addresses = BodyAddresses(kv_layers);
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
      if (!(it->key == key)) continue;
      if (it->addresses == addresses) {
        PS_RETURN_IF_ERROR(ValidateReplayedStep(kv_layers));
        // The eager path stops at the communicator's error; a graph would
        // launch the collectives of an aborted communicator.
        if (comm_->size() > 1) PS_RETURN_IF_ERROR(CheckCommunicator());
        PS_RETURN_IF_ERROR(CudaStatus(cudaGraphLaunch(it->exec, stream_), "CUDA graph launch"));
        return true;
      }
      cudaGraphExecDestroy(it->exec);
      graph_bytes_ -= it->bytes;
      graphs_.erase(it);
      break;
    }
    const auto seen = [&](const std::vector<DecodeGraphKey>& keys) {
      return std::find(keys.begin(), keys.end(), key) != keys.end();
    };
    if (seen(uncapturable_) || graphs_.size() >= kMaxGraphs) return false;
    if (!seen(warmed_up_)) {
      warming_up_ = key;  // warmed up once its body succeeds (EndBody)
      return false;
    }
    // Marked until EndBody succeeds: a capture that fails is not retried.
    uncapturable_.push_back(key);
    capture_free_before_ = FreeDeviceBytes();
    PS_RETURN_IF_ERROR(CudaStatus(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                                  "CUDA graph capture"));
    capturing_ = true;
    capture_key_ = key;
    capture_addresses_ = std::move(addresses);
    return false;
  }

  // A capture that failed (the capture was invalidated under an operation,
  // or ending or instantiating it failed) leaves its key in uncapturable_
  // and the step to run eagerly. An operation that failed for a reason of
  // its own (a validation error) leaves the capture active: its error is the
  // step's, and the key may be captured later.
  absl::StatusOr<bool> EndBody(bool body_ok) override {
    if (warming_up_ && body_ok) warmed_up_.push_back(*warming_up_);
    warming_up_.reset();
    if (!capturing_) return true;
    if (!body_ok) {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      const bool invalidated = cudaStreamIsCapturing(stream_, &status) != cudaSuccess ||
                               status != cudaStreamCaptureStatusActive;
      AbandonCapture();
      if (invalidated) return false;
      uncapturable_.erase(std::find(uncapturable_.begin(), uncapturable_.end(), capture_key_));
      return true;
    }
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    cudaGraphExec_t exec = nullptr;
    if (e == cudaSuccess) e = cudaGraphInstantiateWithFlags(&exec, graph, 0);
    if (graph != nullptr) cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    uncapturable_.erase(std::find(uncapturable_.begin(), uncapturable_.end(), capture_key_));
    const size_t free_after = FreeDeviceBytes();
    const int64_t bytes = capture_free_before_ > free_after
                              ? static_cast<int64_t>(capture_free_before_ - free_after)
                              : 0;
    graphs_.push_back(CapturedBody{capture_key_, std::move(capture_addresses_), exec, bytes});
    graph_bytes_ += bytes;
    spdlog::info(
        "CUDA graph captured for decode batch {} (context bucket {}): {:.1f} MiB of device "
        "memory; {} graphs hold {:.1f} MiB",
        capture_key_.batch, capture_key_.context, bytes / 1048576.0, graphs_.size(),
        graph_bytes_ / 1048576.0);
    // Capturing ran nothing: this step's body runs as the graph's first replay.
    PS_RETURN_IF_ERROR(CudaStatus(cudaGraphLaunch(exec, stream_), "CUDA graph launch"));
    return true;
  }

  // The mixture-of-experts MLP (ModelBackend::MoeMlp's contract). The router
  // GEMM's logits go to the host (the stream is waited for: a MoE body is
  // never captured in a graph) and are routed there by RouteTokens, as on
  // the CPU backend; the routing tables go up in one copy. Then, per chunk
  // of at most kMoeChunkTokens tokens: the chunk's rows gathered by expert
  // (LaunchMoeGatherRows), per expert with tokens one gate/up GEMM
  // (GateUpSiluMul: stacked at load) and one down GEMM into its rows of the
  // pair output, the shared expert over the chunk when the model has one,
  // and one kernel summing each token's expert rows in expert order
  // (LaunchMoeCombine) into y in partial_sum_type().
  absl::Status MoeMlp(GemmInput x, int64_t n, const MoeConfig& moe, const BackendExperts& w,
                      PartialSums y) override {
    PS_RETURN_IF_ERROR(w.CheckAgainst(moe));
    if (n == 0) return absl::OkStatus();
    PS_RETURN_IF_ERROR(ReserveMoeScratch(n));
    const int64_t experts = moe.num_experts, hidden = w.router.cols, k = moe.top_k;
    float* logits = static_cast<float*>(moe_.logits.get());
    PS_RETURN_IF_ERROR(Linear(x, n, w.router, BackendVector{}, logits));
    float* host_logits = static_cast<float*>(moe_.host_logits.get());
    PS_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(host_logits, logits, static_cast<size_t>(n * experts) * sizeof(float),
                        cudaMemcpyDeviceToHost, stream_),
        "router logits download"));
    PS_RETURN_IF_ERROR(WaitForStream("router logits download"));
    // Tables for every chunk, each at its tokens' pair offset t0 * k:
    // tokens (chunk-local rows of x, grouped by expert), token_pairs (each
    // token's grouped positions in expert order) and the pairs' weights.
    const int64_t chunks = (n + kMoeChunkTokens - 1) / kMoeChunkTokens;
    moe_routing_.resize(static_cast<size_t>(chunks));
    int32_t* tokens = static_cast<int32_t*>(moe_.host_tables.get());
    int32_t* token_pairs = tokens + n * k;
    float* weights = reinterpret_cast<float*>(token_pairs + n * k);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t t0 = c * kMoeChunkTokens, m = std::min(kMoeChunkTokens, n - t0);
      MoeRouting& r = moe_routing_[static_cast<size_t>(c)];
      PS_RETURN_IF_ERROR(RouteTokens(host_logits + t0 * experts, m, moe, &r));
      if (static_cast<int64_t>(r.tokens.size()) != m * k)
        return absl::InternalError("MoeMlp: routing gave an unexpected number of pairs");
      std::copy(r.tokens.begin(), r.tokens.end(), tokens + t0 * k);
      std::copy(r.token_weights.begin(), r.token_weights.end(), weights + t0 * k);
      TokenPairPositions(r, token_pairs + t0 * k);
    }
    PS_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(moe_.tables.get(), tokens, static_cast<size_t>(3 * n * k) * 4,
                                   cudaMemcpyHostToDevice, stream_),
                   "routing tables upload"));
    const int32_t* d_tokens = static_cast<const int32_t*>(moe_.tables.get());
    const int32_t* d_token_pairs = d_tokens + n * k;
    const float* d_weights = reinterpret_cast<const float*>(d_token_pairs + n * k);
    const int64_t eb = cuda_model::ElemBytes(gemm_elem_);
    const int64_t sum_bytes = cuda_model::ElemBytes(sum_elem_);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t t0 = c * kMoeChunkTokens, m = std::min(kMoeChunkTokens, n - t0);
      const GemmInput xc{static_cast<char*>(x.data) + t0 * hidden * eb};
      PS_RETURN_IF_ERROR(
          RunExperts(xc, hidden, w, moe_routing_[static_cast<size_t>(c)], d_tokens + t0 * k));
      const float* shared_out = nullptr;
      const float* shared_logit = nullptr;
      if (w.has_shared()) {
        PS_RETURN_IF_ERROR(RunSharedExpert(xc, m, w));
        shared_out = static_cast<const float*>(moe_.shared_out.get());
        shared_logit = static_cast<const float*>(moe_.shared_logit.get());
      }
      PS_RETURN_IF_ERROR(
          CudaStatus(cuda_model::LaunchMoeCombine(
                         static_cast<const float*>(moe_.pair_out.get()), d_token_pairs + t0 * k,
                         d_weights + t0 * k, m, static_cast<int>(k), static_cast<int>(hidden),
                         shared_out, shared_logit,
                         static_cast<char*>(y.data) + t0 * hidden * sum_bytes, sum_elem_, stream_),
                     "moe_combine launch"));
    }
    return absl::OkStatus();
  }

  // Enqueued on the compute stream (NCCL): no host synchronisation; a
  // communicator error surfaces in WaitForStep. The payload is the partial
  // sums in place, in partial_sum_type(): with 16-bit weights the weights'
  // type (as vLLM all-reduces in the model dtype: half the bytes on the
  // links), written so by the GEMM and read so by the add + norm.
  absl::Status AllReduceSum(PartialSums data, int64_t count) override {
    if (comm_->size() <= 1 || count == 0) return absl::OkStatus();
    const Communicator::ReduceType type =
        sum_elem_ == Elem::kF16    ? Communicator::ReduceType::kFloat16
        : sum_elem_ == Elem::kBF16 ? Communicator::ReduceType::kBFloat16
                                   : Communicator::ReduceType::kFloat32;
    return comm_->AllReduceSumAsync(data.data, static_cast<size_t>(count), type, stream_);
  }

  absl::Status LmHead(GemmInput x, int64_t n, const BackendMatrix& w,
                      std::vector<float>* logits) override {
    host_logits_.resize(static_cast<size_t>(n) * w.rows);
    const size_t bytes = host_logits_.size() * sizeof(float);
    if (n > 0) {
      PS_RETURN_IF_ERROR(logits_.Reserve(bytes, "logits allocation"));
      PS_RETURN_IF_ERROR(pinned_logits_.Reserve(bytes, "pinned logits allocation"));
      float* d_logits = static_cast<float*>(logits_.get());
      PS_RETURN_IF_ERROR(LogitsOnDevice(x, n, w, d_logits));
      // Into pinned memory: asynchronous, so that WaitForStep (not the copy)
      // is where the host waits.
      PS_RETURN_IF_ERROR(CudaStatus(
          cudaMemcpyAsync(pinned_logits_.get(), d_logits, bytes, cudaMemcpyDeviceToHost, stream_),
          "logits download"));
    }
    PS_RETURN_IF_ERROR(WaitForStep());
    if (n > 0) std::memcpy(host_logits_.data(), pinned_logits_.get(), bytes);
    logits->swap(host_logits_);
    return absl::OkStatus();
  }

  // Rows reduced on the device: one argmax kernel over the logits for the
  // greedy rows, one sampling kernel (cuda_model::LaunchSampleRows) for the
  // sampled ones with their parameters and uniforms uploaded in one copy;
  // then the ids and logprobs come back in one copy, and only the rows that
  // need logits (left to the host sampler, or refused) are copied back into
  // pinned memory.
  absl::Status LmHeadSample(GemmInput x, int64_t n, const BackendMatrix& w,
                            std::span<const RowSampling> rows, SampledRows* out,
                            std::vector<float>* logits) override {
    using Mode = RowSampling::Mode;
    const bool any_greedy = std::any_of(
        rows.begin(), rows.end(), [](const RowSampling& r) { return r.mode == Mode::kGreedy; });
    const bool any_sample = w.rows <= cuda_model::kMaxSampleVocab &&
                            std::any_of(rows.begin(), rows.end(), [](const RowSampling& r) {
                              return r.mode == Mode::kSample;
                            });
    if (n == 0 || (!any_greedy && !any_sample))
      return ModelBackend::LmHeadSample(x, n, w, rows, out, logits);
    // Draws of the sampled rows, at most kMaxSampleDraws each, and top
    // lists of at most kMaxSampleTopLogprobs (ReserveStepScratch sized the
    // output buffers for that, and the inputs short of penalties).
    SampleLayout l;
    l.args.resize(static_cast<size_t>(n));
    for (int64_t t = 0; t < n; ++t) {
      const RowSampling& r = rows[t];
      if (!any_sample || r.mode != Mode::kSample) continue;
      if (r.uniforms.empty() || r.uniforms.size() > size_t{cuda_model::kMaxSampleDraws})
        return absl::InvalidArgumentError(absl::StrCat("LmHeadSample: row ", t, " has ",
                                                       r.uniforms.size(), " uniforms, want 1 to ",
                                                       cuda_model::kMaxSampleDraws));
      // A history the sampler would refuse stays with it (for the error).
      if (cuda_model::BuildSampleRowArgs(r, w.rows, static_cast<int32_t>(l.num_draws),
                                         static_cast<int32_t>(l.num_top), &l.args[t],
                                         &l.penalties)) {
        l.num_draws += l.args[t].num_draws;
        l.num_top += cuda_model::TopLogprobCount(r, w.rows);
      }
    }
    float* d_logits = static_cast<float*>(logits_.get());
    // 4-byte words: [n argmax | draws | their logprobs | top ids | top logprobs].
    int32_t* d_ids = static_cast<int32_t*>(argmax_.get());
    PS_RETURN_IF_ERROR(LogitsOnDevice(x, n, w, d_logits));
    if (any_greedy)
      PS_RETURN_IF_ERROR(CudaStatus(
          cuda_model::LaunchGreedyArgmax(d_logits, static_cast<int>(n), w.rows, d_ids, stream_),
          "greedy argmax launch"));
    if (l.num_draws > 0) PS_RETURN_IF_ERROR(EnqueueSampling(rows, l, d_logits, w.rows, d_ids + n));
    const int64_t words = n + 2 * l.num_draws + 2 * l.num_top;
    PS_RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(pinned_argmax_.get(), d_ids, static_cast<size_t>(words) * sizeof(int32_t),
                        cudaMemcpyDeviceToHost, stream_),
        "token download"));
    PS_RETURN_IF_ERROR(WaitForStep());
    std::vector<uint8_t> reduced;
    SampledRows sampled;
    const int64_t wanted = UnpackSampled(rows, l, static_cast<const char*>(pinned_argmax_.get()), n,
                                         w.rows, &sampled, &reduced);
    std::vector<float> kept;
    PS_RETURN_IF_ERROR(DownloadRows(d_logits, n, w.rows, reduced, wanted, &kept));
    *out = std::move(sampled);  // nothing written on error
    logits->swap(kept);
    return absl::OkStatus();
  }

  // d_logits [n, w.rows] = x w^T, soft-capped on the device when the plan
  // says (Gemma 2), so that the argmax and sampling kernels and the
  // downloaded rows all see the capped values.
  absl::Status LogitsOnDevice(GemmInput x, int64_t n, const BackendMatrix& w, float* d_logits) {
    PS_RETURN_IF_ERROR(Linear(x, n, w, BackendVector{}, d_logits));
    const double cap = plan_ != nullptr ? plan_->final_logit_softcap : 0.0;
    if (!(cap > 0)) return absl::OkStatus();
    return CudaStatus(cuda_model::LaunchSoftcap(d_logits, n * w.rows, cap, stream_),
                      "final logit soft cap launch");
  }

  // The sampling kernel's inputs for one LmHeadSample: per-row args (with
  // draw and top-list offsets), the rows' penalty lists, and the totals.
  struct SampleLayout {
    std::vector<cuda_model::SampleRowArgs> args;
    std::vector<cuda_model::SamplePenalty> penalties;
    int64_t num_draws = 0;
    int64_t num_top = 0;
  };

  // LmHeadSample's results from the downloaded words `got` (its layout) into
  // *out; reduced[t] = whether row t was reduced. Returns the number of rows
  // that were not (their logits are needed).
  static int64_t UnpackSampled(std::span<const RowSampling> rows, const SampleLayout& l,
                               const char* got, int64_t n, int64_t vocab, SampledRows* out,
                               std::vector<uint8_t>* reduced) {
    auto word = [&](int64_t i, auto* v) { std::memcpy(v, got + i * 4, 4); };
    const int64_t draw0 = n, lp0 = n + l.num_draws, top0 = n + 2 * l.num_draws,
                  top_lp0 = top0 + l.num_top;
    SampledRows res;
    res.top_begin.push_back(0);
    reduced->assign(static_cast<size_t>(n), 0);
    int64_t wanted = 0;
    for (int64_t t = 0; t < n; ++t) {
      const RowSampling& r = rows[t];
      const cuda_model::SampleRowArgs& a = l.args[t];
      if (r.mode == RowSampling::Mode::kGreedy) {
        int32_t id = -1;
        word(t, &id);
        res.tokens.push_back(id);
        res.logprobs.push_back(0.0f);
        (*reduced)[t] = id >= 0;
      } else if (a.num_draws > 0) {
        int32_t first = -1;
        word(draw0 + a.first_draw, &first);
        (*reduced)[t] = first >= 0;
        for (int32_t j = 0; j < a.num_draws; ++j) {
          int32_t id = -1;
          float lp = 0.0f;
          word(draw0 + a.first_draw + j, &id);
          if (a.logprobs >= 0) word(lp0 + a.first_draw + j, &lp);
          res.tokens.push_back((*reduced)[t] ? id : -1);
          res.logprobs.push_back((*reduced)[t] ? lp : 0.0f);
        }
        const int64_t top = (*reduced)[t] ? cuda_model::TopLogprobCount(r, vocab) : 0;
        for (int64_t k = 0; k < top; ++k) {
          int32_t id = -1;
          float lp = 0.0f;
          word(top0 + a.top_begin + k, &id);
          word(top_lp0 + a.top_begin + k, &lp);
          res.top_ids.push_back(id);
          res.top_logprobs.push_back(lp);
        }
      } else {
        res.tokens.insert(res.tokens.end(), static_cast<size_t>(r.draws()), -1);
        res.logprobs.insert(res.logprobs.end(), static_cast<size_t>(r.draws()), 0.0f);
      }
      res.top_begin.push_back(static_cast<int64_t>(res.top_ids.size()));
      if (!(*reduced)[t]) ++wanted;
    }
    *out = std::move(res);
    return wanted;
  }

  // LmHeadSample's sampling: [args | uniforms | penalties | penalty scratch]
  // staged in pinned memory, one upload, and the sampling kernel over the n
  // = l.args.size() rows of d_logits ([n, vocab]), writing [draws | their
  // logprobs | top ids | top logprobs] to d_out.
  absl::Status EnqueueSampling(std::span<const RowSampling> rows, const SampleLayout& l,
                               float* d_logits, int64_t vocab, int32_t* d_out) {
    const int64_t n = static_cast<int64_t>(l.args.size());
    const size_t args_bytes = l.args.size() * sizeof(cuda_model::SampleRowArgs);
    const size_t uniform_offset = (args_bytes + 7) / 8 * 8;
    const size_t penalty_offset =
        uniform_offset + static_cast<size_t>(l.num_draws) * sizeof(double);
    const size_t raw_offset =
        penalty_offset + l.penalties.size() * sizeof(cuda_model::SamplePenalty);
    const size_t in_bytes = raw_offset + l.penalties.size() * sizeof(float);
    if (in_bytes > sample_in_.bytes() || in_bytes > pinned_sample_in_.bytes()) {
      // Long histories outgrow what ReserveStepScratch sized: wait for the
      // queued work (polling the communicator) before the allocation
      // synchronizes the device, and grow geometrically so that a history
      // growing by a token a step does not reallocate every step.
      PS_RETURN_IF_ERROR(WaitForStep());
      const size_t grown = std::max(in_bytes, 2 * sample_in_.bytes());
      PS_RETURN_IF_ERROR(sample_in_.Reserve(grown, "sampling input allocation"));
      PS_RETURN_IF_ERROR(pinned_sample_in_.Reserve(grown, "pinned sampling input allocation"));
    }
    char* staged = static_cast<char*>(pinned_sample_in_.get());
    std::memcpy(staged, l.args.data(), args_bytes);
    double* u = reinterpret_cast<double*>(staged + uniform_offset);
    for (int64_t t = 0; t < n; ++t)
      if (l.args[t].num_draws > 0)
        std::copy(rows[t].uniforms.begin(), rows[t].uniforms.end(), u + l.args[t].first_draw);
    if (!l.penalties.empty())
      std::memcpy(staged + penalty_offset, l.penalties.data(),
                  l.penalties.size() * sizeof(cuda_model::SamplePenalty));
    char* d_in = static_cast<char*>(sample_in_.get());
    // The scratch is written by the kernel: only the inputs go up.
    PS_RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(d_in, staged, raw_offset, cudaMemcpyHostToDevice, stream_),
                   "sampling parameters upload"));
    cuda_model::SampleBuffers b;
    b.args = reinterpret_cast<const cuda_model::SampleRowArgs*>(d_in);
    b.uniforms = reinterpret_cast<const double*>(d_in + uniform_offset);
    b.penalties = reinterpret_cast<const cuda_model::SamplePenalty*>(d_in + penalty_offset);
    b.penalty_raw = reinterpret_cast<float*>(d_in + raw_offset);
    b.tokens = d_out;
    b.logprobs = reinterpret_cast<float*>(d_out + l.num_draws);
    b.top_ids = d_out + 2 * l.num_draws;
    b.top_logprobs = reinterpret_cast<float*>(d_out + 2 * l.num_draws + l.num_top);
    return CudaStatus(
        cuda_model::LaunchSampleRows(d_logits, static_cast<int>(n), vocab, b, stream_),
        "sampling launch");
  }

  // LmHeadSample's download of the rows not reduced (reduced[t] == 0;
  // `wanted` of them) of d_logits ([n, vocab]) into *kept, compacted in row
  // order: runs of consecutive rows, one copy each, into pinned memory.
  absl::Status DownloadRows(const float* d_logits, int64_t n, int64_t vocab,
                            const std::vector<uint8_t>& reduced, int64_t wanted,
                            std::vector<float>* kept) {
    kept->assign(static_cast<size_t>(wanted * vocab), 0.0f);
    if (wanted == 0) return absl::OkStatus();
    float* dst = static_cast<float*>(pinned_logits_.get());
    for (int64_t t = 0; t < n;) {
      if (reduced[t]) {
        ++t;
        continue;
      }
      int64_t end = t;
      while (end < n && !reduced[end]) ++end;
      const size_t count = static_cast<size_t>((end - t) * vocab);
      PS_RETURN_IF_ERROR(
          CudaStatus(cudaMemcpyAsync(dst, d_logits + static_cast<size_t>(t * vocab),
                                     count * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                     "logits download"));
      dst += count;
      t = end;
    }
    PS_RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "logits download"));
    std::memcpy(kept->data(), pinned_logits_.get(), kept->size() * sizeof(float));
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
    kRopeCosLocal,  // the local layers' tables (Gemma 3); empty without local RoPE
    kRopeSinLocal,
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
    // The activation buffers counted as fp32 (the GEMM inputs among them,
    // the SwiGLU product included, are 16-bit for a 16-bit model), plus a
    // 16-bit GEMM-input conversion (mixed weight types, at most the
    // intermediate width) and the attention operands.
    const int64_t per_token = 3 * hidden + 2 * q_dim + 2 * kv_dim + 3 * inter + D +
                              (std::max(hidden, inter) + 2 * q_dim + 2 * kv_dim) / 2;
    // The fused q/k/v or gate/up GEMM output (kFusedGemmMaxTokens rows).
    const int64_t fused = kFusedGemmMaxTokens * std::max(q_dim + 2 * kv_dim, 2 * inter);
    return static_cast<int64_t>((n * per_token + r * (hidden + config_.vocab_size) + fused) *
                                    sizeof(float) +
                                (kInputCount + static_cast<int>(BufferId::kCount) + 1) * kAlign) +
           MoeScratchFor(n).total();
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

  // A MoE layer's router, experts (each one's gate/up stacked for one GEMM)
  // and shared expert.
  absl::Status UploadExperts(const LayerWeights& src, const std::string& p, BackendExperts* d) {
    PS_ASSIGN_OR_RETURN(d->router, UploadMatrix(src.router, p + "router"));
    const size_t experts = src.expert_gate.size();
    if (src.expert_up.size() != experts || src.expert_down.size() != experts)
      return absl::InvalidArgumentError(absl::StrCat(p, "experts: ", experts, " gate, ",
                                                     src.expert_up.size(), " up and ",
                                                     src.expert_down.size(), " down matrices"));
    d->gate.resize(experts);
    d->up.resize(experts);
    d->down.resize(experts);
    for (size_t e = 0; e < experts; ++e) {
      const std::string q = absl::StrCat(p, "experts.", e, ".");
      BackendMatrix* gate_up[2] = {&d->gate[e], &d->up[e]};
      PS_RETURN_IF_ERROR(UploadStacked({&src.expert_gate[e], &src.expert_up[e]},
                                       {q + "gate_proj", q + "up_proj"}, gate_up));
      PS_ASSIGN_OR_RETURN(d->down[e], UploadMatrix(src.expert_down[e], q + "down_proj"));
    }
    if (src.shared_gate.rows > 0) {
      BackendMatrix* gate_up[2] = {&d->shared_gate, &d->shared_up};
      PS_RETURN_IF_ERROR(UploadStacked({&src.shared_gate, &src.shared_up},
                                       {p + "shared_expert.gate_proj", p + "shared_expert.up_proj"},
                                       gate_up));
      PS_ASSIGN_OR_RETURN(d->shared_down, UploadMatrix(src.shared_down, p + "shared_expert.down"));
      PS_ASSIGN_OR_RETURN(d->shared_expert_gate,
                          UploadMatrix(src.shared_expert_gate, p + "shared_expert_gate"));
    }
    return absl::OkStatus();
  }

  // MoeMlp's scratch for a step of n tokens, in bytes (chunks of at most
  // kMoeChunkTokens tokens, top_k pairs per token; zero for a dense model).
  struct MoeScratchBytes {
    int64_t logits = 0, tables = 0, rows = 0, act = 0, gate_up = 0, pair_out = 0, shared_act = 0,
            shared_out = 0, shared_logit = 0;
    int64_t total() const {
      return 2 * logits + 2 * tables + rows + act + 2 * gate_up + pair_out + shared_act +
             shared_out + shared_logit;  // logits and tables: device + pinned host
    }
  };
  MoeScratchBytes MoeScratchFor(int64_t n) const {
    MoeScratchBytes b;
    if (!config_.moe.enabled() || n <= 0) return b;
    const int64_t k = config_.moe.top_k, hidden = config_.hidden_size;
    const int64_t inter = shard_.expert_intermediate_size;
    const int64_t shared = shard_.shared_expert_intermediate_size;
    const int64_t c = std::min(n, kMoeChunkTokens), pairs = c * k;
    const int64_t eb = cuda_model::ElemBytes(gemm_elem_);
    b.logits = n * config_.moe.num_experts * 4;
    b.tables = 3 * n * k * 4;
    b.rows = pairs * hidden * eb;
    b.act = pairs * inter * eb;
    b.gate_up = pairs * std::max(inter, shared) * 4;  // GateUpSiluMul's unfused path
    b.pair_out = pairs * hidden * 4;
    b.shared_act = c * shared * eb;
    b.shared_out = shared > 0 ? c * hidden * 4 : 0;
    b.shared_logit = shared > 0 ? c * 4 : 0;
    return b;
  }
  absl::Status ReserveMoeScratch(int64_t n) {
    const MoeScratchBytes b = MoeScratchFor(n);
    if (b.total() == 0) return absl::OkStatus();
    auto grow = [](auto& buf, int64_t bytes, absl::string_view what) {
      return buf.Reserve(std::max<size_t>(static_cast<size_t>(bytes), 4),
                         absl::StrCat("mixture-of-experts ", what, " allocation"));
    };
    PS_RETURN_IF_ERROR(grow(moe_.logits, b.logits, "router logits"));
    PS_RETURN_IF_ERROR(grow(moe_.host_logits, b.logits, "pinned router logits"));
    PS_RETURN_IF_ERROR(grow(moe_.tables, b.tables, "routing tables"));
    PS_RETURN_IF_ERROR(grow(moe_.host_tables, b.tables, "pinned routing tables"));
    PS_RETURN_IF_ERROR(grow(moe_.rows, b.rows, "gathered rows"));
    PS_RETURN_IF_ERROR(grow(moe_.act, b.act, "expert activations"));
    PS_RETURN_IF_ERROR(grow(moe_.gate, b.gate_up, "expert gate"));
    PS_RETURN_IF_ERROR(grow(moe_.up, b.gate_up, "expert up"));
    PS_RETURN_IF_ERROR(grow(moe_.pair_out, b.pair_out, "expert outputs"));
    PS_RETURN_IF_ERROR(grow(moe_.shared_act, b.shared_act, "shared expert activations"));
    PS_RETURN_IF_ERROR(grow(moe_.shared_out, b.shared_out, "shared expert output"));
    return grow(moe_.shared_logit, b.shared_logit, "shared expert gate");
  }

  // The experts of one chunk (xc: its rows of the GEMM input; r: its
  // routing; d_tokens: its grouped chunk-local rows on the device): the rows
  // gathered, then per expert with tokens gate/up + SiLU-and-mul and down
  // into its rows of moe_.pair_out (fp32).
  absl::Status RunExperts(GemmInput xc, int64_t hidden, const BackendExperts& w,
                          const MoeRouting& r, const int32_t* d_tokens) {
    const int64_t pairs = static_cast<int64_t>(r.tokens.size());
    const int64_t eb = cuda_model::ElemBytes(gemm_elem_);
    char* rows = static_cast<char*>(moe_.rows.get());
    char* act = static_cast<char*>(moe_.act.get());
    float* pair_out = static_cast<float*>(moe_.pair_out.get());
    PS_RETURN_IF_ERROR(
        CudaStatus(cuda_model::LaunchMoeGatherRows(xc.data, gemm_elem_, d_tokens, pairs,
                                                   static_cast<int>(hidden), rows, stream_),
                   "moe_gather_rows launch"));
    for (int e = 0; e < r.num_experts; ++e) {
      const int64_t begin = r.offsets[e], count = r.offsets[e + 1] - begin;
      if (count == 0) continue;
      const int64_t inter = w.gate[e].rows;
      const GemmInput in{rows + begin * hidden * eb};
      const GemmInput out{act + begin * inter * eb};
      PS_RETURN_IF_ERROR(GateUpSiluMul(in, count, w.gate[e], w.up[e],
                                       static_cast<float*>(moe_.gate.get()),
                                       static_cast<float*>(moe_.up.get()), out));
      PS_RETURN_IF_ERROR(Linear(out, count, w.down[e], BackendVector{}, pair_out + begin * hidden));
    }
    return absl::OkStatus();
  }

  // The shared expert of one chunk of m tokens into moe_.shared_out (fp32
  // [m, hidden]) and its gate's logits into moe_.shared_logit ([m]).
  absl::Status RunSharedExpert(GemmInput xc, int64_t m, const BackendExperts& w) {
    const GemmInput act{moe_.shared_act.get()};
    PS_RETURN_IF_ERROR(GateUpSiluMul(xc, m, w.shared_gate, w.shared_up,
                                     static_cast<float*>(moe_.gate.get()),
                                     static_cast<float*>(moe_.up.get()), act));
    PS_RETURN_IF_ERROR(
        Linear(act, m, w.shared_down, BackendVector{}, static_cast<float*>(moe_.shared_out.get())));
    return Linear(xc, m, w.shared_expert_gate, BackendVector{},
                  static_cast<float*>(moe_.shared_logit.get()));
  }

  // fp32 matrices upload as they are; F16 / BF16 stored rows (LoadLlamaWeights
  // with WeightDType kFloat16 / kBFloat16) upload as 16-bit.
  absl::StatusOr<BackendMatrix> UploadMatrix(const Matrix& m, const std::string& name) {
    if (m.is_fp32()) {
      if (static_cast<int64_t>(m.data.size()) != m.rows * m.cols)
        return absl::InvalidArgumentError(absl::StrCat("weight ", name, " has ", m.data.size(),
                                                       " fp32 values for [", m.rows, ", ", m.cols,
                                                       "]"));
      PS_ASSIGN_OR_RETURN(const BackendVector v, UploadVector(m.data, name));
      matrices_.push_back(DeviceMatrix{v.data, Elem::kF32, m.rows, m.cols});
      return BackendMatrix{&matrices_.back(), m.rows, m.cols};
    }
    if ((m.type != GgmlType::kF16 && m.type != GgmlType::kBF16) || m.bytes() == nullptr)
      return absl::UnimplementedError(
          absl::StrCat("weight ", name, " is held as ", GgmlTypeName(m.type),
                       ": the CUDA backend runs float32, float16 or bfloat16 matrices (--dtype)"));
    if (m.row_bytes != static_cast<uint64_t>(m.cols) * 2)
      return absl::InvalidArgumentError(absl::StrCat("weight ", name, " has ", m.row_bytes,
                                                     " bytes per row for ", m.cols, " columns"));
    const size_t bytes = static_cast<size_t>(m.rows) * m.row_bytes;
    DeviceBuffer buf;
    PS_RETURN_IF_ERROR(buf.Reserve(std::max<size_t>(bytes, 4), absl::StrCat("upload of ", name)));
    PS_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(buf.get(), m.bytes(), bytes, cudaMemcpyHostToDevice),
                                  absl::StrCat("upload of ", name)));
    weight_bytes_ += static_cast<int64_t>(bytes);
    has_16bit_weights_ = true;
    matrices_.push_back(DeviceMatrix{buf.get(), m.type == GgmlType::kF16 ? Elem::kF16 : Elem::kBF16,
                                     m.rows, m.cols});
    weights_.push_back(std::move(buf));
    return BackendMatrix{&matrices_.back(), m.rows, m.cols};
  }

  // Every per-step scratch buffer at this step's size, before the step's
  // first collective is enqueued: growing one later (cudaFree and
  // cudaFreeHost synchronize the device) would make the host wait for a
  // queued all-reduce outside WaitForStep. Sized for the pool's cache type
  // (device_views_); a step over other views may still grow the attention
  // buffers in place.
  absl::Status ReserveStepScratch(const ForwardPlan& plan) {
    const int64_t n = plan.num_tokens;
    const int64_t r = static_cast<int64_t>(plan.batch->logits_rows.size());
    const int64_t D = config_.head_size, hidden = config_.hidden_size;
    const int64_t q_dim = shard_.num_heads * D, kv_dim = shard_.num_kv_heads * D;
    const int64_t inter = shard_.intermediate_size, vocab = config_.vocab_size;
    auto bytes = [](int64_t elems, int64_t size) {
      return std::max<size_t>(static_cast<size_t>(elems * size), 4);
    };
    if (has_16bit_weights_ && gemm_elem_ == Elem::kF32)  // mixed types: conversions
      PS_RETURN_IF_ERROR(gemm_input_.Reserve(
          bytes(std::max(n, r) * std::max({hidden, q_dim, inter}), 2), "GEMM input allocation"));
    if (n > 0)
      PS_RETURN_IF_ERROR(fused_out_.Reserve(
          bytes(std::min(n, kFusedGemmMaxTokens) * std::max(q_dim + 2 * kv_dim, 2 * inter),
                sizeof(float)),
          "fused GEMM output allocation"));
    if (!device_views_.empty()) {
      const Elem io = AttentionIoElem(device_views_[0].shape.dtype);
      if (io != Elem::kF32)
        PS_RETURN_IF_ERROR(attn_q_.Reserve(bytes(n * q_dim, 2), "query conversion allocation"));
      if (io != gemm_elem_)
        PS_RETURN_IF_ERROR(attn_out_.Reserve(bytes(n * q_dim, cuda_model::ElemBytes(io)),
                                             "attention output allocation"));
    }
    PS_RETURN_IF_ERROR(ReserveMoeScratch(n));
    if (config_.qk_norm && n > 0)
      PS_RETURN_IF_ERROR(head_norm_.Reserve(bytes(n * std::max(q_dim, kv_dim), sizeof(float)),
                                            "q/k norm scratch allocation"));
    PS_RETURN_IF_ERROR(logits_.Reserve(bytes(r * vocab, sizeof(float)), "logits allocation"));
    PS_RETURN_IF_ERROR(
        pinned_logits_.Reserve(bytes(r * vocab, sizeof(float)), "pinned logits allocation"));
    // LmHeadSample: r argmax ids and per row up to kMaxSampleDraws draws
    // with their logprobs and a top list of kMaxSampleTopLogprobs (ids and
    // logprobs); the sampling kernel's [args | uniforms] input.
    const int64_t ids =
        r * (1 + 2 * cuda_model::kMaxSampleDraws + 2 * cuda_model::kMaxSampleTopLogprobs);
    PS_RETURN_IF_ERROR(argmax_.Reserve(bytes(ids, sizeof(int32_t)), "sampled token allocation"));
    PS_RETURN_IF_ERROR(
        pinned_argmax_.Reserve(bytes(ids, sizeof(int32_t)), "pinned sampled token allocation"));
    const int64_t sample_in =
        (r * static_cast<int64_t>(sizeof(cuda_model::SampleRowArgs)) + 7) / 8 * 8 +
        r * cuda_model::kMaxSampleDraws * static_cast<int64_t>(sizeof(double));
    PS_RETURN_IF_ERROR(sample_in_.Reserve(bytes(sample_in, 1), "sampling input allocation"));
    PS_RETURN_IF_ERROR(
        pinned_sample_in_.Reserve(bytes(sample_in, 1), "pinned sampling input allocation"));
    // Decode scratch for the kernel the dispatcher picks for the pool's
    // cache (PAGEDSERVE_DECODE_KERNEL included): the v2 partitions, or the
    // GQA kernels' context splits at their finest (so that neither
    // allocates per launch).
    if (plan.num_decode > 0) {
      const int heads = shard_.num_heads;
      size_t need = 0;
      if (!kernels::ShouldUsePagedAttentionV1(plan.num_decode, heads, plan.max_decode_len))
        need = kernels::PagedAttentionV2WorkspaceBytes(plan.num_decode, heads, config_.head_size,
                                                       plan.max_decode_len);
      if (!device_views_.empty()) {
        kernels::PagedAttentionParams p;
        p.cache = device_views_[0];
        p.num_seqs = plan.num_decode;
        p.num_heads = heads;
        p.max_seq_len = plan.max_decode_len;
        p.io_dtype = AttentionIoDType(device_views_[0]);
        // An invalid override fails the attention call itself.
        const kernels::DecodeKernel k =
            kernels::ChooseDecodeKernel(
                p, kernels::DecodeKernelFromEnvironment().value_or(kernels::DecodeKernel::kAuto))
                .kernel;
        if (k == kernels::DecodeKernel::kV2)
          need = kernels::PagedAttentionV2WorkspaceBytes(plan.num_decode, heads, config_.head_size,
                                                         plan.max_decode_len);
        if (k == kernels::DecodeKernel::kGqa || k == kernels::DecodeKernel::kGqaMma)
          need =
              std::max(need, kernels::PagedAttentionGqaWorkspaceBytes(
                                 plan.num_decode, heads, config_.head_size, plan.max_decode_len));
      }
      if (need > 0)
        PS_RETURN_IF_ERROR(workspace_.Reserve(need, "decode attention workspace allocation"));
    }
    return absl::OkStatus();
  }

  // The io_dtype of the kernel params for `cache`: fp32 for fp8 caches, unset
  // (= the cache's type) otherwise.
  static std::optional<kernels::DType> AttentionIoDType(const kernels::KVCacheView& cache) {
    return kernels::IsFp8(cache.shape.dtype) ? std::optional(kernels::DType::kFloat32)
                                             : std::nullopt;
  }

  // The step's rotary tables on the device ([n, rope_half] each): the
  // global ones, or with `local` the local layers' (Gemma 3).
  struct RopeTables {
    const float* cos;
    const float* sin;
  };
  // InvalidArgument when the plan has no tables of that kind for its n tokens.
  absl::StatusOr<RopeTables> Rope(bool local, int64_t n) const {
    const std::vector<float>& c = local ? plan_->rope_cos_local : plan_->rope_cos;
    if (n > 0 && (plan_->rope_half <= 0 || c.size() < static_cast<size_t>(n) * plan_->rope_half))
      return absl::InvalidArgumentError(absl::StrCat("ApplyRope: the plan has no ",
                                                     local ? "local " : "", "rotary tables for ", n,
                                                     " tokens"));
    if (local) return RopeTables{In<float>(kRopeCosLocal), In<float>(kRopeSinLocal)};
    return RopeTables{In<float>(kRopeCos), In<float>(kRopeSin)};
  }

  // Where RopeAttentionFrom reads token t's projections: q[t * q_stride],
  // k / v[t * kv_stride], each + its bias when not null (fp32).
  struct QkvRows {
    const float *q, *k, *v;
    int64_t q_stride, kv_stride;
    const float *q_bias = nullptr, *k_bias = nullptr, *v_bias = nullptr;
  };

  // RoPE of the queries into the attention operand type (attn_q_, or the
  // fp32 `q_out` [n, q_dim] for an fp32 / fp8 cache), RoPE of the keys with
  // the cache write of keys and values, then the attention into `out`.
  absl::Status RopeAttentionFrom(const kernels::KVCacheView& cache, const LayerAttention& layer,
                                 int64_t n, int num_heads, const QkvRows& in, float* q_out,
                                 GemmInput out) {
    const int D = cache.shape.head_size;
    const int64_t q_dim = static_cast<int64_t>(num_heads) * D;
    const Elem io = AttentionIoElem(cache.shape.dtype);
    void* qa = q_out;
    if (io != Elem::kF32) {
      PS_RETURN_IF_ERROR(attn_q_.Reserve(
          std::max<size_t>(static_cast<size_t>(n * q_dim) * cuda_model::ElemBytes(io), 4),
          "query conversion allocation"));
      qa = attn_q_.get();
    }
    PS_ASSIGN_OR_RETURN(const RopeTables tables, Rope(layer.local_rope, n));
    PS_RETURN_IF_ERROR(
        CudaStatus(cuda_model::LaunchRopeConvert(in.q, static_cast<int>(n), num_heads, D, RotHalf(),
                                                 in.q_stride, in.q_bias, tables.cos, tables.sin, qa,
                                                 io, stream_),
                   "rope + query conversion launch"));
    PS_RETURN_IF_ERROR(CudaStatus(
        cuda_model::LaunchRopeReshapeAndCache(
            in.k, in.v, in.kv_stride, in.k_bias, in.v_bias, static_cast<int>(n),
            cache.shape.num_kv_heads, D, RotHalf(), tables.cos, tables.sin, In<int64_t>(kSlots),
            cache.shape.num_blocks, cache.shape.block_size, cache.key_cache, cache.value_cache,
            CacheTypeOf(cache.shape.dtype), cache.k_scale, cache.v_scale, stream_),
        "rope + reshape_and_cache launch"));
    return RunAttention(cache, layer, num_heads, qa, out);
  }

  // The attention kernels over `cache`, whose step's keys and values are
  // written: decode attention for the plan's decode sequences, prefill
  // attention for the rest, from the queries qa in the cache's operand type
  // (AttentionIoElem), into out (GEMM input [n, q_dim]). The kernels write
  // their output in the operand type `io`: straight into `out` when that is
  // the GEMM-input type (a 16-bit model with a cache of its dtype), else
  // into attn_out_ and converted.
  absl::Status RunAttention(const kernels::KVCacheView& cache, const LayerAttention& layer,
                            int num_heads, const void* qa, GemmInput out) {
    const ForwardPlan& plan = *plan_;
    const ForwardBatch& b = *plan.batch;
    const int64_t n = plan.num_tokens;
    const int64_t q_dim = static_cast<int64_t>(num_heads) * cache.shape.head_size;
    const Elem io = AttentionIoElem(cache.shape.dtype);
    const std::optional<kernels::DType> io_dtype = AttentionIoDType(cache);
    // The block tables, lengths and query offsets are the same for every
    // layer of the step: the kernels' host-side checks run for the step's
    // first attention call, and again only for a layer whose pool is smaller
    // than every one checked so far (block ids are checked against it).
    const bool validate = !step_validated_ || cache.shape.num_blocks < validated_blocks_;
    if (validate) validated_blocks_ = cache.shape.num_blocks;
    step_validated_ = true;
    void* oa = out.data;
    if (io != gemm_elem_) {
      PS_RETURN_IF_ERROR(attn_out_.Reserve(
          std::max<size_t>(static_cast<size_t>(n * q_dim) * cuda_model::ElemBytes(io), 4),
          "attention output allocation"));
      oa = attn_out_.get();
    }
    const int M = b.max_blocks_per_seq;
    if (plan.num_decode > 0)
      PS_RETURN_IF_ERROR(
          kernels::PagedAttention(DecodeParams(cache, layer, num_heads, qa, oa, validate)));
    if (plan.num_prefill > 0) {
      const int64_t bt_off = static_cast<int64_t>(plan.num_decode) * M;
      const int64_t row_off =
          static_cast<int64_t>(plan.prefill_row0) * q_dim * cuda_model::ElemBytes(io);
      kernels::PrefillAttentionParams pf;
      pf.out = static_cast<char*>(oa) + row_off;
      pf.query = static_cast<const char*>(qa) + row_off;
      pf.num_seqs = plan.num_prefill;
      pf.num_heads = num_heads;
      pf.query_start_loc = In<int32_t>(kPrefillQsl);
      pf.seq_lens = In<int32_t>(kSeqLens) + plan.num_decode;
      pf.cache = cache;
      pf.io_dtype = io_dtype;
      pf.block_tables = In<int32_t>(kBlockTables) + bt_off;
      pf.max_blocks_per_seq = M;
      pf.max_query_len = plan.max_prefill_query_len;
      pf.max_seq_len = plan.max_prefill_len;
      pf.scale = plan.attention_scale;
      pf.sliding_window = layer.sliding_window;
      pf.logit_softcap = layer.logit_softcap;
      if (validate) {
        pf.host_query_start_loc = plan.prefill_query_start_loc.data();
        pf.host_seq_lens = b.seq_lens.data() + plan.num_decode;
        pf.host_block_tables = b.block_tables.data() + bt_off;
      }
      pf.stream = stream_;
      PS_RETURN_IF_ERROR(kernels::PrefillAttention(pf));
    }
    if (io == gemm_elem_) return absl::OkStatus();
    return CudaStatus(cuda_model::LaunchConvert(oa, io, n * q_dim, out.data, gemm_elem_, stream_),
                      "attention output conversion");
  }

  // The decode attention of the plan's decode sequences over `cache`, from
  // qa into oa; with `validate`, the host copies of the block tables and
  // lengths for the kernels' checks.
  kernels::PagedAttentionParams DecodeParams(const kernels::KVCacheView& cache,
                                             const LayerAttention& layer, int num_heads,
                                             const void* qa, void* oa, bool validate) const {
    const ForwardPlan& plan = *plan_;
    const ForwardBatch& b = *plan.batch;
    kernels::PagedAttentionParams pa;
    pa.out = oa;
    pa.query = qa;
    pa.num_seqs = plan.num_decode;
    pa.num_heads = num_heads;
    pa.cache = cache;
    pa.io_dtype = AttentionIoDType(cache);
    pa.block_tables = In<int32_t>(kBlockTables);
    pa.max_blocks_per_seq = b.max_blocks_per_seq;
    pa.seq_lens = In<int32_t>(kSeqLens);
    pa.max_seq_len = plan.max_decode_len;
    pa.scale = plan.attention_scale;
    pa.sliding_window = layer.sliding_window;
    pa.logit_softcap = layer.logit_softcap;
    if (validate) {
      pa.host_block_tables = b.block_tables.data();
      pa.host_seq_lens = b.seq_lens.data();
    }
    pa.workspace = workspace_.get();
    pa.workspace_bytes = workspace_.bytes();
    pa.stream = stream_;
    return pa;
  }

  // The host-side checks a replayed body skips (RunAttention's first-layer
  // validation): the padded step's block tables and lengths against the
  // smallest pool among the layers.
  absl::Status ValidateReplayedStep(std::span<const kernels::KVCacheView> kv_layers) const {
    if (kv_layers.empty()) return absl::OkStatus();
    const kernels::KVCacheView* smallest = &kv_layers[0];
    for (const kernels::KVCacheView& v : kv_layers)
      if (v.shape.num_blocks < smallest->shape.num_blocks) smallest = &v;
    // The operand pointers are only checked for being set.
    return kernels::ValidatePagedAttention(DecodeParams(
        *smallest, LayerAttention{}, shard_.num_heads, inputs_.get(), inputs_.get(), true));
  }

  // Every address a captured body reads or writes besides the weights: the
  // step inputs, the activation and scratch buffers (with their sizes, which
  // bound the kernels' workspaces) and the cache views. A graph replays only
  // over the same list.
  std::vector<uintptr_t> BodyAddresses(std::span<const kernels::KVCacheView> kv_layers) {
    std::vector<uintptr_t> a;
    auto add = [&](const void* p, size_t bytes) {
      a.push_back(reinterpret_cast<uintptr_t>(p));
      a.push_back(bytes);
    };
    for (const void* p : d_in_) add(p, 0);
    for (const DeviceBuffer* b : StepBuffers()) add(b->get(), b->bytes());
    // The cache views, with what their kernels take as launch arguments
    // (the fp8 scales by their bits).
    for (const kernels::KVCacheView& v : kv_layers) {
      uint32_t k_scale = 0, v_scale = 0;
      std::memcpy(&k_scale, &v.k_scale, sizeof(k_scale));
      std::memcpy(&v_scale, &v.v_scale, sizeof(v_scale));
      add(v.key_cache, static_cast<size_t>(v.shape.num_blocks));
      add(v.value_cache, static_cast<size_t>(v.shape.dtype));
      a.insert(a.end(), {static_cast<uintptr_t>(v.shape.num_kv_heads),
                         static_cast<uintptr_t>(v.shape.head_size),
                         static_cast<uintptr_t>(v.shape.block_size), k_scale, v_scale});
    }
    return a;
  }

  // The step's block tables into block_tables_, which keeps the table of
  // the previous step: only the rows that differ go up (ChangedRowRanges;
  // in steady decoding, a sequence's row changes when it starts a block),
  // each run of them from pinned staging in one asynchronous copy. A new
  // width or more rows than the buffer holds uploads the whole table: the
  // width is fixed in graph-replayed decode steps (the context bucket's),
  // while an eager step's is its longest sequence's block count.
  absl::Status UploadBlockTables(const ForwardBatch& b) {
    const int rows = b.num_seqs(), width = b.max_blocks_per_seq;
    const size_t bytes = b.block_tables.size() * sizeof(int32_t);
    if (width != held_table_width_ || bytes > block_tables_.bytes()) {
      held_table_.clear();
      held_table_width_ = width;
    }
    if (rows == 0 || width < 1) return absl::OkStatus();
    // Geometric growth, so that a batch growing by a sequence a step does
    // not reallocate (and drop the graphs) every step.
    if (bytes > block_tables_.bytes())
      PS_RETURN_IF_ERROR(block_tables_.Reserve(std::max(bytes, 2 * block_tables_.bytes()),
                                               "block table allocation"));
    // On its own condition: a failed pinned allocation is retried next step.
    if (pinned_tables_.bytes() < block_tables_.bytes())
      PS_RETURN_IF_ERROR(
          pinned_tables_.Reserve(block_tables_.bytes(), "pinned block table allocation"));
    const std::vector<RowRange> ranges =
        ChangedRowRanges(held_table_, b.block_tables, rows, width, kMaxBlockTableCopies);
    const size_t row_bytes = static_cast<size_t>(width) * sizeof(int32_t);
    char* staged = static_cast<char*>(pinned_tables_.get());
    char* device = static_cast<char*>(block_tables_.get());
    for (const RowRange& r : ranges) {
      const size_t offset = static_cast<size_t>(r.begin) * row_bytes;
      const size_t count = static_cast<size_t>(r.end - r.begin) * row_bytes;
      std::memcpy(staged + offset, b.block_tables.data() + static_cast<size_t>(r.begin) * width,
                  count);
      absl::Status s = CudaStatus(
          cudaMemcpyAsync(device + offset, staged + offset, count, cudaMemcpyHostToDevice, stream_),
          "block table upload");
      if (!s.ok()) {
        held_table_.clear();  // some rows may have gone up: the next step uploads all
        return s;
      }
    }
    // What the device holds now: this step's rows, then any older ones.
    if (held_table_.size() < b.block_tables.size()) held_table_.resize(b.block_tables.size());
    std::copy(b.block_tables.begin(), b.block_tables.end(), held_table_.begin());
    return absl::OkStatus();
  }

  // Ends a capture whose body failed (EndBody, BeginStep after an abandoned
  // step, the destructor): the partial graph is dropped and the key stays
  // uncapturable. Nothing of the body ran, so the step's host-side checks
  // run again in an eager retry.
  void AbandonCapture() {
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph != nullptr) cudaGraphDestroy(graph);
    cudaGetLastError();  // clear the capture's error
    capturing_ = false;
    step_validated_ = false;
  }

  // Destroys every graph (a buffer they name is about to be freed, or the
  // backend is). After the communicator was aborted the graphs, whose
  // collectives belong to it, are forgotten instead: NCCL's resources of a
  // captured collective are released when its graph is destroyed, and the
  // worker is on its way out.
  void DropGraphs() {
    if (!comm_failed_)
      for (CapturedBody& g : graphs_) cudaGraphExecDestroy(g.exec);
    graphs_.clear();
    graph_bytes_ = 0;
  }

  int64_t graph_bytes() const override { return graph_bytes_; }

  // The device's free memory in bytes (cudaMemGetInfo), 0 when it fails.
  static size_t FreeDeviceBytes() {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return free;
  }

  // The communicator's asynchronous error (multi-rank groups); on one, the
  // graphs are forgotten (DropGraphs).
  absl::Status CheckCommunicator() {
    absl::Status s = comm_->CheckAsyncError();
    if (!s.ok()) {
      comm_failed_ = true;
      DropGraphs();
    }
    return s;
  }

  // The step buffers a captured body may read or write (BodyAddresses lists
  // their addresses; each drops the graphs before it grows).
  std::vector<DeviceBuffer*> StepBuffers() {
    std::vector<DeviceBuffer*> v;
    for (DeviceBuffer& b : buffers_) v.push_back(&b);
    for (DeviceBuffer* b : {&inputs_, &workspace_, &gemm_input_, &attn_q_, &attn_k_, &attn_v_,
                            &attn_out_, &fused_out_, &head_norm_, &block_tables_})
      v.push_back(b);
    return v;
  }

  // Matrices with the same columns and element type uploaded stacked by rows
  // into one allocation, each handle a row range of it (DeviceMatrix::fused),
  // so that they run as one GEMM (StackedGemm). Matrices that do not match
  // (mixed forms) upload one by one.
  absl::Status UploadStacked(std::initializer_list<const Matrix*> ms,
                             std::initializer_list<std::string> names, BackendMatrix** out) {
    const Matrix& first = **ms.begin();
    bool same = true;
    for (const Matrix* m : ms)
      same = same && m->cols == first.cols && m->is_fp32() == first.is_fp32() &&
             (m->is_fp32() || (m->type == first.type && m->bytes() != nullptr &&
                               (m->type == GgmlType::kF16 || m->type == GgmlType::kBF16) &&
                               m->row_bytes == static_cast<uint64_t>(m->cols) * 2));
    if (!same) {
      auto name = names.begin();
      int i = 0;
      for (const Matrix* m : ms) {
        PS_ASSIGN_OR_RETURN(*out[i++], UploadMatrix(*m, *name++));
      }
      return absl::OkStatus();
    }
    const Elem type = first.is_fp32()                ? Elem::kF32
                      : first.type == GgmlType::kF16 ? Elem::kF16
                                                     : Elem::kBF16;
    const size_t elem = static_cast<size_t>(cuda_model::ElemBytes(type));
    if (type != Elem::kF32) {
      has_16bit_weights_ = true;
    }
    int64_t rows = 0;
    for (const Matrix* m : ms) rows += m->rows;
    const std::string what = absl::StrCat("upload of ", *names.begin(), " (stacked)");
    DeviceBuffer buf;
    PS_RETURN_IF_ERROR(
        buf.Reserve(std::max<size_t>(static_cast<size_t>(rows * first.cols) * elem, 4), what));
    char* dst = static_cast<char*>(buf.get());
    for (const Matrix* m : ms) {
      const size_t bytes = static_cast<size_t>(m->rows * m->cols) * elem;
      const void* src = m->is_fp32() ? static_cast<const void*>(m->data.data()) : m->bytes();
      if (m->is_fp32() && static_cast<int64_t>(m->data.size()) != m->rows * m->cols)
        return absl::InvalidArgumentError(absl::StrCat(
            what, ": ", m->data.size(), " fp32 values for [", m->rows, ", ", m->cols, "]"));
      PS_RETURN_IF_ERROR(CudaStatus(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice), what));
      dst += bytes;
    }
    weight_bytes_ += static_cast<int64_t>(static_cast<size_t>(rows * first.cols) * elem);
    matrices_.push_back(DeviceMatrix{buf.get(), type, rows, first.cols});
    const DeviceMatrix* parent = &matrices_.back();
    const char* base = static_cast<const char*>(buf.get());
    int64_t row0 = 0;
    int i = 0;
    for (const Matrix* m : ms) {
      matrices_.push_back(DeviceMatrix{base + static_cast<size_t>(row0 * first.cols) * elem, type,
                                       m->rows, m->cols, parent, row0});
      *out[i++] = BackendMatrix{&matrices_.back(), m->rows, m->cols};
      row0 += m->rows;
    }
    weights_.push_back(std::move(buf));
    return absl::OkStatus();
  }

  // The stacked matrix `outs` covers exactly, in order (rows of one
  // UploadStacked call), or null.
  static const DeviceMatrix* FusedParent(std::span<const LinearOut> outs) {
    if (outs.size() < 2) return nullptr;
    const DeviceMatrix* parent = M(outs[0].w).fused;
    int64_t row = 0;
    for (const LinearOut& o : outs) {
      const DeviceMatrix& w = M(o.w);
      if (parent == nullptr || w.fused != parent || w.fused_row0 != row) return nullptr;
      row += w.rows;
    }
    return row == parent->rows ? parent : nullptr;
  }

  // x (`count` values of `from`) in element type `type` on the stream: x
  // itself when the types agree, else a conversion into `buf` (grown as
  // needed).
  absl::StatusOr<const void*> ConvertActivations(const void* x, Elem from, int64_t count, Elem type,
                                                 DeviceBuffer* buf, absl::string_view what) {
    if (type == from) return x;
    PS_RETURN_IF_ERROR(
        buf->Reserve(std::max<size_t>(static_cast<size_t>(count) * cuda_model::ElemBytes(type), 4),
                     absl::StrCat(what, " allocation")));
    PS_RETURN_IF_ERROR(
        CudaStatus(cuda_model::LaunchConvert(x, from, count, buf->get(), type, stream_), what));
    return static_cast<const void*>(buf->get());
  }

  // fused_out_ [n, parent.rows] (fp32) = x parent^T: one GEMM over the rows
  // stacked at load (UploadStacked), n <= kFusedGemmMaxTokens.
  absl::StatusOr<float*> StackedGemm(GemmInput x, int64_t n, const DeviceMatrix& parent) {
    PS_ASSIGN_OR_RETURN(const void* xin,
                        ConvertActivations(x.data, gemm_elem_, n * parent.cols, parent.type,
                                           &gemm_input_, "GEMM input conversion"));
    PS_RETURN_IF_ERROR(fused_out_.Reserve(
        std::max<size_t>(static_cast<size_t>(n * parent.rows) * sizeof(float), 4),
        "fused GEMM output allocation"));
    float* y = static_cast<float*>(fused_out_.get());
    PS_RETURN_IF_ERROR(Gemm(xin, n, parent, y));
    return y;
  }

  static ActivationType TypeOf(Elem e) {
    switch (e) {
      case Elem::kF16: return ActivationType::kFloat16;
      case Elem::kBF16: return ActivationType::kBFloat16;
      case Elem::kF32: break;
    }
    return ActivationType::kFloat32;
  }

  // Activation buffer `id` grown to `bytes` (at least 4).
  absl::StatusOr<void*> GrowBuffer(BufferId id, int64_t bytes) {
    DeviceBuffer& b = buffers_[static_cast<size_t>(id)];
    PS_RETURN_IF_ERROR(
        b.Reserve(std::max<size_t>(static_cast<size_t>(bytes), 4), "activation buffer allocation"));
    return b.get();
  }

  // y[n, W.rows] (of y_type) = x[n, W.cols] W^T, row-major, x already in
  // W's element type. In cuBLAS' column-major terms: Y^T (W.rows x n, ld
  // W.rows) = op_T(W as cols x rows, ld cols) * X^T (cols x n, ld cols).
  // fp32: SGEMM (y_type fp32 only); fp16/bf16: GemmEx with fp32
  // accumulation (tensor cores), the output fp32 or W's type (rounded once).
  absl::Status Gemm(const void* x, int64_t n, const DeviceMatrix& w, void* y,
                    Elem y_type = Elem::kF32) {
    if (n == 0) return absl::OkStatus();
    const float alpha = 1.0f, beta = 0.0f;
    const int m = static_cast<int>(w.rows), nn = static_cast<int>(n), k = static_cast<int>(w.cols);
    if (y_type != Elem::kF32 && y_type != w.type)
      return absl::InternalError("GEMM output type differs from the weights' 16-bit type");
    if (w.type == Elem::kF32)
      return CublasStatus(
          blas_->sgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha,
                       static_cast<const float*>(w.data), k, static_cast<const float*>(x), k, &beta,
                       static_cast<float*>(y), m),
          "cublasSgemm");
    const cudaDataType t = CudaType(w.type);
    return CublasStatus(
        blas_->gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha, w.data, t, k, x, t, k,
                       &beta, y, CudaType(y_type), m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx");
  }

  // Waits for the step's work on the stream. With a multi-rank NCCL group
  // it polls the stream and the communicator's asynchronous error, so that
  // a peer that died mid-collective makes this step fail (the communicator
  // is aborted) instead of blocking forever.
  absl::Status WaitForStep() {
    PS_RETURN_IF_ERROR(WaitForStream("forward pass"));
    step_pending_ = false;
    return absl::OkStatus();
  }

  // Waits for the work queued on the stream so far (WaitForStep's rule:
  // with a multi-rank group, polling the communicator's asynchronous error).
  absl::Status WaitForStream(absl::string_view what) {
    if (comm_->size() <= 1) return CudaStatus(cudaStreamSynchronize(stream_), what);
    for (int spin = 0;; ++spin) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) return absl::OkStatus();
      if (e != cudaErrorNotReady) return CudaStatus(e, what);
      PS_RETURN_IF_ERROR(CheckCommunicator());
      // Spin (yielding) for the first few milliseconds, about a decode
      // step, then poll every 20 us.
      if (spin < 20000) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    }
  }

  Communicator* comm_;
  int device_;
  ModelConfig config_;
  ShardLayout shard_;
  cudaStream_t stream_ = nullptr;  // the compute stream (blocking, see Init)
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
  // The rotary pairs per head of this step's tables (ForwardPlan::rope_half:
  // head_size / 2, or less for partial rotary).
  int RotHalf() const { return plan_ != nullptr ? plan_->rope_half : 0; }
  std::array<const void*, kInputCount> d_in_{};
  std::array<DeviceBuffer, static_cast<size_t>(BufferId::kCount)> buffers_;
  DeviceBuffer inputs_, workspace_, logits_;
  // 16-bit copies of activations: the GEMM input, attention operands.
  DeviceBuffer gemm_input_, attn_q_, attn_k_, attn_v_, attn_out_, fused_out_;
  DeviceBuffer head_norm_;  // HeadRmsNorm's fp32 output before the copy back
  // MoeMlp's scratch (ReserveMoeScratch) and each chunk's routing.
  struct MoeBuffers {
    DeviceBuffer logits, tables, rows, act, gate, up, pair_out, shared_act, shared_out,
        shared_logit;
    PinnedBuffer host_logits, host_tables;
  } moe_;
  std::vector<MoeRouting> moe_routing_;
  DeviceBuffer argmax_, sample_in_;  // LmHeadSample's ids and sampling inputs
  PinnedBuffer host_inputs_, pinned_logits_, pinned_argmax_, pinned_sample_in_;
  DeviceBuffer cublas_workspace_;
  // The block tables the device holds (UploadBlockTables): the buffer, the
  // host copy of its rows and their width, and the staging of changed rows.
  DeviceBuffer block_tables_;
  PinnedBuffer pinned_tables_;
  std::vector<int32_t> held_table_;
  int held_table_width_ = 0;
  // CUDA graphs of decode bodies (BeginBody / EndBody), by padded shape.
  struct CapturedBody {
    DecodeGraphKey key;
    std::vector<uintptr_t> addresses;  // BodyAddresses at capture
    cudaGraphExec_t exec = nullptr;
    int64_t bytes = 0;  // device memory it took (graph_bytes)
  };
  std::vector<CapturedBody> graphs_;
  int64_t graph_bytes_ = 0;                   // sum of graphs_' bytes
  size_t capture_free_before_ = 0;            // FreeDeviceBytes when the capture began
  std::vector<DecodeGraphKey> warmed_up_;     // keys whose first step ran eagerly
  std::optional<DecodeGraphKey> warming_up_;  // this step's key, running eagerly once
  std::vector<DecodeGraphKey> uncapturable_;  // keys whose capture failed (or is under way)
  bool capturing_ = false;
  bool comm_failed_ = false;  // CheckCommunicator saw an error (the communicator is aborted)
  DecodeGraphKey capture_key_;
  std::vector<uintptr_t> capture_addresses_;
  bool has_16bit_weights_ = false;  // some matrix runs through GemmEx
  Elem gemm_elem_ = Elem::kF32;     // GEMM-input activations (gemm_input_type)
  Elem sum_elem_ = Elem::kF32;      // partial sums (partial_sum_type)
  bool step_pending_ = false;       // BeginStep ran and WaitForStep has not succeeded since
  bool step_validated_ = false;     // this step's Attention has validated its index arrays
  int64_t validated_blocks_ = 0;    // against a pool of this many blocks
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
