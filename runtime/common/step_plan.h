// The step plan: everything workers need to run one engine step, decided by the
// coordinator (scheduler + block manager) and broadcast to every worker rank.
// Workers never decide placement; they apply the block operations and run the
// forward pass exactly as planned. The coordinator never touches tensors.
#ifndef PAGEDSERVE_RUNTIME_COMMON_STEP_PLAN_H_
#define PAGEDSERVE_RUNTIME_COMMON_STEP_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/common/sampling_params.h"

namespace pagedserve {

using SeqId = uint64_t;
inline constexpr SeqId kNoSeq = ~SeqId{0};

// A block-table entry whose block went back to the pool because it lies
// wholly before the sliding window of every layer (SchedulerConfig::
// sliding_window): attention never reads it again and nothing writes it.
// Such entries form a prefix of the table; a worker never dereferences them.
inline constexpr int32_t kDroppedBlock = -1;

// A (source, destination) physical block pair.
struct BlockPair {
  int32_t src = 0;
  int32_t dst = 0;
  bool operator==(const BlockPair&) const = default;
};

// One sequence's share of a step. Plans are incremental: workers keep a mirror
// of every running sequence (runtime/common/step_plan_mirror.h) and a plan
// carries only what changed since the sequence's previous plan. A sequence
// *starts* (new_state, or fork_from set) with everything in full; a continuing
// sequence carries its fed tokens, the changed tail of its block table and
// its sampling flags, nothing else.
struct SequenceStep {
  SeqId seq_id = 0;
  // Before this step the worker copies its per-sequence state (token history,
  // block table, sampling parameters) from this sequence: set when a sibling
  // is forked for n > 1 or beam search. kNoSeq otherwise.
  SeqId fork_from = kNoSeq;
  // Tokens fed this step: a prompt chunk (prefill) or the last sampled token
  // (decode). Positions are start_pos, start_pos+1, ...; start_pos is the number
  // of tokens whose K/V are already cached (0 on a fresh or recomputed sequence,
  // > 0 after a prefix-cache hit or a previous chunk).
  std::vector<int32_t> token_ids;
  int32_t start_pos = 0;
  // Block-table delta. The sequence's block table (physical blocks, logical
  // order) after this plan is the first block_table_start entries the worker
  // holds for it, followed by block_table. So a full row has start 0, and an
  // unchanged row of L entries has start L and no entries; a decode that
  // opens a new block sends one entry, a copy-on-write of the last block sends
  // the last entry again. The resulting row covers start_pos + token_ids.size().
  // Leading entries may be kDroppedBlock (sliding window).
  int32_t block_table_start = 0;
  std::vector<int32_t> block_table;
  // Draw samples from the logits of the last token of this step. False for a
  // non-final chunk of a chunked prefill.
  bool sample = true;
  // Samples to draw: n on the final prefill step of an n > 1 group's parent
  // (siblings are forked afterwards), else 1.
  int32_t num_samples = 1;
  // Speculative decoding (runtime/coordinator/speculative.h): the last
  // num_draft_tokens fed tokens are draft tokens, unverified. The worker
  // samples the target at each of the last num_draft_tokens + 1 fed tokens
  // (token i's sample is for position start_pos + token_ids.size() - d + i,
  // drawn from the history up to that position, with that position's seeded
  // uniform) and returns num_draft_tokens + 1 SampledTokens for the sequence,
  // in position order. Requires sample and num_samples == 1; 0 otherwise.
  // Draft tokens are either all given (a coordinator-side proposer: n-gram
  // lookup) or all kNoToken: then the worker's draft model proposes them
  // (runtime/worker/draft_model.h) before the verification, feeds them in
  // their places and returns them in StepResult::drafts.
  int32_t num_draft_tokens = 0;
  // Prompt logprobs (SamplingParams::prompt_logprobs >= 0): the worker
  // scores, at each fed position p with p + 1 < num_prompt_tokens, the prompt
  // token at p + 1 (PromptLogprob, in StepResult::prompt_logprobs): a fed
  // token, or next_prompt_token for the last fed position when the prompt
  // goes on after this chunk (-1 otherwise). Only on prefill entries without
  // draft tokens.
  bool prompt_logprobs = false;
  int32_t next_prompt_token = -1;
  // True on the first step of a sequence and on its first step after a
  // recompute preemption: workers (re)start its per-sequence state here
  // instead of continuing an old one. False on a forked sibling (fork_from).
  bool new_state = false;

  // Per-sequence constants: read by workers only when the sequence starts
  // (starts()), ignored and not sent over the wire otherwise.
  // Which member of its group this sequence is (0..n-1): seeded requests derive
  // their random stream from (seed, sample_index, position) so outputs do not
  // depend on batch composition or preemption.
  int32_t sample_index = 0;
  SamplingParams sampling;
  // How many of the sequence's tokens are prompt (positions < this); the rest
  // are generated tokens (for presence / frequency penalties).
  int32_t num_prompt_tokens = 0;
  // When new_state and start_pos > 0 (a prefix-cache hit), the token ids at
  // positions [0, start_pos) whose K/V came from the cache, so that workers see
  // the whole history. Empty otherwise.
  std::vector<int32_t> cached_prefix_token_ids;

  bool starts() const { return new_state || fork_from != kNoSeq; }
  int32_t context_len() const { return start_pos + static_cast<int32_t>(token_ids.size()); }
  // SampledTokens this entry returns (0 when it does not sample).
  int32_t num_results() const { return sample ? num_samples + num_draft_tokens : 0; }
  bool is_prefill() const { return token_ids.size() > 1 || start_pos == 0; }
};

struct StepPlan {
  uint64_t step_id = 0;
  std::vector<SequenceStep> seqs;  // decode sequences first, then prefills
  // Block operations, applied in this order before the forward pass.
  std::vector<BlockPair> swap_out;  // device block -> CPU swap block
  std::vector<BlockPair> swap_in;   // CPU swap block -> device block
  std::vector<BlockPair> copy;      // device -> device (copy-on-write)
  // Sequences whose worker state ends: finished, aborted, failed, or preempted
  // by recompute (such a sequence comes back later with new_state). Workers
  // apply this list after the sequences of this plan (a fork reads its parent
  // first) and ignore ids they never saw or already dropped (a request aborted
  // while waiting, a sibling that finished on its first token).
  std::vector<SeqId> finished;
  bool shutdown = false;  // workers exit after acknowledging this plan

  // Tokens fed this step (prefill chunks + decode tokens). The slot mapping
  // (slot[t] = block_table[pos / block_size] * block_size + pos % block_size
  // per fed token) is derived by workers from their mirrored block tables.
  int64_t num_tokens() const {
    int64_t n = 0;
    for (const SequenceStep& s : seqs) n += static_cast<int64_t>(s.token_ids.size());
    return n;
  }
};

// One sampled token of a sequence.
struct SampledToken {
  SeqId seq_id = 0;
  int32_t token_id = 0;
  float logprob = 0.0f;                // of token_id, when requested
  std::vector<int32_t> top_token_ids;  // top-N alternatives, when requested
  std::vector<float> top_logprobs;
};

// One prompt token scored (SequenceStep::prompt_logprobs): the raw
// log-softmax of the logits at position - 1 (before any logit processor,
// as SampledToken::logprob), the token's rank there (1 + the number of
// tokens with a larger logit), and the top SamplingParams::prompt_logprobs
// tokens of that position (logprob descending, ties to the lower id).
struct PromptLogprob {
  SeqId seq_id = 0;
  int32_t position = 0;  // of the scored prompt token, >= 1
  int32_t token_id = 0;
  float logprob = 0.0f;
  int32_t rank = 0;
  std::vector<int32_t> top_token_ids;
  std::vector<float> top_logprobs;
  bool operator==(const PromptLogprob&) const = default;
};

// token_id of the SampledToken entries of a sequence that could not be
// sampled this step (StepResult::failed).
inline constexpr int32_t kNoToken = -1;

// A sequence whose logits could not be sampled this step: a row holding NaN
// or +inf, every logit -inf, or every token masked (min_tokens / bad_words,
// or the structured-output mask over tokens with a finite logit). That is
// the model's output for this one request, not a fault of the step: its
// entries in StepResult::tokens carry kNoToken, and the coordinator fails its
// request alone with `message` (its K/V is never registered in the prefix
// cache) and keeps serving the others.
struct SequenceFailure {
  SeqId seq_id = 0;
  std::string message;
  bool operator==(const SequenceFailure&) const = default;
};

// The tokens a worker's draft model proposed for an entry whose draft tokens
// were kNoToken (SequenceStep::num_draft_tokens), in position order.
struct ProposedDraft {
  SeqId seq_id = 0;
  std::vector<int32_t> token_ids;
  bool operator==(const ProposedDraft&) const = default;
};

// What TP rank 0 returns to the coordinator for a plan. For a sequence with
// num_samples = n there are n entries with the same seq_id, in sample order;
// for one with num_draft_tokens = d, d + 1 entries in position order.
struct StepResult {
  uint64_t step_id = 0;
  std::vector<SampledToken> tokens;
  double forward_seconds = 0.0;  // per-rank figures for metrics
  double collective_seconds = 0.0;
  // The prompt tokens scored this step, per sequence in position order.
  std::vector<PromptLogprob> prompt_logprobs;
  // Sampled sequences that could not be sampled (at most one entry each).
  std::vector<SequenceFailure> failed;
  // One entry per plan entry whose draft tokens the worker proposed, in plan
  // order.
  std::vector<ProposedDraft> drafts;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COMMON_STEP_PLAN_H_
