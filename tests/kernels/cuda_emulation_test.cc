// Runs the CUDA kernel source (kernels/cuda/*_kernels.cuh) on the CPU through
// tests/kernels/simt_emulator.h and compares it to the double-precision
// reference (reference_attention.h) and to the CPU backend. This checks the
// kernels' indexing into the paged layout, masking of the slots past the
// context (filled with NaN here), thread-group / warp / block reductions, the
// v2 partition + reduce arithmetic and the prefill tiling on machines without
// a GPU. It needs only the CUDA headers, not a device. Tolerances: the
// attention standard of attention_check.h, with its negative controls.
#include "tests/kernels/simt_emulator.h"  // must precede the kernel headers

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cache_ops.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/half.h"
#include "kernels/cuda/cache_kernels.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/paged_attention_kernels.cuh"
#include "kernels/cuda/prefill_attention_kernels.cuh"
#include "kernels/cuda/prefill_attention_mma_kernels.cuh"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"
#include "kernels/reshape_and_cache.h"
#include "kernels/types.h"
#include "tests/kernels/attention_check.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/reference_attention.h"

namespace pagedserve::kernels {
namespace {

namespace kc = ::pagedserve::kernels::cuda;
using testing::GatheredKV;

using testing::Decode;
using testing::Encode;

std::vector<float> Quantize(const std::vector<float>& f, DType t) {
  std::vector<uint8_t> e = Encode(f, t);
  return Decode(e.data(), f.size(), t);
}

std::vector<float> RandomVector(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

std::vector<float> AlibiSlopes(int n) {
  std::vector<float> s(n);
  for (int h = 0; h < n; ++h) s[h] = std::pow(2.0f, -8.0f * (h + 1) / n);
  return s;
}

// A host paged cache filled by the emulated reshape_and_cache kernel, which
// must produce the same bytes as the CPU backend. Unused slots hold NaN.
struct HostCase {
  DType dtype;
  int num_heads, num_kv_heads, head_size, block_size;
  std::vector<int> seq_lens;
  int max_blocks_per_seq = 0;
  int64_t num_blocks = 0;
  std::vector<std::vector<float>> keys{}, values{};
  std::vector<int32_t> block_tables{};
  std::vector<uint8_t> key_cache{}, value_cache{};
  KVCacheShape shape{};
  GatheredKV K(int s) const { return {keys[s].data(), num_kv_heads, head_size}; }
  GatheredKV V(int s) const { return {values[s].data(), num_kv_heads, head_size}; }
  int num_seqs() const { return static_cast<int>(seq_lens.size()); }
};

template <typename U>
void EmuReshapeAndCache(const std::vector<uint8_t>& k, const std::vector<uint8_t>& v,
                        const std::vector<int64_t>& slots, HostCase& c) {
  const int n = c.num_kv_heads * c.head_size;
  const int threads = n < 512 ? ((n + 31) / 32) * 32 : 512;
  kc::EmuLaunch(dim3(static_cast<unsigned>(slots.size())), dim3(threads), 0, [&] {
    kc::ReshapeAndCacheKernel<U>(
        reinterpret_cast<const U*>(k.data()), reinterpret_cast<const U*>(v.data()), n, n,
        slots.data(), c.num_blocks * c.block_size, reinterpret_cast<U*>(c.key_cache.data()),
        reinterpret_cast<U*>(c.value_cache.data()), c.num_kv_heads, c.head_size, c.block_size);
  });
}

void Build(HostCase& c, std::mt19937& rng) {
  const int bs = c.block_size;
  const int max_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  c.max_blocks_per_seq = (max_len + bs - 1) / bs + 1;
  int64_t used = 0;
  for (int len : c.seq_lens) used += (len + bs - 1) / bs;
  c.num_blocks = used + 2;
  std::vector<int32_t> perm(c.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  c.block_tables.assign(static_cast<size_t>(c.num_seqs()) * c.max_blocks_per_seq, perm[0]);
  const size_t row = static_cast<size_t>(c.num_kv_heads) * c.head_size;
  std::vector<float> all_k, all_v;
  std::vector<int64_t> slots;
  int64_t next = 0;
  for (int s = 0; s < c.num_seqs(); ++s) {
    const int len = c.seq_lens[s];
    for (int i = 0; i < (len + bs - 1) / bs; ++i)
      c.block_tables[static_cast<size_t>(s) * c.max_blocks_per_seq + i] = perm[next++];
    c.keys.push_back(Quantize(RandomVector(len * row, rng), c.dtype));
    c.values.push_back(Quantize(RandomVector(len * row, rng), c.dtype));
    all_k.insert(all_k.end(), c.keys.back().begin(), c.keys.back().end());
    all_v.insert(all_v.end(), c.values.back().begin(), c.values.back().end());
    for (int t = 0; t < len; ++t)
      slots.push_back(static_cast<int64_t>(
                          c.block_tables[static_cast<size_t>(s) * c.max_blocks_per_seq + t / bs]) *
                          bs +
                      t % bs);
  }
  slots.push_back(-1);  // a padding token
  all_k.insert(all_k.end(), row, 7.0f);
  all_v.insert(all_v.end(), row, 7.0f);
  c.shape = {c.num_blocks, c.num_kv_heads, c.head_size, c.block_size, c.dtype};
  const size_t bytes = c.num_blocks * c.shape.block_bytes();
  c.key_cache.assign(bytes, 0xFF);  // NaN in every dtype
  c.value_cache.assign(bytes, 0xFF);
  std::vector<uint8_t> ek = Encode(all_k, c.dtype), ev = Encode(all_v, c.dtype);
  if (c.dtype == DType::kFloat32) {
    EmuReshapeAndCache<uint32_t>(ek, ev, slots, c);
  } else {
    EmuReshapeAndCache<uint16_t>(ek, ev, slots, c);
  }
  // Same bytes as the CPU backend.
  std::vector<uint8_t> hk(bytes, 0xFF), hv(bytes, 0xFF);
  ReshapeAndCacheParams p;
  p.key = ek.data();
  p.value = ev.data();
  p.slot_mapping = slots.data();
  p.num_tokens = static_cast<int>(slots.size());
  p.cache = {hk.data(), hv.data(), c.shape, Device::kCPU};
  ASSERT_TRUE(ReshapeAndCache(p).ok());
  ASSERT_EQ(hk, c.key_cache) << "emulated reshape_and_cache key bytes differ from the CPU backend";
  ASSERT_EQ(hv, c.value_cache)
      << "emulated reshape_and_cache value bytes differ from the CPU backend";
}

// Overwrites the blocks of sequence s that lie wholly before token `first`
// with NaN bytes, so that a kernel reading them fails its check.
void PoisonBeforeWindow(HostCase& c, int s, int first) {
  const size_t bb = c.shape.block_bytes();
  for (int b = 0; (b + 1) * c.block_size <= first; ++b) {
    const size_t phys = c.block_tables[static_cast<size_t>(s) * c.max_blocks_per_seq + b];
    std::fill_n(c.key_cache.begin() + phys * bb, bb, 0xFF);
    std::fill_n(c.value_cache.begin() + phys * bb, bb, 0xFF);
  }
}

// C: the cache element type (T, or an fp8 tag type); `scale` already holds
// k_scale for fp8 (as the launcher folds it), v_scale is applied by the kernel.
template <typename T, int HS, typename C = T>
void EmuDecode(const HostCase& c, const std::vector<uint8_t>& q, const float* alibi, float scale,
               bool v2, std::vector<uint8_t>& out, float v_scale = 1.0f, int window = 0,
               float softcap = 0.0f) {
  const int S = c.num_seqs(), H = c.num_heads;
  const int max_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  std::vector<int32_t> lens(c.seq_lens.begin(), c.seq_lens.end());
  const int P = v2 ? kernels::NumPartitions(max_len) : 1;
  const int psize = v2 ? kernels::kPartitionSize : 0;
  std::vector<float> ml(static_cast<size_t>(S) * H * P, NAN), es(ml.size(), NAN);
  std::vector<float> tmp(ml.size() * HS, NAN);
  const size_t smem = static_cast<size_t>((v2 ? psize : max_len) + 7) / 8 * 8 * sizeof(float);
  kc::EmuLaunch(dim3(H, S, P), dim3(kc::kDecodeThreads), smem, [&] {
    kc::PagedAttentionKernel<T, HS, kc::kDecodeThreads, C>(
        reinterpret_cast<T*>(out.data()), ml.data(), es.data(), tmp.data(),
        reinterpret_cast<const T*>(q.data()), reinterpret_cast<const C*>(c.key_cache.data()),
        reinterpret_cast<const C*>(c.value_cache.data()), c.num_kv_heads, c.block_size, scale,
        c.block_tables.data(), c.max_blocks_per_seq, lens.data(), alibi, psize, v_scale, window,
        softcap);
  });
  if (!v2) return;
  kc::EmuLaunch(dim3(H, S), dim3(kc::kDecodeThreads), P * sizeof(float), [&] {
    kc::PagedAttentionReduceKernel<T, kc::kDecodeThreads>(reinterpret_cast<T*>(out.data()),
                                                          ml.data(), es.data(), tmp.data(),
                                                          lens.data(), HS, P, psize);
  });
}

template <typename T, int HS>
void CheckDecode(DType dt, int block_size, int heads, int kv_heads, bool use_alibi,
                 std::vector<int> lens, std::mt19937& rng) {
  HostCase c{dt, heads, kv_heads, HS, block_size, std::move(lens)};
  Build(c, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const int S = c.num_seqs();
  std::vector<float> q = Quantize(RandomVector(static_cast<size_t>(S) * heads * HS, rng), dt);
  std::vector<uint8_t> eq = Encode(q, dt);
  std::vector<float> slopes = AlibiSlopes(heads);
  const float* alibi = use_alibi ? slopes.data() : nullptr;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const std::string label = std::string(DTypeName(dt)) + " head " + std::to_string(HS) + " block " +
                            std::to_string(block_size) + " heads " + std::to_string(heads) + "/" +
                            std::to_string(kv_heads) + (use_alibi ? " alibi" : "");
  const size_t per_seq = static_cast<size_t>(heads) * HS;
  // The negative controls' sequence: the longest with at least three blocks.
  int control = -1;
  for (int s = 0; s < S; ++s)
    if (c.seq_lens[s] >= 3 * block_size && (control < 0 || c.seq_lens[s] > c.seq_lens[control]))
      control = s;
  for (bool v2 : {false, true}) {
    std::vector<uint8_t> out(S * per_seq * DTypeSize(dt), 0xFF);
    EmuDecode<T, HS>(c, eq, alibi, scale, v2, out);
    std::vector<float> got = Decode(out.data(), S * per_seq, dt);
    for (int s = 0; s < S; ++s) {
      std::vector<double> ref = testing::ReferenceDecode(q.data() + s * per_seq, heads, c.K(s),
                                                         c.V(s), c.seq_lens[s], scale, alibi);
      ASSERT_TRUE(
          testing::AttentionOutputMatches(got.data() + s * per_seq, ref.data(), per_seq, dt))
          << label << (v2 ? " v2" : " v1") << " seq " << s << " (len " << c.seq_lens[s] << ")";
      if (s != control) continue;
      // Negative controls (attention_check.h): zeroed output, and the same
      // kernel with this sequence's last full block dropped.
      HostCase dropped = c;
      std::vector<int32_t> row(c.block_tables.begin() + s * c.max_blocks_per_seq,
                               c.block_tables.begin() + (s + 1) * c.max_blocks_per_seq);
      testing::DropBlock(&row, &dropped.seq_lens[s], (c.seq_lens[s] - 1) / block_size - 1,
                         block_size);
      std::copy(row.begin(), row.end(), dropped.block_tables.begin() + s * c.max_blocks_per_seq);
      std::vector<uint8_t> dout(out.size(), 0xFF);
      EmuDecode<T, HS>(dropped, eq, alibi, scale, v2, dout);
      const std::vector<float> dgot = Decode(dout.data(), S * per_seq, dt);
      testing::ExpectRejectsBrokenOutputs(
          ref, std::vector<float>(dgot.begin() + s * per_seq, dgot.begin() + (s + 1) * per_seq),
          dt);
    }
  }
}

// Lengths around block and partition edges; every dtype and block size, each
// head size at least once, GQA/MQA/MHA, ALiBi on and off.
TEST(CudaEmulationTest, DecodeKernelMatchesReference) {
  std::mt19937 rng(21);
  const std::vector<int> lens = {1, 7, 8, 9, 15, 16, 17, 33, 511, 512, 513, 1100};
  CheckDecode<float, 64>(DType::kFloat32, 16, 4, 2, false, lens, rng);
  CheckDecode<float, 80>(DType::kFloat32, 8, 3, 1, true, lens, rng);
  CheckDecode<float, 256>(DType::kFloat32, 32, 2, 2, false, lens, rng);
  CheckDecode<__half, 96>(DType::kFloat16, 16, 4, 1, true, lens, rng);
  CheckDecode<__half, 112>(DType::kFloat16, 8, 2, 2, false, lens, rng);
  CheckDecode<__half, 128>(DType::kFloat16, 32, 6, 2, true, lens, rng);
  CheckDecode<__nv_bfloat16, 128>(DType::kBFloat16, 8, 4, 2, false, lens, rng);
  CheckDecode<__nv_bfloat16, 80>(DType::kBFloat16, 32, 2, 1, true, lens, rng);
  CheckDecode<__nv_bfloat16, 256>(DType::kBFloat16, 16, 2, 1, false, lens, rng);
}

// Sliding window (v1 and v2): each sequence's blocks wholly before its window
// hold NaN (never read), lengths around the window edge, a v2 partition wholly
// before the window (1100 tokens, window 40). Negative control: the same
// kernel without the window, on the unpoisoned cache, misses the reference.
template <typename T, int HS>
void CheckWindowDecode(DType dt, int block_size, int heads, int kv_heads, int window,
                       std::vector<int> lens, std::mt19937& rng) {
  HostCase c{dt, heads, kv_heads, HS, block_size, std::move(lens)};
  Build(c, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const HostCase clean = c;
  for (int s = 0; s < c.num_seqs(); ++s)
    PoisonBeforeWindow(c, s, testing::WindowFirstKey(c.seq_lens[s] - 1, window));
  const int S = c.num_seqs();
  std::vector<float> q = Quantize(RandomVector(static_cast<size_t>(S) * heads * HS, rng), dt);
  std::vector<uint8_t> eq = Encode(q, dt);
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const size_t per_seq = static_cast<size_t>(heads) * HS;
  for (bool v2 : {false, true}) {
    std::vector<uint8_t> out(S * per_seq * DTypeSize(dt), 0xFF), plain(out.size(), 0xFF);
    EmuDecode<T, HS>(c, eq, nullptr, scale, v2, out, 1.0f, window);
    EmuDecode<T, HS>(clean, eq, nullptr, scale, v2, plain, 1.0f, 0);
    const std::vector<float> got = Decode(out.data(), S * per_seq, dt);
    const std::vector<float> no_window = Decode(plain.data(), S * per_seq, dt);
    for (int s = 0; s < S; ++s) {
      const std::vector<double> ref = testing::ReferenceDecode(
          q.data() + s * per_seq, heads, c.K(s), c.V(s), c.seq_lens[s], scale, nullptr, window);
      EXPECT_TRUE(
          testing::AttentionOutputMatches(got.data() + s * per_seq, ref.data(), per_seq, dt))
          << DTypeName(dt) << " window " << window << (v2 ? " v2" : " v1") << " seq " << s
          << " (len " << c.seq_lens[s] << ")";
      if (c.seq_lens[s] > window + 4) {
        EXPECT_FALSE(testing::AttentionOutputMatches(no_window.data() + s * per_seq, ref.data(),
                                                     per_seq, dt))
            << "the kernel without its window passes, seq " << s;
      }
    }
  }
}

TEST(CudaEmulationTest, SlidingWindowDecodeMatchesReference) {
  std::mt19937 rng(24);
  const std::vector<int> lens = {1, 39, 40, 41, 57, 600, 1100};
  CheckWindowDecode<float, 64>(DType::kFloat32, 16, 4, 2, 40, lens, rng);
  CheckWindowDecode<__half, 128>(DType::kFloat16, 8, 2, 1, 40, lens, rng);
  CheckWindowDecode<__nv_bfloat16, 80>(DType::kBFloat16, 32, 2, 2, 700, lens, rng);
}

// Soft-capped scores (Gemma 2's attn_logit_softcapping), v1 and v2, with
// and without a sliding window and ALiBi: queries scaled so that the scores
// run to several units and the cap bends them. Negative control: the same
// kernel without the cap misses the capped reference on every sequence of
// more than one key.
template <typename T, int HS>
void CheckSoftcapDecode(DType dt, int block_size, int heads, int kv_heads, float softcap,
                        int window, bool use_alibi, std::vector<int> lens, std::mt19937& rng) {
  SCOPED_TRACE(::testing::Message() << DTypeName(dt) << " head " << HS << " softcap " << softcap
                                    << " window " << window << (use_alibi ? " alibi" : ""));
  HostCase c{dt, heads, kv_heads, HS, block_size, std::move(lens)};
  Build(c, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  for (int s = 0; window > 0 && s < c.num_seqs(); ++s)
    PoisonBeforeWindow(c, s, testing::WindowFirstKey(c.seq_lens[s] - 1, window));
  const int S = c.num_seqs();
  std::vector<float> q = Quantize(RandomVector(static_cast<size_t>(S) * heads * HS, rng), dt);
  std::vector<uint8_t> eq = Encode(q, dt);
  std::vector<float> slopes = AlibiSlopes(heads);
  const float* alibi = use_alibi ? slopes.data() : nullptr;
  const float scale = 8.0f / std::sqrt(static_cast<float>(HS));
  const size_t per_seq = static_cast<size_t>(heads) * HS;
  for (bool v2 : {false, true}) {
    std::vector<uint8_t> out(S * per_seq * DTypeSize(dt), 0xFF), plain(out.size(), 0xFF);
    EmuDecode<T, HS>(c, eq, alibi, scale, v2, out, 1.0f, window, softcap);
    EmuDecode<T, HS>(c, eq, alibi, scale, v2, plain, 1.0f, window, 0.0f);
    const std::vector<float> got = Decode(out.data(), S * per_seq, dt);
    const std::vector<float> uncapped = Decode(plain.data(), S * per_seq, dt);
    for (int s = 0; s < S; ++s) {
      const std::vector<double> ref =
          testing::ReferenceDecode(q.data() + s * per_seq, heads, c.K(s), c.V(s), c.seq_lens[s],
                                   scale, alibi, window, softcap);
      EXPECT_TRUE(
          testing::AttentionOutputMatches(got.data() + s * per_seq, ref.data(), per_seq, dt))
          << (v2 ? "v2" : "v1") << " seq " << s << " (len " << c.seq_lens[s] << ")";
      if (c.seq_lens[s] < 2) continue;
      testing::AttentionControlScope control;
      EXPECT_FALSE(
          testing::AttentionOutputMatches(uncapped.data() + s * per_seq, ref.data(), per_seq, dt))
          << "the kernel without its soft cap passes, " << (v2 ? "v2" : "v1") << " seq " << s;
    }
  }
}

TEST(CudaEmulationTest, SoftCappedDecodeMatchesReference) {
  std::mt19937 rng(26);
  const std::vector<int> lens = {1, 2, 17, 40, 41, 600, 1100};
  CheckSoftcapDecode<float, 64>(DType::kFloat32, 16, 4, 2, 1.0f, 0, false, lens, rng);
  CheckSoftcapDecode<float, 128>(DType::kFloat32, 8, 2, 1, 50.0f / 16, 40, true, lens, rng);
  CheckSoftcapDecode<__half, 128>(DType::kFloat16, 16, 4, 2, 1.0f, 40, false, lens, rng);
  CheckSoftcapDecode<__nv_bfloat16, 256>(DType::kBFloat16, 32, 2, 1, 2.0f, 0, true, lens, rng);
}

// mma: the tensor-core kernel (prefill_attention_mma_kernels.cuh; fp16/bf16
// only), over more rows than one of its 64-row blocks and 32-key tiles.
template <typename T, int HS>
void CheckPrefill(DType dt, int block_size, int heads, int kv_heads, bool use_alibi,
                  std::mt19937& rng, bool mma = false, int window = 0, float softcap = 0.0f) {
  struct Seq {
    int cached, q_len;
  };
  std::vector<Seq> seqs = {{1, 8}, {0, 1}, {37, 20}, {0, 45}, {16, 16}, {5, 1}};
  if (mma) seqs.insert(seqs.end(), {{50, 70}, {0, 130}, {31, 64}, {97, 3}});
  std::vector<int> lens;
  lens.reserve(seqs.size());
  for (const Seq& s : seqs) lens.push_back(s.cached + s.q_len);
  HostCase c{dt, heads, kv_heads, HS, block_size, lens};
  Build(c, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  // Blocks wholly before every row's window must not be read: NaN there.
  for (int s = 0; window > 0 && s < c.num_seqs(); ++s)
    PoisonBeforeWindow(c, s, testing::WindowFirstKey(seqs[s].cached, window));
  std::vector<int32_t> qsl = {0};
  int max_q = 0;
  for (const Seq& s : seqs) {
    qsl.push_back(qsl.back() + s.q_len);
    max_q = std::max(max_q, s.q_len);
  }
  const int T_ = qsl.back(), S = c.num_seqs();
  const int64_t qstride = static_cast<int64_t>(heads + 1) * HS;  // padded rows
  std::vector<float> q = Quantize(RandomVector(static_cast<size_t>(T_) * qstride, rng), dt);
  std::vector<uint8_t> eq = Encode(q, dt);
  std::vector<float> slopes = AlibiSlopes(heads);
  std::vector<int32_t> lens32(lens.begin(), lens.end());
  std::vector<uint8_t> out(static_cast<size_t>(T_) * heads * HS * DTypeSize(dt), 0xFF);
  // Soft-capped: scores large against the cap (several units), so that the
  // cap bends them.
  const float scale = (softcap > 0 ? 8.0f : 1.0f) / std::sqrt(static_cast<float>(HS));
  auto run_simt = [&](float cap, std::vector<uint8_t>* o) {
    kc::EmuLaunch(dim3(heads, S, (max_q + 7) / 8), dim3(128), 0, [&] {
      kc::PrefillAttentionKernel<T, HS>(
          reinterpret_cast<T*>(o->data()), reinterpret_cast<const T*>(eq.data()), qstride,
          qsl.data(), lens32.data(), reinterpret_cast<const T*>(c.key_cache.data()),
          reinterpret_cast<const T*>(c.value_cache.data()), kv_heads, block_size,
          c.block_tables.data(), c.max_blocks_per_seq, scale, use_alibi ? slopes.data() : nullptr,
          1.0f, window, cap);
    });
  };
  if constexpr (sizeof(T) == 2) {
    if (mma) {
      kc::EmuLaunch(dim3(heads, S, (max_q + kc::kPrefillMmaRows - 1) / kc::kPrefillMmaRows),
                    dim3(kc::kPrefillMmaThreads), kc::PrefillMmaSharedBytes(HS), [&] {
                      kc::PrefillAttentionMmaKernel<T, HS>(
                          reinterpret_cast<T*>(out.data()), reinterpret_cast<const T*>(eq.data()),
                          qstride, qsl.data(), lens32.data(),
                          reinterpret_cast<const T*>(c.key_cache.data()),
                          reinterpret_cast<const T*>(c.value_cache.data()), kv_heads, block_size,
                          c.block_tables.data(), c.max_blocks_per_seq, scale,
                          use_alibi ? slopes.data() : nullptr);
                    });
    }
  }
  if (!mma) run_simt(softcap, &out);
  std::vector<float> got = Decode(out.data(), static_cast<size_t>(T_) * heads * HS, dt);
  // Negative control for the cap: the same kernel without it.
  std::vector<uint8_t> uncapped_out(out.size(), 0xFF);
  if (softcap > 0) run_simt(0.0f, &uncapped_out);
  const std::vector<float> uncapped =
      Decode(uncapped_out.data(), static_cast<size_t>(T_) * heads * HS, dt);
  int multi_key_rows = 0, uncapped_passes = 0;
  // Each query row (all heads) under the attention standard.
  std::vector<double> ref(static_cast<size_t>(heads) * HS);
  for (int s = 0; s < S; ++s) {
    for (int i = 0; i < seqs[s].q_len; ++i) {
      const int row = qsl[s] + i, qpos = seqs[s].cached + i;
      for (int h = 0; h < heads; ++h)
        testing::ReferenceAttendRange(q.data() + row * qstride + static_cast<int64_t>(h) * HS, h,
                                      heads, c.K(s), c.V(s), testing::WindowFirstKey(qpos, window),
                                      qpos + 1, qpos, scale, use_alibi ? slopes[h] : 0.0,
                                      ref.data() + h * HS, softcap);
      ASSERT_TRUE(testing::AttentionOutputMatches(
          got.data() + static_cast<size_t>(row) * ref.size(), ref.data(), ref.size(), dt))
          << DTypeName(dt) << " head " << HS << " block " << block_size
          << (use_alibi ? " alibi" : "") << (mma ? " tensor cores" : "") << " window " << window
          << " softcap " << softcap << " seq " << s << " row " << i;
      if (softcap > 0 && qpos + 1 - testing::WindowFirstKey(qpos, window) >= 2) {
        ++multi_key_rows;
        testing::AttentionControlScope control;
        uncapped_passes +=
            testing::AttentionOutputMatches(uncapped.data() + static_cast<size_t>(row) * ref.size(),
                                            ref.data(), ref.size(), dt)
                ? 1
                : 0;
      }
    }
  }
  if (softcap > 0) {
    EXPECT_GT(multi_key_rows, 20);
    EXPECT_EQ(uncapped_passes, 0) << "the kernel without its soft cap passes " << uncapped_passes
                                  << " of " << multi_key_rows << " rows";
  }
  EXPECT_FALSE(testing::AttentionOutputMatches(std::vector<float>(ref.size(), 0.0f), ref, dt))
      << "a zeroed prefill row passes";
}

TEST(CudaEmulationTest, PrefillKernelMatchesReference) {
  std::mt19937 rng(22);
  CheckPrefill<float, 64>(DType::kFloat32, 16, 4, 2, false, rng);
  CheckPrefill<__half, 80>(DType::kFloat16, 8, 2, 1, true, rng);
  CheckPrefill<__nv_bfloat16, 128>(DType::kBFloat16, 32, 2, 2, false, rng);
  CheckPrefill<float, 256>(DType::kFloat32, 8, 2, 1, true, rng);
}

// Sliding window: rows near and past the window edge, tiles that start past
// it; blocks wholly before every row's window hold NaN.
TEST(CudaEmulationTest, SlidingWindowPrefillMatchesReference) {
  std::mt19937 rng(25);
  CheckPrefill<float, 64>(DType::kFloat32, 16, 4, 2, false, rng, false, 9);
  CheckPrefill<__half, 80>(DType::kFloat16, 8, 2, 1, false, rng, false, 17);
}

// Soft-capped scores (Gemma 2), alone and with a sliding window and ALiBi;
// the kernel without the cap is the negative control (CheckPrefill).
TEST(CudaEmulationTest, SoftCappedPrefillMatchesReference) {
  std::mt19937 rng(27);
  CheckPrefill<float, 64>(DType::kFloat32, 16, 4, 2, false, rng, false, 0, 1.0f);
  CheckPrefill<__half, 128>(DType::kFloat16, 8, 2, 1, true, rng, false, 17, 1.0f);
  CheckPrefill<__nv_bfloat16, 256>(DType::kBFloat16, 32, 2, 2, false, rng, false, 9, 2.0f);
}

// The tensor-core prefill kernel under the same standard: both 16-bit types,
// both head sizes it is built for, GQA and MHA, ALiBi, block sizes 8-32.
TEST(CudaEmulationTest, TensorCorePrefillKernelMatchesReference) {
  std::mt19937 rng(23);
  CheckPrefill<__half, 64>(DType::kFloat16, 16, 4, 2, false, rng, true);
  CheckPrefill<__nv_bfloat16, 64>(DType::kBFloat16, 8, 3, 1, true, rng, true);
  CheckPrefill<__half, 128>(DType::kFloat16, 32, 2, 2, true, rng, true);
  CheckPrefill<__nv_bfloat16, 128>(DType::kBFloat16, 16, 4, 1, false, rng, true);
}

// ---------------------------------------------------------------------------
// fp8 KV cache: the same kernel source with CACHE_T = __nv_fp8_e4m3 /
// __nv_fp8_e5m2 (16-byte key loads of 16 codes, 8-byte value loads, the
// conversion of cuda_fp8.h in registers) and the fp8 reshape_and_cache kernel,
// whose bytes must equal the CPU backend's. Reference: the double attention
// on decode(fp8(x / scale)) * scale (kernels/cpu/fp8.h, checked against
// cuda_fp8.h in fp8_conversion_test.cc); bounds of the io dtype. Negative
// controls: zeroed output, one block dropped, k_scale or v_scale ignored.

float Fp8Round(DType t, float x, float scale) {
  return t == DType::kFloat8E4M3 ? Fp8E4M3BitsToFloat(FloatToFp8E4M3Bits(x / scale)) * scale
                                 : Fp8E5M2BitsToFloat(FloatToFp8E5M2Bits(x / scale)) * scale;
}

// c.dtype is the fp8 cache dtype; K/V are drawn in `io`, written by the
// emulated ReshapeAndCacheFp8Kernel<T, C>, and c.keys / c.values hold the
// values the attention kernels must see.
template <typename T, typename C>
void BuildFp8(HostCase& c, DType io, float ks, float vs, std::mt19937& rng) {
  const int bs = c.block_size;
  const int max_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  c.max_blocks_per_seq = (max_len + bs - 1) / bs + 1;
  int64_t used = 0;
  for (int len : c.seq_lens) used += (len + bs - 1) / bs;
  c.num_blocks = used + 2;
  std::vector<int32_t> perm(c.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  c.block_tables.assign(static_cast<size_t>(c.num_seqs()) * c.max_blocks_per_seq, perm[0]);
  const size_t row = static_cast<size_t>(c.num_kv_heads) * c.head_size;
  std::vector<float> all_k, all_v;
  std::vector<int64_t> slots;
  int64_t next = 0;
  for (int s = 0; s < c.num_seqs(); ++s) {
    const int len = c.seq_lens[s];
    for (int i = 0; i < (len + bs - 1) / bs; ++i)
      c.block_tables[static_cast<size_t>(s) * c.max_blocks_per_seq + i] = perm[next++];
    std::vector<float> k = Quantize(RandomVector(len * row, rng), io);
    std::vector<float> v = Quantize(RandomVector(len * row, rng), io);
    all_k.insert(all_k.end(), k.begin(), k.end());
    all_v.insert(all_v.end(), v.begin(), v.end());
    for (float& x : k) x = Fp8Round(c.dtype, x, ks);
    for (float& x : v) x = Fp8Round(c.dtype, x, vs);
    c.keys.push_back(std::move(k));
    c.values.push_back(std::move(v));
    for (int t = 0; t < len; ++t)
      slots.push_back(static_cast<int64_t>(
                          c.block_tables[static_cast<size_t>(s) * c.max_blocks_per_seq + t / bs]) *
                          bs +
                      t % bs);
  }
  slots.push_back(-1);  // a padding token
  all_k.insert(all_k.end(), row, 7.0f);
  all_v.insert(all_v.end(), row, 7.0f);
  c.shape = {c.num_blocks, c.num_kv_heads, c.head_size, c.block_size, c.dtype};
  const size_t bytes = c.num_blocks * c.shape.block_bytes();
  c.key_cache.assign(bytes, 0x7F);  // NaN in both fp8 formats
  c.value_cache.assign(bytes, 0x7F);
  std::vector<uint8_t> ek = Encode(all_k, io), ev = Encode(all_v, io);
  const int n = c.num_kv_heads * c.head_size;
  const int threads = n < 512 ? ((n + 31) / 32) * 32 : 512;
  kc::EmuLaunch(dim3(static_cast<unsigned>(slots.size())), dim3(threads), 0, [&] {
    kc::ReshapeAndCacheFp8Kernel<T, C>(
        reinterpret_cast<const T*>(ek.data()), reinterpret_cast<const T*>(ev.data()), n, n,
        slots.data(), c.num_blocks * c.block_size, c.key_cache.data(), c.value_cache.data(),
        c.num_kv_heads, c.head_size, c.block_size, ks, vs);
  });
  std::vector<uint8_t> hk(bytes, 0x7F), hv(bytes, 0x7F);
  ReshapeAndCacheParams p;
  p.key = ek.data();
  p.value = ev.data();
  p.slot_mapping = slots.data();
  p.num_tokens = static_cast<int>(slots.size());
  p.cache = {hk.data(), hv.data(), c.shape, Device::kCPU, ks, vs};
  p.io_dtype = io;
  ASSERT_TRUE(ReshapeAndCache(p).ok());
  ASSERT_EQ(hk, c.key_cache)
      << "emulated fp8 reshape_and_cache key bytes differ from the CPU backend";
  ASSERT_EQ(hv, c.value_cache)
      << "emulated fp8 reshape_and_cache value bytes differ from the CPU backend";
}

template <typename T, typename C, int HS>
void CheckDecodeFp8(DType cache_dt, DType io, int block_size, int heads, int kv_heads,
                    bool use_alibi, float ks, float vs, std::mt19937& rng) {
  HostCase c{cache_dt, heads, kv_heads, HS, block_size, {1, 7, 8, 9, 17, 33, 512, 513, 1100}};
  BuildFp8<T, C>(c, io, ks, vs, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const int S = c.num_seqs();
  std::vector<float> q = Quantize(RandomVector(static_cast<size_t>(S) * heads * HS, rng), io);
  std::vector<uint8_t> eq = Encode(q, io);
  std::vector<float> slopes = AlibiSlopes(heads);
  const float* alibi = use_alibi ? slopes.data() : nullptr;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const std::string label = std::string(DTypeName(cache_dt)) + " io " + DTypeName(io) + " head " +
                            std::to_string(HS) + " block " + std::to_string(block_size) +
                            (use_alibi ? " alibi" : "");
  const size_t per_seq = static_cast<size_t>(heads) * HS;
  const int control = S - 1;  // 1100 tokens
  for (bool v2 : {false, true}) {
    auto run = [&](const HostCase& hc, float k_s, float v_s) {
      std::vector<uint8_t> out(S * per_seq * DTypeSize(io), 0xFF);
      EmuDecode<T, HS, C>(hc, eq, alibi, scale * k_s, v2, out, v_s);
      return Decode(out.data(), S * per_seq, io);
    };
    const std::vector<float> got = run(c, ks, vs);
    std::vector<double> ref;
    for (int s = 0; s < S; ++s) {
      ref = testing::ReferenceDecode(q.data() + s * per_seq, heads, c.K(s), c.V(s), c.seq_lens[s],
                                     scale, alibi);
      ASSERT_TRUE(
          testing::AttentionOutputMatches(got.data() + s * per_seq, ref.data(), per_seq, io))
          << label << (v2 ? " v2" : " v1") << " seq " << s << " (len " << c.seq_lens[s] << ")";
    }
    auto slice = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + control * per_seq, v.begin() + (control + 1) * per_seq);
    };
    HostCase dropped = c;
    std::vector<int32_t> row(c.block_tables.begin() + control * c.max_blocks_per_seq,
                             c.block_tables.begin() + (control + 1) * c.max_blocks_per_seq);
    testing::DropBlock(&row, &dropped.seq_lens[control], (c.seq_lens[control] - 1) / block_size - 1,
                       block_size);
    std::copy(row.begin(), row.end(),
              dropped.block_tables.begin() + control * c.max_blocks_per_seq);
    testing::ExpectRejectsBrokenOutputs(ref, slice(run(dropped, ks, vs)), io);
    testing::AttentionControlScope scope;
    EXPECT_FALSE(testing::AttentionOutputMatches(slice(run(c, 1.0f, vs)), ref, io))
        << label << ": a kernel ignoring k_scale passes";
    EXPECT_FALSE(testing::AttentionOutputMatches(slice(run(c, ks, 1.0f)), ref, io))
        << label << ": a kernel ignoring v_scale passes";
  }
}

TEST(CudaEmulationTest, Fp8DecodeKernelMatchesReference) {
  std::mt19937 rng(31);
  CheckDecodeFp8<float, __nv_fp8_e4m3, 128>(DType::kFloat8E4M3, DType::kFloat32, 16, 4, 2, false,
                                            0.043f, 0.021f, rng);
  CheckDecodeFp8<__half, __nv_fp8_e4m3, 64>(DType::kFloat8E4M3, DType::kFloat16, 8, 2, 1, true,
                                            0.0037f, 0.25f, rng);
  CheckDecodeFp8<__nv_bfloat16, __nv_fp8_e5m2, 80>(DType::kFloat8E5M2, DType::kBFloat16, 32, 3, 1,
                                                   false, 0.05f, 0.03f, rng);
  CheckDecodeFp8<float, __nv_fp8_e5m2, 112>(DType::kFloat8E5M2, DType::kFloat32, 8, 2, 2, false,
                                            2.5f, 0.0009f, rng);
}

template <typename T, typename C, int HS>
void CheckPrefillFp8(DType cache_dt, DType io, int block_size, int heads, int kv_heads,
                     bool use_alibi, float ks, float vs, std::mt19937& rng) {
  struct Seq {
    int cached, q_len;
  };
  const std::vector<Seq> seqs = {{1, 8}, {0, 1}, {37, 20}, {0, 45}, {16, 16}, {5, 1}};
  std::vector<int> lens;
  lens.reserve(seqs.size());
  for (const Seq& s : seqs) lens.push_back(s.cached + s.q_len);
  HostCase c{cache_dt, heads, kv_heads, HS, block_size, lens};
  BuildFp8<T, C>(c, io, ks, vs, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  std::vector<int32_t> qsl = {0};
  int max_q = 0;
  for (const Seq& s : seqs) {
    qsl.push_back(qsl.back() + s.q_len);
    max_q = std::max(max_q, s.q_len);
  }
  const int T_ = qsl.back(), S = c.num_seqs();
  const int64_t qstride = static_cast<int64_t>(heads) * HS;
  std::vector<float> q = Quantize(RandomVector(static_cast<size_t>(T_) * qstride, rng), io);
  std::vector<uint8_t> eq = Encode(q, io);
  std::vector<float> slopes = AlibiSlopes(heads);
  std::vector<int32_t> lens32(lens.begin(), lens.end());
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  auto run = [&](float k_s, float v_s) {
    std::vector<uint8_t> out(static_cast<size_t>(T_) * heads * HS * DTypeSize(io), 0xFF);
    kc::EmuLaunch(dim3(heads, S, (max_q + 7) / 8), dim3(128), 0, [&] {
      kc::PrefillAttentionKernel<T, HS, C>(
          reinterpret_cast<T*>(out.data()), reinterpret_cast<const T*>(eq.data()), qstride,
          qsl.data(), lens32.data(), reinterpret_cast<const C*>(c.key_cache.data()),
          reinterpret_cast<const C*>(c.value_cache.data()), kv_heads, block_size,
          c.block_tables.data(), c.max_blocks_per_seq, scale * k_s,
          use_alibi ? slopes.data() : nullptr, v_s, 0, 0.0f);
    });
    return Decode(out.data(), static_cast<size_t>(T_) * heads * HS, io);
  };
  const std::vector<float> got = run(ks, vs), no_k = run(1.0f, vs), no_v = run(ks, 1.0f);
  std::vector<double> ref(static_cast<size_t>(heads) * HS);
  for (int s = 0; s < S; ++s) {
    for (int i = 0; i < seqs[s].q_len; ++i) {
      const int row = qsl[s] + i, qpos = seqs[s].cached + i;
      for (int h = 0; h < heads; ++h)
        testing::ReferenceAttendRange(q.data() + row * qstride + static_cast<int64_t>(h) * HS, h,
                                      heads, c.K(s), c.V(s), 0, qpos + 1, qpos, scale,
                                      use_alibi ? slopes[h] : 0.0, ref.data() + h * HS);
      ASSERT_TRUE(testing::AttentionOutputMatches(
          got.data() + static_cast<size_t>(row) * ref.size(), ref.data(), ref.size(), io))
          << DTypeName(cache_dt) << " io " << DTypeName(io) << " head " << HS << " block "
          << block_size << " seq " << s << " row " << i;
      if (s == 2 && i == seqs[s].q_len - 1) {
        testing::AttentionControlScope scope;
        EXPECT_FALSE(
            testing::AttentionOutputMatches(std::vector<float>(ref.size(), 0.0f), ref, io));
        EXPECT_FALSE(testing::AttentionOutputMatches(
            no_k.data() + static_cast<size_t>(row) * ref.size(), ref.data(), ref.size(), io))
            << "a prefill kernel ignoring k_scale passes";
        EXPECT_FALSE(testing::AttentionOutputMatches(
            no_v.data() + static_cast<size_t>(row) * ref.size(), ref.data(), ref.size(), io))
            << "a prefill kernel ignoring v_scale passes";
      }
    }
  }
}

TEST(CudaEmulationTest, Fp8PrefillKernelMatchesReference) {
  std::mt19937 rng(32);
  CheckPrefillFp8<float, __nv_fp8_e4m3, 64>(DType::kFloat8E4M3, DType::kFloat32, 16, 4, 2, false,
                                            0.043f, 0.021f, rng);
  CheckPrefillFp8<__half, __nv_fp8_e5m2, 80>(DType::kFloat8E5M2, DType::kFloat16, 8, 2, 1, true,
                                             0.05f, 0.03f, rng);
  CheckPrefillFp8<__nv_bfloat16, __nv_fp8_e4m3, 128>(DType::kFloat8E4M3, DType::kBFloat16, 32, 2, 2,
                                                     false, 0.02f, 0.5f, rng);
}

TEST(CudaEmulationTest, CopyBlocksKernelIsByteExact) {
  std::mt19937 rng(23);
  const int64_t block_bytes = 2 * 64 * 16 * 2;  // fp16, 2 kv heads, head 64, block 16
  const int num_blocks = 6, layers = 2;
  std::vector<std::vector<uint8_t>> bufs(2 * layers,
                                         std::vector<uint8_t>(num_blocks * block_bytes));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : bufs)
    for (auto& x : b) x = static_cast<uint8_t>(byte(rng));
  const std::vector<std::vector<uint8_t>> before = bufs;
  std::vector<uint64_t> kp, vp;
  for (int l = 0; l < layers; ++l) {
    kp.push_back(reinterpret_cast<uintptr_t>(bufs[2 * l].data()));
    vp.push_back(reinterpret_cast<uintptr_t>(bufs[2 * l + 1].data()));
  }
  const std::vector<int64_t> pairs = {0, 3, 4, 1, 4, 5};
  for (bool vec16 : {true, false}) {
    bufs = before;
    kc::EmuLaunch(dim3(3, layers), dim3(64), 0, [&] {
      if (vec16) {
        kc::CopyBlocksKernel<uint4>(kp.data(), vp.data(), pairs.data(), block_bytes / 16);
      } else {
        kc::CopyBlocksKernel<uint8_t>(kp.data(), vp.data(), pairs.data(), block_bytes);
      }
    });
    for (size_t i = 0; i < bufs.size(); ++i) {
      std::vector<uint8_t> expect = before[i];
      for (size_t p = 0; p < pairs.size(); p += 2)
        std::memcpy(expect.data() + pairs[p + 1] * block_bytes,
                    before[i].data() + pairs[p] * block_bytes, block_bytes);
      EXPECT_EQ(bufs[i], expect) << "buffer " << i << (vec16 ? " uint4" : " bytes");
    }
  }
}

}  // namespace
}  // namespace pagedserve::kernels
