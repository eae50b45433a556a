// A model-free Executor for engine tests: every sequence emits a scripted
// token list chosen by the first token of its prompt and its sample index,
// following the step plans exactly as a worker would (per-sequence state from
// new_state / fork_from, dropped on `finished`). It also checks the plans it
// gets through a StepPlanMirror: block-table deltas that apply, rows covering
// the context, blocks inside the pool.
#ifndef PAGEDSERVE_TESTS_ENGINE_SCRIPTED_EXECUTOR_H_
#define PAGEDSERVE_TESTS_ENGINE_SCRIPTED_EXECUTOR_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/common/step_plan_mirror.h"
#include "runtime/engine/executor.h"

namespace pagedserve::testing {

class ScriptedExecutor : public Executor {
 public:
  // script[key][sample] = tokens emitted in order; past the end: `filler`.
  using Script = std::map<int32_t, std::vector<std::vector<int32_t>>>;

  ScriptedExecutor(Script script, int64_t device_blocks, int64_t cpu_blocks, int32_t block_size,
                   int32_t filler)
      : script_(std::move(script)),
        device_blocks_(device_blocks),
        cpu_blocks_(cpu_blocks),
        filler_(filler),
        mirror_(block_size, device_blocks) {}

  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    ++executed_;
    if (fail_at_ > 0 && executed_ >= fail_at_)
      return absl::UnavailableError("scripted worker failure");
    StepResult r;
    r.step_id = plan.step_id;
    for (const SequenceStep& st : plan.seqs) {
      if (st.new_state) {
        const int32_t key = st.start_pos == 0 ? st.token_ids[0] : st.cached_prefix_token_ids[0];
        seqs_[st.seq_id] = {key};
      } else if (st.fork_from != kNoSeq) {
        auto it = seqs_.find(st.fork_from);
        if (it == seqs_.end()) return absl::InternalError("fork from an unknown sequence");
        const Seq parent = it->second;  // copy first: operator[] may rehash and move it
        seqs_[st.seq_id] = parent;
      }
    }
    // Block tables (covering each context, blocks in range), histories and
    // sampling parameters, from the plan's deltas as a worker keeps them.
    if (absl::Status s = mirror_.Apply(plan); !s.ok()) return absl::InternalError(s.message());
    for (const SequenceStep& st : plan.seqs) {
      auto it = seqs_.find(st.seq_id);
      if (it == seqs_.end())
        return absl::InternalError(absl::StrCat("unknown sequence ", st.seq_id));
      if (!st.sample) continue;
      const StepPlanMirror::Sequence& m = *mirror_.Find(st.seq_id);
      const int32_t generated = st.context_len() - m.num_prompt_tokens;
      if (it->second.key == unsampleable_key_ && generated == unsampleable_at_) {
        // As a worker whose logits row for this sequence held a NaN.
        for (int32_t k = 0; k < st.num_samples; ++k)
          r.tokens.push_back(SampledToken{st.seq_id, kNoToken, 0.0f, {}, {}});
        r.failed.push_back({st.seq_id, "sampler row 0 (seq 1): logit of token 7 is nan"});
        continue;
      }
      for (int32_t k = 0; k < st.num_samples; ++k) {
        SampledToken t;
        t.seq_id = st.seq_id;
        t.token_id = Token(it->second.key, m.sample_index + k, generated);
        t.logprob = -0.25f * static_cast<float>(generated + 1);
        if (m.sampling.logprobs > 0) {
          t.top_token_ids = {t.token_id};
          t.top_logprobs = {t.logprob};
        }
        r.tokens.push_back(t);
      }
    }
    for (SeqId id : plan.finished) seqs_.erase(id);
    max_step_tokens_ = std::max<int64_t>(max_step_tokens_, plan.num_tokens());
    return r;
  }
  absl::Status Shutdown() override { return absl::OkStatus(); }
  int64_t num_device_blocks() const override { return device_blocks_; }
  int64_t num_cpu_blocks() const override { return cpu_blocks_; }

  void FailAt(int step) { fail_at_ = step; }
  // Sequences whose script key is `key` cannot be sampled at output position
  // `generated` (StepResult::failed), the others run on.
  void UnsampleableAt(int32_t key, int32_t generated) {
    unsampleable_key_ = key;
    unsampleable_at_ = generated;
  }
  size_t live_sequences() const { return seqs_.size(); }

 private:
  struct Seq {
    int32_t key = 0;
  };
  int32_t Token(int32_t key, int32_t sample, int32_t generated) const {
    auto it = script_.find(key);
    if (it == script_.end() || sample >= static_cast<int32_t>(it->second.size())) return filler_;
    const std::vector<int32_t>& s = it->second[sample];
    return generated < static_cast<int32_t>(s.size()) ? s[generated] : filler_;
  }

  Script script_;
  int64_t device_blocks_, cpu_blocks_;
  int32_t filler_;
  absl::flat_hash_map<SeqId, Seq> seqs_;
  StepPlanMirror mirror_;
  int executed_ = 0;
  int fail_at_ = 0;
  int32_t unsampleable_key_ = -1, unsampleable_at_ = -1;
  int64_t max_step_tokens_ = 0;
};

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_ENGINE_SCRIPTED_EXECUTOR_H_
