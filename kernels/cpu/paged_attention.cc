// CPU decode attention: paged_attention v1 and v2 (and the contiguous-KV
// baseline used by the benchmark), all on top of cpu::AttendArgs.
//
// Work is split over (sequence, KV head) in v1 and (sequence, KV head,
// partition) in v2; each task handles the whole GQA group of query heads that
// share the KV head, so every K/V block is read from memory once per task.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention_core.h"
#include "kernels/cpu/common.h"
#include "kernels/cpu/contiguous_attention.h"

namespace pagedserve::kernels::cpu {
namespace {

struct DecodeShape {
  int num_seqs, num_heads, num_kv_heads, head_size, block_size;
  DType dtype;  // cache element type
  const void* query;
  const int32_t* seq_lens;
  float scale;           // softmax scale times the effective k_scale
  const float* slopes;   // [num_heads] or null
  DType io;              // query / output element type
  float v_scale;         // effective v_scale, applied with the normalization
  int window;            // sliding window (tokens), 0 = none
  float softcap = 0.0f;  // score soft cap, 0 = none
};

// Per-thread buffers, sized for one task of `group` queries over at most
// `max_tokens` tokens.
struct Scratch {
  std::vector<float> q, qrep, logits, kbuf, vbuf, m, l, acc, slopes;
  std::vector<int> limit, qpos, first;
  std::vector<const void*> kp, vp;

  Scratch(int group, int head_size, int block_size, int max_tokens) {
    const int max_blocks = (max_tokens + block_size - 1) / block_size;
    q.resize(head_size);
    qrep.resize(static_cast<size_t>(group) * head_size * kQrepWidth);  // >= group*(hs/x)*16
    logits.resize(static_cast<size_t>(group) * max_tokens);
    kbuf.resize(static_cast<size_t>(block_size) * head_size);
    vbuf.resize(static_cast<size_t>(block_size) * head_size);
    m.resize(group);
    l.resize(group);
    acc.resize(static_cast<size_t>(group) * head_size);
    slopes.resize(group);
    limit.resize(group);
    qpos.resize(group);
    first.resize(group);
    kp.resize(max_blocks);
    vp.resize(max_blocks);
  }
};

// Attention of the group of query heads of (s, kvh) over tokens
// [t_begin, t_end) of sequence s; results in sc.m / sc.l / sc.acc.
// block_ptrs(s, kvh, logical_block, &k, &v) gives the block addresses.
// With a sliding window, the blocks wholly before it are skipped; a range
// wholly before it gives m = -inf, l = 0, acc = 0.
template <typename BlockPtrs>
void DecodeTask(const DecodeShape& d, AttendFn fn, Scratch& sc, int s, int kvh, int t_begin,
                int t_end, const BlockPtrs& block_ptrs) {
  const int group = d.num_heads / d.num_kv_heads;
  const int hs = d.head_size;
  const int x = static_cast<int>(16 / DTypeSize(d.dtype));
  const int seq_len = d.seq_lens[s];
  const int win_first = d.window > 0 ? std::max(0, seq_len - d.window) : 0;
  if (win_first >= t_end) {
    std::fill_n(sc.m.begin(), group, -std::numeric_limits<float>::infinity());
    std::fill_n(sc.l.begin(), group, 0.0f);
    std::fill_n(sc.acc.begin(), static_cast<size_t>(group) * hs, 0.0f);
    return;
  }
  t_begin = std::max(t_begin, win_first / d.block_size * d.block_size);
  for (int g = 0; g < group; ++g) {
    const int h = kvh * group + g;
    LoadRow(d.io, ElemPtr(d.query, (static_cast<int64_t>(s) * d.num_heads + h) * hs, d.io), hs,
            sc.q.data());
    BuildQrep(sc.q.data(), hs, x, sc.qrep.data() + static_cast<size_t>(g) * (hs / x) * kQrepWidth);
    sc.limit[g] = seq_len;
    sc.qpos[g] = seq_len - 1;
    sc.first[g] = win_first;
    if (d.slopes != nullptr) sc.slopes[g] = d.slopes[h];
  }
  const int first = t_begin / d.block_size;
  const int last = (t_end + d.block_size - 1) / d.block_size;
  for (int b = first; b < last; ++b) block_ptrs(s, kvh, b, &sc.kp[b - first], &sc.vp[b - first]);
  AttendArgs a;
  a.head_size = hs;
  a.num_queries = group;
  a.qrep = sc.qrep.data();
  a.limit = sc.limit.data();
  a.first = win_first > 0 ? sc.first.data() : nullptr;
  a.qpos = sc.qpos.data();
  a.slopes = d.slopes != nullptr ? sc.slopes.data() : nullptr;
  a.scale = d.scale;
  a.softcap = d.softcap;
  a.k_blocks = sc.kp.data();
  a.v_blocks = sc.vp.data();
  a.t_begin = t_begin;
  a.t_end = t_end;
  a.logits = sc.logits.data();
  a.kbuf = sc.kbuf.data();
  a.vbuf = sc.vbuf.data();
  a.out_max = sc.m.data();
  a.out_sum = sc.l.data();
  a.out_acc = sc.acc.data();
  fn(a);
}

// One pass over the whole context per (sequence, KV head).
template <typename BlockPtrs>
void RunDecodeV1(const DecodeShape& d, int max_seq_len, void* out, const BlockPtrs& block_ptrs) {
  const AttendFn fn = SelectAttend(d.dtype, d.block_size);
  const int group = d.num_heads / d.num_kv_heads;
  const int hs = d.head_size;
  const int64_t tasks = static_cast<int64_t>(d.num_seqs) * d.num_kv_heads;
#pragma omp parallel if (tasks > 1)
  {
    Scratch sc(group, hs, d.block_size, max_seq_len);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int s = static_cast<int>(task / d.num_kv_heads);
      const int kvh = static_cast<int>(task % d.num_kv_heads);
      DecodeTask(d, fn, sc, s, kvh, 0, d.seq_lens[s], block_ptrs);
      for (int g = 0; g < group; ++g) {
        const int h = kvh * group + g;
        StoreRow(d.io, sc.acc.data() + static_cast<size_t>(g) * hs, d.v_scale / sc.l[g], hs,
                 ElemPtr(out, (static_cast<int64_t>(s) * d.num_heads + h) * hs, d.io));
      }
    }
  }
}

// The decode shape of a paged-cache call (v1 and v2): the k scale folded into the
// softmax scale, the v scale applied to the output, operands in the resolved io dtype.
DecodeShape PagedDecodeShape(const PagedAttentionParams& p) {
  const KVCacheShape& cs = p.cache.shape;
  return DecodeShape{p.num_seqs,
                     p.num_heads,
                     cs.num_kv_heads,
                     cs.head_size,
                     cs.block_size,
                     cs.dtype,
                     p.query,
                     p.seq_lens,
                     p.scale * EffectiveKScale(p.cache),
                     p.alibi_slopes,
                     ResolveIoDType(p.io_dtype, cs.dtype),
                     EffectiveVScale(p.cache),
                     p.sliding_window,
                     p.logit_softcap};
}

}  // namespace

absl::Status PagedAttentionV1(const PagedAttentionParams& p) {
  const KVCacheShape& cs = p.cache.shape;
  const DecodeShape d = PagedDecodeShape(p);
  const int64_t head_elems = static_cast<int64_t>(cs.head_size) * cs.block_size;
  auto block_ptrs = [&](int s, int kvh, int b, const void** k, const void** v) {
    const int64_t phys = p.block_tables[static_cast<int64_t>(s) * p.max_blocks_per_seq + b];
    const int64_t off = (phys * cs.num_kv_heads + kvh) * head_elems;
    *k = ElemPtr(static_cast<const void*>(p.cache.key_cache), off, cs.dtype);
    *v = ElemPtr(static_cast<const void*>(p.cache.value_cache), off, cs.dtype);
  };
  RunDecodeV1(d, p.max_seq_len, p.out, block_ptrs);
  return absl::OkStatus();
}

absl::Status PagedAttentionV2(const PagedAttentionParams& p) {
  const KVCacheShape& cs = p.cache.shape;
  const DecodeShape d = PagedDecodeShape(p);
  const int hs = cs.head_size;
  const int group = p.num_heads / cs.num_kv_heads;
  const int parts = NumPartitions(p.max_seq_len);
  const int64_t rows = static_cast<int64_t>(p.num_seqs) * p.num_heads;  // (s, h)

  // Workspace layout (PagedAttentionV2WorkspaceBytes): max_logits, exp_sums
  // [num_seqs, num_heads, parts], tmp_out [num_seqs, num_heads, parts, hs].
  std::vector<float> owned;
  float* ws = static_cast<float*>(p.workspace);
  if (ws == nullptr) {
    owned.resize(PagedAttentionV2WorkspaceBytes(p.num_seqs, p.num_heads, hs, p.max_seq_len) /
                 sizeof(float));
    ws = owned.data();
  }
  float* max_logits = ws;
  float* exp_sums = max_logits + rows * parts;
  float* tmp_out = exp_sums + rows * parts;

  const AttendFn fn = SelectAttend(cs.dtype, cs.block_size);
  const int64_t head_elems = static_cast<int64_t>(hs) * cs.block_size;
  auto block_ptrs = [&](int s, int kvh, int b, const void** k, const void** v) {
    const int64_t phys = p.block_tables[static_cast<int64_t>(s) * p.max_blocks_per_seq + b];
    const int64_t off = (phys * cs.num_kv_heads + kvh) * head_elems;
    *k = ElemPtr(static_cast<const void*>(p.cache.key_cache), off, cs.dtype);
    *v = ElemPtr(static_cast<const void*>(p.cache.value_cache), off, cs.dtype);
  };

  const int64_t tasks = static_cast<int64_t>(p.num_seqs) * cs.num_kv_heads * parts;
#pragma omp parallel
  {
    Scratch sc(group, hs, cs.block_size, kPartitionSize);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int part = static_cast<int>(task % parts);
      const int64_t sk = task / parts;
      const int s = static_cast<int>(sk / cs.num_kv_heads);
      const int kvh = static_cast<int>(sk % cs.num_kv_heads);
      const int seq_len = p.seq_lens[s];
      const int t_begin = part * kPartitionSize;
      if (t_begin >= seq_len) continue;  // the reduce reads only this sequence's partitions
      const int t_end = std::min(seq_len, t_begin + kPartitionSize);
      DecodeTask(d, fn, sc, s, kvh, t_begin, t_end, block_ptrs);
      for (int g = 0; g < group; ++g) {
        const int64_t row = static_cast<int64_t>(s) * p.num_heads + kvh * group + g;
        max_logits[row * parts + part] = sc.m[g];
        exp_sums[row * parts + part] = sc.l[g];
        float* dst = tmp_out + (row * parts + part) * hs;
        // A partition wholly before the window (l = 0) gets weight 0 in the reduce.
        const float inv = sc.l[g] > 0.0f ? 1.0f / sc.l[g] : 0.0f;
        const float* src = sc.acc.data() + static_cast<size_t>(g) * hs;
        for (int i = 0; i < hs; ++i) dst[i] = src[i] * inv;
      }
    }

    // Reduce: out = sum_p w_p * tmp_out_p / sum_p w_p, w_p = exp_sum_p * exp(max_p - max).
    std::vector<float> acc(hs);
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int s = static_cast<int>(row / p.num_heads);
      const int np = NumPartitions(p.seq_lens[s]);
      const float* ml = max_logits + row * parts;
      const float* es = exp_sums + row * parts;
      float gmax = -std::numeric_limits<float>::infinity();
      for (int i = 0; i < np; ++i) gmax = std::max(gmax, ml[i]);
      float total = 0.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int i = 0; i < np; ++i) {
        const float w = es[i] * std::exp(ml[i] - gmax);
        total += w;
        const float* src = tmp_out + (row * parts + i) * hs;
        for (int j = 0; j < hs; ++j) acc[j] += w * src[j];
      }
      // tmp_out is in stored-V units: v_scale is applied here, once.
      StoreRow(d.io, acc.data(), d.v_scale / total, hs, ElemPtr(p.out, row * hs, d.io));
    }
  }
  return absl::OkStatus();
}

absl::Status ContiguousDecodeAttention(const ContiguousDecodeParams& p) {
  if (p.out == nullptr || p.query == nullptr || p.key == nullptr || p.value == nullptr ||
      p.seq_lens == nullptr)
    return absl::InvalidArgumentError("contiguous attention: null buffer");
  if (p.num_seqs <= 0 || p.num_kv_heads <= 0 || p.num_heads <= 0 ||
      p.num_heads % p.num_kv_heads != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("contiguous attention: bad head counts ", p.num_heads, "/", p.num_kv_heads));
  if (!IsSupportedHeadSize(p.head_size) || !IsSupportedBlockSize(p.block_size) || p.capacity <= 0 ||
      p.capacity % p.block_size != 0)
    return absl::InvalidArgumentError("contiguous attention: bad head_size/block_size/capacity");
  for (int s = 0; s < p.num_seqs; ++s)
    if (p.seq_lens[s] < 1 || p.seq_lens[s] > p.capacity)
      return absl::InvalidArgumentError(absl::StrCat(
          "contiguous attention: seq_lens[", s, "]=", p.seq_lens[s], " outside [1, capacity]"));
  const DecodeShape d{p.num_seqs, p.num_heads, p.num_kv_heads, p.head_size, p.block_size, p.dtype,
                      p.query,    p.seq_lens,  p.scale,        nullptr,     p.dtype,      1.0f,
                      0};
  const int64_t head_elems = static_cast<int64_t>(p.head_size) * p.block_size;
  const int64_t seq_head_elems = static_cast<int64_t>(p.head_size) * p.capacity;
  auto block_ptrs = [&](int s, int kvh, int b, const void** k, const void** v) {
    const int64_t off =
        (static_cast<int64_t>(s) * p.num_kv_heads + kvh) * seq_head_elems + b * head_elems;
    *k = ElemPtr(p.key, off, p.dtype);
    *v = ElemPtr(p.value, off, p.dtype);
  };
  RunDecodeV1(d, p.capacity, p.out, block_ptrs);
  return absl::OkStatus();
}

}  // namespace pagedserve::kernels::cpu
