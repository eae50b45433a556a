// Test support: running a LlamaModel over its own paged KV pool, one
// sequence per prompt, the way a worker would (block tables, slot mapping,
// logits rows), for the end-to-end agreement tests (fp8_kv_forward_test.cc,
// quant_formats_test.cc).
#ifndef PAGEDSERVE_TESTS_WORKER_PAGED_RUN_H_
#define PAGEDSERVE_TESTS_WORKER_PAGED_RUN_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "runtime/worker/llama_model.h"
#include "tests/worker/batch_vectors.h"

namespace pagedserve::testing {

inline constexpr int kPagedRunBlockSize = 16;

// One paged pool (all layers) big enough for every sequence: sequence s owns
// blocks [s * per_seq, (s + 1) * per_seq).
struct Pool {
  kernels::KVCacheShape shape;
  std::vector<std::vector<uint8_t>> storage;
  std::vector<kernels::KVCacheView> views;
  int per_seq = 0;
  Pool(const ModelConfig& c, kernels::DType dt, int num_seqs, int max_len, float k_scale) {
    per_seq = (max_len + kPagedRunBlockSize - 1) / kPagedRunBlockSize;
    shape = {static_cast<int64_t>(num_seqs) * per_seq, c.num_kv_heads, c.head_size,
             kPagedRunBlockSize, dt};
    for (int l = 0; l < c.num_layers; ++l) {
      storage.emplace_back(shape.block_bytes() * shape.num_blocks);
      storage.emplace_back(shape.block_bytes() * shape.num_blocks);
      views.push_back({storage[storage.size() - 2].data(), storage.back().data(), shape,
                       kernels::Device::kCPU, k_scale, 1.0f});
    }
  }
};

// A step: sequence s contributes tokens[s] at positions start[s].. and wants
// the logits of `rows[s]` of its tokens (indices into tokens[s]).
inline std::vector<float> Step(LlamaModel& m, Pool& pool,
                               const std::vector<std::vector<int32_t>>& tokens,
                               const std::vector<int>& start,
                               const std::vector<std::vector<int>>& rows) {
  BatchVectors b;
  b.width = pool.per_seq;
  for (size_t s = 0; s < tokens.size(); ++s) {
    if (tokens[s].empty()) continue;  // not in this step
    const int base = static_cast<int>(b.ids.size());
    for (size_t i = 0; i < tokens[s].size(); ++i) {
      b.ids.push_back(tokens[s][i]);
      b.pos.push_back(start[s] + static_cast<int>(i));
      b.slots.push_back(static_cast<int64_t>(s) * pool.per_seq * kPagedRunBlockSize + start[s] +
                        static_cast<int64_t>(i));
    }
    for (int r : rows[s]) b.rows.push_back(base + r);
    b.qsl.push_back(static_cast<int32_t>(b.ids.size()));
    b.lens.push_back(start[s] + static_cast<int>(tokens[s].size()));
    for (int k = 0; k < pool.per_seq; ++k)
      b.tables.push_back(static_cast<int32_t>(s) * pool.per_seq + k);
  }
  std::vector<float> logits;
  absl::Status st = m.Forward(b.view(), pool.views, &logits);
  EXPECT_TRUE(st.ok()) << st;
  return logits;
}

inline int Argmax(const float* row, int n) {
  return static_cast<int>(std::max_element(row, row + n) - row);
}

// Greedy continuation (n tokens) of every prompt, all prompts batched: one
// prefill step, then n - 1 decode steps; a KV cache of `dt`.
inline std::vector<std::vector<int32_t>> Greedy(LlamaModel& m,
                                                const std::vector<std::vector<int32_t>>& prompts,
                                                int n, kernels::DType dt) {
  const int vocab = m.config().vocab_size;
  int max_len = 0;
  for (const auto& p : prompts) max_len = std::max<int>(max_len, static_cast<int>(p.size()) + n);
  Pool pool(m.config(), dt, static_cast<int>(prompts.size()), max_len, 1.0f);
  std::vector<std::vector<int32_t>> out(prompts.size());
  std::vector<std::vector<int32_t>> tokens = prompts;
  std::vector<int> start(prompts.size(), 0);
  std::vector<std::vector<int>> rows(prompts.size());
  for (size_t s = 0; s < prompts.size(); ++s) rows[s] = {static_cast<int>(prompts[s].size()) - 1};
  for (int step = 0; step < n; ++step) {
    const std::vector<float> logits = Step(m, pool, tokens, start, rows);
    if (logits.size() != prompts.size() * vocab) return out;
    for (size_t s = 0; s < prompts.size(); ++s) {
      const int32_t next = Argmax(logits.data() + s * vocab, vocab);
      out[s].push_back(next);
      start[s] += static_cast<int>(tokens[s].size());
      tokens[s] = {next};
      rows[s] = {0};
    }
  }
  return out;
}

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_WORKER_PAGED_RUN_H_
