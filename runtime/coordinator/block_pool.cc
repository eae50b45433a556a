#include "runtime/coordinator/block_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pagedserve {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size, bool enable_caching)
    : num_blocks_(std::max(num_blocks, 0)),
      block_size_(block_size),
      ref_(num_blocks_, 0),
      gen_(num_blocks_, 0) {
  free_.reserve(num_blocks_);
  // Stack order: block 0 is handed out first.
  for (int32_t b = num_blocks_ - 1; b >= 0; --b) free_.push_back(b);
  if (enable_caching) {
    cache_ = std::make_unique<PrefixCache>(num_blocks_, block_size_);
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
    cache_->Erase(b);
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
  if (is_cached(b)) {
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

int32_t BlockPool::Lookup(const BlockHash& hash, int32_t parent_block, uint32_t parent_gen,
                          absl::Span<const int32_t> token_ids, absl::Span<const int64_t> extra_keys,
                          bool* collision) const {
  if (cache_ == nullptr) return -1;
  return cache_->Lookup(hash, parent_block, parent_gen, token_ids, extra_keys, collision);
}

bool BlockPool::Register(int32_t b, const BlockHash& hash, int32_t parent_block,
                         uint32_t parent_gen, absl::Span<const int32_t> token_ids,
                         absl::Span<const int64_t> extra_keys) {
  if (cache_ == nullptr || ref_[b] <= 0) return false;
  return cache_->Insert(b, hash, parent_block, parent_gen, token_ids, extra_keys);
}

absl::Status BlockPool::CheckInvariants() const {
  std::vector<uint8_t> state(num_blocks_, 0);  // 1 free, 2 evictable, 3 in use
  for (int32_t b : free_) {
    if (b < 0 || b >= num_blocks_ || state[b] != 0) {
      return absl::InternalError(
          absl::StrCat("block ", b, " is on the free list twice or out of range"));
    }
    if (ref_[b] != 0)
      return absl::InternalError(absl::StrCat("free block ", b, " has ref ", ref_[b]));
    if (is_cached(b)) return absl::InternalError(absl::StrCat("free block ", b, " is cached"));
    state[b] = 1;
  }
  int32_t lru_count = 0;
  if (cache_ != nullptr) {
    int32_t prev = -1;
    for (int32_t b = lru_head_; b >= 0; b = next_[b]) {
      if (state[b] != 0 || prev_[b] != prev) {
        return absl::InternalError(absl::StrCat("LRU list is corrupt at block ", b));
      }
      if (ref_[b] != 0 || !is_cached(b)) {
        return absl::InternalError(absl::StrCat("evictable block ", b, " has ref ", ref_[b],
                                                " cached ", int(is_cached(b))));
      }
      state[b] = 2;
      prev = b;
      ++lru_count;
    }
    if (prev != lru_tail_) return absl::InternalError("LRU tail is wrong");
    if (absl::Status st = cache_->CheckInvariants(); !st.ok()) return st;
  }
  if (lru_count != num_evictable_) {
    return absl::InternalError(
        absl::StrCat("evictable count ", num_evictable_, " but LRU holds ", lru_count));
  }
  int32_t in_use = 0;
  for (int32_t b = 0; b < num_blocks_; ++b) {
    if (state[b] == 0) {
      if (ref_[b] <= 0) {
        return absl::InternalError(
            absl::StrCat("block ", b, " is neither free, evictable nor referenced"));
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
