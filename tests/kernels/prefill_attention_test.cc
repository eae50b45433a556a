// Prefill attention (CPU) against the double-precision reference: causal,
// variable-length flattened batch, K/V read from the paged cache (new tokens
// written there by ReshapeAndCache). Tolerances: the attention standard of
// attention_check.h, with its negative controls (zeroed row, dropped block).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/prefill_attention.h"
#include "kernels/reshape_and_cache.h"
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

struct SeqSpec {
  int32_t seq_len;  // context after this step
  int32_t q_len;    // new tokens (query rows)
};

struct PrefillCase {
  int heads = 14, kv_heads = 2, head_size = 64, block_size = 16;
  DType dtype = DType::kFloat32;
  std::vector<SeqSpec> seqs;
  bool alibi = false;
  int query_stride_pad = 0;  // extra elements between query tokens (fused QKV)
  int check_every = 1;       // compare every n-th query row with the reference
  uint32_t seed = 1;
  int window = 0;        // sliding window (0 = none)
  float softcap = 0.0f;  // score soft cap (0 = none)
};

// Blocks wholly before every query row's window are never read: NaN there.
void PoisonBeforeWindows(const PrefillCase& c, PagedBatch& b) {
  for (size_t s = 0; c.window > 0 && s < c.seqs.size(); ++s)
    PoisonBlocksBefore(b, static_cast<int>(s),
                       WindowFirstKey(c.seqs[s].seq_len - c.seqs[s].q_len, c.window));
}

// Negative control of a windowed or soft-capped case: the same call without
// the window and the soft cap misses the reference of the longest sequence's
// last row (it attends to tokens before the window, NaN there; or weighs the
// scores uncapped).
void ExpectFailsWithoutWindow(const PrefillCase& c, const PagedBatch& b, const HostTensor& q,
                              const std::vector<int32_t>& qsl, int64_t qstride,
                              PrefillAttentionParams p) {
  const int hs = c.head_size, H = c.heads;
  size_t longest = 0;
  for (size_t s = 1; s < c.seqs.size(); ++s)
    if (c.seqs[s].seq_len > c.seqs[longest].seq_len) longest = s;
  const int pos = c.seqs[longest].seq_len - 1;
  const int64_t row = qsl[longest + 1] - 1;
  std::vector<double> ref(static_cast<size_t>(H) * hs);
  for (int h = 0; h < H; ++h)
    ReferenceAttendRange(q.f.data() + row * qstride + static_cast<int64_t>(h) * hs, h, H,
                         b.gathered_k(static_cast<int>(longest)),
                         b.gathered_v(static_cast<int>(longest)), WindowFirstKey(pos, c.window),
                         pos + 1, pos, p.scale, 0.0, ref.data() + static_cast<size_t>(h) * hs,
                         c.softcap);
  HostTensor plain(c.dtype, static_cast<size_t>(qsl.back()) * H * hs);
  p.out = plain.data();
  p.sliding_window = 0;
  p.logit_softcap = 0.0f;
  ASSERT_TRUE(PrefillAttention(p).ok());
  std::vector<float> got(ref.size());
  for (size_t k = 0; k < got.size(); ++k) got[k] = plain.Get(static_cast<size_t>(row) * H * hs + k);
  EXPECT_FALSE(AttentionOutputMatches(got, ref, c.dtype)) << "no window passes";
}

void RunPrefillCase(const PrefillCase& c) {
  SCOPED_TRACE(absl::StrCat(DTypeName(c.dtype), " block ", c.block_size, " alibi ", c.alibi,
                            " seqs ", c.seqs.size()));
  std::mt19937 rng(c.seed);
  const int hs = c.head_size, H = c.heads, KVH = c.kv_heads;
  std::vector<int32_t> lens;
  for (const SeqSpec& s : c.seqs) lens.push_back(s.seq_len);
  PagedBatch b = MakePagedBatch(rng, lens, KVH, hs, c.block_size, c.dtype);

  // The new tokens' K/V: fresh values written by ReshapeAndCache (over the
  // ones MakePagedBatch stored), mirrored in the gathered copies.
  std::vector<int32_t> qsl = {0};
  for (const SeqSpec& s : c.seqs) qsl.push_back(qsl.back() + s.q_len);
  const int num_tokens = qsl.back();
  const size_t row = static_cast<size_t>(KVH) * hs;
  HostTensor nk = RandomTensor(rng, c.dtype, num_tokens * row, 1.0f);
  HostTensor nv = RandomTensor(rng, c.dtype, num_tokens * row, 1.0f);
  std::vector<int64_t> slots(num_tokens);
  for (size_t s = 0; s < c.seqs.size(); ++s)
    for (int i = 0; i < c.seqs[s].q_len; ++i) {
      const int pos = c.seqs[s].seq_len - c.seqs[s].q_len + i;
      const int t = qsl[s] + i;
      slots[t] =
          static_cast<int64_t>(b.block_tables[s * b.max_blocks_per_seq + pos / c.block_size]) *
              c.block_size +
          pos % c.block_size;
      std::copy_n(nk.f.begin() + t * row, row, b.k[s].begin() + pos * row);
      std::copy_n(nv.f.begin() + t * row, row, b.v[s].begin() + pos * row);
    }
  PoisonBeforeWindows(c, b);
  ReshapeAndCacheParams rp;
  rp.key = nk.data();
  rp.value = nv.data();
  rp.slot_mapping = slots.data();
  rp.num_tokens = num_tokens;
  rp.cache = b.cache.view();
  ASSERT_TRUE(ReshapeAndCache(rp).ok());

  const int64_t qstride = static_cast<int64_t>(H) * hs + c.query_stride_pad;
  HostTensor q = RandomTensor(rng, c.dtype, num_tokens * qstride, 2.0f);
  HostTensor out(c.dtype, static_cast<size_t>(num_tokens) * H * hs);
  for (size_t i = 0; i < out.size(); ++i) out.Set(i, -7.0f);
  const std::vector<float> slopes = AlibiSlopes(H);
  PrefillAttentionParams p;
  p.out = out.data();
  p.query = q.data();
  p.query_token_stride = c.query_stride_pad ? qstride : 0;
  p.num_seqs = static_cast<int>(c.seqs.size());
  p.num_heads = H;
  p.query_start_loc = qsl.data();
  p.seq_lens = b.seq_lens.data();
  p.cache = b.cache.view();
  p.block_tables = b.block_tables.data();
  p.max_blocks_per_seq = b.max_blocks_per_seq;
  for (const SeqSpec& s : c.seqs) {
    p.max_query_len = std::max(p.max_query_len, s.q_len);
    p.max_seq_len = std::max(p.max_seq_len, s.seq_len);
  }
  p.scale = 1.0f / std::sqrt(static_cast<float>(hs));
  p.alibi_slopes = c.alibi ? slopes.data() : nullptr;
  p.sliding_window = c.window;
  p.logit_softcap = c.softcap;
  ASSERT_TRUE(PrefillAttention(p).ok());

  // Each checked query row (all heads) under the attention standard.
  std::vector<double> ref(static_cast<size_t>(H) * hs);
  std::vector<float> got(ref.size());
  int control_seq = -1;
  std::vector<double> control_ref;
  for (size_t s = 0; s < c.seqs.size(); ++s)
    for (int i = 0; i < c.seqs[s].q_len; ++i) {
      const int t = qsl[s] + i;
      const bool last = i == c.seqs[s].q_len - 1;
      if (i % c.check_every != 0 && !last) continue;
      const int pos = c.seqs[s].seq_len - c.seqs[s].q_len + i;
      for (int h = 0; h < H; ++h)
        ReferenceAttendRange(q.f.data() + t * qstride + static_cast<int64_t>(h) * hs, h, H,
                             b.gathered_k(s), b.gathered_v(s), WindowFirstKey(pos, c.window),
                             pos + 1, pos, p.scale, c.alibi ? slopes[h] : 0.0,
                             ref.data() + static_cast<size_t>(h) * hs, c.softcap);
      for (size_t k = 0; k < got.size(); ++k) got[k] = out.Get(static_cast<size_t>(t) * H * hs + k);
      ASSERT_TRUE(AttentionOutputMatches(got, ref, c.dtype))
          << "seq " << s << " (len " << c.seqs[s].seq_len << ", q_len " << c.seqs[s].q_len
          << ") row " << i;
      // Negative-control candidate: the last row of the longest sequence that
      // keeps a valid context with one block dropped.
      const SeqSpec& sp = c.seqs[s];
      if (last && sp.seq_len >= 3 * c.block_size && sp.seq_len - c.block_size >= sp.q_len &&
          (control_seq < 0 || sp.seq_len > c.seqs[control_seq].seq_len)) {
        control_seq = static_cast<int>(s);
        control_ref = ref;
      }
    }

  if (c.window > 0 || c.softcap > 0) return ExpectFailsWithoutWindow(c, b, q, qsl, qstride, p);
  // Negative controls: a zeroed row, and the same kernel with one block of the
  // control sequence's context dropped (its last row then attends to every
  // token but that block's), must both fail the standard.
  if (control_seq < 0) {
    EXPECT_FALSE(AttentionOutputMatches(std::vector<float>(ref.size(), 0.0f), ref, c.dtype));
    return;
  }
  std::vector<int32_t> tables = b.block_tables, dlens = b.seq_lens;
  std::vector<int32_t> trow(tables.begin() + control_seq * b.max_blocks_per_seq,
                            tables.begin() + (control_seq + 1) * b.max_blocks_per_seq);
  DropBlock(&trow, &dlens[control_seq], (c.seqs[control_seq].seq_len - 1) / c.block_size - 1,
            c.block_size);
  std::copy(trow.begin(), trow.end(), tables.begin() + control_seq * b.max_blocks_per_seq);
  HostTensor dropped_out(c.dtype, out.size());
  p.out = dropped_out.data();
  p.block_tables = tables.data();
  p.seq_lens = dlens.data();
  ASSERT_TRUE(PrefillAttention(p).ok());
  const size_t last_row = static_cast<size_t>(qsl[control_seq + 1] - 1);
  for (size_t k = 0; k < got.size(); ++k) got[k] = dropped_out.Get(last_row * H * hs + k);
  ExpectRejectsBrokenOutputs(control_ref, got, c.dtype);
}

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

// 14 query heads / 2 KV heads, head size 64, block 16: one cached token plus 8
// new query tokens, with and without ALiBi, query rows strided as in a fused
// QKV buffer.
TEST(PrefillAttentionTest, OneCachedTokenPlusEightNew) {
  uint32_t seed = 1;
  for (DType dt : kDTypes)
    for (bool alibi : {false, true}) {
      PrefillCase c;
      c.dtype = dt;
      c.seqs = {{9, 8}};
      c.alibi = alibi;
      c.query_stride_pad = 2 * 2 * 64;  // room for K and V of 2 KV heads
      c.seed = seed++;
      RunPrefillCase(c);
    }
}

// KV lengths from 1 upward in one variable-length batch (whole prompts, and
// prompts with a cached prefix), every block size and dtype.
TEST(PrefillAttentionTest, KVLengthsFromOneUpward) {
  uint32_t seed = 10;
  for (int bs : {8, 16, 32})
    for (DType dt : kDTypes) {
      PrefillCase c;
      c.block_size = bs;
      c.dtype = dt;
      for (int len = 1; len <= (kLight ? 9 : 20); ++len) c.seqs.push_back({len, len});
      c.seqs.push_back({40, 3});
      c.seqs.push_back({bs + 1, 1});  // a decode-like row inside a prefill batch
      c.seqs.push_back({5, 0});       // a sequence with nothing to compute
      c.alibi = bs == 16;
      c.seed = seed++;
      RunPrefillCase(c);
    }
}

// A long prompt that crosses the 512-token chunks, and a prompt whose 900-token
// prefix is already cached; GQA 8/1 with head size 128 too.
// Sliding window: whole prompts longer than the window, a chunk after a
// cached prefix longer than the window (tiles that start past it), windows
// shorter than a block and spanning partitions; every dtype.
TEST(PrefillAttentionTest, SlidingWindow) {
  uint32_t seed = 500;
  for (DType dt : kDTypes)
    for (int window : {5, 40, 600}) {
      PrefillCase c;
      c.heads = 4;
      c.kv_heads = 2;
      c.dtype = dt;
      c.window = window;
      c.seqs = {{1, 1}, {70, 70}, {200, 37}, {1300, 100}, {45, 1}};
      c.check_every = 3;
      c.seed = seed++;
      RunPrefillCase(c);
    }
}

// Gemma 2's attention soft-capping, alone and with a window (its local
// layers), every dtype (fp16 / bf16 caches take the AVX2 intrinsics path on
// x86): queries of scale 2 give scores well past the cap of 1.5.
TEST(PrefillAttentionTest, LogitSoftcap) {
  uint32_t seed = 900;
  for (DType dt : kDTypes)
    for (int window : {0, 40}) {
      PrefillCase c;
      c.heads = 4;
      c.kv_heads = 2;
      c.dtype = dt;
      c.window = window;
      c.softcap = 1.5f;
      c.seqs = {{1, 1}, {70, 70}, {200, 37}, {45, 1}};
      c.check_every = 3;
      c.seed = seed++;
      RunPrefillCase(c);
    }
}

TEST(PrefillAttentionTest, LongPrompt) {
  for (DType dt : {DType::kFloat32, DType::kBFloat16}) {
    PrefillCase c;
    c.dtype = dt;
    // Sanitizer builds: fewer rows, still across the 512-token chunk boundary.
    c.seqs = kLight ? std::vector<SeqSpec>{{530, 24}, {1100, 6}}
                    : std::vector<SeqSpec>{{700, 700}, {1100, 200}};
    c.check_every = kLight ? 5 : 1;
    c.seed = 77;
    RunPrefillCase(c);
  }
  PrefillCase c;
  c.heads = 8;
  c.kv_heads = 1;
  c.head_size = 128;
  c.dtype = DType::kFloat16;
  c.seqs = {{600, kLight ? 40 : 600}};
  c.check_every = kLight ? 7 : 3;
  c.alibi = true;
  c.seed = 78;
  RunPrefillCase(c);
}

}  // namespace
}  // namespace pagedserve::kernels::testing
