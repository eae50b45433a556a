// Internal: maps the runtime element type and head size onto the compile-time
// template parameters of the CUDA kernels. Supported head sizes: 64, 80, 96,
// 112, 128, 256 (kernels::IsSupportedHeadSize).
#ifndef PAGEDSERVE_KERNELS_CUDA_DISPATCH_CUH_
#define PAGEDSERVE_KERNELS_CUDA_DISPATCH_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/cuda/launch.h"

namespace pagedserve::kernels::cuda {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>{}, std::integral_constant<int, HEAD_SIZE>{}).
template <typename Fn>
cudaError_t DispatchHead(int head_size, Fn&& fn) {
  switch (head_size) {
    case 64: return fn(std::integral_constant<int, 64>{});
    case 80: return fn(std::integral_constant<int, 80>{});
    case 96: return fn(std::integral_constant<int, 96>{});
    case 112: return fn(std::integral_constant<int, 112>{});
    case 128: return fn(std::integral_constant<int, 128>{});
    case 256: return fn(std::integral_constant<int, 256>{});
    default: return cudaErrorInvalidValue;
  }
}

template <typename Fn>
cudaError_t DispatchElemHead(Elem elem, int head_size, Fn&& fn) {
  switch (elem) {
    case Elem::kF32:
      return DispatchHead(head_size, [&](auto hs) { return fn(TypeTag<float>{}, hs); });
    case Elem::kF16:
      return DispatchHead(head_size, [&](auto hs) { return fn(TypeTag<__half>{}, hs); });
    case Elem::kBF16:
      return DispatchHead(head_size, [&](auto hs) { return fn(TypeTag<__nv_bfloat16>{}, hs); });
    default: return cudaErrorInvalidValue;
  }
}

// Calls fn(TypeTag<T>{}, TypeTag<CACHE_T>{}, std::integral_constant<int,
// HEAD_SIZE>{}) for the io element type T and the cache element type CACHE_T:
// (T, T) for fp32/fp16/bf16 caches (io must equal the cache element), and
// T in {float, __half, __nv_bfloat16} x CACHE_T in {__nv_fp8_e4m3,
// __nv_fp8_e5m2} for fp8 caches. cudaErrorInvalidValue for other combinations.
template <typename Fn>
cudaError_t DispatchIoCacheHead(Elem io, Elem cache, int head_size, Fn&& fn) {
  auto with_io = [&](auto cache_tag) -> cudaError_t {
    switch (io) {
      case Elem::kF32:
        return DispatchHead(head_size,
                            [&](auto hs) { return fn(TypeTag<float>{}, cache_tag, hs); });
      case Elem::kF16:
        return DispatchHead(head_size,
                            [&](auto hs) { return fn(TypeTag<__half>{}, cache_tag, hs); });
      case Elem::kBF16:
        return DispatchHead(head_size,
                            [&](auto hs) { return fn(TypeTag<__nv_bfloat16>{}, cache_tag, hs); });
      default: return cudaErrorInvalidValue;
    }
  };
  switch (cache) {
    case Elem::kFp8E4M3: return with_io(TypeTag<__nv_fp8_e4m3>{});
    case Elem::kFp8E5M2: return with_io(TypeTag<__nv_fp8_e5m2>{});
    default:
      if (io != cache) return cudaErrorInvalidValue;
      return DispatchElemHead(cache, head_size, [&](auto t, auto hs) { return fn(t, t, hs); });
  }
}

}  // namespace pagedserve::kernels::cuda

#endif  // PAGEDSERVE_KERNELS_CUDA_DISPATCH_CUH_
