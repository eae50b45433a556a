#include "runtime/coordinator/scheduler.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "runtime/common/field_error.h"

namespace pagedserve {

absl::StatusOr<PreemptionMode> ParsePreemptionMode(std::string_view s) {
  if (s == "swap") return PreemptionMode::kSwap;
  if (s == "recompute") return PreemptionMode::kRecompute;
  return absl::InvalidArgumentError(
      absl::StrCat("--preemption-mode must be 'swap' or 'recompute', got '", std::string(s), "'"));
}

absl::Status SchedulerConfig::Validate() const {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (block_size < 1) return bad("--block-size must be >= 1, got ", block_size);
  if (num_device_blocks < 1) return bad("num_device_blocks must be >= 1, got ", num_device_blocks);
  if (num_cpu_blocks < 0) return bad("num_cpu_blocks must be >= 0, got ", num_cpu_blocks);
  if (max_num_seqs < 1) return bad("--max-num-seqs must be >= 1, got ", max_num_seqs);
  if (max_model_len < 2) return bad("--max-model-len must be >= 2, got ", max_model_len);
  if (sliding_window < 0) return bad("sliding_window must be >= 0, got ", sliding_window);
  if (!(watermark >= 0.0 && watermark < 1.0))
    return bad("watermark must be in [0, 1), got ", watermark);
  if (absl::Status s = speculative.Validate(); !s.ok()) return s;
  if (max_num_batched_tokens < max_num_seqs) {
    return bad("--max-num-batched-tokens (", max_num_batched_tokens,
               ") must be >= --max-num-seqs (", max_num_seqs,
               "): every running sequence needs one token per decode step");
  }
  if (!enable_chunked_prefill && max_num_batched_tokens < max_model_len) {
    return bad("--max-num-batched-tokens (", max_num_batched_tokens,
               ") is smaller than --max-model-len (", max_model_len,
               ") with chunked prefill disabled: a long prompt could never be scheduled; raise "
               "--max-num-batched-tokens or enable chunked prefill");
  }
  const int64_t per_seq = MaxBlocksPerSequence(max_model_len);
  const int64_t watermark_blocks = static_cast<int64_t>(watermark * num_device_blocks);
  if (num_device_blocks - watermark_blocks < per_seq) {
    return bad("the KV cache holds ", num_device_blocks, " blocks of ", block_size, " tokens (",
               watermark_blocks, " kept free as watermark), fewer than the ", per_seq,
               " blocks one --max-model-len (", max_model_len,
               ") sequence needs; lower --max-model-len or give the cache more memory");
  }
  return absl::OkStatus();
}

int64_t SchedulerConfig::LongestSequenceInPool() const {
  const int64_t watermark_blocks = static_cast<int64_t>(watermark * num_device_blocks);
  const int64_t available = static_cast<int64_t>(num_device_blocks) - watermark_blocks;
  constexpr int64_t kUnbounded = std::numeric_limits<int32_t>::max();
  if (sliding_window > 0 && enable_chunked_prefill && MaxBlocksPerSequence(kUnbounded) <= available)
    return kUnbounded;
  return available * block_size;
}

int64_t SchedulerConfig::MaxBlocksPerSequence(int64_t num_tokens) const {
  const int64_t bs = std::max(block_size, 1);
  const int64_t full = (num_tokens + bs - 1) / bs;
  if (sliding_window <= 0 || !enable_chunked_prefill) return full;
  const int64_t windowed = (sliding_window - 1 + int64_t{max_num_batched_tokens} + bs - 1) / bs + 1;
  return std::min(full, windowed);
}

bool Scheduler::KeyLess::operator()(const SequenceGroup* a, const SequenceGroup* b) const {
  return std::tie(a->priority, a->arrival_time, a->arrival_order) <
         std::tie(b->priority, b->arrival_time, b->arrival_order);
}

absl::StatusOr<std::unique_ptr<Scheduler>> Scheduler::Create(const SchedulerConfig& config,
                                                             std::vector<int32_t> eos_token_ids) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  return std::unique_ptr<Scheduler>(new Scheduler(config, std::move(eos_token_ids)));
}

Scheduler::Scheduler(const SchedulerConfig& config, std::vector<int32_t> eos_token_ids)
    : config_(config), eos_(eos_token_ids.begin(), eos_token_ids.end()) {
  BlockManager::Options o;
  o.block_size = config.block_size;
  o.num_device_blocks = config.num_device_blocks;
  o.num_cpu_blocks = config.num_cpu_blocks;
  o.enable_prefix_caching = config.enable_prefix_caching;
  o.watermark = config.watermark;
  o.hash_fn = config.hash_fn;
  o.sliding_window = config.sliding_window;
  bm_ = std::make_unique<BlockManager>(o);
  proposer_ = MakeProposer(config.speculative);
  if (proposer_ != nullptr)
    counters_.spec_accepted_per_pos.assign(config.speculative.num_speculative_tokens, 0);
}

absl::Status Scheduler::CheckAdmissible(int64_t prompt_len, const SamplingParams& p) const {
  const int64_t m = config_.max_model_len;
  if (prompt_len < 1) return FieldError("prompt", "prompt must have at least one token");
  if (prompt_len >= m) {
    return FieldError("prompt",
                      absl::StrCat("prompt has ", prompt_len, " tokens but max_model_len is ", m,
                                   ": at most ", m - 1, " prompt tokens are allowed"));
  }
  if (p.n < 1 || p.max_tokens < 1) {
    return FieldError(
        p.n < 1 ? "n" : "max_tokens",
        absl::StrCat("n and max_tokens must be >= 1, got n=", p.n, " max_tokens=", p.max_tokens));
  }
  if (prompt_len + p.max_tokens > m) {
    return FieldError(
        "max_tokens",
        absl::StrCat("max_tokens (", p.max_tokens, ") is too large: max_model_len is ", m,
                     " and the prompt has ", prompt_len, " tokens, so at most ", m - prompt_len,
                     m - prompt_len == 1 ? " token" : " tokens",
                     " can be generated; lower max_tokens or shorten the prompt"));
  }
  const int32_t seqs = p.max_seqs();
  const char* what = p.use_beam_search ? "the beam width" : "n";
  const char* field = p.use_beam_search ? "best_of" : "n";
  if (seqs > config_.max_num_seqs) {
    return FieldError(field, absl::StrCat(what, " (", seqs, ") exceeds --max-num-seqs (",
                                          config_.max_num_seqs, ")"));
  }
  const int64_t total = prompt_len + p.max_tokens;
  // Every sequence counted with its own copy of the prompt, although forked
  // siblings share the prompt's full blocks: a group preempted by recompute
  // (also swap's fallback) prefills each sequence again on its own, and
  // without the prefix cache nothing shares them then. A group that fits
  // only through sharing could never be resumed.
  const int64_t needed = static_cast<int64_t>(seqs) * config_.MaxBlocksPerSequence(total);
  const int64_t limit = static_cast<int64_t>(config_.num_device_blocks) - bm_->watermark_blocks();
  if (needed > limit) {
    return FieldError(
        "max_tokens",
        absl::StrCat("request needs ", needed, " KV blocks (", what, " ", seqs, " x ", total,
                     " tokens: prompt ", prompt_len, " + max_tokens ", p.max_tokens,
                     ", in blocks of ", config_.block_size, ") but the KV cache admits at most ",
                     limit, " (", config_.num_device_blocks, " blocks - watermark ",
                     bm_->watermark_blocks(), "); lower max_tokens or n"));
  }
  return absl::OkStatus();
}

absl::Status Scheduler::AddRequest(Request r) {
  if (r.request_id.empty()) return absl::InvalidArgumentError("request_id must not be empty");
  if (groups_.contains(r.request_id)) {
    return absl::AlreadyExistsError(
        absl::StrCat("request_id '", r.request_id, "' is already in use"));
  }
  if (absl::Status s = r.params.Validate(); !s.ok()) return s;
  for (size_t i = 0; i < r.prompt_token_ids.size(); ++i) {
    if (r.prompt_token_ids[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_token_ids[", i, "] is negative (", r.prompt_token_ids[i], ")"));
    }
  }
  if (absl::Status s = CheckAdmissible(static_cast<int64_t>(r.prompt_token_ids.size()), r.params);
      !s.ok()) {
    return s;
  }
  auto g = std::make_unique<SequenceGroup>();
  g->request_id = r.request_id;
  g->params = std::move(r.params);
  g->step_params = g->params;
  if (g->params.min_tokens > 0) {
    // Workers mask the end tokens until min_tokens; they know no EOS ids.
    std::vector<int32_t>& end = g->step_params.min_tokens_end_ids;
    if (!g->params.ignore_eos) end.assign(eos_.begin(), eos_.end());
    end.insert(end.end(), g->params.stop_token_ids.begin(), g->params.stop_token_ids.end());
    std::sort(end.begin(), end.end());
    end.erase(std::unique(end.begin(), end.end()), end.end());
  }
  if (g->params.use_beam_search) {
    SamplingParams& w = g->step_params;
    w.n = 1;
    w.logprobs = 2 * g->params.beam_width();
    w.use_beam_search = false;
    w.best_of = 0;
    w.length_penalty = 1.0f;
    w.early_stopping = EarlyStopping::kFalse;
    const int64_t room = static_cast<int64_t>(config_.max_model_len) -
                         static_cast<int64_t>(r.prompt_token_ids.size());
    g->beam = std::make_unique<BeamSearch>(
        g->params, static_cast<int32_t>(std::min<int64_t>(g->params.max_tokens, room)));
  }
  g->arrival_time = r.arrival_time;
  g->priority = config_.enable_priority ? r.priority : 0;
  g->arrival_order = arrival_counter_++;
  auto s = std::make_unique<Sequence>();
  s->id = next_seq_id_++;
  s->num_prompt_tokens = static_cast<int32_t>(r.prompt_token_ids.size());
  s->tokens = std::move(r.prompt_token_ids);
  // Room for every token the sequence can reach: no reallocation while decoding.
  s->tokens.reserve(std::min<int64_t>(
      static_cast<int64_t>(s->num_prompt_tokens) + g->params.max_tokens, config_.max_model_len));
  s->extra_keys = std::move(r.cache_extra_keys);
  g->seqs.push_back(std::move(s));
  waiting_.insert(g.get());
  groups_.emplace(g->request_id, std::move(g));
  return absl::OkStatus();
}

absl::Status Scheduler::Abort(const std::string& request_id) {
  return FinishRequest(request_id, FinishReason::kAbort);
}

absl::Status Scheduler::FinishRequest(const std::string& request_id, FinishReason reason) {
  auto it = groups_.find(request_id);
  if (it == groups_.end()) {
    return absl::NotFoundError(absl::StrCat("no unfinished request '", request_id, "'"));
  }
  if (reason == FinishReason::kNone) reason = FinishReason::kAbort;
  if (it->second->pending_finish == FinishReason::kNone) {
    it->second->pending_finish = reason;
    ++num_pending_finishes_;
  }
  return absl::OkStatus();
}

absl::Status Scheduler::FinishSequence(const std::string& request_id, int32_t index,
                                       FinishReason reason) {
  auto it = groups_.find(request_id);
  if (it == groups_.end()) {
    return absl::NotFoundError(absl::StrCat("no unfinished request '", request_id, "'"));
  }
  if (in_flight_) {
    return absl::FailedPreconditionError(absl::StrCat("FinishSequence('", request_id, "', ", index,
                                                      ") while step ", step_id_, " is in flight"));
  }
  SequenceGroup* g = it->second.get();
  Sequence* s = nullptr;
  for (auto& sp : g->seqs) {
    if (sp->sample_index == index) s = sp.get();
  }
  if (s == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("request '", request_id, "' has no sequence with sample index ", index));
  }
  if (s->finished() || g->pending_finish != FinishReason::kNone) return absl::OkStatus();
  if (g->num_unfinished() == 1) return FinishRequest(request_id, reason);
  if (reason == FinishReason::kNone) reason = FinishReason::kAbort;
  s->status = SequenceStatus::kFinished;
  s->finish_reason = reason;
  bm_->Free(*s);
  return absl::OkStatus();
}

const SequenceGroup* Scheduler::FindRequest(const std::string& request_id) const {
  auto it = groups_.find(request_id);
  return it == groups_.end() ? nullptr : it->second.get();
}

void Scheduler::ReleaseGroup(SequenceGroup* g, std::vector<SeqId>* finished_ids) {
  for (auto& s : g->seqs) {
    if (!s->finished()) {
      s->status = SequenceStatus::kFinished;
      s->finish_reason = g->pending_finish;
    }
    bm_->Free(*s);
    finished_ids->push_back(s->id);
  }
  if (g->status == SequenceStatus::kRunning) {
    running_.erase(std::find(running_.begin(), running_.end(), g));
  } else if (g->status == SequenceStatus::kWaiting) {
    waiting_.erase(g);
  } else if (g->status == SequenceStatus::kSwapped) {
    swapped_.erase(g);
  }
  g->status = SequenceStatus::kFinished;
  groups_.erase(g->request_id);  // destroys g
}

void Scheduler::ApplyPendingFinishes(StepPlan* plan) {
  if (num_pending_finishes_ == 0) return;
  num_pending_finishes_ = 0;
  std::vector<SequenceGroup*> doomed;
  for (auto& [id, g] : groups_) {
    if (g->pending_finish != FinishReason::kNone) doomed.push_back(g.get());
  }
  for (SequenceGroup* g : doomed) ReleaseGroup(g, &plan->finished);
}

int32_t Scheduler::DecodeCount(const SequenceGroup* g) const {
  int32_t c = 0;
  for (const auto& s : g->seqs) c += !s->finished() && s->num_uncomputed() == 1;
  return c;
}

int32_t Scheduler::RunningSeqs() const {
  int32_t c = 0;
  for (const SequenceGroup* g : running_) c += g->max_running_seqs();
  return c;
}

void Scheduler::InsertRunning(SequenceGroup* g) {
  running_.insert(std::upper_bound(running_.begin(), running_.end(), g, KeyLess()), g);
}

void Scheduler::PlanTokens(SequenceGroup* g, int32_t avail, GroupPlan* gp) {
  gp->seqs.clear();
  gp->ks.clear();
  gp->prefix_hits.clear();
  gp->drafts.clear();
  gp->incomplete = false;
  for (auto& sp : g->seqs) {
    Sequence* s = sp.get();
    if (s->finished()) continue;
    int32_t hit = -1;
    // A request that wants prompt logprobs prefills every prompt token (a
    // cached block has no logits).
    const bool scores_prompt = g->params.prompt_logprobs >= 0 && !g->prompt_logprobs_done;
    if (config_.enable_prefix_caching && s->block_table.empty() && s->num_computed_tokens == 0 &&
        !s->blocks_on_cpu && !scores_prompt) {
      hit = bm_->MatchPrefix(*s);
    }
    const int32_t need = s->num_uncomputed();
    int32_t k;
    if (need == 1) {
      k = 1;  // decode tokens are budgeted by the caller
    } else if (config_.enable_chunked_prefill) {
      k = std::min(need, std::max(avail, 0));
      avail -= k;
    } else {
      k = need <= avail ? need : 0;
      avail -= k;
    }
    if (k < need) gp->incomplete = true;
    gp->seqs.push_back(s);
    gp->ks.push_back(k);
    gp->prefix_hits.push_back(hit);
    gp->drafts.push_back(0);
  }
  AlignBeams(g, gp);
}

void Scheduler::AlignBeams(const SequenceGroup* g, GroupPlan* gp) const {
  if (!g->params.use_beam_search) return;
  bool all = true;
  for (size_t i = 0; i < gp->seqs.size(); ++i)
    all = all && gp->ks[i] == gp->seqs[i]->num_uncomputed();
  if (all) return;
  // Beams sample together: while some beam's (recomputed) prompt stays
  // incomplete, the others keep their last token for a later step.
  gp->incomplete = true;
  for (size_t i = 0; i < gp->seqs.size(); ++i) {
    const int32_t need = gp->seqs[i]->num_uncomputed();
    if (gp->ks[i] == need) gp->ks[i] = need - 1;
  }
}

int32_t Scheduler::Commit(SequenceGroup* g, const GroupPlan& gp, StepPlan* plan) {
  // The prefix-cache counters describe a request's first admission only: a
  // request re-admitted after a recompute preemption finds its own blocks
  // again, which is recovered work, not prefix sharing (vLLM keeps those
  // lookups apart as preempted_queries / preempted_hits).
  const bool first_admission = g->num_cached_tokens < 0;
  const int32_t ordinal = num_step_groups_++;
  int32_t tokens = 0;
  for (size_t i = 0; i < gp.seqs.size(); ++i) {
    Sequence* s = gp.seqs[i];
    if (gp.prefix_hits[i] >= 0) {
      if (first_admission) bm_->RecordPrefixQuery(s->len(), gp.prefix_hits[i]);
      if (g->num_cached_tokens < 0 && s == g->seqs[0].get())
        g->num_cached_tokens = gp.prefix_hits[i];
    }
    s->status = SequenceStatus::kRunning;
    const int32_t k = gp.ks[i];
    tokens += k;
    if (k <= 0 || !bm_->AppendSlots(*s, k, &plan->copy)) continue;
    int32_t samples = 0;
    if (s->num_computed_tokens + k - gp.drafts[i] == s->len()) {
      samples =
          (!g->forked && !g->params.use_beam_search && g->params.n > 1 && s == g->seqs[0].get())
              ? g->params.n
              : 1;
    }
    scheduled_.push_back({s, g, k, samples, ordinal, gp.drafts[i]});
  }
  if (g->num_cached_tokens < 0 && !config_.enable_prefix_caching) g->num_cached_tokens = 0;
  return tokens;
}

int32_t Scheduler::CommitLoneDecode(SequenceGroup* g, int32_t spare, StepPlan* plan) {
  if (g->seqs.size() != 1) return 0;
  Sequence* s = g->seqs[0].get();
  // A decode (one uncomputed token) on a table that covers the computed
  // tokens: PlanTokens would give it k = 1, with no prefix-cache lookup.
  if (s->finished() || s->num_uncomputed() != 1 || s->block_table.empty()) return 0;
  // Drafts only where their blocks are free (never a preemption for them).
  int32_t d = MaySpeculate(g) ? ProposeDraft(g, s, spare) : 0;
  if (d > 0 && !bm_->AppendSlots(*s, 1 + d, &plan->copy)) d = 0;
  // Fails, changing nothing, exactly when NumBlocksToAppend({s}, {1}) exceeds
  // the available blocks: then the general path preempts.
  if (d == 0 && !bm_->AppendSlots(*s, 1, &plan->copy)) return 0;
  s->status = SequenceStatus::kRunning;
  const int32_t samples =
      (!g->forked && !g->params.use_beam_search && g->params.n > 1) ? g->params.n : 1;
  scheduled_.push_back({s, g, 1 + d, samples, num_step_groups_++, d});
  if (g->num_cached_tokens < 0 && !config_.enable_prefix_caching) g->num_cached_tokens = 0;
  return 1 + d;
}

bool Scheduler::MaySpeculate(const SequenceGroup* g) const {
  // Not with structured output: the worker's grammar mask for each
  // verification row would have to follow that row's own prefix of the
  // drafts (it masks with the whole history, drafts included).
  return spec_step_ && !g->params.use_beam_search && !g->params.structured_output.active() &&
         (g->forked || g->params.n == 1);
}

int32_t Scheduler::ProposeDraft(const SequenceGroup* g, Sequence* s, int32_t spare) {
  if (s->spec_k == 0) s->spec_k = config_.speculative.num_speculative_tokens;
  // Room for the d + 1 tokens a fully accepted run emits.
  const int64_t room = std::min<int64_t>(g->params.max_tokens - s->num_output_tokens(),
                                         config_.max_model_len - s->len()) -
                       1;
  const auto limit = static_cast<int32_t>(std::min<int64_t>({s->spec_k, spare, room}));
  if (limit < 1) {
    s->draft.clear();
    return 0;
  }
  proposer_->Propose(s->tokens, limit, &s->draft);
  return static_cast<int32_t>(s->draft.size());
}

void Scheduler::AddDrafts(const SequenceGroup* g, int32_t spare, GroupPlan* gp) {
  if (!MaySpeculate(g)) return;
  bool any = false;
  for (size_t i = 0; i < gp->seqs.size(); ++i) {
    Sequence* s = gp->seqs[i];
    if (gp->ks[i] != 1 || s->num_uncomputed() != 1) continue;
    const int32_t d = ProposeDraft(g, s, spare);
    gp->drafts[i] = d;
    gp->ks[i] += d;
    spare -= d;
    any = any || d > 0;
  }
  if (!any || bm_->NumBlocksToAppend(gp->seqs, gp->ks) <= bm_->device().num_available()) return;
  for (size_t i = 0; i < gp->seqs.size(); ++i) {
    gp->ks[i] -= gp->drafts[i];
    gp->drafts[i] = 0;
  }
}

void Scheduler::Preempt(SequenceGroup* g, StepPlan* plan) {
  std::vector<Sequence*> seqs;
  for (auto& s : g->seqs) {
    if (!s->finished()) seqs.push_back(s.get());
  }
  if (config_.preemption_mode == PreemptionMode::kSwap) {
    if (bm_->SwapOut(seqs, &plan->swap_out)) {
      for (Sequence* s : seqs) s->status = SequenceStatus::kSwapped;
      g->status = SequenceStatus::kSwapped;
      swapped_.insert(g);
      ++counters_.num_preemptions_swap;
      return;
    }
    ++counters_.num_swap_fallbacks;
  }
  for (Sequence* s : seqs) {
    bm_->Free(*s);
    s->num_computed_tokens = 0;
    s->new_state = true;  // workers drop its state now and restart it on re-admission
    s->fork_from = kNoSeq;
    s->status = SequenceStatus::kWaiting;
    plan->finished.push_back(s->id);
  }
  g->status = SequenceStatus::kWaiting;
  waiting_.insert(g);
  ++counters_.num_preemptions_recompute;
}

absl::StatusOr<StepPlan> Scheduler::Schedule() { return Schedule(StepPlan()); }

absl::StatusOr<StepPlan> Scheduler::Schedule(StepPlan recycled) {
  if (in_flight_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step_id_, " is still in flight: call ProcessResult before the next Schedule"));
  }
  StepPlan plan = std::move(recycled);
  plan.step_id = ++step_id_;
  plan.swap_out.clear();
  plan.swap_in.clear();
  plan.copy.clear();
  plan.shutdown = false;
  // plan.seqs keeps its entries for BuildPlan to overwrite.
  plan.finished.clear();
  plan.finished.swap(pending_finished_ids_);
  ApplyPendingFinishes(&plan);
  scheduled_.clear();
  num_step_groups_ = 0;

  int32_t budget = config_.max_num_batched_tokens;
  if (config_.prefill_first && swapped_.empty() && !waiting_.empty()) {
    int32_t running_seqs = RunningSeqs();
    AdmitWaiting(&plan, &budget, &running_seqs);
    if (!scheduled_.empty()) {
      BuildPlan(&plan);
      return plan;
    }
  }
  if (!ScheduleRunning(&plan, &budget)) {
    int32_t running_seqs = RunningSeqs();
    if (ScheduleSwapped(&plan, &budget, &running_seqs)) AdmitWaiting(&plan, &budget, &running_seqs);
  }
  BuildPlan(&plan);
  return plan;
}

bool Scheduler::ScheduleRunning(StepPlan* plan, int32_t* budget) {
  // Decode tokens of running groups not yet visited are reserved, so prompt
  // chunks of older groups cannot starve newer groups' decodes.
  decode_counts_.clear();
  int32_t reserved = 0;
  for (const SequenceGroup* g : running_) {
    decode_counts_.push_back(DecodeCount(g));
    reserved += decode_counts_.back();
  }
  const int32_t disable_at = config_.speculative.disable_by_batch_size;
  spec_step_ = proposer_ != nullptr && (disable_at <= 0 || RunningSeqs() < disable_at);
  bool stopped = false;
  for (size_t i = 0; i < running_.size(); ++i) {
    SequenceGroup* g = running_[i];
    reserved -= decode_counts_[i];
    if (const int32_t taken = CommitLoneDecode(g, *budget - reserved - 1, plan); taken > 0) {
      *budget -= taken;
      continue;
    }
    PlanTokens(g, *budget - reserved - decode_counts_[i], &group_plan_);
    stopped |= group_plan_.incomplete;
    while (bm_->NumBlocksToAppend(group_plan_.seqs, group_plan_.ks) >
           bm_->device().num_available()) {
      SequenceGroup* victim = running_.back();
      const int32_t victim_decodes = decode_counts_.back();
      running_.pop_back();
      decode_counts_.pop_back();
      Preempt(victim, plan);
      if (victim == g) return true;  // g was the newest running request
      reserved -= victim_decodes;
      stopped = true;
    }
    int32_t planned = 0;
    for (int32_t k : group_plan_.ks) planned += k;
    AddDrafts(g, *budget - reserved - planned, &group_plan_);
    *budget -= Commit(g, group_plan_, plan);
  }
  return stopped;
}

bool Scheduler::ScheduleSwapped(StepPlan* plan, int32_t* budget, int32_t* running_seqs) {
  while (!swapped_.empty()) {
    SequenceGroup* g = *swapped_.begin();
    const int32_t dc = DecodeCount(g);
    if (*running_seqs + g->max_running_seqs() > config_.max_num_seqs || dc > *budget) break;
    std::vector<Sequence*> members;
    for (auto& s : g->seqs) {
      if (!s->finished()) members.push_back(s.get());
    }
    // Reserve one block per sequence for its decode slot (new block or copy).
    if (!bm_->SwapIn(members, static_cast<int32_t>(members.size()), &plan->swap_in)) break;
    swapped_.erase(swapped_.begin());
    g->status = SequenceStatus::kRunning;
    InsertRunning(g);
    *running_seqs += g->max_running_seqs();
    PlanTokens(g, *budget - dc, &group_plan_);
    if (bm_->NumBlocksToAppend(group_plan_.seqs, group_plan_.ks) > bm_->device().num_available()) {
      for (size_t j = 0; j < group_plan_.ks.size(); ++j) {
        if (group_plan_.seqs[j]->num_uncomputed() > 1) {
          group_plan_.ks[j] = 0;
          group_plan_.incomplete = true;
        }
      }
      AlignBeams(g, &group_plan_);
    }
    *budget -= Commit(g, group_plan_, plan);
    if (group_plan_.incomplete) return false;
  }
  return true;
}

void Scheduler::AdmitWaiting(StepPlan* plan, int32_t* budget, int32_t* running_seqs) {
  while (swapped_.empty() && !waiting_.empty()) {
    SequenceGroup* g = *waiting_.begin();
    const int32_t dc = DecodeCount(g);
    if (*running_seqs + g->max_running_seqs() > config_.max_num_seqs || dc > *budget) break;
    PlanTokens(g, *budget - dc, &group_plan_);
    const bool starts = !group_plan_.ks.empty() && group_plan_.ks[0] > 0;
    if (!starts || !bm_->CanAdmit(bm_->NumBlocksToAppend(group_plan_.seqs, group_plan_.ks))) {
      for (Sequence* s : group_plan_.seqs) {  // undo prefix-cache matches
        bm_->Free(*s);
        s->num_computed_tokens = 0;
      }
      break;
    }
    waiting_.erase(waiting_.begin());
    g->status = SequenceStatus::kRunning;
    InsertRunning(g);
    *running_seqs += g->max_running_seqs();
    *budget -= Commit(g, group_plan_, plan);
    if (group_plan_.incomplete) break;
  }
}

void Scheduler::BuildPlan(StepPlan* plan) {
  auto is_decode = [](const Scheduled& e) {
    return e.num_tokens == 1 && e.seq->num_computed_tokens > 0;
  };
  if (!std::is_partitioned(scheduled_.begin(), scheduled_.end(), is_decode)) {
    std::stable_partition(scheduled_.begin(), scheduled_.end(), is_decode);
  }
  plan->seqs.resize(scheduled_.size());
  int64_t total_tokens = 0;
  for (size_t i = 0; i < scheduled_.size(); ++i) {
    FillSequenceStep(scheduled_[i], plan->seqs[i]);
    total_tokens += scheduled_[i].num_tokens;
  }
  in_flight_ = true;
  ++counters_.num_steps;
  counters_.last_step_tokens = static_cast<int32_t>(total_tokens);
  counters_.last_step_seqs = static_cast<int32_t>(scheduled_.size());
}

void Scheduler::FillSequenceStep(const Scheduled& e, SequenceStep& st) {
  Sequence* s = e.seq;
  // A recycled entry that carried per-sequence constants; a continuing
  // sequence's entry leaves them at their defaults.
  const bool had_constants = st.starts();
  st.seq_id = s->id;
  st.fork_from = s->fork_from;
  st.new_state = s->new_state;
  st.start_pos = s->num_computed_tokens;
  st.num_draft_tokens = e.num_samples > 0 ? e.num_draft : 0;
  if (e.num_tokens == 1) {  // a decode: no call into memmove for one token
    st.token_ids.clear();
    st.token_ids.push_back(s->tokens[st.start_pos]);
  } else if (e.num_draft > 0) {  // a verification: the last token, then the draft
    st.token_ids.clear();
    st.token_ids.push_back(s->tokens[st.start_pos]);
    st.token_ids.insert(st.token_ids.end(), s->draft.begin(), s->draft.end());
  } else {
    st.token_ids.assign(s->tokens.begin() + st.start_pos,
                        s->tokens.begin() + st.start_pos + e.num_tokens);
  }
  st.sample = e.num_samples > 0;
  st.num_samples = std::max(e.num_samples, 1);
  // Prompt logprobs: the parent's prefill chunks that score a prompt token.
  const SequenceGroup& g = *e.group;
  st.prompt_logprobs = g.params.prompt_logprobs >= 0 && !g.prompt_logprobs_done &&
                       s == g.seqs[0].get() && e.num_draft == 0 &&
                       st.start_pos + 1 < s->num_prompt_tokens;
  st.next_prompt_token = st.prompt_logprobs && st.context_len() < s->num_prompt_tokens
                             ? s->tokens[st.context_len()]
                             : -1;
  if (st.starts()) {  // everything in full
    st.sample_index = s->sample_index;
    st.sampling = e.group->step_params;
    st.num_prompt_tokens = s->num_prompt_tokens;
    if (s->new_state && st.start_pos > 0) {
      st.cached_prefix_token_ids.assign(s->tokens.begin(), s->tokens.begin() + st.start_pos);
    } else {
      st.cached_prefix_token_ids.clear();
    }
    s->num_synced_blocks = 0;
  } else if (had_constants) {
    st.sample_index = 0;
    st.sampling = SamplingParams();
    st.num_prompt_tokens = 0;
    st.cached_prefix_token_ids.clear();
  }
  // The block-table entries the workers do not hold yet.
  const int32_t rows = static_cast<int32_t>(s->block_table.size());
  st.block_table_start = std::min(s->num_synced_blocks, rows);
  if (st.block_table_start == rows) {
    st.block_table.clear();  // the usual decode: nothing changed
  } else {
    st.block_table.assign(s->block_table.begin() + st.block_table_start, s->block_table.end());
  }
  s->num_synced_blocks = rows;
  s->fork_from = kNoSeq;
  s->new_state = false;
}

void Scheduler::CheckStop(Sequence* s, const SamplingParams& p) {
  const int32_t tok = s->tokens.back();
  const bool eos = !p.ignore_eos && eos_.contains(tok);
  if (eos ||
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), tok) != p.stop_token_ids.end()) {
    s->finish_reason = FinishReason::kStop;
    s->stop_token_id = tok;
  } else if (s->num_output_tokens() >= p.max_tokens || s->len() >= config_.max_model_len) {
    s->finish_reason = FinishReason::kLength;
  } else {
    return;
  }
  s->status = SequenceStatus::kFinished;
}

absl::StatusOr<std::vector<RequestOutput>> Scheduler::ProcessResult(const StepResult& result) {
  if (!in_flight_) return absl::FailedPreconditionError("ProcessResult without a plan in flight");
  if (result.step_id != step_id_) {
    return absl::InvalidArgumentError(absl::StrCat("result is for step ", result.step_id,
                                                   " but step ", step_id_, " is in flight"));
  }
  if (absl::Status s = IndexResult(result); !s.ok()) return s;  // state unchanged on error
  in_flight_ = false;
  std::vector<RequestOutput> outputs;
  ApplyTokens(result, &outputs);
  ReleaseFinished(&outputs);
  scheduled_.clear();
  return outputs;
}

absl::Status Scheduler::IndexResult(const StepResult& result) {
  // Fast path: the worker answers in plan order (the usual case).
  ResultIndex& ix = result_index_;
  ix.first.assign(scheduled_.size(), -1);
  ix.by_seq.clear();
  ix.in_order = true;
  size_t expected = 0;
  for (size_t i = 0; i < scheduled_.size() && ix.in_order; ++i) {
    const Scheduled& e = scheduled_[i];
    if (e.num_samples == 0) continue;
    for (int32_t k = 0; k < e.num_results() && ix.in_order; ++k) {
      ix.in_order =
          expected + k < result.tokens.size() && result.tokens[expected + k].seq_id == e.seq->id;
    }
    ix.first[i] = static_cast<int32_t>(expected);
    expected += e.num_results();
  }
  if (!ix.in_order || expected != result.tokens.size()) {
    // Gather by sequence: by_seq[id] = indices in sample order.
    ix.in_order = false;
    for (size_t t = 0; t < result.tokens.size(); ++t) {
      ix.by_seq[result.tokens[t].seq_id].push_back(static_cast<int32_t>(t));
    }
    expected = 0;
    for (const Scheduled& e : scheduled_) {
      if (e.num_samples == 0) continue;
      expected += e.num_results();
      auto it = ix.by_seq.find(e.seq->id);
      const size_t got = it == ix.by_seq.end() ? 0 : it->second.size();
      if (got != static_cast<size_t>(e.num_results())) {
        return absl::InvalidArgumentError(absl::StrCat("step ", step_id_, ": sequence ", e.seq->id,
                                                       " expects ", e.num_results(),
                                                       " sampled tokens, got ", got));
      }
    }
    if (expected != result.tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", step_id_, ": result has ", result.tokens.size(), " tokens, the plan samples ",
          expected, " (tokens for sequences not sampled this step)"));
    }
  }
  for (const SequenceFailure& f : result.failed) {
    const bool sampled = std::any_of(scheduled_.begin(), scheduled_.end(), [&](const Scheduled& e) {
      return e.num_samples > 0 && e.seq->id == f.seq_id;
    });
    if (!sampled)
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", step_id_, ": failure reported for sequence ", f.seq_id, ", not sampled"));
  }
  for (const SampledToken& t : result.tokens) {
    if (t.token_id < 0 && (t.token_id != kNoToken || FailureOf(result, t.seq_id) == nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("step ", step_id_, ": negative token id ",
                                                     t.token_id, " for sequence ", t.seq_id));
    }
  }
  // A draft model's proposals: one per entry of placeholders, in plan order.
  ix.draft_of.assign(scheduled_.size(), -1);
  size_t next_draft = 0;
  for (size_t i = 0; i < scheduled_.size(); ++i) {
    const Scheduled& e = scheduled_[i];
    if (e.num_samples == 0 || e.num_draft == 0 || e.seq->draft.front() != kNoToken) continue;
    const ProposedDraft* d =
        next_draft < result.drafts.size() ? &result.drafts[next_draft] : nullptr;
    if (d == nullptr || d->seq_id != e.seq->id ||
        d->token_ids.size() != static_cast<size_t>(e.num_draft) ||
        std::any_of(d->token_ids.begin(), d->token_ids.end(), [](int32_t t) { return t < 0; })) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step ", step_id_, ": sequence ", e.seq->id, " expects ", e.num_draft,
          " proposed draft tokens (result entry ", next_draft, " of ", result.drafts.size(), ")"));
    }
    ix.draft_of[i] = static_cast<int32_t>(next_draft++);
  }
  if (next_draft != result.drafts.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", step_id_, ": result has ", result.drafts.size(),
                     " proposed drafts, the plan asks for ", next_draft));
  }
  // Entries come grouped by sequence: look each sequence up once.
  SeqId last = kNoSeq;
  for (const PromptLogprob& p : result.prompt_logprobs) {
    if (p.seq_id == last) continue;
    last = p.seq_id;
    if (PromptGroup(p.seq_id) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", step_id_, ": prompt logprobs for sequence ", p.seq_id,
                       ", which does not score its prompt this step"));
    }
  }
  return absl::OkStatus();
}

SequenceGroup* Scheduler::PromptGroup(SeqId seq_id) const {
  for (const Scheduled& e : scheduled_) {
    if (e.seq->id == seq_id && e.group->params.prompt_logprobs >= 0 &&
        !e.group->prompt_logprobs_done)
      return e.group;
  }
  return nullptr;
}

const SequenceFailure* Scheduler::FailureOf(const StepResult& result, SeqId seq_id) {
  for (const SequenceFailure& f : result.failed) {
    if (f.seq_id == seq_id) return &f;
  }
  return nullptr;
}

void Scheduler::FailGroup(SequenceGroup* g, const Scheduled& e, const SequenceFailure& f,
                          std::vector<RequestOutput>* outputs) {
  // The failed sequence's K/V is not marked computed (never cached) and the
  // blocks this step appended for it go now (the table matches its computed
  // tokens again); the group's other blocks go at the next Schedule(), as
  // for FinishRequest.
  bm_->TrimToComputed(*e.seq);
  if (g->pending_finish == FinishReason::kNone) {
    g->pending_finish = FinishReason::kError;
    ++num_pending_finishes_;
  }
  RequestOutput& out = (*outputs)[OutputSlot(e, outputs)];
  out.finished = true;
  if (out.error.empty()) out.error = f.message;
}

int32_t Scheduler::OutputSlot(const Scheduled& e, std::vector<RequestOutput>* outputs) {
  int32_t& slot = output_slots_[e.group_ordinal];
  if (slot < 0) {
    slot = static_cast<int32_t>(outputs->size());
    output_groups_.push_back(e.group);
    RequestOutput& o = outputs->emplace_back();
    o.request_id = e.group->request_id;
    o.num_prompt_tokens = e.seq->num_prompt_tokens;  // every sequence of a group has its prompt
    o.num_cached_tokens = std::max(e.group->num_cached_tokens, 0);
  }
  return slot;
}

const SampledToken& Scheduler::TokenOf(const StepResult& result, size_t i, int32_t k) const {
  const ResultIndex& ix = result_index_;
  if (ix.in_order) return result.tokens[ix.first[i] + k];
  return result.tokens[ix.by_seq.at(scheduled_[i].seq->id)[k]];
}

void Scheduler::ApplyTokens(const StepResult& result, std::vector<RequestOutput>* outputs) {
  outputs->reserve(num_step_groups_);  // one per group: references stay valid
  output_slots_.assign(num_step_groups_, -1);
  output_groups_.clear();
  finishing_outputs_.clear();
  for (auto& v : beam_samples_) v.clear();
  SequenceGroup* g = nullptr;
  for (size_t k = 0; k < result.prompt_logprobs.size(); ++k) {
    const PromptLogprob& p = result.prompt_logprobs[k];
    if (k == 0 || p.seq_id != result.prompt_logprobs[k - 1].seq_id)
      g = PromptGroup(p.seq_id);  // IndexResult checked it
    if (p.position == static_cast<int32_t>(g->prompt_logprobs.size()) + 1)
      g->prompt_logprobs.push_back(p);  // else scored before a recompute preemption
  }
  for (size_t i = 0; i < scheduled_.size(); ++i) {
    const Scheduled& e = scheduled_[i];
    Sequence* s = e.seq;
    SequenceGroup* g = e.group;
    if (const int32_t d = result_index_.draft_of[i]; d >= 0) s->draft = result.drafts[d].token_ids;
    // A verification entry fails only when the row whose token it emits
    // (row `accepted`) could not be sampled: rows past the first rejected
    // draft are discarded, as without speculation they never exist.
    if (e.num_samples > 0 && e.num_draft == 0 && !result.failed.empty()) {
      if (const SequenceFailure* f = FailureOf(result, s->id); f != nullptr) {
        FailGroup(g, e, *f, outputs);
        continue;
      }
    }
    if (e.num_draft > 0) {
      // Only the fed token and the accepted drafts are verified K/V
      // (SettleVerified once they are in s->tokens).
      const bool live = g->pending_finish == FinishReason::kNone;
      const int32_t accepted = live ? VerifyDraft(result, i, s) : 0;
      if (live && TokenOf(result, i, accepted).token_id == kNoToken) {
        FailGroup(g, e, *FailureOf(result, s->id), outputs);  // IndexResult: listed
        continue;
      }
      s->num_computed_tokens += 1 + accepted;
      if (!live) {
        SettleVerified(s);
        continue;
      }
    } else {
      s->num_computed_tokens += e.num_tokens;
      bm_->MarkComputed(*s);
    }
    if (e.num_samples == 0 || g->pending_finish != FinishReason::kNone) continue;
    const int32_t slot = OutputSlot(e, outputs);
    RequestOutput& out = (*outputs)[slot];
    if (g->params.prompt_logprobs >= 0 && !g->prompt_logprobs_done) {
      out.prompt_logprobs = std::move(g->prompt_logprobs);
      g->prompt_logprobs.clear();
      g->prompt_logprobs_done = true;
    }
    if (g->beam != nullptr) {
      if (beam_samples_.size() <= static_cast<size_t>(slot)) beam_samples_.resize(slot + 1);
      beam_samples_[slot].emplace_back(s, &TokenOf(result, i, 0));
      continue;
    }
    bool finished;
    if (e.num_draft > 0) {
      finished = EmitRun(g, s, result, i, &out);
      SettleVerified(s);
    } else if (e.num_samples > 1) {
      const size_t first_child = ForkSiblings(g, *s, e.num_samples - 1);
      finished = Emit(g, s, TokenOf(result, i, 0), &out);
      for (int32_t k = 1; k < e.num_samples; ++k) {
        finished |= Emit(g, g->seqs[first_child + k - 1].get(), TokenOf(result, i, k), &out);
      }
    } else {
      finished = Emit(g, s, TokenOf(result, i, 0), &out);
    }
    if (finished) finishing_outputs_.push_back(slot);
  }
  for (size_t o = 0; o < beam_samples_.size() && o < output_groups_.size(); ++o) {
    if (beam_samples_[o].empty() || output_groups_[o]->pending_finish != FinishReason::kNone)
      continue;
    BeamStep(output_groups_[o], beam_samples_[o], &(*outputs)[o]);
    if (output_groups_[o]->beam->done()) finishing_outputs_.push_back(static_cast<int32_t>(o));
  }
}

bool Scheduler::IsStopToken(const SamplingParams& p, int32_t token) const {
  if (!p.ignore_eos && eos_.contains(token)) return true;
  return std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
         p.stop_token_ids.end();
}

void Scheduler::BeamStep(SequenceGroup* g,
                         std::span<const std::pair<Sequence*, const SampledToken*>> sampled,
                         RequestOutput* out) {
  std::vector<BeamInput> in(sampled.size());
  for (size_t b = 0; b < sampled.size(); ++b) {
    Sequence* s = sampled[b].first;
    in[b].cumulative_logprob = s->cumulative_logprob;
    in[b].output_tokens = nullptr;
    in[b].output_logprobs = &s->output_logprobs;
    in[b].sampled = sampled[b].second;
  }
  // Generated tokens of each beam (the tokens past the prompt).
  std::vector<std::vector<int32_t>> outputs(sampled.size());
  for (size_t b = 0; b < sampled.size(); ++b) {
    const Sequence* s = sampled[b].first;
    outputs[b].assign(s->tokens.begin() + s->num_prompt_tokens, s->tokens.end());
    in[b].output_tokens = &outputs[b];
  }
  const int32_t output_len = sampled.front().first->num_output_tokens();
  const SamplingParams& p = g->params;
  std::vector<BeamChoice> live =
      g->beam->Step(in, output_len, [&](int32_t t) { return IsStopToken(p, t); });
  g->forked = true;

  // Forks first (a child copies its parent before the parent is extended),
  // then extend the parents in place; beams nobody chose are dropped.
  std::vector<bool> extended(sampled.size(), false);
  std::vector<std::pair<Sequence*, const BeamChoice*>> extend;
  for (const BeamChoice& c : live) {
    Sequence* parent = sampled[c.parent].first;
    if (!extended[c.parent]) {
      extended[c.parent] = true;
      extend.emplace_back(parent, &c);
      continue;
    }
    auto child = std::make_unique<Sequence>();
    child->id = next_seq_id_++;
    child->sample_index = parent->sample_index;
    child->tokens.reserve(parent->tokens.capacity());
    child->tokens = parent->tokens;
    child->num_prompt_tokens = parent->num_prompt_tokens;
    child->num_computed_tokens = parent->num_computed_tokens;
    child->extra_keys = parent->extra_keys;
    child->status = SequenceStatus::kRunning;
    child->fork_from = parent->id;
    child->new_state = false;
    child->output_logprobs = parent->output_logprobs;
    bm_->Fork(*parent, *child);
    extend.emplace_back(child.get(), &c);
    g->seqs.push_back(std::move(child));
  }
  for (auto& [s, c] : extend) {
    s->tokens.push_back(c->token_id);
    s->output_logprobs.push_back(c->logprob);
    s->cumulative_logprob = c->cumulative_logprob;
  }
  for (size_t b = 0; b < sampled.size(); ++b) {
    if (extended[b]) continue;
    Sequence* s = sampled[b].first;
    s->status = SequenceStatus::kFinished;
    s->finish_reason = FinishReason::kAbort;
    bm_->Free(*s);
    pending_finished_ids_.push_back(s->id);
  }
  if (!g->beam->done()) {
    std::erase_if(g->seqs, [](const std::unique_ptr<Sequence>& s) { return s->finished(); });
    return;
  }
  // The search ended: every live beam finishes; ReleaseFinished frees them.
  for (auto& s : g->seqs) {
    if (s->finished()) continue;
    s->status = SequenceStatus::kFinished;
    s->finish_reason = FinishReason::kLength;
  }
  // Dropped beams' ids were listed above: keep them out of ReleaseFinished's list.
  std::erase_if(g->seqs, [&](const std::unique_ptr<Sequence>& s) {
    for (size_t b = 0; b < sampled.size(); ++b) {
      if (!extended[b] && sampled[b].first == s.get()) return true;
    }
    return false;
  });
  std::vector<BeamHypothesis> results = g->beam->TakeResults();
  for (size_t i = 0; i < results.size(); ++i) {
    BeamHypothesis& h = results[i];
    SequenceOutput& so = out->seqs.emplace_back();
    so.index = static_cast<int32_t>(i);
    for (size_t t = 0; t < h.token_ids.size(); ++t) {
      SampledToken& st = so.new_tokens.emplace_back();
      st.token_id = h.token_ids[t];
      st.logprob = h.logprobs[t];
    }
    so.finished = true;
    so.finish_reason = h.finish_reason;
    so.stop_token_id = h.stop_token_id;
    so.num_output_tokens = static_cast<int32_t>(h.token_ids.size());
    so.cumulative_logprob = h.cumulative_logprob;
    so.beam_score = h.score;
  }
}

size_t Scheduler::ForkSiblings(SequenceGroup* g, const Sequence& parent, int32_t count) {
  // Parallel sampling: the siblings share the prefilled parent's blocks.
  const size_t first = g->seqs.size();
  for (int32_t k = 1; k <= count; ++k) {
    auto child = std::make_unique<Sequence>();
    child->id = next_seq_id_++;
    child->sample_index = k;
    child->tokens.reserve(parent.tokens.capacity());
    child->tokens = parent.tokens;
    child->num_prompt_tokens = parent.num_prompt_tokens;
    child->num_computed_tokens = parent.num_computed_tokens;
    child->extra_keys = parent.extra_keys;
    child->status = SequenceStatus::kRunning;
    child->fork_from = parent.id;
    child->new_state = false;
    bm_->Fork(parent, *child);
    g->seqs.push_back(std::move(child));
  }
  g->forked = true;
  return first;
}

int32_t Scheduler::VerifyDraft(const StepResult& result, size_t i, Sequence* s) {
  const auto d = static_cast<int32_t>(s->draft.size());
  int32_t a = 0;
  while (a < d && TokenOf(result, i, a).token_id == s->draft[a]) ++a;
  ++counters_.spec_num_drafts;
  counters_.spec_draft_tokens += d;
  counters_.spec_accepted_tokens += a;
  for (int32_t j = 0; j < a && j < static_cast<int32_t>(counters_.spec_accepted_per_pos.size());
       ++j) {
    ++counters_.spec_accepted_per_pos[j];
  }
  const int32_t k_max = config_.speculative.num_speculative_tokens;
  s->spec_k = a == d ? std::min(k_max, s->spec_k + 1) : std::max(1, a + 1);
  return a;
}

void Scheduler::SettleVerified(Sequence* s) {
  bm_->TrimToComputed(*s);
  bm_->MarkComputed(*s);
}

bool Scheduler::EmitRun(SequenceGroup* g, Sequence* s, const StepResult& result, size_t i,
                        RequestOutput* out) {
  // The tokens fed this step are the first num_computed_tokens - len + 1 of
  // the run (accepted drafts); the target's next sample follows them.
  const int32_t accepted = s->num_computed_tokens - s->len();
  SequenceOutput& so = out->seqs.emplace_back();
  so.index = s->sample_index;
  for (int32_t j = 0; j <= accepted && !s->finished(); ++j) {
    const SampledToken& t = TokenOf(result, i, j);
    s->tokens.push_back(t.token_id);
    so.new_tokens.push_back(t);
    CheckStop(s, g->params);
  }
  const auto emitted = static_cast<int64_t>(so.new_tokens.size());
  counters_.spec_emitted_tokens += emitted;
  // A run cut by a stop condition verified only the tokens before its last.
  s->num_computed_tokens = std::min(s->num_computed_tokens, s->len() - 1);
  so.finished = s->finished();
  so.finish_reason = s->finish_reason;
  so.stop_token_id = s->stop_token_id;
  so.num_output_tokens = s->num_output_tokens();
  return so.finished;
}

bool Scheduler::Emit(SequenceGroup* g, Sequence* s, const SampledToken& t, RequestOutput* out) {
  s->tokens.push_back(t.token_id);
  CheckStop(s, g->params);
  SequenceOutput& so = out->seqs.emplace_back();
  so.index = s->sample_index;
  so.new_tokens.push_back(t);
  so.finished = s->finished();
  so.finish_reason = s->finish_reason;
  so.stop_token_id = s->stop_token_id;
  so.num_output_tokens = s->num_output_tokens();
  return so.finished;
}

void Scheduler::ReleaseFinished(std::vector<RequestOutput>* outputs) {
  // Finished sequences' blocks are freed now; their ids are reported when the
  // whole request ends (a fresh sibling may still fork from a finished parent).
  // Only outputs where a sequence finished this step can hold such blocks
  // (FinishSequence and dropped beams free theirs at once), or end a request.
  std::sort(finishing_outputs_.begin(), finishing_outputs_.end());
  finishing_outputs_.erase(std::unique(finishing_outputs_.begin(), finishing_outputs_.end()),
                           finishing_outputs_.end());
  for (int32_t o : finishing_outputs_) {
    SequenceGroup* g = output_groups_[o];
    for (auto& s : g->seqs) {
      if (s->finished() && (!s->block_table.empty() || s->blocks_on_cpu)) bm_->Free(*s);
    }
    if (g->num_unfinished() > 0) continue;
    (*outputs)[o].finished = true;
    for (auto& s : g->seqs) pending_finished_ids_.push_back(s->id);
    running_.erase(std::find(running_.begin(), running_.end(), g));
    g->status = SequenceStatus::kFinished;
    groups_.erase(g->request_id);  // destroys g
  }
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s = counters_;
  s.num_running = static_cast<int32_t>(running_.size());
  s.num_waiting = static_cast<int32_t>(waiting_.size());
  s.num_swapped = static_cast<int32_t>(swapped_.size());
  const BlockPool& d = bm_->device();
  const BlockPool& c = bm_->cpu();
  s.device_kv_usage = d.num_blocks() ? static_cast<double>(d.num_in_use()) / d.num_blocks() : 0.0;
  s.cpu_kv_usage = c.num_blocks() ? static_cast<double>(c.num_in_use()) / c.num_blocks() : 0.0;
  s.prefix_cache_queries = bm_->prefix_cache_queries();
  s.prefix_cache_hits = bm_->prefix_cache_hits();
  return s;
}

absl::Status Scheduler::CheckInvariants() const {
  if (absl::Status s = bm_->CheckInvariants(); !s.ok()) return s;
  size_t listed = running_.size() + waiting_.size() + swapped_.size();
  if (listed != groups_.size()) {
    return absl::InternalError(
        absl::StrCat(groups_.size(), " requests but ", listed, " in the queues"));
  }
  if (!std::is_sorted(running_.begin(), running_.end(), KeyLess())) {
    return absl::InternalError("running list is not in (priority, arrival) order");
  }
  for (const auto& [id, g] : groups_) {
    for (const auto& s : g->seqs) {
      const std::string where = absl::StrCat("request ", id, " sequence ", s->id, ": ");
      if (s->finished()) {
        if (!s->block_table.empty())
          return absl::InternalError(where + "finished but holds blocks");
        continue;
      }
      if (s->status != g->status)
        return absl::InternalError(where + "status differs from its request");
      switch (g->status) {
        case SequenceStatus::kRunning:
          if (s->blocks_on_cpu) return absl::InternalError(where + "running with CPU blocks");
          if (!in_flight_ && static_cast<int32_t>(s->block_table.size()) !=
                                 bm_->BlocksForTokens(s->num_computed_tokens)) {
            return absl::InternalError(absl::StrCat(where, s->block_table.size(), " blocks for ",
                                                    s->num_computed_tokens, " computed tokens"));
          }
          break;
        case SequenceStatus::kWaiting:
          if (!s->block_table.empty() || s->num_computed_tokens != 0) {
            return absl::InternalError(where + "waiting but holds blocks or computed tokens");
          }
          break;
        case SequenceStatus::kSwapped:
          if (!s->blocks_on_cpu) return absl::InternalError(where + "swapped without CPU blocks");
          break;
        case SequenceStatus::kFinished:
          return absl::InternalError(where + "request finished but still listed");
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedserve
