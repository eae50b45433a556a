// Public kernel entry points: validate at the API boundary, then run the
// backend that matches KVCacheView::device (kernels/backend.h). Nothing is
// written when validation fails.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "kernels/backend.h"
#include "kernels/cache_ops.h"
#include "kernels/cuda/gqa_decode_plan.h"  // pure C++: GQA shared memory and split bounds
#include "kernels/cuda/prefill_attention_mma_plan.h"  // pure C++: PrefillMmaBuiltFor
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"
#include "kernels/reshape_and_cache.h"

namespace pagedserve::kernels {
namespace {

#ifndef PAGEDSERVE_WITH_CUDA
absl::Status NoCuda() {
  return absl::FailedPreconditionError("kCUDA cache view, but pagedserve was built without CUDA");
}
#endif

absl::Status Invalid(absl::string_view op, auto&&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", parts...));
}

absl::Status CheckCache(absl::string_view op, const KVCacheView& cache) {
  absl::Status st = ValidateCacheView(cache);
  if (!st.ok()) return Invalid(op, st.message());
  return absl::OkStatus();
}

absl::Status CheckHeads(absl::string_view op, int num_heads, int num_kv_heads) {
  if (num_heads <= 0) return Invalid(op, "num_heads must be > 0, got ", num_heads);
  if (num_heads % num_kv_heads != 0)
    return Invalid(op, "num_heads (", num_heads, ") must be a multiple of cache.num_kv_heads (",
                   num_kv_heads, ")");
  return absl::OkStatus();
}

// A token stride of 0 means "packed" (`row` elements); otherwise it must be at
// least `row` (`row_name` says what row is made of, for the message).
absl::Status CheckTokenStride(absl::string_view op, absl::string_view field, int64_t stride,
                              int64_t row, absl::string_view row_name) {
  if (stride < 0 || (stride != 0 && stride < row))
    return Invalid(op, field, " ", stride, " is smaller than ", row_name, " = ", row);
  return absl::OkStatus();
}

// Checks the block-table rows of `num_seqs` sequences whose context lengths are
// given by len(s): every used entry must name a block in [0, num_blocks).
template <typename LenFn>
absl::Status CheckBlockTables(absl::string_view op, const int32_t* bt, int num_seqs,
                              int max_blocks_per_seq, const KVCacheShape& cs, LenFn len) {
  for (int s = 0; s < num_seqs; ++s) {
    const int64_t used = (static_cast<int64_t>(len(s)) + cs.block_size - 1) / cs.block_size;
    for (int64_t i = 0; i < used; ++i) {
      const int32_t b = bt[static_cast<int64_t>(s) * max_blocks_per_seq + i];
      if (b < 0 || b >= cs.num_blocks)
        return Invalid(op, "block_tables[", s, "][", i, "] = ", b, " is outside the pool [0, ",
                       cs.num_blocks, ")");
    }
  }
  return absl::OkStatus();
}

// Checks shared by decode and prefill attention (PagedAttentionParams and
// PrefillAttentionParams name these fields alike): the cache view, num_seqs,
// num_heads and, when there is work, the pointers, max_blocks_per_seq and scale.
template <typename Params>
absl::Status CheckAttentionCommon(absl::string_view op, const Params& p) {
  if (absl::Status st = CheckCache(op, p.cache); !st.ok()) return st;
  if (absl::Status st = ValidateIoDType(p.io_dtype, p.cache.shape.dtype); !st.ok())
    return Invalid(op, st.message());
  if (p.num_seqs < 0) return Invalid(op, "num_seqs must be >= 0, got ", p.num_seqs);
  if (absl::Status st = CheckHeads(op, p.num_heads, p.cache.shape.num_kv_heads); !st.ok())
    return st;
  if (p.num_seqs == 0) return absl::OkStatus();
  if (p.out == nullptr) return Invalid(op, "out is null");
  if (p.query == nullptr) return Invalid(op, "query is null");
  if (p.block_tables == nullptr) return Invalid(op, "block_tables is null");
  if (p.seq_lens == nullptr) return Invalid(op, "seq_lens is null");
  if (p.max_blocks_per_seq <= 0)
    return Invalid(op, "max_blocks_per_seq must be > 0, got ", p.max_blocks_per_seq);
  if (!std::isfinite(p.scale)) return Invalid(op, "scale must be finite, got ", p.scale);
  if (p.sliding_window < 0)
    return Invalid(op, "sliding_window must be >= 0 (0 = none), got ", p.sliding_window);
  if (!(p.logit_softcap >= 0) || !std::isfinite(p.logit_softcap))
    return Invalid(op, "logit_softcap must be finite and >= 0 (0 = none), got ", p.logit_softcap);
  return absl::OkStatus();
}

// seq_lens[s] = len must fit max_seq_len and the block-table row of the sequence.
template <typename Params>
absl::Status CheckSeqLenFits(absl::string_view op, const Params& p, int s, int32_t len) {
  const int block_size = p.cache.shape.block_size;
  if (len > p.max_seq_len)
    return Invalid(op, "seq_lens[", s, "] = ", len, " exceeds max_seq_len ", p.max_seq_len);
  if (len > static_cast<int64_t>(p.max_blocks_per_seq) * block_size)
    return Invalid(op, "seq_lens[", s, "] = ", len, " is longer than the block table (",
                   p.max_blocks_per_seq, " blocks of ", block_size, " tokens)");
  return absl::OkStatus();
}

absl::Status ValidateDecode(absl::string_view op, const PagedAttentionParams& p) {
  if (absl::Status st = CheckAttentionCommon(op, p); !st.ok()) return st;
  if (p.num_seqs == 0) return absl::OkStatus();
  if (p.max_seq_len <= 0) return Invalid(op, "max_seq_len must be > 0, got ", p.max_seq_len);
  const KVCacheShape& cs = p.cache.shape;
  const bool on_host = p.cache.device == Device::kCPU;
  const int32_t* seq_lens = on_host ? p.seq_lens : p.host_seq_lens;
  const int32_t* block_tables = on_host ? p.block_tables : p.host_block_tables;
  if (seq_lens == nullptr) return absl::OkStatus();  // kCUDA without host copies
  for (int s = 0; s < p.num_seqs; ++s) {
    const int32_t len = seq_lens[s];
    if (len < 1) return Invalid(op, "seq_lens[", s, "] = ", len, " must be >= 1");
    if (absl::Status st = CheckSeqLenFits(op, p, s, len); !st.ok()) return st;
  }
  if (block_tables == nullptr) return absl::OkStatus();
  return CheckBlockTables(op, block_tables, p.num_seqs, p.max_blocks_per_seq, cs,
                          [&](int s) { return seq_lens[s]; });
}

}  // namespace

// ---------------------------------------------------------------------------
// reshape_and_cache
// ---------------------------------------------------------------------------

absl::Status ReshapeAndCache(const ReshapeAndCacheParams& p) {
  constexpr absl::string_view op = "reshape_and_cache";
  if (absl::Status st = CheckCache(op, p.cache); !st.ok()) return st;
  if (absl::Status st = ValidateIoDType(p.io_dtype, p.cache.shape.dtype); !st.ok())
    return Invalid(op, st.message());
  const KVCacheShape& cs = p.cache.shape;
  if (p.num_tokens < 0) return Invalid(op, "num_tokens must be >= 0, got ", p.num_tokens);
  const int64_t row = static_cast<int64_t>(cs.num_kv_heads) * cs.head_size;
  if (absl::Status st = CheckTokenStride(op, "key_token_stride", p.key_token_stride, row,
                                         "num_kv_heads * head_size");
      !st.ok())
    return st;
  if (absl::Status st = CheckTokenStride(op, "value_token_stride", p.value_token_stride, row,
                                         "num_kv_heads * head_size");
      !st.ok())
    return st;
  if (p.num_tokens == 0) return absl::OkStatus();
  if (p.key == nullptr) return Invalid(op, "key is null");
  if (p.value == nullptr) return Invalid(op, "value is null");
  if (p.slot_mapping == nullptr) return Invalid(op, "slot_mapping is null");
  if (p.cache.device == Device::kCPU) {
    const int64_t slots = cs.num_blocks * cs.block_size;
    for (int t = 0; t < p.num_tokens; ++t)
      if (p.slot_mapping[t] >= slots)
        return Invalid(op, "slot_mapping[", t, "] = ", p.slot_mapping[t],
                       " is outside the pool (num_blocks * block_size = ", slots, ")");
    return cpu::ReshapeAndCache(p);
  }
#ifdef PAGEDSERVE_WITH_CUDA
  return cuda::ReshapeAndCache(p);
#else
  return NoCuda();
#endif
}

// ---------------------------------------------------------------------------
// Decode attention
// ---------------------------------------------------------------------------

absl::Status ValidatePagedAttention(const PagedAttentionParams& p) {
  return ValidateDecode("paged_attention", p);
}

size_t PagedAttentionV2WorkspaceBytes(int num_seqs, int num_heads, int head_size, int max_seq_len) {
  const size_t rows = static_cast<size_t>(num_seqs) * static_cast<size_t>(num_heads) *
                      static_cast<size_t>(NumPartitions(max_seq_len));
  return rows * (2 + static_cast<size_t>(head_size)) * sizeof(float);
}

bool ShouldUsePagedAttentionV1(int num_seqs, int num_heads, int max_seq_len) {
  return max_seq_len <= 8192 &&
         (NumPartitions(max_seq_len) == 1 || static_cast<int64_t>(num_seqs) * num_heads > 512);
}

absl::Status PagedAttentionV1(const PagedAttentionParams& p) {
  if (absl::Status st = ValidateDecode("paged_attention_v1", p); !st.ok()) return st;
  if (p.num_seqs == 0) return absl::OkStatus();
  if (p.cache.device == Device::kCPU) return cpu::PagedAttentionV1(p);
#ifdef PAGEDSERVE_WITH_CUDA
  return cuda::PagedAttentionV1(p);
#else
  return NoCuda();
#endif
}

absl::Status PagedAttentionV2(const PagedAttentionParams& p) {
  if (absl::Status st = ValidateDecode("paged_attention_v2", p); !st.ok()) return st;
  if (p.num_seqs == 0) return absl::OkStatus();
  if (p.cache.device == Device::kCPU) return cpu::PagedAttentionV2(p);
#ifdef PAGEDSERVE_WITH_CUDA
  if (p.workspace == nullptr)
    return Invalid("paged_attention_v2", "workspace is null (required on kCUDA; ",
                   "PagedAttentionV2WorkspaceBytes() bytes)");
  return cuda::PagedAttentionV2(p);
#else
  return NoCuda();
#endif
}

const char* DecodeKernelName(DecodeKernel k) {
  switch (k) {
    case DecodeKernel::kAuto: return "auto";
    case DecodeKernel::kV1: return "v1";
    case DecodeKernel::kV2: return "v2";
    case DecodeKernel::kGqa: return "gqa";
    case DecodeKernel::kGqaMma: return "gqa_mma";
  }
  return "?";
}

bool ParseDecodeKernel(const char* name, DecodeKernel* k) {
  if (name == nullptr) return false;
  for (DecodeKernel c : {DecodeKernel::kAuto, DecodeKernel::kV1, DecodeKernel::kV2,
                         DecodeKernel::kGqa, DecodeKernel::kGqaMma}) {
    if (std::strcmp(name, DecodeKernelName(c)) == 0) {
      *k = c;
      return true;
    }
  }
  return false;
}

bool GqaDecodeFits(int head_size, int group_size) {
  return group_size >= 1 &&
         cuda::GqaDecodeSharedBytes(head_size, group_size) <= cuda::kGqaMaxSharedBytes;
}

size_t PagedAttentionGqaWorkspaceBytes(int num_seqs, int num_heads, int head_size,
                                       int max_seq_len) {
  // PlanGqaSplits never exceeds tiles / kGqaMinTilesPerSplit or kGqaMaxSplits.
  const int64_t tiles =
      (static_cast<int64_t>(max_seq_len) + cuda::kGqaTileTokens - 1) / cuda::kGqaTileTokens;
  int64_t splits = tiles / cuda::kGqaMinTilesPerSplit;
  if (splits > cuda::kGqaMaxSplits) splits = cuda::kGqaMaxSplits;
  if (splits < 2) return 0;  // one split: no scratch
  return cuda::GqaWorkspaceBytes(num_seqs, num_heads, head_size, static_cast<int>(splits));
}

bool GqaMmaFits(DType dtype, int head_size, int group_size) {
  return (dtype == DType::kFloat16 || dtype == DType::kBFloat16) &&
         cuda::GqaMmaSupports(head_size, group_size) && cuda::GqaMmaBuiltFor(head_size) &&
         cuda::GqaMmaSharedBytes(head_size) <= cuda::kGqaMaxSharedBytes;
}

absl::Status PagedAttentionGqaMma(const PagedAttentionParams& p) {
  constexpr absl::string_view op = "paged_attention_gqa_mma";
  if (absl::Status st = ValidateDecode(op, p); !st.ok()) return st;
  if (p.sliding_window > 0)
    return Invalid(op, "takes no sliding window (v1/v2 do); got sliding_window ", p.sliding_window);
  if (p.logit_softcap > 0)
    return Invalid(op, "takes no logit soft cap (v1/v2 do); got logit_softcap ", p.logit_softcap);
  if (p.num_seqs == 0) return absl::OkStatus();
  const KVCacheShape& cs = p.cache.shape;
  const int group = p.num_heads / cs.num_kv_heads;
  if (ResolveIoDType(p.io_dtype, cs.dtype) != cs.dtype ||
      !GqaMmaFits(cs.dtype, cs.head_size, group))
    return Invalid(op, "the tensor-core GQA kernel takes fp16/bf16 caches with operands of the ",
                   "same type, head sizes 64 or 128 and groups of at most ", cuda::kGqaMmaMaxGroup,
                   " heads; got a ", DTypeName(cs.dtype), " cache, head_size ", cs.head_size,
                   ", group ", group);
  if (p.cache.device == Device::kCPU)
    return absl::FailedPreconditionError(
        "paged_attention_gqa_mma: the tensor-core GQA decode kernel is CUDA-only");
#ifdef PAGEDSERVE_WITH_CUDA
  return cuda::PagedAttentionGqa(p, /*tensor_cores=*/true);
#else
  return NoCuda();
#endif
}

absl::Status PagedAttentionGqa(const PagedAttentionParams& p) {
  constexpr absl::string_view op = "paged_attention_gqa";
  if (absl::Status st = ValidateDecode(op, p); !st.ok()) return st;
  if (p.sliding_window > 0)
    return Invalid(op, "takes no sliding window (v1/v2 do); got sliding_window ", p.sliding_window);
  if (p.logit_softcap > 0)
    return Invalid(op, "takes no logit soft cap (v1/v2 do); got logit_softcap ", p.logit_softcap);
  if (p.num_seqs == 0) return absl::OkStatus();
  if (IsFp8(p.cache.shape.dtype) ||
      ResolveIoDType(p.io_dtype, p.cache.shape.dtype) != p.cache.shape.dtype)
    return Invalid(op,
                   "the GQA kernel reads fp32/fp16/bf16 caches with operands of the same type; ",
                   DTypeName(p.cache.shape.dtype), " caches go to v1/v2");
  const int group = p.num_heads / p.cache.shape.num_kv_heads;
  if (!GqaDecodeFits(p.cache.shape.head_size, group))
    return Invalid(op, "group size ", group, " with head_size ", p.cache.shape.head_size, " needs ",
                   cuda::GqaDecodeSharedBytes(p.cache.shape.head_size, group),
                   " bytes of shared memory, more than the ", cuda::kGqaMaxSharedBytes, " allowed");
  if (p.cache.device == Device::kCPU)
    return absl::FailedPreconditionError(
        "paged_attention_gqa: the GQA decode kernel is CUDA-only (the CPU v1/v2 kernels already "
        "serve a whole GQA group per task)");
#ifdef PAGEDSERVE_WITH_CUDA
  return cuda::PagedAttentionGqa(p);
#else
  return NoCuda();
#endif
}

// The one place that decides which decode kernel runs (see the contract in
// paged_attention.h). Reasons are stated so that logs, benchmarks and tests
// can tell why a kernel was taken.
namespace {

// The decode-kernel rule (contract: ChooseDecodeKernel in paged_attention.h).
// The reason string is built only when `explain` is set: PagedAttention() runs
// this for every layer of every step and needs the kernel alone.
DecodeKernelChoice ChooseDecodeKernelImpl(Device device, int num_seqs, int num_heads,
                                          int num_kv_heads, int head_size, int max_seq_len,
                                          DecodeKernel requested, bool explain) {
  auto why = [explain](const auto&... parts) {
    return explain ? absl::StrCat(parts...) : std::string();
  };
  // Without the cache dtype a tensor-core request is answered as gqa (the
  // per-call overload below decides it).
  if (requested == DecodeKernel::kGqaMma) requested = DecodeKernel::kGqa;
  const bool v1 = ShouldUsePagedAttentionV1(num_seqs, num_heads, max_seq_len);
  const DecodeKernel v1v2 = v1 ? DecodeKernel::kV1 : DecodeKernel::kV2;
  const char* const heuristic =
      v1 ? "vLLM heuristic: v1 (context fits one 512-token partition, or num_seqs * num_heads > "
           "512, and max_seq_len <= 8192)"
         : "vLLM heuristic: v2 (long context with few sequences x heads: split into 512-token "
           "partitions)";
  if (requested == DecodeKernel::kV1 || requested == DecodeKernel::kV2)
    return {requested, why(DecodeKernelName(requested), " requested")};
  const int group = num_kv_heads > 0 ? num_heads / num_kv_heads : 0;
  if (device == Device::kCPU)
    return {v1v2,
            why("CPU backend (no separate GQA kernel; its v1/v2 serve a whole "
                "group per task)",
                requested == DecodeKernel::kGqa ? ", gqa request ignored" : "", "; ", heuristic)};
  if (!GqaDecodeFits(head_size, group))
    return {v1v2, why("group size ", group, " x head_size ", head_size,
                      " exceeds the GQA kernel's shared memory (",
                      cuda::GqaDecodeSharedBytes(head_size, group), " > ", cuda::kGqaMaxSharedBytes,
                      " bytes); ", heuristic)};
  if (requested == DecodeKernel::kGqa)
    return {DecodeKernel::kGqa, why("gqa requested (group size ", group, ")")};
  if (group >= 2)
    return {DecodeKernel::kGqa,
            why("GQA group size ", group, ": each K/V tile is read once for all ", group,
                " query heads (v1/v2 would read it ", group, " times)")};
  return {v1v2, why("MHA (group size 1): no K/V to share across heads; ", heuristic)};
}

DecodeKernelChoice ChooseDecodeKernelImpl(const PagedAttentionParams& p, DecodeKernel requested,
                                          bool explain) {
  const DType cache = p.cache.shape.dtype;
  const bool converts = IsFp8(cache) || ResolveIoDType(p.io_dtype, cache) != cache;
  if (converts || p.sliding_window > 0 || p.logit_softcap > 0) {
    const bool v1 = ShouldUsePagedAttentionV1(p.num_seqs, p.num_heads, p.max_seq_len);
    const DecodeKernel k = requested == DecodeKernel::kV1 || requested == DecodeKernel::kV2
                               ? requested
                               : (v1 ? DecodeKernel::kV1 : DecodeKernel::kV2);
    if (!explain) return {k, std::string()};
    if (!converts && p.sliding_window > 0)
      return {k, absl::StrCat("sliding window of ", p.sliding_window,
                              " tokens: only v1/v2 take a window; ", DecodeKernelName(k))};
    if (!converts)
      return {k, absl::StrCat("logit soft cap of ", p.logit_softcap,
                              ": only v1/v2 take a soft cap; ", DecodeKernelName(k))};
    return {k, absl::StrCat(DTypeName(cache), " cache with ",
                            DTypeName(ResolveIoDType(p.io_dtype, cache)),
                            " operands: only v1/v2 convert in registers; ", DecodeKernelName(k))};
  }
  const int kv_heads = p.cache.shape.num_kv_heads;
  const int group = kv_heads > 0 ? p.num_heads / kv_heads : 0;
  std::string prefix;
  if (requested == DecodeKernel::kGqaMma) {
    if (p.cache.device == Device::kCUDA && GqaMmaFits(cache, p.cache.shape.head_size, group))
      return {DecodeKernel::kGqaMma,
              explain ? absl::StrCat("gqa_mma requested (tensor cores, group size ", group, ")")
                      : std::string()};
    if (explain)
      prefix = absl::StrCat("gqa_mma request does not fit (", DeviceName(p.cache.device), ", ",
                            DTypeName(cache), " cache, head_size ", p.cache.shape.head_size,
                            ", group ", group, "); ");
    requested = DecodeKernel::kAuto;
  }
  DecodeKernelChoice c =
      ChooseDecodeKernelImpl(p.cache.device, p.num_seqs, p.num_heads, kv_heads,
                             p.cache.shape.head_size, p.max_seq_len, requested, explain);
  if (explain) c.reason = prefix + c.reason;
  return c;
}

}  // namespace

DecodeKernelChoice ChooseDecodeKernel(Device device, int num_seqs, int num_heads, int num_kv_heads,
                                      int head_size, int max_seq_len, DecodeKernel requested) {
  return ChooseDecodeKernelImpl(device, num_seqs, num_heads, num_kv_heads, head_size, max_seq_len,
                                requested, /*explain=*/true);
}

DecodeKernelChoice ChooseDecodeKernel(const PagedAttentionParams& p, DecodeKernel requested) {
  return ChooseDecodeKernelImpl(p, requested, /*explain=*/true);
}

absl::StatusOr<DecodeKernel> DecodeKernelFromEnvironment() {
  // Read once: the comparison override for devices (v1/v2 stay reachable).
  static const char* const env = std::getenv("PAGEDSERVE_DECODE_KERNEL");
  DecodeKernel k = DecodeKernel::kAuto;
  if (env != nullptr && *env != '\0' && !ParseDecodeKernel(env, &k))
    return Invalid("paged_attention", "PAGEDSERVE_DECODE_KERNEL=", env,
                   " is not one of auto, v1, v2, gqa, gqa_mma");
  return k;
}

absl::Status PagedAttention(const PagedAttentionParams& p) {
  DecodeKernel requested = p.kernel;
  if (requested == DecodeKernel::kAuto) {
    absl::StatusOr<DecodeKernel> env = DecodeKernelFromEnvironment();
    if (!env.ok()) return env.status();
    requested = *env;
  }
  switch (ChooseDecodeKernelImpl(p, requested, /*explain=*/false).kernel) {
    case DecodeKernel::kGqa: return PagedAttentionGqa(p);
    case DecodeKernel::kGqaMma: return PagedAttentionGqaMma(p);
    case DecodeKernel::kV2: return PagedAttentionV2(p);
    default: return PagedAttentionV1(p);
  }
}

// ---------------------------------------------------------------------------
// Prefill attention
// ---------------------------------------------------------------------------

absl::Status ValidatePrefillAttention(const PrefillAttentionParams& p) {
  constexpr absl::string_view op = "prefill_attention";
  if (absl::Status st = CheckAttentionCommon(op, p); !st.ok()) return st;
  if (p.num_seqs == 0) return absl::OkStatus();
  if (p.query_start_loc == nullptr) return Invalid(op, "query_start_loc is null");
  const KVCacheShape& cs = p.cache.shape;
  const int64_t row = static_cast<int64_t>(p.num_heads) * cs.head_size;
  if (absl::Status st = CheckTokenStride(op, "query_token_stride", p.query_token_stride, row,
                                         "num_heads * head_size");
      !st.ok())
    return st;
  const bool on_host = p.cache.device == Device::kCPU;
  const int32_t* qsl = on_host ? p.query_start_loc : p.host_query_start_loc;
  const int32_t* seq_lens = on_host ? p.seq_lens : p.host_seq_lens;
  const int32_t* block_tables = on_host ? p.block_tables : p.host_block_tables;
  if (qsl == nullptr || seq_lens == nullptr) return absl::OkStatus();
  if (qsl[0] < 0) return Invalid(op, "query_start_loc[0] = ", qsl[0], " must be >= 0");
  for (int s = 0; s < p.num_seqs; ++s) {
    const int64_t q_len = static_cast<int64_t>(qsl[s + 1]) - qsl[s];
    if (q_len < 0)
      return Invalid(op, "query_start_loc must be non-decreasing: [", s, "] = ", qsl[s], " > [",
                     s + 1, "] = ", qsl[s + 1]);
    if (q_len > p.max_query_len)
      return Invalid(op, "query length of sequence ", s, " (", q_len, ") exceeds max_query_len ",
                     p.max_query_len);
    const int32_t len = seq_lens[s];
    if (len < q_len)
      return Invalid(op, "seq_lens[", s, "] = ", len, " is shorter than its query length ", q_len);
    if (absl::Status st = CheckSeqLenFits(op, p, s, len); !st.ok()) return st;
  }
  if (block_tables == nullptr) return absl::OkStatus();
  return CheckBlockTables(op, block_tables, p.num_seqs, p.max_blocks_per_seq, cs,
                          [&](int s) { return seq_lens[s]; });
}

const char* PrefillKernelName(PrefillKernel k) {
  switch (k) {
    case PrefillKernel::kAuto: return "auto";
    case PrefillKernel::kSimt: return "simt";
    case PrefillKernel::kMma: return "mma";
  }
  return "?";
}

bool ParsePrefillKernel(const char* name, PrefillKernel* k) {
  if (name == nullptr) return false;
  for (PrefillKernel c : {PrefillKernel::kAuto, PrefillKernel::kSimt, PrefillKernel::kMma})
    if (std::strcmp(name, PrefillKernelName(c)) == 0) {
      *k = c;
      return true;
    }
  return false;
}

bool PrefillMmaFits(DType cache_dtype, DType io_dtype, int head_size) {
  return (cache_dtype == DType::kFloat16 || cache_dtype == DType::kBFloat16) &&
         io_dtype == cache_dtype && cuda::PrefillMmaBuiltFor(head_size);
}

absl::Status PrefillAttention(const PrefillAttentionParams& p) {
  if (absl::Status st = ValidatePrefillAttention(p); !st.ok()) return st;
  if (p.num_seqs == 0) return absl::OkStatus();
  if (p.cache.device == Device::kCPU) return cpu::PrefillAttention(p);
#ifdef PAGEDSERVE_WITH_CUDA
  PrefillKernel k = p.kernel;
  if (k == PrefillKernel::kAuto) {
    // Read once: the comparison switch for devices.
    static const char* const env = std::getenv("PAGEDSERVE_PREFILL_KERNEL");
    if (env != nullptr && *env != '\0' && !ParsePrefillKernel(env, &k))
      return Invalid("prefill_attention", "PAGEDSERVE_PREFILL_KERNEL=", env,
                     " is not one of auto, simt, mma");
  }
  const bool mma =
      k == PrefillKernel::kMma && p.sliding_window == 0 && p.logit_softcap == 0 &&
      PrefillMmaFits(p.cache.shape.dtype, ResolveIoDType(p.io_dtype, p.cache.shape.dtype),
                     p.cache.shape.head_size);
  return cuda::PrefillAttention(p, mma);
#else
  return NoCuda();
#endif
}

// ---------------------------------------------------------------------------
// copy_blocks / swap_blocks
// ---------------------------------------------------------------------------

namespace {

bool SameLayout(const KVCacheShape& a, const KVCacheShape& b) {
  return a.num_kv_heads == b.num_kv_heads && a.head_size == b.head_size &&
         a.block_size == b.block_size && a.dtype == b.dtype;
}

absl::Status CheckPairs(absl::string_view op, std::span<const BlockCopy> pairs, int64_t src_blocks,
                        int64_t dst_blocks) {
  for (size_t i = 0; i < pairs.size(); ++i) {
    if (pairs[i].src < 0 || pairs[i].src >= src_blocks)
      return Invalid(op, "pairs[", i, "].src = ", pairs[i].src, " is outside the pool [0, ",
                     src_blocks, ")");
    if (pairs[i].dst < 0 || pairs[i].dst >= dst_blocks)
      return Invalid(op, "pairs[", i, "].dst = ", pairs[i].dst, " is outside the pool [0, ",
                     dst_blocks, ")");
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CopyBlocks(std::span<const KVCacheView> layers, std::span<const BlockCopy> pairs,
                        void* stream) {
  constexpr absl::string_view op = "copy_blocks";
  if (layers.empty() || pairs.empty()) return absl::OkStatus();
  for (size_t i = 0; i < layers.size(); ++i) {
    if (absl::Status st = ValidateCacheView(layers[i]); !st.ok())
      return Invalid(op, "layers[", i, "]: ", st.message());
    if (!SameLayout(layers[i].shape, layers[0].shape) ||
        layers[i].shape.num_blocks != layers[0].shape.num_blocks)
      return Invalid(op, "layers[", i, "] has a different shape than layers[0]");
    if (layers[i].device != layers[0].device)
      return Invalid(op, "layers[", i, "] is on ", DeviceName(layers[i].device), ", layers[0] on ",
                     DeviceName(layers[0].device));
  }
  const int64_t nb = layers[0].shape.num_blocks;
  if (absl::Status st = CheckPairs(op, pairs, nb, nb); !st.ok()) return st;
  if (layers[0].device == Device::kCPU) return cpu::CopyBlocks(layers, pairs);
#ifdef PAGEDSERVE_WITH_CUDA
  return cuda::CopyBlocks(layers, pairs, stream);
#else
  return NoCuda();
#endif
}

absl::Status SwapBlocks(std::span<const KVCacheView> src, std::span<const KVCacheView> dst,
                        std::span<const BlockCopy> pairs, void* stream) {
  constexpr absl::string_view op = "swap_blocks";
  if (src.size() != dst.size())
    return Invalid(op, "src has ", src.size(), " layers, dst has ", dst.size());
  if (src.empty() || pairs.empty()) return absl::OkStatus();
  bool any_cuda = false;
  for (size_t i = 0; i < src.size(); ++i) {
    if (absl::Status st = ValidateCacheView(src[i]); !st.ok())
      return Invalid(op, "src[", i, "]: ", st.message());
    if (absl::Status st = ValidateCacheView(dst[i]); !st.ok())
      return Invalid(op, "dst[", i, "]: ", st.message());
    if (!SameLayout(src[i].shape, src[0].shape) || !SameLayout(dst[i].shape, src[0].shape))
      return Invalid(op, "layer ", i, ": src and dst must share num_kv_heads, head_size, ",
                     "block_size and dtype with src[0]");
    if (src[i].shape.num_blocks != src[0].shape.num_blocks ||
        dst[i].shape.num_blocks != dst[0].shape.num_blocks)
      return Invalid(op, "layer ", i, ": num_blocks differs from layer 0");
    if (src[i].device != src[0].device || dst[i].device != dst[0].device)
      return Invalid(op, "layer ", i, ": device differs from layer 0");
    if (IsFp8(src[i].shape.dtype) &&
        (src[i].k_scale != dst[i].k_scale || src[i].v_scale != dst[i].v_scale))
      return Invalid(op, "layer ", i, ": src and dst fp8 pools must share k_scale and v_scale ",
                     "(the bytes are moved as they are)");
    any_cuda = any_cuda || src[i].device == Device::kCUDA || dst[i].device == Device::kCUDA;
  }
  if (absl::Status st = CheckPairs(op, pairs, src[0].shape.num_blocks, dst[0].shape.num_blocks);
      !st.ok())
    return st;
  if (!any_cuda) return cpu::SwapBlocks(src, dst, pairs);
#ifdef PAGEDSERVE_WITH_CUDA
  return cuda::SwapBlocks(src, dst, pairs, stream);
#else
  return NoCuda();
#endif
}

}  // namespace pagedserve::kernels
