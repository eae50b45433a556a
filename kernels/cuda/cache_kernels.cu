// Launchers of the reshape_and_cache and copy_blocks kernels (cache_kernels.cuh).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/cache_kernels.cuh"
#include "kernels/cuda/launch.h"

namespace pagedserve::kernels::cuda {

cudaError_t LaunchReshapeAndCache(const void* key, const void* value, int64_t key_token_stride,
                                  int64_t value_token_stride, const int64_t* slot_mapping,
                                  int64_t num_slots, int num_tokens, void* key_cache,
                                  void* value_cache, int num_kv_heads, int head_size,
                                  int block_size, Elem elem, Elem io, float k_scale, float v_scale,
                                  cudaStream_t stream) {
  if (num_tokens <= 0) return cudaSuccess;
  const int n = num_kv_heads * head_size;
  const int threads = n < 512 ? ((n + 31) / 32) * 32 : 512;
  if (elem == Elem::kFp8E4M3 || elem == Elem::kFp8E5M2) {
    auto launch = [&](auto io_tag, auto cache_tag) {
      using T = decltype(io_tag);
      using C = decltype(cache_tag);
      ReshapeAndCacheFp8Kernel<T, C><<<num_tokens, threads, 0, stream>>>(
          static_cast<const T*>(key), static_cast<const T*>(value), key_token_stride,
          value_token_stride, slot_mapping, num_slots, static_cast<uint8_t*>(key_cache),
          static_cast<uint8_t*>(value_cache), num_kv_heads, head_size, block_size, k_scale,
          v_scale);
      return cudaGetLastError();
    };
    auto with_io = [&](auto cache_tag) {
      switch (io) {
        case Elem::kF32: return launch(float{}, cache_tag);
        case Elem::kF16: return launch(__half{}, cache_tag);
        case Elem::kBF16: return launch(__nv_bfloat16{}, cache_tag);
        default: return cudaErrorInvalidValue;
      }
    };
    return elem == Elem::kFp8E4M3 ? with_io(__nv_fp8_e4m3{}) : with_io(__nv_fp8_e5m2{});
  }
  if (io != elem) return cudaErrorInvalidValue;
  if (elem == Elem::kF32) {
    ReshapeAndCacheKernel<uint32_t><<<num_tokens, threads, 0, stream>>>(
        static_cast<const uint32_t*>(key), static_cast<const uint32_t*>(value), key_token_stride,
        value_token_stride, slot_mapping, num_slots, static_cast<uint32_t*>(key_cache),
        static_cast<uint32_t*>(value_cache), num_kv_heads, head_size, block_size);
  } else {
    ReshapeAndCacheKernel<uint16_t><<<num_tokens, threads, 0, stream>>>(
        static_cast<const uint16_t*>(key), static_cast<const uint16_t*>(value), key_token_stride,
        value_token_stride, slot_mapping, num_slots, static_cast<uint16_t*>(key_cache),
        static_cast<uint16_t*>(value_cache), num_kv_heads, head_size, block_size);
  }
  return cudaGetLastError();
}

cudaError_t LaunchCopyBlocks(const uint64_t* key_ptrs, const uint64_t* value_ptrs,
                             const int64_t* pairs, int num_layers, int num_pairs,
                             int64_t block_bytes, bool aligned16, cudaStream_t stream) {
  if (num_layers <= 0 || num_pairs <= 0) return cudaSuccess;
  const dim3 grid(num_pairs, num_layers);
  if (aligned16) {
    CopyBlocksKernel<uint4>
        <<<grid, 256, 0, stream>>>(key_ptrs, value_ptrs, pairs, block_bytes / 16);
  } else {
    CopyBlocksKernel<uint8_t><<<grid, 256, 0, stream>>>(key_ptrs, value_ptrs, pairs, block_bytes);
  }
  return cudaGetLastError();
}

}  // namespace pagedserve::kernels::cuda
