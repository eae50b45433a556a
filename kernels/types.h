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
// consecutive elements of one key vector (x = 4 fp32, 8 fp16/bf16, 16 fp8). The
// CPU backend uses the same layout so that the block manager, the tests and
// swap/copy are backend-agnostic.
//
// fp8 KV cache (vLLM's --kv-cache-dtype fp8*, csrc/quantization/fp8): elements
// are OCP 8-bit floats ("OCP 8-bit Floating Point Specification (OFP8)" rev 1.0,
// 2023) with one fp32 scale per layer for K and one for V:
//   stored = fp8(x / k_scale)   round to nearest even, saturating to +-max finite
//                               (448 e4m3, 57344 e5m2), NaN stays NaN
//   read   = float(stored) * k_scale            (likewise v_scale for values)
// Kernels convert in registers as they load; queries, new K/V and outputs are
// never fp8 (see the io_dtype fields of the kernel params).
#ifndef PAGEDSERVE_KERNELS_TYPES_H_
#define PAGEDSERVE_KERNELS_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"

namespace pagedserve::kernels {

// Element type of queries, keys, values, outputs and of the KV cache. Softmax
// and accumulation are always fp32. The fp8 types are KV-cache-only:
//   kFloat8E4M3: OCP E4M3 "fn" (1 sign, 4 exponent bits bias 7, 3 mantissa
//                bits; no infinities, S.1111.111 is NaN; max finite 448)
//   kFloat8E5M2: OCP E5M2 (IEEE-like: bias 15, 2 mantissa bits, inf/NaN;
//                max finite 57344)
// The numbering is part of kernels/cuda/launch.h's Elem (same order).
enum class DType : uint8_t { kFloat32, kFloat16, kBFloat16, kFloat8E4M3, kFloat8E5M2 };

// Bytes per element: 4, 2, 2, 1, 1.
constexpr size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat16:
    case DType::kBFloat16: return 2;
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: return 1;
  }
  return 4;
}
// True for the 8-bit KV-cache types.
constexpr bool IsFp8(DType t) { return t == DType::kFloat8E4M3 || t == DType::kFloat8E5M2; }
// "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2".
const char* DTypeName(DType t);

// The element type of the non-cache operands of a kernel (queries, new K/V,
// outputs) given the params' optional io_dtype and the cache dtype:
// io_dtype when set, else the cache dtype (which, for an fp8 cache, the
// validation rejects: an fp8 cache needs an explicit fp32/fp16/bf16 io_dtype).
constexpr DType ResolveIoDType(const std::optional<DType>& io_dtype, DType cache) {
  return io_dtype.has_value() ? *io_dtype : cache;
}

// Checks io_dtype against a cache dtype: for fp32/fp16/bf16 caches io_dtype
// must be unset or equal to the cache dtype; for fp8 caches it must be set to
// fp32, fp16 or bf16. InvalidArgument naming `field` otherwise.
absl::Status ValidateIoDType(const std::optional<DType>& io_dtype, DType cache,
                             const char* field = "io_dtype");

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

  // Elements per 16-byte vector of the key layout: 4 (fp32), 8 (fp16/bf16) or
  // 16 (fp8).
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
  // Per-layer dequantization scales of an fp8 cache (vLLM's k_scale /
  // v_scale): a stored key element s means s * k_scale, and reshape_and_cache
  // stores fp8(k / k_scale). Finite and > 0. Ignored (must still be finite
  // and > 0) for fp32/fp16/bf16 caches. 1.0 is vLLM's default when a
  // checkpoint carries no scales.
  float k_scale = 1.0f;
  float v_scale = 1.0f;
};

// Head sizes and block sizes every backend supports.
bool IsSupportedHeadSize(int head_size);    // 64, 80, 96, 112, 128, 256
bool IsSupportedBlockSize(int block_size);  // 8, 16, 32

// Checks a cache view: known dtype, supported head/block size, positive counts,
// non-null buffers, head_size divisible by x, finite positive k_scale/v_scale.
// Returns InvalidArgument naming the field.
absl::Status ValidateCacheView(const KVCacheView& cache);

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_TYPES_H_
