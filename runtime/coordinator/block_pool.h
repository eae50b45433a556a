// A pool of fixed-size physical KV blocks: free list, reference counts and,
// optionally, a prefix cache (prefix_cache.h) whose unreferenced blocks it
// evicts in LRU order.
//
// Every block is in exactly one state:
//   free       ref 0, holds nothing reusable (on the free list);
//   evictable  ref 0, holds a cached full block (in the LRU list and the
//              hash table; a later request may revive it);
//   in use     ref >= 1 (referenced by that many block-table entries).
// so num_free() + num_evictable() + num_in_use() == num_blocks() always.
//
// Allocate() and Free are O(1): a plain stack of free block ids (as in
// nano-vllm) plus an intrusive doubly linked LRU list for evictable blocks.
// Allocate takes a free block first and only then evicts the least recently
// released cached block. Block ids are 0..num_blocks-1.
//
// Prefix caching (the device pool only): a block is registered under a hash only
// after its K/V were computed (the caller's duty). A registered block records its
// token ids, extra keys and its parent (block id + generation), and Lookup
// accepts a candidate only when all of them equal the request's (PrefixCache).
// The generation of a block increases whenever it is handed out for new
// content, so a cached child whose parent block was evicted and reused is never
// matched again.
#ifndef PAGEDSERVE_RUNTIME_COORDINATOR_BLOCK_POOL_H_
#define PAGEDSERVE_RUNTIME_COORDINATOR_BLOCK_POOL_H_

#include <cstdint>
#include <vector>

#include <memory>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "runtime/coordinator/block_hash.h"
#include "runtime/coordinator/prefix_cache.h"

namespace pagedserve {

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, int32_t block_size, bool enable_caching);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_evictable() const { return num_evictable_; }
  int32_t num_in_use() const { return num_blocks_ - num_free() - num_evictable_; }
  // Blocks that Allocate() can hand out: free + evictable.
  int32_t num_available() const { return num_free() + num_evictable_; }

  // Returns a block with ref count 1, or -1 when none is available. Evicts the
  // least recently released cached block when the free list is empty.
  int32_t Allocate();
  // Adds a reference. A block at ref 0 must be evictable (a cache hit): it
  // leaves the LRU list.
  void IncRef(int32_t block);
  // Drops a reference; at 0 a cached block becomes evictable (most recently
  // used end of the LRU list), any other block returns to the free list.
  void DecRef(int32_t block);
  int32_t ref_count(int32_t block) const { return ref_[block]; }
  uint32_t generation(int32_t block) const { return gen_[block]; }

  // ---- prefix cache (no-ops / misses when caching is disabled) ----
  bool caching() const { return cache_ != nullptr; }
  bool is_cached(int32_t block) const { return cache_ != nullptr && cache_->contains(block); }
  // Returns the cached block registered under `hash` whose parent is
  // (parent_block, parent_gen) (-1 for the first block) and whose token ids and
  // extra keys equal the given ones; -1 when there is none or it does not
  // verify. Does not take a reference. `*collision` is set when a block was
  // found under the hash but failed verification.
  int32_t Lookup(const BlockHash& hash, int32_t parent_block, uint32_t parent_gen,
                 absl::Span<const int32_t> token_ids, absl::Span<const int64_t> extra_keys,
                 bool* collision = nullptr) const;
  // Registers in-use `block` (full, K/V computed) under `hash`. Returns false
  // and changes nothing when the hash is already registered or the block is
  // already cached.
  bool Register(int32_t block, const BlockHash& hash, int32_t parent_block, uint32_t parent_gen,
                absl::Span<const int32_t> token_ids, absl::Span<const int64_t> extra_keys);
  int64_t num_evictions() const { return num_evictions_; }

  // Checks the free-list / LRU / hash-table bookkeeping and the state counts.
  absl::Status CheckInvariants() const;

 private:
  void LruRemove(int32_t b);
  void LruPushBack(int32_t b);

  const int32_t num_blocks_;
  const int32_t block_size_;
  std::vector<int32_t> ref_;
  std::vector<uint32_t> gen_;
  std::vector<int32_t> free_;              // stack
  std::unique_ptr<PrefixCache> cache_;     // null when caching is off
  std::vector<int32_t> prev_, next_;       // LRU links of evictable blocks, -1 terminated
  int32_t lru_head_ = -1, lru_tail_ = -1;  // head = evicted first
  int32_t num_evictable_ = 0;
  int64_t num_evictions_ = 0;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COORDINATOR_BLOCK_POOL_H_
