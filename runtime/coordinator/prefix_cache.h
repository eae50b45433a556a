// The prefix-cache table of the device block pool: which physical blocks hold
// a cached full block, under which hash, and the identity each was registered
// with (parent block + generation, token ids, extra keys), so that a lookup
// is verified and a hash collision can cost a miss but never serve another
// prefix's K/V. This is the hash -> block table of vLLM's automatic prefix
// caching; the chained hashes come from block_hash.h.
//
// It knows nothing of reference counts or eviction order: BlockPool owns
// those and tells the cache when a cached block is reused for new content
// (Erase). Not thread-safe: the block manager owns it.
#ifndef PAGEDSERVE_RUNTIME_COORDINATOR_PREFIX_CACHE_H_
#define PAGEDSERVE_RUNTIME_COORDINATOR_PREFIX_CACHE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "runtime/coordinator/block_hash.h"

namespace pagedserve {

class PrefixCache {
 public:
  // Block ids are 0..num_blocks-1; every cached block holds block_size tokens.
  // Memory: block_size token ids plus 80 to 110 bytes per block (the hash
  // table is sized for num_blocks entries at construction).
  PrefixCache(int32_t num_blocks, int32_t block_size);

  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  bool contains(int32_t block) const { return cached_[block] != 0; }
  int32_t size() const { return static_cast<int32_t>(table_.size()); }

  // The block registered under `hash` whose parent is (parent_block,
  // parent_gen) (-1 for the first block of a sequence; the generation is then
  // ignored) and whose token ids and extra keys equal the given ones; -1 when
  // there is none. `*collision` is set when a block was found under the hash
  // but failed that verification.
  int32_t Lookup(const BlockHash& hash, int32_t parent_block, uint32_t parent_gen,
                 absl::Span<const int32_t> token_ids, absl::Span<const int64_t> extra_keys,
                 bool* collision) const;
  // Records `block` under `hash` with its identity. Returns false and changes
  // nothing when the hash is taken, the block is already cached or token_ids
  // is not one full block.
  bool Insert(int32_t block, const BlockHash& hash, int32_t parent_block, uint32_t parent_gen,
              absl::Span<const int32_t> token_ids, absl::Span<const int64_t> extra_keys);
  // Forgets `block` (it is about to hold new content). No-op when not cached.
  void Erase(int32_t block);

  // Every table entry names a cached block registered under that hash, and
  // every cached block has its entry.
  absl::Status CheckInvariants() const;

 private:
  const int32_t block_size_;
  std::vector<uint8_t> cached_;
  std::vector<BlockHash> hash_;
  std::vector<int32_t> parent_;
  std::vector<uint32_t> parent_gen_;
  std::vector<int32_t> tokens_;  // num_blocks * block_size
  std::vector<std::vector<int64_t>> extra_;
  absl::flat_hash_map<BlockHash, int32_t> table_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COORDINATOR_PREFIX_CACHE_H_
