// Serialization of StepPlan and StepResult (runtime/common/step_plan.h) for the
// coordinator -> worker broadcast and the TP-rank-0 -> coordinator reply.
// Format: a 4-byte magic ("PSP4" / "PSR3") then the fields (see wire.h for the
// encoding). A plan's sequence entry is incremental (step_plan.h): seq_id, a
// flags byte (sample, new_state, fork, draft, prompt logprobs), fork_from when forked,
// num_draft_tokens when it has draft tokens, next_prompt_token with prompt
// logprobs, token_ids,
// start_pos, block_table_start, block_table, num_samples, and only for a
// starting sequence (new_state or fork) sample_index, sampling (with its
// structured output: kind byte and spec), num_prompt_tokens and cached_prefix_token_ids. A decode
// of a continuing sequence whose block table did not change is 41 bytes. Decoding rejects a wrong
// magic, unknown flags, truncated data and trailing bytes with DataLoss naming the field.
#ifndef PAGEDSERVE_DISTRIBUTED_STEP_PLAN_CODEC_H_
#define PAGEDSERVE_DISTRIBUTED_STEP_PLAN_CODEC_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/common/step_plan.h"

namespace pagedserve {

// Encoding never fails; Decode(Encode(x)) == x field for field, except the
// per-sequence constants of entries that do not start a sequence, which are
// not sent and decode as their defaults.
std::string EncodeStepPlan(const StepPlan& plan);
// DataLoss for a wrong magic, truncated or corrupt data, trailing bytes. Only
// the encoding is checked: ids, block numbers and slots are validated where
// they are used (the worker).
absl::StatusOr<StepPlan> DecodeStepPlan(std::string_view bytes);

std::string EncodeStepResult(const StepResult& result);
// DataLoss as DecodeStepPlan.
absl::StatusOr<StepResult> DecodeStepResult(std::string_view bytes);

}  // namespace pagedserve

#endif  // PAGEDSERVE_DISTRIBUTED_STEP_PLAN_CODEC_H_
