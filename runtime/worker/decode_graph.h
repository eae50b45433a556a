// The shapes decode steps are padded to so that a backend can capture the
// layer body once per shape and replay it (CUDA graphs; vLLM's capture of
// decode batches, --enforce-eager to turn it off). Plain host arithmetic,
// used by the one forward pass (runtime/worker/llama_model.h) on every
// backend; only a backend whose ModelBackend::SupportsBodyGraphs() is true
// gets padded steps.
//
// A graph replays its kernels with the launch parameters of its capture, so
// everything that sizes a launch must be the same for every step that
// replays it: the token and sequence count (padded to a batch bucket), the
// block-table width and the attention's max_seq_len (padded to a context
// bucket), and the number of logits rows (one per padded sequence). Kernels
// read the real lengths and block ids from device memory, so padding only
// adds work: padded sequences have seq_len 1, block table row 0 (block 0 is
// read, never written) and slot -1 (reshape_and_cache skips it), and their
// rows are not returned.
#ifndef PAGEDSERVE_RUNTIME_WORKER_DECODE_GRAPH_H_
#define PAGEDSERVE_RUNTIME_WORKER_DECODE_GRAPH_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "runtime/worker/model_backend.h"

namespace pagedserve {

// What decode steps may be captured (the worker's --enforce-eager and
// --max-seq-len-to-capture, vLLM's flags of the same names).
struct DecodeGraphOptions {
  bool enforce_eager = false;
  // The largest batch captured: batches of more sequences run eagerly.
  int max_batch = 256;
  // The longest context captured: a step whose longest decode sequence is
  // longer runs eagerly (vLLM's default, 8192).
  int max_seq_len_to_capture = 8192;
};

// The batch bucket of `num_seqs` sequences (vLLM's capture sizes): 1, 2, 4,
// then the next multiple of 8. `num_seqs` >= 1.
int DecodeGraphBatchBucket(int num_seqs);

// The context bucket of a step whose longest decode sequence has
// `max_seq_len` tokens: the smallest of 256, 384, 512, 768, ... (2^k and
// 1.5 * 2^k) that holds it, so that the work sized for the bucket is less
// than 1.5 times the step's (attention splits past a sequence's length exit at
// once, but fewer splits carry its work), capped at `cap`, rounded up to the
// block size. 1 <= max_seq_len <= cap.
int DecodeGraphContextBucket(int max_seq_len, int block_size, int cap);

// The key of `batch` when it may be captured: every sequence a decode
// sequence (one token, seq_len > 1), every sequence with one logits row at
// its token (rows in sequence order) and at most options.max_batch
// sequences, each at most options.max_seq_len_to_capture long; nullopt
// otherwise (and always with options.enforce_eager).
std::optional<DecodeGraphKey> ChooseDecodeGraph(const ForwardBatch& batch, int block_size,
                                                const DecodeGraphOptions& options);

// `batch` padded to `key` (ChooseDecodeGraph's): the real sequences first,
// unchanged except that block-table rows are cut or zero-padded to
// key.context / block_size entries (a real row needs at most that many);
// then padded sequences (token 0, position 0, slot -1, seq_len 1, block
// table zeros, one logits row each). Owns its arrays; `batch()` views them
// and is valid until the next Pad call or destruction.
class PaddedDecodeBatch {
 public:
  void Pad(const ForwardBatch& batch, const DecodeGraphKey& key, int block_size);
  const ForwardBatch& batch() const { return view_; }

 private:
  std::vector<int32_t> token_ids_, positions_, query_start_loc_, seq_lens_, block_tables_,
      logits_rows_;
  std::vector<int64_t> slot_mapping_;
  ForwardBatch view_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_DECODE_GRAPH_H_
