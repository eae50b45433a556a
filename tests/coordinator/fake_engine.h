// Test harness: a fake worker that applies step plans to a fake KV store and
// a fake model whose next token depends on the K/V it reads.
//
// The KV store keeps one int per slot of every device and CPU block (the token
// id whose "K/V" the slot holds; -1 initially). Per plan it applies, in the
// documented order, swap_out, swap_in and copy, then writes every fed token
// into plan.slot_mapping[t], then reads each sequence's whole context through
// its block table. The fake model samples a token from a hash of that context,
// so any misplaced block changes the output; the harness also checks the
// context equals the worker's own per-sequence history (built from the plan's
// new_state / cached_prefix_token_ids / fork_from fields), which must equal
// the scheduler's token list.
#ifndef PAGEDSERVE_TESTS_COORDINATOR_FAKE_ENGINE_H_
#define PAGEDSERVE_TESTS_COORDINATOR_FAKE_ENGINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "runtime/common/step_plan.h"

namespace pagedserve::testing {

#define PS_CHECK_OK(expr)                          \
  do {                                             \
    if (absl::Status st_ = (expr); !st_.ok()) return st_; \
  } while (0)

class FakeEngine {
 public:
  FakeEngine(int32_t num_device_blocks, int32_t num_cpu_blocks, int32_t block_size, int32_t vocab = 1000,
             int32_t eos = -1)
      : bs_(block_size), vocab_(vocab), eos_(eos),
        dev_(static_cast<size_t>(num_device_blocks) * block_size, -1),
        cpu_(static_cast<size_t>(num_cpu_blocks) * block_size, -1) {}

  // Runs one plan. On success fills *result; an error describes the first
  // inconsistency (wrong context, bad slot, ...).
  absl::Status Run(const StepPlan& plan, StepResult* result) {
    result->step_id = plan.step_id;
    result->tokens.clear();
    for (const BlockPair& p : plan.swap_out) PS_CHECK_OK(CopyBlock(dev_, p.src, cpu_, p.dst));
    for (const BlockPair& p : plan.swap_in) PS_CHECK_OK(CopyBlock(cpu_, p.src, dev_, p.dst));
    for (const BlockPair& p : plan.copy) PS_CHECK_OK(CopyBlock(dev_, p.src, dev_, p.dst));
    // Forks read the parent's history as it was before this step.
    absl::flat_hash_map<SeqId, std::vector<int32_t>> forked;
    for (const SequenceStep& s : plan.seqs) {
      if (s.fork_from != kNoSeq) {
        auto it = history_.find(s.fork_from);
        if (it == history_.end()) return absl::InternalError(absl::StrCat("fork from unknown seq ", s.fork_from));
        forked[s.seq_id] = it->second;
      }
    }
    size_t t = 0;
    for (const SequenceStep& s : plan.seqs) {
      std::vector<int32_t>& h = history_[s.seq_id];
      if (s.new_state) {
        h = s.cached_prefix_token_ids;
        if (static_cast<int32_t>(h.size()) != s.start_pos) {
          return absl::InternalError(absl::StrCat("seq ", s.seq_id, ": cached prefix has ", h.size(),
                                                  " tokens, start_pos ", s.start_pos));
        }
      } else if (s.fork_from != kNoSeq) {
        h = forked[s.seq_id];
      }
      if (static_cast<int32_t>(h.size()) != s.start_pos) {
        return absl::InternalError(absl::StrCat("seq ", s.seq_id, ": worker history ", h.size(),
                                                " tokens but start_pos ", s.start_pos));
      }
      h.insert(h.end(), s.token_ids.begin(), s.token_ids.end());
      for (size_t i = 0; i < s.token_ids.size(); ++i, ++t) {
        if (t >= plan.slot_mapping.size()) return absl::InternalError("slot_mapping too short");
        const int64_t pos = s.start_pos + static_cast<int64_t>(i);
        const int64_t want = static_cast<int64_t>(s.block_table.at(pos / bs_)) * bs_ + pos % bs_;
        if (plan.slot_mapping[t] != want) {
          return absl::InternalError(absl::StrCat("seq ", s.seq_id, " pos ", pos, ": slot ", plan.slot_mapping[t],
                                                  " but block table gives ", want));
        }
        if (want < 0 || want >= static_cast<int64_t>(dev_.size())) return absl::InternalError("slot out of range");
        dev_[want] = s.token_ids[i];
      }
    }
    if (t != plan.slot_mapping.size()) return absl::InternalError("slot_mapping too long");
    for (const SequenceStep& s : plan.seqs) {
      // "Attention": read the whole context through the block table.
      std::vector<int32_t> ctx(s.context_len());
      for (int32_t p = 0; p < s.context_len(); ++p) {
        ctx[p] = dev_.at(static_cast<size_t>(s.block_table.at(p / bs_)) * bs_ + p % bs_);
      }
      if (ctx != history_[s.seq_id]) {
        return absl::InternalError(absl::StrCat("step ", plan.step_id, " seq ", s.seq_id,
                                                ": KV context differs from the sequence's history"));
      }
      if (!s.sample) continue;
      for (int32_t k = 0; k < s.num_samples; ++k) {
        SampledToken tok;
        tok.seq_id = s.seq_id;
        tok.token_id = NextToken(ctx, s.sample_index + k);
        result->tokens.push_back(tok);
      }
    }
    for (SeqId id : plan.finished) history_.erase(id);
    return absl::OkStatus();
  }

  const std::vector<int32_t>* history(SeqId id) const {
    auto it = history_.find(id);
    return it == history_.end() ? nullptr : &it->second;
  }

 private:
  absl::Status CopyBlock(const std::vector<int32_t>& from, int32_t src, std::vector<int32_t>& to, int32_t dst) {
    if (src < 0 || dst < 0 || static_cast<size_t>(src + 1) * bs_ > from.size() ||
        static_cast<size_t>(dst + 1) * bs_ > to.size()) {
      return absl::InternalError(absl::StrCat("block op (", src, ", ", dst, ") out of range"));
    }
    std::copy(from.begin() + static_cast<size_t>(src) * bs_, from.begin() + static_cast<size_t>(src + 1) * bs_,
              to.begin() + static_cast<size_t>(dst) * bs_);
    return absl::OkStatus();
  }

  int32_t NextToken(const std::vector<int32_t>& ctx, int32_t sample_index) const {
    uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(sample_index) * 0x9E3779B97F4A7C15ull;
    for (int32_t v : ctx) h = (h ^ static_cast<uint32_t>(v)) * 1099511628211ull;
    h ^= h >> 29;
    int32_t tok = static_cast<int32_t>(h % static_cast<uint64_t>(vocab_));
    if (eos_ >= 0 && tok == eos_ && ctx.size() < 8) tok = (tok + 1) % vocab_;  // no instant EOS
    return tok;
  }

  int32_t bs_, vocab_, eos_;
  std::vector<int32_t> dev_, cpu_;
  absl::flat_hash_map<SeqId, std::vector<int32_t>> history_;
};

#undef PS_CHECK_OK

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_COORDINATOR_FAKE_ENGINE_H_
