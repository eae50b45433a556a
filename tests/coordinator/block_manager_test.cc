// Unit tests of BlockPool and BlockManager, plus a seeded randomized sequence
// of allocate / append / fork / free / swap operations checking the invariants.
#include <algorithm>
#include <array>
#include <random>
#include <string>

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

// LRU over many blocks: 32 cached blocks released in a known order (a stride
// permutation), some revived by a hit and released again (they move to the
// most recently used end), one revived and kept. Allocate must then evict in
// exactly the LRU order, each eviction dropping the block from the hash table,
// and never the block still referenced.
TEST(BlockPoolTest, EvictionFollowsTheExactLruOrderOverManyBlocks) {
  constexpr int32_t kBlocks = 32;
  BlockPool pool(kBlocks, 2, /*enable_caching=*/true);
  std::vector<std::vector<int32_t>> tokens(kBlocks);
  auto hash_of = [](int32_t b) { return BlockHash{static_cast<uint64_t>(b) + 1, 77}; };
  for (int32_t i = 0; i < kBlocks; ++i) {
    const int32_t b = pool.Allocate();
    ASSERT_EQ(b, i) << "a fresh pool hands out every block once";
  }
  for (int32_t b = 0; b < kBlocks; ++b) {
    tokens[b] = {2 * b, 2 * b + 1};
    ASSERT_TRUE(pool.Register(b, hash_of(b), -1, 0, tokens[b], {}));
  }
  // Release order: b = 7 * i mod 32, i = 0..31 (a permutation: gcd(7, 32) = 1).
  std::vector<int32_t> lru;  // the model: front = evicted first
  for (int32_t i = 0; i < kBlocks; ++i) {
    const int32_t b = (7 * i) % kBlocks;
    pool.DecRef(b);
    lru.push_back(b);
  }
  const std::vector<int32_t> release_order = lru;
  ASSERT_EQ(pool.num_evictable(), kBlocks);
  ASSERT_EQ(pool.num_free(), 0);
  // Hits: revive and release again, in this order (the first three released
  // blocks, backwards, and two from the middle) -> most recently used end.
  for (int32_t b : {14, 7, 0, 21, 9}) {
    ASSERT_EQ(pool.Lookup(hash_of(b), -1, 0, tokens[b], {}), b);
    pool.IncRef(b);
    pool.DecRef(b);
    lru.erase(std::find(lru.begin(), lru.end(), b));
    lru.push_back(b);
  }
  // A hit that keeps its reference: never evicted.
  const int32_t kept = 28;
  ASSERT_EQ(pool.Lookup(hash_of(kept), -1, 0, tokens[kept], {}), kept);
  pool.IncRef(kept);
  lru.erase(std::find(lru.begin(), lru.end(), kept));
  ASSERT_EQ(pool.num_evictable(), kBlocks - 1);
  // The expected order is neither the release order nor the block-id order,
  // so a FIFO-by-release or lowest-id eviction would fail below.
  ASSERT_NE(lru, std::vector<int32_t>(release_order.begin(), release_order.end() - 1));
  std::vector<int32_t> by_id = lru;
  std::sort(by_id.begin(), by_id.end());
  ASSERT_NE(lru, by_id);

  std::vector<int32_t> evicted;
  for (int32_t i = 0; i < kBlocks - 1; ++i) {
    const int32_t b = pool.Allocate();
    evicted.push_back(b);
    EXPECT_EQ(pool.num_evictions(), i + 1);
    if (b >= 0) {
      EXPECT_EQ(pool.Lookup(hash_of(b), -1, 0, tokens[b], {}), -1)
          << "evicted block " << b << " still in the hash table";
    }
  }
  EXPECT_EQ(evicted, lru);
  EXPECT_EQ(pool.Allocate(), -1) << "the referenced block must not be evicted";
  EXPECT_EQ(pool.Lookup(hash_of(kept), -1, 0, tokens[kept], {}), kept);
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

// The block manager's view of the same rule: six one-block prompts, freed in
// the order 3, 0, 5, 1, 4, 2, then prompt 5 hit again (revived and freed).
// A new 8-token sequence needs two blocks from a pool with none free: it
// must take exactly the blocks of prompts 3 and 0 (least recently freed),
// whose prefixes then miss, while the others still hit.
TEST(BlockManagerTest, NewAllocationsEvictTheLeastRecentlyFreedPrefixes) {
  BlockManager bm(Opts(6, 0, 4, /*caching=*/true));
  std::vector<BlockPair> copies;
  std::vector<Sequence> seqs;
  seqs.reserve(6);
  for (SeqId i = 0; i < 6; ++i) {
    seqs.push_back(MakeSeq(i, Iota(4, 100 * (i + 1))));
    Feed(bm, seqs.back(), 4, &copies);
    ASSERT_EQ(seqs.back().block_table.size(), 1u);
  }
  std::vector<int32_t> block_of;
  block_of.reserve(seqs.size());
  for (const Sequence& s : seqs) block_of.push_back(s.block_table[0]);
  for (int i : {3, 0, 5, 1, 4, 2}) bm.Free(seqs[i]);
  ASSERT_EQ(bm.device().num_evictable(), 6);
  {
    Sequence again = MakeSeq(10, Iota(5, 500));  // prompt 5 plus one token
    ASSERT_EQ(bm.MatchPrefix(again), 4);
    bm.Free(again);
  }
  Sequence fresh = MakeSeq(20, Iota(8, 9000));
  Feed(bm, fresh, 8, &copies);
  EXPECT_EQ(fresh.block_table, (std::vector<int32_t>{block_of[3], block_of[0]}));
  EXPECT_EQ(bm.device().num_evictions(), 2);
  for (int i = 0; i < 6; ++i) {
    Sequence probe = MakeSeq(30 + i, Iota(5, 100 * (i + 1)));
    EXPECT_EQ(bm.MatchPrefix(probe), (i == 3 || i == 0) ? 0 : 4) << "prompt " << i;
    bm.Free(probe);
  }
  EXPECT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
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

std::string Hex(const std::array<uint8_t, 32>& d) {
  static const char* kDigits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : d) {
    s.push_back(kDigits[b >> 4]);
    s.push_back(kDigits[b & 15]);
  }
  return s;
}

std::array<uint8_t, 32> DigestOf(const std::string& s) {
  return Sha256Digest(
      absl::Span<const uint8_t>(reinterpret_cast<const uint8_t*>(s.data()), s.size()));
}

// The primitive against the FIPS 180-4 example vectors (NIST CSRC "Examples
// with intermediate values", SHA-256): one block, empty, two blocks, and the
// million-'a' message.
TEST(BlockHashTest, Sha256MatchesTheFips180KnownAnswers) {
  EXPECT_EQ(Hex(DigestOf("abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Hex(DigestOf("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Hex(DigestOf("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Hex(DigestOf(std::string(1000000, 'a'))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  // Negative control: one bit off in the message is another digest.
  EXPECT_NE(Hex(DigestOf("abb")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// A chained block hash computed by hand from the documented serialization
// (block_hash.h: parent.hi | parent.lo | num_tokens | tokens | num_extra_keys |
// extra keys, little-endian, u64 / u32 / u64 / u64) and an independent SHA-256
// (Python's hashlib.sha256 of the same bytes; first 16 digest bytes, big-endian
// into hi and lo).
TEST(BlockHashTest, ChainedBlockHashMatchesAHandComputedVector) {
  // Block 1: root parent, tokens {1, 2, 3}, no extra keys. 44 bytes:
  const std::vector<uint8_t> first = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                      0, 0, 0, 0,                          // parent hi, lo
                                      3, 0, 0, 0, 0, 0, 0, 0,              // 3 tokens
                                      1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0,  // 1, 2, 3
                                      0, 0, 0, 0, 0, 0, 0, 0};             // 0 extra keys
  // hashlib.sha256(first).hexdigest() =
  // 7644b37e14fd6c9b2b21c943b086698727504c6825a7fc4401563f3ba7b9538c
  EXPECT_EQ(Hex(Sha256Digest(first)),
            "7644b37e14fd6c9b2b21c943b086698727504c6825a7fc4401563f3ba7b9538c");
  const std::vector<int32_t> t1 = {1, 2, 3};
  const BlockHash h1 = Sha256BlockHash(kRootBlockHash, t1, {});
  EXPECT_EQ(h1, (BlockHash{0x7644b37e14fd6c9bull, 0x2b21c943b0866987ull}));
  // Block 2: parent h1, tokens {4, 5, 6, -1}, extra key -2 (two's complement,
  // fixed width). hashlib over the 60 bytes
  // 9b6cfd147eb34476 876986b043c9212b 0400000000000000 04000000 05000000 06000000
  // ffffffff 0100000000000000 feffffffffffffff
  // = badd215e3b19becff4b6644e79efa5c9fd3098fbcc8769f88a6cbf58106d6d79
  const std::vector<int32_t> t2 = {4, 5, 6, -1};
  const std::vector<int64_t> k2 = {-2};
  EXPECT_EQ(Sha256BlockHash(h1, t2, k2), (BlockHash{0xbadd215e3b19becfull, 0xf4b6644e79efa5c9ull}));
  // Negative control: the same fields big-endian are not what the vector pins.
  std::vector<uint8_t> big_endian = first;
  std::reverse(big_endian.begin() + 16, big_endian.begin() + 24);
  EXPECT_NE(Hex(Sha256Digest(big_endian)),
            "7644b37e14fd6c9b2b21c943b086698727504c6825a7fc4401563f3ba7b9538c");
}

int32_t LiveBlocks(const Sequence& s) {
  return static_cast<int32_t>(
      std::count_if(s.block_table.begin(), s.block_table.end(), [](int32_t b) { return b >= 0; }));
}

// Sliding window (vLLM's sliding-window KV manager): after each step the
// blocks wholly before the next query's window go back to the pool, so a
// sequence fed one token at a time holds ceil(window / block_size) + 1 blocks
// at most, however long it grows; the dropped entries stay in the table as
// kDroppedBlock, and fork, swap and free skip them.
TEST(BlockManagerTest, SlidingWindowFreesTheBlocksBeforeTheWindow) {
  constexpr int32_t kWindow = 10, kBs = 4;
  BlockManager::Options o = Opts(32, 32, kBs, /*caching=*/true);
  o.sliding_window = kWindow;
  BlockManager bm(o);
  Sequence s = MakeSeq(1, Iota(3));
  std::vector<BlockPair> copies;
  Feed(bm, s, 3, &copies);
  int32_t peak = 0;
  for (int32_t t = 3; t < 200; ++t) {
    s.tokens.push_back(t);
    Feed(bm, s, 1, &copies);
    // The next query (position t + 1) reads keys (t + 1 - kWindow, t + 1].
    const int32_t first_needed_block = std::max(0, t + 1 - kWindow + 1) / kBs;
    ASSERT_EQ(s.num_dropped_blocks, first_needed_block) << "t " << t;
    for (int32_t i = 0; i < s.num_dropped_blocks; ++i) ASSERT_EQ(s.block_table[i], kDroppedBlock);
    for (size_t i = s.num_dropped_blocks; i < s.block_table.size(); ++i)
      ASSERT_GE(s.block_table[i], 0);
    peak = std::max(peak, LiveBlocks(s));
    ASSERT_EQ(bm.device().num_in_use(), LiveBlocks(s));
    ASSERT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
  }
  EXPECT_EQ(s.block_table.size(), 50u);  // 200 tokens: the table keeps its length
  EXPECT_LE(peak, (kWindow + kBs - 1) / kBs + 1);
  // Dropped full blocks stay cached until a new block evicts them.
  EXPECT_EQ(bm.device().num_evictable(), 32 - LiveBlocks(s));
  // Fork and swap with dropped entries.
  Sequence child = MakeSeq(2, s.tokens);
  child.num_computed_tokens = s.num_computed_tokens;
  bm.Fork(s, child);
  EXPECT_EQ(child.num_dropped_blocks, s.num_dropped_blocks);
  std::vector<Sequence*> group{&s, &child};
  EXPECT_EQ(bm.NumDistinctBlocks(group), LiveBlocks(s));
  std::vector<BlockPair> out, in;
  ASSERT_TRUE(bm.SwapOut(group, &out));
  EXPECT_EQ(static_cast<int32_t>(out.size()), LiveBlocks(s));
  EXPECT_EQ(bm.device().num_in_use(), 0);
  ASSERT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
  ASSERT_TRUE(bm.SwapIn(group, 0, &in));
  EXPECT_EQ(in.size(), out.size());
  EXPECT_EQ(s.block_table, child.block_table);
  EXPECT_EQ(s.block_table[0], kDroppedBlock);
  ASSERT_TRUE(bm.CheckInvariants().ok()) << bm.CheckInvariants();
  bm.Free(s);
  bm.Free(child);
  EXPECT_EQ(bm.device().num_in_use(), 0);
  EXPECT_EQ(bm.cpu().num_in_use(), 0);
  EXPECT_TRUE(bm.CheckInvariants().ok());
  // Without the window nothing is dropped (the control).
  BlockManager full(Opts(64, 0, kBs));
  Sequence f = MakeSeq(3, Iota(200));
  Feed(full, f, 200, &copies);
  EXPECT_EQ(LiveBlocks(f), 50);
}

// A chunk fed at once: the window is measured from the chunk's end, and the
// chunk's own blocks are all held while it runs (MaxBlocksPerSequence).
TEST(BlockManagerTest, SlidingWindowAfterAChunkKeepsTheLastWindow) {
  BlockManager::Options o = Opts(64, 0, 4);
  o.sliding_window = 6;
  BlockManager bm(o);
  Sequence s = MakeSeq(1, Iota(40));
  std::vector<BlockPair> copies;
  ASSERT_TRUE(bm.AppendSlots(s, 40, &copies));
  EXPECT_EQ(bm.device().num_in_use(), 10);
  s.num_computed_tokens = 40;
  bm.MarkComputed(s);
  // Next query at 40 reads (34, 40]: positions 35.. live in blocks 8 and 9.
  EXPECT_EQ(s.num_dropped_blocks, 8);
  EXPECT_EQ(bm.device().num_in_use(), 2);
  bm.Free(s);
  EXPECT_EQ(bm.device().num_in_use(), 0);
}

// Thousands of random operations; invariants after each; all blocks return.
class RandomOpsTest
    : public ::testing::TestWithParam<std::tuple<uint64_t, bool, int32_t /*sliding window*/>> {};

TEST_P(RandomOpsTest, InvariantsHoldAndEveryBlockReturns) {
  const auto [seed, caching, window] = GetParam();
  std::mt19937_64 rng(seed);
  BlockManager::Options options = Opts(64, 32, 4, caching);
  options.sliding_window = window;
  BlockManager bm(options);
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
                         ::testing::Combine(::testing::Values(1u, 2u, 3u), ::testing::Bool(),
                                            ::testing::Values(0, 3, 9)));

}  // namespace
}  // namespace pagedserve
