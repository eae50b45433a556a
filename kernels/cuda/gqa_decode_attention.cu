// Launchers of the GQA decode attention kernel
// (kernels/cuda/gqa_decode_kernels.cuh): template dispatch on element type and
// head size, the dynamic shared-memory opt-in, the occupancy query the split
// planner needs, and the cross-split reduce (the v2 reduce kernel of
// paged_attention_kernels.cuh, with the split size as its partition size).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/gqa_decode_kernels.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/paged_attention_kernels.cuh"

namespace pagedserve::kernels::cuda {
namespace {

template <typename T, int HEAD_SIZE>
auto GqaKernel() {
  return GqaDecodeKernel<T, T, HEAD_SIZE, kDecodeThreads>;
}

// Lets the kernel use `smem` bytes of dynamic shared memory (needed above 48 KiB).
template <typename Kernel>
cudaError_t AllowSharedBytes(Kernel kernel, size_t smem) {
  if (smem <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                              static_cast<int>(smem));
}

template <typename T, int HEAD_SIZE>
cudaError_t Launch(const DecodeArgs& a, const GqaSplitPlan& plan, float* max_logits,
                   float* exp_sums, float* tmp_out) {
  const int group_size = a.num_heads / a.cache.num_kv_heads;
  auto kernel = GqaKernel<T, HEAD_SIZE>();
  const size_t smem = GqaDecodeSharedBytes(HEAD_SIZE, group_size);
  if (cudaError_t e = AllowSharedBytes(kernel, smem); e != cudaSuccess) return e;
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
                            float* exp_sums, float* tmp_out) {
  if (!ValidPlan(plan) || a.cache.num_kv_heads <= 0 || a.num_heads % a.cache.num_kv_heads != 0)
    return cudaErrorInvalidValue;
  if (plan.num_splits > 1 && (max_logits == nullptr || exp_sums == nullptr || tmp_out == nullptr))
    return cudaErrorInvalidValue;
  return DispatchElemHead(a.cache.elem, a.cache.head_size, [&](auto t, auto hs) {
    using T = typename decltype(t)::type;
    return Launch<T, decltype(hs)::value>(a, plan, max_logits, exp_sums, tmp_out);
  });
}

cudaError_t GqaDecodeOccupancy(Elem elem, int head_size, int group_size, int* num_sms,
                               int* blocks_per_sm) {
  *num_sms = 0;
  *blocks_per_sm = 0;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(num_sms, cudaDevAttrMultiProcessorCount, device);
      e != cudaSuccess)
    return e;
  int optin = 0;
  if (cudaError_t e =
          cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
      e != cudaSuccess)
    return e;
  const size_t smem = GqaDecodeSharedBytes(head_size, group_size);
  if (smem > static_cast<size_t>(optin)) return cudaSuccess;  // does not fit: 0 blocks
  return DispatchElemHead(elem, head_size, [&](auto t, auto hs) -> cudaError_t {
    using T = typename decltype(t)::type;
    auto kernel = GqaKernel<T, decltype(hs)::value>();
    if (cudaError_t e = AllowSharedBytes(kernel, smem); e != cudaSuccess) return e;
    return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, kernel, kDecodeThreads,
                                                         smem);
  });
}

}  // namespace pagedserve::kernels::cuda
