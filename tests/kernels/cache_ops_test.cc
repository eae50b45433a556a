// reshape_and_cache against the test's own indexing of the layout in
// kernels/types.h; copy_blocks and swap_blocks byte-identical round trips;
// the fp16 / bf16 conversions of kernels/cpu/half.h. fp8 caches: reshape_and_cache
// stores fp8(x / scale) (saturating) from an fp16/fp32 input, copy/swap move
// fp8 blocks byte-exactly (conversions themselves: fp8_conversion_test.cc).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cache_ops.h"
#include "kernels/cpu/half.h"
#include "kernels/reshape_and_cache.h"
#include "tests/kernels/kernel_test_util.h"

namespace pagedserve::kernels::testing {
namespace {

constexpr DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3,
                             DType::kFloat8E5M2};

KVCacheShape Shape(int64_t blocks, int kvh, int hs, int bs, DType dt) {
  KVCacheShape s;
  s.num_blocks = blocks;
  s.num_kv_heads = kvh;
  s.head_size = hs;
  s.block_size = bs;
  s.dtype = dt;
  return s;
}

TEST(ReshapeAndCacheTest, ScattersIntoLayoutAndSkipsPadding) {
  for (DType dt : kDTypes)
    for (int bs : {8, 16, 32})
      for (int hs : {64, 80, 256}) {
        SCOPED_TRACE(absl::StrCat(DTypeName(dt), " block ", bs, " head ", hs));
        std::mt19937 rng(bs * 1000 + hs);
        const int kvh = 3, blocks = 5, tokens = 23;
        // fp8: fp32 or fp16 input and per-layer scales; the value scale makes
        // |x / v_scale| exceed e4m3's 448 (saturation).
        const bool fp8 = IsFp8(dt);
        const DType io = fp8 ? (bs == 16 ? DType::kFloat32 : DType::kFloat16) : dt;
        const float ks = fp8 ? 0.37f : 1.0f, vs = fp8 ? 0.006f : 1.0f;
        HostPagedCache cache(Shape(blocks, kvh, hs, bs, dt));
        cache.Fill(-9.0f);
        HostPagedCache expected(Shape(blocks, kvh, hs, bs, dt));
        expected.Fill(-9.0f);
        // Strided input (key and value slices of one fused buffer per token).
        const int64_t stride = 3 * kvh * hs;
        HostTensor qkv = RandomTensor(rng, io, tokens * stride, 4.0f);
        std::vector<int64_t> slots(tokens);
        std::vector<int64_t> free_slots(blocks * bs);
        for (int i = 0; i < blocks * bs; ++i) free_slots[i] = i;
        std::shuffle(free_slots.begin(), free_slots.end(), rng);
        for (int t = 0; t < tokens; ++t) {
          slots[t] = t % 5 == 4 ? -1 : free_slots[t];  // every fifth token is padding
          if (slots[t] < 0) continue;
          for (int h = 0; h < kvh; ++h)
            for (int d = 0; d < hs; ++d) {
              // fp8: the code of x / scale (StoreElem rounds and saturates).
              const float k = qkv.f[t * stride + kvh * hs + h * hs + d];
              const float v = qkv.f[t * stride + 2 * kvh * hs + h * hs + d];
              expected.SetKey(slots[t] / bs, h, d, slots[t] % bs, fp8 ? k / ks : k);
              expected.SetValue(slots[t] / bs, h, d, slots[t] % bs, fp8 ? v / vs : v);
            }
        }
        ReshapeAndCacheParams p;
        p.key = static_cast<const uint8_t*>(qkv.data()) + kvh * hs * DTypeSize(io);
        p.value = static_cast<const uint8_t*>(qkv.data()) + 2 * kvh * hs * DTypeSize(io);
        if (fp8) p.io_dtype = io;
        p.key_token_stride = stride;
        p.value_token_stride = stride;
        p.slot_mapping = slots.data();
        p.num_tokens = tokens;
        p.cache = cache.view();
        p.cache.k_scale = ks;
        p.cache.v_scale = vs;
        ASSERT_TRUE(ReshapeAndCache(p).ok());
        EXPECT_TRUE(cache.key_bytes() == expected.key_bytes());
        EXPECT_TRUE(cache.value_bytes() == expected.value_bytes());
      }
}

// Random bytes in every block (NaN payloads included: the copies are bytes).
void Randomize(HostPagedCache& c, std::mt19937& rng) {
  for (auto* v : {&c.key_bytes(), &c.value_bytes()})
    for (uint8_t& x : *v) x = static_cast<uint8_t>(rng());
}

std::vector<uint8_t> BlockBytes(HostPagedCache& c, bool key, int64_t block) {
  const size_t n = c.shape().block_bytes();
  const auto& v = key ? c.key_bytes() : c.value_bytes();
  return std::vector<uint8_t>(v.begin() + block * n, v.begin() + (block + 1) * n);
}

TEST(CopyBlocksTest, CopiesEveryLayerByteExact) {
  for (DType dt : kDTypes) {
    std::mt19937 rng(static_cast<int>(dt) + 1);
    const KVCacheShape shape = Shape(10, 2, 80, 16, dt);
    std::vector<HostPagedCache> layers(3, HostPagedCache(shape));
    for (auto& l : layers) Randomize(l, rng);
    std::vector<HostPagedCache> before = layers;
    std::vector<KVCacheView> views;
    views.reserve(layers.size());
    for (auto& l : layers) views.push_back(l.view());
    const std::vector<BlockCopy> pairs = {{0, 7}, {3, 9}, {3, 4}};
    ASSERT_TRUE(CopyBlocks(views, pairs).ok());
    for (size_t i = 0; i < layers.size(); ++i)
      for (int64_t b = 0; b < shape.num_blocks; ++b) {
        int64_t from = b;
        for (const BlockCopy& p : pairs)
          if (p.dst == b) from = p.src;
        for (bool key : {true, false})
          EXPECT_TRUE(BlockBytes(layers[i], key, b) == BlockBytes(before[i], key, from))
              << "layer " << i << " block " << b << (key ? " key" : " value");
      }
  }
}

TEST(SwapBlocksTest, SwapOutAndInRoundTripIsByteIdentical) {
  for (DType dt : kDTypes) {
    std::mt19937 rng(static_cast<int>(dt) + 11);
    const int layers = 4;
    std::vector<HostPagedCache> device(layers, HostPagedCache(Shape(12, 3, 64, 8, dt)));
    std::vector<HostPagedCache> host(layers, HostPagedCache(Shape(6, 3, 64, 8, dt)));
    for (auto& l : device) Randomize(l, rng);
    const std::vector<HostPagedCache> original = device;
    std::vector<KVCacheView> dv, hv;
    for (auto& l : device) dv.push_back(l.view());
    for (auto& l : host) hv.push_back(l.view());
    // Swap out blocks 2, 11, 5 to host blocks 0, 5, 3 ...
    const std::vector<BlockCopy> out_pairs = {{2, 0}, {11, 5}, {5, 3}};
    ASSERT_TRUE(SwapBlocks(dv, hv, out_pairs).ok());
    // ... clobber them on the device, then swap them in to blocks 7, 1, 5.
    for (auto& l : device)
      for (int64_t b : {2, 11, 5}) {
        std::memset(l.key_bytes().data() + b * l.shape().block_bytes(), 0xAB,
                    l.shape().block_bytes());
        std::memset(l.value_bytes().data() + b * l.shape().block_bytes(), 0xCD,
                    l.shape().block_bytes());
      }
    const std::vector<BlockCopy> in_pairs = {{0, 7}, {5, 1}, {3, 5}};
    ASSERT_TRUE(SwapBlocks(hv, dv, in_pairs).ok());
    for (int i = 0; i < layers; ++i)
      for (size_t k = 0; k < out_pairs.size(); ++k)
        for (bool key : {true, false})
          EXPECT_TRUE(BlockBytes(device[i], key, in_pairs[k].dst) ==
                      BlockBytes(const_cast<HostPagedCache&>(original[i]), key, out_pairs[k].src))
              << "layer " << i << " pair " << k;
  }
}

// Conversions against exact known encodings and exhaustively against the
// compiler's _Float16 where available.
TEST(HalfTest, KnownValuesAndRounding) {
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7c00);         // rounds to infinity
  EXPECT_EQ(FloatToHalfBits(0x1p-24f), 0x0001);         // smallest subnormal
  EXPECT_EQ(FloatToHalfBits(0x1p-25f), 0x0000);         // tie to even -> 0
  EXPECT_EQ(FloatToHalfBits(1.0f + 0x1p-11f), 0x3c00);  // tie to even
  EXPECT_EQ(FloatToHalfBits(1.0f + 0x1.8p-11f), 0x3c01);
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(FloatToHalfBits(std::nanf("")))));
  EXPECT_EQ(HalfBitsToFloat(0x7c00), INFINITY);
  EXPECT_EQ(HalfBitsToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + 0x1p-8f), 0x3f80);  // tie to even
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + 0x1.8p-8f), 0x3f81);
  EXPECT_EQ(BFloat16BitsToFloat(0xc0a0), -5.0f);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfBitsToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalfBits(f), h) << "round trip of half 0x" << std::hex << h;
#if defined(__FLT16_MAX__)
    ASSERT_EQ(f, static_cast<float>(std::bit_cast<_Float16>(static_cast<uint16_t>(h))));
#endif
  }
#if defined(__FLT16_MAX__)
  std::mt19937 rng(1);
  for (int i = 0; i < 200000; ++i) {
    const float f = BitsToFloat(rng());
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalfBits(f), std::bit_cast<uint16_t>(static_cast<_Float16>(f))) << f;
  }
#endif
}

}  // namespace
}  // namespace pagedserve::kernels::testing
