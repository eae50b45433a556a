// The CUDA worker against the CPU worker on the same weights (the random-weight
// test model, PAGEDSERVE_TEST_MODEL, prompts from PAGEDSERVE_TEST_REFERENCE):
//   - forward-pass logits of a mixed prefill + decode batch, a long prompt
//     (decode through paged_attention_v2 with the device workspace) and a
//     chunked prefill (and the variant models: Q/K/V biases, q/k norms,
//     LongRoPE, Gemma 2/3, mixtures of experts) agree within fp32
//     summation-order tolerance with fp32
//     weights and KV, and within a bound relative to the precision's own
//     effect with bf16/fp16 weights and 16-bit or fp8 KV (CompareLogits);
//   - greedy tokens through Worker::Execute are identical, including a swap
//     out to the pinned host pool and a swap in to other device blocks, and a
//     copy-on-write block copy;
//   - the backend's add + norm, RoPE and SiLU-and-mul launchers, packed
//     (aligned) and scalar (misaligned), equal the CPU operations;
//   - without a device, a kCUDA worker fails with a status (never a crash);
//     the dtype rules (auto = bf16 on CUDA) hold without a device too.
// The CPU model is itself checked against transformers in
// llama_reference_test.cc; here it is the reference for the device.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda_device.h"
#include "kernels/paged_attention.h"
#include "runtime/model/weights.h"
#include "runtime/worker/cpu_backend.h"
#include "runtime/worker/cuda/cuda_backend.h"
#include "runtime/worker/cuda/llama_model_cuda.h"
#include "runtime/worker/llama_model.h"
#include "runtime/worker/worker.h"
#include "tests/worker/batch_vectors.h"
#include "tests/worker/mismatches.h"
#include "tests/worker/reference_fixture.h"

#ifdef PAGEDSERVE_WITH_CUDA
#include <cuda_runtime_api.h>

#include "runtime/worker/cuda/model_kernels.h"
#endif

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
    ASSERT_TRUE(w.ok()) << w.status();
    // --dtype auto on CUDA: bf16 weights, and the KV cache follows.
    EXPECT_EQ((*w)->kv_cache_dtype(), kernels::DType::kBFloat16);
  } else {
    ASSERT_FALSE(w.ok());
    EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition) << w.status();
  }
}

// The dtype rules of WorkerOptions (no device needed): --dtype auto is bf16
// on CUDA and stays auto (stored formats) on the CPU; --kv-cache-dtype auto
// follows the resolved weight dtype; an explicit KV dtype wins everywhere.
TEST(CudaWorkerTest, DtypeResolution) {
  WorkerOptions o;
  o.device = kernels::Device::kCUDA;
  EXPECT_EQ(ResolveWeightDType(o), WeightDType::kBFloat16);
  EXPECT_EQ(ResolveKvCacheDType(o), kernels::DType::kBFloat16);
  o.dtype = WeightDType::kFloat32;
  EXPECT_EQ(ResolveWeightDType(o), WeightDType::kFloat32);
  EXPECT_EQ(ResolveKvCacheDType(o), kernels::DType::kFloat32);
  o.dtype = WeightDType::kFloat16;
  EXPECT_EQ(ResolveKvCacheDType(o), kernels::DType::kFloat16);
  o.kv_cache_dtype = kernels::DType::kFloat8E5M2;
  EXPECT_EQ(ResolveKvCacheDType(o), kernels::DType::kFloat8E5M2);
  // auto follows an fp16 checkpoint; bf16, fp32 and GGUF (no dtype) give bf16.
  WorkerOptions a;
  a.device = kernels::Device::kCUDA;
  ModelConfig m;
  m.checkpoint_dtype = "float16";
  EXPECT_EQ(ResolveWeightDType(a, &m), WeightDType::kFloat16);
  EXPECT_EQ(ResolveKvCacheDType(a, &m), kernels::DType::kFloat16);
  for (const char* d : {"bfloat16", "float32", ""}) {
    m.checkpoint_dtype = d;
    EXPECT_EQ(ResolveWeightDType(a, &m), WeightDType::kBFloat16) << d;
  }
  m.checkpoint_dtype = "float16";
  a.device = kernels::Device::kCPU;  // the CPU's auto is the stored formats
  EXPECT_EQ(ResolveWeightDType(a, &m), WeightDType::kAuto);
  WorkerOptions c;  // CPU
  EXPECT_EQ(ResolveWeightDType(c), WeightDType::kAuto);
  EXPECT_EQ(ResolveKvCacheDType(c), kernels::DType::kFloat16);
  c.dtype = WeightDType::kBFloat16;
  EXPECT_EQ(ResolveKvCacheDType(c), kernels::DType::kBFloat16);
}

// vLLM's --gpu-memory-utilization arithmetic (no device needed): a 100 GiB
// device at 0.9 with 20 GiB in use (weights and context) leaves 70 GiB minus
// the reserves; a device already fuller than the fraction leaves nothing.
TEST(CudaWorkerTest, GpuMemoryUtilizationIsAFractionOfTheWholeDevice) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  EXPECT_EQ(GpuKvBudgetBytes(100 * kGiB, 80 * kGiB, 0.9, 0, 0), 70 * kGiB);
  EXPECT_EQ(GpuKvBudgetBytes(100 * kGiB, 80 * kGiB, 0.9, 2 * kGiB, kGiB), 67 * kGiB);
  EXPECT_EQ(GpuKvBudgetBytes(100 * kGiB, 80 * kGiB, 1.0, 0, 0), 80 * kGiB);  // all that is free
  EXPECT_LE(GpuKvBudgetBytes(100 * kGiB, 5 * kGiB, 0.9, 0, 0), 0);           // 95 GiB in use > 90
}

#ifdef PAGEDSERVE_WITH_CUDA
// One sequence of a hand-made batch.
struct Seq {
  std::vector<int32_t> tokens;  // fed this step
  int start = 0;                // cached tokens before this step
  std::vector<int32_t> blocks;  // block table (covers start + tokens)
};

testing::BatchVectors MakeBatch(const std::vector<Seq>& seqs) {
  testing::BatchVectors b;
  b.width = 1;
  for (const Seq& s : seqs) b.width = std::max<int>(b.width, s.blocks.size());
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
    std::vector<int32_t> row(b.width, 0);
    std::copy(s.blocks.begin(), s.blocks.end(), row.begin());
    b.tables.insert(b.tables.end(), row.begin(), row.end());
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

// One model (weights loaded as `weights`) with its own KV pool of `kv` on
// `device`, for the logit comparisons below.
struct ModelUnderTest {
  std::unique_ptr<LlamaModel> model;
  std::vector<std::vector<char>> storage;  // CPU pools
  std::vector<kernels::KVCacheView> views;
};

constexpr int kPoolBlocks = 256;

void MakeModel(const std::string& path, WeightDType weights, kernels::DType kv, bool gpu,
               Communicator* comm, ModelUnderTest* m) {
  auto w = LoadLlamaWeights(path, 0, 1, weights);
  ASSERT_TRUE(w.ok()) << w.status();
  const ModelConfig cfg = w->config;
  auto model = gpu ? CudaLlamaModel::Create(std::move(*w), comm, 0)
                   : LlamaModel::Create(std::move(*w), comm);
  ASSERT_TRUE(model.ok()) << model.status();
  m->model = std::move(*model);
  kernels::KVCacheShape shape{kPoolBlocks, cfg.num_kv_heads, cfg.head_size, kBlockSize, kv};
  if (gpu) {
    ASSERT_TRUE(m->model->AllocateCaches(shape, kPoolBlocks, 0).ok());
    const auto v = m->model->device_cache();
    m->views.assign(v.begin(), v.end());
  } else {
    for (int l = 0; l < cfg.num_layers; ++l) {
      m->storage.emplace_back(shape.block_bytes() * kPoolBlocks);
      m->storage.emplace_back(shape.block_bytes() * kPoolBlocks);
      m->views.push_back({m->storage[m->storage.size() - 2].data(), m->storage.back().data(), shape,
                          kernels::Device::kCPU});
    }
  }
  ASSERT_EQ(m->views.size(), static_cast<size_t>(cfg.num_layers));
}

// The CUDA model against the CPU model at the same precision, on the same
// batches: every reference prompt prefilled in one batch (blocks reversed per
// sequence, so not contiguous), 8 decode steps of all of them, a 700-token
// prompt in two chunks (prefill over cached context) and decode steps at
// 700+ tokens (paged_attention_v2 with the device workspace). Decode feeds
// the CPU model's argmax (teacher forcing), so both see the same contexts.
//
// fp32 weights and KV: every logit within kLogitAbsTol + kLogitRelTol * |cpu|
// (fp32 summation order) and the same argmax in every row.
// Reduced precision (bf16/fp16 weights, 16-bit or fp8 KV): the CUDA backend
// rounds what the CPU one rounds (weights at load, q/k/v into the cache type)
// and, in addition, the GEMM inputs to the weight type (tensor cores), and an
// fp8 element may round the other way when its fp32 value differs in the
// last bits. So the check is relative to the precision's own effect, measured
// on the same batches: rms(gpu - cpu) <= kRmsFactor * rms(cpu - cpu_fp32),
// where cpu_fp32 is the fp32 CPU model, and the argmax agrees with the CPU
// model in at least kMinTop1 of the rows.
constexpr double kRmsFactor = 3.0;
constexpr double kMinTop1 = 0.9;

void CompareLogits(const std::string& path, const std::vector<testing::ReferencePrompt>& prompts,
                   WeightDType weights, kernels::DType kv) {
  const bool exact = weights == WeightDType::kFloat32 && kv == kernels::DType::kFloat32;
  SCOPED_TRACE(::testing::Message()
               << "weights " << WeightDTypeName(weights) << ", KV " << kernels::DTypeName(kv));
  auto comm = MakeSingleRankCommunicator();
  ModelUnderTest cpu, gpu, ref;
  ASSERT_NO_FATAL_FAILURE(MakeModel(path, weights, kv, false, comm.get(), &cpu));
  ASSERT_NO_FATAL_FAILURE(MakeModel(path, weights, kv, true, comm.get(), &gpu));
  if (!exact) {
    ASSERT_NO_FATAL_FAILURE(
        MakeModel(path, WeightDType::kFloat32, kernels::DType::kFloat32, false, comm.get(), &ref));
  }
  const ModelConfig& cfg = cpu.model->config();

  double worst = 0, sq_gpu = 0, sq_ref = 0;
  int64_t values = 0, rows = 0, top1 = 0;
  auto compare = [&](const testing::BatchVectors& b, const char* what) -> std::vector<float> {
    std::vector<float> a, g, r;
    absl::Status sc = cpu.model->Forward(b.view(), cpu.views, &a);
    absl::Status sg = gpu.model->Forward(b.view(), gpu.views, &g);
    EXPECT_TRUE(sc.ok()) << what << ": " << sc;
    EXPECT_TRUE(sg.ok()) << what << ": " << sg;
    EXPECT_EQ(a.size(), g.size()) << what;
    if (a.size() != g.size()) return a;
    if (!exact) {
      absl::Status sr = ref.model->Forward(b.view(), ref.views, &r);
      EXPECT_TRUE(sr.ok()) << what << ": " << sr;
      EXPECT_EQ(r.size(), a.size()) << what;
      if (r.size() != a.size()) return a;
    }
    int bad = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double d = static_cast<double>(a[i]) - g[i];
      worst = std::max(worst, std::abs(d));
      sq_gpu += d * d;
      if (!exact) sq_ref += (static_cast<double>(a[i]) - r[i]) * (static_cast<double>(a[i]) - r[i]);
      if (exact && std::abs(d) > kLogitAbsTol + kLogitRelTol * std::abs(a[i]) && ++bad <= 5)
        ADD_FAILURE() << what << ": logit " << i << " cpu " << a[i] << " gpu " << g[i];
    }
    values += static_cast<int64_t>(a.size());
    for (size_t row = 0; row < b.rows.size(); ++row) {
      const bool same = Argmax(a, row, cfg.vocab_size) == Argmax(g, row, cfg.vocab_size);
      if (exact) {
        EXPECT_TRUE(same) << what << " row " << row;
      }
      ++rows;
      top1 += same ? 1 : 0;
    }
    return a;
  };

  const int cap_blocks = 24;  // 384 tokens per sequence, blocks [0, 192)
  std::vector<Seq> seqs;
  for (size_t i = 0; i < prompts.size() && seqs.size() < 8; ++i) {
    if (prompts[i].prompt_ids.size() + 8 > 384u) continue;  // longer ones: the 700-token case
    Seq s;
    s.tokens = prompts[i].prompt_ids;
    const int slot = static_cast<int>(seqs.size());
    s.blocks = Range(slot * cap_blocks, cap_blocks);
    std::reverse(s.blocks.begin(), s.blocks.end());
    seqs.push_back(s);
  }
  ASSERT_GE(seqs.size(), 2u) << "too few reference prompts of at most 376 tokens";
  std::vector<float> logits = compare(MakeBatch(seqs), "prefill batch");
  for (int step = 0; step < 8 && !::testing::Test::HasFailure(); ++step) {
    for (size_t i = 0; i < seqs.size(); ++i) {
      seqs[i].start += static_cast<int>(seqs[i].tokens.size());
      seqs[i].tokens = {Argmax(logits, static_cast<int>(i), cfg.vocab_size)};
    }
    logits = compare(MakeBatch(seqs), "decode batch");
  }

  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> tok(0, cfg.vocab_size - 1);
  Seq lng;
  for (int i = 0; i < 700; ++i) lng.tokens.push_back(tok(rng));
  lng.blocks = Range(kPoolBlocks - 48, 48);  // 768 tokens, blocks [208, 256)
  ASSERT_FALSE(kernels::ShouldUsePagedAttentionV1(1, cfg.num_heads, 701));
  Seq first = lng;
  first.tokens.resize(300);
  compare(MakeBatch({first}), "long prompt chunk 1");
  Seq second = lng;
  second.start = 300;
  second.tokens.erase(second.tokens.begin(), second.tokens.begin() + 300);
  logits = compare(MakeBatch({second}), "long prompt chunk 2");
  lng.start = 700;
  for (int step = 0; step < 4 && !::testing::Test::HasFailure(); ++step) {
    lng.tokens = {Argmax(logits, 0, cfg.vocab_size)};
    logits = compare(MakeBatch({lng}), "long decode (v2)");
    ++lng.start;
  }
  const double rms_gpu = std::sqrt(sq_gpu / std::max<int64_t>(values, 1));
  const double rms_ref = std::sqrt(sq_ref / std::max<int64_t>(values, 1));
  std::printf(
      "weights %s, KV %s: max |cpu - gpu| %.3g, rms(cpu - gpu) %.3g, rms(cpu - cpu fp32) "
      "%.3g, top-1 agreement %lld/%lld\n",
      WeightDTypeName(weights), kernels::DTypeName(kv), worst, rms_gpu, rms_ref,
      static_cast<long long>(top1), static_cast<long long>(rows));
  if (!exact) {
    EXPECT_GT(rms_ref, 0.0) << "the reduced precision changed nothing: not a reduced precision?";
    EXPECT_LE(rms_gpu, kRmsFactor * rms_ref);
    EXPECT_GE(static_cast<double>(top1), kMinTop1 * static_cast<double>(rows));
  }
}

TEST_F(CudaWorkerModelTest, LogitsMatchCpuModel) {
  CompareLogits(model_path_, prompts_, WeightDType::kFloat32, kernels::DType::kFloat32);
}

// bf16 / fp16 weights on tensor cores with a cache of the same type (the
// CUDA worker's default is bf16 + bf16).
TEST_F(CudaWorkerModelTest, Bf16AndFp16LogitsMatchCpuModel) {
  CompareLogits(model_path_, prompts_, WeightDType::kBFloat16, kernels::DType::kBFloat16);
  CompareLogits(model_path_, prompts_, WeightDType::kFloat16, kernels::DType::kFloat16);
}

// Q/K/V biases (Qwen2) on the tiny random qwen2_bias model
// (tests/fixtures/make_random_variant.py; PAGEDSERVE_QWEN2_BIAS_MODEL and
// PAGEDSERVE_QWEN2_BIAS_REFERENCE): the CUDA backend adds them in the RoPE
// and cache-write kernels, which read the stacked q/k/v GEMM output up to
// 256 tokens and the outputs of separate GEMMs above; both against the CPU
// model, in fp32 and bf16.
TEST_F(CudaWorkerModelTest, BiasedQkvLogitsMatchCpuModel) {
  // Set by CTest and scripts/gpu-check; missing is a setup error, not a skip.
  const std::string model = Env("PAGEDSERVE_QWEN2_BIAS_MODEL");
  const std::string reference = Env("PAGEDSERVE_QWEN2_BIAS_REFERENCE");
  ASSERT_FALSE(model.empty()) << "PAGEDSERVE_QWEN2_BIAS_MODEL is not set";
  ASSERT_FALSE(reference.empty()) << "PAGEDSERVE_QWEN2_BIAS_REFERENCE is not set";
  const auto prompts = testing::LoadReference(reference);
  ASSERT_FALSE(prompts.empty());
  CompareLogits(model, prompts, WeightDType::kFloat32, kernels::DType::kFloat32);
  CompareLogits(model, prompts, WeightDType::kBFloat16, kernels::DType::kBFloat16);
}

// Qwen3's per-head q/k RMSNorm (HeadRmsNorm: the add + norm kernel over head
// rows, then the separate RoPE and cache-write path) on the tiny random
// qwen3_qk_norm model (head_dim 128; PAGEDSERVE_QWEN3_MODEL and
// PAGEDSERVE_QWEN3_REFERENCE) against the CPU model, in fp32 and bf16.
TEST_F(CudaWorkerModelTest, QkNormLogitsMatchCpuModel) {
  // Set by CTest; missing is a setup error, not a skip.
  const std::string model = Env("PAGEDSERVE_QWEN3_MODEL");
  const std::string reference = Env("PAGEDSERVE_QWEN3_REFERENCE");
  ASSERT_FALSE(model.empty()) << "PAGEDSERVE_QWEN3_MODEL is not set";
  ASSERT_FALSE(reference.empty()) << "PAGEDSERVE_QWEN3_REFERENCE is not set";
  const auto prompts = testing::LoadReference(reference);
  ASSERT_FALSE(prompts.empty());
  CompareLogits(model, prompts, WeightDType::kFloat32, kernels::DType::kFloat32);
  CompareLogits(model, prompts, WeightDType::kBFloat16, kernels::DType::kBFloat16);
}

// LongRoPE's scaled tables and partial rotary (48 of 64 dimensions: the
// kernels' rot_half) on the tiny random phi3_longrope model
// (PAGEDSERVE_PHI3_LONGROPE_MODEL and _REFERENCE) against the CPU model, in
// fp32 and bf16.
TEST_F(CudaWorkerModelTest, PartialRotaryLongRopeLogitsMatchCpuModel) {
  // Set by CTest and scripts/gpu-check; missing is a setup error, not a skip.
  const std::string model = Env("PAGEDSERVE_PHI3_LONGROPE_MODEL");
  const std::string reference = Env("PAGEDSERVE_PHI3_LONGROPE_REFERENCE");
  ASSERT_FALSE(model.empty()) << "PAGEDSERVE_PHI3_LONGROPE_MODEL is not set";
  ASSERT_FALSE(reference.empty()) << "PAGEDSERVE_PHI3_LONGROPE_REFERENCE is not set";
  const auto prompts = testing::LoadReference(reference);
  ASSERT_FALSE(prompts.empty());
  CompareLogits(model, prompts, WeightDType::kFloat32, kernels::DType::kFloat32);
  CompareLogits(model, prompts, WeightDType::kBFloat16, kernels::DType::kBFloat16);
}

// Gemma 2 on the tiny random gemma2 model (PAGEDSERVE_GEMMA2_MODEL and
// _REFERENCE): the sandwich norms (AddPostRmsNorm), the embedding scale,
// GeGLU, attention soft-capping (cap 1.0: the decode v1/v2 and SIMT prefill
// kernels, with layer 0's window of 20) and the final soft cap (3.0) against
// the CPU model, in fp32 and bf16 (with a bf16 cache, whose decode would
// otherwise run the GQA kernel).
TEST_F(CudaWorkerModelTest, Gemma2LogitsMatchCpuModel) {
  // Set by CTest and scripts/gpu-check; missing is a setup error, not a skip.
  const std::string model = Env("PAGEDSERVE_GEMMA2_MODEL");
  const std::string reference = Env("PAGEDSERVE_GEMMA2_REFERENCE");
  ASSERT_FALSE(model.empty()) << "PAGEDSERVE_GEMMA2_MODEL is not set";
  ASSERT_FALSE(reference.empty()) << "PAGEDSERVE_GEMMA2_REFERENCE is not set";
  const auto prompts = testing::LoadReference(reference);
  ASSERT_FALSE(prompts.empty());
  CompareLogits(model, prompts, WeightDType::kFloat32, kernels::DType::kFloat32);
  CompareLogits(model, prompts, WeightDType::kBFloat16, kernels::DType::kBFloat16);
}

// Gemma 3 on the tiny random gemma3 model (PAGEDSERVE_GEMMA3_MODEL and
// _REFERENCE): Gemma 2's layout with per-head q/k norms and no soft caps, 5
// windowed layers rotating by the local RoPE tables (rope_local_base_freq)
// and one global layer (rope_theta, linear scaling 8), against the CPU
// model, in fp32 and bf16.
TEST_F(CudaWorkerModelTest, Gemma3LogitsMatchCpuModel) {
  // Set by CTest and scripts/gpu-check; missing is a setup error, not a skip.
  const std::string model = Env("PAGEDSERVE_GEMMA3_MODEL");
  const std::string reference = Env("PAGEDSERVE_GEMMA3_REFERENCE");
  ASSERT_FALSE(model.empty()) << "PAGEDSERVE_GEMMA3_MODEL is not set";
  ASSERT_FALSE(reference.empty()) << "PAGEDSERVE_GEMMA3_REFERENCE is not set";
  const auto prompts = testing::LoadReference(reference);
  ASSERT_FALSE(prompts.empty());
  CompareLogits(model, prompts, WeightDType::kFloat32, kernels::DType::kFloat32);
  CompareLogits(model, prompts, WeightDType::kBFloat16, kernels::DType::kBFloat16);
}

// Mixture of experts (CudaBackend::MoeMlp) on the tiny random Mixtral
// (PAGEDSERVE_MIXTRAL_MOE_MODEL: 8 experts, top-2, renormalised) and
// Qwen2-MoE (PAGEDSERVE_QWEN2_MOE_MODEL: routed experts plus the
// sigmoid-gated shared expert) against the CPU model, in fp32 and bf16
// (the routing is the CPU's RouteTokens on the device's router logits).
TEST_F(CudaWorkerModelTest, MoeLogitsMatchCpuModel) {
  for (const char* name : {"MIXTRAL_MOE", "QWEN2_MOE"}) {
    SCOPED_TRACE(name);
    // Set by CTest and scripts/gpu-check; missing is a setup error, not a skip.
    const std::string model = Env(absl::StrCat("PAGEDSERVE_", name, "_MODEL").c_str());
    const std::string reference = Env(absl::StrCat("PAGEDSERVE_", name, "_REFERENCE").c_str());
    ASSERT_FALSE(model.empty()) << "PAGEDSERVE_" << name << "_MODEL is not set";
    ASSERT_FALSE(reference.empty()) << "PAGEDSERVE_" << name << "_REFERENCE is not set";
    const auto prompts = testing::LoadReference(reference);
    ASSERT_FALSE(prompts.empty());
    CompareLogits(model, prompts, WeightDType::kFloat32, kernels::DType::kFloat32);
    CompareLogits(model, prompts, WeightDType::kBFloat16, kernels::DType::kBFloat16);
  }
}

// fp8 KV caches (scales 1.0) under fp32 and bf16 weights.
TEST_F(CudaWorkerModelTest, Fp8KvLogitsMatchCpuModel) {
  CompareLogits(model_path_, prompts_, WeightDType::kFloat32, kernels::DType::kFloat8E4M3);
  CompareLogits(model_path_, prompts_, WeightDType::kBFloat16, kernels::DType::kFloat8E5M2);
}

// Generation through Worker::Execute on both backends, with a swap out /
// swap in of sequence 0 and a copy-on-write copy of sequence 1's blocks;
// sequence i samples with params[i % params.size()] (greedy by default).
class GreedyRunner {
 public:
  explicit GreedyRunner(Worker* w, std::vector<SamplingParams> params = {Greedy()})
      : w_(w), params_(std::move(params)) {}

  static SamplingParams Greedy() {
    SamplingParams p;
    p.temperature = 0.0f;
    return p;
  }

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
        s.sampling = params_[static_cast<size_t>(i) % params_.size()];
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
        sampled_.push_back(t);
      }
    }
    return out;
  }

  // Every SampledToken of the last Run, in the order the steps returned them.
  const std::vector<SampledToken>& sampled() const { return sampled_; }

 private:
  Worker* w_;
  std::vector<SamplingParams> params_;
  std::vector<SampledToken> sampled_;
};

// The first four reference prompts (the token tests' pool has 8 blocks per
// sequence).
std::vector<testing::ReferencePrompt> ShortPrompts(
    const std::vector<testing::ReferencePrompt>& all) {
  return {all.begin(), all.begin() + std::min<size_t>(4, all.size())};
}

// One side of the CPU / CUDA worker pair the token tests compare: fp32
// weights (the CPU side must compute what the fp32 CUDA worker does), 128
// device blocks, swap space; the CUDA side on device 0.
WorkerOptions PairOptions(const std::string& model_path, bool cuda) {
  WorkerOptions o;
  o.model_path = model_path;
  o.dtype = WeightDType::kFloat32;
  o.block_size = kBlockSize;
  o.kv_cache_memory = 64LL << 20;
  o.max_num_blocks = 128;
  o.swap_space = 16LL << 20;
  if (cuda) {
    o.device = kernels::Device::kCUDA;
    o.cuda_device = 0;
    o.gpu_memory_utilization = 0.5;
  }
  return o;
}

TEST_F(CudaWorkerModelTest, GreedyTokensMatchCpuWorkerWithSwapAndCopy) {
  const std::vector<testing::ReferencePrompt> prompts = ShortPrompts(prompts_);
  for (auto& p : prompts)
    ASSERT_LE(p.prompt_ids.size(), 64u) << "prompt too long for the test pool";
  auto comm_cpu = MakeSingleRankCommunicator();
  auto comm_gpu = MakeSingleRankCommunicator();
  auto cpu = Worker::Create(PairOptions(model_path_, false), comm_cpu.get());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = Worker::Create(PairOptions(model_path_, true), comm_gpu.get());
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

// CUDA graphs (the default) against --enforce-eager: 40 greedy decode steps
// of the short prompts, fp32 and the default bf16, replayed from graphs
// captured at batch bucket 4 (the first step of a shape runs eagerly, the
// second is captured, the rest replay), give the eager worker's tokens.
// The eager steps are unpadded, so a GEMM may sum in another order; with
// this model's logit gaps that never flips a greedy token.
TEST_F(CudaWorkerModelTest, GraphReplayedDecodeMatchesEnforceEager) {
  const std::vector<testing::ReferencePrompt> prompts = ShortPrompts(prompts_);
  for (WeightDType dtype : {WeightDType::kFloat32, WeightDType::kAuto}) {
    SCOPED_TRACE(WeightDTypeName(dtype));
    auto comm_eager = MakeSingleRankCommunicator();
    auto comm_graph = MakeSingleRankCommunicator();
    WorkerOptions eager_options = PairOptions(model_path_, true);
    eager_options.dtype = dtype;
    eager_options.graphs.enforce_eager = true;
    WorkerOptions graph_options = eager_options;
    graph_options.graphs.enforce_eager = false;
    auto eager = Worker::Create(eager_options, comm_eager.get());
    ASSERT_TRUE(eager.ok()) << eager.status();
    auto graph = Worker::Create(graph_options, comm_graph.get());
    ASSERT_TRUE(graph.ok()) << graph.status();
    const int steps = 40;
    auto a = GreedyRunner(eager->get()).Run(prompts, steps);
    auto g = GreedyRunner(graph->get()).Run(prompts, steps);
    ASSERT_EQ(a.size(), g.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], g[i]) << prompts[i].name;
  }
}

// Sampled rows: the CUDA worker samples rows on the device (LmHeadSample's
// sampling kernel, penalties and logprobs included) with the sampler's
// seeded uniforms, so with fp32 weights (logits within ~1e-6 of the CPU's)
// the seeded tokens are the CPU worker's, except where a uniform falls
// within that distance of a boundary of the cumulative distribution, and
// the logprobs agree to 1e-3 with the same top ids. One batch mixes a
// greedy row, top-k + top-p, penalties with logprobs 2, and min-p with
// logprobs 5.
TEST_F(CudaWorkerModelTest, SeededSampledTokensMatchCpuWorker) {
  const std::vector<testing::ReferencePrompt> prompts = ShortPrompts(prompts_);
  for (auto& p : prompts)
    ASSERT_LE(p.prompt_ids.size(), 64u) << "prompt too long for the test pool";
  std::vector<SamplingParams> params(4);
  params[0].temperature = 0.0f;
  params[1].temperature = 0.8f;
  params[1].top_k = 40;
  params[1].top_p = 0.9f;
  params[2].temperature = 1.0f;
  params[2].repetition_penalty = 1.3f;
  params[2].frequency_penalty = 0.5f;
  params[2].logprobs = 2;
  params[3].temperature = 1.2f;
  params[3].min_p = 0.05f;
  params[3].logprobs = 5;
  for (size_t i = 0; i < params.size(); ++i) params[i].seed = 17 + i;
  auto comm_cpu = MakeSingleRankCommunicator();
  auto comm_gpu = MakeSingleRankCommunicator();
  auto cpu = Worker::Create(PairOptions(model_path_, false), comm_cpu.get());
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto gpu = Worker::Create(PairOptions(model_path_, true), comm_gpu.get());
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  const int steps = 24;
  GreedyRunner cpu_run(cpu->get(), params), gpu_run(gpu->get(), params);
  auto a = cpu_run.Run(prompts, steps);
  auto g = gpu_run.Run(prompts, steps);
  ASSERT_EQ(a.size(), g.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_GE(a[i].size(), static_cast<size_t>(steps - 2)) << prompts[i].name;
    EXPECT_EQ(a[i], g[i]) << prompts[i].name;
  }
  const std::vector<SampledToken>& at = cpu_run.sampled();
  const std::vector<SampledToken>& gt = gpu_run.sampled();
  ASSERT_EQ(at.size(), gt.size());
  int with_top = 0;
  for (size_t k = 0; k < at.size(); ++k) {
    if (at[k].seq_id != gt[k].seq_id || at[k].token_id != gt[k].token_id) break;  // diverged
    EXPECT_NEAR(at[k].logprob, gt[k].logprob, 1e-3) << "token " << k;
    const std::vector<float>& lp = at[k].top_logprobs;
    ASSERT_EQ(lp.size(), gt[k].top_logprobs.size());
    ASSERT_EQ(at[k].top_token_ids.size(), gt[k].top_token_ids.size());
    for (size_t j = 0; j < lp.size(); ++j) {
      EXPECT_NEAR(lp[j], gt[k].top_logprobs[j], 1e-3) << "token " << k;
      // Ids agree unless a neighbour is a near tie (the two workers' logits
      // differ by ~1e-6).
      const bool near_tie = (j > 0 && std::abs(lp[j] - lp[j - 1]) < 1e-4f) ||
                            (j + 1 < lp.size() && std::abs(lp[j] - lp[j + 1]) < 1e-4f);
      if (!near_tie) {
        EXPECT_EQ(at[k].top_token_ids[j], gt[k].top_token_ids[j]) << "token " << k << " top " << j;
      }
    }
    with_top += !gt[k].top_token_ids.empty();
  }
  EXPECT_GT(with_top, 0) << "no logprobs rows were compared";
}

// ---- The backend's elementwise kernels through their launchers ----------------

// A device buffer of n elements of T plus slack for an offset (freed on
// destruction).
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(size_t n) {
    if (cudaMalloc(&p_, (n + 8) * sizeof(T)) != cudaSuccess) p_ = nullptr;
  }
  ~DeviceArray() { cudaFree(p_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  bool ok() const { return p_ != nullptr; }
  // The buffer from element `offset` on: offset 1 misaligns every packed
  // access, so the launchers take their scalar variant.
  T* at(size_t offset) { return static_cast<T*>(p_) + offset; }
  void Upload(const std::vector<T>& v, size_t offset) {
    ASSERT_EQ(cudaMemcpy(at(offset), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice),
              cudaSuccess);
  }
  std::vector<T> Download(size_t count, size_t offset) {
    std::vector<T> v(count);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(v.data(), at(offset), count * sizeof(T), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return v;
  }

 private:
  void* p_ = nullptr;
};

std::vector<float> RandomFloats(size_t n, std::mt19937& rng, float lo, float hi) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

using ::pagedserve::testing::Mismatches;

// The add + norm, RoPE and SiLU-and-mul launchers on the device, at aligned
// addresses (the packed, vectorized variant) and one element off (the scalar
// one), against the CPU operations (cpu_ops): what the SIMT emulation test
// checks of the kernel bodies, here with the device's compiler, alignment
// rules and fp32 units. Tolerances as the emulation test's (the same fp32
// operations; the norm's double sum in another order).
TEST(CudaModelKernelsTest, PackedAndScalarLaunchesMatchCpuOperations) {
  std::string reason;
  if (!DeviceOrSkipReason(&reason)) GTEST_SKIP() << "no usable CUDA device: " << reason;
  namespace cm = cuda_model;
  constexpr double kRel = 2e-6, kAbs = 1e-7;
  std::mt19937 rng(41);
  const int n = 5, dim = 2048, heads = 4, head_size = 128;
  const int64_t count = static_cast<int64_t>(n) * dim;
  const std::vector<float> x0 = RandomFloats(count, rng, -2.0f, 2.0f);
  const std::vector<float> add = RandomFloats(count, rng, -2.0f, 2.0f);
  const std::vector<float> weight = RandomFloats(dim, rng, 0.5f, 1.5f);
  const std::vector<float> up = RandomFloats(count, rng, -2.0f, 2.0f);
  const int half = head_size / 2;
  std::vector<float> cos_t(static_cast<size_t>(n) * half), sin_t(cos_t.size());
  for (size_t i = 0; i < cos_t.size(); ++i) {
    const double angle = std::uniform_real_distribution<double>(-10, 10)(rng);
    cos_t[i] = static_cast<float>(std::cos(angle));
    sin_t[i] = static_cast<float>(std::sin(angle));
  }
  // References.
  std::vector<float> want_x = x0, want_norm(count), want_silu(count), want_rope = x0;
  cpu_ops::AddRmsNorm(want_x.data(), add.data(), nullptr, n, dim, weight.data(), 1e-5,
                      want_norm.data());
  cpu_ops::SiluMul(x0.data(), up.data(), count, want_silu.data());
  cpu_ops::ApplyRope(want_rope.data(), n, heads, head_size, head_size / 2, dim, cos_t.data(),
                     sin_t.data());

  for (size_t offset : {size_t{0}, size_t{1}}) {
    SCOPED_TRACE(offset == 0 ? "aligned (packed)" : "one element off (scalar)");
    DeviceArray<float> x(count), a(count), w(dim), out(count), u(count), c(cos_t.size()),
        sn(sin_t.size());
    ASSERT_TRUE(x.ok() && a.ok() && w.ok() && out.ok() && u.ok() && c.ok() && sn.ok());
    x.Upload(x0, offset);
    a.Upload(add, offset);
    w.Upload(weight, offset);
    u.Upload(up, offset);
    c.Upload(cos_t, offset);
    sn.Upload(sin_t, offset);
    ASSERT_EQ(
        cm::LaunchAddRmsNorm(x.at(offset), a.at(offset), cm::Elem::kF32, nullptr, w.at(offset), n,
                             dim, 1e-5, out.at(offset), cm::Elem::kF32, nullptr),
        cudaSuccess);
    EXPECT_EQ(Mismatches(out.Download(count, offset), want_norm, kRel, kAbs), 0);
    EXPECT_EQ(Mismatches(x.Download(count, offset), want_x, 0, 0), 0);  // written back
    x.Upload(x0, offset);
    ASSERT_EQ(cm::LaunchSiluMul(x.at(offset), u.at(offset), count, out.at(offset), cm::Elem::kF32,
                                nullptr),
              cudaSuccess);
    EXPECT_EQ(Mismatches(out.Download(count, offset), want_silu, kRel, kAbs), 0);
    ASSERT_EQ(cm::LaunchApplyRope(x.at(offset), n, heads, head_size, head_size / 2, dim,
                                  c.at(offset), sn.at(offset), nullptr),
              cudaSuccess);
    EXPECT_EQ(Mismatches(x.Download(count, offset), want_rope, kRel, kAbs), 0);
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
