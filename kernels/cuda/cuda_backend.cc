// The CUDA backend of kernels/backend.h: argument packing, the few CUDA-only
// preconditions (16-byte aligned cache buffers), v1's shared-memory fallback,
// copy_blocks' device-side tables and swap_blocks' memcpys. Every CUDA error
// becomes absl::InternalError carrying cudaGetErrorString; nothing aborts.
// Work is enqueued on the caller's stream (params.stream; null = the legacy
// default stream) and not waited for, except where CUDA itself synchronizes
// (copies from/to pageable host memory).
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/launch.h"
#include "kernels/paged_attention.h"

namespace pagedserve::kernels::cuda {
namespace {

cudaStream_t AsStream(void* s) { return static_cast<cudaStream_t>(s); }

Elem ToElem(DType t) {
  switch (t) {
    case DType::kFloat32: return Elem::kF32;
    case DType::kFloat16: return Elem::kF16;
    case DType::kBFloat16: return Elem::kBF16;
    case DType::kFloat8E4M3: return Elem::kFp8E4M3;
    case DType::kFloat8E5M2: return Elem::kFp8E5M2;
  }
  return Elem::kF32;
}

absl::Status CheckAligned(const void* p, size_t alignment, absl::string_view field) {
  if (reinterpret_cast<uintptr_t>(p) % alignment != 0)
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be ", alignment, "-byte aligned for the CUDA kernels"));
  return absl::OkStatus();
}

absl::Status CheckCache(const KVCacheView& c) {
  if (c.device != Device::kCUDA)
    return absl::InvalidArgumentError("cache.device must be kCUDA for the CUDA backend");
  if (auto s = CheckAligned(c.key_cache, 16, "cache.key_cache"); !s.ok()) return s;
  return CheckAligned(c.value_cache, 16, "cache.value_cache");
}

CacheArgs MakeCacheArgs(const KVCacheView& c) {
  CacheArgs a;
  a.key_cache = c.key_cache;
  a.value_cache = c.value_cache;
  a.num_kv_heads = c.shape.num_kv_heads;
  a.head_size = c.shape.head_size;
  a.block_size = c.shape.block_size;
  a.elem = ToElem(c.shape.dtype);
  a.k_scale = IsFp8(c.shape.dtype) ? c.k_scale : 1.0f;
  a.v_scale = IsFp8(c.shape.dtype) ? c.v_scale : 1.0f;
  return a;
}

DecodeArgs MakeDecodeArgs(const PagedAttentionParams& p) {
  DecodeArgs a;
  a.out = p.out;
  a.query = p.query;
  a.num_seqs = p.num_seqs;
  a.num_heads = p.num_heads;
  a.cache = MakeCacheArgs(p.cache);
  a.io = ToElem(ResolveIoDType(p.io_dtype, p.cache.shape.dtype));
  a.block_tables = p.block_tables;
  a.max_blocks_per_seq = p.max_blocks_per_seq;
  a.seq_lens = p.seq_lens;
  a.max_seq_len = p.max_seq_len;
  a.scale = p.scale;
  a.alibi_slopes = p.alibi_slopes;
  a.sliding_window = p.sliding_window;
  a.logit_softcap = p.logit_softcap;
  a.stream = AsStream(p.stream);
  return a;
}

// Workspace layout of kernels/paged_attention.h: max_logits [S, H, P], then
// exp_sums [S, H, P], then tmp_out [S, H, P, D], all fp32, back to back.
size_t WorkspaceBytes(const PagedAttentionParams& p) {
  return PagedAttentionV2WorkspaceBytes(p.num_seqs, p.num_heads, p.cache.shape.head_size,
                                        p.max_seq_len);
}

absl::Status RunV2(const PagedAttentionParams& p, void* workspace) {
  const size_t shp = static_cast<size_t>(p.num_seqs) * p.num_heads * NumPartitions(p.max_seq_len);
  float* max_logits = static_cast<float*>(workspace);
  float* exp_sums = max_logits + shp;
  float* tmp_out = exp_sums + shp;
  return CudaStatus(LaunchPagedAttentionV2(MakeDecodeArgs(p), max_logits, exp_sums, tmp_out),
                    "paged_attention_v2 launch");
}

// V2 with a stream-ordered temporary workspace (cudaMallocAsync/cudaFreeAsync).
absl::Status RunV2WithTemporaryWorkspace(const PagedAttentionParams& p) {
  void* ws = nullptr;
  cudaStream_t stream = AsStream(p.stream);
  if (auto s = CudaStatus(cudaMallocAsync(&ws, WorkspaceBytes(p), stream),
                          "paged_attention workspace allocation");
      !s.ok())
    return s;
  absl::Status status = RunV2(p, ws);
  absl::Status freed = CudaStatus(cudaFreeAsync(ws, stream), "paged_attention workspace free");
  return status.ok() ? freed : status;
}

}  // namespace

absl::Status ReshapeAndCache(const ReshapeAndCacheParams& p) {
  if (auto s = CheckCache(p.cache); !s.ok()) return s;
  if (p.num_tokens == 0) return absl::OkStatus();
  const KVCacheShape& sh = p.cache.shape;
  const int64_t row = static_cast<int64_t>(sh.num_kv_heads) * sh.head_size;
  const int64_t ks = p.key_token_stride != 0 ? p.key_token_stride : row;
  const int64_t vs = p.value_token_stride != 0 ? p.value_token_stride : row;
  return CudaStatus(
      LaunchReshapeAndCache(p.key, p.value, ks, vs, p.slot_mapping, sh.num_blocks * sh.block_size,
                            p.num_tokens, p.cache.key_cache, p.cache.value_cache, sh.num_kv_heads,
                            sh.head_size, sh.block_size, ToElem(sh.dtype),
                            ToElem(ResolveIoDType(p.io_dtype, sh.dtype)), p.cache.k_scale,
                            p.cache.v_scale, AsStream(p.stream)),
      "reshape_and_cache launch");
}

absl::Status PagedAttentionV1(const PagedAttentionParams& p) {
  if (auto s = CheckCache(p.cache); !s.ok()) return s;
  if (p.num_seqs == 0) return absl::OkStatus();
  size_t max_smem = 0;
  if (auto s = CudaStatus(
          DecodeV1MaxSharedBytes(ToElem(ResolveIoDType(p.io_dtype, p.cache.shape.dtype)),
                                 ToElem(p.cache.shape.dtype), p.cache.shape.head_size, &max_smem),
          "paged_attention_v1 shared memory query");
      !s.ok())
    return s;
  // v1 keeps one fp32 logit per context token in shared memory. Contexts too
  // long for the device (about 55K tokens on sm_90) take the partitioned path,
  // which computes the same softmax in 512-token pieces.
  if (DecodeV1SharedBytes(p.max_seq_len) > max_smem) return RunV2WithTemporaryWorkspace(p);
  return CudaStatus(LaunchPagedAttentionV1(MakeDecodeArgs(p)), "paged_attention_v1 launch");
}

absl::Status PagedAttentionV2(const PagedAttentionParams& p) {
  if (auto s = CheckCache(p.cache); !s.ok()) return s;
  if (p.num_seqs == 0) return absl::OkStatus();
  // No workspace, or one the caller says is too small for this shape: a
  // stream-ordered temporary one (PagedAttentionParams::workspace_bytes).
  if (p.workspace == nullptr || (p.workspace_bytes != 0 && p.workspace_bytes < WorkspaceBytes(p)))
    return RunV2WithTemporaryWorkspace(p);
  if (auto s = CheckAligned(p.workspace, alignof(float), "workspace"); !s.ok()) return s;
  return RunV2(p, p.workspace);
}

// GQA decode: plan the context splits from the device's occupancy and the
// workspace the caller gave (kernels/cuda/gqa_decode_plan.h), then launch.
absl::Status PagedAttentionGqa(const PagedAttentionParams& p, bool tensor_cores) {
  if (auto s = CheckCache(p.cache); !s.ok()) return s;
  if (p.num_seqs == 0) return absl::OkStatus();
  const KVCacheShape& sh = p.cache.shape;
  const int group = p.num_heads / sh.num_kv_heads;
  int num_sms = 0, blocks_per_sm = 0;
  if (auto s = CudaStatus(GqaDecodeOccupancy(ToElem(sh.dtype), sh.head_size, group, &num_sms,
                                             &blocks_per_sm, tensor_cores),
                          "paged_attention_gqa occupancy query");
      !s.ok())
    return s;
  if (blocks_per_sm < 1)
    return absl::InvalidArgumentError(absl::StrCat(
        "paged_attention_gqa: group size ", group, " with head_size ", sh.head_size, " needs ",
        tensor_cores
            ? GqaMmaSharedBytes(sh.head_size)
            : GqaDecodeSharedBytes(sh.head_size, group, static_cast<int>(DTypeSize(sh.dtype))),
        " bytes of shared memory; the device fits none"));
  // Splits the caller's workspace holds (PagedAttentionParams::workspace_bytes,
  // default the v2 size); without a workspace, a temporary one of the planned size.
  int max_splits = kGqaMaxSplits;
  if (p.workspace != nullptr) {
    if (auto s = CheckAligned(p.workspace, alignof(float), "workspace"); !s.ok()) return s;
    const size_t bytes = p.workspace_bytes != 0 ? p.workspace_bytes : WorkspaceBytes(p);
    max_splits = GqaSplitsThatFit(bytes, p.num_seqs, p.num_heads, sh.head_size);
  }
  const GqaSplitPlan plan =
      PlanGqaSplits(num_sms, blocks_per_sm, p.num_seqs, sh.num_kv_heads, p.max_seq_len, max_splits);
  const DecodeArgs a = MakeDecodeArgs(p);
  if (plan.num_splits == 1)
    return CudaStatus(LaunchGqaDecode(a, plan, nullptr, nullptr, nullptr, tensor_cores),
                      "paged_attention_gqa launch");
  void* ws = p.workspace;
  cudaStream_t stream = AsStream(p.stream);
  if (ws == nullptr) {
    if (auto s = CudaStatus(
            cudaMallocAsync(
                &ws, GqaWorkspaceBytes(p.num_seqs, p.num_heads, sh.head_size, plan.num_splits),
                stream),
            "paged_attention_gqa workspace allocation");
        !s.ok())
      return s;
  }
  const size_t shp = static_cast<size_t>(p.num_seqs) * p.num_heads * plan.num_splits;
  float* max_logits = static_cast<float*>(ws);
  float* exp_sums = max_logits + shp;
  float* tmp_out = exp_sums + shp;
  absl::Status status =
      CudaStatus(LaunchGqaDecode(a, plan, max_logits, exp_sums, tmp_out, tensor_cores),
                 "paged_attention_gqa launch");
  if (p.workspace == nullptr) {
    absl::Status freed =
        CudaStatus(cudaFreeAsync(ws, stream), "paged_attention_gqa workspace free");
    if (status.ok()) status = freed;
  }
  return status;
}

absl::Status PrefillAttention(const PrefillAttentionParams& p, bool tensor_cores) {
  if (auto s = CheckCache(p.cache); !s.ok()) return s;
  if (p.num_seqs == 0) return absl::OkStatus();
  PrefillArgs a;
  a.out = p.out;
  a.query = p.query;
  a.query_token_stride = p.query_token_stride != 0
                             ? p.query_token_stride
                             : static_cast<int64_t>(p.num_heads) * p.cache.shape.head_size;
  a.num_seqs = p.num_seqs;
  a.num_heads = p.num_heads;
  a.query_start_loc = p.query_start_loc;
  a.seq_lens = p.seq_lens;
  a.cache = MakeCacheArgs(p.cache);
  a.io = ToElem(ResolveIoDType(p.io_dtype, p.cache.shape.dtype));
  a.block_tables = p.block_tables;
  a.max_blocks_per_seq = p.max_blocks_per_seq;
  a.max_query_len = p.max_query_len;
  a.scale = p.scale;
  a.alibi_slopes = p.alibi_slopes;
  a.sliding_window = p.sliding_window;
  a.logit_softcap = p.logit_softcap;
  a.stream = AsStream(p.stream);
  if (tensor_cores)
    return CudaStatus(LaunchPrefillAttentionMma(a), "prefill_attention (tensor cores) launch");
  return CudaStatus(LaunchPrefillAttention(a), "prefill_attention launch");
}

absl::Status CopyBlocks(std::span<const KVCacheView> layers, std::span<const BlockCopy> pairs,
                        void* stream) {
  if (layers.empty() || pairs.empty()) return absl::OkStatus();
  const size_t block_bytes = layers[0].shape.block_bytes();
  bool aligned16 = block_bytes % 16 == 0;
  // One host table: key pointers, value pointers (as uint64), then the pairs.
  const size_t L = layers.size(), N = pairs.size();
  std::vector<uint64_t> table(2 * L + 2 * N);
  for (size_t i = 0; i < L; ++i) {
    if (layers[i].device != Device::kCUDA)
      return absl::InvalidArgumentError(absl::StrCat("layers[", i, "].device must be kCUDA"));
    table[i] = reinterpret_cast<uintptr_t>(layers[i].key_cache);
    table[L + i] = reinterpret_cast<uintptr_t>(layers[i].value_cache);
    aligned16 = aligned16 && table[i] % 16 == 0 && table[L + i] % 16 == 0;
  }
  for (size_t j = 0; j < N; ++j) {
    table[2 * L + 2 * j] = static_cast<uint64_t>(pairs[j].src);
    table[2 * L + 2 * j + 1] = static_cast<uint64_t>(pairs[j].dst);
  }
  cudaStream_t s = AsStream(stream);
  void* dev = nullptr;
  const size_t bytes = table.size() * sizeof(uint64_t);
  if (auto st = CudaStatus(cudaMallocAsync(&dev, bytes, s), "copy_blocks table allocation");
      !st.ok())
    return st;
  // From pageable memory the copy is staged before cudaMemcpyAsync returns, so
  // `table` may go out of scope afterwards.
  absl::Status status =
      CudaStatus(cudaMemcpyAsync(dev, table.data(), bytes, cudaMemcpyHostToDevice, s),
                 "copy_blocks table upload");
  if (status.ok()) {
    const uint64_t* d = static_cast<const uint64_t*>(dev);
    status = CudaStatus(
        LaunchCopyBlocks(d, d + L, reinterpret_cast<const int64_t*>(d + 2 * L), static_cast<int>(L),
                         static_cast<int>(N), static_cast<int64_t>(block_bytes), aligned16, s),
        "copy_blocks launch");
  }
  absl::Status freed = CudaStatus(cudaFreeAsync(dev, s), "copy_blocks table free");
  return status.ok() ? freed : status;
}

absl::Status SwapBlocks(std::span<const KVCacheView> src, std::span<const KVCacheView> dst,
                        std::span<const BlockCopy> pairs, void* stream) {
  cudaStream_t s = AsStream(stream);
  for (size_t i = 0; i < src.size(); ++i) {
    const KVCacheView& a = src[i];
    const KVCacheView& b = dst[i];
    const size_t block_bytes = a.shape.block_bytes();
    cudaMemcpyKind kind;
    if (a.device == Device::kCUDA) {
      kind = b.device == Device::kCUDA ? cudaMemcpyDeviceToDevice : cudaMemcpyDeviceToHost;
    } else {
      kind = b.device == Device::kCUDA ? cudaMemcpyHostToDevice : cudaMemcpyHostToHost;
    }
    for (const BlockCopy& pc : pairs) {
      const size_t so = static_cast<size_t>(pc.src) * block_bytes;
      const size_t doff = static_cast<size_t>(pc.dst) * block_bytes;
      if (kind == cudaMemcpyHostToHost) {
        std::memcpy(static_cast<char*>(b.key_cache) + doff,
                    static_cast<const char*>(a.key_cache) + so, block_bytes);
        std::memcpy(static_cast<char*>(b.value_cache) + doff,
                    static_cast<const char*>(a.value_cache) + so, block_bytes);
        continue;
      }
      if (auto st = CudaStatus(
              cudaMemcpyAsync(static_cast<char*>(b.key_cache) + doff,
                              static_cast<const char*>(a.key_cache) + so, block_bytes, kind, s),
              "swap_blocks key copy");
          !st.ok())
        return st;
      if (auto st = CudaStatus(
              cudaMemcpyAsync(static_cast<char*>(b.value_cache) + doff,
                              static_cast<const char*>(a.value_cache) + so, block_bytes, kind, s),
              "swap_blocks value copy");
          !st.ok())
        return st;
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedserve::kernels::cuda
