#include "runtime/worker/draft_model.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"
#include "runtime/worker/block_table_update.h"
#include "runtime/worker/cpu_backend.h"

namespace pagedserve {
namespace {

// Most tokens one catch-up pass feeds (bounds the draft's activations when a
// sequence's first speculation feeds its whole prompt).
constexpr int64_t kMaxPassTokens = 512;

}  // namespace

absl::StatusOr<std::unique_ptr<DraftModel>> DraftModel::Create(const std::string& path,
                                                               WeightDType dtype,
                                                               const ModelConfig& target,
                                                               int64_t max_model_len,
                                                               Communicator* comm) {
  absl::StatusOr<LlamaWeights> loaded = LoadLlamaWeights(path, comm->rank(), comm->size(), dtype);
  if (!loaded.ok()) {
    return absl::Status(loaded.status().code(),
                        absl::StrCat("draft model: ", loaded.status().message()));
  }
  LlamaWeights weights = *std::move(loaded);
  if (weights.config.vocab_size != target.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft model '", path, "' has a vocabulary of ", weights.config.vocab_size,
                     " tokens, the target ", target.vocab_size,
                     ": a draft model must share the target's vocabulary"));
  }
  SelectLongRopeFactors(max_model_len, &weights.config);
  auto d = std::unique_ptr<DraftModel>(new DraftModel());
  d->comm_ = comm;
  PS_ASSIGN_OR_RETURN(d->model_,
                      LlamaModel::Create(std::move(weights), comm, MakeCpuBackend(comm)));
  return d;
}

kernels::KVCacheShape DraftModel::CacheShape(int block_size, kernels::DType dtype) const {
  kernels::KVCacheShape shape;
  shape.num_kv_heads = model_->local_num_kv_heads();
  shape.head_size = model_->config().head_size;
  shape.block_size = block_size;
  shape.dtype = dtype;
  return shape;
}

int64_t DraftModel::BytesPerBlock(int block_size, kernels::DType dtype) const {
  return static_cast<int64_t>(CacheShape(block_size, dtype).block_bytes()) * 2 *
         model_->config().num_layers;
}

absl::Status DraftModel::AllocateCaches(int block_size, kernels::DType dtype,
                                        int64_t num_device_blocks, int64_t num_cpu_blocks) {
  block_size_ = block_size;
  PS_RETURN_IF_ERROR(
      model_->AllocateCaches(CacheShape(block_size, dtype), num_device_blocks, num_cpu_blocks));
  const auto dev = model_->device_cache();
  const auto cpu = model_->cpu_cache();
  device_layers_.assign(dev.begin(), dev.end());
  cpu_layers_.assign(cpu.begin(), cpu.end());
  return absl::OkStatus();
}

void DraftModel::Batch::Clear() {
  seq.clear();
  first_pos.clear();
  token_ids.clear();
  positions.clear();
  qsl.assign(1, 0);
  seq_lens.clear();
  logits_rows.clear();
  slots.clear();
  rows.clear();
}

void DraftModel::Batch::Add(int i, const StepPlanMirror::Sequence& st, int32_t begin, int32_t end,
                            bool want_logits, int32_t block_size) {
  seq.push_back(i);
  first_pos.push_back(begin);
  rows.push_back(&st);
  for (int32_t pos = begin; pos < end; ++pos) {
    token_ids.push_back(st.history[pos]);
    positions.push_back(pos);
    slots.push_back(static_cast<int64_t>(st.block_table[pos / block_size]) * block_size +
                    pos % block_size);
  }
  qsl.push_back(static_cast<int32_t>(token_ids.size()));
  seq_lens.push_back(end);
  if (want_logits) logits_rows.push_back(qsl.back() - 1);
}

absl::StatusOr<std::vector<int32_t>> DraftModel::Run(const Batch& b) {
  int max_blocks = 0;
  const std::vector<int32_t> block_tables = BuildBlockTable(b.rows, &max_blocks);
  ForwardBatch batch;
  batch.token_ids = b.token_ids;
  batch.positions = b.positions;
  batch.slot_mapping = b.slots;
  batch.query_start_loc = b.qsl;
  batch.seq_lens = b.seq_lens;
  batch.block_tables = block_tables;
  batch.max_blocks_per_seq = max_blocks;
  batch.logits_rows = b.logits_rows;
  RowSampling greedy;
  greedy.mode = RowSampling::Mode::kGreedy;
  const std::vector<RowSampling> reduce(b.logits_rows.size(), greedy);
  SampledRows out;
  PS_RETURN_IF_ERROR(model_->Forward(batch, device_layers_, reduce, &out, &logits_));
  if (out.tokens.size() != b.logits_rows.size())
    return absl::InternalError(absl::StrCat("draft model: ", out.tokens.size(), " argmaxes for ",
                                            b.logits_rows.size(), " rows"));
  // An argmax over a row of NaN is some token: the target rejects it if wrong.
  for (int32_t& t : out.tokens) t = std::clamp(t, 0, model_->config().vocab_size - 1);
  PS_RETURN_IF_ERROR(AgreeOnRankZero(&out.tokens));
  return std::move(out.tokens);
}

absl::Status DraftModel::AgreeOnRankZero(std::vector<int32_t>* tokens) {
  if (comm_->size() <= 1 || tokens->empty()) return absl::OkStatus();
  // Token ids are below 2^24, exact in fp32.
  const size_t n = tokens->size();
  std::vector<float> mine(tokens->begin(), tokens->end());
  std::vector<float> all(n * static_cast<size_t>(comm_->size()));
  PS_RETURN_IF_ERROR(comm_->AllGather(mine.data(), all.data(), n));
  for (size_t j = 0; j < n; ++j) (*tokens)[j] = static_cast<int32_t>(all[j]);
  return absl::OkStatus();
}

absl::Status DraftModel::Propose(const StepPlan& plan, StepPlanMirror* mirror,
                                 std::vector<ProposedDraft>* drafts) {
  absl::Status status = ProposeSteps(plan, mirror, drafts);
  // Also after an error: the coordinator fails the plan's sequences.
  for (SeqId id : plan.finished) computed_.erase(id);
  return status;
}

absl::Status DraftModel::ProposeSteps(const StepPlan& plan, StepPlanMirror* mirror,
                                      std::vector<ProposedDraft>* drafts) {
  const int num_seqs = static_cast<int>(plan.seqs.size());
  // Drafts to propose per entry (0: the draft does nothing for it).
  std::vector<int32_t> k(num_seqs, 0);
  // Per speculating entry: the first position whose draft K/V is missing.
  std::vector<int32_t> from(num_seqs, 0);
  int32_t k_max = 0;
  int64_t catch_up = 0;  // tokens before the entries' last verified ones
  for (int i = 0; i < num_seqs; ++i) {
    const SequenceStep& s = plan.seqs[i];
    const auto n = static_cast<int32_t>(s.token_ids.size());
    const int32_t d = s.num_draft_tokens;
    const auto holes =
        std::count(s.token_ids.end() - std::clamp(d, 0, n), s.token_ids.end(), kNoToken);
    if (holes > 0 && (holes != d || !s.sample || d >= n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("step ", plan.step_id, ": sequence ", s.seq_id, " has ", holes,
                       " placeholder draft tokens of ", d, " (all or none, on a sampled entry)"));
    }
    // The draft K/V valid before this step (the pre-plan state; a fork
    // reads its parent's), up to the step's start: later positions are
    // rewritten. A (re)started sequence has none of its own: its cached
    // blocks may come from steps the draft did not run.
    int32_t valid = 0;
    if (!s.new_state) {
      const auto it = computed_.find(s.fork_from != kNoSeq ? s.fork_from : s.seq_id);
      valid = it == computed_.end() ? 0 : it->second;
    }
    from[i] = std::min(valid, s.start_pos);
    if (holes == 0) continue;
    k[i] = d;
    k_max = std::max(k_max, d);
    catch_up += s.start_pos - from[i];
    if (mirror->Find(s.seq_id) == nullptr)
      return absl::InternalError("draft model: a plan sequence has no state");
  }
  // Entries that do not speculate keep what is still valid.
  for (int i = 0; i < num_seqs; ++i) {
    if (k[i] > 0) continue;
    if (from[i] > 0) {
      computed_[plan.seqs[i].seq_id] = from[i];
    } else {
      computed_.erase(plan.seqs[i].seq_id);
    }
  }
  if (k_max == 0) return absl::OkStatus();
  // Catch-up passes of at most kMaxPassTokens tokens while there are more
  // (a sequence's first speculation feeds its whole prompt), then one pass
  // that feeds the rest and each entry's last verified token t.
  while (catch_up > kMaxPassTokens) {
    batch_.Clear();
    int64_t budget = kMaxPassTokens;
    for (int i = 0; i < num_seqs && budget > 0; ++i) {
      const int32_t t_pos = plan.seqs[i].start_pos;
      if (k[i] == 0 || from[i] >= t_pos) continue;
      const auto take = static_cast<int32_t>(std::min<int64_t>(budget, t_pos - from[i]));
      batch_.Add(i, *mirror->Find(plan.seqs[i].seq_id), from[i], from[i] + take, false,
                 block_size_);
      from[i] += take;
      budget -= take;
      catch_up -= take;
    }
    PS_RETURN_IF_ERROR(Run(batch_).status());
    for (size_t r = 0; r < batch_.seq.size(); ++r)
      computed_[plan.seqs[batch_.seq[r]].seq_id] = batch_.seq_lens[r];
  }
  batch_.Clear();
  for (int i = 0; i < num_seqs; ++i) {
    if (k[i] == 0) continue;
    const SequenceStep& s = plan.seqs[i];
    batch_.Add(i, *mirror->Find(s.seq_id), from[i], s.start_pos + 1, true, block_size_);
  }
  std::vector<std::vector<int32_t>> proposed(num_seqs);
  {
    PS_ASSIGN_OR_RETURN(std::vector<int32_t> first, Run(batch_));
    for (size_t r = 0; r < batch_.seq.size(); ++r) {
      const int i = batch_.seq[r];
      computed_[plan.seqs[i].seq_id] = batch_.seq_lens[r];
      proposed[i].push_back(first[r]);
    }
  }
  // Draft steps 2..k: each speculating entry feeds its previous draft token.
  for (int32_t j = 1; j < k_max; ++j) {
    batch_.Clear();
    for (int i = 0; i < num_seqs; ++i) {
      if (k[i] <= j) continue;
      const SequenceStep& s = plan.seqs[i];
      const int32_t pos = s.context_len() - k[i] - 1 + j;  // of draft token j (1-based)
      PS_RETURN_IF_ERROR(mirror->SetProposedTokens(s.seq_id, pos, {&proposed[i].back(), 1}));
      batch_.Add(i, *mirror->Find(s.seq_id), pos, pos + 1, true, block_size_);
    }
    PS_ASSIGN_OR_RETURN(std::vector<int32_t> next, Run(batch_));
    for (size_t r = 0; r < batch_.seq.size(); ++r) {
      const int i = batch_.seq[r];
      computed_[plan.seqs[i].seq_id] = batch_.seq_lens[r];
      proposed[i].push_back(next[r]);
    }
  }
  for (int i = 0; i < num_seqs; ++i) {
    if (k[i] == 0) continue;
    const SequenceStep& s = plan.seqs[i];
    // The last draft token is fed to the target only.
    PS_RETURN_IF_ERROR(
        mirror->SetProposedTokens(s.seq_id, s.context_len() - 1, {&proposed[i].back(), 1}));
    drafts->push_back({s.seq_id, std::move(proposed[i])});
  }
  return absl::OkStatus();
}

}  // namespace pagedserve
