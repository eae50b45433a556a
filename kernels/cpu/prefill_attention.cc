// CPU prefill attention over the paged cache (causal, variable-length batch).
//
// Tasks are (sequence, KV head, tile of query rows). A task runs the shared
// attention loop (attention_core.h) over the context in chunks of
// kPartitionSize tokens for all query heads of the KV head's group and all rows
// of the tile at once, so each K/V block is converted and read once per tile,
// and merges the chunks with log-sum-exp rescaling. Row i of sequence s sits
// at position seq_len - q_len + i and sees keys [0, position].
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention_core.h"
#include "kernels/cpu/common.h"

namespace pagedserve::kernels::cpu {
namespace {
// Queries (rows x group heads) per task, at most; bounds the logits scratch.
constexpr int kMaxTileQueries = 64;
// Query rows per task tile: kMaxTileQueries / group, unless few, short
// queries (a speculative verification's k + 1 rows, a small chunk) would make
// fewer than two tasks per thread; then the rows are split finer (K/V of a
// tile's context is read once per tile, so finer tiles cost more reads, but
// of a short context).
int RowsPerTile(const PrefillAttentionParams& p, int group, int kvh_count) {
  const int rows_per_tile = std::max(1, kMaxTileQueries / group);
  int64_t max_q_len = 0, full_tiles = 0;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int q_len = p.query_start_loc[s + 1] - p.query_start_loc[s];
    max_q_len = std::max<int64_t>(max_q_len, q_len);
    full_tiles += (q_len + rows_per_tile - 1) / rows_per_tile;
  }
  const int64_t want = 2 * static_cast<int64_t>(omp_get_max_threads());
  if (full_tiles * kvh_count >= want || max_q_len <= 1) return rows_per_tile;
  const int64_t tiles_per_seq = (want + kvh_count * p.num_seqs - 1) / (kvh_count * p.num_seqs);
  return static_cast<int>(
      std::clamp<int64_t>((max_q_len + tiles_per_seq - 1) / tiles_per_seq, 1, rows_per_tile));
}
}  // namespace

absl::Status PrefillAttention(const PrefillAttentionParams& p) {
  const KVCacheShape& cs = p.cache.shape;
  const int hs = cs.head_size;
  const int bs = cs.block_size;
  const int kvh_count = cs.num_kv_heads;
  const int group = p.num_heads / kvh_count;
  const int x = cs.x();
  const int rows_per_tile = RowsPerTile(p, group, kvh_count);
  const int64_t q_stride =
      p.query_token_stride != 0 ? p.query_token_stride : static_cast<int64_t>(p.num_heads) * hs;
  const AttendFn fn = SelectAttend(cs.dtype, bs);
  const DType io = ResolveIoDType(p.io_dtype, cs.dtype);
  const float kscale = p.scale * EffectiveKScale(p.cache);  // k_scale folded in
  const float vscale = EffectiveVScale(p.cache);
  const int64_t head_elems = static_cast<int64_t>(hs) * bs;

  // (sequence, first row) of every tile.
  std::vector<std::pair<int, int>> tiles;
  for (int s = 0; s < p.num_seqs; ++s) {
    const int q_len = p.query_start_loc[s + 1] - p.query_start_loc[s];
    for (int r = 0; r < q_len; r += rows_per_tile) tiles.emplace_back(s, r);
  }
  const int64_t tasks = static_cast<int64_t>(tiles.size()) * kvh_count;

#pragma omp parallel if (tasks > 1)
  {
    const int maxq = rows_per_tile * group;
    std::vector<float> q(hs), qrep(static_cast<size_t>(maxq) * (hs / x) * kQrepWidth);
    std::vector<float> logits(static_cast<size_t>(maxq) * kPartitionSize);
    std::vector<float> kbuf(static_cast<size_t>(bs) * hs), vbuf(static_cast<size_t>(bs) * hs);
    std::vector<float> cm(maxq), cl(maxq), cacc(static_cast<size_t>(maxq) * hs);
    std::vector<float> m(maxq), l(maxq), acc(static_cast<size_t>(maxq) * hs), slopes(maxq);
    std::vector<int> limit(maxq), qpos(maxq), first(maxq);
    std::vector<const void*> kp(kPartitionSize / 8), vp(kPartitionSize / 8);

#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const auto [s, r0] = tiles[task / kvh_count];
      const int kvh = static_cast<int>(task % kvh_count);
      const int q0 = p.query_start_loc[s];
      const int q_len = p.query_start_loc[s + 1] - q0;
      const int seq_len = p.seq_lens[s];
      const int rows = std::min(rows_per_tile, q_len - r0);
      const int nq = rows * group;
      // Query index = r * group + g.
      for (int r = 0; r < rows; ++r) {
        const int pos = seq_len - q_len + r0 + r;
        for (int g = 0; g < group; ++g) {
          const int qi = r * group + g;
          const int h = kvh * group + g;
          LoadRow(io, ElemPtr(p.query, (q0 + r0 + r) * q_stride + static_cast<int64_t>(h) * hs, io),
                  hs, q.data());
          BuildQrep(q.data(), hs, x, qrep.data() + static_cast<size_t>(qi) * (hs / x) * kQrepWidth);
          limit[qi] = pos + 1;
          qpos[qi] = pos;
          first[qi] = p.sliding_window > 0 ? std::max(0, pos + 1 - p.sliding_window) : 0;
          if (p.alibi_slopes != nullptr) slopes[qi] = p.alibi_slopes[h];
          m[qi] = -std::numeric_limits<float>::infinity();
          l[qi] = 0.0f;
        }
      }
      std::fill(acc.begin(), acc.begin() + static_cast<size_t>(nq) * hs, 0.0f);
      const int ctx_end = seq_len - q_len + r0 + rows;  // last row's limit
      const int32_t* bt = p.block_tables + static_cast<int64_t>(s) * p.max_blocks_per_seq;
      // The tile's first row has the earliest window: start at its block.
      const int ctx_begin = first[0] / bs * bs;
      for (int c0 = ctx_begin; c0 < ctx_end; c0 += kPartitionSize) {
        const int c1 = std::min(ctx_end, c0 + kPartitionSize);
        for (int b = c0 / bs, i = 0; b * bs < c1; ++b, ++i) {
          const int64_t off = (static_cast<int64_t>(bt[b]) * kvh_count + kvh) * head_elems;
          kp[i] = ElemPtr(static_cast<const void*>(p.cache.key_cache), off, cs.dtype);
          vp[i] = ElemPtr(static_cast<const void*>(p.cache.value_cache), off, cs.dtype);
        }
        AttendArgs a;
        a.head_size = hs;
        a.num_queries = nq;
        a.qrep = qrep.data();
        a.limit = limit.data();
        a.first = p.sliding_window > 0 ? first.data() : nullptr;
        a.qpos = qpos.data();
        a.slopes = p.alibi_slopes != nullptr ? slopes.data() : nullptr;
        a.scale = kscale;
        a.softcap = p.logit_softcap;
        a.k_blocks = kp.data();
        a.v_blocks = vp.data();
        a.t_begin = c0;
        a.t_end = c1;
        a.logits = logits.data();
        a.kbuf = kbuf.data();
        a.vbuf = vbuf.data();
        a.out_max = cm.data();
        a.out_sum = cl.data();
        a.out_acc = cacc.data();
        fn(a);
        // Merge this chunk into the running (m, l, acc) of every query.
        for (int qi = 0; qi < nq; ++qi) {
          if (cl[qi] == 0.0f) continue;  // the query sees no token of this chunk
          const float nm = std::max(m[qi], cm[qi]);
          const float a_old = std::exp(m[qi] - nm);  // 0 when m = -inf
          const float a_new = std::exp(cm[qi] - nm);
          float* dst = acc.data() + static_cast<size_t>(qi) * hs;
          const float* src = cacc.data() + static_cast<size_t>(qi) * hs;
          for (int d = 0; d < hs; ++d) dst[d] = dst[d] * a_old + src[d] * a_new;
          l[qi] = l[qi] * a_old + cl[qi] * a_new;
          m[qi] = nm;
        }
      }
      for (int r = 0; r < rows; ++r)
        for (int g = 0; g < group; ++g) {
          const int qi = r * group + g;
          const int h = kvh * group + g;
          StoreRow(io, acc.data() + static_cast<size_t>(qi) * hs, vscale / l[qi], hs,
                   ElemPtr(p.out, (static_cast<int64_t>(q0 + r0 + r) * p.num_heads + h) * hs, io));
        }
    }
  }
  return absl::OkStatus();
}

}  // namespace pagedserve::kernels::cpu
