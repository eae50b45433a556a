// The coordinator's engine: one iteration = schedule (Scheduler) -> execute
// (Executor) -> process results (stop conditions, incremental detokenization,
// stop strings held back until they cannot match, usage) -> outputs for the
// front end. Single-threaded: the caller (EngineLoop::Run or the generate
// command) calls AddRequest / Abort / Step from one thread; only CheckRequest
// may be called from other threads. The engine never
// touches tensors.
//
// Text: per sample an IncrementalDetokenizer (skip_special_tokens); the token
// that ends a sample by EOS or stop_token_ids is reported in token_ids but not
// detokenized (as vLLM). Stop strings: text that could still become one is
// held back; at the first occurrence the text is cut before it and that
// sample finishes with "stop" (samples of an n > 1 request stop independently,
// Scheduler::FinishSequence). Concatenated deltas of a sample equal the
// one-shot Decode of its tokens (less a stop token) cut at the stop string.
// A request id may be reused once its final output was returned and one more
// Step ran (the scheduler releases stopped requests at the next step).
// Beam search: no deltas while the search runs; the final output holds the n
// best beams whole (SequenceDelta::cumulative_logprob / beam_score set).
// Metrics (optional): gauges and counters after every step, inter-token
// latency per token, one RequestFinished per request (steady clock).
#ifndef PAGEDSERVE_RUNTIME_ENGINE_ENGINE_H_
#define PAGEDSERVE_RUNTIME_ENGINE_ENGINE_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/common/sampling_params.h"
#include "runtime/coordinator/scheduler.h"
#include "runtime/engine/executor.h"
#include "runtime/grammar/compile.h"
#include "runtime/tokenizer/detokenizer.h"
#include "runtime/tokenizer/tokenizer.h"

namespace pagedserve {

class Metrics;

struct EngineOptions {
  SchedulerConfig scheduler;  // block counts are taken from the executor
  bool skip_special_tokens = true;
  // --require-cache-salt: every request must carry a cache_salt (multi-tenant
  // deployments, where an unsalted request would share the prefix cache with
  // every other unsalted one). Checked by CheckCacheSalt / AddRequest.
  bool require_cache_salt = false;
  // --seed (as vLLM's engine-wide seed): a request without SamplingParams::seed
  // gets one derived from this seed and the number of requests AddRequest
  // accepted before it (DefaultRequestSeed), so the same requests in the same
  // order sample the same text on every run. None: unseeded requests draw
  // nondeterministic uniforms.
  std::optional<uint64_t> default_seed;
  // --max-model-len left at 0 (vLLM's default): scheduler.max_model_len holds
  // the model's context, and Create lowers it to the longest sequence the KV
  // pool holds (SchedulerConfig::LongestSequenceInPool) when the pool is
  // smaller; max_model_len_source() says which. False: a pool smaller than one
  // max_model_len sequence is an InvalidArgument from Create.
  bool fit_max_model_len = false;
};

// The seed given to a request without one under EngineOptions::default_seed
// `engine_seed`, where `ordinal` is the number of requests (seeded or not)
// AddRequest accepted before it: SplitMix64-mixed, so neighbouring ordinals
// give unrelated streams.
uint64_t DefaultRequestSeed(uint64_t engine_seed, uint64_t ordinal);

// One of SamplingParams::bad_words as vLLM's SamplingParams.update_from_tokenizer
// tokenizes it: the word without leading spaces, encoded without special
// tokens; then " " + that text, kept when it encodes to as many tokens as the
// first and starts with another token (the form the word takes inside a
// text). A word of spaces only gives nothing. AddRequest fills
// SamplingParams::bad_words_token_ids with these.
std::vector<std::vector<int32_t>> BadWordTokenIds(std::string_view word, const Tokenizer& tok);

// Token counts since the engine was created (every step, with or without
// Metrics): the stats log line's throughputs are their differences.
struct EngineTokenCounters {
  int64_t prompt_tokens = 0;      // prompt tokens prefilled (cached ones excluded)
  int64_t generation_tokens = 0;  // output tokens given to requests (their completion tokens)
};

struct EngineRequest {
  std::string request_id;                 // unique among in-flight requests
  std::vector<int32_t> prompt_token_ids;  // already tokenized (chat templates applied)
  SamplingParams params;                  // validated by AddRequest
  int32_t priority = 0;
  // Prefix-cache isolation (runtime/common/cache_salt.h): requests with
  // different salts never share cached KV blocks. Empty = no salt. Checked by
  // AddRequest with CheckCacheSalt; a front end parses it and passes it here.
  std::string cache_salt;
  // True when params.max_tokens is the front end's default, not the client's
  // value: AddRequest (and EngineLoop::Submit) then lower it to the context's
  // room, max_model_len - prompt length (CapDefaultMaxTokens). A client's own
  // max_tokens beyond that room is refused (InvalidArgument naming
  // max_tokens), as vLLM refuses it.
  bool max_tokens_is_default = false;
};

// New output of one sequence (sample index) of a request since the last Step.
struct SequenceDelta {
  int32_t index = 0;
  std::string text;                // new text; never a broken UTF-8 sequence,
                                   // never text that may still become a stop string
  std::vector<int32_t> token_ids;  // new token ids
  std::vector<float> logprobs;     // per new token, when requested
  // Per new token, when logprobs > 0 was requested: the top-N alternatives
  // (ids and raw logprobs, best first). Empty otherwise.
  std::vector<std::vector<int32_t>> top_token_ids;
  std::vector<std::vector<float>> top_logprobs;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;  // set when finished
  // Beam search (use_beam_search): a request's only deltas come when the
  // search ends, one per returned beam (index = rank, best first), each with
  // every token, the beam's sum of raw logprobs and its score
  // cumulative_logprob / generated_len ** length_penalty. Unset otherwise.
  std::optional<double> cumulative_logprob;
  std::optional<double> beam_score;
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;  // summed over the n sequences
  int32_t cached_prompt_tokens = 0;
};

struct EngineOutput {
  std::string request_id;
  std::vector<SequenceDelta> deltas;  // only sequences with news
  bool finished = false;              // every sequence finished
  Usage usage;                        // meaningful when finished
  // SamplingParams::prompt_logprobs >= 0: in the request's first output, the
  // prompt tokens at positions 1 .. prompt_len - 1 scored (PromptLogprob),
  // in position order (the first prompt token has none). Empty otherwise.
  std::vector<PromptLogprob> prompt_logprobs;
  absl::Status error;  // non-OK when the request failed
};

class Engine {
 public:
  // `tokenizer` (not owned) must outlive the engine; `metrics` may be null.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(EngineOptions options,
                                                        const Tokenizer* tokenizer,
                                                        std::unique_ptr<Executor> executor,
                                                        std::vector<int32_t> eos_token_ids,
                                                        Metrics* metrics = nullptr);

  // Caps a default max_tokens (CapDefaultMaxTokens), validates the parameters
  // and admission bound (prompt + max_tokens vs the pool and max_model_len)
  // and queues the request. Errors: those of
  // CheckRequest, AlreadyExists (duplicate id), FailedPrecondition (the engine
  // stopped after a fatal error).
  absl::Status AddRequest(EngineRequest request);
  // Aborts a request: its blocks are freed in the next step and a final output
  // with finish_reason "abort" is produced by the next Step. NotFound if unknown.
  absl::Status Abort(const std::string& request_id);

  // When request->max_tokens_is_default: lowers params.max_tokens to
  // max(1, max_model_len - prompt length), so that a default never makes a
  // request inadmissible; the flag is cleared. No-op otherwise. Thread-safe
  // like CheckRequest.
  void CapDefaultMaxTokens(EngineRequest* request) const;

  // The checks of AddRequest without queueing anything (parameters, token ids,
  // admission bound), for a front end that answers before queueing. Errors:
  // InvalidArgument (parameters, token ids, KV admission bound), OutOfRange
  // (a prompt of max_model_len tokens or more). Thread-safe: reads only state
  // fixed at Create (tokenizer, scheduler configuration), so front-end threads
  // may call it while another thread runs Step.
  absl::Status CheckRequest(const std::vector<int32_t>& prompt_token_ids,
                            const SamplingParams& params) const;

  // The checks of a request's cache_salt: ValidateCacheSalt when non-empty;
  // InvalidArgument "cache_salt is required (--require-cache-salt)" when empty
  // and EngineOptions::require_cache_salt is set. Never echoes the salt.
  // Thread-safe like CheckRequest (reads only options fixed at Create).
  absl::Status CheckCacheSalt(std::string_view cache_salt) const;

  // True while a request is in flight or the scheduler still holds blocks of a
  // request that already finished (released by the next Step): keep stepping.
  bool HasUnfinishedRequests() const;
  // Requests added and not yet reported finished.
  int64_t num_unfinished_requests() const { return static_cast<int64_t>(requests_.size()); }
  // One iteration. An error is fatal (the executor failed): call FailAll.
  absl::StatusOr<std::vector<EngineOutput>> Step();
  // Final outputs with `error` for every in-flight request (after a fatal error
  // or at shutdown), and forgets them. After a fatal Step error the engine
  // stays stopped: AddRequest and Step return FailedPrecondition.
  std::vector<EngineOutput> FailAll(const absl::Status& error);

  SchedulerStats stats() const;
  EngineTokenCounters token_counters() const { return token_counters_; }
  const SchedulerConfig& scheduler_config() const;
  Executor& executor();
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // For tests and tooling (block-manager invariants, queue contents).
  const Scheduler& scheduler() const { return *scheduler_; }

  ~Engine();

 private:
  using Clock = std::chrono::steady_clock;
  // Structured-output constraints checked at admission (thread-safe).
  mutable grammar::ConstraintCache<const grammar::Grammar> constraint_cache_{64};
  // One sample of a request: incremental detokenization and stop strings.
  struct SeqState {
    explicit SeqState(const Tokenizer& t, DecodeOptions o) : detok(t, o) {}
    IncrementalDetokenizer detok;
    std::string text;  // text so far (stop token text excluded), truncated at a stop string
    size_t sent = 0;   // bytes of `text` already emitted
    // Stop strings are matched in `text` from max(sent, stop_from): the text
    // of the tokens before min_tokens is never matched (vLLM), also when a
    // speculative run brings several tokens in one step.
    size_t stop_from = 0;
    int32_t num_tokens = 0;
    bool finished = false;
    FinishReason finish_reason = FinishReason::kNone;
    Clock::time_point last_token;
  };
  struct RequestState {
    std::string request_id;
    SamplingParams params;
    int32_t prompt_len = 0;
    int32_t cached_tokens = 0;
    std::vector<SeqState> seqs;  // n, by sample index
    bool aborted = false;        // Abort() called; reported by the next Step
    Clock::time_point arrival, first_scheduled, first_token, last_token;
    bool scheduled = false, has_token = false;
  };

  Engine(EngineOptions options, const Tokenizer* tokenizer, std::unique_ptr<Executor> executor,
         std::unique_ptr<Scheduler> scheduler, Metrics* metrics);
  // Appends a sequence's new text to its delta, holding back a suffix that may
  // still become a stop string. Returns true when a stop string was found (the
  // text is truncated before it).
  bool EmitText(RequestState& r, SeqState& s, bool final, SequenceDelta* d);
  // True when text[from..] holds one of `stops`.
  static bool HasStopString(const std::vector<std::string>& stops, const std::string& text,
                            size_t from);
  // Marks a sequence finished: flushes its detokenizer and emits the rest.
  void FinishSeq(RequestState& r, SeqState& s, FinishReason reason, SequenceDelta* d);
  // Finishes every sample of `r` not finished yet with `reason`, one delta each
  // in `out` (finished, finish_reason = reason). `flush_text`: first flush the
  // sample's detokenizer and emit its held-back text (FinishSeq), as an abort
  // does; an error reports no more text.
  void FinishOpenSamples(RequestState& r, FinishReason reason, bool flush_text, EngineOutput* out);
  // Builds the final output of a request and records its metrics (`reason`
  // kNone: "length" when every sample ran out of tokens, else "stop").
  void Finalize(RequestState& r, EngineOutput* out, FinishReason reason);
  void RecordSchedule(const StepPlan& plan);

  // The phases of Step, in order.
  // Final outputs ("abort") of the requests aborted since the last step.
  void ReportAborted(std::vector<EngineOutput>* outputs);
  // Runs the plan on the executor, or returns an empty result (no tokens) for
  // a plan with nothing to do. An executor error stops the engine (broken_).
  absl::StatusOr<StepResult> ExecutePlan(const StepPlan& plan);
  // Applies the scheduler's output for one request: token times, the samples'
  // new tokens and text; appends the request's EngineOutput (none while a beam
  // search runs) and forgets the request once it finished or failed (a bad
  // token id fails this request alone: "error" for its open samples).
  void ApplyRequestOutput(const RequestOutput& ro, Clock::time_point now,
                          std::vector<EngineOutput>* outputs);
  // One delta per sample in `ro` not finished yet (AppendTokens, then
  // ApplyStopConditions). Internal error: a sample index outside [0, n) or a
  // token the detokenizer rejects.
  absl::Status ApplySampleOutputs(const RequestOutput& ro, RequestState& r, Clock::time_point now,
                                  EngineOutput* out);
  // Appends a sample's new tokens (ids, logprobs, inter-token latency) to `d`
  // and their text (less a stop token) to the sample's text.
  absl::Status AppendTokens(const RequestState& r, SeqState& s, const SequenceOutput& so,
                            Clock::time_point now, SequenceDelta* d);
  // Emits the new text; a stop string in it finishes the sample with "stop"
  // (and tells the scheduler, Scheduler::FinishSequence, if it would go on);
  // else a sample the scheduler finished is finished with its reason.
  absl::Status ApplyStopConditions(const std::string& request_id, RequestState& r, SeqState& s,
                                   const SequenceOutput& so, SequenceDelta* d);
  // Gauges and counters of the step (Metrics; no-op without).
  void RecordStepMetrics(const StepPlan& plan, const StepResult& result);

  EngineOptions options_;
  const Tokenizer* tokenizer_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Scheduler> scheduler_;
  StepPlan spare_plan_;  // the last step's plan: the next Schedule reuses its memory
  Metrics* metrics_;
  DecodeOptions decode_options_;
  absl::flat_hash_map<std::string, std::unique_ptr<RequestState>> requests_;
  std::vector<std::string> unscheduled_;  // request ids not yet scheduled once
  std::vector<std::string> aborted_;      // aborted, final output pending
  absl::Status broken_;                   // the fatal error that stopped the engine
  SchedulerStats last_stats_;
  EngineTokenCounters token_counters_;
  // Output tokens given to requests this step (AppendTokens): the generation
  // tokens of the step's metrics, so the counter equals the completion tokens
  // reported (not rows that failed, drafts rejected or tokens past a stop
  // string in a speculative run).
  int64_t step_generation_tokens_ = 0;
  // Prompt lengths of the requests whose first token came in this step
  // (vllm:prompt_tokens_total); taken by RecordStepMetrics.
  int64_t first_token_prompt_tokens_ = 0;
  uint64_t requests_accepted_ = 0;  // AddRequest successes, for DefaultRequestSeed
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_ENGINE_ENGINE_H_
