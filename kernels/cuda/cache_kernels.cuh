// Internal: reshape_and_cache and copy_blocks kernels. Both move raw element
// bits, so they are instantiated per element width (4 or 2 bytes), not per
// dtype; the fp8 variant of reshape_and_cache converts (per input type x fp8
// format). Shared by cache_kernels.cu and the CPU emulation test.
#ifndef PAGEDSERVE_KERNELS_CUDA_CACHE_KERNELS_CUH_
#define PAGEDSERVE_KERNELS_CUDA_CACHE_KERNELS_CUH_

#include <cstdint>

#include "kernels/cuda/dtype_utils.cuh"

namespace pagedserve::kernels::cuda {

// vLLM's paged layout (kernels/types.h), in elements: key element (h, d) of
// the token in `offset` of `block` at [block, h, d / x, offset, d % x], value
// element at [block, h, d, offset]; x = 16 bytes / element size (16 for fp8).
__device__ __forceinline__ int64_t KeyCacheOffset(int64_t block, int offset, int h, int d,
                                                  int num_kv_heads, int head_size, int block_size,
                                                  int x) {
  const int64_t head_base =
      (block * num_kv_heads + h) * static_cast<int64_t>(head_size) * block_size;
  return head_base + static_cast<int64_t>(d / x) * block_size * x + offset * x + d % x;
}
__device__ __forceinline__ int64_t ValueCacheOffset(int64_t block, int offset, int h, int d,
                                                    int num_kv_heads, int head_size,
                                                    int block_size) {
  const int64_t head_base =
      (block * num_kv_heads + h) * static_cast<int64_t>(head_size) * block_size;
  return head_base + static_cast<int64_t>(d) * block_size + offset;
}

// Grid (num_tokens); each thread block scatters one token's K and V of all KV
// heads. Key element (h, d) goes to [block, h, d / x, offset, d % x], value
// element to [block, h, d, offset]. Slots < 0 (padding) and slots at or beyond
// num_slots = num_blocks * block_size are skipped.
template <typename U>
__global__ void ReshapeAndCacheKernel(const U* __restrict__ key, const U* __restrict__ value,
                                      int64_t key_token_stride, int64_t value_token_stride,
                                      const int64_t* __restrict__ slot_mapping, int64_t num_slots,
                                      U* __restrict__ key_cache, U* __restrict__ value_cache,
                                      int num_kv_heads, int head_size, int block_size) {
  constexpr int X = static_cast<int>(16 / sizeof(U));
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0 || slot >= num_slots) return;
  const int64_t block = slot / block_size;
  const int offset = static_cast<int>(slot % block_size);
  const int n = num_kv_heads * head_size;
  const U* k_src = key + token * key_token_stride;
  const U* v_src = value + token * value_token_stride;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int h = i / head_size, d = i % head_size;
    key_cache[KeyCacheOffset(block, offset, h, d, num_kv_heads, head_size, block_size, X)] =
        k_src[i];
    value_cache[ValueCacheOffset(block, offset, h, d, num_kv_heads, head_size, block_size)] =
        v_src[i];
  }
}

// reshape_and_cache into an fp8 cache (C = __nv_fp8_e4m3 / __nv_fp8_e5m2):
// same grid and layout (x = 16), each element stored as
// fp8(x / k_scale) (keys) or fp8(x / v_scale) (values), round to nearest
// even, saturating (cuda_fp8.h __NV_SATFINITE). T: float, __half, __nv_bfloat16.
template <typename T, typename C>
__global__ void ReshapeAndCacheFp8Kernel(const T* __restrict__ key, const T* __restrict__ value,
                                         int64_t key_token_stride, int64_t value_token_stride,
                                         const int64_t* __restrict__ slot_mapping,
                                         int64_t num_slots, uint8_t* __restrict__ key_cache,
                                         uint8_t* __restrict__ value_cache, int num_kv_heads,
                                         int head_size, int block_size, float k_scale,
                                         float v_scale) {
  constexpr int X = CacheElem<C>::kKeyVec;
  const int64_t token = blockIdx.x;
  const int64_t slot = slot_mapping[token];
  if (slot < 0 || slot >= num_slots) return;
  const int64_t block = slot / block_size;
  const int offset = static_cast<int>(slot % block_size);
  const int n = num_kv_heads * head_size;
  const T* k_src = key + token * key_token_stride;
  const T* v_src = value + token * value_token_stride;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int h = i / head_size, d = i % head_size;
    key_cache[KeyCacheOffset(block, offset, h, d, num_kv_heads, head_size, block_size, X)] =
        FloatToFp8<C>(ToFloat(k_src[i]) / k_scale);
    value_cache[ValueCacheOffset(block, offset, h, d, num_kv_heads, head_size, block_size)] =
        FloatToFp8<C>(ToFloat(v_src[i]) / v_scale);
  }
}

// Grid (num_pairs, num_layers): copies block pairs[2p] to block pairs[2p+1] in
// the key and the value cache of one layer, in units of U.
template <typename U>
__global__ void CopyBlocksKernel(const uint64_t* __restrict__ key_ptrs,
                                 const uint64_t* __restrict__ value_ptrs,
                                 const int64_t* __restrict__ pairs, int64_t units_per_block) {
  const int pair = blockIdx.x, layer = blockIdx.y;
  const int64_t src = pairs[2 * pair] * units_per_block;
  const int64_t dst = pairs[2 * pair + 1] * units_per_block;
  U* k = reinterpret_cast<U*>(key_ptrs[layer]);
  U* v = reinterpret_cast<U*>(value_ptrs[layer]);
  for (int64_t i = threadIdx.x; i < units_per_block; i += blockDim.x) {
    k[dst + i] = k[src + i];
    v[dst + i] = v[src + i];
  }
}

}  // namespace pagedserve::kernels::cuda

#endif  // PAGEDSERVE_KERNELS_CUDA_CACHE_KERNELS_CUH_
