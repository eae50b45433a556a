// fp8 KV cache on the CPU backend: reshape_and_cache writes fp8(x / scale),
// paged attention v1 / v2 and prefill attention read stored * scale, both
// OCP formats, scales != 1, io dtypes fp32 / fp16 / bf16, GQA, ALiBi.
//
// Reference: the double-precision naive attention (reference_attention.h) on
// the fp8-rounded K/V, i.e. decode(fp8(x / k_scale)) * k_scale per element
// with the conversions of kernels/cpu/fp8.h (checked against ml_dtypes in
// fp8_fixture_test.cc and against cuda_fp8.h in fp8_conversion_test.cc).
// Tolerance: attention_check.h's standard for the io dtype (the output is
// io-typed). Negative controls in every case: a
// zeroed output, the kernel with one block dropped, and the kernel run with
// k_scale or v_scale left at 1 (a kernel ignoring the scale) all fail.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cache_ops.h"
#include "kernels/cpu/fp8.h"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"
#include "kernels/reshape_and_cache.h"
#include "tests/kernels/attention_check.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/reference_attention.h"

namespace pagedserve::kernels::testing {
namespace {

float Fp8Round(DType t, float x, float scale) {
  return t == DType::kFloat8E4M3 ? Fp8E4M3BitsToFloat(FloatToFp8E4M3Bits(x / scale)) * scale
                                 : Fp8E5M2BitsToFloat(FloatToFp8E5M2Bits(x / scale)) * scale;
}

// A batch written into an fp8 paged cache through ReshapeAndCache.
struct Fp8Batch {
  DType cache_dt, io;
  int num_kv_heads, head_size, block_size;
  float k_scale, v_scale;
  std::vector<int32_t> seq_lens;
  int max_blocks_per_seq = 0;
  std::vector<int32_t> block_tables{};
  std::vector<std::vector<float>> k_ref{},
      v_ref{};  // fp8-rounded, scaled: what the kernels must see
  std::vector<uint8_t> key_cache{}, value_cache{};
  KVCacheShape shape{};

  KVCacheView view(float ks, float vs) {
    KVCacheView v;
    v.key_cache = key_cache.data();
    v.value_cache = value_cache.data();
    v.shape = shape;
    v.k_scale = ks;
    v.v_scale = vs;
    return v;
  }
  GatheredKV K(int s) const { return {k_ref[s].data(), num_kv_heads, head_size}; }
  GatheredKV V(int s) const { return {v_ref[s].data(), num_kv_heads, head_size}; }
  int num_seqs() const { return static_cast<int>(seq_lens.size()); }
};

void Build(Fp8Batch& b, std::mt19937& rng) {
  const int bs = b.block_size, kvh = b.num_kv_heads, hs = b.head_size;
  int64_t used = 0;
  int max_nb = 1;
  for (int len : b.seq_lens) {
    used += (len + bs - 1) / bs;
    max_nb = std::max(max_nb, (len + bs - 1) / bs);
  }
  b.max_blocks_per_seq = max_nb + 1;
  b.shape = {used + 2, kvh, hs, bs, b.cache_dt};
  b.key_cache.assign(b.shape.num_blocks * b.shape.block_bytes(), 0x7f);  // NaN codes
  b.value_cache.assign(b.key_cache.size(), 0x7f);
  std::vector<int32_t> pool(b.shape.num_blocks);
  for (size_t i = 0; i < pool.size(); ++i) pool[i] = static_cast<int32_t>(i);
  std::shuffle(pool.begin(), pool.end(), rng);
  b.block_tables.assign(static_cast<size_t>(b.num_seqs()) * b.max_blocks_per_seq, -1);
  const int64_t row = static_cast<int64_t>(kvh) * hs;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  size_t next = 0;
  for (int s = 0; s < b.num_seqs(); ++s) {
    const int len = b.seq_lens[s];
    for (int i = 0; i < (len + bs - 1) / bs; ++i)
      b.block_tables[static_cast<size_t>(s) * b.max_blocks_per_seq + i] = pool[next++];
    HostTensor k(b.io, len * row), v(b.io, len * row);
    for (size_t i = 0; i < k.size(); ++i) {
      k.Set(i, u(rng));
      v.Set(i, u(rng));
    }
    std::vector<int64_t> slots(len);
    for (int t = 0; t < len; ++t)
      slots[t] = static_cast<int64_t>(
                     b.block_tables[static_cast<size_t>(s) * b.max_blocks_per_seq + t / bs]) *
                     bs +
                 t % bs;
    ReshapeAndCacheParams p;
    p.key = k.data();
    p.value = v.data();
    p.slot_mapping = slots.data();
    p.num_tokens = len;
    p.cache = b.view(b.k_scale, b.v_scale);
    p.io_dtype = b.io;
    ASSERT_TRUE(ReshapeAndCache(p).ok());
    b.k_ref.emplace_back(k.size());
    b.v_ref.emplace_back(v.size());
    for (size_t i = 0; i < k.size(); ++i) {
      b.k_ref[s][i] = Fp8Round(b.cache_dt, k.f[i], b.k_scale);
      b.v_ref[s][i] = Fp8Round(b.cache_dt, v.f[i], b.v_scale);
    }
  }
}

std::string Label(const Fp8Batch& b, int heads) {
  return absl::StrCat(DTypeName(b.cache_dt), " io ", DTypeName(b.io), " head ", b.head_size,
                      " block ", b.block_size, " heads ", heads, "/", b.num_kv_heads);
}

// Runs decode (v1 or v2) over the batch with the given view scales.
std::vector<float> RunDecode(Fp8Batch& b, const HostTensor& q, int heads, bool v2,
                             const float* alibi, float ks, float vs,
                             const std::vector<int32_t>* tables = nullptr,
                             const std::vector<int32_t>* lens = nullptr) {
  const std::vector<int32_t>& bt = tables ? *tables : b.block_tables;
  const std::vector<int32_t>& sl = lens ? *lens : b.seq_lens;
  HostTensor out(b.io, q.size());
  PagedAttentionParams p;
  p.out = out.data();
  p.query = const_cast<HostTensor&>(q).data();
  p.num_seqs = b.num_seqs();
  p.num_heads = heads;
  p.cache = b.view(ks, vs);
  p.io_dtype = b.io;
  p.block_tables = bt.data();
  p.max_blocks_per_seq = b.max_blocks_per_seq;
  p.seq_lens = sl.data();
  p.max_seq_len = *std::max_element(b.seq_lens.begin(), b.seq_lens.end());
  p.scale = 1.0f / std::sqrt(static_cast<float>(b.head_size));
  p.alibi_slopes = alibi;
  const absl::Status st = v2 ? PagedAttentionV2(p) : PagedAttentionV1(p);
  EXPECT_TRUE(st.ok()) << st;
  std::vector<float> got(q.size());
  for (size_t i = 0; i < got.size(); ++i) got[i] = out.Get(i);
  return got;
}

void CheckDecode(DType cache_dt, DType io, int hs, int bs, int heads, int kvh, bool alibi_on,
                 float ks, float vs, std::mt19937& rng) {
  Fp8Batch b{cache_dt, io, kvh, hs, bs, ks, vs, {1, 7, 17, 64, 513, 1100}};
  Build(b, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const int S = b.num_seqs();
  const size_t per_seq = static_cast<size_t>(heads) * hs;
  HostTensor q = RandomTensor(rng, io, S * per_seq, 1.0f);
  std::vector<float> slopes = AlibiSlopes(heads);
  const float* alibi = alibi_on ? slopes.data() : nullptr;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hs));
  const std::string label = Label(b, heads) + (alibi_on ? " alibi" : "");
  const int control = S - 1;  // the longest sequence (1100 tokens)
  for (bool v2 : {false, true}) {
    SCOPED_TRACE(label + (v2 ? " v2" : " v1"));
    const std::vector<float> got = RunDecode(b, q, heads, v2, alibi, ks, vs);
    std::vector<std::vector<double>> refs;
    for (int s = 0; s < S; ++s) {
      refs.push_back(ReferenceDecode(q.f.data() + s * per_seq, heads, b.K(s), b.V(s), b.seq_lens[s],
                                     scale, alibi));
      EXPECT_TRUE(AttentionOutputMatches(got.data() + s * per_seq, refs[s].data(), per_seq, io))
          << "seq " << s << " (len " << b.seq_lens[s] << ")";
    }
    // Negative controls on the longest sequence.
    auto slice = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + control * per_seq, v.begin() + (control + 1) * per_seq);
    };
    std::vector<int32_t> tables = b.block_tables, lens = b.seq_lens;
    std::vector<int32_t> row(tables.begin() + control * b.max_blocks_per_seq,
                             tables.begin() + (control + 1) * b.max_blocks_per_seq);
    int len = lens[control];
    DropBlock(&row, &len, (len - 1) / bs - 1, bs);
    lens[control] = len;
    std::copy(row.begin(), row.end(), tables.begin() + control * b.max_blocks_per_seq);
    ExpectRejectsBrokenOutputs(
        refs[control], slice(RunDecode(b, q, heads, v2, alibi, ks, vs, &tables, &lens)), io);
    AttentionControlScope scope;
    EXPECT_FALSE(AttentionOutputMatches(slice(RunDecode(b, q, heads, v2, alibi, 1.0f, vs)),
                                        refs[control], io))
        << "a kernel ignoring k_scale passes";
    EXPECT_FALSE(AttentionOutputMatches(slice(RunDecode(b, q, heads, v2, alibi, ks, 1.0f)),
                                        refs[control], io))
        << "a kernel ignoring v_scale passes";
  }
}

TEST(Fp8KvCacheTest, DecodeV1V2MatchReferenceOnRoundedKV) {
  std::mt19937 rng(81);
  CheckDecode(DType::kFloat8E4M3, DType::kFloat32, 128, 16, 4, 2, false, 0.043f, 0.021f, rng);
  CheckDecode(DType::kFloat8E4M3, DType::kFloat16, 64, 8, 2, 2, true, 0.0037f, 0.25f, rng);
  CheckDecode(DType::kFloat8E4M3, DType::kBFloat16, 80, 32, 3, 1, false, 0.011f, 0.013f, rng);
  CheckDecode(DType::kFloat8E5M2, DType::kFloat32, 64, 32, 4, 1, true, 0.05f, 0.03f, rng);
  CheckDecode(DType::kFloat8E5M2, DType::kFloat16, 112, 16, 2, 2, false, 2.5f, 0.0009f, rng);
  CheckDecode(DType::kFloat8E5M2, DType::kBFloat16, 256, 8, 2, 1, false, 0.3f, 0.07f, rng);
}

void CheckPrefill(DType cache_dt, DType io, int hs, int bs, int heads, int kvh, bool alibi_on,
                  float ks, float vs, std::mt19937& rng) {
  struct Seq {
    int cached, q_len;
  };
  const std::vector<Seq> seqs = {{0, 1}, {1, 8}, {37, 20}, {0, 45}, {600, 3}};
  Fp8Batch b{cache_dt, io, kvh, hs, bs, ks, vs, {}};
  for (const Seq& s : seqs) b.seq_lens.push_back(s.cached + s.q_len);
  Build(b, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  std::vector<int32_t> qsl = {0};
  int max_q = 0;
  for (const Seq& s : seqs) {
    qsl.push_back(qsl.back() + s.q_len);
    max_q = std::max(max_q, s.q_len);
  }
  const int T = qsl.back();
  const size_t per_row = static_cast<size_t>(heads) * hs;
  HostTensor q = RandomTensor(rng, io, T * per_row, 1.0f);
  std::vector<float> slopes = AlibiSlopes(heads);
  auto run = [&](float k_s, float v_s) {
    HostTensor out(io, q.size());
    PrefillAttentionParams p;
    p.out = out.data();
    p.query = q.data();
    p.num_seqs = b.num_seqs();
    p.num_heads = heads;
    p.query_start_loc = qsl.data();
    p.seq_lens = b.seq_lens.data();
    p.cache = b.view(k_s, v_s);
    p.io_dtype = io;
    p.block_tables = b.block_tables.data();
    p.max_blocks_per_seq = b.max_blocks_per_seq;
    p.max_query_len = max_q;
    p.max_seq_len = *std::max_element(b.seq_lens.begin(), b.seq_lens.end());
    p.scale = 1.0f / std::sqrt(static_cast<float>(hs));
    p.alibi_slopes = alibi_on ? slopes.data() : nullptr;
    const absl::Status st = PrefillAttention(p);
    EXPECT_TRUE(st.ok()) << st;
    std::vector<float> got(q.size());
    for (size_t i = 0; i < got.size(); ++i) got[i] = out.Get(i);
    return got;
  };
  const std::vector<float> got = run(ks, vs);
  const std::vector<float> no_k = run(1.0f, vs), no_v = run(ks, 1.0f);
  std::vector<double> ref(per_row);
  const std::string label = Label(b, heads) + (alibi_on ? " alibi" : "");
  for (int s = 0; s < b.num_seqs(); ++s)
    for (int i = 0; i < seqs[s].q_len; ++i) {
      const int row = qsl[s] + i, qpos = seqs[s].cached + i;
      for (int h = 0; h < heads; ++h)
        ReferenceAttendOne(q.f.data() + row * per_row + static_cast<size_t>(h) * hs, h, heads,
                           b.K(s), b.V(s), qpos + 1, qpos, 1.0 / std::sqrt(static_cast<double>(hs)),
                           alibi_on ? slopes[h] : 0.0, ref.data() + h * hs);
      ASSERT_TRUE(AttentionOutputMatches(got.data() + row * per_row, ref.data(), per_row, io))
          << label << " seq " << s << " row " << i;
      if (s == 2 && i == seqs[s].q_len - 1) {  // controls on a row with 57 visible keys
        AttentionControlScope scope;
        EXPECT_FALSE(AttentionOutputMatches(std::vector<float>(per_row, 0.0f), ref, io)) << label;
        EXPECT_FALSE(AttentionOutputMatches(no_k.data() + row * per_row, ref.data(), per_row, io))
            << label << ": a kernel ignoring k_scale passes";
        EXPECT_FALSE(AttentionOutputMatches(no_v.data() + row * per_row, ref.data(), per_row, io))
            << label << ": a kernel ignoring v_scale passes";
      }
    }
}

TEST(Fp8KvCacheTest, PrefillMatchesReferenceOnRoundedKV) {
  std::mt19937 rng(82);
  CheckPrefill(DType::kFloat8E4M3, DType::kFloat32, 64, 16, 4, 2, false, 0.043f, 0.021f, rng);
  CheckPrefill(DType::kFloat8E4M3, DType::kBFloat16, 128, 8, 2, 1, true, 0.02f, 0.5f, rng);
  CheckPrefill(DType::kFloat8E5M2, DType::kFloat16, 80, 32, 2, 2, false, 0.05f, 0.03f, rng);
  CheckPrefill(DType::kFloat8E5M2, DType::kFloat32, 256, 16, 3, 1, false, 3.0f, 0.011f, rng);
}

// The scale must matter beyond a global factor: with k_scale large enough
// that x / k_scale falls into e4m3's subnormal range, or small enough that it
// saturates, the stored codes (and the attention) reflect it.
TEST(Fp8KvCacheTest, ReshapeAndCacheSaturatesAndUsesScale) {
  KVCacheShape shape{2, 1, 64, 16, DType::kFloat8E4M3};
  std::vector<uint8_t> kc(shape.num_blocks * shape.block_bytes()), vc(kc.size());
  std::vector<float> k(64, 1.0f), v(64, -1000.0f);
  k[0] = std::nanf("");
  const int64_t slot = 17;  // block 1, offset 1
  ReshapeAndCacheParams p;
  p.key = k.data();
  p.value = v.data();
  p.slot_mapping = &slot;
  p.num_tokens = 1;
  p.cache = {kc.data(), vc.data(), shape, Device::kCPU, 0.25f, 0.5f};
  p.io_dtype = DType::kFloat32;
  ASSERT_TRUE(ReshapeAndCache(p).ok());
  const int64_t base = shape.block_elems();  // block 1
  // key d = 1: 1 / 0.25 = 4 -> e4m3 0x48; key d = 0: NaN -> 0x7F.
  EXPECT_EQ(kc[base + (0 * 16 + 1) * 16 + 1], 0x48);
  EXPECT_EQ(kc[base + (0 * 16 + 1) * 16 + 0], 0x7f);
  // value -1000 / 0.5 = -2000 saturates to -448 (0xFE).
  for (int d = 0; d < 64; ++d) EXPECT_EQ(vc[base + d * 16 + 1], 0xfe) << d;
}

TEST(Fp8KvCacheTest, ValidationNamesTheField) {
  std::mt19937 rng(83);
  Fp8Batch b{DType::kFloat8E4M3, DType::kFloat16, 2, 64, 16, 1.0f, 1.0f, {20}};
  Build(b, rng);
  HostTensor q(DType::kFloat16, 4 * 64), out(DType::kFloat16, 4 * 64);
  PagedAttentionParams p;
  p.out = out.data();
  p.query = q.data();
  p.num_seqs = 1;
  p.num_heads = 4;
  p.cache = b.view(1.0f, 1.0f);
  p.block_tables = b.block_tables.data();
  p.max_blocks_per_seq = b.max_blocks_per_seq;
  p.seq_lens = b.seq_lens.data();
  p.max_seq_len = 20;
  auto expect_invalid = [](const absl::Status& st, const char* field) {
    SCOPED_TRACE(field);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find(field), std::string::npos) << st;
  };
  expect_invalid(PagedAttentionV1(p), "io_dtype");  // unset for an fp8 cache
  p.io_dtype = DType::kFloat8E5M2;
  expect_invalid(PagedAttentionV2(p), "io_dtype");  // fp8 operands
  p.io_dtype = DType::kFloat16;
  EXPECT_TRUE(PagedAttentionV1(p).ok());
  p.cache.k_scale = 0.0f;
  expect_invalid(PagedAttentionV1(p), "k_scale");
  p.cache.k_scale = 1.0f;
  p.cache.v_scale = std::nanf("");
  expect_invalid(PagedAttentionV1(p), "v_scale");
  p.cache.v_scale = 1.0f;
  // Non-fp8 cache: io_dtype must be unset or equal to the cache dtype.
  PagedBatch f16 = MakePagedBatch(rng, {20}, 2, 64, 16, DType::kFloat16);
  p.cache = f16.cache.view();
  p.block_tables = f16.block_tables.data();
  p.max_blocks_per_seq = f16.max_blocks_per_seq;
  p.io_dtype = DType::kFloat32;
  expect_invalid(PagedAttentionV1(p), "io_dtype");
  p.io_dtype = DType::kFloat16;
  EXPECT_TRUE(PagedAttentionV1(p).ok());
  ReshapeAndCacheParams r;
  r.key = q.data();
  r.value = q.data();
  const int64_t slot = 0;
  r.slot_mapping = &slot;
  r.num_tokens = 1;
  r.cache = b.view(1.0f, 1.0f);
  expect_invalid(ReshapeAndCache(r), "io_dtype");
  PrefillAttentionParams pf;
  pf.cache = b.view(1.0f, 1.0f);
  pf.num_heads = 4;
  expect_invalid(ValidatePrefillAttention(pf), "io_dtype");
  // Swapping between fp8 pools of different scales would change the values.
  std::vector<uint8_t> hk(b.key_cache.size()), hv(hk.size());
  KVCacheView src = b.view(0.5f, 1.0f), dst = src;
  dst.key_cache = hk.data();
  dst.value_cache = hv.data();
  dst.k_scale = 1.0f;
  const BlockCopy pair{0, 0};
  expect_invalid(SwapBlocks({&src, 1}, {&dst, 1}, {&pair, 1}), "k_scale");
  dst.k_scale = 0.5f;
  EXPECT_TRUE(SwapBlocks({&src, 1}, {&dst, 1}, {&pair, 1}).ok());
  EXPECT_TRUE(std::equal(hk.begin(), hk.begin() + b.shape.block_bytes(), b.key_cache.begin()));
}

}  // namespace
}  // namespace pagedserve::kernels::testing
