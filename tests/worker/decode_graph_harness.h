// Test support for CUDA-graph semantics on the CPU (decode_graph_test.cc,
// decode_graph_tp_test.cc): CaptureBackend, a ModelBackend that behaves as
// the CUDA backend's graphs do over the CPU backend, and a fixed schedule of
// prefills and decode steps of the random-weight Llama (PAGEDSERVE_TEST_MODEL)
// whose logits are compared between graph and eager runs.
#ifndef PAGEDSERVE_TESTS_WORKER_DECODE_GRAPH_HARNESS_H_
#define PAGEDSERVE_TESTS_WORKER_DECODE_GRAPH_HARNESS_H_

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "distributed/communicator.h"
#include "gtest/gtest.h"
#include "runtime/model/weights.h"
#include "runtime/worker/cpu_backend.h"
#include "runtime/worker/decode_graph.h"
#include "runtime/worker/llama_model.h"
#include "tests/worker/batch_vectors.h"

namespace pagedserve::testing {

// How CaptureBackend misbehaves, for the negative controls.
enum class Fault {
  kNone,
  kNoLaunchAfterCapture,  // EndBody does not run the recording
  kReplayRunsNothing,     // a replay reports the body enqueued but runs nothing
  kCaptureFails,          // every capture fails at its end (not a defect: the
                          // forward pass must run the body again, eagerly)
};

// The CPU backend with CUDA-graph semantics for the body: the first step of
// a key runs eagerly, the second records the operations (nothing runs) and
// runs the recording at EndBody, later steps replay it. Arguments are kept
// as the capture saw them, as a graph keeps its launch parameters; the
// recording is dropped when a Buffer address changed. The CPU operations
// read the plan of the step that runs them, so what this checks is the
// forward pass's side: padding that leaves the real rows alone, the body
// skipped on replay and run after a capture, the buffers asked for before
// BeginBody. The CUDA side (launch sizes fixed per key) is cuda_worker_test's
// GraphsMatchEager, on a device.
class CaptureBackend final : public ModelBackend {
 public:
  CaptureBackend(std::unique_ptr<ModelBackend> inner, Fault fault)
      : inner_(std::move(inner)), fault_(fault) {}

  int warmups = 0, captures = 0, replays = 0, failed_captures = 0;

  kernels::Device device() const override { return inner_->device(); }
  const char* name() const override { return "capture"; }
  absl::StatusOr<BackendWeights> LoadWeights(LlamaWeights w) override {
    return inner_->LoadWeights(std::move(w));
  }
  int64_t weight_bytes() const override { return inner_->weight_bytes(); }
  absl::StatusOr<int64_t> KvCacheBudgetBytes(int64_t host, double gmu) const override {
    return inner_->KvCacheBudgetBytes(host, gmu);
  }
  absl::Status AllocateCaches(const kernels::KVCacheShape& shape, int64_t d, int64_t c) override {
    return inner_->AllocateCaches(shape, d, c);
  }
  std::span<const kernels::KVCacheView> device_cache() const override {
    return inner_->device_cache();
  }
  std::span<const kernels::KVCacheView> cpu_cache() const override { return inner_->cpu_cache(); }
  absl::Status CheckKvCache(const kernels::KVCacheView& v) const override {
    return inner_->CheckKvCache(v);
  }
  absl::Status BeginStep(const ForwardPlan& plan) override {
    recording_ = nullptr;  // an abandoned capture
    step_buffers_.clear();
    plan_ = &plan;
    return inner_->BeginStep(plan);
  }
  absl::StatusOr<float*> Buffer(BufferId id, int64_t elems) override {
    absl::StatusOr<float*> p = inner_->Buffer(id, elems);
    if (p.ok()) step_buffers_.push_back(*p);
    return p;
  }
  ActivationType gemm_input_type() const override { return inner_->gemm_input_type(); }
  absl::StatusOr<GemmInput> GemmInputBuffer(BufferId id, int64_t elems) override {
    absl::StatusOr<GemmInput> p = inner_->GemmInputBuffer(id, elems);
    if (p.ok()) step_buffers_.push_back(p->data);
    return p;
  }
  ActivationType partial_sum_type() const override { return inner_->partial_sum_type(); }
  absl::StatusOr<PartialSums> PartialSumBuffer(int64_t elems) override {
    absl::StatusOr<PartialSums> p = inner_->PartialSumBuffer(elems);
    if (p.ok()) step_buffers_.push_back(p->data);
    return p;
  }

  bool SupportsBodyGraphs() const override { return true; }
  absl::StatusOr<bool> BeginBody(std::span<const kernels::KVCacheView>) override {
    const DecodeGraphKey key = *plan_->graph;
    for (Graph& g : graphs_) {
      if (!(g.key == key)) continue;
      if (g.buffers != step_buffers_) break;
      // The CPU operations validate as they run (the CUDA backend validates
      // a replayed step's block tables and lengths before the launch).
      if (fault_ != Fault::kReplayRunsNothing) {
        for (const auto& op : g.ops)
          if (absl::Status st = op(); !st.ok()) return st;
      }
      ++replays;
      return true;
    }
    std::erase_if(graphs_, [&](const Graph& g) { return g.key == key; });
    if (std::find(never_.begin(), never_.end(), key) != never_.end()) return false;
    if (std::find(warm_.begin(), warm_.end(), key) == warm_.end()) {
      warm_.push_back(key);
      ++warmups;
      return false;
    }
    graphs_.push_back(Graph{key, step_buffers_, {}});
    recording_ = &graphs_.back();
    ++captures;
    return false;
  }
  absl::StatusOr<bool> EndBody(bool body_ok) override {
    if (recording_ == nullptr) return true;
    Graph* g = recording_;
    recording_ = nullptr;
    if (!body_ok || fault_ == Fault::kCaptureFails) {
      // As a failed CUDA capture: nothing ran, the key is not captured again.
      ++failed_captures;
      never_.push_back(g->key);
      graphs_.pop_back();
      return false;
    }
    if (fault_ == Fault::kNoLaunchAfterCapture) return true;
    for (const auto& op : g->ops)
      if (absl::Status s = op(); !s.ok()) return s;
    return true;
  }

  absl::Status EmbeddingGather(const BackendMatrix& t, float* out) override {
    return Run([=, this] { return inner_->EmbeddingGather(t, out); });
  }
  absl::Status Linear(GemmInput x, int64_t n, const BackendMatrix& w, const BackendVector& bias,
                      float* y) override {
    return Run([=, this] { return inner_->Linear(x, n, w, bias, y); });
  }
  absl::Status LinearGroup(GemmInput x, int64_t n, std::span<const LinearOut> outs) override {
    std::vector<LinearOut> o(outs.begin(), outs.end());
    return Run([=, this] { return inner_->LinearGroup(x, n, o); });
  }
  absl::Status RowParallelLinear(GemmInput x, int64_t n, const BackendMatrix& w,
                                 PartialSums y) override {
    return Run([=, this] { return inner_->RowParallelLinear(x, n, w, y); });
  }
  absl::Status AddRmsNorm(float* residual, PartialSums add, int64_t n, int dim,
                          const BackendVector& weight, double eps, bool logits_rows,
                          GemmInput out) override {
    return Run([=, this] {
      return inner_->AddRmsNorm(residual, add, n, dim, weight, eps, logits_rows, out);
    });
  }
  absl::Status ApplyRope(float* x, int64_t n, int heads, int head_size, int64_t stride,
                         bool local) override {
    return Run([=, this] { return inner_->ApplyRope(x, n, heads, head_size, stride, local); });
  }
  absl::Status SiluMul(const float* gate, const float* up, int64_t count, GemmInput out) override {
    return Run([=, this] { return inner_->SiluMul(gate, up, count, out); });
  }
  absl::Status Attention(const kernels::KVCacheView& cache, const LayerAttention& layer, int heads,
                         float* q, float* k, float* v, GemmInput out) override {
    return Run([=, this] { return inner_->Attention(cache, layer, heads, q, k, v, out); });
  }
  absl::Status RopeAndAttention(const kernels::KVCacheView& cache, const LayerAttention& layer,
                                int64_t n, int heads, float* q, float* k, float* v,
                                GemmInput out) override {
    return Run(
        [=, this] { return inner_->RopeAndAttention(cache, layer, n, heads, q, k, v, out); });
  }
  absl::Status AllReduceSum(PartialSums data, int64_t count) override {
    return Run([=, this] { return inner_->AllReduceSum(data, count); });
  }
  absl::Status LmHead(GemmInput x, int64_t n, const BackendMatrix& w,
                      std::vector<float>* logits) override {
    return inner_->LmHead(x, n, w, logits);
  }

 private:
  struct Graph {
    DecodeGraphKey key;
    std::vector<void*> buffers;
    std::vector<std::function<absl::Status()>> ops;
  };
  absl::Status Run(std::function<absl::Status()> op) {
    if (recording_ == nullptr) return op();
    recording_->ops.push_back(std::move(op));
    return absl::OkStatus();
  }

  std::unique_ptr<ModelBackend> inner_;
  Fault fault_;
  const ForwardPlan* plan_ = nullptr;
  std::vector<void*> step_buffers_;
  std::vector<Graph> graphs_;  // recording_ points at the last one while capturing
  std::vector<DecodeGraphKey> warm_, never_;
  Graph* recording_ = nullptr;
};

constexpr int kBlockSize = 16;
constexpr int kBlocksPerSeq = 24;  // 384 tokens
constexpr int kSeqs = 6;

// One model over its own pools.
struct ModelRun {
  std::unique_ptr<LlamaModel> model;
  std::vector<std::vector<float>> storage;
  std::vector<kernels::KVCacheView> views;
  CaptureBackend* capture = nullptr;  // when the backend is one
};

// This rank's shard of the model at `path` over `comm` (the tensor-parallel
// group; a single-rank one when null).
inline ModelRun MakeRun(const std::string& path, bool graphs, Fault fault,
                        Communicator* comm = nullptr) {
  static auto single = MakeSingleRankCommunicator();
  if (comm == nullptr) comm = single.get();
  ModelRun r;
  auto weights = LoadLlamaWeights(path, comm->rank(), comm->size(), WeightDType::kFloat32);
  EXPECT_TRUE(weights.ok()) << weights.status();
  if (!weights.ok()) return r;
  const ModelConfig c = weights->config;
  const int kv_heads = weights->shard.num_kv_heads;
  std::unique_ptr<ModelBackend> backend = MakeCpuBackend(comm);
  if (graphs) {
    auto capture = std::make_unique<CaptureBackend>(std::move(backend), fault);
    r.capture = capture.get();
    backend = std::move(capture);
  }
  auto model = LlamaModel::Create(std::move(*weights), comm, std::move(backend));
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return r;
  r.model = std::move(*model);
  const int num_blocks = kSeqs * kBlocksPerSeq;
  kernels::KVCacheShape shape{num_blocks, kv_heads, c.head_size, kBlockSize,
                              kernels::DType::kFloat32};
  for (int l = 0; l < c.num_layers; ++l) {
    r.storage.emplace_back(shape.block_bytes() * num_blocks / sizeof(float), 0.0f);
    r.storage.emplace_back(shape.block_bytes() * num_blocks / sizeof(float), 0.0f);
    r.views.push_back({r.storage[r.storage.size() - 2].data(), r.storage.back().data(), shape,
                       kernels::Device::kCPU});
  }
  return r;
}

// A step of `parts` (sequence, first position, tokens); sequence s owns
// blocks [s * kBlocksPerSeq, (s + 1) * kBlocksPerSeq). Logits of each
// part's last token.
struct Part {
  int seq, start;
  std::vector<int32_t> tokens;
};
// `bad_block`: when set, the first block-table entry of the step (outside
// the pool: the attention's validation must refuse it).
inline absl::Status Step(ModelRun& r, const std::vector<Part>& parts, std::vector<float>* logits,
                         bool bad_block = false) {
  BatchVectors b;
  b.width = kBlocksPerSeq;
  for (const Part& p : parts) {
    for (size_t i = 0; i < p.tokens.size(); ++i) {
      b.ids.push_back(p.tokens[i]);
      b.pos.push_back(p.start + static_cast<int32_t>(i));
      b.slots.push_back(static_cast<int64_t>(p.seq) * kBlocksPerSeq * kBlockSize + p.start + i);
    }
    b.qsl.push_back(static_cast<int32_t>(b.ids.size()));
    b.lens.push_back(p.start + static_cast<int32_t>(p.tokens.size()));
    b.rows.push_back(b.qsl.back() - 1);
    for (int i = 0; i < kBlocksPerSeq; ++i) b.tables.push_back(p.seq * kBlocksPerSeq + i);
  }
  if (bad_block) b.tables[0] = 1 << 20;
  return r.model->Forward(b.view(), r.views, logits);
}

inline int32_t Argmax(const std::vector<float>& logits, int row, int vocab) {
  const float* p = logits.data() + static_cast<size_t>(row) * vocab;
  return static_cast<int32_t>(std::max_element(p, p + vocab) - p);
}

struct Schedule {
  std::vector<std::vector<float>> logits;  // per decode step
  int warmups = 0, captures = 0, replays = 0, failed_captures = 0;
};

// Prompts of 7 + 37 s tokens for sequences 0-4 and 252 for sequence 5 (its
// decodes cross the 256-token context bucket at step 20), then 24 greedy
// decode steps (greedy from this model's logits): sequences 0-2 for steps
// 0-7 (batch bucket 4), 0-4 for steps 8-15 (bucket 8), all six for 16-23
// (bucket 8, context bucket 384 from step 20 on).
inline Schedule RunSchedule(const std::string& path, bool graphs, Fault fault,
                            Communicator* comm = nullptr) {
  Schedule out;
  ModelRun r = MakeRun(path, graphs, fault, comm);
  if (r.model == nullptr) return out;
  const int vocab = r.model->config().vocab_size;
  std::vector<int> len(kSeqs);
  std::vector<int32_t> next(kSeqs);
  for (int s = 0; s < kSeqs; ++s) {
    Part p{s, 0, {}};
    const int prompt_len = s < 5 ? 7 + 37 * s : 252;
    for (int i = 0; i < prompt_len; ++i) p.tokens.push_back((s * 7919 + i * 104729 + 1) % vocab);
    std::vector<float> logits;
    const absl::Status st = Step(r, {p}, &logits);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return out;
    len[s] = static_cast<int>(p.tokens.size());
    next[s] = Argmax(logits, 0, vocab);
  }
  for (int step = 0; step < 24; ++step) {
    const int n = step < 8 ? 3 : step < 16 ? 5 : 6;
    std::vector<Part> parts(n);
    for (int s = 0; s < n; ++s) parts[s] = Part{s, len[s], {next[s]}};
    std::vector<float> logits;
    const absl::Status st = Step(r, parts, &logits);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return out;
    for (int s = 0; s < n; ++s) {
      ++len[s];
      next[s] = Argmax(logits, s, vocab);
    }
    out.logits.push_back(std::move(logits));
  }
  if (r.capture != nullptr) {
    out.warmups = r.capture->warmups;
    out.captures = r.capture->captures;
    out.replays = r.capture->replays;
    out.failed_captures = r.capture->failed_captures;
  }
  return out;
}

inline const char* TestModel() { return std::getenv("PAGEDSERVE_TEST_MODEL"); }

inline double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= m)) m = d;  // NaN propagates
  }
  return m;
}

// Largest logit difference over the schedule between graphs and eager.
inline double ScheduleDiff(const Schedule& a, const Schedule& b) {
  if (a.logits.size() != b.logits.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.logits.size(); ++i)
    m = std::max(m, MaxAbsDiff(a.logits[i], b.logits[i]));
  return m;
}

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_WORKER_DECODE_GRAPH_HARNESS_H_
