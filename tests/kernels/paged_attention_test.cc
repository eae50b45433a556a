// paged_attention v1 / v2 (CPU) against the double-precision reference on
// gathered K/V (tests/kernels/reference_attention.h).
//
// Tolerances: the attention standard of attention_check.h (per element scaled
// to the reference output, plus a relative-RMS bound); every case with a
// sequence of three or more blocks also checks that a zeroed output and the
// kernel's own output with one block dropped fail that standard. Built with
// PAGEDSERVE_KERNEL_TESTS_LIGHT (sanitizer builds), the grid is thinned and the longest contexts
// shortened.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/paged_attention.h"
#include "tests/kernels/attention_check.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/reference_attention.h"

namespace pagedserve::kernels::testing {
namespace {

#ifdef PAGEDSERVE_KERNEL_TESTS_LIGHT
constexpr bool kLight = true;
#else
constexpr bool kLight = false;
#endif

struct HeadConfig {
  int heads, kv_heads;
};
constexpr HeadConfig kHeadConfigs[] = {{40, 40}, {64, 8}, {9, 3}, {8, 1}};
constexpr int kHeadSizes[] = {64, 80, 96, 112, 128, 256};
constexpr int kBlockSizes[] = {8, 16, 32};
constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

struct DecodeCase {
  HeadConfig heads;
  int head_size;
  int block_size;
  DType dtype;
  std::vector<int32_t> seq_lens;
  bool alibi;
  float q_mag = 2.0f;
  float v_mag = 1.0f;
  uint32_t seed = 1;

  std::string Name() const {
    std::string lens;
    for (int32_t l : seq_lens) absl::StrAppend(&lens, l, ",");
    return absl::StrCat("heads ", heads.heads, "/", heads.kv_heads, " head_size ", head_size,
                        " block ", block_size, " ", DTypeName(dtype), " alibi ", alibi, " lens ",
                        lens);
  }
};

struct DecodeOutputs {
  HostTensor v1, v2;
};

PagedAttentionParams MakeParams(PagedBatch& b, HostTensor& q, int heads, const float* slopes,
                                void* out) {
  PagedAttentionParams p;
  p.out = out;
  p.query = q.data();
  p.num_seqs = b.num_seqs;
  p.num_heads = heads;
  p.cache = b.cache.view();
  p.block_tables = b.block_tables.data();
  p.max_blocks_per_seq = b.max_blocks_per_seq;
  p.seq_lens = b.seq_lens.data();
  p.max_seq_len = *std::max_element(b.seq_lens.begin(), b.seq_lens.end());
  p.scale = 1.0f / std::sqrt(static_cast<float>(b.cache.shape().head_size));
  p.alibi_slopes = slopes;
  return p;
}

std::vector<float> ToFloats(const HostTensor& t, size_t begin, size_t n) {
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) f[i] = t.Get(begin + i);
  return f;
}

// Runs v2 (v1 when `v1`) on `b` with sequence s's block `index` dropped
// (DropBlock) and returns sequence s's output.
std::vector<float> RunWithDroppedBlock(PagedBatch& b, HostTensor& q, int heads, const float* slopes,
                                       int s, int index, bool v1) {
  std::vector<int32_t> tables = b.block_tables, lens = b.seq_lens;
  std::vector<int32_t> row(tables.begin() + s * b.max_blocks_per_seq,
                           tables.begin() + (s + 1) * b.max_blocks_per_seq);
  DropBlock(&row, &lens[s], index, b.cache.shape().block_size);
  std::copy(row.begin(), row.end(), tables.begin() + s * b.max_blocks_per_seq);
  HostTensor out(q.dtype, q.size());
  PagedAttentionParams p = MakeParams(b, q, heads, slopes, out.data());
  p.block_tables = tables.data();
  p.seq_lens = lens.data();
  EXPECT_TRUE((v1 ? PagedAttentionV1(p) : PagedAttentionV2(p)).ok());
  const size_t n = static_cast<size_t>(heads) * b.cache.shape().head_size;
  return ToFloats(out, s * n, n);
}

// v1 and v2 against the reference under the attention standard
// (attention_check.h), sequence by sequence; then the negative controls on
// the longest sequence with at least three blocks: zeroed output and its
// last full block dropped (the one ALiBi weighs most) must both fail.
void RunDecodeCase(const DecodeCase& c) {
  SCOPED_TRACE(c.Name());
  std::mt19937 rng(c.seed);
  const int hs = c.head_size;
  PagedBatch b =
      MakePagedBatch(rng, c.seq_lens, c.heads.kv_heads, hs, c.block_size, c.dtype, 1.0f, c.v_mag);
  const size_t n = static_cast<size_t>(b.num_seqs) * c.heads.heads * hs;
  HostTensor q = RandomTensor(rng, c.dtype, n, c.q_mag);
  const std::vector<float> slopes = AlibiSlopes(c.heads.heads);
  const float* alibi = c.alibi ? slopes.data() : nullptr;
  HostTensor o1(c.dtype, n), o2(c.dtype, n);
  PagedAttentionParams p = MakeParams(b, q, c.heads.heads, alibi, nullptr);
  p.out = o1.data();
  ASSERT_TRUE(PagedAttentionV1(p).ok());
  p.out = o2.data();
  ASSERT_TRUE(PagedAttentionV2(p).ok());

  const size_t per_seq = static_cast<size_t>(c.heads.heads) * hs;
  int control_seq = -1;
  std::vector<double> control_ref;
  for (int s = 0; s < b.num_seqs; ++s) {
    const std::vector<double> ref =
        ReferenceDecode(q.f.data() + s * per_seq, c.heads.heads, b.gathered_k(s), b.gathered_v(s),
                        b.seq_lens[s], p.scale, alibi);
    ASSERT_TRUE(AttentionOutputMatches(ToFloats(o1, s * per_seq, per_seq), ref, c.dtype))
        << "v1 seq " << s << " (len " << b.seq_lens[s] << ")";
    ASSERT_TRUE(AttentionOutputMatches(ToFloats(o2, s * per_seq, per_seq), ref, c.dtype))
        << "v2 seq " << s << " (len " << b.seq_lens[s] << ")";
    if (b.seq_lens[s] >= 3 * c.block_size &&
        (control_seq < 0 || b.seq_lens[s] > b.seq_lens[control_seq])) {
      control_seq = s;
      control_ref = ref;
    }
  }
  if (control_seq < 0) return;
  const int nb = (b.seq_lens[control_seq] + c.block_size - 1) / c.block_size;
  for (bool v1 : {true, false}) {
    SCOPED_TRACE(v1 ? "negative controls, v1" : "negative controls, v2");
    ExpectRejectsBrokenOutputs(
        control_ref, RunWithDroppedBlock(b, q, c.heads.heads, alibi, control_seq, nb - 2, v1),
        c.dtype);
  }
}

// Every head configuration, head size, block size and dtype with the short
// context lengths 1, bs-1, bs, bs+1 (one batch), ALiBi alternating.
TEST(PagedAttentionTest, ShortContextsEveryShape) {
  int i = 0;
  for (const HeadConfig& hc : kHeadConfigs)
    for (int hs : kHeadSizes)
      for (int bs : kBlockSizes)
        for (DType dt : kDTypes) {
          ++i;
          if (kLight && i % 7 != 0) continue;
          RunDecodeCase({hc,
                         hs,
                         bs,
                         dt,
                         {1, bs - 1, bs, bs + 1},
                         i % 2 == 0,
                         2.0f,
                         1.0f,
                         static_cast<uint32_t>(i)});
        }
}

// Contexts around and across the 512-token partitions: every dtype and block
// size, head configurations and head sizes rotating.
TEST(PagedAttentionTest, LongContextsAcrossPartitions) {
  const std::vector<int32_t> lens = kLight ? std::vector<int32_t>{511, 513, 1025}
                                           : std::vector<int32_t>{511, 512, 513, 1025, 4097};
  // (heads, head size) pairs that keep the caches small: wide head counts with
  // small heads.
  const struct {
    HeadConfig hc;
    int hs;
  } shapes[] = {{{8, 1}, 256}, {{9, 3}, 128}, {{64, 8}, 80}, {{40, 40}, 64}, {{9, 3}, 96},
                {{8, 1}, 112}, {{64, 8}, 64}, {{9, 3}, 256}, {{8, 1}, 128}};
  int i = 0;
  for (int bs : kBlockSizes)
    for (DType dt : kDTypes) {
      const auto& sh = shapes[i % 9];
      ++i;
      if (kLight && i % 3 != 0) continue;
      RunDecodeCase(
          {sh.hc, sh.hs, bs, dt, lens, i % 2 == 1, 2.0f, 1.0f, static_cast<uint32_t>(100 + i)});
    }
}

// Sliding window (kernels/paged_attention.h): v1 and v2 against the windowed
// reference, lengths around the window edge and across partitions (1100
// tokens with a window of 40: two v2 partitions wholly before it), every
// dtype (the AVX2 16-bit path and the generic one), blocks wholly before each
// window set to NaN (never read). Negative control: the same call without
// the window fails (it reads the NaN blocks or weighs tokens it must not).
TEST(PagedAttentionTest, SlidingWindow) {
  int i = 0;
  for (DType dt : kDTypes)
    for (int window : {40, 700}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dt), " window ", window));
      std::mt19937 rng(300 + i++);
      const int heads = 4, kv_heads = 2, hs = 64, bs = 16;
      PagedBatch b = MakePagedBatch(rng, {1, 39, 40, 41, 57, 600, 1100}, kv_heads, hs, bs, dt);
      for (int s = 0; s < b.num_seqs; ++s)
        PoisonBlocksBefore(b, s, WindowFirstKey(b.seq_lens[s] - 1, window));
      const size_t per_seq = static_cast<size_t>(heads) * hs;
      HostTensor q = RandomTensor(rng, dt, b.num_seqs * per_seq, 2.0f);
      HostTensor o1(dt, q.size()), o2(dt, q.size()), plain(dt, q.size());
      PagedAttentionParams p = MakeParams(b, q, heads, nullptr, o1.data());
      p.sliding_window = window;
      ASSERT_TRUE(PagedAttentionV1(p).ok());
      p.out = o2.data();
      ASSERT_TRUE(PagedAttentionV2(p).ok());
      p.out = plain.data();
      p.sliding_window = 0;
      ASSERT_TRUE(PagedAttentionV2(p).ok());
      for (int s = 0; s < b.num_seqs; ++s) {
        const std::vector<double> ref =
            ReferenceDecode(q.f.data() + s * per_seq, heads, b.gathered_k(s), b.gathered_v(s),
                            b.seq_lens[s], p.scale, nullptr, window);
        EXPECT_TRUE(AttentionOutputMatches(ToFloats(o1, s * per_seq, per_seq), ref, dt))
            << "v1 seq " << s << " (len " << b.seq_lens[s] << ")";
        EXPECT_TRUE(AttentionOutputMatches(ToFloats(o2, s * per_seq, per_seq), ref, dt))
            << "v2 seq " << s << " (len " << b.seq_lens[s] << ")";
        if (b.seq_lens[s] > window + 4) {
          EXPECT_FALSE(AttentionOutputMatches(ToFloats(plain, s * per_seq, per_seq), ref, dt))
              << "no window passes, seq " << s;
        }
      }
    }
}

// Gemma 2's attention soft-capping (v1 and v2, every dtype, alone and with a
// window) against the double reference with the cap; the same call without
// the cap misses it.
TEST(PagedAttentionTest, LogitSoftcap) {
  int i = 0;
  for (DType dt : kDTypes)
    for (int window : {0, 40}) {
      SCOPED_TRACE(absl::StrCat(DTypeName(dt), " window ", window));
      std::mt19937 rng(700 + i++);
      const int heads = 4, kv_heads = 2, hs = 64, bs = 16;
      PagedBatch b = MakePagedBatch(rng, {1, 39, 57, 600}, kv_heads, hs, bs, dt);
      const size_t per_seq = static_cast<size_t>(heads) * hs;
      HostTensor q = RandomTensor(rng, dt, b.num_seqs * per_seq, 2.0f);
      HostTensor o1(dt, q.size()), o2(dt, q.size()), plain(dt, q.size());
      PagedAttentionParams p = MakeParams(b, q, heads, nullptr, o1.data());
      p.sliding_window = window;
      p.logit_softcap = 1.5f;
      ASSERT_TRUE(PagedAttentionV1(p).ok());
      p.out = o2.data();
      ASSERT_TRUE(PagedAttentionV2(p).ok());
      p.out = plain.data();
      p.logit_softcap = 0.0f;
      ASSERT_TRUE(PagedAttentionV2(p).ok());
      for (int s = 0; s < b.num_seqs; ++s) {
        const std::vector<double> ref =
            ReferenceDecode(q.f.data() + s * per_seq, heads, b.gathered_k(s), b.gathered_v(s),
                            b.seq_lens[s], p.scale, nullptr, window, 1.5);
        EXPECT_TRUE(AttentionOutputMatches(ToFloats(o1, s * per_seq, per_seq), ref, dt))
            << "v1 seq " << s << " (len " << b.seq_lens[s] << ")";
        EXPECT_TRUE(AttentionOutputMatches(ToFloats(o2, s * per_seq, per_seq), ref, dt))
            << "v2 seq " << s << " (len " << b.seq_lens[s] << ")";
        if (b.seq_lens[s] > 1) {
          EXPECT_FALSE(AttentionOutputMatches(ToFloats(plain, s * per_seq, per_seq), ref, dt))
              << "no soft cap passes, seq " << s;
        }
      }
    }
}

TEST(PagedAttentionTest, NegativeSlidingWindowIsRejected) {
  std::mt19937 rng(9);
  PagedBatch b = MakePagedBatch(rng, {5}, 1, 64, 16, DType::kFloat32);
  HostTensor q = RandomTensor(rng, DType::kFloat32, 64, 1.0f), out(DType::kFloat32, 64);
  PagedAttentionParams p = MakeParams(b, q, 1, nullptr, out.data());
  p.sliding_window = -1;
  const absl::Status st = PagedAttention(p);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("sliding_window"), std::string::npos) << st;
}

// Peaky softmax (large queries) so that errors in the max/rescaling logic show.
TEST(PagedAttentionTest, PeakySoftmax) {
  for (DType dt : kDTypes)
    RunDecodeCase({{9, 3}, 64, 16, dt, {17, 600, 1500}, false, 16.0f, 1.0f, 7});
}

// Long context with large values: 32K tokens, |V| near 1e4 in fp16 / bf16.
TEST(PagedAttentionTest, LongContextLargeValues) {
  const int32_t len = kLight ? 8192 : 32768;
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    DecodeCase c{{8, 1}, 128, 16, dt, {len}, false, 2.0f, 1e4f, 11};
    RunDecodeCase(c);
  }
}

// A zero query gives equal weights: the output is the mean of V over exactly
// seq_len tokens, whatever the unused slots of the last block hold.
TEST(PagedAttentionTest, PaddingDoesNotLeak) {
  for (DType dt : kDTypes)
    for (float garbage : {std::numeric_limits<float>::quiet_NaN(), 6e4f, -3e38f}) {
      if (dt != DType::kFloat32 && std::abs(garbage) > 6e4f) continue;
      SCOPED_TRACE(absl::StrCat(DTypeName(dt), " garbage ", garbage));
      std::mt19937 rng(3);
      const std::vector<int32_t> lens = {1, 15, 17, 33, 513};
      PagedBatch b = MakePagedBatch(rng, lens, 3, 128, 16, dt, 1.0f, 1.0f, 2, 1, garbage);
      const int heads = 9, hs = 128;
      HostTensor q(dt, lens.size() * heads * hs);
      for (size_t i = 0; i < q.size(); ++i) q.Set(i, 0.0f);
      for (int version = 1; version <= 2; ++version) {
        HostTensor out(dt, q.size());
        PagedAttentionParams p = MakeParams(b, q, heads, nullptr, out.data());
        ASSERT_TRUE((version == 1 ? PagedAttentionV1(p) : PagedAttentionV2(p)).ok());
        for (size_t s = 0; s < lens.size(); ++s) {
          std::vector<double> mean(static_cast<size_t>(heads) * hs, 0.0);
          for (int h = 0; h < heads; ++h)
            for (int d = 0; d < hs; ++d) {
              double& m = mean[static_cast<size_t>(h) * hs + d];
              for (int t = 0; t < lens[s]; ++t)
                m += b.v[s][(static_cast<size_t>(t) * 3 + h / 3) * hs + d];
              m /= lens[s];
            }
          ASSERT_TRUE(AttentionOutputMatches(ToFloats(out, s * mean.size(), mean.size()), mean, dt))
              << "v" << version << " seq " << s << " (len " << lens[s] << ")";
        }
      }
    }
}

// The caller-provided v2 workspace and the v1/v2 heuristic.
TEST(PagedAttentionTest, WorkspaceAndHeuristic) {
  EXPECT_TRUE(ShouldUsePagedAttentionV1(1, 8, 512));      // one partition
  EXPECT_FALSE(ShouldUsePagedAttentionV1(1, 8, 513));     // little parallelism, 2 partitions
  EXPECT_TRUE(ShouldUsePagedAttentionV1(64, 32, 4096));   // 2048 (seq, head) pairs
  EXPECT_FALSE(ShouldUsePagedAttentionV1(64, 32, 8193));  // too long for v1
  EXPECT_EQ(PagedAttentionV2WorkspaceBytes(2, 4, 64, 1025), size_t{2 * 4 * 3 * (2 + 64) * 4});

  std::mt19937 rng(5);
  const std::vector<int32_t> lens = {700, 1300};
  PagedBatch b = MakePagedBatch(rng, lens, 2, 64, 16, DType::kFloat32);
  HostTensor q = RandomTensor(rng, DType::kFloat32, 2 * 4 * 64, 1.0f);
  HostTensor a(DType::kFloat32, q.size()), c(DType::kFloat32, q.size()),
      d(DType::kFloat32, q.size());
  PagedAttentionParams p = MakeParams(b, q, 4, nullptr, a.data());
  std::vector<float> ws(PagedAttentionV2WorkspaceBytes(2, 4, 64, p.max_seq_len) / 4 + 1,
                        std::numeric_limits<float>::quiet_NaN());
  p.workspace = ws.data();
  ASSERT_TRUE(PagedAttentionV2(p).ok());
  EXPECT_TRUE(std::isnan(ws.back())) << "v2 wrote past its workspace";
  p.workspace = nullptr;
  p.out = c.data();
  ASSERT_TRUE(PagedAttentionV1(p).ok());
  p.out = d.data();
  ASSERT_TRUE(PagedAttention(p).ok());
  for (size_t i = 0; i < q.size(); ++i) {
    EXPECT_NEAR(a.Get(i), c.Get(i), 2e-5);
    EXPECT_NEAR(d.Get(i), c.Get(i), 2e-5);
  }
}

}  // namespace
}  // namespace pagedserve::kernels::testing
