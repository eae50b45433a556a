#include "runtime/coordinator/block_manager.h"

#include <algorithm>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace pagedserve {
namespace {

// Swap out / swap in of one sequence: every block of its block table gets a
// block of pool `to` (the caller has checked there are enough) and the old one
// loses a reference. A block shared by several sequences of the call (`moved`:
// old id -> new id) is copied once (one entry in `pairs`) and referenced again.
void MoveBlockTable(Sequence& seq, BlockPool& from, BlockPool& to,
                    absl::flat_hash_map<int32_t, int32_t>& moved, std::vector<BlockPair>* pairs) {
  for (int32_t& b : seq.block_table) {
    if (b == kDroppedBlock) continue;  // out of the sliding window: nothing to move
    auto [it, inserted] = moved.try_emplace(b, -1);
    if (inserted) {
      it->second = to.Allocate();
      pairs->push_back({b, it->second});
    } else {
      to.IncRef(it->second);
    }
    from.DecRef(b);
    b = it->second;
  }
  seq.num_synced_blocks = 0;
}

}  // namespace

BlockManager::BlockManager(const Options& o)
    : block_size_(std::max(o.block_size, 1)),
      watermark_blocks_(static_cast<int32_t>(
          std::floor(std::max(o.watermark, 0.0) * std::max(o.num_device_blocks, 0)))),
      sliding_window_(std::max(o.sliding_window, 0)),
      device_(o.num_device_blocks, std::max(o.block_size, 1), o.enable_prefix_caching),
      cpu_(o.num_cpu_blocks, std::max(o.block_size, 1), /*enable_caching=*/false),
      hash_fn_(o.hash_fn ? o.hash_fn : BlockHashFn(Sha256BlockHash)) {}

void BlockManager::EnsureHashes(Sequence& seq, int32_t num_full_blocks) {
  auto& hashes = seq.block_hashes;
  for (int32_t i = static_cast<int32_t>(hashes.size()); i < num_full_blocks; ++i) {
    const BlockHash& parent = i == 0 ? kRootBlockHash : hashes[i - 1];
    hashes.push_back(hash_fn_(
        parent,
        absl::MakeConstSpan(seq.tokens).subspan(static_cast<size_t>(i) * block_size_, block_size_),
        seq.extra_keys));
  }
}

int32_t BlockManager::MatchPrefix(Sequence& seq) {
  if (!device_.caching() || !seq.block_table.empty() || seq.len() == 0) return 0;
  const int32_t max_blocks = (seq.len() - 1) / block_size_;
  int32_t parent = -1;
  uint32_t parent_gen = 0;
  int32_t hits = 0;
  for (int32_t i = 0; i < max_blocks; ++i) {
    EnsureHashes(seq, i + 1);
    bool collision = false;
    int32_t b = device_.Lookup(
        seq.block_hashes[i], parent, parent_gen,
        absl::MakeConstSpan(seq.tokens).subspan(static_cast<size_t>(i) * block_size_, block_size_),
        seq.extra_keys, &collision);
    if (collision) ++prefix_collisions_;
    if (b < 0) break;
    device_.IncRef(b);
    seq.block_table.push_back(b);
    parent = b;
    parent_gen = device_.generation(b);
    ++hits;
  }
  if (hits > 0) holders_.insert(&seq);
  seq.num_synced_blocks = 0;
  seq.num_computed_tokens = hits * block_size_;
  seq.num_registered_blocks = hits;
  return hits * block_size_;
}

int32_t BlockManager::NumBlocksToAppend(absl::Span<Sequence* const> seqs,
                                        absl::Span<const int32_t> num_new_tokens) const {
  int32_t needed = 0;
  if (seqs.size() == 1) {  // the common case: no sharing within the group
    const Sequence& s = *seqs[0];
    const int32_t n = num_new_tokens[0];
    if (n <= 0) return 0;
    const int32_t have = static_cast<int32_t>(s.block_table.size());
    needed = std::max(0, BlocksForTokens(static_cast<int64_t>(s.num_computed_tokens) + n) - have);
    const int32_t wb = s.num_computed_tokens / block_size_;
    if (wb < have && device_.ref_count(s.block_table[wb]) > 1) ++needed;
    return needed;
  }
  // Shared blocks about to be written: block -> number of writers among seqs.
  absl::flat_hash_map<int32_t, int32_t> writers;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = *seqs[i];
    const int32_t n = num_new_tokens[i];
    if (n <= 0) continue;
    const int32_t have = static_cast<int32_t>(s.block_table.size());
    needed += std::max(0, BlocksForTokens(static_cast<int64_t>(s.num_computed_tokens) + n) - have);
    const int32_t wb = s.num_computed_tokens / block_size_;
    if (wb < have && device_.ref_count(s.block_table[wb]) > 1) ++writers[s.block_table[wb]];
  }
  for (const auto& [b, w] : writers) needed += std::min(w, device_.ref_count(b) - 1);
  return needed;
}

bool BlockManager::AppendSlots(Sequence& seq, int32_t n, std::vector<BlockPair>* copies) {
  if (n <= 0) return true;
  const int32_t have = static_cast<int32_t>(seq.block_table.size());
  const int32_t fresh =
      std::max(0, BlocksForTokens(static_cast<int64_t>(seq.num_computed_tokens) + n) - have);
  const int32_t wb = seq.num_computed_tokens / block_size_;
  const bool cow = wb < have && IsShared(seq, wb);
  if (fresh + (cow ? 1 : 0) > device_.num_available()) return false;
  if (cow) CopyOnWrite(seq, wb, copies);
  const bool was_empty = seq.block_table.empty();
  for (int32_t i = 0; i < fresh; ++i) seq.block_table.push_back(device_.Allocate());
  if (was_empty && !seq.block_table.empty()) holders_.insert(&seq);
  return true;
}

bool BlockManager::CopyOnWrite(Sequence& seq, int32_t index, std::vector<BlockPair>* copies) {
  if (!IsShared(seq, index)) return true;
  const int32_t src = seq.block_table[index];
  const int32_t dst = device_.Allocate();
  if (dst < 0) return false;
  copies->push_back({src, dst});
  device_.DecRef(src);
  seq.block_table[index] = dst;
  seq.num_synced_blocks = std::min(seq.num_synced_blocks, index);
  return true;
}

void BlockManager::TrimToComputed(Sequence& seq) {
  if (seq.blocks_on_cpu) return;
  const auto keep = static_cast<size_t>(BlocksForTokens(seq.num_computed_tokens));
  if (seq.block_table.size() <= keep) return;
  while (seq.block_table.size() > keep) {
    device_.DecRef(seq.block_table.back());
    seq.block_table.pop_back();
  }
  seq.num_synced_blocks = std::min(seq.num_synced_blocks, static_cast<int32_t>(keep));
  if (seq.block_table.empty()) holders_.erase(&seq);
}

void BlockManager::Fork(const Sequence& parent, Sequence& child) {
  child.block_table = parent.block_table;
  child.blocks_on_cpu = parent.blocks_on_cpu;
  child.block_hashes = parent.block_hashes;
  child.num_registered_blocks = parent.num_registered_blocks;
  child.num_dropped_blocks = parent.num_dropped_blocks;
  BlockPool& pool = parent.blocks_on_cpu ? cpu_ : device_;
  for (int32_t b : child.block_table) {
    if (b != kDroppedBlock) pool.IncRef(b);
  }
  child.num_synced_blocks = 0;
  if (!child.block_table.empty()) holders_.insert(&child);
}

void BlockManager::Free(Sequence& seq) {
  BlockPool& pool = seq.blocks_on_cpu ? cpu_ : device_;
  // Reverse order: the tail of a chain becomes least recently used first, so
  // eviction takes a prefix's last blocks before its first ones.
  for (auto it = seq.block_table.rbegin(); it != seq.block_table.rend(); ++it) {
    if (*it != kDroppedBlock) pool.DecRef(*it);
  }
  seq.block_table.clear();
  seq.blocks_on_cpu = false;
  seq.num_registered_blocks = 0;
  seq.num_dropped_blocks = 0;
  seq.num_synced_blocks = 0;
  holders_.erase(&seq);
}

void BlockManager::RegisterFullBlocks(Sequence& seq, int32_t full) {
  EnsureHashes(seq, full);
  for (int32_t i = seq.num_registered_blocks; i < full; ++i) {
    const int32_t b = seq.block_table[i];
    const int32_t parent = i == 0 ? -1 : seq.block_table[i - 1];
    // A block already dropped out of the sliding window, or whose parent was,
    // is not registered (a child is reachable only through its parent).
    if (b == kDroppedBlock || (i > 0 && parent == kDroppedBlock)) break;
    if (device_.is_cached(b)) continue;
    // A child is reachable only through a cached parent.
    if (parent >= 0 && !device_.is_cached(parent)) break;
    device_.Register(
        b, seq.block_hashes[i], parent, parent >= 0 ? device_.generation(parent) : 0,
        absl::MakeConstSpan(seq.tokens).subspan(static_cast<size_t>(i) * block_size_, block_size_),
        seq.extra_keys);
  }
  seq.num_registered_blocks = full;
}

void BlockManager::DropBlocksOutsideWindow(Sequence& seq) {
  const int64_t window_start = static_cast<int64_t>(seq.num_computed_tokens) - sliding_window_ + 1;
  const auto drop = static_cast<int32_t>(
      std::min<int64_t>(window_start / block_size_, static_cast<int64_t>(seq.block_table.size())));
  for (int32_t i = seq.num_dropped_blocks; i < drop; ++i) {
    device_.DecRef(seq.block_table[i]);
    seq.block_table[i] = kDroppedBlock;
  }
  seq.num_dropped_blocks = std::max(seq.num_dropped_blocks, drop);
}

int32_t BlockManager::NumDistinctBlocks(absl::Span<Sequence* const> seqs) const {
  absl::flat_hash_set<int32_t> seen;
  for (const Sequence* s : seqs) seen.insert(s->block_table.begin(), s->block_table.end());
  seen.erase(kDroppedBlock);
  return static_cast<int32_t>(seen.size());
}

bool BlockManager::SwapOut(absl::Span<Sequence* const> seqs, std::vector<BlockPair>* pairs) {
  for (const Sequence* s : seqs) {
    if (s->blocks_on_cpu) return false;
  }
  if (NumDistinctBlocks(seqs) > cpu_.num_available()) return false;
  absl::flat_hash_map<int32_t, int32_t> to_cpu;
  for (Sequence* s : seqs) {
    MoveBlockTable(*s, device_, cpu_, to_cpu, pairs);
    s->blocks_on_cpu = true;
    s->num_registered_blocks = 0;
  }
  return true;
}

bool BlockManager::SwapIn(absl::Span<Sequence* const> seqs, int32_t reserve,
                          std::vector<BlockPair>* pairs) {
  for (const Sequence* s : seqs) {
    if (!s->blocks_on_cpu && !s->block_table.empty()) return false;
  }
  if (!CanAdmit(NumDistinctBlocks(seqs) + reserve)) return false;
  absl::flat_hash_map<int32_t, int32_t> to_dev;
  for (Sequence* s : seqs) {
    if (!s->blocks_on_cpu) continue;
    MoveBlockTable(*s, cpu_, device_, to_dev, pairs);
    s->blocks_on_cpu = false;
    s->num_registered_blocks = 0;
  }
  return true;
}

absl::Status BlockManager::CheckInvariants() const {
  if (absl::Status s = device_.CheckInvariants(); !s.ok()) {
    return absl::InternalError(absl::StrCat("device pool: ", s.message()));
  }
  if (absl::Status s = cpu_.CheckInvariants(); !s.ok()) {
    return absl::InternalError(absl::StrCat("cpu pool: ", s.message()));
  }
  if (cpu_.num_evictable() != 0) return absl::InternalError("cpu pool has evictable blocks");
  std::vector<int32_t> dev_refs(device_.num_blocks(), 0), cpu_refs(cpu_.num_blocks(), 0);
  for (const Sequence* s : holders_) {
    auto& refs = s->blocks_on_cpu ? cpu_refs : dev_refs;
    for (size_t i = 0; i < s->block_table.size(); ++i) {
      const int32_t b = s->block_table[i];
      if (b == kDroppedBlock) {
        if (i >= static_cast<size_t>(s->num_dropped_blocks) || sliding_window_ == 0) {
          return absl::InternalError(
              absl::StrCat("sequence ", s->id, " has a dropped block at entry ", i,
                           " outside its dropped prefix of ", s->num_dropped_blocks));
        }
        continue;
      }
      if (i < static_cast<size_t>(s->num_dropped_blocks)) {
        return absl::InternalError(
            absl::StrCat("sequence ", s->id, " keeps block ", b, " inside its dropped prefix"));
      }
      if (b < 0 || b >= static_cast<int32_t>(refs.size())) {
        return absl::InternalError(
            absl::StrCat("sequence ", s->id, " names block ", b, " outside its pool"));
      }
      ++refs[b];
    }
  }
  for (int32_t b = 0; b < device_.num_blocks(); ++b) {
    if (dev_refs[b] != device_.ref_count(b)) {
      return absl::InternalError(absl::StrCat("device block ", b, " has ref ", device_.ref_count(b),
                                              " but ", dev_refs[b], " table entries"));
    }
  }
  for (int32_t b = 0; b < cpu_.num_blocks(); ++b) {
    if (cpu_refs[b] != cpu_.ref_count(b)) {
      return absl::InternalError(absl::StrCat("cpu block ", b, " has ref ", cpu_.ref_count(b),
                                              " but ", cpu_refs[b], " table entries"));
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedserve
