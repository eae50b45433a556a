#include "runtime/worker/constraint_rows.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pagedserve {

absl::StatusOr<std::shared_ptr<grammar::CompiledConstraint>> ConstraintRows::Compiled(
    const StructuredOutput& so) {
  if (!vocab_) {
    if (!loader_) {
      return absl::FailedPreconditionError(
          "structured output needs the model's vocabulary, and this worker was given none");
    }
    absl::StatusOr<std::shared_ptr<const grammar::TokenVocabulary>> v = loader_();
    if (!v.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("structured output: loading the vocabulary failed: ", v.status().message()));
    }
    vocab_ = *std::move(v);
  }
  return cache_.GetOrCreate(
      so,
      [&](const StructuredOutput& c)
          -> absl::StatusOr<std::shared_ptr<grammar::CompiledConstraint>> {
        absl::StatusOr<std::shared_ptr<const grammar::Grammar>> g = grammar::CompileConstraint(c);
        if (!g.ok()) return g.status();
        return std::make_shared<grammar::CompiledConstraint>(*std::move(g), vocab_);
      });
}

absl::StatusOr<std::shared_ptr<const grammar::TokenMask>> ConstraintRows::Mask(
    SeqId id, const StepPlanMirror::Sequence& seq) {
  absl::StatusOr<std::shared_ptr<grammar::CompiledConstraint>> compiled =
      Compiled(seq.sampling.structured_output);
  if (!compiled.ok()) return compiled.status();
  const size_t prompt = std::min<size_t>(std::max(seq.num_prompt_tokens, 0), seq.history.size());
  const std::span<const int32_t> outputs = std::span<const int32_t>(seq.history).subspan(prompt);
  Row& row = rows_[id];
  const bool extends = row.matcher && row.compiled == *compiled &&
                       row.consumed.size() <= outputs.size() &&
                       std::equal(row.consumed.begin(), row.consumed.end(), outputs.begin());
  if (!extends) {
    row = Row{};
    row.compiled = *compiled;
    row.matcher = std::make_unique<grammar::ConstraintMatcher>(*compiled);
  }
  for (size_t i = row.consumed.size(); i < outputs.size(); ++i) {
    if (!row.broken && !row.matcher->Accept(outputs[i])) row.broken = true;
    row.consumed.push_back(outputs[i]);
  }
  if (!row.broken) return row.matcher->Mask();
  auto only_end =
      std::make_shared<grammar::TokenMask>((static_cast<size_t>(vocab_->size()) + 63) / 64, 0);
  for (int32_t e : vocab_->end_ids())
    (*only_end)[static_cast<size_t>(e) >> 6] |= uint64_t{1} << (e & 63);
  return only_end;
}

void ConstraintRows::Drop(std::span<const SeqId> ids) {
  for (SeqId id : ids) rows_.erase(id);
}

}  // namespace pagedserve
