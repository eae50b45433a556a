// Element types, devices and the paged KV-cache view shared by every kernel.
//
// The layout is vLLM's PagedAttention layout (Kwon et al., "Efficient Memory
// Management for Large Language Model Serving with PagedAttention", SOSP 2023;
// vLLM csrc/attention). One physical block holds `block_size` tokens of one
// layer's K and V for this rank's KV heads:
//
//   key_cache   [num_blocks, num_kv_heads, head_size / x, block_size, x]
//   value_cache [num_blocks, num_kv_heads, head_size, block_size]
//
// with x = 16 bytes / sizeof(element), so that one 16-byte load reads x
// consecutive elements of one key vector. The CPU backend uses the same layout
// so that the block manager, the tests and swap/copy are backend-agnostic.
#ifndef PAGEDSERVE_KERNELS_TYPES_H_
#define PAGEDSERVE_KERNELS_TYPES_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace pagedserve::kernels {

// Element type of queries, keys, values and outputs. Softmax and accumulation
// are always fp32.
enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16 };

// Bytes per element: 4, 2, 2.
constexpr size_t DTypeSize(DType t) { return t == DType::kFloat32 ? 4 : 2; }
// "f32", "f16", "bf16".
const char* DTypeName(DType t);

// Where a buffer lives. kCUDA buffers are device pointers on the current device.
enum class Device : uint8_t { kCPU, kCUDA };
const char* DeviceName(Device d);

// Shape of one layer's paged KV cache on one rank.
struct KVCacheShape {
  int64_t num_blocks = 0;  // physical blocks in the pool
  int num_kv_heads = 0;    // KV heads held by this rank
  int head_size = 0;       // elements per head
  int block_size = 0;      // tokens per block
  DType dtype = DType::kFloat32;

  // Elements per 16-byte vector of the key layout: 4 (fp32) or 8 (fp16/bf16).
  int x() const { return static_cast<int>(16 / DTypeSize(dtype)); }
  // Elements of K (or of V) in one block: num_kv_heads * head_size * block_size.
  int64_t block_elems() const {
    return static_cast<int64_t>(num_kv_heads) * head_size * block_size;
  }
  // Bytes of K (or of V) in one block.
  size_t block_bytes() const { return static_cast<size_t>(block_elems()) * DTypeSize(dtype); }
};

// A non-owning view of one layer's paged KV cache (cf. FlashInfer's paged_kv_t).
struct KVCacheView {
  void* key_cache = nullptr;    // [num_blocks, num_kv_heads, head_size/x, block_size, x]
  void* value_cache = nullptr;  // [num_blocks, num_kv_heads, head_size, block_size]
  KVCacheShape shape;
  Device device = Device::kCPU;
};

// Head sizes and block sizes every backend supports.
bool IsSupportedHeadSize(int head_size);   // 64, 80, 96, 112, 128, 256
bool IsSupportedBlockSize(int block_size); // 8, 16, 32

// Checks a cache view: supported head/block size, positive counts, non-null
// buffers, head_size divisible by x. Returns InvalidArgument naming the field.
absl::Status ValidateCacheView(const KVCacheView& cache);

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_TYPES_H_
