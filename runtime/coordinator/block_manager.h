// The block manager: per-sequence block tables over a device block pool and a
// CPU swap pool, with copy-on-write, fork, swap out / in and prefix caching.
// It decides placement only; it never touches K/V bytes. The operations it
// emits (copy-on-write copies, swap pairs) go into the step plan and workers
// apply them before the forward pass, in the order swap out, swap in, copy.
//
// Block table of a sequence: block_table[i] holds tokens [i*B, (i+1)*B) where
// B = block_size; slot(token t) = block_table[t / B] * B + t % B.
//
// Design follows vLLM's block manager (SOSP'23 PagedAttention paper, and
// vLLM v0/v1) and nano-vllm: a plain free list, reference counts, and a hash
// chain for prefix caching. Not thread-safe: the scheduler owns it.
#ifndef PAGEDSERVE_RUNTIME_COORDINATOR_BLOCK_MANAGER_H_
#define PAGEDSERVE_RUNTIME_COORDINATOR_BLOCK_MANAGER_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "runtime/common/step_plan.h"
#include "runtime/coordinator/block_hash.h"
#include "runtime/coordinator/block_pool.h"
#include "runtime/coordinator/sequence.h"

namespace pagedserve {

class BlockManager {
 public:
  struct Options {
    int32_t block_size = 16;        // tokens per block, >= 1
    int32_t num_device_blocks = 0;  // >= 1
    int32_t num_cpu_blocks = 0;     // >= 0 (0: no swap space)
    bool enable_prefix_caching = false;
    // Fraction of device blocks kept free when admitting new work (vLLM's
    // default 0.01), so that admission does not cause immediate preemption.
    double watermark = 0.01;
    BlockHashFn hash_fn;  // empty: Sha256BlockHash
    // > 0 when every layer of the model attends only to the last
    // `sliding_window` positions (keys (p - window, p] for a query at p):
    // MarkComputed then returns the blocks wholly before the window of the
    // sequence's next query to the pool (vLLM's sliding-window KV manager), so
    // a long sequence holds about window / block_size blocks. 0: every block
    // is kept (full attention, or some layers global).
    int32_t sliding_window = 0;
  };

  explicit BlockManager(const Options& options);

  BlockManager(const BlockManager&) = delete;
  BlockManager& operator=(const BlockManager&) = delete;

  int32_t block_size() const { return block_size_; }
  int32_t watermark_blocks() const { return watermark_blocks_; }
  int32_t BlocksForTokens(int64_t num_tokens) const {
    return static_cast<int32_t>((num_tokens + block_size_ - 1) / block_size_);
  }
  const BlockPool& device() const { return device_; }
  const BlockPool& cpu() const { return cpu_; }

  // Prefix-cache lookup for a sequence that holds no blocks yet: takes a
  // reference on the longest chain of verified cached full blocks, at most
  // (len - 1) / block_size of them so that at least the last token is computed
  // (its logits are needed) and no cached block is ever written. Sets
  // num_computed_tokens and returns the hit length in tokens. No-op (0) when
  // caching is off. The caller counts the query with RecordPrefixQuery once
  // the match is kept (an admission attempt may be undone with Free).
  int32_t MatchPrefix(Sequence& seq);
  void RecordPrefixQuery(int64_t queried_tokens, int64_t hit_tokens) {
    prefix_queries_ += queried_tokens;
    prefix_hits_ += hit_tokens;
  }

  // Device blocks that AppendSlots would take for seqs[i] to feed
  // num_new_tokens[i] more tokens each (new blocks plus copy-on-write copies,
  // counting that the last sharer of a block writes in place).
  int32_t NumBlocksToAppend(absl::Span<Sequence* const> seqs,
                            absl::Span<const int32_t> num_new_tokens) const;
  // Makes seq's block table cover num_computed_tokens + n tokens. The block
  // the first new token is written to goes through CopyOnWrite first. Returns
  // false and changes nothing when the device pool cannot supply the blocks.
  bool AppendSlots(Sequence& seq, int32_t n, std::vector<BlockPair>* copies);

  // True when seq's block_table[index] is shared with another sequence
  // (ref count > 1): writing into it would change the other's K/V.
  bool IsShared(const Sequence& seq, int32_t index) const {
    return device_.ref_count(seq.block_table[index]) > 1;
  }
  // Copy-on-write (vLLM, SOSP'23 section 4.4): makes seq's device block
  // block_table[index] private before seq writes into it. When it is shared,
  // a fresh block takes its place in seq's table, the old one loses seq's
  // reference, and (old, new) is appended to *copies for the workers to copy
  // the K/V before the forward pass. No-op (true) when it is not shared;
  // false, changing nothing, when no device block is available.
  bool CopyOnWrite(Sequence& seq, int32_t index, std::vector<BlockPair>* copies);

  // child shares all of parent's blocks (ref counts + 1); for n > 1 sampling
  // and beam search. child must hold no blocks.
  void Fork(const Sequence& parent, Sequence& child);

  // Releases every block of seq (device or CPU) and clears its table.
  void Free(Sequence& seq);

  // Speculative decoding rollback (runtime/coordinator/speculative.h). A
  // verification step writes K/V for draft tokens at slots past the tokens
  // that end up accepted. The rule:
  //   - num_computed_tokens counts verified tokens only (the fed token and
  //     the accepted drafts), so MarkComputed never offers the prefix cache
  //     a block holding an unverified token;
  //   - slots of rejected tokens inside a block that also holds verified
  //     tokens stay allocated and are simply overwritten by later steps
  //     (attention never reads past a sequence's length);
  //   - blocks holding only rejected tokens go back to the pool here.
  // Makes seq's device block table exactly BlocksForTokens(num_computed_tokens)
  // long, returning the trailing blocks' references, and lowers
  // num_synced_blocks so the workers' mirror drops them too. Call after the
  // step's result was applied.
  void TrimToComputed(Sequence& seq);

  // Offers seq's full blocks whose K/V are computed (num_computed_tokens) to
  // the prefix cache, then, with a sliding window, drops the blocks wholly
  // before the window of the next query (position num_computed_tokens, whose
  // window starts at num_computed_tokens - sliding_window + 1): their entries
  // become kDroppedBlock (the table keeps its length, so block indices and the
  // workers' mirror stay valid) and their references go back to the pool, to
  // the prefix cache's evictable blocks when cached. Call only after the step
  // that computed them returned. Inline: called for every sequence of every
  // step, and a block fills only once every block_size decode steps.
  void MarkComputed(Sequence& seq) {
    if (seq.blocks_on_cpu) return;
    if (device_.caching()) {
      const int32_t full = std::min<int32_t>(seq.num_computed_tokens / block_size_,
                                             static_cast<int32_t>(seq.block_table.size()));
      if (full > seq.num_registered_blocks) RegisterFullBlocks(seq, full);
    }
    if (sliding_window_ > 0 && seq.num_computed_tokens - sliding_window_ + 1 >=
                                   (seq.num_dropped_blocks + 1) * block_size_) {
      DropBlocksOutsideWindow(seq);
    }
  }
  int32_t sliding_window() const { return sliding_window_; }

  // Distinct blocks held by the sequences together (shared blocks once).
  int32_t NumDistinctBlocks(absl::Span<Sequence* const> seqs) const;
  // Moves the sequences' device blocks to the CPU pool (sharing preserved),
  // appending (device, cpu) pairs. Returns false and changes nothing when the
  // CPU pool lacks room.
  bool SwapOut(absl::Span<Sequence* const> seqs, std::vector<BlockPair>* pairs);
  // Moves swapped sequences back to device blocks, appending (cpu, device)
  // pairs; requires that `reserve` more blocks plus the watermark stay free
  // afterwards. Returns false and changes nothing otherwise.
  bool SwapIn(absl::Span<Sequence* const> seqs, int32_t reserve, std::vector<BlockPair>* pairs);

  // True when num_blocks more device blocks can be taken while leaving the
  // watermark free (admission of new work).
  bool CanAdmit(int32_t num_blocks) const {
    return device_.num_available() - num_blocks >= watermark_blocks_;
  }

  // Checks both pools and that every pool reference count equals the number
  // of block-table entries that name the block.
  absl::Status CheckInvariants() const;

  // Prefix-cache counters, in tokens.
  int64_t prefix_cache_queries() const { return prefix_queries_; }
  int64_t prefix_cache_hits() const { return prefix_hits_; }
  int64_t prefix_cache_collisions() const { return prefix_collisions_; }  // failed verifications

 private:
  void EnsureHashes(Sequence& seq, int32_t num_full_blocks);
  // MarkComputed's work once seq's first `full` blocks are full and computed.
  void RegisterFullBlocks(Sequence& seq, int32_t full);
  // MarkComputed's work once at least one more block left the window.
  void DropBlocksOutsideWindow(Sequence& seq);

  const int32_t block_size_;
  const int32_t watermark_blocks_;
  const int32_t sliding_window_;
  BlockPool device_;
  BlockPool cpu_;
  BlockHashFn hash_fn_;
  absl::flat_hash_set<const Sequence*> holders_;
  int64_t prefix_queries_ = 0;
  int64_t prefix_hits_ = 0;
  int64_t prefix_collisions_ = 0;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COORDINATOR_BLOCK_MANAGER_H_
