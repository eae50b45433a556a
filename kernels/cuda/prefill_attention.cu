// Launcher of the prefill attention kernel (prefill_attention_kernels.cuh).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/prefill_attention_kernels.cuh"

namespace pagedserve::kernels::cuda {

cudaError_t LaunchPrefillAttention(const PrefillArgs& a) {
  if (a.num_seqs <= 0 || a.max_query_len <= 0) return cudaSuccess;
  return DispatchElemHead(a.cache.elem, a.cache.head_size, [&](auto t, auto hs) {
    using T = typename decltype(t)::type;
    constexpr int kHeadSize = decltype(hs)::value;
    const dim3 grid(a.num_heads, a.num_seqs, (a.max_query_len + kRowsPerTile - 1) / kRowsPerTile);
    PrefillAttentionKernel<T, kHeadSize><<<grid, kPrefillThreads, 0, a.stream>>>(
        static_cast<T*>(a.out), static_cast<const T*>(a.query), a.query_token_stride,
        a.query_start_loc, a.seq_lens, static_cast<const T*>(a.cache.key_cache),
        static_cast<const T*>(a.cache.value_cache), a.cache.num_kv_heads, a.cache.block_size,
        a.block_tables, a.max_blocks_per_seq, a.scale, a.alibi_slopes);
    return cudaGetLastError();
  });
}

}  // namespace pagedserve::kernels::cuda
