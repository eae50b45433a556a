// The CUDA worker against the CPU worker on the same weights (the random-weight
// test model, PAGEDSERVE_TEST_MODEL, prompts from PAGEDSERVE_TEST_REFERENCE):
//   - forward-pass logits of a mixed prefill + decode batch, a long prompt
//     (decode through paged_attention_v2 with the device workspace) and a
//     chunked prefill agree within fp32 summation-order tolerance;
//   - greedy tokens through Worker::Execute are identical, including a swap
//     out to the pinned host pool and a swap in to other device blocks, and a
//     copy-on-write block copy;
//   - without a device, a kCUDA worker fails with a status (never a crash).
// The CPU model is itself checked against transformers in
// llama_reference_test.cc; here it is the reference for the device.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda_device.h"
#include "kernels/paged_attention.h"
#include "runtime/model/weights.h"
#include "runtime/worker/cuda/llama_model_cuda.h"
#include "runtime/worker/llama_model.h"
#include "runtime/worker/worker.h"
#include "tests/worker/reference_fixture.h"

namespace pagedserve {
namespace {

constexpr int kBlockSize = 16;
// CPU (OpenBLAS, OpenMP) and GPU (cuBLAS, CUDA kernels) both run fp32 but
// sum in different orders over 4 layers.
constexpr double kLogitAbsTol = 1e-3;
constexpr double kLogitRelTol = 1e-3;

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

bool DeviceOrSkipReason(std::string* reason) { return kernels::CudaDeviceAvailable(reason); }

// Without a usable device a CUDA worker fails with a status (no crash); with
// one it is created. Runs (never skips) in every configuration.
TEST(CudaWorkerTest, CreateFollowsDeviceAvailability) {
  std::string reason;
  const bool device = DeviceOrSkipReason(&reason);
  auto comm = MakeSingleRankCommunicator();
  WorkerOptions o;
  o.model_path = Env("PAGEDSERVE_TEST_MODEL");
  o.device = kernels::Device::kCUDA;
  auto w = Worker::Create(o, comm.get());
  if (device) {
    EXPECT_TRUE(w.ok()) << w.status();
  } else {
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition) << w.status();
  }
}

#ifdef PAGEDSERVE_WITH_CUDA
// The CUDA worker keeps an fp32 pool: an fp8 (or any other) --kv-cache-dtype
// is refused with Unimplemented naming the flag and the value, before any
// device work (so this runs without a GPU too).
TEST(CudaWorkerTest, Fp8KvCacheIsRefusedClearly) {
  auto comm = MakeSingleRankCommunicator();
  for (kernels::DType dt : {kernels::DType::kFloat8E4M3, kernels::DType::kFloat8E5M2}) {
    WorkerOptions o;
    o.model_path = Env("PAGEDSERVE_TEST_MODEL");
    o.device = kernels::Device::kCUDA;
    o.kv_cache_dtype = dt;
    auto w = Worker::Create(o, comm.get());
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), absl::StatusCode::kUnimplemented) << w.status();
    EXPECT_NE(w.status().message().find(std::string("--kv-cache-dtype ") + kernels::DTypeName(dt)),
              std::string::npos)
        << w.status();
  }
}

// One sequence of a hand-made batch.
struct Seq {
  std::vector<int32_t> tokens;  // fed this step
  int start = 0;                // cached tokens before this step
  std::vector<int32_t> blocks;  // block table (covers start + tokens)
};

struct Batch {
  std::vector<int32_t> ids, pos, qsl{0}, lens, bt, rows;
  std::vector<int64_t> slots;
  int max_blocks = 1;
  ForwardBatch view() const {
    ForwardBatch b;
    b.token_ids = ids;
    b.positions = pos;
    b.slot_mapping = slots;
    b.query_start_loc = qsl;
    b.seq_lens = lens;
    b.block_tables = bt;
    b.max_blocks_per_seq = max_blocks;
    b.logits_rows = rows;
    return b;
  }
};

Batch MakeBatch(const std::vector<Seq>& seqs) {
  Batch b;
  for (const Seq& s : seqs) b.max_blocks = std::max<int>(b.max_blocks, s.blocks.size());
  for (const Seq& s : seqs) {
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      const int p = s.start + static_cast<int>(i);
      b.ids.push_back(s.tokens[i]);
      b.pos.push_back(p);
      b.slots.push_back(static_cast<int64_t>(s.blocks.at(p / kBlockSize)) * kBlockSize +
                        p % kBlockSize);
    }
    b.qsl.push_back(static_cast<int32_t>(b.ids.size()));
    b.lens.push_back(s.start + static_cast<int>(s.tokens.size()));
    std::vector<int32_t> row(b.max_blocks, 0);
    std::copy(s.blocks.begin(), s.blocks.end(), row.begin());
    b.bt.insert(b.bt.end(), row.begin(), row.end());
    b.rows.push_back(b.qsl.back() - 1);
  }
  return b;
}

std::vector<int32_t> Range(int first, int count) {
  std::vector<int32_t> v(count);
  std::iota(v.begin(), v.end(), first);
  return v;
}

int Argmax(const std::vector<float>& logits, int row, int vocab) {
  const float* r = logits.data() + static_cast<int64_t>(row) * vocab;
  return static_cast<int>(std::max_element(r, r + vocab) - r);
}

class CudaWorkerModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    if (!DeviceOrSkipReason(&reason)) GTEST_SKIP() << "no usable CUDA device: " << reason;
    model_path_ = Env("PAGEDSERVE_TEST_MODEL");
    prompts_ = testing::LoadReference(Env("PAGEDSERVE_TEST_REFERENCE"));
    ASSERT_FALSE(prompts_.empty());
  }
  std::string model_path_;
  std::vector<testing::ReferencePrompt> prompts_;
};

TEST_F(CudaWorkerModelTest, LogitsMatchCpuModel) {
  auto cpu_w = LoadLlamaWeights(model_path_);
  auto gpu_w = LoadLlamaWeights(model_path_);
  ASSERT_TRUE(cpu_w.ok()) << cpu_w.status();
  ASSERT_TRUE(gpu_w.ok()) << gpu_w.status();
  const ModelConfig cfg = cpu_w->config;
  auto comm = MakeSingleRankCommunicator();
  auto cpu = LlamaModel::Create(std::move(*cpu_w), comm.get());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = CudaLlamaModel::Create(std::move(*gpu_w), comm.get(), 0);
  ASSERT_TRUE(gpu.ok()) << gpu.status();

  const int num_blocks = 256;
  kernels::KVCacheShape shape{num_blocks, cfg.num_kv_heads, cfg.head_size, kBlockSize,
                              kernels::DType::kFloat32};
  std::vector<std::vector<float>> storage;
  std::vector<kernels::KVCacheView> cpu_views;
  for (int l = 0; l < cfg.num_layers; ++l) {
    storage.emplace_back(shape.block_elems() * num_blocks);
    storage.emplace_back(shape.block_elems() * num_blocks);
    cpu_views.push_back(
        {storage[storage.size() - 2].data(), storage.back().data(), shape, kernels::Device::kCPU});
  }
  ASSERT_TRUE((*gpu)->AllocateCaches(shape, num_blocks, 0).ok());
  const auto gpu_views = (*gpu)->device_cache();
  ASSERT_EQ(gpu_views.size(), static_cast<size_t>(cfg.num_layers));

  double worst = 0;
  auto compare = [&](const Batch& b, const char* what) -> std::vector<float> {
    std::vector<float> a, g;
    absl::Status sc = (*cpu)->Forward(b.view(), cpu_views, &a);
    absl::Status sg = (*gpu)->Forward(b.view(), gpu_views, &g);
    EXPECT_TRUE(sc.ok()) << what << ": " << sc;
    EXPECT_TRUE(sg.ok()) << what << ": " << sg;
    EXPECT_EQ(a.size(), g.size()) << what;
    if (a.size() != g.size()) return a;
    int bad = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = std::abs(static_cast<double>(a[i]) - g[i]);
      worst = std::max(worst, d);
      if (d > kLogitAbsTol + kLogitRelTol * std::abs(a[i]) && ++bad <= 5)
        ADD_FAILURE() << what << ": logit " << i << " cpu " << a[i] << " gpu " << g[i];
    }
    for (size_t r = 0; r < b.rows.size(); ++r)
      EXPECT_EQ(Argmax(a, r, cfg.vocab_size), Argmax(g, r, cfg.vocab_size)) << what << " row " << r;
    return a;
  };

  // Every reference prompt prefilled in one batch, blocks reversed per sequence
  // so that they are not contiguous; then 8 decode steps of all sequences
  // (teacher-forced with the CPU argmax).
  const int cap_blocks = 24;  // 384 tokens per sequence, blocks [0, 192)
  std::vector<Seq> seqs;
  for (size_t i = 0; i < prompts_.size() && i < 8; ++i) {
    ASSERT_LE(prompts_[i].prompt_ids.size() + 8, 384u) << prompts_[i].name;
    Seq s;
    s.tokens = prompts_[i].prompt_ids;
    s.blocks = Range(static_cast<int>(i) * cap_blocks, cap_blocks);
    std::reverse(s.blocks.begin(), s.blocks.end());
    seqs.push_back(s);
  }
  std::vector<float> logits = compare(MakeBatch(seqs), "prefill batch");
  for (int step = 0; step < 8 && !HasFailure(); ++step) {
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].start += static_cast<int>(seqs[i].tokens.size());
      seqs[i].tokens = {Argmax(logits, static_cast<int>(i), cfg.vocab_size)};
    }
    logits = compare(MakeBatch(seqs), "decode batch");
  }

  // A 700-token prompt of random ids in two chunks (prefill over cached
  // context), then decode steps at 700+ tokens: one sequence with 8 heads
  // makes paged_attention choose v2 (two 512-token partitions).
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, cfg.vocab_size - 1);
  Seq lng;
  for (int i = 0; i < 700; ++i) lng.tokens.push_back(tok(rng));
  lng.blocks = Range(num_blocks - 48, 48);  // 768 tokens, blocks [208, 256)
  ASSERT_FALSE(kernels::ShouldUsePagedAttentionV1(1, cfg.num_heads, 701));
  Seq first = lng;
  first.tokens.resize(300);
  compare(MakeBatch({first}), "long prompt chunk 1");
  Seq second = lng;
  second.start = 300;
  second.tokens.erase(second.tokens.begin(), second.tokens.begin() + 300);
  logits = compare(MakeBatch({second}), "long prompt chunk 2");
  lng.start = 700;
  for (int step = 0; step < 4 && !HasFailure(); ++step) {
    lng.tokens = {Argmax(logits, 0, cfg.vocab_size)};
    logits = compare(MakeBatch({lng}), "long decode (v2)");
    ++lng.start;
  }
  std::printf("max |cpu - gpu| logit: %.3g\n", worst);
}

// Greedy generation through Worker::Execute on both backends, with a swap out
// / swap in of sequence 0 and a copy-on-write copy of sequence 1's blocks.
class GreedyRunner {
 public:
  explicit GreedyRunner(Worker* w) : w_(w) {}

  std::vector<std::vector<int32_t>> Run(const std::vector<testing::ReferencePrompt>& prompts,
                                        int steps) {
    const int n = static_cast<int>(prompts.size());
    const int cap = 8;  // blocks per sequence
    std::vector<std::vector<int32_t>> out(n);
    std::vector<std::vector<int32_t>> tables(n);
    std::vector<int> start(n, 0);
    std::vector<std::vector<int32_t>> feed(n);
    for (int i = 0; i < n; ++i) {
      tables[i] = Range(i * cap, cap);
      feed[i] = prompts[i].prompt_ids;
    }
    const int spare = n * cap;  // blocks after every sequence's range
    bool swapped = false;
    uint64_t step_id = 0;
    for (int step = 0; step < steps; ++step) {
      StepPlan plan;
      plan.step_id = ++step_id;
      const int swap_out_step = 4, swap_in_step = 6, cow_step = 8;
      if (step == swap_out_step) {
        // Sequence 0 leaves the device: its used blocks go to CPU blocks 0..k-1.
        const int used = (start[0] + kBlockSize - 1) / kBlockSize;
        for (int b = 0; b < used; ++b) plan.swap_out.push_back({tables[0][b], b});
        swapped = true;
      }
      if (step == swap_in_step) {
        // Back in to a different device range (the spare blocks).
        const int used = (start[0] + kBlockSize - 1) / kBlockSize;
        for (int b = 0; b < used; ++b) plan.swap_in.push_back({b, spare + b});
        tables[0] = Range(spare, cap);
        swapped = false;
      }
      if (step == cow_step && n > 1) {
        // Sequence 1 continues on copies of its blocks (copy-on-write target).
        const int used = (start[1] + kBlockSize - 1) / kBlockSize;
        for (int b = 0; b < used; ++b) plan.copy.push_back({tables[1][b], spare + cap + b});
        tables[1] = Range(spare + cap, cap);
      }
      for (int i = 0; i < n; ++i) {
        if (i == 0 && swapped) continue;
        SequenceStep s;
        s.seq_id = 100 + i;
        s.token_ids = feed[i];
        s.start_pos = start[i];
        s.new_state = start[i] == 0;
        s.num_prompt_tokens = static_cast<int32_t>(prompts[i].prompt_ids.size());
        const int ctx = start[i] + static_cast<int>(feed[i].size());
        s.block_table.assign(tables[i].begin(),
                             tables[i].begin() + (ctx + kBlockSize - 1) / kBlockSize);
        s.sampling.temperature = 0.0f;
        s.sampling.max_tokens = steps;
        plan.seqs.push_back(s);
      }
      auto res = w_->Execute(plan);
      EXPECT_TRUE(res.ok()) << "step " << step << ": " << res.status();
      if (!res.ok()) return out;
      for (const SampledToken& t : res->tokens) {
        const int i = static_cast<int>(t.seq_id - 100);
        start[i] += static_cast<int>(feed[i].size());
        feed[i] = {t.token_id};
        out[i].push_back(t.token_id);
      }
    }
    return out;
  }

 private:
  Worker* w_;
};

TEST_F(CudaWorkerModelTest, GreedyTokensMatchCpuWorkerWithSwapAndCopy) {
  std::vector<testing::ReferencePrompt> prompts(
      prompts_.begin(), prompts_.begin() + std::min<size_t>(4, prompts_.size()));
  for (auto& p : prompts)
    ASSERT_LE(p.prompt_ids.size(), 64u) << "prompt too long for the test pool";
  auto comm_cpu = MakeSingleRankCommunicator();
  auto comm_gpu = MakeSingleRankCommunicator();
  WorkerOptions o;
  o.model_path = model_path_;
  o.dtype = WeightDType::kFloat32;  // the CPU side must compute what the fp32 CUDA worker does
  o.block_size = kBlockSize;
  o.kv_cache_memory = 64LL << 20;
  o.max_num_blocks = 128;
  o.swap_space = 16LL << 20;
  auto cpu = Worker::Create(o, comm_cpu.get());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  o.device = kernels::Device::kCUDA;
  o.cuda_device = 0;
  o.gpu_memory_utilization = 0.5;
  auto gpu = Worker::Create(o, comm_gpu.get());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->device(), kernels::Device::kCUDA);
  EXPECT_EQ((*gpu)->num_device_blocks(), 128);
  EXPECT_EQ((*gpu)->num_cpu_blocks(), (*cpu)->num_cpu_blocks());
  ASSERT_GE((*gpu)->num_cpu_blocks(), 8);
  EXPECT_EQ((*gpu)->bytes_per_block(), (*cpu)->bytes_per_block());

  const int steps = 24;
  auto a = GreedyRunner(cpu->get()).Run(prompts, steps);
  auto g = GreedyRunner(gpu->get()).Run(prompts, steps);
  ASSERT_EQ(a.size(), g.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_GE(a[i].size(), static_cast<size_t>(steps - 2)) << prompts[i].name;
    EXPECT_EQ(a[i], g[i]) << prompts[i].name;
  }
}

TEST_F(CudaWorkerModelTest, BadDeviceIndexIsAnError) {
  auto comm = MakeSingleRankCommunicator();
  WorkerOptions o;
  o.model_path = model_path_;
  o.device = kernels::Device::kCUDA;
  o.cuda_device = 1 << 20;
  auto w = Worker::Create(o, comm.get());
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition) << w.status();
}
#endif  // PAGEDSERVE_WITH_CUDA

}  // namespace
}  // namespace pagedserve
