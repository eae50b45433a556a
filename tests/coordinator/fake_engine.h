// Test harness: a fake worker that applies step plans to a fake KV store and
// a fake model whose next token depends on the K/V it reads.
//
// The KV store keeps one int per slot of every device and CPU block (the token
// id whose "K/V" the slot holds; -1 initially). Per plan it applies, in the
// documented order, swap_out, swap_in and copy, then the plan's incremental
// sequence entries to its StepPlanMirror (block-table rows, histories), then
// writes every fed token into its slot (derived from the mirrored rows, as a
// worker does), then reads each sequence's whole context through its mirrored
// block table. The fake model samples a token from a hash of that context, so
// any misplaced block or wrong block-table delta changes the output; the
// harness also checks that the context equals the mirrored history (built from
// new_state / cached_prefix_token_ids / fork_from and the fed tokens), which
// must equal the scheduler's token list.
#ifndef PAGEDSERVE_TESTS_COORDINATOR_FAKE_ENGINE_H_
#define PAGEDSERVE_TESTS_COORDINATOR_FAKE_ENGINE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/common/step_plan.h"
#include "runtime/common/step_plan_mirror.h"

namespace pagedserve::testing {

#define PS_CHECK_OK(expr)                                 \
  do {                                                    \
    if (absl::Status st_ = (expr); !st_.ok()) return st_; \
  } while (0)

class FakeEngine {
 public:
  FakeEngine(int32_t num_device_blocks, int32_t num_cpu_blocks, int32_t block_size,
             int32_t vocab = 1000, int32_t eos = -1)
      : bs_(block_size),
        vocab_(vocab),
        eos_(eos),
        dev_(static_cast<size_t>(num_device_blocks) * block_size, -1),
        cpu_(static_cast<size_t>(num_cpu_blocks) * block_size, -1),
        mirror_(block_size, num_device_blocks) {}

  // Runs one plan. On success fills *result; an error describes the first
  // inconsistency (wrong context, bad slot, bad delta, ...).
  absl::Status Run(const StepPlan& plan, StepResult* result) {
    result->step_id = plan.step_id;
    result->tokens.clear();
    result->drafts.clear();
    for (const BlockPair& p : plan.swap_out) PS_CHECK_OK(CopyBlock(dev_, p.src, cpu_, p.dst));
    for (const BlockPair& p : plan.swap_in) PS_CHECK_OK(CopyBlock(cpu_, p.src, dev_, p.dst));
    for (const BlockPair& p : plan.copy) PS_CHECK_OK(CopyBlock(dev_, p.src, dev_, p.dst));
    // The scheduler never rewinds a sequence: each entry continues exactly
    // where the worker's history ends (or where its cached prefix ends).
    for (const SequenceStep& s : plan.seqs) {
      const StepPlanMirror::Sequence* m = mirror_.Find(s.seq_id);
      size_t have = 0;
      if (s.new_state) {
        have = s.cached_prefix_token_ids.size();
      } else if (s.fork_from != kNoSeq) {
        const StepPlanMirror::Sequence* parent = mirror_.Find(s.fork_from);
        have = parent ? parent->history.size() : 0;
      } else if (m != nullptr) {
        have = m->history.size();
      }
      // ... except after a verification step, which rewinds over the
      // rejected part of its draft (at most the draft).
      auto drafted = last_draft_.find(s.seq_id);
      const size_t rewind = !s.starts() && drafted != last_draft_.end() ? drafted->second : 0;
      if (have < static_cast<size_t>(s.start_pos) || have > s.start_pos + rewind) {
        return absl::InternalError(absl::StrCat("step ", plan.step_id, " seq ", s.seq_id,
                                                ": worker history ", have, " tokens but start_pos ",
                                                s.start_pos));
      }
    }
    PS_CHECK_OK(mirror_.Apply(plan));
    for (const SequenceStep& s : plan.seqs) last_draft_[s.seq_id] = s.num_draft_tokens;
    PS_CHECK_OK(ProposeDrafts(plan, result));
    std::vector<int64_t> slots;
    mirror_.AppendSlotMapping(plan, &slots);
    size_t t = 0;
    for (const SequenceStep& s : plan.seqs) {
      const std::vector<int32_t>& history = mirror_.Find(s.seq_id)->history;
      for (size_t i = 0; i < s.token_ids.size(); ++i, ++t) {
        if (slots[t] < 0 || slots[t] >= static_cast<int64_t>(dev_.size())) {
          return absl::InternalError("slot out of range");
        }
        dev_[slots[t]] = history[s.start_pos + i];  // placeholders filled
      }
    }
    for (const SequenceStep& s : plan.seqs) {
      // "Attention": read the whole context through the mirrored block table.
      const StepPlanMirror::Sequence& m = *mirror_.Find(s.seq_id);
      std::vector<int32_t> ctx(s.context_len());
      for (int32_t p = 0; p < s.context_len(); ++p) {
        ctx[p] = dev_.at(static_cast<size_t>(m.block_table.at(p / bs_)) * bs_ + p % bs_);
      }
      if (ctx != m.history) {
        return absl::InternalError(
            absl::StrCat("step ", plan.step_id, " seq ", s.seq_id,
                         ": KV context differs from the sequence's history"));
      }
      if (!s.sample) continue;
      // Speculative verification: a sample after each of the last
      // num_draft_tokens + 1 fed tokens, from the context up to it.
      if (s.num_draft_tokens < 0 ||
          s.num_draft_tokens >= static_cast<int32_t>(s.token_ids.size()) ||
          (s.num_draft_tokens > 0 && s.num_samples != 1)) {
        return absl::InternalError(absl::StrCat("step ", plan.step_id, " seq ", s.seq_id, ": ",
                                                s.num_draft_tokens, " draft tokens"));
      }
      for (int32_t back = s.num_draft_tokens; back >= 0; --back) {
        const std::vector<int32_t> pre(ctx.begin(), ctx.end() - back);
        for (int32_t k = 0; k < s.num_samples; ++k) {
          SampledToken tok;
          tok.seq_id = s.seq_id;
          tok.token_id = NextToken(pre, m.sample_index + k);
          if (m.sampling.logprobs > 0) {
            TopLogprobs(pre, m.sampling.logprobs, &tok);
            tok.token_id = tok.top_token_ids[0];
          }
          result->tokens.push_back(tok);
        }
      }
    }
    return absl::OkStatus();
  }

  const StepPlanMirror& mirror() const { return mirror_; }
  const std::vector<int32_t>* history(SeqId id) const {
    const StepPlanMirror::Sequence* m = mirror_.Find(id);
    return m == nullptr ? nullptr : &m->history;
  }

 private:
  absl::Status CopyBlock(const std::vector<int32_t>& from, int32_t src, std::vector<int32_t>& to,
                         int32_t dst) {
    if (src < 0 || dst < 0 || static_cast<size_t>(src + 1) * bs_ > from.size() ||
        static_cast<size_t>(dst + 1) * bs_ > to.size()) {
      return absl::InternalError(absl::StrCat("block op (", src, ", ", dst, ") out of range"));
    }
    std::copy(from.begin() + static_cast<size_t>(src) * bs_,
              from.begin() + static_cast<size_t>(src + 1) * bs_,
              to.begin() + static_cast<size_t>(dst) * bs_);
    return absl::OkStatus();
  }

  // A fake draft model (SequenceStep::num_draft_tokens placeholders): each
  // draft token is a function of the context before it, independent of the
  // fake target's (so with a small vocabulary drafts match often, not always).
  absl::Status ProposeDrafts(const StepPlan& plan, StepResult* result) {
    for (const SequenceStep& s : plan.seqs) {
      const int32_t d = s.num_draft_tokens;
      if (d <= 0 || s.token_ids.back() != kNoToken) continue;
      const StepPlanMirror::Sequence& m = *mirror_.Find(s.seq_id);
      std::vector<int32_t> ctx(m.history.begin(), m.history.end() - d);
      ProposedDraft pd{s.seq_id, {}};
      for (int32_t j = 0; j < d; ++j) {
        pd.token_ids.push_back(NextToken(ctx, 1000 + m.sample_index));
        ctx.push_back(pd.token_ids.back());
      }
      PS_CHECK_OK(mirror_.SetProposedTokens(s.seq_id, s.context_len() - d, pd.token_ids));
      result->drafts.push_back(std::move(pd));
    }
    return absl::OkStatus();
  }

  // A fake top-n list (what beam search reads): n distinct token ids with
  // strictly decreasing logprobs < 0, a function of the context alone.
  void TopLogprobs(const std::vector<int32_t>& ctx, int32_t n, SampledToken* tok) const {
    uint64_t h = 0xcbf29ce484222325ull;
    for (int32_t v : ctx) h = (h ^ static_cast<uint32_t>(v)) * 1099511628211ull;
    auto next = [&h] {
      h ^= h >> 31;
      h *= 0x9E3779B97F4A7C15ull;
      h ^= h >> 29;
      return h;
    };
    std::vector<bool> used(vocab_, false);
    double lp = -0.05 - static_cast<double>(next() % 1000) / 400.0;
    for (int32_t j = 0; j < n && j < vocab_; ++j) {
      int32_t id = static_cast<int32_t>(next() % static_cast<uint64_t>(vocab_));
      while (used[id]) id = (id + 1) % vocab_;
      used[id] = true;
      tok->top_token_ids.push_back(id);
      tok->top_logprobs.push_back(static_cast<float>(lp));
      lp -= 0.01 + static_cast<double>(next() % 1000) / 800.0;
    }
    tok->logprob = tok->top_logprobs[0];
  }

  int32_t NextToken(const std::vector<int32_t>& ctx, int32_t sample_index) const {
    uint64_t h =
        1469598103934665603ull ^ static_cast<uint64_t>(sample_index) * 0x9E3779B97F4A7C15ull;
    for (int32_t v : ctx) h = (h ^ static_cast<uint32_t>(v)) * 1099511628211ull;
    h ^= h >> 29;
    int32_t tok = static_cast<int32_t>(h % static_cast<uint64_t>(vocab_));
    if (eos_ >= 0 && tok == eos_ && ctx.size() < 8) tok = (tok + 1) % vocab_;  // no instant EOS
    return tok;
  }

  int32_t bs_, vocab_, eos_;
  std::vector<int32_t> dev_, cpu_;
  StepPlanMirror mirror_;
  std::map<SeqId, int32_t> last_draft_;  // draft tokens of each sequence's last step
};

#undef PS_CHECK_OK

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_COORDINATOR_FAKE_ENGINE_H_
