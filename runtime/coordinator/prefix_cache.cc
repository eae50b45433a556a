#include "runtime/coordinator/prefix_cache.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pagedserve {

PrefixCache::PrefixCache(int32_t num_blocks, int32_t block_size)
    : block_size_(block_size),
      cached_(num_blocks, 0),
      hash_(num_blocks),
      parent_(num_blocks, -1),
      parent_gen_(num_blocks, 0),
      tokens_(static_cast<size_t>(num_blocks) * block_size, 0),
      extra_(num_blocks) {
  // Every block can be cached at once: sized for that up front, so that
  // registering a block never rehashes the whole table in the middle of a
  // step (each rehash moves every entry, one cache miss apiece).
  table_.reserve(static_cast<size_t>(std::max(num_blocks, 0)));
}

int32_t PrefixCache::Lookup(const BlockHash& hash, int32_t parent_block, uint32_t parent_gen,
                            absl::Span<const int32_t> token_ids,
                            absl::Span<const int64_t> extra_keys, bool* collision) const {
  auto it = table_.find(hash);
  if (it == table_.end()) return -1;
  const int32_t b = it->second;
  const int32_t* stored = &tokens_[static_cast<size_t>(b) * block_size_];
  const bool ok = static_cast<int32_t>(token_ids.size()) == block_size_ &&
                  parent_[b] == parent_block &&
                  (parent_block < 0 || parent_gen_[b] == parent_gen) &&
                  std::equal(token_ids.begin(), token_ids.end(), stored) &&
                  extra_[b].size() == extra_keys.size() &&
                  std::equal(extra_keys.begin(), extra_keys.end(), extra_[b].begin());
  if (!ok) {
    if (collision) *collision = true;
    return -1;
  }
  return b;
}

bool PrefixCache::Insert(int32_t b, const BlockHash& hash, int32_t parent_block,
                         uint32_t parent_gen, absl::Span<const int32_t> token_ids,
                         absl::Span<const int64_t> extra_keys) {
  if (cached_[b] || static_cast<int32_t>(token_ids.size()) != block_size_) return false;
  if (!table_.emplace(hash, b).second) return false;
  cached_[b] = 1;
  hash_[b] = hash;
  parent_[b] = parent_block;
  parent_gen_[b] = parent_gen;
  std::copy(token_ids.begin(), token_ids.end(), &tokens_[static_cast<size_t>(b) * block_size_]);
  extra_[b].assign(extra_keys.begin(), extra_keys.end());
  return true;
}

void PrefixCache::Erase(int32_t b) {
  if (!cached_[b]) return;
  auto it = table_.find(hash_[b]);
  if (it != table_.end() && it->second == b) table_.erase(it);
  cached_[b] = 0;
  extra_[b].clear();
}

absl::Status PrefixCache::CheckInvariants() const {
  for (const auto& [h, b] : table_) {
    if (!cached_[b] || !(hash_[b] == h)) {
      return absl::InternalError(absl::StrCat("hash table entry for block ", b, " is stale"));
    }
  }
  int32_t num_cached = 0;
  for (uint8_t c : cached_) num_cached += c;
  if (num_cached != size()) {
    return absl::InternalError(
        absl::StrCat(num_cached, " cached blocks but ", table_.size(), " hash table entries"));
  }
  return absl::OkStatus();
}

}  // namespace pagedserve
