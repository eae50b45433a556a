#include "runtime/worker/block_table_update.h"

#include <algorithm>
#include <cstddef>

#include "kernels/cache_ops.h"
#include "runtime/common/status_macros.h"

namespace pagedserve {

std::vector<RowRange> ChangedRowRanges(std::span<const int32_t> held, std::span<const int32_t> next,
                                       int rows, int width, int max_ranges) {
  const int held_rows = static_cast<int>(held.size() / static_cast<size_t>(width));
  const size_t w = static_cast<size_t>(width);
  std::vector<RowRange> ranges;
  for (int r = 0; r < rows; ++r) {
    const bool changed =
        r >= held_rows ||
        !std::equal(next.begin() + r * w, next.begin() + (r + 1) * w, held.begin() + r * w);
    if (!changed) continue;
    if (!ranges.empty() && ranges.back().end == r) {
      ranges.back().end = r + 1;
    } else {
      ranges.push_back(RowRange{r, r + 1});
    }
  }
  if (static_cast<int>(ranges.size()) > max_ranges)
    ranges = {RowRange{ranges.front().begin, ranges.back().end}};
  return ranges;
}

std::vector<int32_t> BuildBlockTable(std::span<const StepPlanMirror::Sequence* const> rows,
                                     int* width) {
  constexpr int kQuantum = 16;
  int longest = 1;
  for (const StepPlanMirror::Sequence* r : rows)
    longest = std::max(longest, static_cast<int>(r->block_table.size()));
  *width = (longest + kQuantum - 1) / kQuantum * kQuantum;
  std::vector<int32_t> table(rows.size() * static_cast<size_t>(*width), 0);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::replace_copy(rows[i]->block_table.begin(), rows[i]->block_table.end(),
                      table.begin() + static_cast<std::ptrdiff_t>(i * static_cast<size_t>(*width)),
                      kDroppedBlock, 0);
  }
  return table;
}

namespace {
std::vector<kernels::BlockCopy> ToCopies(const std::vector<BlockPair>& pairs) {
  std::vector<kernels::BlockCopy> out;
  out.reserve(pairs.size());
  for (const BlockPair& p : pairs) out.push_back({p.src, p.dst});
  return out;
}
}  // namespace

absl::Status ApplyBlockOperations(const StepPlan& plan,
                                  std::span<const kernels::KVCacheView> device,
                                  std::span<const kernels::KVCacheView> cpu) {
  if (!plan.swap_out.empty())
    PS_RETURN_IF_ERROR(kernels::SwapBlocks(device, cpu, ToCopies(plan.swap_out)));
  if (!plan.swap_in.empty())
    PS_RETURN_IF_ERROR(kernels::SwapBlocks(cpu, device, ToCopies(plan.swap_in)));
  if (!plan.copy.empty()) PS_RETURN_IF_ERROR(kernels::CopyBlocks(device, ToCopies(plan.copy)));
  return absl::OkStatus();
}

}  // namespace pagedserve
