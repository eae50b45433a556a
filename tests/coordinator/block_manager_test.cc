// Unit tests of BlockPool and BlockManager, plus a seeded randomized sequence
// of allocate / append / fork / free / swap operations checking the invariants.
#include <random>

#include "gtest/gtest.h"
#include "runtime/common/cache_salt.h"
#include "runtime/coordinator/block_manager.h"
#include "runtime/coordinator/block_pool.h"

namespace pagedserve {
namespace {

std::vector<int32_t> Iota(int32_t n, int32_t start = 0) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

TEST(BlockPoolTest, AllocateFreeAndCounts) {
  BlockPool pool(4, 16, /*enable_caching=*/false);
  EXPECT_EQ(pool.num_free(), 4);
  std::vector<int32_t> got;
  got.reserve(4);
  for (int i = 0; i < 4; ++i) got.push_back(pool.Allocate());
  EXPECT_EQ(pool.Allocate(), -1);
  EXPECT_EQ(pool.num_in_use(), 4);
  std::sort(got.begin(), got.end());
  EXPECT_EQ(got, Iota(4));
  pool.IncRef(2);
  pool.DecRef(2);
  EXPECT_EQ(pool.num_in_use(), 4);
  pool.DecRef(2);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.Allocate(), 2);  // LIFO free list
  EXPECT_TRUE(pool.CheckInvariants().ok());
}

TEST(BlockPoolTest, CachedBlocksAreEvictedLeastRecentlyReleasedFirst) {
  BlockPool pool(3, 2, /*enable_caching=*/true);
  int32_t a = pool.Allocate(), b = pool.Allocate(), c = pool.Allocate();
  std::vector<int32_t> ta{1, 2}, tb{3, 4}, tc{5, 6};
  ASSERT_TRUE(pool.Register(a, {1, 1}, -1, 0, ta, {}));
  ASSERT_TRUE(pool.Register(b, {2, 2}, -1, 0, tb, {}));
  ASSERT_TRUE(pool.Register(c, {3, 3}, -1, 0, tc, {}));
  pool.DecRef(b);  // released first
  pool.DecRef(a);
  pool.DecRef(c);
  EXPECT_EQ(pool.num_evictable(), 3);
  EXPECT_EQ(pool.num_free(), 0);
  // A hit revives `b`; it leaves the LRU list.
  ASSERT_EQ(pool.Lookup({2, 2}, -1, 0, tb, {}), b);
  pool.IncRef(b);
  EXPECT_EQ(pool.num_evictable(), 2);
  // Eviction order: a (released before c), then c.
  EXPECT_EQ(pool.Allocate(), a);
  EXPECT_EQ(pool.Lookup({1, 1}, -1, 0, ta, {}), -1);  // evicted: gone from the table
  EXPECT_EQ(pool.Allocate(), c);
  EXPECT_EQ(pool.Allocate(), -1);
  EXPECT_EQ(pool.num_evictions(), 2);
  EXPECT_TRUE(pool.CheckInvariants().ok()) << pool.CheckInvariants();
}

TEST(BlockPoolTest, LookupVerifiesTokensParentAndExtraKeys) {
  BlockPool pool(4, 2, true);
  int32_t p = pool.Allocate(), c = pool.Allocate();
  std::vector<int32_t> t1{1, 2}, t2{3, 4};
  std::vector<int64_t> salt{42};
  ASSERT_TRUE(pool.Register(p, {7, 7}, -1, 0, t1, {}));
  ASSERT_TRUE(pool.Register(c, {8, 8}, p, pool.generation(p), t2, salt));
  EXPECT_FALSE(pool.Register(c, {9, 9}, -1, 0, t2, {}));  // already cached
  bool collision = false;
  EXPECT_EQ(pool.Lookup({8, 8}, p, pool.generation(p), t2, salt, &collision), c);
  EXPECT_FALSE(collision);
  EXPECT_EQ(pool.Lookup({8, 8}, p, pool.generation(p), t1, salt, &collision), -1);  // other tokens
  EXPECT_TRUE(collision);
  EXPECT_EQ(pool.Lookup({8, 8}, p, pool.generation(p), t2, {}), -1);        // other extra keys
  EXPECT_EQ(pool.Lookup({8, 8}, -1, 0, t2, salt), -1);                      // other parent
  EXPECT_EQ(pool.Lookup({8, 8}, p, pool.generation(p) + 1, t2, salt), -1);  // parent reused
}

BlockManager::Options Opts(int32_t dev, int32_t cpu, int32_t bs = 4, bool caching = false) {
  BlockManager::Options o;
  o.block_size = bs;
  o.num_device_blocks = dev;
  o.num_cpu_blocks = cpu;
  o.enable_prefix_caching = caching;
  o.watermark = 0.0;
  return o;
}

Sequence MakeSeq(SeqId id, std::vector<int32_t> tokens) {
  Sequence s;
  s.id = id;
  s.num_prompt_tokens = static_cast<int32_t>(tokens.size());
  s.tokens = std::move(tokens);
  return s;
}

// Appends n tokens and marks them computed, as a step would.
void Feed(BlockManager& bm, Sequence& s, int32_t n, std::vector<BlockPair>* copies) {
  ASSERT_TRUE(bm.AppendSlots(s, n, copies));
  s.num_computed_tokens += n;
  bm.MarkComputed(s);
}

TEST(BlockManagerTest, AppendAllocatesBlocksOnBoundaries) {
  BlockManager bm(Opts(8, 0));
  Sequence s = MakeSeq(1, Iota(9));
  std::vector<BlockPair> copies;
  Feed(bm, s, 9, &copies);
  EXPECT_EQ(s.block_table.size(), 3u);
  EXPECT_EQ(bm.device().num_in_use(), 3);
  s.tokens.push_back(100);
  Feed(bm, s, 1, &copies);  // position 9 still in block 2
  EXPECT_EQ(s.block_table.size(), 3u);
  s.tokens.insert(s.tokens.end(), {101, 102, 103});
  Feed(bm, s, 3, &copies);  // positions 10, 11, 12 -> a 4th block
  EXPECT_EQ(s.block_table.size(), 4u);
  EXPECT_TRUE(copies.empty());
  bm.Free(s);
  EXPECT_EQ(bm.device().num_free(), 8);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

TEST(BlockManagerTest, ForkSharesBlocksAndCopyOnWriteSplitsTheLastOne) {
  BlockManager bm(Opts(8, 0));
  Sequence parent = MakeSeq(1, Iota(6));  // blocks: [0..3] full, [4,5] partial
  std::vector<BlockPair> copies;
  Feed(bm, parent, 6, &copies);
  Sequence child = MakeSeq(2, Iota(6));
  child.num_computed_tokens = 6;
  bm.Fork(parent, child);
  EXPECT_EQ(bm.device().num_in_use(), 2);
  EXPECT_EQ(bm.device().ref_count(parent.block_table[1]), 2);
  std::vector<Sequence*> both{&parent, &child};
  std::vector<int32_t> ones{1, 1};
  EXPECT_EQ(bm.NumBlocksToAppend(both, ones), 1);  // one copy; the last sharer writes in place
  parent.tokens.push_back(50);
  Feed(bm, parent, 1, &copies);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, child.block_table[1]);
  EXPECT_EQ(copies[0].dst, parent.block_table[1]);
  EXPECT_EQ(parent.block_table[0], child.block_table[0]);  // full block still shared
  child.tokens.push_back(60);
  Feed(bm, child, 1, &copies);
  EXPECT_EQ(copies.size(), 1u);  // child is now the only owner: writes in place
  EXPECT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
  bm.Free(parent);
  bm.Free(child);
  EXPECT_EQ(bm.device().num_free(), 8);
}

TEST(BlockManagerTest, SwapOutAndInPreserveSharing) {
  BlockManager bm(Opts(6, 6));
  Sequence a = MakeSeq(1, Iota(6));
  std::vector<BlockPair> copies;
  Feed(bm, a, 6, &copies);
  Sequence b = MakeSeq(2, Iota(6));
  b.num_computed_tokens = 6;
  bm.Fork(a, b);
  std::vector<Sequence*> group{&a, &b};
  EXPECT_EQ(bm.NumDistinctBlocks(group), 2);
  std::vector<BlockPair> out, in;
  ASSERT_TRUE(bm.SwapOut(group, &out));
  EXPECT_EQ(out.size(), 2u);
  EXPECT_EQ(bm.device().num_in_use(), 0);
  EXPECT_EQ(bm.cpu().num_in_use(), 2);
  EXPECT_EQ(a.block_table, b.block_table);
  EXPECT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
  ASSERT_TRUE(bm.SwapIn(group, 0, &in));
  EXPECT_EQ(in.size(), 2u);
  EXPECT_EQ(a.block_table, b.block_table);
  EXPECT_EQ(bm.cpu().num_in_use(), 0);
  EXPECT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
}

TEST(BlockManagerTest, SwapOutRefusedWhenCpuPoolIsFull) {
  BlockManager bm(Opts(6, 1));
  Sequence a = MakeSeq(1, Iota(6));
  std::vector<BlockPair> copies, out;
  Feed(bm, a, 6, &copies);
  std::vector<Sequence*> group{&a};
  EXPECT_FALSE(bm.SwapOut(group, &out));
  EXPECT_TRUE(out.empty());
  EXPECT_EQ(bm.device().num_in_use(), 2);
}

TEST(BlockManagerTest, PrefixMatchStopsBeforeTheLastToken) {
  BlockManager bm(Opts(16, 0, 4, /*caching=*/true));
  Sequence a = MakeSeq(1, Iota(8));
  std::vector<BlockPair> copies;
  Feed(bm, a, 8, &copies);  // two full blocks registered
  Sequence b = MakeSeq(2, Iota(8));
  EXPECT_EQ(bm.MatchPrefix(b), 4);  // (8 - 1) / 4 = 1 block: the last token is recomputed
  Sequence c = MakeSeq(3, Iota(11));
  EXPECT_EQ(bm.MatchPrefix(c), 8);
  EXPECT_EQ(c.block_table, a.block_table);
  Sequence d = MakeSeq(4, Iota(11, 1));  // other tokens
  EXPECT_EQ(bm.MatchPrefix(d), 0);
  bm.Free(a);
  bm.Free(b);
  bm.Free(c);
  EXPECT_EQ(bm.device().num_evictable(), 2);
  EXPECT_TRUE(bm.CheckInvariants().ok());
}

TEST(BlockManagerTest, NotComputedBlocksAreNeverCached) {
  BlockManager bm(Opts(16, 0, 4, true));
  Sequence a = MakeSeq(1, Iota(12));
  std::vector<BlockPair> copies;
  ASSERT_TRUE(bm.AppendSlots(a, 12, &copies));  // scheduled, never computed (aborted)
  bm.MarkComputed(a);
  bm.Free(a);
  EXPECT_EQ(bm.device().num_evictable(), 0);
  Sequence b = MakeSeq(2, Iota(12));
  EXPECT_EQ(bm.MatchPrefix(b), 0);
}

TEST(BlockManagerTest, ConstantHashCollisionIsCaughtByVerification) {
  BlockManager::Options o = Opts(16, 0, 4, true);
  o.hash_fn = [](const BlockHash&, absl::Span<const int32_t>, absl::Span<const int64_t>) {
    return BlockHash{1, 1};
  };
  BlockManager bm(o);
  Sequence a = MakeSeq(1, Iota(8));
  std::vector<BlockPair> copies;
  Feed(bm, a, 8, &copies);
  Sequence b = MakeSeq(2, Iota(8, 100));  // different tokens, same (weak) hash
  EXPECT_EQ(bm.MatchPrefix(b), 0);
  EXPECT_GE(bm.prefix_cache_collisions(), 1);
  Sequence c = MakeSeq(3, Iota(8));  // the real owner still hits
  EXPECT_EQ(bm.MatchPrefix(c), 4);
}

TEST(BlockManagerTest, ExtraKeysSeparateOtherwiseEqualPrefixes) {
  BlockManager bm(Opts(16, 0, 4, true));
  Sequence a = MakeSeq(1, Iota(9));
  a.extra_keys = {7};
  std::vector<BlockPair> copies;
  Feed(bm, a, 9, &copies);
  Sequence b = MakeSeq(2, Iota(9));
  EXPECT_EQ(bm.MatchPrefix(b), 0);
  Sequence c = MakeSeq(3, Iota(9));
  c.extra_keys = {7};
  EXPECT_EQ(bm.MatchPrefix(c), 8);
}

// cache_salt isolation at the block manager: the salt's keys enter the first
// block's hash; different salts share nothing, one salt shares as before, and
// unsalted requests do not hit a salted tenant's blocks (nor the reverse).
TEST(BlockManagerTest, CacheSaltsIsolatePrefixes) {
  BlockManager bm(Opts(32, 0, 4, true));
  std::vector<BlockPair> copies;
  Sequence a = MakeSeq(1, Iota(13));
  a.extra_keys = CacheSaltKeys("tenant-a");
  Feed(bm, a, 13, &copies);
  Sequence b = MakeSeq(2, Iota(13));
  b.extra_keys = CacheSaltKeys("tenant-b");
  EXPECT_EQ(bm.MatchPrefix(b), 0) << "another salt must not hit";
  Sequence plain = MakeSeq(3, Iota(13));
  EXPECT_EQ(bm.MatchPrefix(plain), 0) << "no salt must not hit a salted prefix";
  Sequence a2 = MakeSeq(4, Iota(13));
  a2.extra_keys = CacheSaltKeys("tenant-a");
  EXPECT_EQ(bm.MatchPrefix(a2), 12) << "the same salt shares its full blocks";
  EXPECT_EQ(bm.prefix_cache_collisions(), 0) << "separated by the hash, not by verification";

  const std::vector<int32_t> t = Iota(4);
  EXPECT_FALSE(Sha256BlockHash(kRootBlockHash, t, CacheSaltKeys("tenant-a")) ==
               Sha256BlockHash(kRootBlockHash, t, CacheSaltKeys("tenant-b")));
  EXPECT_TRUE(Sha256BlockHash(kRootBlockHash, t, CacheSaltKeys("tenant-a")) ==
              Sha256BlockHash(kRootBlockHash, t, CacheSaltKeys("tenant-a")));
}

// The salt -> keys encoding is injective (length word + zero-padded bytes).
TEST(CacheSaltTest, KeysAreInjectiveAndEmptyMeansNone) {
  EXPECT_TRUE(CacheSaltKeys("").empty());
  const std::vector<std::string> salts = {"a",
                                          "b",
                                          "ab",
                                          "ba",
                                          "abcdefgh",
                                          "abcdefghi",
                                          std::string("abcdefgh\0", 9),
                                          std::string(256, 'x')};
  for (size_t i = 0; i < salts.size(); ++i) {
    EXPECT_EQ(CacheSaltKeys(salts[i]), CacheSaltKeys(salts[i]));
    for (size_t j = i + 1; j < salts.size(); ++j) {
      EXPECT_NE(CacheSaltKeys(salts[i]), CacheSaltKeys(salts[j])) << i << " vs " << j;
    }
  }
  EXPECT_EQ(CacheSaltKeys(std::string(256, 'x')).size(), 2u + 32u);
  EXPECT_EQ(CacheSaltKeys("a")[0], kCacheSaltTag);
  EXPECT_TRUE(ValidateCacheSalt("tenant-a").ok());
  EXPECT_FALSE(ValidateCacheSalt("").ok());
  EXPECT_FALSE(ValidateCacheSalt(std::string(257, 'x')).ok());
  EXPECT_FALSE(ValidateCacheSalt("tab\there").ok());
  EXPECT_FALSE(ValidateCacheSalt("\x7f").ok());
}

TEST(BlockHashTest, Sha256ChainIsDeterministicAndSensitive) {
  std::vector<int32_t> t{1, 2, 3};
  BlockHash h1 = Sha256BlockHash(kRootBlockHash, t, {});
  EXPECT_EQ(h1, Sha256BlockHash(kRootBlockHash, t, {}));
  EXPECT_FALSE(h1 == Sha256BlockHash(h1, t, {}));
  std::vector<int32_t> t2{1, 2, 4};
  EXPECT_FALSE(h1 == Sha256BlockHash(kRootBlockHash, t2, {}));
  std::vector<int64_t> k{0};
  EXPECT_FALSE(h1 == Sha256BlockHash(kRootBlockHash, t, k));
}

// Thousands of random operations; invariants after each; all blocks return.
class RandomOpsTest : public ::testing::TestWithParam<std::tuple<uint64_t, bool>> {};

TEST_P(RandomOpsTest, InvariantsHoldAndEveryBlockReturns) {
  const auto [seed, caching] = GetParam();
  std::mt19937_64 rng(seed);
  BlockManager bm(Opts(64, 32, 4, caching));
  std::vector<std::unique_ptr<Sequence>> live;
  SeqId next_id = 0;
  std::vector<BlockPair> ops;
  auto rand = [&](int n) { return static_cast<int>(rng() % n); };
  for (int step = 0; step < 4000; ++step) {
    const int op = rand(7);
    if (op == 0 || live.empty()) {  // new sequence, maybe sharing a prefix with a previous one
      auto s = std::make_unique<Sequence>();
      s->id = next_id++;
      const int32_t n = 1 + rand(20);
      for (int i = 0; i < n; ++i)
        s->tokens.push_back(rand(3));  // small vocab: many shared prefixes
      s->num_prompt_tokens = n;
      bm.MatchPrefix(*s);
      ops.clear();
      if (bm.AppendSlots(*s, s->num_uncomputed(), &ops)) {
        s->num_computed_tokens = s->len();
        bm.MarkComputed(*s);
        live.push_back(std::move(s));
      } else {
        bm.Free(*s);
      }
    } else {
      Sequence& s = *live[rand(static_cast<int>(live.size()))];
      if (op <= 2 && !s.blocks_on_cpu) {  // append 1..5 tokens
        const int32_t n = 1 + rand(5);
        for (int i = 0; i < n; ++i) s.tokens.push_back(rand(3));
        ops.clear();
        if (bm.AppendSlots(s, n, &ops)) {
          s.num_computed_tokens += n;
          bm.MarkComputed(s);
        } else {
          s.tokens.resize(s.tokens.size() - n);
        }
      } else if (op == 3) {  // fork
        auto c = std::make_unique<Sequence>();
        c->id = next_id++;
        c->tokens = s.tokens;
        c->num_prompt_tokens = s.num_prompt_tokens;
        c->num_computed_tokens = s.num_computed_tokens;
        bm.Fork(s, *c);
        live.push_back(std::move(c));
      } else if (op == 4) {  // free (finish / abort / recompute)
        auto it = std::find_if(live.begin(), live.end(), [&](auto& p) { return p.get() == &s; });
        bm.Free(s);
        live.erase(it);
      } else if (op == 5) {  // swap out or in
        std::vector<Sequence*> g{&s};
        ops.clear();
        if (s.blocks_on_cpu) {
          bm.SwapIn(g, 0, &ops);
        } else {
          bm.SwapOut(g, &ops);
        }
      }
    }
    ASSERT_TRUE(bm.CheckInvariants().ok()) << "step " << step << ": " << bm.CheckInvariants();
    ASSERT_EQ(bm.device().num_free() + bm.device().num_evictable() + bm.device().num_in_use(), 64);
    ASSERT_EQ(bm.cpu().num_free() + bm.cpu().num_in_use(), 32);
  }
  for (auto& s : live) bm.Free(*s);
  EXPECT_TRUE(bm.CheckInvariants().ok());
  EXPECT_EQ(bm.device().num_in_use(), 0);
  EXPECT_EQ(bm.device().num_free() + bm.device().num_evictable(), 64);
  EXPECT_EQ(bm.cpu().num_free(), 32);
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomOpsTest,
                         ::testing::Combine(::testing::Values(1u, 2u, 3u), ::testing::Bool()));

}  // namespace
}  // namespace pagedserve
