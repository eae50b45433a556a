// The small kernels of the CUDA backend: __global__ wrappers of the
// bodies in model_kernels.cuh and their launchers (model_kernels.h).
#include "runtime/worker/cuda/model_kernels.h"

#include <type_traits>

#include "runtime/worker/cuda/model_kernels.cuh"
#include "runtime/worker/cuda/sampling_kernels.cuh"

namespace pagedserve::cuda_model {
namespace {

// Grid-stride element count -> number of blocks, capped so that the grid
// fits the 1-D limit comfortably; kernels loop over the remainder.
unsigned int BlocksFor(int64_t count) {
  int64_t blocks = (count + kThreads - 1) / kThreads;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
  return static_cast<unsigned int>(blocks);
}

// Calls fn(std::integral_constant<int, V>{}) with V = pack (kPack or 1):
// the VEC of a body, from PackWidth.
template <typename Fn>
cudaError_t WithPack(int pack, Fn&& fn) {
  if (pack == kPack) return fn(std::integral_constant<int, kPack>{});
  return fn(std::integral_constant<int, 1>{});
}

template <typename T, int VEC>
__global__ void EmbeddingGatherKernel(const T* __restrict__ table, const int32_t* __restrict__ ids,
                                      int hidden, float* __restrict__ out) {
  EmbeddingGatherBody<T, VEC>(table, ids, hidden, out);
}

__global__ void __launch_bounds__(kThreads)
    GreedyArgmaxKernel(const float* __restrict__ logits, int64_t vocab, int32_t* __restrict__ out) {
  GreedyArgmaxBody<kThreads>(logits, vocab, out);
}

// Threads per block of the sampling kernel: a row's passes are bound by
// its vocab / threads elements per thread and the 256-bucket scans.
constexpr int kSampleThreads = 512;

__global__ void __launch_bounds__(kSampleThreads)
    SampleRowsKernel(float* __restrict__ logits, int64_t vocab, const SampleBuffers b) {
  SampleRowsBody<kSampleThreads>(logits, vocab, b);
}

template <typename T, int VEC>
__global__ void RopeConvertKernel(const float* x, int heads, int head_size, int rot_half,
                                  int64_t token_stride, const float* __restrict__ bias,
                                  const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                  T* out) {
  RopeConvertBody<T, VEC>(x, heads, head_size, rot_half, token_stride, bias, cos_t, sin_t, out);
}

template <typename C, int VEC>
__global__ void RopeReshapeAndCacheKernel(
    const float* __restrict__ key, const float* __restrict__ value, int64_t token_stride,
    const float* __restrict__ k_bias, const float* __restrict__ v_bias, int num_kv_heads,
    int head_size, int rot_half, const float* __restrict__ cos_t, const float* __restrict__ sin_t,
    const int64_t* __restrict__ slot_mapping, int64_t num_blocks, int block_size,
    C* __restrict__ key_cache, C* __restrict__ value_cache, float k_scale, float v_scale) {
  RopeReshapeAndCacheBody<C, VEC>(key, value, token_stride, k_bias, v_bias, num_kv_heads, head_size,
                                  rot_half, cos_t, sin_t, slot_mapping, num_blocks, block_size,
                                  key_cache, value_cache, k_scale, v_scale);
}

template <typename From, typename To, int VEC>
__global__ void ConvertKernel(const From* __restrict__ in, int64_t count, To* __restrict__ out) {
  ConvertBody<From, To, VEC>(in, count, out);
}

// Calls fn(T{}) with a value of the C++ type of `e`.
template <typename Fn>
cudaError_t WithElem(Elem e, Fn&& fn) {
  switch (e) {
    case Elem::kF32: return fn(float{});
    case Elem::kF16: return fn(__half{});
    case Elem::kBF16: return fn(__nv_bfloat16{});
  }
  return cudaErrorInvalidValue;
}

template <typename OutT, typename AddT, int VEC>
__global__ void __launch_bounds__(kThreads)
    AddRmsNormKernel(float* residual, const AddT* __restrict__ add,
                     const int32_t* __restrict__ rows, const float* __restrict__ weight, int dim,
                     double eps, OutT* __restrict__ out) {
  AddRmsNormBody<kThreads, OutT, AddT, VEC>(residual, add, rows, weight, dim, eps, out);
}

template <typename AddT, int VEC>
__global__ void __launch_bounds__(kThreads)
    AddPostRmsNormKernel(float* __restrict__ residual, const AddT* __restrict__ add,
                         const float* __restrict__ weight, int dim, double eps) {
  AddPostRmsNormBody<kThreads, AddT, VEC>(residual, add, weight, dim, eps);
}

template <int VEC>
__global__ void ScaleKernel(float* __restrict__ x, int64_t count, float factor) {
  ScaleBody<VEC>(x, count, factor);
}

__global__ void SoftcapKernel(float* __restrict__ x, int64_t count, double cap) {
  SoftcapBody(x, count, cap);
}

// The gated activations act(gate) * up: one kernel and one launcher over the
// activation's body.
struct SiluAct {
  template <typename OutT, int VEC>
  __device__ static void Body(const float* gate, const float* up, int64_t count, OutT* out) {
    SiluMulBody<OutT, VEC>(gate, up, count, out);
  }
};
struct GeluTanhAct {
  template <typename OutT, int VEC>
  __device__ static void Body(const float* gate, const float* up, int64_t count, OutT* out) {
    GeluTanhMulBody<OutT, VEC>(gate, up, count, out);
  }
};

template <typename Act, typename OutT, int VEC>
__global__ void GatedMulKernel(const float* gate, const float* __restrict__ up, int64_t count,
                               OutT* out) {
  Act::template Body<OutT, VEC>(gate, up, count, out);
}

template <int VEC>
__global__ void ApplyRopeKernel(float* __restrict__ x, int heads, int head_size, int rot_half,
                                int64_t token_stride, const float* __restrict__ cos_t,
                                const float* __restrict__ sin_t) {
  ApplyRopeBody<VEC>(x, heads, head_size, rot_half, token_stride, cos_t, sin_t);
}

__global__ void AddBiasKernel(float* __restrict__ y, const float* __restrict__ bias, int64_t total,
                              int cols) {
  AddBiasBody(y, bias, total, cols);
}

template <typename OutT, int VEC>
__global__ void SiluMulStackedKernel(const float* __restrict__ y, int64_t n, int inter,
                                     OutT* __restrict__ out) {
  SiluMulStackedBody<OutT, VEC>(y, n, inter, out);
}

template <typename T, int VEC>
__global__ void MoeGatherRowsKernel(const T* __restrict__ x, const int32_t* __restrict__ tokens,
                                    int hidden, T* __restrict__ out) {
  MoeGatherRowsBody<T, VEC>(x, tokens, hidden, out);
}

template <typename OutT, int VEC>
__global__ void MoeCombineKernel(const float* __restrict__ pair_out,
                                 const int32_t* __restrict__ token_pairs,
                                 const float* __restrict__ pair_weights, int top_k, int hidden,
                                 const float* __restrict__ shared_out,
                                 const float* __restrict__ shared_logit, OutT* __restrict__ y) {
  MoeCombineBody<OutT, VEC>(pair_out, token_pairs, pair_weights, top_k, hidden, shared_out,
                            shared_logit, y);
}

template <typename Act>
cudaError_t LaunchGatedMul(const float* gate, const float* up, int64_t count, void* out,
                           Elem out_type, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  return WithElem(out_type, [&](auto tag) {
    using OutT = decltype(tag);
    OutT* o = static_cast<OutT*>(out);
    const int pack = PackWidth({count}, {Packable(gate), Packable(up), Packable(o)});
    return WithPack(pack, [&](auto vec) {
      GatedMulKernel<Act, OutT, decltype(vec)::value>
          <<<BlocksFor(count / decltype(vec)::value), kThreads, 0, stream>>>(gate, up, count, o);
      return cudaGetLastError();
    });
  });
}

}  // namespace

cudaError_t LaunchEmbeddingGather(const void* table, Elem table_type, const int32_t* ids, int n,
                                  int hidden, float* out, cudaStream_t stream) {
  if (n <= 0 || hidden <= 0) return cudaSuccess;
  return WithElem(table_type, [&](auto t) {
    using T = decltype(t);
    const T* tab = static_cast<const T*>(table);
    return WithPack(PackWidth({hidden}, {Packable(tab), Packable(out)}), [&](auto vec) {
      EmbeddingGatherKernel<T, decltype(vec)::value>
          <<<n, kThreads, 0, stream>>>(tab, ids, hidden, out);
      return cudaGetLastError();
    });
  });
}

cudaError_t LaunchConvert(const void* in, Elem in_type, int64_t count, void* out, Elem out_type,
                          cudaStream_t stream) {
  if (in_type == out_type) return cudaErrorInvalidValue;
  if (count <= 0) return cudaSuccess;
  return WithElem(in_type, [&](auto from) {
    return WithElem(out_type, [&](auto to) {
      using From = decltype(from);
      using To = decltype(to);
      const From* src = static_cast<const From*>(in);
      To* dst = static_cast<To*>(out);
      return WithPack(PackWidth({count}, {Packable(src), Packable(dst)}), [&](auto vec) {
        ConvertKernel<From, To, decltype(vec)::value>
            <<<BlocksFor(count / decltype(vec)::value), kThreads, 0, stream>>>(src, count, dst);
        return cudaGetLastError();
      });
    });
  });
}

cudaError_t LaunchAddRmsNorm(float* residual, const void* add, Elem add_type, const int32_t* rows,
                             const float* weight, int n, int dim, double eps, void* out,
                             Elem out_type, cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return cudaSuccess;
  return WithElem(out_type, [&](auto out_tag) {
    return WithElem(add_type, [&](auto add_tag) {
      using OutT = decltype(out_tag);
      using AddT = decltype(add_tag);
      const AddT* a = static_cast<const AddT*>(add);
      OutT* o = static_cast<OutT*>(out);
      const int pack =
          PackWidth({dim}, {Packable(residual), Packable(a), Packable(weight), Packable(o)});
      return WithPack(pack, [&](auto vec) {
        AddRmsNormKernel<OutT, AddT, decltype(vec)::value>
            <<<n, kThreads, 0, stream>>>(residual, a, rows, weight, dim, eps, o);
        return cudaGetLastError();
      });
    });
  });
}

cudaError_t LaunchAddPostRmsNorm(float* residual, const void* add, Elem add_type,
                                 const float* weight, int n, int dim, double eps,
                                 cudaStream_t stream) {
  if (n <= 0 || dim <= 0) return cudaSuccess;
  if (add == nullptr) return cudaErrorInvalidValue;
  return WithElem(add_type, [&](auto add_tag) {
    using AddT = decltype(add_tag);
    const AddT* a = static_cast<const AddT*>(add);
    const int pack = PackWidth({dim}, {Packable(residual), Packable(a), Packable(weight)});
    return WithPack(pack, [&](auto vec) {
      AddPostRmsNormKernel<AddT, decltype(vec)::value>
          <<<n, kThreads, 0, stream>>>(residual, a, weight, dim, eps);
      return cudaGetLastError();
    });
  });
}

cudaError_t LaunchScale(float* x, int64_t count, float factor, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  return WithPack(PackWidth({count}, {Packable(x)}), [&](auto vec) {
    ScaleKernel<decltype(vec)::value>
        <<<BlocksFor(count / decltype(vec)::value), kThreads, 0, stream>>>(x, count, factor);
    return cudaGetLastError();
  });
}

cudaError_t LaunchSoftcap(float* x, int64_t count, double cap, cudaStream_t stream) {
  if (!(cap > 0)) return cudaErrorInvalidValue;
  if (count <= 0) return cudaSuccess;
  SoftcapKernel<<<BlocksFor(count), kThreads, 0, stream>>>(x, count, cap);
  return cudaGetLastError();
}

cudaError_t LaunchGeluTanhMul(const float* gate, const float* up, int64_t count, void* out,
                              Elem out_type, cudaStream_t stream) {
  return LaunchGatedMul<GeluTanhAct>(gate, up, count, out, out_type, stream);
}

cudaError_t LaunchApplyRope(float* x, int n, int heads, int head_size, int rot_half,
                            int64_t token_stride, const float* cos_t, const float* sin_t,
                            cudaStream_t stream) {
  if (n <= 0 || heads <= 0 || head_size < 2) return cudaSuccess;
  if (rot_half < 1 || 2 * rot_half > head_size) return cudaErrorInvalidValue;
  const int pack =
      PackWidth({rot_half, token_stride}, {Packable(x), Packable(cos_t), Packable(sin_t)});
  return WithPack(pack, [&](auto vec) {
    ApplyRopeKernel<decltype(vec)::value>
        <<<n, kThreads, 0, stream>>>(x, heads, head_size, rot_half, token_stride, cos_t, sin_t);
    return cudaGetLastError();
  });
}

cudaError_t LaunchAddBias(float* y, const float* bias, int n, int cols, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(n) * cols;
  if (total <= 0) return cudaSuccess;
  AddBiasKernel<<<BlocksFor(total), kThreads, 0, stream>>>(y, bias, total, cols);
  return cudaGetLastError();
}

cudaError_t LaunchSiluMul(const float* gate, const float* up, int64_t count, void* out,
                          Elem out_type, cudaStream_t stream) {
  return LaunchGatedMul<SiluAct>(gate, up, count, out, out_type, stream);
}

cudaError_t LaunchSiluMulStacked(const float* y, int64_t n, int inter, void* out, Elem out_type,
                                 cudaStream_t stream) {
  if (n <= 0 || inter <= 0) return cudaSuccess;
  return WithElem(out_type, [&](auto tag) {
    using OutT = decltype(tag);
    OutT* o = static_cast<OutT*>(out);
    return WithPack(PackWidth({inter}, {Packable(y), Packable(o)}), [&](auto vec) {
      SiluMulStackedKernel<OutT, decltype(vec)::value>
          <<<BlocksFor(n * inter / decltype(vec)::value), kThreads, 0, stream>>>(y, n, inter, o);
      return cudaGetLastError();
    });
  });
}

cudaError_t LaunchMoeGatherRows(const void* x, Elem type, const int32_t* tokens, int64_t pairs,
                                int hidden, void* out, cudaStream_t stream) {
  if (pairs <= 0 || hidden <= 0) return cudaSuccess;
  if (pairs > 0x7fffffff) return cudaErrorInvalidValue;  // one block per pair
  return WithElem(type, [&](auto tag) {
    using T = decltype(tag);
    const T* src = static_cast<const T*>(x);
    T* dst = static_cast<T*>(out);
    return WithPack(PackWidth({hidden}, {Packable(src), Packable(dst)}), [&](auto vec) {
      MoeGatherRowsKernel<T, decltype(vec)::value>
          <<<static_cast<unsigned int>(pairs), kThreads, 0, stream>>>(src, tokens, hidden, dst);
      return cudaGetLastError();
    });
  });
}

cudaError_t LaunchMoeCombine(const float* pair_out, const int32_t* token_pairs,
                             const float* pair_weights, int64_t n, int top_k, int hidden,
                             const float* shared_out, const float* shared_logit, void* y,
                             Elem y_type, cudaStream_t stream) {
  if (n <= 0 || hidden <= 0) return cudaSuccess;
  if (top_k < 1 || n > 0x7fffffff || (shared_out != nullptr && shared_logit == nullptr))
    return cudaErrorInvalidValue;
  return WithElem(y_type, [&](auto tag) {
    using OutT = decltype(tag);
    OutT* o = static_cast<OutT*>(y);
    const int pack = PackWidth({hidden}, {Packable(pair_out), Packable(shared_out), Packable(o)});
    return WithPack(pack, [&](auto vec) {
      MoeCombineKernel<OutT, decltype(vec)::value>
          <<<static_cast<unsigned int>(n), kThreads, 0, stream>>>(
              pair_out, token_pairs, pair_weights, top_k, hidden, shared_out, shared_logit, o);
      return cudaGetLastError();
    });
  });
}

cudaError_t LaunchRopeConvert(const float* x, int n, int heads, int head_size, int rot_half,
                              int64_t token_stride, const float* bias, const float* cos_t,
                              const float* sin_t, void* out, Elem out_type, cudaStream_t stream) {
  if (n <= 0 || heads <= 0 || head_size < 2) return cudaSuccess;
  if (rot_half < 1 || 2 * rot_half > head_size) return cudaErrorInvalidValue;
  return WithElem(out_type, [&](auto t) {
    using T = decltype(t);
    T* o = static_cast<T*>(out);
    const int pack =
        PackWidth({rot_half, token_stride},
                  {Packable(x), Packable(bias), Packable(cos_t), Packable(sin_t), Packable(o)});
    return WithPack(pack, [&](auto vec) {
      RopeConvertKernel<T, decltype(vec)::value><<<n, kThreads, 0, stream>>>(
          x, heads, head_size, rot_half, token_stride, bias, cos_t, sin_t, o);
      return cudaGetLastError();
    });
  });
}

cudaError_t LaunchRopeReshapeAndCache(const float* key, const float* value, int64_t token_stride,
                                      const float* k_bias, const float* v_bias, int n,
                                      int num_kv_heads, int head_size, int rot_half,
                                      const float* cos_t, const float* sin_t,
                                      const int64_t* slot_mapping, int64_t num_blocks,
                                      int block_size, void* key_cache, void* value_cache,
                                      CacheType type, float k_scale, float v_scale,
                                      cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (num_kv_heads <= 0 || head_size < 2 || block_size <= 0 || rot_half < 1 ||
      2 * rot_half > head_size || token_stride < static_cast<int64_t>(num_kv_heads) * head_size)
    return cudaErrorInvalidValue;
  auto launch = [&](auto tag) {
    using C = decltype(tag);
    C* kc = static_cast<C*>(key_cache);
    C* vc = static_cast<C*>(value_cache);
    const int pack = PackWidth({rot_half, token_stride},
                               {Packable(key), Packable(value), Packable(k_bias), Packable(v_bias),
                                Packable(cos_t), Packable(sin_t), Packable(kc)});
    return WithPack(pack, [&](auto vec) {
      RopeReshapeAndCacheKernel<C, decltype(vec)::value><<<n, kThreads, 0, stream>>>(
          key, value, token_stride, k_bias, v_bias, num_kv_heads, head_size, rot_half, cos_t, sin_t,
          slot_mapping, num_blocks, block_size, kc, vc, k_scale, v_scale);
      return cudaGetLastError();
    });
  };
  switch (type) {
    case CacheType::kF32: return launch(float{});
    case CacheType::kF16: return launch(__half{});
    case CacheType::kBF16: return launch(__nv_bfloat16{});
    case CacheType::kFp8E4M3: return launch(__nv_fp8_e4m3{});
    case CacheType::kFp8E5M2: return launch(__nv_fp8_e5m2{});
  }
  return cudaErrorInvalidValue;
}

cudaError_t LaunchGreedyArgmax(const float* logits, int n, int64_t vocab, int32_t* out,
                               cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  GreedyArgmaxKernel<<<n, kThreads, 0, stream>>>(logits, vocab, out);
  return cudaGetLastError();
}

cudaError_t LaunchSampleRows(float* logits, int n, int64_t vocab, const SampleBuffers& b,
                             cudaStream_t stream) {
  if (vocab < 1 || vocab > kMaxSampleVocab) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  SampleRowsKernel<<<n, kSampleThreads, 0, stream>>>(logits, vocab, b);
  return cudaGetLastError();
}

}  // namespace pagedserve::cuda_model
