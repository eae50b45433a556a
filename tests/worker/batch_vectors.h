// Test support: the arrays of one ForwardBatch (runtime/worker/model_backend.h,
// which holds only spans), owned in vectors that each test fills its own way.
#ifndef PAGEDSERVE_TESTS_WORKER_BATCH_VECTORS_H_
#define PAGEDSERVE_TESTS_WORKER_BATCH_VECTORS_H_

#include <cstdint>
#include <vector>

#include "runtime/worker/model_backend.h"

namespace pagedserve::testing {

struct BatchVectors {
  std::vector<int32_t> ids, pos, qsl{0}, lens, tables, rows;  // qsl starts at 0
  std::vector<int64_t> slots;
  int width = 0;  // max_blocks_per_seq

  // Spans over the vectors above: valid while this object is unchanged.
  ForwardBatch view() const {
    ForwardBatch b;
    b.token_ids = ids;
    b.positions = pos;
    b.slot_mapping = slots;
    b.query_start_loc = qsl;
    b.seq_lens = lens;
    b.block_tables = tables;
    b.max_blocks_per_seq = width;
    b.logits_rows = rows;
    return b;
  }
};

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_WORKER_BATCH_VECTORS_H_
