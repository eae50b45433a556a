// Which rows of a step's block table a backend that keeps the previous
// step's table in device memory must upload (the CUDA backend: only the rows
// that changed, instead of the whole [num_seqs, max_blocks_per_seq] table
// every step). Plain host arithmetic, tested without a device.
#ifndef PAGEDSERVE_RUNTIME_WORKER_BLOCK_TABLE_UPDATE_H_
#define PAGEDSERVE_RUNTIME_WORKER_BLOCK_TABLE_UPDATE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/types.h"
#include "runtime/common/step_plan.h"
#include "runtime/common/step_plan_mirror.h"

namespace pagedserve {

// Rows [begin, end) of a block table.
struct RowRange {
  int begin = 0;
  int end = 0;
  bool operator==(const RowRange&) const = default;
};

// The rows of `next` ([rows, width] row-major) that differ from `held` (the
// table the device holds: held.size() / width rows of the same width; rows
// past it count as changed), as ascending, disjoint, non-adjacent ranges
// (adjacent changed rows share a range). More than `max_ranges` ranges are
// merged into the one range from the first changed row to the last (one copy
// of some unchanged rows beats many small copies). Empty when nothing
// changed. Requires width >= 1, next.size() == rows * width,
// held.size() % width == 0, max_ranges >= 1.
std::vector<RowRange> ChangedRowRanges(std::span<const int32_t> held, std::span<const int32_t> next,
                                       int rows, int width, int max_ranges);

// A plan's block operations on one model's pools, in the plan's order:
// swap_out (device -> CPU), swap_in (CPU -> device), copy (device ->
// device, copy-on-write). The worker applies them to the target's pools and
// to a draft model's (draft_model.h), which share block ids. Errors: those
// of kernels::SwapBlocks / CopyBlocks (a block id out of a pool, mismatched
// shapes); operations before the failing one have been applied.
absl::Status ApplyBlockOperations(const StepPlan& plan,
                                  std::span<const kernels::KVCacheView> device,
                                  std::span<const kernels::KVCacheView> cpu);

// A step's block table, [rows.size(), *width] row-major, from the mirrored
// rows (StepPlanMirror::Sequence::block_table, non-null). The width (the row
// stride, ForwardBatch::max_blocks_per_seq) is the longest row rounded up to
// a multiple of 16, so that it changes once per 16 blocks of the longest
// sequence rather than at each block: a device backend keeps its copy of the
// table and uploads only the rows that changed while the width stays.
// Padding and entries dropped out of a sliding window (kDroppedBlock) are
// block 0: the kernels never read them (they start at the window).
std::vector<int32_t> BuildBlockTable(std::span<const StepPlanMirror::Sequence* const> rows,
                                     int* width);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_WORKER_BLOCK_TABLE_UPDATE_H_
