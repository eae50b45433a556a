// reshape_and_cache: writes new tokens' keys and values into the paged cache.
#ifndef PAGEDSERVE_KERNELS_RESHAPE_AND_CACHE_H_
#define PAGEDSERVE_KERNELS_RESHAPE_AND_CACHE_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "kernels/types.h"

namespace pagedserve::kernels {

struct ReshapeAndCacheParams {
  // key[t, h, d] at key + t * key_token_stride + h * head_size + d (elements);
  // likewise value. Strides let callers pass slices of a fused QKV buffer.
  // Element type io_dtype (below); same device as the cache.
  const void* key = nullptr;       // [num_tokens, num_kv_heads, head_size]
  const void* value = nullptr;     // [num_tokens, num_kv_heads, head_size]
  int64_t key_token_stride = 0;    // elements; 0 means num_kv_heads * head_size
  int64_t value_token_stride = 0;  // elements; 0 means num_kv_heads * head_size
  // slot_mapping[t] = physical_block * block_size + offset_in_block; a negative
  // slot marks padding and the token is skipped. int64, same device as the cache.
  const int64_t* slot_mapping = nullptr;  // [num_tokens]
  int num_tokens = 0;
  KVCacheView cache;
  // Element type of key and value. Unset means cache.shape.dtype (the only
  // choice for fp32/fp16/bf16 caches). An fp8 cache requires it, as kFloat32,
  // kFloat16 or kBFloat16: elements are converted to fp8(x / cache.k_scale)
  // (keys) and fp8(x / cache.v_scale) (values), rounded to nearest even and
  // saturated to the largest finite fp8 (kernels/types.h).
  std::optional<DType> io_dtype;
  void* stream = nullptr;  // cudaStream_t for kCUDA; ignored on CPU
};

// Scatters every non-padding token t into block slot_mapping[t] / block_size at
// offset slot_mapping[t] % block_size, in the layouts of kernels/types.h.
// Errors (before anything is written): InvalidArgument for a bad cache view,
// a bad io_dtype (ValidateIoDType), null pointers with num_tokens > 0, or (when slot_mapping is
// host-readable, i.e. on CPU) a slot at or beyond num_blocks * block_size.
absl::Status ReshapeAndCache(const ReshapeAndCacheParams& p);

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_RESHAPE_AND_CACHE_H_
