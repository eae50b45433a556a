// Launchers of the PagedAttention v1/v2 decode kernels
// (kernels/cuda/paged_attention_kernels.cuh): template dispatch on element type
// and head size, shared-memory sizing, and the v2 reduce launch.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/paged_attention_kernels.cuh"

namespace pagedserve::kernels::cuda {
namespace {

size_t LogitsBytes(int tokens) { return static_cast<size_t>((tokens + 7) / 8 * 8) * sizeof(float); }

template <typename T, typename C, int HEAD_SIZE>
cudaError_t LaunchDecode(const DecodeArgs& a, int partition_size, int num_partitions,
                         float* max_logits, float* exp_sums, float* tmp_out) {
  auto kernel = PagedAttentionKernel<T, HEAD_SIZE, kDecodeThreads, C>;
  // fp8: k_scale folded into the softmax scale; v_scale applied by the kernel.
  const float scale = kIsFp8<C> ? a.scale * a.cache.k_scale : a.scale;
  const size_t smem = LogitsBytes(partition_size > 0 ? partition_size : a.max_seq_len);
  if (smem > 48 * 1024) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(smem));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(a.num_heads, a.num_seqs, num_partitions);
  kernel<<<grid, kDecodeThreads, smem, a.stream>>>(
      static_cast<T*>(a.out), max_logits, exp_sums, tmp_out, static_cast<const T*>(a.query),
      static_cast<const C*>(a.cache.key_cache), static_cast<const C*>(a.cache.value_cache),
      a.cache.num_kv_heads, a.cache.block_size, scale, a.block_tables, a.max_blocks_per_seq,
      a.seq_lens, a.alibi_slopes, partition_size, a.cache.v_scale, a.sliding_window,
      a.logit_softcap);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || partition_size == 0) return e;
  const dim3 rgrid(a.num_heads, a.num_seqs);
  PagedAttentionReduceKernel<T, kDecodeThreads>
      <<<rgrid, kDecodeThreads, num_partitions * sizeof(float), a.stream>>>(
          static_cast<T*>(a.out), max_logits, exp_sums, tmp_out, a.seq_lens, HEAD_SIZE,
          num_partitions, partition_size);
  return cudaGetLastError();
}

}  // namespace

size_t DecodeV1SharedBytes(int max_seq_len) { return LogitsBytes(max_seq_len); }

cudaError_t DecodeV1MaxSharedBytes(Elem io, Elem cache, int head_size, size_t* bytes) {
  return DispatchIoCacheHead(io, cache, head_size, [&](auto t, auto c, auto hs) -> cudaError_t {
    using T = typename decltype(t)::type;
    using C = typename decltype(c)::type;
    cudaFuncAttributes attr{};
    cudaError_t e = cudaFuncGetAttributes(
        &attr, PagedAttentionKernel<T, decltype(hs)::value, kDecodeThreads, C>);
    if (e != cudaSuccess) return e;
    int device = 0, optin = 0;
    if ((e = cudaGetDevice(&device)) != cudaSuccess) return e;
    e = cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (e != cudaSuccess) return e;
    *bytes = static_cast<size_t>(optin) > attr.sharedSizeBytes ? optin - attr.sharedSizeBytes : 0;
    return cudaSuccess;
  });
}

cudaError_t LaunchPagedAttentionV1(const DecodeArgs& a) {
  return DispatchIoCacheHead(a.io, a.cache.elem, a.cache.head_size, [&](auto t, auto c, auto hs) {
    using T = typename decltype(t)::type;
    using C = typename decltype(c)::type;
    return LaunchDecode<T, C, decltype(hs)::value>(a, 0, 1, nullptr, nullptr, nullptr);
  });
}

cudaError_t LaunchPagedAttentionV2(const DecodeArgs& a, float* max_logits, float* exp_sums,
                                   float* tmp_out) {
  const int num_partitions = NumPartitions(a.max_seq_len);
  return DispatchIoCacheHead(a.io, a.cache.elem, a.cache.head_size, [&](auto t, auto c, auto hs) {
    using T = typename decltype(t)::type;
    using C = typename decltype(c)::type;
    return LaunchDecode<T, C, decltype(hs)::value>(a, kPartitionSize, num_partitions, max_logits,
                                                   exp_sums, tmp_out);
  });
}

}  // namespace pagedserve::kernels::cuda
