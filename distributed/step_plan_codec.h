// Serialization of StepPlan and StepResult (runtime/common/step_plan.h) for the
// coordinator -> worker broadcast and the TP-rank-0 -> coordinator reply.
// Format: a 4-byte magic ("PSP1" / "PSR1") then the fields in declaration order
// (see wire.h for the encoding). Decoding rejects a wrong magic, truncated data
// and trailing bytes with DataLoss naming the field.
#ifndef PAGEDSERVE_DISTRIBUTED_STEP_PLAN_CODEC_H_
#define PAGEDSERVE_DISTRIBUTED_STEP_PLAN_CODEC_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/common/step_plan.h"

namespace pagedserve {

// Encoding never fails; Decode(Encode(x)) == x field for field.
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
