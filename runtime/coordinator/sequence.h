// Sequences and requests (sequence groups) as the coordinator tracks them.
//
// A request (SequenceGroup) holds 1..n sequences: n > 1 for parallel sampling.
// Its first sequence (the parent) is prefilled once and samples n tokens; the
// n-1 siblings are then forked from it, sharing its prompt blocks.
// With beam search (params.use_beam_search) the sequences are the live beams
// (at most beam_width): after every step the scheduler extends each chosen
// parent in place by its best chosen token, forks it for its other chosen
// tokens, and frees and drops the beams not chosen (runtime/coordinator/beam_search.h).
//
// Token bookkeeping of one sequence (all counts in tokens):
//   tokens                prompt + generated so far
//   num_prompt_tokens     length of the prompt part
//   num_computed_tokens   tokens whose K/V are in the cache and confirmed by a
//                         returned step result (or a verified prefix-cache hit)
// A sequence feeds tokens[num_computed_tokens, ...) in its next step: a prompt
// chunk (prefill), or its last sampled token (decode, len - computed == 1).
#ifndef PAGEDSERVE_RUNTIME_COORDINATOR_SEQUENCE_H_
#define PAGEDSERVE_RUNTIME_COORDINATOR_SEQUENCE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/common/finish_reason.h"
#include "runtime/common/sampling_params.h"
#include "runtime/common/step_plan.h"
#include "runtime/coordinator/beam_search.h"
#include "runtime/coordinator/block_hash.h"

namespace pagedserve {

enum class SequenceStatus {
  kWaiting,   // not yet admitted, or preempted by recompute
  kRunning,   // holds device blocks
  kSwapped,   // preempted by swap: holds CPU swap blocks
  kFinished,  // see FinishReason
};

// FinishReason (runtime/common/finish_reason.h): the scheduler sets kStop
// (EOS / stop token id; stop strings are reported by the caller), kLength and
// kAbort; kError is the engine's.

// Field order is for the step loop: the fields every scheduling step reads
// or writes come first, within the first two cache lines; beam search and
// prefix-cache state, read only when a block fills or a beam forks, follow.
struct Sequence {
  SeqId id = 0;
  std::vector<int32_t> tokens;
  int32_t num_prompt_tokens = 0;
  int32_t num_computed_tokens = 0;
  SequenceStatus status = SequenceStatus::kWaiting;
  FinishReason finish_reason = FinishReason::kNone;
  int32_t sample_index = 0;    // 0..n-1 within the group
  int32_t stop_token_id = -1;  // the token that stopped it, when kStop by token

  // Block manager state. Entries are device block ids, or CPU swap block ids
  // while status == kSwapped.
  std::vector<int32_t> block_table;
  int32_t num_registered_blocks = 0;  // leading full blocks already offered to the cache
  // Leading entries that are kDroppedBlock: their blocks fell wholly out of
  // the sliding window and went back to the pool (BlockManager::MarkComputed).
  int32_t num_dropped_blocks = 0;
  bool blocks_on_cpu = false;

  // What the workers' mirror of the sequence (runtime/common/step_plan_mirror.h)
  // holds, so that its next SequenceStep carries only what changed.
  bool new_state = true;  // workers (re)start its state: everything in full
  // Leading block-table entries the workers hold as they are now. The block
  // manager lowers it whenever it replaces or drops entries (copy-on-write,
  // swap, free); building a plan raises it to the table's length.
  int32_t num_synced_blocks = 0;
  SeqId fork_from = kNoSeq;  // workers start it as a copy of this sibling

  // Speculative decoding: the draft tokens fed after tokens.back() in the
  // step in flight (unverified, never part of `tokens`), and the number of
  // draft tokens the next step may propose (adapted to the acceptance; 0
  // until the first speculative step sets it).
  std::vector<int32_t> draft;
  int32_t spec_k = 0;

  // Prefix caching: hashes of the first full blocks of `tokens`, and the
  // request's extra keys.
  std::vector<BlockHash> block_hashes;
  std::vector<int64_t> extra_keys;
  // Beam search only: sum of the raw logprobs of the generated tokens, and
  // each one's logprob.
  double cumulative_logprob = 0.0;
  std::vector<float> output_logprobs;

  int32_t len() const { return static_cast<int32_t>(tokens.size()); }
  int32_t num_output_tokens() const { return len() - num_prompt_tokens; }
  int32_t num_uncomputed() const { return len() - num_computed_tokens; }
  bool finished() const { return status == SequenceStatus::kFinished; }
};

// One client request.
// Field order as for Sequence: what every step reads first; step_params,
// read only when a sequence starts, last.
struct SequenceGroup {
  std::string request_id;
  std::vector<std::unique_ptr<Sequence>> seqs;  // seqs[0] is the parent
  std::unique_ptr<BeamSearch> beam;             // set when params.use_beam_search
  SequenceStatus status = SequenceStatus::kWaiting;
  FinishReason pending_finish = FinishReason::kNone;  // Abort/FinishRequest, applied next step
  int32_t num_cached_tokens = -1;  // prefix-cache hit of the first admission; -1 until known
  bool forked = false;             // siblings exist (n > 1 after the first sample)
  // params.prompt_logprobs >= 0: the prompt tokens scored so far (positions
  // 1, 2, ... in order; a chunk re-fed after a recompute preemption scores
  // again and is not appended twice), handed to the request's first output
  // (prompt_logprobs_done then).
  std::vector<PromptLogprob> prompt_logprobs;
  bool prompt_logprobs_done = false;
  SamplingParams params;
  double arrival_time = 0.0;
  int32_t priority = 0;        // lower value = more important (vLLM convention)
  uint64_t arrival_order = 0;  // admission-queue tie breaker
  // What workers get for this request's sequences: params, except for beam
  // search: greedy with logprobs = 2 * beam_width (the candidates), n = 1 and
  // no beam fields (workers never see beam search).
  SamplingParams step_params;

  int32_t num_unfinished() const {
    int32_t c = 0;
    for (const auto& s : seqs) c += !s->finished();
    return c;
  }
  // Sequence slots the group needs while it runs: n before the fork; the
  // beam width throughout for beam search.
  int32_t max_running_seqs() const {
    if (params.use_beam_search) return params.beam_width();
    return forked ? num_unfinished() : params.n;
  }
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COORDINATOR_SEQUENCE_H_
