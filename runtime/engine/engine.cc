#include "runtime/engine/engine.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/common/cache_salt.h"
#include "runtime/common/field_error.h"
#include "runtime/engine/engine_metrics.h"
#include "spdlog/spdlog.h"

namespace pagedserve {
namespace {

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

int32_t ClampBlocks(int64_t n) {
  return static_cast<int32_t>(std::clamp<int64_t>(n, 0, std::numeric_limits<int32_t>::max()));
}

// Longest suffix of text[from, end) that is a proper prefix of some stop string.
size_t StopPrefixHold(const std::string& text, size_t from, const std::vector<std::string>& stops) {
  const size_t end = text.size();
  size_t hold = 0;
  for (const std::string& stop : stops) {
    const size_t max_k = std::min(stop.size() - 1, end - from);
    for (size_t k = max_k; k > hold; --k) {
      if (text.compare(end - k, k, stop, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

// Whether the plan gives the executor anything to do (sequences to run, blocks
// to free, swap or copy); an empty plan is not sent.
bool PlanHasWork(const StepPlan& plan) {
  return !plan.seqs.empty() || !plan.finished.empty() || !plan.swap_out.empty() ||
         !plan.swap_in.empty() || !plan.copy.empty();
}

// A fatal error of step `step_id`: the code of `s`, its message prefixed with the step.
absl::Status StepError(uint64_t step_id, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat("step ", step_id, ": ", s.message()));
}

}  // namespace

Engine::Engine(EngineOptions options, const Tokenizer* tokenizer,
               std::unique_ptr<Executor> executor, std::unique_ptr<Scheduler> scheduler,
               Metrics* metrics)
    : options_(std::move(options)),
      tokenizer_(tokenizer),
      executor_(std::move(executor)),
      scheduler_(std::move(scheduler)),
      metrics_(metrics) {
  decode_options_.skip_special_tokens = options_.skip_special_tokens;
  options_.scheduler = scheduler_->config();
  last_stats_ = scheduler_->stats();
}

Engine::~Engine() = default;

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(EngineOptions options,
                                                       const Tokenizer* tokenizer,
                                                       std::unique_ptr<Executor> executor,
                                                       std::vector<int32_t> eos_token_ids,
                                                       Metrics* metrics) {
  if (tokenizer == nullptr) return absl::InvalidArgumentError("Engine::Create: tokenizer is null");
  if (executor == nullptr) return absl::InvalidArgumentError("Engine::Create: executor is null");
  SchedulerConfig config = options.scheduler;
  config.num_device_blocks = ClampBlocks(executor->num_device_blocks());
  config.num_cpu_blocks = ClampBlocks(executor->num_cpu_blocks());
  if (options.fit_max_model_len) {
    // vLLM's default: the model's context, or the longest sequence the pool
    // holds when that is shorter (a pool under 2 tokens stays an error).
    const int64_t fit = config.LongestSequenceInPool();
    if (fit >= 2 && fit < config.max_model_len) config.max_model_len = static_cast<int32_t>(fit);
  }
  absl::StatusOr<std::unique_ptr<Scheduler>> scheduler =
      Scheduler::Create(config, std::move(eos_token_ids));
  if (!scheduler.ok()) return scheduler.status();
  return std::unique_ptr<Engine>(new Engine(std::move(options), tokenizer, std::move(executor),
                                            *std::move(scheduler), metrics));
}

void Engine::CapDefaultMaxTokens(EngineRequest* request) const {
  if (!request->max_tokens_is_default) return;
  request->max_tokens_is_default = false;
  const int64_t room = static_cast<int64_t>(scheduler_->config().max_model_len) -
                       static_cast<int64_t>(request->prompt_token_ids.size());
  int& max_tokens = request->params.max_tokens;
  max_tokens = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(max_tokens, room)));
}

absl::Status Engine::CheckRequest(const std::vector<int32_t>& prompt_token_ids,
                                  const SamplingParams& params) const {
  if (absl::Status s = params.Validate(); !s.ok()) return s;
  if (params.structured_output.active()) {
    // Compiled here once (cached) so that a constraint the grammar engine
    // refuses is a 400 naming it, never an unconstrained answer.
    auto compiled =
        constraint_cache_.GetOrCreate(params.structured_output, grammar::CompileConstraint);
    if (!compiled.ok()) return FieldError("structured_output", compiled.status().message());
  }
  if (prompt_token_ids.empty()) return FieldError("prompt", "prompt_token_ids must not be empty");
  const int32_t vocab = tokenizer_->vocab_size();
  for (size_t i = 0; i < prompt_token_ids.size(); ++i) {
    if (prompt_token_ids[i] < 0 || prompt_token_ids[i] >= vocab) {
      return FieldError("prompt", absl::StrCat("prompt_token_ids[", i, "] = ", prompt_token_ids[i],
                                               " is outside the vocabulary [0, ", vocab, ")"));
    }
  }
  const int64_t max_len = scheduler_->config().max_model_len;
  if (static_cast<int64_t>(prompt_token_ids.size()) >= max_len) {
    return FieldError(
        "prompt",
        absl::StrCat("prompt has ", prompt_token_ids.size(), " tokens but max_model_len is ",
                     max_len, ": at most ", max_len - 1, " prompt tokens are allowed"),
        absl::StatusCode::kOutOfRange);
  }
  return scheduler_->CheckAdmissible(static_cast<int64_t>(prompt_token_ids.size()), params);
}

absl::Status Engine::CheckCacheSalt(std::string_view cache_salt) const {
  if (cache_salt.empty()) {
    if (options_.require_cache_salt) {
      return FieldError(
          "cache_salt",
          "cache_salt is required: this server runs with --require-cache-salt (one salt per tenant)");
    }
    return absl::OkStatus();
  }
  return ValidateCacheSalt(cache_salt);
}

std::vector<std::vector<int32_t>> BadWordTokenIds(std::string_view word, const Tokenizer& tok) {
  std::vector<std::vector<int32_t>> out;
  const size_t first = word.find_first_not_of(' ');
  if (first == std::string_view::npos) return out;
  const std::string text(word.substr(first));
  EncodeOptions eo;
  eo.add_special_tokens = false;
  std::vector<int32_t> plain = tok.Encode(text, eo);
  if (plain.empty()) return out;
  std::vector<int32_t> spaced = tok.Encode(" " + text, eo);
  const bool add_spaced = spaced.size() == plain.size() && spaced.front() != plain.front();
  out.push_back(std::move(plain));
  if (add_spaced) out.push_back(std::move(spaced));
  return out;
}

uint64_t DefaultRequestSeed(uint64_t engine_seed, uint64_t ordinal) {
  // SplitMix64's finalizer over the seed, then over the ordinal mixed in.
  auto mix = [](uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  };
  return mix(mix(engine_seed) ^ ordinal);
}

absl::Status Engine::AddRequest(EngineRequest request) {
  if (request.request_id.empty()) return absl::InvalidArgumentError("request_id must not be empty");
  if (requests_.contains(request.request_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id '", request.request_id, "' is already in use"));
  }
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the engine stopped after a fatal error: ", broken_.message()));
  }
  CapDefaultMaxTokens(&request);
  if (absl::Status s = CheckRequest(request.prompt_token_ids, request.params); !s.ok()) return s;
  if (absl::Status s = CheckCacheSalt(request.cache_salt); !s.ok()) return s;

  request.params.bad_words_token_ids.clear();
  for (const std::string& word : request.params.bad_words) {
    for (std::vector<int32_t>& ids : BadWordTokenIds(word, *tokenizer_))
      request.params.bad_words_token_ids.push_back(std::move(ids));
  }

  const uint64_t ordinal = requests_accepted_;
  if (!request.params.seed && options_.default_seed) {
    request.params.seed = DefaultRequestSeed(*options_.default_seed, ordinal);
  }
  auto r = std::make_unique<RequestState>();
  r->request_id = request.request_id;
  r->params = request.params;
  r->prompt_len = static_cast<int32_t>(request.prompt_token_ids.size());
  r->arrival = Clock::now();
  r->seqs.reserve(request.params.n);
  DecodeOptions decode = decode_options_;
  if (request.params.skip_special_tokens.has_value())
    decode.skip_special_tokens = *request.params.skip_special_tokens;
  for (int i = 0; i < request.params.n; ++i) r->seqs.emplace_back(*tokenizer_, decode);

  Request sr;
  sr.request_id = request.request_id;
  sr.prompt_token_ids = std::move(request.prompt_token_ids);
  sr.params = std::move(request.params);
  sr.arrival_time = Seconds(r->arrival.time_since_epoch());
  sr.priority = request.priority;
  sr.cache_extra_keys = CacheSaltKeys(request.cache_salt);
  if (absl::Status s = scheduler_->AddRequest(std::move(sr)); !s.ok()) return s;

  requests_accepted_ = ordinal + 1;
  unscheduled_.push_back(r->request_id);
  requests_.emplace(r->request_id, std::move(r));
  return absl::OkStatus();
}

absl::Status Engine::Abort(const std::string& request_id) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) {
    return absl::NotFoundError(absl::StrCat("no unfinished request '", request_id, "'"));
  }
  RequestState& r = *it->second;
  if (r.aborted) return absl::OkStatus();
  r.aborted = true;
  aborted_.push_back(request_id);
  // NotFound here would mean the scheduler already forgot it; the final
  // output is produced by the next Step either way.
  scheduler_->Abort(request_id).IgnoreError();
  return absl::OkStatus();
}

bool Engine::HasUnfinishedRequests() const {
  // A sequence ended by a stop string is reported finished at once, but the
  // scheduler frees its blocks only in the next Schedule(): that step must run.
  // After a fatal error nothing can run any more.
  return !requests_.empty() || (broken_.ok() && scheduler_->HasUnfinishedRequests());
}

SchedulerStats Engine::stats() const { return scheduler_->stats(); }

const SchedulerConfig& Engine::scheduler_config() const { return scheduler_->config(); }

Executor& Engine::executor() { return *executor_; }

bool Engine::HasStopString(const std::vector<std::string>& stops, const std::string& text,
                           size_t from) {
  for (const std::string& stop : stops) {
    if (text.find(stop, from) != std::string::npos) return true;
  }
  return false;
}

bool Engine::EmitText(RequestState& r, SeqState& s, bool final, SequenceDelta* d) {
  // Before min_tokens output tokens no stop string ends the sample, and the
  // text is released as it comes (vLLM: such a stop string is never matched).
  static const std::vector<std::string> kNoStops;
  const std::vector<std::string>& stops =
      s.num_tokens < r.params.min_tokens ? kNoStops : r.params.stop;
  bool found = false;
  if (!stops.empty()) {
    // Text before `sent` cannot hold the start of a stop string: such a
    // start would have been held back.
    size_t best = std::string::npos, best_len = 0;
    for (const std::string& stop : stops) {
      const size_t pos = s.text.find(stop, std::max(s.sent, s.stop_from));
      if (pos < best) {
        best = pos;
        best_len = stop.size();
      }
    }
    if (best != std::string::npos) {
      s.text.resize(r.params.include_stop_str_in_output ? best + best_len : best);
      found = true;
    }
  }
  size_t end = s.text.size();
  if (!found && !final && !stops.empty())
    end -= StopPrefixHold(s.text, std::max(s.sent, s.stop_from), stops);
  if (end > s.sent) {
    d->text.append(s.text, s.sent, end - s.sent);
    s.sent = end;
  }
  return found;
}

void Engine::FinishSeq(RequestState& r, SeqState& s, FinishReason reason, SequenceDelta* d) {
  if (s.finished) return;
  s.finished = true;
  s.finish_reason = reason;
  // Flush the detokenizer; the flushed bytes may still complete a stop string.
  s.text += s.detok.Finish();
  if (EmitText(r, s, /*final=*/true, d)) s.finish_reason = FinishReason::kStop;
  d->finished = true;
  d->finish_reason = s.finish_reason;
}

void Engine::Finalize(RequestState& r, EngineOutput* out, FinishReason metrics_reason) {
  out->finished = true;
  out->usage.prompt_tokens = r.prompt_len;
  out->usage.cached_prompt_tokens = r.cached_tokens;
  out->usage.completion_tokens = 0;
  int64_t longest = 0;
  for (const SeqState& s : r.seqs) {
    out->usage.completion_tokens += s.num_tokens;
    longest = std::max<int64_t>(longest, s.num_tokens);
  }

  FinishReason reason = metrics_reason;
  if (reason == FinishReason::kNone) {
    // One figure per request: "length" when every sample ran out of tokens,
    // else "stop".
    reason = FinishReason::kLength;
    for (const SeqState& s : r.seqs) {
      if (s.finish_reason != FinishReason::kLength) reason = FinishReason::kStop;
    }
  }
  const Clock::time_point now = Clock::now();
  engine_metrics::RequestFigures f;
  f.reason = FinishReasonName(reason);
  f.e2e_s = Seconds(now - r.arrival);
  if (r.scheduled) f.queue_s = Seconds(r.first_scheduled - r.arrival);
  if (r.has_token) {
    f.ttft_s = Seconds(r.first_token - r.arrival);
    f.prefill_s = r.scheduled ? Seconds(r.first_token - r.first_scheduled) : -1;
    f.decode_s = Seconds(r.last_token - r.first_token);
  }
  f.prompt_len = r.prompt_len;
  f.generation_len = out->usage.completion_tokens;
  f.max_generation_len = longest;
  engine_metrics::RecordFinished(metrics_, f);
}

void Engine::RecordSchedule(const StepPlan& plan) {
  if (unscheduled_.empty()) return;
  const Clock::time_point now = Clock::now();
  auto done = [&](const std::string& id) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return true;
    const SequenceGroup* g = scheduler_->FindRequest(id);
    if (g == nullptr) return true;  // aborted before it ever ran
    if (g->status == SequenceStatus::kWaiting) return false;
    it->second->scheduled = true;
    it->second->first_scheduled = now;
    return true;
  };
  unscheduled_.erase(std::remove_if(unscheduled_.begin(), unscheduled_.end(), done),
                     unscheduled_.end());
}

// One step, in phases: schedule -> report aborted requests -> execute the plan ->
// let the scheduler process the result -> apply each request's new tokens to
// its samples (text, stop strings, finished samples and requests) -> record
// the step's metrics.
absl::StatusOr<std::vector<EngineOutput>> Engine::Step() {
  if (!broken_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the engine stopped after a fatal error: ", broken_.message()));
  }
  std::vector<EngineOutput> outputs;

  absl::StatusOr<StepPlan> plan = scheduler_->Schedule(std::move(spare_plan_));
  if (!plan.ok()) {
    broken_ = plan.status();
    return plan.status();
  }
  ReportAborted(&outputs);
  RecordSchedule(*plan);

  absl::StatusOr<StepResult> result = ExecutePlan(*plan);
  if (!result.ok()) return result.status();
  absl::StatusOr<std::vector<RequestOutput>> processed = scheduler_->ProcessResult(*result);
  if (!processed.ok()) {
    broken_ = StepError(plan->step_id, processed.status());
    return broken_;
  }

  const Clock::time_point now = Clock::now();
  for (const RequestOutput& ro : *processed) ApplyRequestOutput(ro, now, &outputs);
  RecordStepMetrics(*plan, *result);
  spare_plan_ = *std::move(plan);  // the next Schedule() reuses its memory
  return outputs;
}

void Engine::ReportAborted(std::vector<EngineOutput>* outputs) {
  // Schedule() released the blocks of the aborted requests; report them now.
  for (const std::string& id : aborted_) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    RequestState& r = *it->second;
    EngineOutput& out = outputs->emplace_back();
    out.request_id = id;
    FinishOpenSamples(r, FinishReason::kAbort, /*flush_text=*/true, &out);
    Finalize(r, &out, FinishReason::kAbort);
    requests_.erase(it);
  }
  aborted_.clear();
}

absl::StatusOr<StepResult> Engine::ExecutePlan(const StepPlan& plan) {
  StepResult result;
  result.step_id = plan.step_id;
  if (!PlanHasWork(plan)) return result;
  absl::StatusOr<StepResult> r = executor_->Execute(plan);
  if (!r.ok()) {
    broken_ = StepError(plan.step_id, r.status());
    return broken_;
  }
  return r;
}

void Engine::ApplyRequestOutput(const RequestOutput& ro, Clock::time_point now,
                                std::vector<EngineOutput>* outputs) {
  auto it = requests_.find(ro.request_id);
  if (it == requests_.end()) return;
  RequestState& r = *it->second;
  if (!r.has_token && ro.error.empty()) {  // a failure is not a first token
    r.has_token = true;
    r.first_token = now;
    r.cached_tokens = ro.num_cached_tokens;
    first_token_prompt_tokens_ += r.prompt_len;
  }
  r.last_token = now;
  // Beam search reports nothing until the search ends (beams reorder).
  if (ro.seqs.empty() && !ro.finished) return;
  EngineOutput& out = outputs->emplace_back();
  out.request_id = ro.request_id;
  out.prompt_logprobs = ro.prompt_logprobs;
  absl::Status failure = ro.error.empty()
                             ? ApplySampleOutputs(ro, r, now, &out)
                             : absl::InternalError(absl::StrCat(
                                   "the model's output could not be sampled: ", ro.error));
  if (!failure.ok()) {
    // Logits that cannot be sampled, or a bad token id from the model: fail
    // this request alone.
    spdlog::warn("engine: request {} failed: {}", ro.request_id, std::string(failure.message()));
    out.error = failure;
    FinishOpenSamples(r, FinishReason::kError, /*flush_text=*/false, &out);
    if (!ro.finished) scheduler_->FinishRequest(ro.request_id, FinishReason::kAbort).IgnoreError();
    Finalize(r, &out, FinishReason::kError);
    requests_.erase(it);
    return;
  }
  const bool all_finished =
      std::all_of(r.seqs.begin(), r.seqs.end(), [](const SeqState& s) { return s.finished; });
  if (all_finished) {
    Finalize(r, &out, FinishReason::kNone);
    requests_.erase(it);
  }
}

absl::Status Engine::ApplySampleOutputs(const RequestOutput& ro, RequestState& r,
                                        Clock::time_point now, EngineOutput* out) {
  for (const SequenceOutput& so : ro.seqs) {
    if (so.index < 0 || so.index >= static_cast<int32_t>(r.seqs.size())) {
      return absl::InternalError(absl::StrCat("scheduler output for sample ", so.index,
                                              " of a request with n = ", r.seqs.size()));
    }
    SeqState& s = r.seqs[so.index];
    if (s.finished) continue;
    SequenceDelta& d = out->deltas.emplace_back();
    d.index = so.index;
    d.cumulative_logprob = so.cumulative_logprob;
    d.beam_score = so.beam_score;
    if (absl::Status st = AppendTokens(r, s, so, now, &d); !st.ok()) return st;
    if (absl::Status st = ApplyStopConditions(ro.request_id, r, s, so, &d); !st.ok()) return st;
  }
  return absl::OkStatus();
}

absl::Status Engine::AppendTokens(const RequestState& r, SeqState& s, const SequenceOutput& so,
                                  Clock::time_point now, SequenceDelta* d) {
  for (size_t k = 0; k < so.new_tokens.size(); ++k) {
    const SampledToken& t = so.new_tokens[k];
    if (++s.num_tokens > 1)
      engine_metrics::ObserveInterTokenLatency(metrics_, Seconds(now - s.last_token));
    s.last_token = now;
    d->token_ids.push_back(t.token_id);
    ++step_generation_tokens_;
    if (r.params.logprobs >= 0) d->logprobs.push_back(t.logprob);
    if (r.params.logprobs > 0) {
      d->top_token_ids.push_back(t.top_token_ids);
      d->top_logprobs.push_back(t.top_logprobs);
    }
    // The token that stopped the sequence (EOS, stop_token_ids) is not
    // part of the text, as in vLLM; its id is reported.
    const bool stop_token = so.finished && so.finish_reason == FinishReason::kStop &&
                            k + 1 == so.new_tokens.size() && so.stop_token_id == t.token_id;
    if (stop_token) continue;
    absl::StatusOr<std::string> piece = s.detok.Add(t.token_id);
    if (!piece.ok()) {
      return absl::InternalError(absl::StrCat("sample ", so.index, ": ", piece.status().message()));
    }
    s.text += *piece;
    if (s.num_tokens < r.params.min_tokens) s.stop_from = s.text.size();
    // Several tokens in one step (speculative decoding): a stop string
    // completed by this token ends the sample here, as it would have one
    // token per step; the tokens after it are dropped (the scheduler's copy
    // ends with the sequence, ApplyStopConditions).
    if (k + 1 < so.new_tokens.size() &&
        HasStopString(r.params.stop, s.text, std::max(s.sent, s.stop_from)))
      break;
  }
  return absl::OkStatus();
}

absl::Status Engine::ApplyStopConditions(const std::string& request_id, RequestState& r,
                                         SeqState& s, const SequenceOutput& so, SequenceDelta* d) {
  if (EmitText(r, s, /*final=*/false, d)) {
    // A stop string: the sample ends here even if the scheduler would go on.
    s.finished = true;
    s.finish_reason = FinishReason::kStop;
    d->finished = true;
    d->finish_reason = FinishReason::kStop;
    if (!so.finished) return scheduler_->FinishSequence(request_id, so.index, FinishReason::kStop);
  } else if (so.finished) {
    FinishSeq(r, s, so.finish_reason, d);
  }
  return absl::OkStatus();
}

void Engine::FinishOpenSamples(RequestState& r, FinishReason reason, bool flush_text,
                               EngineOutput* out) {
  for (size_t i = 0; i < r.seqs.size(); ++i) {
    SeqState& s = r.seqs[i];
    if (s.finished) continue;
    SequenceDelta& d = out->deltas.emplace_back();
    d.index = static_cast<int32_t>(i);
    // FinishSeq may end the sample with "stop" (the flushed text completes a
    // stop string); `reason` overrides it below.
    if (flush_text) FinishSeq(r, s, reason, &d);
    s.finished = true;
    s.finish_reason = reason;
    d.finished = true;
    d.finish_reason = reason;
  }
}

void Engine::RecordStepMetrics(const StepPlan& plan, const StepResult& result) {
  engine_metrics::StepFigures fig;
  fig.executed = PlanHasWork(plan);
  const SchedulerStats st = scheduler_->stats();
  fig.running = st.num_running;
  fig.waiting = st.num_waiting;
  fig.swapped = st.num_swapped;
  fig.device_kv_usage = st.device_kv_usage;
  fig.cpu_kv_usage = st.cpu_kv_usage;
  fig.prefix_queries = st.prefix_cache_queries - last_stats_.prefix_cache_queries;
  fig.prefix_hits = st.prefix_cache_hits - last_stats_.prefix_cache_hits;
  fig.preemptions_swap = st.num_preemptions_swap - last_stats_.num_preemptions_swap;
  fig.preemptions_recompute = st.num_preemptions_recompute - last_stats_.num_preemptions_recompute;
  fig.spec_drafts = st.spec_num_drafts - last_stats_.spec_num_drafts;
  fig.spec_draft_tokens = st.spec_draft_tokens - last_stats_.spec_draft_tokens;
  fig.spec_accepted_tokens = st.spec_accepted_tokens - last_stats_.spec_accepted_tokens;
  fig.spec_emitted_tokens = st.spec_emitted_tokens - last_stats_.spec_emitted_tokens;
  fig.spec_accepted_per_pos.resize(st.spec_accepted_per_pos.size());
  for (size_t j = 0; j < st.spec_accepted_per_pos.size(); ++j) {
    fig.spec_accepted_per_pos[j] =
        st.spec_accepted_per_pos[j] -
        (j < last_stats_.spec_accepted_per_pos.size() ? last_stats_.spec_accepted_per_pos[j] : 0);
  }
  fig.generation_tokens = std::exchange(step_generation_tokens_, 0);
  last_stats_ = st;
  for (const SequenceStep& s : plan.seqs) {
    // A verification (draft tokens) is a decode, not a prompt chunk.
    if (s.is_prefill() && s.num_draft_tokens == 0)
      fig.prompt_tokens += static_cast<int64_t>(s.token_ids.size());
  }
  fig.first_token_prompt_tokens = std::exchange(first_token_prompt_tokens_, 0);
  token_counters_.prompt_tokens += fig.prompt_tokens;
  token_counters_.generation_tokens += fig.generation_tokens;
  fig.step_tokens = plan.num_tokens();
  fig.forward_s = result.forward_seconds;
  fig.collective_s = result.collective_seconds;
  engine_metrics::RecordStep(metrics_, fig);
}

std::vector<EngineOutput> Engine::FailAll(const absl::Status& error) {
  std::vector<EngineOutput> outputs;
  const absl::Status err =
      error.ok() ? absl::UnavailableError("the engine is shutting down") : error;
  for (auto& [id, rp] : requests_) {
    RequestState& r = *rp;
    EngineOutput& out = outputs.emplace_back();
    out.request_id = id;
    out.error = err;
    FinishOpenSamples(r, FinishReason::kError, /*flush_text=*/false, &out);
    Finalize(r, &out, FinishReason::kError);
    if (!r.aborted) scheduler_->Abort(id).IgnoreError();
  }
  requests_.clear();
  aborted_.clear();
  unscheduled_.clear();
  return outputs;
}

}  // namespace pagedserve
