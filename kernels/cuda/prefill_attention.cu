// Launcher of the prefill attention kernel (prefill_attention_kernels.cuh).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/prefill_attention_kernels.cuh"

namespace pagedserve::kernels::cuda {

cudaError_t LaunchPrefillAttention(const PrefillArgs& a) {
  if (a.num_seqs <= 0 || a.max_query_len <= 0) return cudaSuccess;
  return DispatchIoCacheHead(a.io, a.cache.elem, a.cache.head_size, [&](auto t, auto c, auto hs) {
    using T = typename decltype(t)::type;
    using C = typename decltype(c)::type;
    constexpr int kHeadSize = decltype(hs)::value;
    // fp8: k_scale folded into the softmax scale; v_scale applied by the kernel.
    const float scale = kIsFp8<C> ? a.scale * a.cache.k_scale : a.scale;
    const dim3 grid(a.num_heads, a.num_seqs, (a.max_query_len + kRowsPerTile - 1) / kRowsPerTile);
    PrefillAttentionKernel<T, kHeadSize, C><<<grid, kPrefillThreads, 0, a.stream>>>(
        static_cast<T*>(a.out), static_cast<const T*>(a.query), a.query_token_stride,
        a.query_start_loc, a.seq_lens, static_cast<const C*>(a.cache.key_cache),
        static_cast<const C*>(a.cache.value_cache), a.cache.num_kv_heads, a.cache.block_size,
        a.block_tables, a.max_blocks_per_seq, scale, a.alibi_slopes, a.cache.v_scale);
    return cudaGetLastError();
  });
}

}  // namespace pagedserve::kernels::cuda
