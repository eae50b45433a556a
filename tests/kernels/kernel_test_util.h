// Host-side helpers of the kernel tests: a paged KV cache in host memory
// filled through the test's own indexing of the kernels/types.h layout, random
// decode problems with shuffled (non-contiguous) block tables, and dtype
// conversions. Header-only so that the CUDA tests can reuse it (they copy the
// host buffers to the device).
#ifndef PAGEDSERVE_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
#define PAGEDSERVE_TESTS_KERNELS_KERNEL_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/fp8.h"
#include "kernels/cpu/half.h"
#include "kernels/types.h"
#include "tests/kernels/reference_attention.h"

namespace pagedserve::kernels::testing {

// Stores v (rounded to nearest even) as element i of a dtype-typed buffer
// (fp8: the raw code of v, i.e. with scale 1; saturating).
inline void StoreElem(DType t, void* base, int64_t i, float v) {
  switch (t) {
    case DType::kFloat32: static_cast<float*>(base)[i] = v; break;
    case DType::kFloat16: static_cast<uint16_t*>(base)[i] = FloatToHalfBits(v); break;
    case DType::kBFloat16: static_cast<uint16_t*>(base)[i] = FloatToBFloat16Bits(v); break;
    case DType::kFloat8E4M3: static_cast<uint8_t*>(base)[i] = FloatToFp8E4M3Bits(v); break;
    case DType::kFloat8E5M2: static_cast<uint8_t*>(base)[i] = FloatToFp8E5M2Bits(v); break;
  }
}
inline float LoadElem(DType t, const void* base, int64_t i) {
  switch (t) {
    case DType::kFloat32: return static_cast<const float*>(base)[i];
    case DType::kFloat16: return HalfBitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kBFloat16: return BFloat16BitsToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kFloat8E4M3: return Fp8E4M3BitsToFloat(static_cast<const uint8_t*>(base)[i]);
    case DType::kFloat8E5M2: return Fp8E5M2BitsToFloat(static_cast<const uint8_t*>(base)[i]);
  }
  return 0.0f;
}
// v as stored in dtype t.
// `f` stored as elements of type t (bytes), and back: the operands and outputs
// of the kernels under test in their wire format.
inline std::vector<uint8_t> Encode(const std::vector<float>& f, DType t) {
  std::vector<uint8_t> out(f.size() * DTypeSize(t));
  for (size_t i = 0; i < f.size(); ++i) StoreElem(t, out.data(), static_cast<int64_t>(i), f[i]);
  return out;
}
inline std::vector<float> Decode(const uint8_t* raw, size_t n, DType t) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = LoadElem(t, raw, static_cast<int64_t>(i));
  return f;
}
inline float RoundTo(DType t, float v) {
  float out;
  uint16_t tmp[2];
  StoreElem(t, t == DType::kFloat32 ? static_cast<void*>(&out) : static_cast<void*>(tmp), 0, v);
  return t == DType::kFloat32 ? out : LoadElem(t, tmp, 0);
}

// Tolerances of attention outputs: tests/kernels/attention_check.h.

// One layer's paged cache in host memory. Every element starts as NaN (the
// "garbage" that unused slots must never leak).
class HostPagedCache {
 public:
  explicit HostPagedCache(const KVCacheShape& s) : shape_(s) {
    const size_t n = static_cast<size_t>(s.num_blocks) * s.block_elems();
    key_.resize(n * DTypeSize(s.dtype));
    value_.resize(n * DTypeSize(s.dtype));
    Fill(std::numeric_limits<float>::quiet_NaN());
  }
  void Fill(float v) {
    const int64_t n = shape_.num_blocks * shape_.block_elems();
    for (int64_t i = 0; i < n; ++i) {
      StoreElem(shape_.dtype, key_.data(), i, v);
      StoreElem(shape_.dtype, value_.data(), i, v);
    }
  }
  KVCacheView view() {
    KVCacheView v;
    v.key_cache = key_.data();
    v.value_cache = value_.data();
    v.shape = shape_;
    v.device = Device::kCPU;
    return v;
  }
  const KVCacheShape& shape() const { return shape_; }
  std::vector<uint8_t>& key_bytes() { return key_; }
  std::vector<uint8_t>& value_bytes() { return value_; }

  // Element indices in the layouts of kernels/types.h.
  int64_t KeyIndex(int64_t block, int h, int d, int off) const {
    const int x = shape_.x();
    return (((block * shape_.num_kv_heads + h) * (shape_.head_size / x) + d / x) *
                shape_.block_size +
            off) *
               x +
           d % x;
  }
  int64_t ValueIndex(int64_t block, int h, int d, int off) const {
    return ((block * shape_.num_kv_heads + h) * shape_.head_size + d) * shape_.block_size + off;
  }
  void SetKey(int64_t block, int h, int d, int off, float v) {
    StoreElem(shape_.dtype, key_.data(), KeyIndex(block, h, d, off), v);
  }
  void SetValue(int64_t block, int h, int d, int off, float v) {
    StoreElem(shape_.dtype, value_.data(), ValueIndex(block, h, d, off), v);
  }
  float GetKey(int64_t block, int h, int d, int off) const {
    return LoadElem(shape_.dtype, key_.data(), KeyIndex(block, h, d, off));
  }
  float GetValue(int64_t block, int h, int d, int off) const {
    return LoadElem(shape_.dtype, value_.data(), ValueIndex(block, h, d, off));
  }

 private:
  KVCacheShape shape_;
  std::vector<uint8_t> key_, value_;
};

// A batch of sequences in a shared paged cache with shuffled block tables and
// their gathered K/V (values as stored, i.e. rounded to the dtype).
struct PagedBatch {
  explicit PagedBatch(const KVCacheShape& shape) : cache(shape) {}
  HostPagedCache cache;
  int num_seqs = 0;
  int max_blocks_per_seq = 0;
  std::vector<int32_t> seq_lens;
  std::vector<int32_t> block_tables;     // [num_seqs, max_blocks_per_seq]
  std::vector<std::vector<float>> k, v;  // per sequence [seq_len, num_kv_heads, head_size]

  GatheredKV gathered_k(int s) const {
    return {k[s].data(), cache.shape().num_kv_heads, cache.shape().head_size};
  }
  GatheredKV gathered_v(int s) const {
    return {v[s].data(), cache.shape().num_kv_heads, cache.shape().head_size};
  }
};

// Builds a batch: every sequence gets ceil(len / block_size) distinct
// physical blocks drawn at random from a pool with `spare_blocks` extra blocks;
// block-table entries past the used ones are -1. Every slot not holding a
// token (unused tail of the last block, spare blocks) holds `garbage`. K uniform in [-k_mag,
// k_mag], V in [-v_mag, v_mag].
inline PagedBatch MakePagedBatch(std::mt19937& rng, const std::vector<int32_t>& seq_lens,
                                 int num_kv_heads, int head_size, int block_size, DType dtype,
                                 float k_mag = 1.0f, float v_mag = 1.0f, int spare_blocks = 3,
                                 int extra_table_entries = 1,
                                 float garbage = std::numeric_limits<float>::quiet_NaN()) {
  int64_t used = 0;
  int max_blocks = 1;
  for (int32_t len : seq_lens) {
    const int nb = (len + block_size - 1) / block_size;
    used += nb;
    max_blocks = std::max(max_blocks, nb);
  }
  KVCacheShape shape;
  shape.num_blocks = used + spare_blocks;
  shape.num_kv_heads = num_kv_heads;
  shape.head_size = head_size;
  shape.block_size = block_size;
  shape.dtype = dtype;
  PagedBatch b(shape);
  if (!std::isnan(garbage)) b.cache.Fill(garbage);
  b.num_seqs = static_cast<int>(seq_lens.size());
  b.max_blocks_per_seq = max_blocks + extra_table_entries;
  b.seq_lens = seq_lens;
  b.block_tables.assign(static_cast<size_t>(b.num_seqs) * b.max_blocks_per_seq, -1);
  std::vector<int32_t> pool(shape.num_blocks);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  std::uniform_real_distribution<float> ku(-k_mag, k_mag), vu(-v_mag, v_mag);
  size_t next = 0;
  for (int s = 0; s < b.num_seqs; ++s) {
    const int len = seq_lens[s];
    const int nb = (len + block_size - 1) / block_size;
    for (int i = 0; i < nb; ++i)
      b.block_tables[static_cast<size_t>(s) * b.max_blocks_per_seq + i] = pool[next++];
    b.k.emplace_back(static_cast<size_t>(len) * num_kv_heads * head_size);
    b.v.emplace_back(static_cast<size_t>(len) * num_kv_heads * head_size);
    for (int t = 0; t < len; ++t) {
      const int32_t blk =
          b.block_tables[static_cast<size_t>(s) * b.max_blocks_per_seq + t / block_size];
      for (int h = 0; h < num_kv_heads; ++h)
        for (int d = 0; d < head_size; ++d) {
          const size_t i = (static_cast<size_t>(t) * num_kv_heads + h) * head_size + d;
          b.k[s][i] = RoundTo(dtype, ku(rng));
          b.v[s][i] = RoundTo(dtype, vu(rng));
          b.cache.SetKey(blk, h, d, t % block_size, b.k[s][i]);
          b.cache.SetValue(blk, h, d, t % block_size, b.v[s][i]);
        }
    }
  }
  return b;
}

// Sets every element of sequence s's blocks that lie wholly before token
// `first` to NaN: a sliding-window kernel must not read them.
inline void PoisonBlocksBefore(PagedBatch& b, int s, int first) {
  const KVCacheShape& sh = b.cache.shape();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (int blk = 0; (blk + 1) * sh.block_size <= first; ++blk) {
    const int32_t phys = b.block_tables[static_cast<size_t>(s) * b.max_blocks_per_seq + blk];
    for (int h = 0; h < sh.num_kv_heads; ++h)
      for (int d = 0; d < sh.head_size; ++d)
        for (int off = 0; off < sh.block_size; ++off) {
          b.cache.SetKey(phys, h, d, off, nan);
          b.cache.SetValue(phys, h, d, off, nan);
        }
  }
}

// Random values rounded to dtype: `bytes` holds them in dtype, `f` as floats.
struct HostTensor {
  DType dtype = DType::kFloat32;
  std::vector<uint8_t> bytes;
  std::vector<float> f;
  HostTensor(DType t, size_t n) : dtype(t), bytes(n * DTypeSize(t)), f(n) {}
  void Set(size_t i, float v) {
    StoreElem(dtype, bytes.data(), static_cast<int64_t>(i), v);
    f[i] = LoadElem(dtype, bytes.data(), static_cast<int64_t>(i));
  }
  float Get(size_t i) const { return LoadElem(dtype, bytes.data(), static_cast<int64_t>(i)); }
  void* data() { return bytes.data(); }
  size_t size() const { return f.size(); }
};

inline HostTensor RandomTensor(std::mt19937& rng, DType t, size_t n, float mag) {
  HostTensor out(t, n);
  std::uniform_real_distribution<float> u(-mag, mag);
  for (size_t i = 0; i < n; ++i) out.Set(i, u(rng));
  return out;
}

// ALiBi slopes as in Press et al. 2022 for n heads (power-of-two schedule,
// 2^(-8 i / n)), the values vLLM / HF use for a power-of-two head count; the
// tests only need plausible positive slopes.
inline std::vector<float> AlibiSlopes(int n) {
  std::vector<float> s(n);
  for (int i = 0; i < n; ++i) s[i] = std::pow(2.0f, -8.0f * (i + 1) / n);
  return s;
}

}  // namespace pagedserve::kernels::testing

#endif  // PAGEDSERVE_TESTS_KERNELS_KERNEL_TEST_UTIL_H_
