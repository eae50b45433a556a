// The continuous-batching scheduler (iteration-level scheduling, Orca OSDI'22;
// block-level KV memory management, vLLM SOSP'23).
//
// Every engine step the caller does, strictly alternating:
//   StepPlan plan = Schedule();            // which sequences run, block ops
//   ... workers run the plan, TP rank 0 samples ...
//   outputs = ProcessResult(result);       // append tokens, stop conditions
//
// Schedule():
//   1. applies pending aborts / finishes (their sequences go into plan.finished
//      and every block they hold is freed);
//   2. walks the running requests oldest first (by (priority, arrival) when
//      priority scheduling is on). Decode tokens are reserved first; prompt
//      chunks (chunked prefill) take what the token budget
//      max_num_batched_tokens has left. When the device pool cannot hold a
//      request's new slots, the most recently arrived running request is
//      preempted (vLLM's victim policy), possibly the request itself: by swap
//      (its blocks go to the CPU pool) or by recompute (its blocks are freed,
//      its sequence ids go into plan.finished so that workers drop their
//      state, and prompt + generated tokens are prefilled again); swap falls
//      back to recompute when the CPU pool lacks room;
//   3. when nothing was preempted or left unscheduled: swaps in swapped
//      requests (oldest first), then, once none is swapped, admits waiting
//      requests (oldest first, head-of-line: the first that does not fit stops
//      admission, so no request waits forever) while max_num_seqs, the token
//      budget and the device pool (keeping the watermark free) allow;
//   4. builds the plan, decodes first: each sequence's entry carries only what
//      changed since its previous plan (runtime/common/step_plan.h), so the
//      cost of a step grows with new work, not with the running sequences'
//      block tables and sampling parameters.
//
// Admission bound (AddRequest, and CheckAdmissible for the front end): a
// request is accepted when prompt_len + max_tokens <= max_model_len (vLLM's
// rule; a front end lowers a max_tokens the client did not send to the room
// first, Engine::CapDefaultMaxTokens) and
//   n * ceil((prompt_len + max_tokens) / block_size)
//     <= num_device_blocks - watermark_blocks,
// and n <= max_num_seqs (n = the beam width for beam search). The same bound makes every accepted
// request schedulable alone, so the queue always moves.
//
// Stop conditions (ProcessResult): EOS (unless ignore_eos) and
// stop_token_ids -> "stop"; max_tokens (or max_model_len, a guard the
// admission bound leaves unreachable) -> "length". A request gets exactly
// max_tokens tokens unless a stop condition fires. Stop strings are checked by the
// caller after detokenizing, which then calls FinishRequest(id, kStop).
//
// Beam search (SamplingParams::use_beam_search; runtime/coordinator/beam_search.h):
// the prompt is prefilled once; after every step in which the live beams
// sampled (workers return each beam's top 2 * beam_width raw logprobs),
// ApplyTokens runs one BeamSearch::Step for the request: a chosen parent is
// extended in place by its best chosen token and forked (BlockManager::Fork:
// full blocks shared, the last partial block copied on write by the next
// AppendSlots) for its other chosen tokens; beams not chosen are freed at once
// and their ids listed in the next plan's `finished` (after the forks that
// read their parents). Every beam of a request is scheduled, preempted (swap
// or recompute), swapped in and admitted together, and their sampling steps
// stay aligned: a beam whose recomputed prompt would complete while another
// beam's would not keeps its last token for a later step. Nothing is streamed
// while the search runs; the final output carries the n best hypotheses
// (index = rank) with every token, cumulative_logprob and beam_score.
//
// Speculative decoding (SchedulerConfig::speculative; runtime/coordinator/
// speculative.h says why it is exact): in ScheduleRunning, after a running
// group's tokens are planned and any preemption is done, every sequence of it
// in decode (not beam search, not an n > 1 parent before its fork) asks the
// proposer for up to min(spec_k, tokens the budget has left after the
// reserved decodes, max_tokens and max_model_len room - 1) draft tokens; the
// drafts are kept only when the device pool has their blocks without
// preempting anything (else the group decodes one token). The step feeds
// [last token, drafts] (the budget counts every one) and ProcessResult keeps
// the longest prefix of the draft equal to the target's samples plus the
// target's next sample; EOS, stop tokens, max_tokens and max_model_len cut
// the run where they fire. Then the sequence's blocks past its verified
// tokens are freed (BlockManager::TrimToComputed).
// Per-sequence k (spec_k): starts at num_speculative_tokens; after a
// verification step with draft length d and a accepted, k = min(k_max, k+1)
// when a == d, else max(1, a + 1). Back-off under load: no sequence drafts in
// a step whose running sequences (as max_num_seqs counts them) number at
// least disable_by_batch_size (when > 0). Swapped-in and newly admitted
// groups draft from their next step on. Beam search never speculates.
//
// Not thread-safe: one engine thread owns the scheduler.
#ifndef PAGEDSERVE_RUNTIME_COORDINATOR_SCHEDULER_H_
#define PAGEDSERVE_RUNTIME_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/common/sampling_params.h"
#include "runtime/common/step_plan.h"
#include "runtime/coordinator/block_manager.h"
#include "runtime/coordinator/sequence.h"
#include "runtime/coordinator/speculative.h"

namespace pagedserve {

enum class PreemptionMode { kRecompute, kSwap };

// "swap" / "recompute" (the --preemption-mode values).
absl::StatusOr<PreemptionMode> ParsePreemptionMode(std::string_view s);

struct SchedulerConfig {
  int32_t block_size = 16;                // tokens per KV block
  int32_t num_device_blocks = 0;          // KV blocks on the device (min over ranks)
  int32_t num_cpu_blocks = 0;             // swap-space blocks on the host
  int32_t max_num_seqs = 256;             // sequences per step
  int32_t max_num_batched_tokens = 2048;  // tokens per step
  int32_t max_model_len = 2048;           // prompt + output tokens per sequence
  bool enable_chunked_prefill = true;
  bool enable_prefix_caching = false;
  bool enable_priority = false;  // order by (priority, arrival) instead of arrival
  // A step with requests waiting admits them alone: their prefills (chunks)
  // and no decode of the running requests, which wait one step (vLLM V0's
  // order without chunked prefill; SGLang's prefill batches). Lower TTFT for
  // requests arriving while others generate, at a higher TPOT for those. When
  // no waiting request can be admitted (no blocks, --max-num-seqs, requests
  // swapped out first) the step is the usual decode-first one. Off by default.
  bool prefill_first = false;
  PreemptionMode preemption_mode = PreemptionMode::kRecompute;
  double watermark = 0.01;  // fraction of device blocks kept free at admission
  BlockHashFn hash_fn;      // prefix-cache hash; empty = SHA-256
  // Speculative decoding (--speculative-config; see "Speculative decoding"
  // above). Off by default.
  SpeculativeConfig speculative;
  // > 0 when every layer of the model attends to the last sliding_window
  // positions only (ModelConfig): the block manager frees the blocks that fall
  // wholly out of the window (BlockManager::Options::sliding_window), and with
  // chunked prefill a sequence never holds more than MaxBlocksPerSequence.
  int32_t sliding_window = 0;

  // The startup check: InvalidArgument naming the flag when a setting is out
  // of range or when some admissible request could never be scheduled
  // (chunked prefill off and max_num_batched_tokens < max_model_len; a device
  // pool, less watermark, smaller than one max_model_len sequence;
  // max_num_batched_tokens < max_num_seqs).
  absl::Status Validate() const;

  // The longest sequence, in tokens, whose blocks fit in the device pool less
  // the watermark: (num_device_blocks - floor(watermark * num_device_blocks)) *
  // block_size; 0 or less when the pool is empty. Validate() refuses a
  // max_model_len above it; vLLM's default max_model_len is the model's context
  // lowered to it (EngineOptions::fit_max_model_len).
  // With chunked prefill and a sliding window the pool holds sequences of
  // any length once it holds the window's blocks: then
  // std::numeric_limits<int32_t>::max().
  int64_t LongestSequenceInPool() const;

  // The most device blocks one sequence of `num_tokens` tokens holds at once:
  // ceil(num_tokens / block_size); with a sliding window and chunked prefill
  // at most ceil((sliding_window - 1 + max_num_batched_tokens) / block_size)
  // + 1 (the window before a step's first token, the step's tokens, and one
  // block of misalignment), since the blocks before the window are freed
  // after every step. Admission and Validate() count with it.
  int64_t MaxBlocksPerSequence(int64_t num_tokens) const;
};

// What a client sends, in token ids (the front end tokenizes).
struct Request {
  std::string request_id;
  std::vector<int32_t> prompt_token_ids;
  SamplingParams params;
  double arrival_time = 0.0;              // seconds, any monotonic clock
  int32_t priority = 0;                   // lower = more important; used when enable_priority
  std::vector<int64_t> cache_extra_keys;  // prefix-cache salt (e.g. adapter id)
};

// New tokens of one sequence of a request in one step.
struct SequenceOutput {
  int32_t index = 0;                                // sample index 0..n-1
  absl::InlinedVector<SampledToken, 1> new_tokens;  // one per step
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  int32_t stop_token_id = -1;     // for kStop by EOS / stop_token_ids
  int32_t num_output_tokens = 0;  // generated so far, for usage
  // Beam search: set on the final outputs (index = rank, best first; new_tokens
  // = the whole hypothesis), the hypothesis' sum of raw logprobs and its score.
  std::optional<double> cumulative_logprob;
  std::optional<double> beam_score;
};

struct RequestOutput {
  std::string request_id;
  absl::InlinedVector<SequenceOutput, 1> seqs;  // the sequences that produced a token
  bool finished = false;                        // every sequence finished
  int32_t num_prompt_tokens = 0;
  int32_t num_cached_tokens = 0;  // prompt tokens served by the prefix cache (first step)
  // SamplingParams::prompt_logprobs >= 0: on the request's first output (its
  // first sampled token), the prompt tokens at positions 1 .. num_prompt_tokens
  // - 1 scored (PromptLogprob), in position order. Empty otherwise.
  std::vector<PromptLogprob> prompt_logprobs;
  // Not empty: the request failed this step (StepResult::failed: its logits
  // could not be sampled); finished is true and seqs holds no tokens of the
  // failed sequence. Its blocks are released at the next Schedule().
  std::string error;
};

struct SchedulerStats {
  int32_t num_running = 0;  // requests
  int32_t num_waiting = 0;
  int32_t num_swapped = 0;
  double device_kv_usage = 0.0;  // in-use device blocks / total
  double cpu_kv_usage = 0.0;
  // Prefix-cache lookups of requests' first admissions, in tokens (a request
  // re-admitted after a recompute preemption is not counted again).
  int64_t prefix_cache_queries = 0;  // tokens
  int64_t prefix_cache_hits = 0;     // tokens
  int64_t num_preemptions_swap = 0;
  int64_t num_preemptions_recompute = 0;
  int64_t num_swap_fallbacks = 0;  // swap wanted, CPU pool full, recomputed
  int64_t num_steps = 0;
  int32_t last_step_tokens = 0;
  int32_t last_step_seqs = 0;
  // Speculative decoding (vLLM's spec-decode counters): verification
  // entries (a sequence with >= 1 draft token in a step), draft tokens
  // proposed, draft tokens accepted, tokens emitted by those entries
  // (accepted + the target's next token, less any cut by a stop condition),
  // and accepted drafts by position (index j: the draft's (j+1)-th token was
  // accepted; num_speculative_tokens entries).
  int64_t spec_num_drafts = 0;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  int64_t spec_emitted_tokens = 0;
  std::vector<int64_t> spec_accepted_per_pos;
};

class Scheduler {
 public:
  // Checks config.Validate(); eos_token_ids end a sequence unless ignore_eos.
  static absl::StatusOr<std::unique_ptr<Scheduler>> Create(const SchedulerConfig& config,
                                                           std::vector<int32_t> eos_token_ids);

  // Queues a request. InvalidArgument (naming the field and the bound) for bad
  // sampling params, an empty prompt, or a request over the admission bound;
  // AlreadyExists for a request id in use. The rejected request holds nothing.
  absl::Status AddRequest(Request request);
  // The admission bound alone (for validation in the front end).
  absl::Status CheckAdmissible(int64_t prompt_len, const SamplingParams& params) const;

  // Aborts (client request or disconnect) / finishes (stop string found by the
  // caller, reason kStop) a request. Applied at the next Schedule(): every
  // block is freed and its sequences are listed in plan.finished. Outputs for
  // it are no longer produced. NotFound for an unknown or finished id.
  absl::Status Abort(const std::string& request_id);
  absl::Status FinishRequest(const std::string& request_id, FinishReason reason);
  // Finishes one sequence (sample `index`) of a request while its siblings go
  // on, e.g. a stop string found by the caller in that sample's text (n > 1
  // samples stop independently). Call between ProcessResult and the next
  // Schedule: the sequence's blocks are freed at once and it is listed in
  // plan.finished when the whole request ends; when it was the request's last
  // unfinished sequence the request finishes as with FinishRequest. A sequence
  // already finished is left as it is. NotFound for an unknown request or
  // index; FailedPrecondition while a step is in flight.
  absl::Status FinishSequence(const std::string& request_id, int32_t index, FinishReason reason);

  // Plans the next step. FailedPrecondition when the previous plan's result
  // was not processed yet. An empty plan (no seqs) is valid: nothing to run.
  absl::StatusOr<StepPlan> Schedule();
  // The same, building the plan in `recycled`'s memory: pass back a plan an
  // earlier Schedule returned, once the step it describes is done, so that a
  // step allocates nothing per sequence (the plan's vectors, each entry's
  // token_ids and block_table keep their capacity). Only memory is reused:
  // the result equals what Schedule() returns (the per-sequence constants of
  // a continuing entry are left at their defaults). On error `recycled` is
  // dropped.
  absl::StatusOr<StepPlan> Schedule(StepPlan recycled);

  // Applies the sampled tokens of the plan in flight. InvalidArgument (state
  // unchanged) when the step id or the set of tokens does not match the plan.
  absl::StatusOr<std::vector<RequestOutput>> ProcessResult(const StepResult& result);

  bool HasUnfinishedRequests() const { return !groups_.empty(); }
  bool step_in_flight() const { return in_flight_; }
  SchedulerStats stats() const;
  const SchedulerConfig& config() const { return config_; }
  const BlockManager& block_manager() const { return *bm_; }
  // Block-manager invariants plus the scheduler's own (queue membership,
  // block tables covering the computed tokens). For tests.
  absl::Status CheckInvariants() const;
  // The request's sequences (nullptr if unknown). For tests and tooling.
  const SequenceGroup* FindRequest(const std::string& request_id) const;
  // Requests holding device blocks, oldest first. For tests and tooling.
  const std::vector<SequenceGroup*>& running_requests() const { return running_; }

 private:
  using Key = std::tuple<int32_t, double, uint64_t>;
  struct KeyLess {
    bool operator()(const SequenceGroup* a, const SequenceGroup* b) const;
  };
  // One sequence of the plan in flight.
  struct Scheduled {
    Sequence* seq;
    SequenceGroup* group;
    int32_t num_tokens;
    int32_t num_samples;    // 0: no sampling this step
    int32_t group_ordinal;  // 0.. per group committed this step (its output slot)
    int32_t num_draft = 0;  // draft tokens among num_tokens (seq->draft)
    // SampledTokens this entry expects in the result.
    int32_t num_results() const { return num_samples == 0 ? 0 : num_samples + num_draft; }
  };
  // The tokens each unfinished sequence of one group feeds this step
  // (PlanTokens -> Commit). Reused across groups and steps.
  struct GroupPlan {
    std::vector<Sequence*> seqs;
    std::vector<int32_t> ks;           // tokens fed, per sequence
    std::vector<int32_t> prefix_hits;  // prefix-cache hit in tokens, -1 when not looked up
    std::vector<int32_t> drafts;       // draft tokens among ks, per sequence
    bool incomplete = false;           // some prompt chunk got less than it needs
  };
  // Where scheduled_[i]'s k-th sampled token is in a StepResult.
  struct ResultIndex {
    bool in_order = true;                                     // tokens in plan order: first[i] + k
    std::vector<int32_t> first;                               // per scheduled_ entry
    absl::flat_hash_map<SeqId, std::vector<int32_t>> by_seq;  // otherwise
    // Per scheduled_ entry: its StepResult::drafts entry (a draft model's
    // proposal for its placeholders), -1 for none.
    std::vector<int32_t> draft_of;
  };

  Scheduler(const SchedulerConfig& config, std::vector<int32_t> eos_token_ids);

  void ApplyPendingFinishes(StepPlan* plan);
  void ReleaseGroup(SequenceGroup* g, std::vector<SeqId>* finished_ids);

  // Schedule() phases, in order. ScheduleRunning returns true when it
  // preempted or left a prompt chunk unscheduled (then nothing else is
  // admitted); ScheduleSwapped returns false when it stopped with a chunk
  // unscheduled (then no waiting request is admitted).
  bool ScheduleRunning(StepPlan* plan, int32_t* budget);
  bool ScheduleSwapped(StepPlan* plan, int32_t* budget, int32_t* running_seqs);
  void AdmitWaiting(StepPlan* plan, int32_t* budget, int32_t* running_seqs);
  void BuildPlan(StepPlan* plan);
  // Overwrites `st` (default-constructed or recycled) with the incremental
  // SequenceStep of one scheduled sequence (step_plan.h).
  void FillSequenceStep(const Scheduled& e, SequenceStep& st);

  // Tokens each unfinished sequence of g feeds this step, given `avail`
  // tokens for prompt chunks; prefix-cache matching happens here.
  void PlanTokens(SequenceGroup* g, int32_t avail, GroupPlan* gp);
  // Beam search: when some beam would not sample this step, none does (the
  // others feed one token less), so every beam step sees every live beam.
  void AlignBeams(const SequenceGroup* g, GroupPlan* gp) const;
  // Appends the planned slots (copy-on-write copies go to plan->copy) and
  // lists the sequences in scheduled_. Returns the tokens taken from the budget.
  int32_t Commit(SequenceGroup* g, const GroupPlan& gp, StepPlan* plan);
  // ScheduleRunning's shortcut for the common case, a group of one sequence
  // in decode: PlanTokens + Commit for it when its slot fits in the device
  // pool (then true, one token taken). False, changing nothing, otherwise:
  // the general path plans the group (and preempts when the pool is full).
  // `spare`: budget tokens it may use for draft tokens. Returns the tokens
  // taken (1 + drafts) or 0 when it did not commit.
  int32_t CommitLoneDecode(SequenceGroup* g, int32_t spare, StepPlan* plan);
  // Speculative decoding: whether g's decoding sequences may draft now, and
  // s's draft (into s->draft) of at most `spare` tokens; returns its length.
  bool MaySpeculate(const SequenceGroup* g) const;
  int32_t ProposeDraft(const SequenceGroup* g, Sequence* s, int32_t spare);
  // Adds drafts to the decoding sequences of a planned group within `spare`
  // budget tokens, dropping them all when the device pool lacks their blocks.
  void AddDrafts(const SequenceGroup* g, int32_t spare, GroupPlan* gp);
  // After a verification step: the accepted length (stats, spec_k) of s.
  int32_t VerifyDraft(const StepResult& result, size_t i, Sequence* s);
  void Preempt(SequenceGroup* g, StepPlan* plan);
  void InsertRunning(SequenceGroup* g);
  int32_t DecodeCount(const SequenceGroup* g) const;
  int32_t RunningSeqs() const;

  // ProcessResult() phases, in order: validate (and index) the result, apply
  // the tokens (forking siblings after an n > 1 prefill), release finished.
  absl::Status IndexResult(const StepResult& result);
  const SampledToken& TokenOf(const StepResult& result, size_t i, int32_t k) const;
  // The entry of result.failed for seq_id; nullptr when it sampled.
  static const SequenceFailure* FailureOf(const StepResult& result, SeqId seq_id);
  // Fails scheduled entry e's group (a sequence of it could not be sampled):
  // its output is finished with the failure's message, its finish pending.
  void FailGroup(SequenceGroup* g, const Scheduled& e, const SequenceFailure& f,
                 std::vector<RequestOutput>* outputs);
  // The index in *outputs of scheduled entry e's group output, appended on
  // first use this step (a group split between decodes and prefills shows
  // up twice in scheduled_ and gets one output).
  int32_t OutputSlot(const Scheduled& e, std::vector<RequestOutput>* outputs);
  // The group of a sequence scheduled this step that scores its prompt
  // (prompt logprobs not yet delivered); nullptr otherwise.
  SequenceGroup* PromptGroup(SeqId seq_id) const;
  void ApplyTokens(const StepResult& result, std::vector<RequestOutput>* outputs);
  // Forks `count` siblings of parent (sample indices 1..count) sharing its
  // blocks; returns the index in g->seqs of the first.
  size_t ForkSiblings(SequenceGroup* g, const Sequence& parent, int32_t count);
  // Appends t to s, checks its stop conditions, adds its output; true when s finished.
  bool Emit(SequenceGroup* g, Sequence* s, const SampledToken& t, RequestOutput* out);
  // Emit for a verification step: the target's tokens 0..accepted of
  // scheduled_[i] in one output, cut at the first stop condition;
  // num_computed_tokens already counts the accepted drafts (len + accepted);
  // a run cut early lowers it to the tokens fed before the cut.
  bool EmitRun(SequenceGroup* g, Sequence* s, const StepResult& result, size_t i,
               RequestOutput* out);
  // After a verification step's tokens are in s->tokens: blocks past the
  // verified tokens freed, full verified blocks offered to the prefix cache.
  void SettleVerified(Sequence* s);
  // One beam-search step of g from its beams' sampled tokens (beam_step_ of
  // this group): extends, forks and drops beams; on the last step marks every
  // beam finished and writes the n results into *out.
  void BeamStep(SequenceGroup* g,
                std::span<const std::pair<Sequence*, const SampledToken*>> sampled,
                RequestOutput* out);
  bool IsStopToken(const SamplingParams& p, int32_t token) const;
  void ReleaseFinished(std::vector<RequestOutput>* outputs);
  void CheckStop(Sequence* s, const SamplingParams& p);

  SchedulerConfig config_;
  absl::flat_hash_set<int32_t> eos_;
  std::unique_ptr<BlockManager> bm_;
  absl::flat_hash_map<std::string, std::unique_ptr<SequenceGroup>> groups_;
  std::vector<SequenceGroup*> running_;  // sorted by key, oldest first
  std::set<SequenceGroup*, KeyLess> waiting_;
  std::set<SequenceGroup*, KeyLess> swapped_;
  std::vector<SeqId> pending_finished_ids_;
  std::vector<Scheduled> scheduled_;  // the plan in flight
  int32_t num_step_groups_ = 0;       // groups committed to the plan in flight
  // Per-step scratch, kept to reuse its memory.
  GroupPlan group_plan_;
  std::vector<int32_t> decode_counts_;         // per running_ entry (ScheduleRunning)
  ResultIndex result_index_;                   // ProcessResult
  std::vector<int32_t> output_slots_;          // group ordinal -> output index, -1 none
  std::vector<SequenceGroup*> output_groups_;  // per output
  std::vector<int32_t> finishing_outputs_;     // outputs where a sequence finished this step
  // Beam search: this step's sampled (beam, token) pairs, by output slot.
  std::vector<std::vector<std::pair<Sequence*, const SampledToken*>>> beam_samples_;
  int32_t num_pending_finishes_ = 0;
  std::unique_ptr<Proposer> proposer_;  // null: speculation off
  bool spec_step_ = false;              // this step may draft (the batch-size back-off)
  bool in_flight_ = false;
  uint64_t step_id_ = 0;
  uint64_t next_seq_id_ = 0;
  uint64_t arrival_counter_ = 0;
  SchedulerStats counters_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COORDINATOR_SCHEDULER_H_
