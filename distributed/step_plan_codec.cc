#include "distributed/step_plan_codec.h"

#include <cstring>

#include "distributed/wire.h"
#include "runtime/common/status_macros.h"

namespace pagedserve {
namespace {

// 2: incremental sequence entries; 3: structured output, logit_bias,
// min_tokens, bad words; 4: prompt logprobs. Result 2: prompt logprobs.
constexpr char kPlanMagic[4] = {'P', 'S', 'P', '4'};
constexpr char kResultMagic[4] = {'P', 'S', 'R', '3'};

void PutSampling(wire::Writer& w, const SamplingParams& s) {
  w.Put<int32_t>(s.n);
  w.Put<int32_t>(s.max_tokens);
  w.Put<float>(s.temperature);
  w.Put<float>(s.top_p);
  w.Put<int32_t>(s.top_k);
  w.Put<float>(s.min_p);
  w.Put<float>(s.repetition_penalty);
  w.Put<float>(s.presence_penalty);
  w.Put<float>(s.frequency_penalty);
  w.Put<uint8_t>(s.seed.has_value());
  w.Put<uint64_t>(s.seed.value_or(0));
  w.Put<uint64_t>(s.stop.size());
  for (const auto& str : s.stop) w.PutString(str);
  w.PutVector(s.stop_token_ids);
  w.Put<uint8_t>(s.ignore_eos);
  w.Put<int32_t>(s.logprobs);
  w.Put<int32_t>(s.prompt_logprobs);
  // The logit processors (the sampler's; the output options stay on the coordinator).
  std::vector<int32_t> bias_ids;
  std::vector<float> biases;
  for (const auto& [id, bias] : s.logit_bias) {
    bias_ids.push_back(id);
    biases.push_back(bias);
  }
  w.PutVector(bias_ids);
  w.PutVector(biases);
  w.Put<int32_t>(s.min_tokens);
  w.PutVector(s.min_tokens_end_ids);
  w.Put<uint64_t>(s.bad_words_token_ids.size());
  for (const auto& word : s.bad_words_token_ids) w.PutVector(word);
}

absl::Status GetSampling(wire::Reader& r, SamplingParams* s) {
  PS_RETURN_IF_ERROR(r.Get(&s->n, "sampling.n"));
  PS_RETURN_IF_ERROR(r.Get(&s->max_tokens, "sampling.max_tokens"));
  PS_RETURN_IF_ERROR(r.Get(&s->temperature, "sampling.temperature"));
  PS_RETURN_IF_ERROR(r.Get(&s->top_p, "sampling.top_p"));
  PS_RETURN_IF_ERROR(r.Get(&s->top_k, "sampling.top_k"));
  PS_RETURN_IF_ERROR(r.Get(&s->min_p, "sampling.min_p"));
  PS_RETURN_IF_ERROR(r.Get(&s->repetition_penalty, "sampling.repetition_penalty"));
  PS_RETURN_IF_ERROR(r.Get(&s->presence_penalty, "sampling.presence_penalty"));
  PS_RETURN_IF_ERROR(r.Get(&s->frequency_penalty, "sampling.frequency_penalty"));
  uint8_t has_seed = 0;
  uint64_t seed = 0;
  PS_RETURN_IF_ERROR(r.Get(&has_seed, "sampling.has_seed"));
  PS_RETURN_IF_ERROR(r.Get(&seed, "sampling.seed"));
  if (has_seed)
    s->seed = seed;
  else
    s->seed.reset();
  uint64_t num_stop = 0;
  PS_RETURN_IF_ERROR(r.Get(&num_stop, "sampling.stop.size"));
  PS_RETURN_IF_ERROR(r.CheckCount(num_stop, sizeof(uint64_t), "sampling.stop"));
  s->stop.resize(num_stop);
  for (auto& str : s->stop) PS_RETURN_IF_ERROR(r.GetString(&str, "sampling.stop"));
  PS_RETURN_IF_ERROR(r.GetVector(&s->stop_token_ids, "sampling.stop_token_ids"));
  uint8_t ignore_eos = 0;
  PS_RETURN_IF_ERROR(r.Get(&ignore_eos, "sampling.ignore_eos"));
  s->ignore_eos = ignore_eos != 0;
  PS_RETURN_IF_ERROR(r.Get(&s->logprobs, "sampling.logprobs"));
  PS_RETURN_IF_ERROR(r.Get(&s->prompt_logprobs, "sampling.prompt_logprobs"));
  std::vector<int32_t> bias_ids;
  std::vector<float> biases;
  PS_RETURN_IF_ERROR(r.GetVector(&bias_ids, "sampling.logit_bias"));
  PS_RETURN_IF_ERROR(r.GetVector(&biases, "sampling.logit_bias"));
  if (bias_ids.size() != biases.size())
    return absl::DataLossError("sampling.logit_bias: ids and biases differ in count");
  s->logit_bias.clear();
  for (size_t i = 0; i < bias_ids.size(); ++i) s->logit_bias.emplace_back(bias_ids[i], biases[i]);
  PS_RETURN_IF_ERROR(r.Get(&s->min_tokens, "sampling.min_tokens"));
  PS_RETURN_IF_ERROR(r.GetVector(&s->min_tokens_end_ids, "sampling.min_tokens_end_ids"));
  uint64_t num_bad = 0;
  PS_RETURN_IF_ERROR(r.Get(&num_bad, "sampling.bad_words.size"));
  PS_RETURN_IF_ERROR(r.CheckCount(num_bad, sizeof(uint64_t), "sampling.bad_words"));
  s->bad_words_token_ids.resize(num_bad);
  for (auto& word : s->bad_words_token_ids)
    PS_RETURN_IF_ERROR(r.GetVector(&word, "sampling.bad_words"));
  return absl::OkStatus();
}

// Structured output: kind byte, spec string (kept apart from PutSampling's
// fields so that either can grow alone).
void PutStructuredOutput(wire::Writer& w, const StructuredOutput& so) {
  w.Put<uint8_t>(static_cast<uint8_t>(so.kind));
  w.PutString(so.spec);
}

absl::Status GetStructuredOutput(wire::Reader& r, StructuredOutput* so) {
  uint8_t kind = 0;
  PS_RETURN_IF_ERROR(r.Get(&kind, "sampling.structured_output.kind"));
  if (kind > static_cast<uint8_t>(StructuredOutput::Kind::kToolCalls)) {
    return absl::DataLossError(
        absl::StrCat("step plan: unknown structured output kind ", int{kind}));
  }
  so->kind = static_cast<StructuredOutput::Kind>(kind);
  return r.GetString(&so->spec, "sampling.structured_output.spec");
}

absl::Status CheckMagic(wire::Reader& r, const char (&magic)[4], const char* what) {
  char m[4];
  for (char& c : m) PS_RETURN_IF_ERROR(r.Get(&c, what));
  if (std::memcmp(m, magic, 4) != 0)
    return absl::DataLossError(absl::StrCat("not a ", what, " message (bad magic)"));
  return absl::OkStatus();
}

// SequenceStep flags.
constexpr uint8_t kSample = 1, kNewState = 2, kFork = 4, kDraft = 8, kPromptLogprobs = 16,
                  kKnownFlags = 31;

void PutSequenceStep(wire::Writer& w, const SequenceStep& s) {
  w.Put<uint64_t>(s.seq_id);
  w.Put<uint8_t>((s.sample ? kSample : 0) | (s.new_state ? kNewState : 0) |
                 (s.fork_from != kNoSeq ? kFork : 0) | (s.num_draft_tokens != 0 ? kDraft : 0) |
                 (s.prompt_logprobs ? kPromptLogprobs : 0));
  if (s.fork_from != kNoSeq) w.Put<uint64_t>(s.fork_from);
  if (s.num_draft_tokens != 0) w.Put<int32_t>(s.num_draft_tokens);
  if (s.prompt_logprobs) w.Put<int32_t>(s.next_prompt_token);
  w.PutVector(s.token_ids);
  w.Put<int32_t>(s.start_pos);
  w.Put<int32_t>(s.block_table_start);
  w.PutVector(s.block_table);
  w.Put<int32_t>(s.num_samples);
  if (!s.starts()) return;  // the per-sequence constants travel once
  w.Put<int32_t>(s.sample_index);
  PutSampling(w, s.sampling);
  PutStructuredOutput(w, s.sampling.structured_output);
  w.Put<int32_t>(s.num_prompt_tokens);
  w.PutVector(s.cached_prefix_token_ids);
}

absl::Status GetSequenceStep(wire::Reader& r, SequenceStep* s) {
  PS_RETURN_IF_ERROR(r.Get(&s->seq_id, "seq_id"));
  uint8_t flags = 0;
  PS_RETURN_IF_ERROR(r.Get(&flags, "flags"));
  if (flags & ~kKnownFlags) {
    return absl::DataLossError(absl::StrCat("step plan: unknown sequence flags ", int{flags}));
  }
  s->sample = flags & kSample;
  s->new_state = flags & kNewState;
  s->fork_from = kNoSeq;
  if (flags & kFork) {
    PS_RETURN_IF_ERROR(r.Get(&s->fork_from, "fork_from"));
    if (s->fork_from == kNoSeq) return absl::DataLossError("step plan: fork flag without a parent");
  }
  s->num_draft_tokens = 0;
  if (flags & kDraft) {
    PS_RETURN_IF_ERROR(r.Get(&s->num_draft_tokens, "num_draft_tokens"));
    if (s->num_draft_tokens < 1)
      return absl::DataLossError("step plan: draft flag with no draft tokens");
  }
  s->prompt_logprobs = flags & kPromptLogprobs;
  s->next_prompt_token = -1;
  if (s->prompt_logprobs) PS_RETURN_IF_ERROR(r.Get(&s->next_prompt_token, "next_prompt_token"));
  PS_RETURN_IF_ERROR(r.GetVector(&s->token_ids, "token_ids"));
  PS_RETURN_IF_ERROR(r.Get(&s->start_pos, "start_pos"));
  PS_RETURN_IF_ERROR(r.Get(&s->block_table_start, "block_table_start"));
  PS_RETURN_IF_ERROR(r.GetVector(&s->block_table, "block_table"));
  PS_RETURN_IF_ERROR(r.Get(&s->num_samples, "num_samples"));
  if (!s->starts()) return absl::OkStatus();
  PS_RETURN_IF_ERROR(r.Get(&s->sample_index, "sample_index"));
  PS_RETURN_IF_ERROR(GetSampling(r, &s->sampling));
  PS_RETURN_IF_ERROR(GetStructuredOutput(r, &s->sampling.structured_output));
  PS_RETURN_IF_ERROR(r.Get(&s->num_prompt_tokens, "num_prompt_tokens"));
  return r.GetVector(&s->cached_prefix_token_ids, "cached_prefix_token_ids");
}

}  // namespace

std::string EncodeStepPlan(const StepPlan& p) {
  wire::Writer w;
  for (char c : kPlanMagic) w.Put(c);
  w.Put<uint64_t>(p.step_id);
  w.Put<uint64_t>(p.seqs.size());
  for (const SequenceStep& s : p.seqs) PutSequenceStep(w, s);
  w.PutVector(p.swap_out);
  w.PutVector(p.swap_in);
  w.PutVector(p.copy);
  w.PutVector(p.finished);
  w.Put<uint8_t>(p.shutdown);
  return std::move(w.buffer());
}

absl::StatusOr<StepPlan> DecodeStepPlan(std::string_view bytes) {
  wire::Reader r(bytes);
  StepPlan p;
  PS_RETURN_IF_ERROR(CheckMagic(r, kPlanMagic, "step plan"));
  PS_RETURN_IF_ERROR(r.Get(&p.step_id, "step_id"));
  uint64_t num_seqs = 0;
  PS_RETURN_IF_ERROR(r.Get(&num_seqs, "seqs.size"));
  PS_RETURN_IF_ERROR(r.CheckCount(num_seqs, 37, "seqs"));  // bytes of the smallest entry
  p.seqs.resize(num_seqs);
  for (SequenceStep& s : p.seqs) PS_RETURN_IF_ERROR(GetSequenceStep(r, &s));
  PS_RETURN_IF_ERROR(r.GetVector(&p.swap_out, "swap_out"));
  PS_RETURN_IF_ERROR(r.GetVector(&p.swap_in, "swap_in"));
  PS_RETURN_IF_ERROR(r.GetVector(&p.copy, "copy"));
  PS_RETURN_IF_ERROR(r.GetVector(&p.finished, "finished"));
  uint8_t shutdown = 0;
  PS_RETURN_IF_ERROR(r.Get(&shutdown, "shutdown"));
  p.shutdown = shutdown != 0;
  if (!r.done()) return absl::DataLossError("step plan: trailing bytes after 'shutdown'");
  return p;
}

std::string EncodeStepResult(const StepResult& res) {
  wire::Writer w;
  for (char c : kResultMagic) w.Put(c);
  w.Put<uint64_t>(res.step_id);
  w.Put<uint64_t>(res.tokens.size());
  for (const SampledToken& t : res.tokens) {
    w.Put<uint64_t>(t.seq_id);
    w.Put<int32_t>(t.token_id);
    w.Put<float>(t.logprob);
    w.PutVector(t.top_token_ids);
    w.PutVector(t.top_logprobs);
  }
  w.Put<uint64_t>(res.prompt_logprobs.size());
  for (const PromptLogprob& p : res.prompt_logprobs) {
    w.Put<uint64_t>(p.seq_id);
    w.Put<int32_t>(p.position);
    w.Put<int32_t>(p.token_id);
    w.Put<float>(p.logprob);
    w.Put<int32_t>(p.rank);
    w.PutVector(p.top_token_ids);
    w.PutVector(p.top_logprobs);
  }
  w.Put<uint64_t>(res.failed.size());
  for (const SequenceFailure& f : res.failed) {
    w.Put<uint64_t>(f.seq_id);
    w.PutString(f.message);
  }
  w.Put<uint64_t>(res.drafts.size());
  for (const ProposedDraft& d : res.drafts) {
    w.Put<uint64_t>(d.seq_id);
    w.PutVector(d.token_ids);
  }
  w.Put<double>(res.forward_seconds);
  w.Put<double>(res.collective_seconds);
  return std::move(w.buffer());
}

absl::StatusOr<StepResult> DecodeStepResult(std::string_view bytes) {
  wire::Reader r(bytes);
  StepResult res;
  PS_RETURN_IF_ERROR(CheckMagic(r, kResultMagic, "step result"));
  PS_RETURN_IF_ERROR(r.Get(&res.step_id, "step_id"));
  uint64_t n = 0;
  PS_RETURN_IF_ERROR(r.Get(&n, "tokens.size"));
  PS_RETURN_IF_ERROR(r.CheckCount(n, 32, "tokens"));
  res.tokens.resize(n);
  for (SampledToken& t : res.tokens) {
    PS_RETURN_IF_ERROR(r.Get(&t.seq_id, "seq_id"));
    PS_RETURN_IF_ERROR(r.Get(&t.token_id, "token_id"));
    PS_RETURN_IF_ERROR(r.Get(&t.logprob, "logprob"));
    PS_RETURN_IF_ERROR(r.GetVector(&t.top_token_ids, "top_token_ids"));
    PS_RETURN_IF_ERROR(r.GetVector(&t.top_logprobs, "top_logprobs"));
  }
  PS_RETURN_IF_ERROR(r.Get(&n, "prompt_logprobs.size"));
  PS_RETURN_IF_ERROR(r.CheckCount(n, 36, "prompt_logprobs"));
  res.prompt_logprobs.resize(n);
  for (PromptLogprob& p : res.prompt_logprobs) {
    PS_RETURN_IF_ERROR(r.Get(&p.seq_id, "prompt_logprobs.seq_id"));
    PS_RETURN_IF_ERROR(r.Get(&p.position, "prompt_logprobs.position"));
    PS_RETURN_IF_ERROR(r.Get(&p.token_id, "prompt_logprobs.token_id"));
    PS_RETURN_IF_ERROR(r.Get(&p.logprob, "prompt_logprobs.logprob"));
    PS_RETURN_IF_ERROR(r.Get(&p.rank, "prompt_logprobs.rank"));
    PS_RETURN_IF_ERROR(r.GetVector(&p.top_token_ids, "prompt_logprobs.top_token_ids"));
    PS_RETURN_IF_ERROR(r.GetVector(&p.top_logprobs, "prompt_logprobs.top_logprobs"));
  }
  PS_RETURN_IF_ERROR(r.Get(&n, "failed.size"));
  PS_RETURN_IF_ERROR(r.CheckCount(n, 16, "failed"));  // seq_id + an empty message
  res.failed.resize(n);
  for (SequenceFailure& f : res.failed) {
    PS_RETURN_IF_ERROR(r.Get(&f.seq_id, "failed.seq_id"));
    PS_RETURN_IF_ERROR(r.GetString(&f.message, "failed.message"));
  }
  PS_RETURN_IF_ERROR(r.Get(&n, "drafts.size"));
  PS_RETURN_IF_ERROR(r.CheckCount(n, 16, "drafts"));  // seq_id + an empty vector
  res.drafts.resize(n);
  for (ProposedDraft& d : res.drafts) {
    PS_RETURN_IF_ERROR(r.Get(&d.seq_id, "drafts.seq_id"));
    PS_RETURN_IF_ERROR(r.GetVector(&d.token_ids, "drafts.token_ids"));
  }
  PS_RETURN_IF_ERROR(r.Get(&res.forward_seconds, "forward_seconds"));
  PS_RETURN_IF_ERROR(r.Get(&res.collective_seconds, "collective_seconds"));
  if (!r.done())
    return absl::DataLossError("step result: trailing bytes after 'collective_seconds'");
  return res;
}

}  // namespace pagedserve
