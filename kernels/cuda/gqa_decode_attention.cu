// Launchers of the GQA decode attention kernel
// (kernels/cuda/gqa_decode_kernels.cuh) and its tensor-core variant
// (gqa_decode_mma_kernels.cuh): template dispatch on element type and
// head size, the dynamic shared-memory opt-in and the occupancy query the
// split planner needs (both cached per device, so that a launch makes no
// attribute or occupancy call after the first), and the cross-split reduce (the v2 reduce kernel of
// paged_attention_kernels.cuh, with the split size as its partition size).
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/gqa_decode_kernels.cuh"
#include "kernels/cuda/gqa_decode_mma_kernels.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/paged_attention_kernels.cuh"

namespace pagedserve::kernels::cuda {
namespace {

// Whether the tensor-core variant is built for this element type and head size.
template <typename T, int HEAD_SIZE>
constexpr bool kHasMma = sizeof(T) == 2 && GqaMmaBuiltFor(HEAD_SIZE);

// The kernel of a variant (MMA only where kHasMma; both have one signature).
template <typename T, int HEAD_SIZE, bool MMA>
auto GqaKernel() {
  if constexpr (MMA) {
    return GqaDecodeMmaKernel<T, HEAD_SIZE, kDecodeThreads>;
  } else {
    return GqaDecodeKernel<T, T, HEAD_SIZE, kDecodeThreads>;
  }
}

// Dynamic shared memory of a variant's block for element type T.
template <typename T, bool MMA>
size_t SharedBytes(int head_size, int group_size) {
  return MMA ? GqaMmaSharedBytes(head_size)
             : GqaDecodeSharedBytes(head_size, group_size, static_cast<int>(sizeof(T)));
}

constexpr int kMaxDevices = 64;  // devices whose attribute settings are cached

// Lets GqaKernel<T, HEAD_SIZE, MMA> use `smem` bytes of dynamic shared memory
// (needed above 48 KiB). The attribute is set once per device and size: the
// largest size allowed so far is cached per device (primary contexts; a
// smaller request needs no call), so launches make no attribute call.
template <typename T, int HEAD_SIZE, bool MMA>
cudaError_t AllowSharedBytes(size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  static std::mutex mu;
  static std::array<size_t, kMaxDevices> allowed{};
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (device < 0 || device >= kMaxDevices)
    return cudaFuncSetAttribute(GqaKernel<T, HEAD_SIZE, MMA>(),
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(smem));
  // Under the lock, so that the attribute only ever grows (a smaller size set
  // after a larger one would make the larger launches fail).
  std::lock_guard<std::mutex> lock(mu);
  if (allowed[device] >= smem) return cudaSuccess;
  cudaError_t e =
      cudaFuncSetAttribute(GqaKernel<T, HEAD_SIZE, MMA>(),
                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
  if (e == cudaSuccess) allowed[device] = smem;
  return e;
}

template <typename T, int HEAD_SIZE, bool MMA>
cudaError_t Launch(const DecodeArgs& a, const GqaSplitPlan& plan, float* max_logits,
                   float* exp_sums, float* tmp_out) {
  const int group_size = a.num_heads / a.cache.num_kv_heads;
  if (MMA && !GqaMmaSupports(HEAD_SIZE, group_size)) return cudaErrorInvalidValue;
  auto kernel = GqaKernel<T, HEAD_SIZE, MMA>();
  const size_t smem = SharedBytes<T, MMA>(HEAD_SIZE, group_size);
  if (cudaError_t e = AllowSharedBytes<T, HEAD_SIZE, MMA>(smem); e != cudaSuccess) return e;
  const dim3 grid(a.cache.num_kv_heads, a.num_seqs, plan.num_splits);
  kernel<<<grid, kDecodeThreads, smem, a.stream>>>(
      static_cast<T*>(a.out), max_logits, exp_sums, tmp_out, static_cast<const T*>(a.query),
      static_cast<const T*>(a.cache.key_cache), static_cast<const T*>(a.cache.value_cache),
      a.cache.num_kv_heads, group_size, a.cache.block_size, a.scale, a.block_tables,
      a.max_blocks_per_seq, a.seq_lens, a.alibi_slopes, plan.split_tokens);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || plan.num_splits == 1) return e;
  const dim3 rgrid(a.num_heads, a.num_seqs);
  PagedAttentionReduceKernel<T, kDecodeThreads>
      <<<rgrid, kDecodeThreads, plan.num_splits * sizeof(float), a.stream>>>(
          static_cast<T*>(a.out), max_logits, exp_sums, tmp_out, a.seq_lens, HEAD_SIZE,
          plan.num_splits, plan.split_tokens);
  return cudaGetLastError();
}

bool ValidPlan(const GqaSplitPlan& plan) {
  if (plan.num_splits == 1) return plan.split_tokens == 0;
  return plan.num_splits > 1 && plan.num_splits <= kGqaMaxSplits && plan.split_tokens > 0 &&
         plan.split_tokens % kGqaTileTokens == 0;
}

}  // namespace

cudaError_t LaunchGqaDecode(const DecodeArgs& a, const GqaSplitPlan& plan, float* max_logits,
                            float* exp_sums, float* tmp_out, bool tensor_cores) {
  if (!ValidPlan(plan) || a.cache.num_kv_heads <= 0 || a.num_heads % a.cache.num_kv_heads != 0)
    return cudaErrorInvalidValue;
  // Only v1/v2 take a window or a soft cap.
  if (a.sliding_window > 0 || a.logit_softcap > 0.0f) return cudaErrorInvalidValue;
  if (plan.num_splits > 1 && (max_logits == nullptr || exp_sums == nullptr || tmp_out == nullptr))
    return cudaErrorInvalidValue;
  return DispatchElemHead(a.cache.elem, a.cache.head_size, [&](auto t, auto hs) -> cudaError_t {
    using T = typename decltype(t)::type;
    constexpr int kHeadSize = decltype(hs)::value;
    if (!tensor_cores) return Launch<T, kHeadSize, false>(a, plan, max_logits, exp_sums, tmp_out);
    if constexpr (kHasMma<T, kHeadSize>) {
      return Launch<T, kHeadSize, true>(a, plan, max_logits, exp_sums, tmp_out);
    } else {
      return cudaErrorInvalidValue;
    }
  });
}

namespace {

// GqaDecodeOccupancy's answers, per (device, element type, head size, group
// size): they depend on nothing else, and the planner asks on every launch.
struct OccupancyKey {
  int device, elem, head_size, group_size;
  bool tensor_cores;
  bool operator<(const OccupancyKey& o) const {
    return std::tie(device, elem, head_size, group_size, tensor_cores) <
           std::tie(o.device, o.elem, o.head_size, o.group_size, o.tensor_cores);
  }
};
std::mutex occupancy_mu;
std::map<OccupancyKey, std::pair<int, int>>& OccupancyCache() {
  static auto* cache = new std::map<OccupancyKey, std::pair<int, int>>();
  return *cache;
}

cudaError_t QueryGqaDecodeOccupancy(int device, Elem elem, int head_size, int group_size,
                                    bool tensor_cores, int* num_sms, int* blocks_per_sm);

}  // namespace

cudaError_t GqaDecodeOccupancy(Elem elem, int head_size, int group_size, int* num_sms,
                               int* blocks_per_sm, bool tensor_cores) {
  *num_sms = 0;
  *blocks_per_sm = 0;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  const OccupancyKey key{device, static_cast<int>(elem), head_size, group_size, tensor_cores};
  {
    std::lock_guard<std::mutex> lock(occupancy_mu);
    auto it = OccupancyCache().find(key);
    if (it != OccupancyCache().end()) {
      *num_sms = it->second.first;
      *blocks_per_sm = it->second.second;
      return cudaSuccess;
    }
  }
  cudaError_t e = QueryGqaDecodeOccupancy(device, elem, head_size, group_size, tensor_cores,
                                          num_sms, blocks_per_sm);
  if (e == cudaSuccess) {
    std::lock_guard<std::mutex> lock(occupancy_mu);
    OccupancyCache()[key] = {*num_sms, *blocks_per_sm};
  }
  return e;
}

namespace {

cudaError_t QueryGqaDecodeOccupancy(int device, Elem elem, int head_size, int group_size,
                                    bool tensor_cores, int* num_sms, int* blocks_per_sm) {
  if (cudaError_t e = cudaDeviceGetAttribute(num_sms, cudaDevAttrMultiProcessorCount, device);
      e != cudaSuccess)
    return e;
  int optin = 0;
  if (cudaError_t e =
          cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      e != cudaSuccess)
    return e;
  return DispatchElemHead(elem, head_size, [&](auto t, auto hs) -> cudaError_t {
    using T = typename decltype(t)::type;
    constexpr int kHeadSize = decltype(hs)::value;
    auto query = [&](auto mma) -> cudaError_t {
      constexpr bool kMma = decltype(mma)::value;
      const size_t smem = SharedBytes<T, kMma>(head_size, group_size);
      if (smem > static_cast<size_t>(optin)) return cudaSuccess;  // does not fit: 0 blocks
      if (cudaError_t e = AllowSharedBytes<T, kHeadSize, kMma>(smem); e != cudaSuccess) return e;
      return cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          blocks_per_sm, GqaKernel<T, kHeadSize, kMma>(), kDecodeThreads, smem);
    };
    if (!tensor_cores) return query(std::false_type{});
    if constexpr (kHasMma<T, kHeadSize>) {
      return query(std::true_type{});
    } else {
      return cudaErrorInvalidValue;
    }
  });
}

}  // namespace

}  // namespace pagedserve::kernels::cuda
