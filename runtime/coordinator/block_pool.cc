#include "runtime/coordinator/block_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pagedserve {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size, bool enable_caching)
    : num_blocks_(std::max(num_blocks, 0)),
      block_size_(block_size),
      caching_(enable_caching),
      ref_(num_blocks_, 0),
      gen_(num_blocks_, 0) {
  free_.reserve(num_blocks_);
  // Stack order: block 0 is handed out first.
  for (int32_t b = num_blocks_ - 1; b >= 0; --b) free_.push_back(b);
  if (caching_) {
    cached_.assign(num_blocks_, 0);
    hash_.resize(num_blocks_);
    parent_.assign(num_blocks_, -1);
    parent_gen_.assign(num_blocks_, 0);
    tokens_.assign(static_cast<size_t>(num_blocks_) * block_size_, 0);
    extra_.resize(num_blocks_);
    prev_.assign(num_blocks_, -1);
    next_.assign(num_blocks_, -1);
  }
}

int32_t BlockPool::Allocate() {
  int32_t b;
  if (!free_.empty()) {
    b = free_.back();
    free_.pop_back();
  } else if (lru_head_ >= 0) {
    b = lru_head_;
    LruRemove(b);
    Uncache(b);
    ++num_evictions_;
  } else {
    return -1;
  }
  ref_[b] = 1;
  ++gen_[b];
  return b;
}

void BlockPool::IncRef(int32_t b) {
  if (ref_[b] == 0) LruRemove(b);  // only evictable blocks are revived
  ++ref_[b];
}

void BlockPool::DecRef(int32_t b) {
  if (--ref_[b] > 0) return;
  if (caching_ && cached_[b]) {
    LruPushBack(b);
  } else {
    free_.push_back(b);
  }
}

void BlockPool::LruRemove(int32_t b) {
  int32_t p = prev_[b], n = next_[b];
  (p >= 0 ? next_[p] : lru_head_) = n;
  (n >= 0 ? prev_[n] : lru_tail_) = p;
  prev_[b] = next_[b] = -1;
  --num_evictable_;
}

void BlockPool::LruPushBack(int32_t b) {
  prev_[b] = lru_tail_;
  next_[b] = -1;
  (lru_tail_ >= 0 ? next_[lru_tail_] : lru_head_) = b;
  lru_tail_ = b;
  ++num_evictable_;
}

void BlockPool::Uncache(int32_t b) {
  auto it = table_.find(hash_[b]);
  if (it != table_.end() && it->second == b) table_.erase(it);
  cached_[b] = 0;
  extra_[b].clear();
}

int32_t BlockPool::Lookup(const BlockHash& hash, int32_t parent_block, uint32_t parent_gen,
                          absl::Span<const int32_t> token_ids,
                          absl::Span<const int64_t> extra_keys, bool* collision) const {
  if (!caching_) return -1;
  auto it = table_.find(hash);
  if (it == table_.end()) return -1;
  const int32_t b = it->second;
  const int32_t* stored = &tokens_[static_cast<size_t>(b) * block_size_];
  bool ok = static_cast<int32_t>(token_ids.size()) == block_size_ &&
            parent_[b] == parent_block && (parent_block < 0 || parent_gen_[b] == parent_gen) &&
            std::equal(token_ids.begin(), token_ids.end(), stored) &&
            extra_[b].size() == extra_keys.size() &&
            std::equal(extra_keys.begin(), extra_keys.end(), extra_[b].begin());
  if (!ok) {
    if (collision) *collision = true;
    return -1;
  }
  return b;
}

bool BlockPool::Register(int32_t b, const BlockHash& hash, int32_t parent_block,
                         uint32_t parent_gen, absl::Span<const int32_t> token_ids,
                         absl::Span<const int64_t> extra_keys) {
  if (!caching_ || cached_[b] || ref_[b] <= 0 ||
      static_cast<int32_t>(token_ids.size()) != block_size_) {
    return false;
  }
  if (!table_.emplace(hash, b).second) return false;
  cached_[b] = 1;
  hash_[b] = hash;
  parent_[b] = parent_block;
  parent_gen_[b] = parent_gen;
  std::copy(token_ids.begin(), token_ids.end(), &tokens_[static_cast<size_t>(b) * block_size_]);
  extra_[b].assign(extra_keys.begin(), extra_keys.end());
  return true;
}

absl::Status BlockPool::CheckInvariants() const {
  std::vector<uint8_t> state(num_blocks_, 0);  // 1 free, 2 evictable, 3 in use
  for (int32_t b : free_) {
    if (b < 0 || b >= num_blocks_ || state[b] != 0) {
      return absl::InternalError(absl::StrCat("block ", b, " is on the free list twice or out of range"));
    }
    if (ref_[b] != 0) return absl::InternalError(absl::StrCat("free block ", b, " has ref ", ref_[b]));
    if (caching_ && cached_[b]) return absl::InternalError(absl::StrCat("free block ", b, " is cached"));
    state[b] = 1;
  }
  int32_t lru_count = 0;
  if (caching_) {
    int32_t prev = -1;
    for (int32_t b = lru_head_; b >= 0; b = next_[b]) {
      if (state[b] != 0 || prev_[b] != prev) {
        return absl::InternalError(absl::StrCat("LRU list is corrupt at block ", b));
      }
      if (ref_[b] != 0 || !cached_[b]) {
        return absl::InternalError(absl::StrCat("evictable block ", b, " has ref ", ref_[b],
                                                " cached ", int(cached_[b])));
      }
      state[b] = 2;
      prev = b;
      ++lru_count;
    }
    if (prev != lru_tail_) return absl::InternalError("LRU tail is wrong");
    for (const auto& [h, b] : table_) {
      if (!cached_[b] || !(hash_[b] == h)) {
        return absl::InternalError(absl::StrCat("hash table entry for block ", b, " is stale"));
      }
    }
    int32_t num_cached = 0;
    for (int32_t b = 0; b < num_blocks_; ++b) num_cached += cached_[b];
    if (num_cached != static_cast<int32_t>(table_.size())) {
      return absl::InternalError(absl::StrCat(num_cached, " cached blocks but ", table_.size(),
                                              " hash table entries"));
    }
  }
  if (lru_count != num_evictable_) {
    return absl::InternalError(absl::StrCat("evictable count ", num_evictable_, " but LRU holds ", lru_count));
  }
  int32_t in_use = 0;
  for (int32_t b = 0; b < num_blocks_; ++b) {
    if (state[b] == 0) {
      if (ref_[b] <= 0) {
        return absl::InternalError(absl::StrCat("block ", b, " is neither free, evictable nor referenced"));
      }
      ++in_use;
    }
  }
  if (num_free() + num_evictable_ + in_use != num_blocks_) {
    return absl::InternalError(absl::StrCat("free ", num_free(), " + evictable ", num_evictable_,
                                            " + in use ", in_use, " != total ", num_blocks_));
  }
  return absl::OkStatus();
}

}  // namespace pagedserve
