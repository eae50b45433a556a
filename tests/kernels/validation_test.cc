// Validation at the API boundary: every bad input gives InvalidArgument (a
// kCUDA view in a CPU-only build: FailedPrecondition) and nothing is written.
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cache_ops.h"
#include "kernels/cuda_device.h"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"
#include "kernels/reshape_and_cache.h"
#include "tests/kernels/kernel_test_util.h"

namespace pagedserve::kernels::testing {
namespace {

class DecodeValidationTest : public ::testing::Test {
 protected:
  DecodeValidationTest()
      : rng_(1),
        b_(MakePagedBatch(rng_, {20, 33}, 2, 64, 16, DType::kFloat32)),
        q_(RandomTensor(rng_, DType::kFloat32, 2 * 4 * 64, 1.0f)),
        out_(DType::kFloat32, 2 * 4 * 64) {
    for (size_t i = 0; i < out_.size(); ++i) out_.Set(i, 42.0f);
    p_.out = out_.data();
    p_.query = q_.data();
    p_.num_seqs = 2;
    p_.num_heads = 4;
    p_.cache = b_.cache.view();
    p_.block_tables = b_.block_tables.data();
    p_.max_blocks_per_seq = b_.max_blocks_per_seq;
    p_.seq_lens = b_.seq_lens.data();
    p_.max_seq_len = 33;
    p_.scale = 0.125f;
  }
  // Runs v1 and v2 on a mutated copy of the good params: both must fail with
  // `code` and leave the output untouched.
  void ExpectRejected(const std::function<void(PagedAttentionParams&)>& mutate,
                      absl::StatusCode code = absl::StatusCode::kInvalidArgument) {
    PagedAttentionParams p = p_;
    mutate(p);
    for (auto* fn : {&PagedAttentionV1, &PagedAttentionV2, &PagedAttention}) {
      const absl::Status st = fn(p);
      EXPECT_EQ(st.code(), code) << st;
      EXPECT_FALSE(st.message().empty());
    }
    if (code == absl::StatusCode::kInvalidArgument) {
      EXPECT_FALSE(ValidatePagedAttention(p).ok());
    }
    for (size_t i = 0; i < out_.size(); ++i) ASSERT_EQ(out_.Get(i), 42.0f) << "output written";
  }
  std::mt19937 rng_;
  PagedBatch b_;
  HostTensor q_, out_;
  PagedAttentionParams p_;
};

TEST_F(DecodeValidationTest, GoodParamsPass) {
  EXPECT_TRUE(ValidatePagedAttention(p_).ok());
  EXPECT_TRUE(PagedAttentionV1(p_).ok());
}

TEST_F(DecodeValidationTest, RejectsBadInputs) {
  ExpectRejected([](auto& p) { p.cache.shape.head_size = 72; });
  ExpectRejected([](auto& p) { p.cache.shape.block_size = 12; });
  ExpectRejected([](auto& p) { p.cache.shape.num_blocks = 0; });
  ExpectRejected([](auto& p) { p.cache.key_cache = nullptr; });
  ExpectRejected([](auto& p) { p.query = nullptr; });
  ExpectRejected([](auto& p) { p.out = nullptr; });
  ExpectRejected([](auto& p) { p.block_tables = nullptr; });
  ExpectRejected([](auto& p) { p.seq_lens = nullptr; });
  ExpectRejected([](auto& p) { p.num_heads = 3; });  // not a multiple of 2 KV heads
  ExpectRejected([](auto& p) { p.num_heads = 0; });
  ExpectRejected([](auto& p) { p.num_seqs = -1; });
  ExpectRejected([](auto& p) { p.max_seq_len = 32; });  // shorter than seq_lens[1]
  ExpectRejected([](auto& p) { p.max_blocks_per_seq = 0; });
  ExpectRejected([](auto& p) { p.scale = NAN; });
}

TEST_F(DecodeValidationTest, RejectsBadBlockTablesAndLengths) {
  const int mb = b_.max_blocks_per_seq;
  std::vector<int32_t> bt = b_.block_tables;
  bt[mb + 2] = static_cast<int32_t>(b_.cache.shape().num_blocks);  // block id == pool size
  ExpectRejected([&](auto& p) { p.block_tables = bt.data(); });
  bt = b_.block_tables;
  bt[1] = -1;
  ExpectRejected([&](auto& p) { p.block_tables = bt.data(); });
  std::vector<int32_t> lens = {0, 33};
  ExpectRejected([&](auto& p) { p.seq_lens = lens.data(); });
  lens = {20, mb * 16 + 1};  // longer than the block table
  ExpectRejected([&](auto& p) {
    p.seq_lens = lens.data();
    p.max_seq_len = lens[1];
  });
}

// Only in builds without CUDA (in a CUDA build a kCUDA view is legal; the
// device tests cover it), so that no configuration reports a skip here.
#ifndef PAGEDSERVE_WITH_CUDA
TEST_F(DecodeValidationTest, CudaViewWithoutCuda) {
  std::string reason;
  EXPECT_FALSE(CudaDeviceAvailable(&reason));
  EXPECT_EQ(reason, "built without CUDA");
  ExpectRejected([](auto& p) { p.cache.device = Device::kCUDA; },
                 absl::StatusCode::kFailedPrecondition);
}
#endif

TEST(PrefillValidationTest, RejectsBadInputs) {
  std::mt19937 rng(2);
  PagedBatch b = MakePagedBatch(rng, {9, 30}, 2, 64, 16, DType::kFloat16);
  HostTensor q = RandomTensor(rng, DType::kFloat16, 11 * 14 * 64, 1.0f);
  HostTensor out(DType::kFloat16, q.size());
  for (size_t i = 0; i < out.size(); ++i) out.Set(i, 3.0f);
  std::vector<int32_t> qsl = {0, 8, 11};
  PrefillAttentionParams good;
  good.out = out.data();
  good.query = q.data();
  good.num_seqs = 2;
  good.num_heads = 14;
  good.query_start_loc = qsl.data();
  good.seq_lens = b.seq_lens.data();
  good.cache = b.cache.view();
  good.block_tables = b.block_tables.data();
  good.max_blocks_per_seq = b.max_blocks_per_seq;
  good.max_query_len = 8;
  good.max_seq_len = 30;
  good.scale = 0.125f;
  ASSERT_TRUE(ValidatePrefillAttention(good).ok());
  std::vector<int32_t> bad_qsl = {0, 8, 7};
  std::vector<int32_t> long_q = {0, 10, 11};  // q_len 10 > seq_len 9
  std::vector<int32_t> bt = b.block_tables;
  bt[b.max_blocks_per_seq + 1] = 1000;
  const std::vector<std::function<void(PrefillAttentionParams&)>> mutations = {
      [](auto& p) { p.num_heads = 15; },
      [](auto& p) { p.cache.shape.head_size = 100; },
      [](auto& p) { p.query = nullptr; },
      [](auto& p) { p.query_start_loc = nullptr; },
      [&](auto& p) { p.query_start_loc = bad_qsl.data(); },
      [&](auto& p) {
        p.query_start_loc = long_q.data();
        p.max_query_len = 10;
      },
      [](auto& p) { p.max_query_len = 7; },
      [](auto& p) { p.max_seq_len = 29; },
      [](auto& p) { p.query_token_stride = 14 * 64 - 1; },
      [&](auto& p) { p.block_tables = bt.data(); },
  };
  for (size_t i = 0; i < mutations.size(); ++i) {
    PrefillAttentionParams p = good;
    mutations[i](p);
    const absl::Status st = PrefillAttention(p);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << "mutation " << i << ": " << st;
  }
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out.Get(i), 3.0f) << "output written";
}

TEST(CacheOpsValidationTest, RejectsBadInputs) {
  KVCacheShape s;
  s.num_blocks = 4;
  s.num_kv_heads = 2;
  s.head_size = 64;
  s.block_size = 8;
  s.dtype = DType::kBFloat16;
  HostPagedCache a(s), c(s);
  a.Fill(1.0f);
  c.Fill(2.0f);
  const std::vector<uint8_t> a_key = a.key_bytes(), c_key = c.key_bytes();
  std::vector<KVCacheView> layers = {a.view(), c.view()};

  // reshape_and_cache: a slot beyond the pool, null inputs, a short stride.
  HostTensor kv(DType::kBFloat16, 3 * 2 * 64);
  std::vector<int64_t> slots = {0, -1, 4 * 8};
  ReshapeAndCacheParams rp;
  rp.key = kv.data();
  rp.value = kv.data();
  rp.slot_mapping = slots.data();
  rp.num_tokens = 3;
  rp.cache = a.view();
  EXPECT_EQ(ReshapeAndCache(rp).code(), absl::StatusCode::kInvalidArgument);
  slots[2] = 31;
  rp.key = nullptr;
  EXPECT_EQ(ReshapeAndCache(rp).code(), absl::StatusCode::kInvalidArgument);
  rp.key = kv.data();
  rp.key_token_stride = 64;
  EXPECT_EQ(ReshapeAndCache(rp).code(), absl::StatusCode::kInvalidArgument);

  // copy_blocks: out-of-pool ids, mismatched layers.
  const std::vector<BlockCopy> bad1 = {{0, 1}, {4, 0}}, bad2 = {{-1, 0}}, bad3 = {{0, 4}};
  for (const auto* pairs : {&bad1, &bad2, &bad3})
    EXPECT_EQ(CopyBlocks(layers, *pairs).code(), absl::StatusCode::kInvalidArgument);
  KVCacheShape s2 = s;
  s2.head_size = 128;
  HostPagedCache other(s2);
  const std::vector<KVCacheView> mixed = {a.view(), other.view()};
  const std::vector<BlockCopy> good = {{0, 1}};
  EXPECT_EQ(CopyBlocks(mixed, good).code(), absl::StatusCode::kInvalidArgument);

  // swap_blocks: layer count, shapes, ids.
  const std::vector<KVCacheView> one = {c.view()};
  EXPECT_EQ(SwapBlocks(layers, one, good).code(), absl::StatusCode::kInvalidArgument);
  const std::vector<KVCacheView> src1 = {a.view()}, dst_other = {other.view()};
  EXPECT_EQ(SwapBlocks(src1, dst_other, good).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SwapBlocks(src1, one, bad3).code(), absl::StatusCode::kInvalidArgument);

  EXPECT_TRUE(a.key_bytes() == a_key) << "a written";
  EXPECT_TRUE(c.key_bytes() == c_key) << "c written";
}

}  // namespace
}  // namespace pagedserve::kernels::testing
