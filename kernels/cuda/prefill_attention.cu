// Launchers of the prefill attention kernels (prefill_attention_kernels.cuh
// and the tensor-core variant, prefill_attention_mma_kernels.cuh).
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <mutex>

#include "kernels/cuda/dispatch.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/prefill_attention_kernels.cuh"
#include "kernels/cuda/prefill_attention_mma_kernels.cuh"

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
        a.block_tables, a.max_blocks_per_seq, scale, a.alibi_slopes, a.cache.v_scale,
        a.sliding_window, a.logit_softcap);
    return cudaGetLastError();
  });
}

namespace {

// Lets PrefillAttentionMmaKernel<T, HEAD_SIZE> use its dynamic shared memory
// (above 48 KiB): set once per device (the size is fixed per instantiation),
// so that launches make no attribute call after the first.
template <typename T, int HEAD_SIZE>
cudaError_t AllowMmaSharedBytes() {
  constexpr int kMaxDevices = 64;
  static std::mutex mu;
  static std::array<bool, kMaxDevices> done{};
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  auto set = [] {
    return cudaFuncSetAttribute(PrefillAttentionMmaKernel<T, HEAD_SIZE>,
                                cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(PrefillMmaSharedBytes(HEAD_SIZE)));
  };
  if (device < 0 || device >= kMaxDevices) return set();
  std::lock_guard<std::mutex> lock(mu);
  if (done[device]) return cudaSuccess;
  const cudaError_t e = set();
  if (e == cudaSuccess) done[device] = true;
  return e;
}

template <typename T, int HEAD_SIZE>
cudaError_t LaunchMma(const PrefillArgs& a) {
  if (cudaError_t e = AllowMmaSharedBytes<T, HEAD_SIZE>(); e != cudaSuccess) return e;
  const dim3 grid(a.num_heads, a.num_seqs,
                  (a.max_query_len + kPrefillMmaRows - 1) / kPrefillMmaRows);
  PrefillAttentionMmaKernel<T, HEAD_SIZE>
      <<<grid, kPrefillMmaThreads, PrefillMmaSharedBytes(HEAD_SIZE), a.stream>>>(
          static_cast<T*>(a.out), static_cast<const T*>(a.query), a.query_token_stride,
          a.query_start_loc, a.seq_lens, static_cast<const T*>(a.cache.key_cache),
          static_cast<const T*>(a.cache.value_cache), a.cache.num_kv_heads, a.cache.block_size,
          a.block_tables, a.max_blocks_per_seq, a.scale, a.alibi_slopes);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchMmaHead(const PrefillArgs& a) {
  switch (a.cache.head_size) {
    case 64: return LaunchMma<T, 64>(a);
    case 128: return LaunchMma<T, 128>(a);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t LaunchPrefillAttentionMma(const PrefillArgs& a) {
  if (a.num_seqs <= 0 || a.max_query_len <= 0) return cudaSuccess;
  if (a.io != a.cache.elem || !PrefillMmaBuiltFor(a.cache.head_size)) return cudaErrorInvalidValue;
  // Only the SIMT kernel takes a window or a soft cap.
  if (a.sliding_window > 0 || a.logit_softcap > 0.0f) return cudaErrorInvalidValue;
  switch (a.io) {
    case Elem::kF16: return LaunchMmaHead<__half>(a);
    case Elem::kBF16: return LaunchMmaHead<__nv_bfloat16>(a);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace pagedserve::kernels::cuda
