// CPU reshape_and_cache: scatters new tokens' K and V into the paged layout of
// kernels/types.h. Keys move in x-element (16-byte) pieces, values element by
// element (their layout puts tokens innermost). An fp8 cache instead converts
// each token's K and V rows from io_dtype to fp32, divides by k_scale /
// v_scale and encodes (kernels/cpu/fp8.h), then scatters the bytes the same way.
#include <cstring>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/common.h"

namespace pagedserve::kernels::cpu {

absl::Status ReshapeAndCache(const ReshapeAndCacheParams& p) {
  const KVCacheShape& cs = p.cache.shape;
  const int hs = cs.head_size;
  const int bs = cs.block_size;
  const int kvh = cs.num_kv_heads;
  const int x = cs.x();
  const size_t esz = DTypeSize(cs.dtype);
  const int64_t row = static_cast<int64_t>(kvh) * hs;
  const int64_t ks = p.key_token_stride != 0 ? p.key_token_stride : row;
  const int64_t vs = p.value_token_stride != 0 ? p.value_token_stride : row;
  const int64_t head_elems = static_cast<int64_t>(hs) * bs;
  const char* key = static_cast<const char*>(p.key);
  const char* value = static_cast<const char*>(p.value);
  char* kc = static_cast<char*>(p.cache.key_cache);
  char* vc = static_cast<char*>(p.cache.value_cache);

  if (IsFp8(cs.dtype)) {
    const DType io = ResolveIoDType(p.io_dtype, cs.dtype);
    const size_t isz = DTypeSize(io);
#pragma omp parallel if (p.num_tokens > 64)
    {
      std::vector<float> f(hs);
      std::vector<uint8_t> kq(hs), vq(hs);
#pragma omp for schedule(static)
      for (int t = 0; t < p.num_tokens; ++t) {
        const int64_t slot = p.slot_mapping[t];
        if (slot < 0) continue;  // padding
        const int64_t block = slot / bs;
        const int off = static_cast<int>(slot % bs);
        for (int h = 0; h < kvh; ++h) {
          const int64_t base = (block * kvh + h) * head_elems;  // 1-byte elements
          LoadRow(io, key + (t * ks + static_cast<int64_t>(h) * hs) * isz, hs, f.data());
          StoreFp8Row(cs.dtype, f.data(), p.cache.k_scale, hs, kq.data());
          LoadRow(io, value + (t * vs + static_cast<int64_t>(h) * hs) * isz, hs, f.data());
          StoreFp8Row(cs.dtype, f.data(), p.cache.v_scale, hs, vq.data());
          for (int c = 0; c < hs / x; ++c)
            std::memcpy(kc + base + (static_cast<int64_t>(c) * bs + off) * x,
                        kq.data() + static_cast<size_t>(c) * x, x);
          for (int d = 0; d < hs; ++d)
            vc[base + static_cast<int64_t>(d) * bs + off] = static_cast<char>(vq[d]);
        }
      }
    }
    return absl::OkStatus();
  }

#pragma omp parallel for schedule(static) if (p.num_tokens > 64)
  for (int t = 0; t < p.num_tokens; ++t) {
    const int64_t slot = p.slot_mapping[t];
    if (slot < 0) continue;  // padding
    const int64_t block = slot / bs;
    const int off = static_cast<int>(slot % bs);
    for (int h = 0; h < kvh; ++h) {
      const int64_t base = (block * kvh + h) * head_elems;
      const char* ksrc = key + (t * ks + static_cast<int64_t>(h) * hs) * esz;
      const char* vsrc = value + (t * vs + static_cast<int64_t>(h) * hs) * esz;
      // key_cache[block, h, c, off, :] = key[t, h, c*x : c*x + x]
      for (int c = 0; c < hs / x; ++c)
        std::memcpy(kc + (base + (static_cast<int64_t>(c) * bs + off) * x) * esz,
                    ksrc + static_cast<size_t>(c) * x * esz, x * esz);
      // value_cache[block, h, d, off] = value[t, h, d]
      char* vdst = vc + (base + off) * esz;
      for (int d = 0; d < hs; ++d)
        std::memcpy(vdst + static_cast<size_t>(d) * bs * esz, vsrc + d * esz, esz);
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedserve::kernels::cpu
