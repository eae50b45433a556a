#include "runtime/worker/worker.h"

#include <algorithm>
#include <chrono>

#include "absl/random/distributions.h"
#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/weights.h"
#include "runtime/worker/block_table_update.h"
#include "runtime/worker/cpu_backend.h"
#include "runtime/worker/cuda/cuda_backend.h"

namespace pagedserve {
namespace {

// How the backend may reduce a sampled row (ModelBackend::LmHeadSample):
// valid params without beams (whose scores need every logprob), and
// num_samples within the sampler's [1, 64], are a plain argmax when greedy
// without penalties or logprobs and the sampler's steps 1-7 (with its
// logprobs) otherwise; rows with logit_bias, min_tokens or bad_words and
// anything else go to the sampler as logits (which
// also reports the errors).
RowSampling::Mode ReducibleMode(const SamplingParams& p, int32_t num_samples) {
  // Structured output masks the logits on the host (Sampler, allowed_tokens).
  if (p.use_beam_search || num_samples < 1 || num_samples > 64 || !p.Validate().ok() ||
      p.structured_output.active())
    return RowSampling::Mode::kLogits;
  // The sampler's steps 1a-1c (logit_bias, min_tokens, bad_words) run on the host.
  if (!p.logit_bias.empty() || p.min_tokens > 0 || !p.bad_words_token_ids.empty())
    return RowSampling::Mode::kLogits;
  const bool penalties =
      p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  return p.greedy() && !penalties && p.logprobs < 0 ? RowSampling::Mode::kGreedy
                                                    : RowSampling::Mode::kSample;
}

// The KV cache element type of --kv-cache-dtype auto (see WorkerOptions).
kernels::DType AutoKvDType(WeightDType dtype) {
  switch (dtype) {
    case WeightDType::kFloat32: return kernels::DType::kFloat32;
    case WeightDType::kBFloat16: return kernels::DType::kBFloat16;
    default: return kernels::DType::kFloat16;
  }
}

}  // namespace

WeightDType ResolveWeightDType(const WorkerOptions& options, const ModelConfig* model) {
  if (options.device != kernels::Device::kCUDA || options.dtype != WeightDType::kAuto)
    return options.dtype;
  return model != nullptr && model->checkpoint_dtype == "float16" ? WeightDType::kFloat16
                                                                  : WeightDType::kBFloat16;
}

kernels::DType ResolveKvCacheDType(const WorkerOptions& options, const ModelConfig* model) {
  return options.kv_cache_dtype.value_or(AutoKvDType(ResolveWeightDType(options, model)));
}

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(const WorkerOptions& options,
                                                       Communicator* comm) {
  if (comm == nullptr) return absl::InvalidArgumentError("Worker: null communicator");
  if (!kernels::IsSupportedBlockSize(options.block_size))
    return absl::InvalidArgumentError(
        absl::StrCat("--block-size ", options.block_size, " is not supported (8, 16 or 32)"));

  // The backend is the only thing the device changes.
  const bool cuda = options.device == kernels::Device::kCUDA;
  ModelConfig checkpoint;  // only for the CUDA worker's --dtype auto
  if (cuda && options.dtype == WeightDType::kAuto) {
    PS_ASSIGN_OR_RETURN(checkpoint, LoadModelConfig(options.model_path));
  }
  const WeightDType load_dtype = ResolveWeightDType(options, &checkpoint);
  const kernels::DType kv_dtype = ResolveKvCacheDType(options, &checkpoint);
  std::unique_ptr<ModelBackend> backend;
  if (!cuda) {
    backend = MakeCpuBackend(comm);
  } else {
#ifndef PAGEDSERVE_WITH_CUDA
    return absl::FailedPreconditionError(
        absl::StrCat("worker device kCUDA (CUDA device ", options.cuda_device,
                     ") requested, but pagedserve was built without CUDA"));
#else
    // fp32, fp16 or bf16 weights (auto: bf16) and any KV cache dtype.
    PS_ASSIGN_OR_RETURN(backend, MakeCudaBackend(comm, options.cuda_device));
#endif
  }

  PS_ASSIGN_OR_RETURN(
      LlamaWeights weights,
      LoadLlamaWeights(options.model_path, comm->rank(), comm->size(), load_dtype,
                       comm->rank() == 0 ? options.load_progress : LoadProgressFn()));
  SelectLongRopeFactors(options.max_model_len, &weights.config);
  auto w = std::unique_ptr<Worker>(new Worker());
  w->comm_ = comm;
  w->device_ = options.device;
  w->kv_dtype_ = kv_dtype;
  const ShardLayout shard = weights.shard;
  const int num_layers = weights.config.num_layers;
  const int vocab = weights.config.vocab_size;
  PS_ASSIGN_OR_RETURN(w->model_, LlamaModel::Create(std::move(weights), comm, std::move(backend)));
  w->model_->set_graph_options(options.graphs);
  w->config_ = &w->model_->config();
  w->sampler_ = std::make_unique<Sampler>(vocab);
  w->constraints_ = std::make_unique<ConstraintRows>(options.constraint_vocabulary);

  kernels::KVCacheShape shape;
  shape.num_kv_heads = shard.num_kv_heads;
  shape.head_size = w->model_->config().head_size;
  shape.block_size = options.block_size;
  shape.dtype = w->kv_dtype_;
  w->bytes_per_block_ = static_cast<int64_t>(shape.block_bytes()) * 2 * num_layers;
  if (!options.draft_model_path.empty()) {
    if (cuda)
      return absl::UnimplementedError(
          "a draft model (--speculative-config \"model\") runs on the CPU worker only");
    // The draft's K/V shares the target's blocks (draft_model.h): the blocks
    // the coordinator frees behind a window every layer has
    // (SchedulerConfig::sliding_window) would be read by the draft.
    const ModelConfig& target = w->model_->config();
    bool all_windowed = target.sliding_window > 0;
    for (int l = 0; l < target.num_layers && all_windowed; ++l)
      all_windowed = target.LayerSlidingWindow(l) == target.sliding_window;
    if (all_windowed)
      return absl::InvalidArgumentError(absl::StrCat(
          "a draft model (--speculative-config \"model\") is not supported with a model whose "
          "every layer attends within a sliding window (",
          target.sliding_window, " tokens): its out-of-window KV blocks are freed"));
    PS_ASSIGN_OR_RETURN(
        w->draft_, DraftModel::Create(options.draft_model_path, load_dtype, w->model_->config(),
                                      options.max_model_len, comm));
    w->bytes_per_block_ += w->draft_->BytesPerBlock(options.block_size, w->kv_dtype_);
  }
  ModelBackend& be = w->model_->backend();
  PS_ASSIGN_OR_RETURN(const int64_t budget, be.KvCacheBudgetBytes(options.kv_cache_memory,
                                                                  options.gpu_memory_utilization));
  w->num_device_blocks_ = budget > 0 ? budget / w->bytes_per_block_ : 0;
  if (options.max_num_blocks > 0)
    w->num_device_blocks_ = std::min(w->num_device_blocks_, options.max_num_blocks);
  w->num_cpu_blocks_ = options.swap_space / w->bytes_per_block_;
  if (w->num_device_blocks_ < 1) {
    if (cuda)
      return absl::InvalidArgumentError(absl::StrCat(
          "GPU KV cache budget of ", budget, " bytes on CUDA device ", options.cuda_device, " (",
          options.gpu_memory_utilization, " of the device's memory, minus what it holds after ",
          be.weight_bytes(), " bytes of weights and the activation reserve) ",
          "is below one block (", w->bytes_per_block_, " bytes across ", num_layers, " layers)"));
    // (A draft model is refused on CUDA above.)
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache budget of ", options.kv_cache_memory, " bytes is below one block (",
                     w->bytes_per_block_, " bytes across ", num_layers, " layers",
                     w->draft_ != nullptr ? " and the draft model's" : "", ")"));
  }
  PS_RETURN_IF_ERROR(be.AllocateCaches(shape, w->num_device_blocks_, w->num_cpu_blocks_));
  if (w->draft_ != nullptr) {
    PS_RETURN_IF_ERROR(w->draft_->AllocateCaches(options.block_size, w->kv_dtype_,
                                                 w->num_device_blocks_, w->num_cpu_blocks_));
  }
  w->mirror_ = std::make_unique<StepPlanMirror>(options.block_size, w->num_device_blocks_);
  const auto dev = be.device_cache();
  const auto cpu = be.cpu_cache();
  w->device_layers_.assign(dev.begin(), dev.end());
  w->cpu_layers_.assign(cpu.begin(), cpu.end());
  return w;
}

Worker::~Worker() = default;

absl::StatusOr<StepResult> Worker::Execute(const StepPlan& plan) {
  const auto start = std::chrono::steady_clock::now();
  const double collective_before = comm_->collective_seconds();
  StepResult result;
  result.step_id = plan.step_id;

  // Block operations, in the order the plan defines, on the target's pools
  // and the draft model's (which share the block ids).
  PS_RETURN_IF_ERROR(ApplyBlockOperations(plan, device_layers_, cpu_layers_));
  if (draft_ != nullptr) {
    PS_RETURN_IF_ERROR(ApplyBlockOperations(plan, draft_->device_cache(), draft_->cpu_cache()));
  }
  // The plan's deltas bring the mirrored block tables and histories up to date.
  PS_RETURN_IF_ERROR(mirror_->Apply(plan));
  constraints_->Drop(plan.finished);
  // The draft model writes its K/V and fills the placeholder draft tokens
  // into the histories, which the target then reads.
  if (draft_ != nullptr) PS_RETURN_IF_ERROR(draft_->Propose(plan, mirror_.get(), &result.drafts));

  if (!plan.seqs.empty()) {
    // Flatten the batch.
    const int num_seqs = static_cast<int>(plan.seqs.size());
    std::vector<int32_t> token_ids, positions, qsl(num_seqs + 1, 0), seq_lens(num_seqs),
        logits_rows;
    std::vector<int> sampled_seq;  // index into plan.seqs per logits row
    std::vector<int> row_back;     // per logits row: fed tokens after its token (drafts)
    std::vector<const StepPlanMirror::Sequence*> rows(num_seqs);
    for (int i = 0; i < num_seqs; ++i) rows[i] = mirror_->Find(plan.seqs[i].seq_id);
    int max_blocks = 0;
    const std::vector<int32_t> block_tables = BuildBlockTable(rows, &max_blocks);
    for (int i = 0; i < num_seqs; ++i) {
      const SequenceStep& s = plan.seqs[i];
      for (size_t j = 0; j < s.token_ids.size(); ++j) {
        // The history: the plan's tokens with the draft model's in place of
        // placeholders (a placeholder left is refused by the forward pass).
        token_ids.push_back(rows[i]->history[s.start_pos + j]);
        positions.push_back(s.start_pos + static_cast<int32_t>(j));
      }
      qsl[i + 1] = static_cast<int32_t>(token_ids.size());
      seq_lens[i] = s.context_len();
      if (s.sample && !s.token_ids.empty()) {
        const int d = s.num_draft_tokens;
        if (d < 0 || d >= static_cast<int>(s.token_ids.size()) || (d > 0 && s.num_samples != 1))
          return absl::InvalidArgumentError(
              absl::StrCat("step ", plan.step_id, ": sequence ", s.seq_id, " has ", d,
                           " draft tokens among ", s.token_ids.size(), " fed with num_samples ",
                           s.num_samples, " (drafts need num_samples 1 and one verified token)"));
        // Speculative verification: the target samples after each draft
        // token too, in position order (step_plan.h).
        for (int back = d; back >= 0; --back) {
          logits_rows.push_back(qsl[i + 1] - 1 - back);
          sampled_seq.push_back(i);
          row_back.push_back(back);
        }
      }
    }
    // Prompt logprobs: a logits row per scored prompt token, after the
    // sampling rows (left as logits by LmHeadSample: RowSampling kLogits).
    std::vector<PromptRow> prompt_rows;
    for (int i = 0; i < num_seqs; ++i) {
      if (plan.seqs[i].prompt_logprobs)
        PS_RETURN_IF_ERROR(PlanPromptRows(plan, i, *rows[i], qsl[i], &prompt_rows));
    }
    const size_t num_sampling_rows = logits_rows.size();
    for (const PromptRow& p : prompt_rows) logits_rows.push_back(p.row);
    std::vector<int64_t> slot_mapping;
    slot_mapping.reserve(token_ids.size());
    mirror_->AppendSlotMapping(plan, &slot_mapping);
    ForwardBatch batch;
    batch.token_ids = token_ids;
    batch.positions = positions;
    batch.slot_mapping = slot_mapping;
    batch.query_start_loc = qsl;
    batch.seq_lens = seq_lens;
    batch.block_tables = block_tables;
    batch.max_blocks_per_seq = max_blocks;
    batch.logits_rows = logits_rows;
    std::vector<RowSampling> reduce;
    std::vector<double> uniforms;
    PlanRowSampling(plan, rows, sampled_seq, row_back, &reduce, &uniforms);
    reduce.resize(logits_rows.size());  // the prompt rows: kLogits
    SampledRows reduced;
    PS_RETURN_IF_ERROR(model_->Forward(batch, device_layers_, reduce, &reduced, &logits_));
    if (comm_->rank() == 0 && !sampled_seq.empty()) {
      PS_RETURN_IF_ERROR(
          CollectTokens(plan, rows, sampled_seq, row_back, reduce, reduced, &result));
    }
    if (comm_->rank() == 0 && !prompt_rows.empty()) {
      PS_RETURN_IF_ERROR(CollectPromptLogprobs(plan, rows, prompt_rows, num_sampling_rows, reduce,
                                               reduced, &result));
    }
  }
  result.forward_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.collective_seconds = comm_->collective_seconds() - collective_before;
  return result;
}

void Worker::PlanRowSampling(const StepPlan& plan,
                             std::span<const StepPlanMirror::Sequence* const> rows,
                             std::span<const int> sampled_seq, std::span<const int> row_back,
                             std::vector<RowSampling>* reduce, std::vector<double>* uniforms) {
  // Rows without beams are reduced where the logits are
  // (ModelBackend::LmHeadSample): greedy ones without penalties or logprobs
  // to their argmax, the others sampled with the sampler's own uniforms (seeded rows: the same
  // stream as Sampler::Sample), so a backend that samples on the device returns the tokens the
  // sampler would.
  reduce->assign(sampled_seq.size(), RowSampling{});
  std::vector<size_t> first_uniform(sampled_seq.size(), 0);
  size_t num_uniforms = 0;
  for (size_t r = 0; r < sampled_seq.size(); ++r) {
    const SamplingParams& p = rows[sampled_seq[r]]->sampling;
    (*reduce)[r].mode = ReducibleMode(p, plan.seqs[sampled_seq[r]].num_samples);
    first_uniform[r] = num_uniforms;
    if ((*reduce)[r].mode == RowSampling::Mode::kSample)
      num_uniforms += static_cast<size_t>(plan.seqs[sampled_seq[r]].num_samples);
  }
  uniforms->assign(num_uniforms, 0.0);  // sized once: the rows' spans point into it
  for (size_t r = 0; r < sampled_seq.size(); ++r) {
    RowSampling& rs = (*reduce)[r];
    if (rs.mode != RowSampling::Mode::kSample) continue;
    const SequenceStep& s = plan.seqs[sampled_seq[r]];
    const StepPlanMirror::Sequence& st = *rows[sampled_seq[r]];
    const SamplingParams& p = st.sampling;
    rs.temperature = p.temperature;
    rs.top_k = p.top_k;
    rs.top_p = p.top_p;
    rs.min_p = p.min_p;
    rs.repetition_penalty = p.repetition_penalty;
    rs.frequency_penalty = p.frequency_penalty;
    rs.presence_penalty = p.presence_penalty;
    const int32_t position = s.context_len() - row_back[r];
    rs.token_history = std::span<const int32_t>(st.history).first(position);
    rs.prompt_len = std::min<int32_t>(st.num_prompt_tokens, position);
    rs.uniforms = std::span<const double>(*uniforms).subspan(first_uniform[r], s.num_samples);
    rs.logprobs = p.logprobs;
    for (int32_t j = 0; j < s.num_samples && !p.greedy(); ++j) {
      (*uniforms)[first_uniform[r] + j] =
          p.seed.has_value()
              ? Sampler::SeededUniform(*p.seed, int64_t{st.sample_index} + j, position)
              : absl::Uniform<double>(absl::IntervalClosedOpen, unseeded_, 0.0, 1.0);
    }
  }
}

absl::Status Worker::CollectTokens(const StepPlan& plan,
                                   std::span<const StepPlanMirror::Sequence* const> rows,
                                   std::span<const int> sampled_seq, std::span<const int> row_back,
                                   std::span<const RowSampling> reduce, const SampledRows& reduced,
                                   StepResult* result) {
  // Rows past sampled_seq.size() are prompt rows (kLogits, one draw each).
  std::vector<size_t> first_draw(reduce.size() + 1, 0);
  for (size_t r = 0; r < reduce.size(); ++r)
    first_draw[r + 1] = first_draw[r] + static_cast<size_t>(reduce[r].draws());
  if (reduced.tokens.size() != first_draw.back() || reduced.logprobs.size() != first_draw.back() ||
      reduced.top_begin.size() != reduce.size() + 1 ||
      reduced.top_ids.size() != static_cast<size_t>(reduced.top_begin.back()) ||
      reduced.top_logprobs.size() != reduced.top_ids.size())
    return absl::InternalError(absl::StrCat("LmHeadSample returned ", reduced.tokens.size(),
                                            " tokens and ", reduced.top_ids.size(),
                                            " top entries for ", first_draw.back(), " draws"));
  std::vector<SamplerRow> sampler_rows;
  sampler_rows.reserve(sampled_seq.size());
  std::vector<std::shared_ptr<const grammar::TokenMask>> masks;  // alive while sampling
  for (size_t r = 0; r < sampled_seq.size(); ++r) {
    if (reduced.tokens[first_draw[r]] >= 0) continue;
    const int i = sampled_seq[r];
    const SequenceStep& s = plan.seqs[i];
    const StepPlanMirror::Sequence& st = *rows[i];
    SamplerRow row;
    row.seq_id = s.seq_id;
    row.params = &st.sampling;
    const int32_t position = s.context_len() - row_back[r];
    row.token_history = std::span<const int32_t>(st.history).first(position);
    row.prompt_len = std::min<int32_t>(st.num_prompt_tokens, position);
    row.position = position;
    row.sample_index = st.sample_index;
    row.num_samples = s.num_samples;
    if (st.sampling.structured_output.active()) {
      PS_ASSIGN_OR_RETURN(masks.emplace_back(), constraints_->Mask(s.seq_id, st));
      row.allowed_tokens = *masks.back();
    }
    sampler_rows.push_back(row);
  }
  std::vector<SampledToken> sampled;
  if (!sampler_rows.empty()) {
    const size_t v = static_cast<size_t>(sampler_->vocab_size());
    if (logits_.size() < sampler_rows.size() * v)
      return absl::InternalError(absl::StrCat("LmHeadSample left ", logits_.size() / v,
                                              " logits rows for ", sampler_rows.size(),
                                              " rows to sample"));
    std::vector<Sampler::RowFailure> failures;
    PS_ASSIGN_OR_RETURN(
        sampled, sampler_->Sample(std::span<const float>(logits_).first(sampler_rows.size() * v),
                                  sampler_rows, &failures));
    // One entry per sequence (a verification entry samples several rows).
    for (const Sampler::RowFailure& f : failures) {
      const SeqId id = sampler_rows[f.row].seq_id;
      const bool listed = std::any_of(result->failed.begin(), result->failed.end(),
                                      [id](const SequenceFailure& e) { return e.seq_id == id; });
      if (!listed) result->failed.push_back({id, std::string(f.status.message())});
    }
  }
  // Merged in row order: a reduced greedy row gives num_samples copies of
  // its argmax (what the sampler returns for a greedy row), a reduced
  // sampled row its num_samples draws, each with the row's logprobs when
  // asked (as the sampler fills them).
  size_t next = 0;
  for (size_t r = 0; r < sampled_seq.size(); ++r) {
    const SequenceStep& s = plan.seqs[sampled_seq[r]];
    const size_t first = first_draw[r];
    const auto top = static_cast<size_t>(reduced.top_begin[r]);
    const auto top_end = static_cast<size_t>(reduced.top_begin[r + 1]);
    for (int j = 0; j < s.num_samples; ++j) {
      if (reduced.tokens[first] >= 0) {
        const bool per_draw = reduce[r].mode == RowSampling::Mode::kSample;
        const size_t d = first + (per_draw ? static_cast<size_t>(j) : 0);
        SampledToken t;
        t.seq_id = s.seq_id;
        t.token_id = reduced.tokens[d];
        if (reduce[r].logprobs >= 0) {
          t.logprob = reduced.logprobs[d];
          t.top_token_ids.assign(reduced.top_ids.begin() + top, reduced.top_ids.begin() + top_end);
          t.top_logprobs.assign(reduced.top_logprobs.begin() + top,
                                reduced.top_logprobs.begin() + top_end);
        }
        result->tokens.push_back(std::move(t));
      } else {
        result->tokens.push_back(std::move(sampled.at(next++)));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Worker::PlanPromptRows(const StepPlan& plan, int i, const StepPlanMirror::Sequence& st,
                                    int32_t first_row, std::vector<PromptRow>* out) const {
  const SequenceStep& s = plan.seqs[i];
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", plan.step_id, ": sequence ", s.seq_id, " prompt logprobs: ", why));
  };
  if (s.num_draft_tokens != 0) return bad("an entry with draft tokens");
  if (st.sampling.prompt_logprobs < 0) return bad("its sampling parameters do not ask for them");
  const auto n = static_cast<int32_t>(s.token_ids.size());
  for (int32_t j = 0; j < n; ++j) {
    const int32_t position = s.start_pos + j + 1;  // of the scored token
    if (position >= st.num_prompt_tokens) break;
    const int32_t token = j + 1 < n ? s.token_ids[j + 1] : s.next_prompt_token;
    if (token < 0 || token >= sampler_->vocab_size())
      return bad(absl::StrCat("prompt token ", token, " at position ", position,
                              " outside the vocabulary (next_prompt_token missing?)"));
    out->push_back({first_row + j, i, position, token});
  }
  return absl::OkStatus();
}

absl::Status Worker::CollectPromptLogprobs(const StepPlan& plan,
                                           std::span<const StepPlanMirror::Sequence* const> rows,
                                           std::span<const PromptRow> prompt_rows,
                                           size_t num_sampling_rows,
                                           std::span<const RowSampling> reduce,
                                           const SampledRows& reduced, StepResult* result) const {
  // The unreduced sampling rows come first in logits_ (compacted in row order).
  size_t first = 0, draw = 0;
  for (size_t r = 0; r < num_sampling_rows; ++r) {
    if (draw < reduced.tokens.size() && reduced.tokens[draw] < 0) ++first;
    draw += static_cast<size_t>(reduce[r].draws());
  }
  const size_t v = static_cast<size_t>(sampler_->vocab_size());
  if (logits_.size() < (first + prompt_rows.size()) * v)
    return absl::InternalError(absl::StrCat("LmHeadSample left ", logits_.size() / v,
                                            " logits rows, ", first + prompt_rows.size(),
                                            " expected"));
  result->prompt_logprobs.reserve(result->prompt_logprobs.size() + prompt_rows.size());
  for (size_t k = 0; k < prompt_rows.size(); ++k) {
    const PromptRow& p = prompt_rows[k];
    const std::span<const float> row = std::span<const float>(logits_).subspan((first + k) * v, v);
    PromptLogprob lp = Sampler::ScoreToken(row, p.token, rows[p.seq]->sampling.prompt_logprobs);
    lp.seq_id = plan.seqs[p.seq].seq_id;
    lp.position = p.position;
    result->prompt_logprobs.push_back(std::move(lp));
  }
  return absl::OkStatus();
}

}  // namespace pagedserve
