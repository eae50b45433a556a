#include "runtime/worker/decode_graph.h"

#include <algorithm>
#include <cstdint>

namespace pagedserve {

int DecodeGraphBatchBucket(int num_seqs) {
  if (num_seqs <= 2) return std::max(num_seqs, 1);
  if (num_seqs <= 4) return 4;
  return (num_seqs + 7) / 8 * 8;
}

int DecodeGraphContextBucket(int max_seq_len, int block_size, int cap) {
  int64_t bucket = 256;
  while (bucket < max_seq_len) {
    // 2^k, then 1.5 * 2^k, then 2^(k+1).
    const bool power_of_two = (bucket & (bucket - 1)) == 0;
    bucket = power_of_two ? bucket / 2 * 3 : bucket / 3 * 4;
  }
  bucket = std::min<int64_t>(bucket, cap);
  return static_cast<int>((bucket + block_size - 1) / block_size * block_size);
}

std::optional<DecodeGraphKey> ChooseDecodeGraph(const ForwardBatch& b, int block_size,
                                                const DecodeGraphOptions& options) {
  const int n = b.num_seqs();
  if (options.enforce_eager || n < 1 || n > options.max_batch || b.num_tokens() != n ||
      b.logits_rows.size() != static_cast<size_t>(n) || block_size < 1)
    return std::nullopt;
  int max_len = 0;
  for (int s = 0; s < n; ++s) {
    if (b.query_start_loc[s] != s || b.logits_rows[s] != s || b.seq_lens[s] <= 1 ||
        b.seq_lens[s] > options.max_seq_len_to_capture)
      return std::nullopt;
    max_len = std::max(max_len, b.seq_lens[s]);
  }
  return DecodeGraphKey{
      DecodeGraphBatchBucket(n),
      DecodeGraphContextBucket(max_len, block_size, options.max_seq_len_to_capture)};
}

void PaddedDecodeBatch::Pad(const ForwardBatch& b, const DecodeGraphKey& key, int block_size) {
  const int n = b.num_seqs();
  const size_t batch = static_cast<size_t>(key.batch);
  const int width = key.context / block_size;
  token_ids_.assign(b.token_ids.begin(), b.token_ids.end());
  positions_.assign(b.positions.begin(), b.positions.end());
  slot_mapping_.assign(b.slot_mapping.begin(), b.slot_mapping.end());
  seq_lens_.assign(b.seq_lens.begin(), b.seq_lens.end());
  token_ids_.resize(batch, 0);
  positions_.resize(batch, 0);
  slot_mapping_.resize(batch, -1);
  seq_lens_.resize(batch, 1);
  query_start_loc_.resize(batch + 1);
  logits_rows_.resize(batch);
  for (size_t s = 0; s <= batch; ++s) query_start_loc_[s] = static_cast<int32_t>(s);
  for (size_t s = 0; s < batch; ++s) logits_rows_[s] = static_cast<int32_t>(s);
  block_tables_.assign(batch * width, 0);
  const int copied = std::min(width, b.max_blocks_per_seq);
  for (int s = 0; s < n; ++s)
    std::copy_n(b.block_tables.begin() + static_cast<size_t>(s) * b.max_blocks_per_seq, copied,
                block_tables_.begin() + static_cast<size_t>(s) * width);
  view_ = ForwardBatch{};
  view_.token_ids = token_ids_;
  view_.positions = positions_;
  view_.slot_mapping = slot_mapping_;
  view_.query_start_loc = query_start_loc_;
  view_.seq_lens = seq_lens_;
  view_.block_tables = block_tables_;
  view_.max_blocks_per_seq = width;
  view_.logits_rows = logits_rows_;
}

}  // namespace pagedserve
