// Model throughput on CPU (issue 3): prefill and decode tokens/s of a real
// model (SmolLM2-135M-Instruct by default) through the Worker, with hand-made
// step plans (the coordinator's job done by hand, so that only the forward pass
// and greedy sampling are timed). The llama.cpp side of the comparison is
// bench/llamacpp_baseline.py; bench/model_side_by_side.sh runs both and prints
// one table. Results: docs/benchmarks.md, "Model (CPU): pagedserve vs llama.cpp"
// (the dated runs: docs/benchmarks-history.md).
//
//   OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 build-bench/bench/bench_model --model=PATH
//   [--prompt_len=128] [--decode_steps=32]
//       [--batches=1,8,32] [--repeats=3] [--max_batched_tokens=512]
//       [--dtype=auto|float32|float16|bfloat16] [--kv_cache_dtype=auto|float32|float16|bfloat16]
//       [--verify_tokens=K] [--read_bandwidth_mib=N] [benchmark flags]
// --dtype float32 (with --kv_cache_dtype auto, i.e. fp32) is the dequantize-at-load
// OpenBLAS path; the default auto runs the GGUF's stored formats with an fp16 cache.
//
// Method (the same as llamacpp_baseline.py, so that the figures compare):
//  * prefill/batch:B  B sequences of --prompt_len tokens (the tokenization of a
//    fixed English text, repeated), packed into step plans of at most
//    --max_batched_tokens tokens (llama.cpp's n_batch = 512), sequences one after
//    another (a sequence longer than the budget is split into chunks, only its
//    last chunk sampled). Timed: every Execute of the prefill, including greedy
//    sampling of each sequence's last token. tokens/s = B * prompt_len / time.
//  * decode/batch:B   after an untimed prefill as above, --decode_steps steps of
//    one plan each holding one token per sequence (the previous greedy token) at
//    the next position. Timed: those Executes. tokens/s = B * decode_steps / time.
//    llama.cpp's decode figure feeds fixed ids and does not time sampling; ours
//    includes the greedy argmax over the vocabulary (small next to the LM head).
//  * verify/batch:B   (--verify_tokens=K) as decode, but each step is a
//    speculative verification: K + 1 tokens per sequence, all K + 1 sampled
//    (see BM_Verify). steps_per_s of verify against decode is what one
//    verification step costs in decode steps.
//  * read_bandwidth  (--read_bandwidth_mib=N) the machine's read bandwidth over an
//    N MiB buffer with the same threads (BM_ReadBandwidth); with the context's
//    model_file_bytes it gives decode/batch:1's fraction of the bandwidth limit
//    (tokens/s * file bytes / bytes_per_s_best: every weight read once per
//    token; the best of several read patterns, see BM_ReadBandwidth).
//  * each benchmark runs --repeats iterations on a fresh KV state (the finished
//    plan drops the sequences; their blocks are reused); counters: tokens_per_s
//    (over all iterations) and tokens_per_s_best (best iteration).
// Threads: OpenMP (OMP_NUM_THREADS) for our loops and OpenBLAS
// (OPENBLAS_NUM_THREADS) for the GEMMs; the context records both.
//
// --device=cpu|cuda (default cpu): the worker's device (WorkerOptions::device;
// the CUDA worker holds fp32 weights and an fp32 KV cache).
//
// Random weights (issue 11; no model file, e.g. on the offline GPU machine
// where the 92 MiB default model does not travel):
//   bench_model --random-weights [--random-layers N] [--device=cpu|cuda]
//               [--enforce-eager] [...]
// builds, in memory, a model of Llama-3-8B's layer shape (hidden 4096, 32 query
// heads, 8 KV heads, head size 128, intermediate 14336, vocab 128256, RMSNorm
// eps 1e-5, rope theta 500000, untied LM head) with N decoder layers (default
// 4 on the CPU, 32 -- the real depth -- on CUDA; fp32 needs ~0.87 GB per layer
// plus 4.2 GB for the embedding and the LM head, bf16 half that). Weights are uniform random
// values from the counter-based hash splitmix64 (as tests/fixtures/
// make_random_llama.py), scaled so that activations stay O(1): a projection
// with fan-in n has standard deviation 1/sqrt(n); fixed seed, so every run
// builds the same model. --dtype float32 holds them as fp32, float16/bfloat16
// as stored 16-bit rows (CPU: kernels::Linear; CUDA: cublasGemmEx on tensor
// cores); auto is float32 on the CPU and bfloat16 on CUDA (the worker's rule),
// and the KV cache follows the weights unless --kv_cache_dtype says otherwise.
// The prompt is fixed token ids (no tokenizer). The model runs through the
// public model API (LlamaModel::Create / CudaLlamaModel::Create over the
// in-memory LlamaWeights) with the same plans as above, turned into
// ForwardBatch rows, and the greedy argmax of LlamaModel's greedy Forward
// (ModelBackend::LmHeadSample: on the host for the CPU, on the device for
// CUDA, as the Worker does for greedy requests) instead of the Worker's
// sampler.
// Extra counters: layers, and layer_tokens_per_s = tokens_per_s * layers (the
// tokens/s of one decoder layer if the whole step were spent in the layers; it
// includes the embedding, LM head and sampling, so it understates a layer's own
// rate; divided by a model's depth it roughly estimates that model's tokens/s,
// leaving out that the LM head runs once per step, not once per layer).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "benchmark/benchmark.h"
#include "distributed/communicator.h"
#include "kernels/cpu/half.h"
#include "kernels/types.h"
#include "runtime/common/step_plan.h"
#include "runtime/model/model_config.h"
#include "runtime/model/weights.h"
#include "runtime/tokenizer/loaders.h"
#include "runtime/worker/cuda/llama_model_cuda.h"
#include "runtime/worker/llama_model.h"
#include "runtime/worker/worker.h"

namespace pagedserve {
namespace {

// The same text as bench/llamacpp_baseline.py.
constexpr char kText[] =
    "The history of the lighthouse is, in many ways, the history of coastal trade. "
    "Long before electric lamps and rotating lenses, sailors relied on bonfires lit on "
    "hilltops to mark dangerous rocks and the entrances of harbours. ";
constexpr int kBlockSize = 16;

struct Config {
  std::string model;
  int prompt_len = 128;
  int decode_steps = 32;
  std::vector<int> batches = {1, 8, 32};
  int repeats = 3;
  int max_batched_tokens = 512;
  WeightDType dtype = WeightDType::kAuto;  // --dtype=auto|float32|float16|bfloat16
  std::optional<kernels::DType>
      kv_cache_dtype;  // --kv_cache_dtype=float32|float16|bfloat16|fp8|fp8_e4m3|fp8_e5m2
  kernels::Device device = kernels::Device::kCPU;  // --device=cpu|cuda
  bool random_weights = false;                     // --random-weights
  int random_layers = 0;                           // --random-layers (0: 4 on CPU, 32 on CUDA)
  bool enforce_eager = false;  // --enforce-eager: no CUDA graphs for decode steps
  int verify_tokens = 0;       // --verify_tokens=K: also time speculative verification steps
  int read_bandwidth_mib = 0;  // --read_bandwidth_mib=N: also time reading N MiB (0 = off)
};

Config& config() {
  static Config c;
  return c;
}

// The model of --random-weights, driven through the public model API.
struct RandomModel {
  std::unique_ptr<LlamaModel> cpu;
  std::unique_ptr<LlamaModel> cuda;               // over the CUDA backend (CudaLlamaModel::Create)
  std::vector<std::unique_ptr<float[]>> storage;  // the CPU KV pool
  std::vector<kernels::KVCacheView> cpu_cache;
  kernels::DType kv_dtype = kernels::DType::kFloat32;
  int num_layers = 0;
  int vocab = 0;
  std::vector<float> logits;
  SampledRows argmax;
  std::vector<RowSampling> greedy;

  // Every row greedy: the argmax is taken where the logits are
  // (ModelBackend::LmHeadSample; CUDA: on the device, only ids come back).
  absl::Status Forward(const ForwardBatch& b) {
    RowSampling g;
    g.mode = RowSampling::Mode::kGreedy;
    greedy.assign(b.logits_rows.size(), g);
    if (cuda) return cuda->Forward(b, cuda->device_cache(), greedy, &argmax, &logits);
    return cpu->Forward(b, cpu_cache, greedy, &argmax, &logits);
  }
};

struct Bench {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Worker> worker;       // model from a file
  std::unique_ptr<RandomModel> random;  // --random-weights
  std::vector<int32_t> prompt;
  uint64_t next_step = 0;
  SeqId next_seq = 1;
};

Bench& bench() {
  static Bench b;
  return b;
}

[[noreturn]] void Die(const std::string& message) {
  std::fprintf(stderr, "bench_model: %s\n", message.c_str());
  std::exit(2);
}

int BlocksPerSeq() {
  const Config& c = config();
  return (c.prompt_len + c.decode_steps * (c.verify_tokens + 1) + kBlockSize - 1) / kBlockSize;
}

void SetupFromFile() {
  Config& c = config();
  Bench& b = bench();
  auto tokenizer = LoadGgufTokenizer(c.model);
  if (!tokenizer.ok()) Die(tokenizer.status().ToString());
  EncodeOptions enc;
  enc.add_special_tokens = false;
  enc.parse_special = false;
  std::vector<int32_t> text = (*tokenizer)->Encode(kText, enc);
  if (text.empty()) Die("the benchmark text tokenizes to nothing");
  while (static_cast<int>(b.prompt.size()) < c.prompt_len)
    b.prompt.insert(b.prompt.end(), text.begin(), text.end());
  b.prompt.resize(c.prompt_len);

  b.comm = MakeSingleRankCommunicator();
  WorkerOptions o;
  o.model_path = c.model;
  o.dtype = c.dtype;
  o.kv_cache_dtype = c.kv_cache_dtype;
  o.block_size = kBlockSize;
  const int max_batch = *std::max_element(c.batches.begin(), c.batches.end());
  o.max_num_blocks = static_cast<int64_t>(max_batch) * BlocksPerSeq();
  o.kv_cache_memory = 8LL << 30;  // capped by max_num_blocks
  o.swap_space = 0;
  o.device = c.device;
  auto w = Worker::Create(o, b.comm.get());
  if (!w.ok()) Die(w.status().ToString());
  b.worker = *std::move(w);
  if (b.worker->num_device_blocks() < o.max_num_blocks)
    Die(absl::StrCat("KV pool has ", b.worker->num_device_blocks(), " blocks, need ",
                     o.max_num_blocks));
}

// --- --random-weights ------------------------------------------------------

// Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json) with `layers` layers.
ModelConfig Llama3_8BShape(int layers) {
  ModelConfig m;
  m.arch = ModelArch::kLlama;
  m.num_layers = layers;
  m.hidden_size = 4096;
  m.intermediate_size = 14336;
  m.num_heads = 32;
  m.num_kv_heads = 8;
  m.head_size = 128;
  m.vocab_size = 128256;
  m.rms_norm_eps = 1e-5;
  m.rope_theta = 500000.0;
  m.tie_word_embeddings = false;
  m.max_position_embeddings = 8192;
  m.bos_token_id = 128000;
  m.eos_token_ids = {128001};
  return m;
}

// splitmix64 (Steele, Lea, Flood, OOPSLA 2014) of a counter: element `i` of
// tensor `tensor` -> uniform in [-1, 1).
inline float RandomUniform(uint64_t tensor, uint64_t i) {
  uint64_t z = (tensor << 40) + i + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// [rows, cols] with standard deviation `std` (uniform(-a, a), a = std * sqrt(3)),
// as fp32 values or as stored F16/BF16 rows.
Matrix RandomMatrix(uint64_t tensor, int64_t rows, int64_t cols, float std, WeightDType dtype) {
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  const float a = std * 1.7320508f;
  if (dtype == WeightDType::kFloat16 || dtype == WeightDType::kBFloat16) {
    const bool bf16 = dtype == WeightDType::kBFloat16;
    m.type = bf16 ? GgmlType::kBF16 : GgmlType::kF16;
    m.row_bytes = static_cast<uint64_t>(cols) * 2;
    m.owned.resize(static_cast<size_t>(rows * cols) * 2);
    uint16_t* dst = reinterpret_cast<uint16_t*>(m.owned.data());
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j) {
        const float v = a * RandomUniform(tensor, static_cast<uint64_t>(r * cols + j));
        dst[r * cols + j] = bf16 ? kernels::FloatToBFloat16Bits(v) : kernels::FloatToHalfBits(v);
      }
  } else {
    m.data.resize(static_cast<size_t>(rows * cols));
    float* dst = m.data.data();
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j)
        dst[r * cols + j] = a * RandomUniform(tensor, static_cast<uint64_t>(r * cols + j));
  }
  return m;
}

// RMSNorm weights uniform in [0.9, 1.1].
std::vector<float> RandomNorm(uint64_t tensor, int n) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = 1.0f + 0.1f * RandomUniform(tensor, i);
  return v;
}

// The whole (tensor-parallel size 1) model in memory. Tensor indices are
// fixed: 0 embedding, 1 LM head, 2 final norm, 16 + 16 * layer + k.
LlamaWeights RandomLlamaWeights(const ModelConfig& cfg, WeightDType dtype) {
  LlamaWeights w;
  w.dtype = dtype == WeightDType::kAuto ? WeightDType::kFloat32 : dtype;
  w.config = cfg;
  auto shard = ComputeShardLayout(cfg, 0, 1);
  if (!shard.ok()) Die(shard.status().ToString());
  w.shard = *shard;
  const int h = cfg.hidden_size, q = cfg.num_heads * cfg.head_size,
            kv = cfg.num_kv_heads * cfg.head_size, inter = cfg.intermediate_size;
  const float in_h = 1.0f / std::sqrt(static_cast<float>(h));
  // Embedding rows of norm ~1 per element (RMSNorm follows); LM head as a projection.
  w.embed_tokens = RandomMatrix(0, cfg.vocab_size, h, 1.0f, w.dtype);
  w.lm_head = RandomMatrix(1, cfg.vocab_size, h, in_h, w.dtype);
  w.final_norm = RandomNorm(2, h);
  w.layers.resize(cfg.num_layers);
  for (int l = 0; l < cfg.num_layers; ++l) {
    LayerWeights& L = w.layers[l];
    const uint64_t t = 16 + 16 * static_cast<uint64_t>(l);
    L.input_layernorm = RandomNorm(t + 0, h);
    L.q_proj = RandomMatrix(t + 1, q, h, in_h, w.dtype);
    L.k_proj = RandomMatrix(t + 2, kv, h, in_h, w.dtype);
    L.v_proj = RandomMatrix(t + 3, kv, h, in_h, w.dtype);
    L.o_proj = RandomMatrix(t + 4, h, q, 1.0f / std::sqrt(static_cast<float>(q)), w.dtype);
    L.post_attention_layernorm = RandomNorm(t + 5, h);
    L.gate_proj = RandomMatrix(t + 6, inter, h, in_h, w.dtype);
    L.up_proj = RandomMatrix(t + 7, inter, h, in_h, w.dtype);
    L.down_proj =
        RandomMatrix(t + 8, h, inter, 1.0f / std::sqrt(static_cast<float>(inter)), w.dtype);
  }
  return w;
}

void SetupRandom() {
  Config& c = config();
  Bench& b = bench();
  const bool cuda = c.device == kernels::Device::kCUDA;
  if (c.random_layers == 0) c.random_layers = cuda ? 32 : 4;
  // The Worker's rules: auto is bf16 on CUDA (fp32 on the CPU here), and the
  // KV cache follows the weights.
  if (cuda && c.dtype == WeightDType::kAuto) c.dtype = WeightDType::kBFloat16;
  const ModelConfig cfg = Llama3_8BShape(c.random_layers);
  // Fixed prompt ids spread over the vocabulary (no tokenizer).
  for (int i = 0; i < c.prompt_len; ++i)
    b.prompt.push_back(static_cast<int32_t>((1000 + 7919LL * i) % cfg.vocab_size));

  b.comm = MakeSingleRankCommunicator();
  auto r = std::make_unique<RandomModel>();
  r->num_layers = cfg.num_layers;
  r->vocab = cfg.vocab_size;
  const auto t0 = std::chrono::steady_clock::now();
  LlamaWeights weights = RandomLlamaWeights(cfg, c.dtype);
  // The Worker's auto KV type: fp32 for fp32 weights, bf16 for bf16, else fp16.
  const WeightDType wd = weights.dtype;
  auto AutoKv = [&] {
    return c.kv_cache_dtype.value_or(wd == WeightDType::kFloat32    ? kernels::DType::kFloat32
                                     : wd == WeightDType::kBFloat16 ? kernels::DType::kBFloat16
                                                                    : kernels::DType::kFloat16);
  };
  const auto t1 = std::chrono::steady_clock::now();
  std::fprintf(stderr,
               "bench_model: random Llama-3-8B-shaped weights, %d layers, %s, built in %.1f s\n",
               cfg.num_layers, WeightDTypeName(weights.dtype),
               std::chrono::duration<double>(t1 - t0).count());
  const int max_batch = *std::max_element(c.batches.begin(), c.batches.end());
  kernels::KVCacheShape shape;
  shape.num_blocks = static_cast<int64_t>(max_batch) * BlocksPerSeq();
  shape.num_kv_heads = cfg.num_kv_heads;
  shape.head_size = cfg.head_size;
  shape.block_size = kBlockSize;
  if (cuda) {
#ifdef PAGEDSERVE_WITH_CUDA
    auto m = CudaLlamaModel::Create(std::move(weights), b.comm.get(), 0);
    if (!m.ok()) Die(m.status().ToString());
    r->cuda = *std::move(m);
    DecodeGraphOptions graphs;
    graphs.enforce_eager = c.enforce_eager;
    r->cuda->set_graph_options(graphs);
    shape.dtype = AutoKv();
    if (absl::Status s = r->cuda->AllocateCaches(shape, shape.num_blocks, 0); !s.ok())
      Die(s.ToString());
    std::fprintf(stderr, "bench_model: uploaded in %.1f s (%.2f GB of weights on CUDA device 0)\n",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(),
                 r->cuda->backend().weight_bytes() / 1e9);
#else
    Die("--device=cuda: this build has no CUDA backend");
#endif
  } else {
    shape.dtype = AutoKv();
    auto m = LlamaModel::Create(std::move(weights), b.comm.get());
    if (!m.ok()) Die(m.status().ToString());
    r->cpu = *std::move(m);
    const size_t floats =
        shape.block_bytes() * static_cast<size_t>(shape.num_blocks) / sizeof(float);
    for (int l = 0; l < cfg.num_layers; ++l) {
      r->storage.emplace_back(new float[floats]);
      float* k = r->storage.back().get();
      r->storage.emplace_back(new float[floats]);
      float* v = r->storage.back().get();
      r->cpu_cache.push_back(kernels::KVCacheView{k, v, shape, kernels::Device::kCPU});
    }
  }
  r->kv_dtype = shape.dtype;
  b.random = std::move(r);
}

void Setup() {
  if (config().random_weights) {
    SetupRandom();
  } else {
    SetupFromFile();
  }
}

int NumLayers() {
  const Bench& b = bench();
  return b.random ? b.random->num_layers : b.worker->model_config().num_layers;
}

kernels::DType KvCacheDType() {
  const Bench& b = bench();
  return b.random ? b.random->kv_dtype : b.worker->kv_cache_dtype();
}

struct Seq {
  SeqId id;
  int first_block;
  int pos = 0;       // tokens cached so far
  int32_t last = 0;  // last sampled token
};

SequenceStep MakeStep(const Seq& s, std::vector<int32_t> tokens, bool sample) {
  SequenceStep st;
  st.seq_id = s.id;
  st.start_pos = s.pos;
  st.new_state = s.pos == 0;
  st.num_prompt_tokens = config().prompt_len;
  st.sample = sample;
  st.sampling.temperature = 0.0f;
  st.sampling.max_tokens = config().decode_steps + 1;
  st.token_ids = std::move(tokens);
  const int end = s.pos + static_cast<int>(st.token_ids.size());
  for (int blk = 0; blk < (end + kBlockSize - 1) / kBlockSize; ++blk)
    st.block_table.push_back(s.first_block + blk);
  return st;
}

// --random-weights: the plan's rows as one ForwardBatch (every step of this
// benchmark carries its sequence's full block table), every row greedy.
void RunRandom(const StepPlan& plan, std::vector<Seq>& seqs) {
  RandomModel& m = *bench().random;
  std::vector<int32_t> ids, pos, qsl{0}, lens, bt, rows;
  std::vector<int64_t> slots;
  std::vector<SeqId> sampled;
  size_t max_blocks = 1;
  for (const SequenceStep& st : plan.seqs) max_blocks = std::max(max_blocks, st.block_table.size());
  for (const SequenceStep& st : plan.seqs) {
    for (size_t i = 0; i < st.token_ids.size(); ++i) {
      const int p = st.start_pos + static_cast<int>(i);
      ids.push_back(st.token_ids[i]);
      pos.push_back(p);
      slots.push_back(static_cast<int64_t>(st.block_table.at(p / kBlockSize)) * kBlockSize +
                      p % kBlockSize);
    }
    qsl.push_back(static_cast<int32_t>(ids.size()));
    lens.push_back(st.start_pos + static_cast<int32_t>(st.token_ids.size()));
    std::vector<int32_t> row(max_blocks, 0);
    std::copy(st.block_table.begin(), st.block_table.end(), row.begin());
    bt.insert(bt.end(), row.begin(), row.end());
    if (st.sample) {
      for (int back = st.num_draft_tokens; back >= 0; --back) {
        rows.push_back(qsl.back() - 1 - back);
        sampled.push_back(st.seq_id);
      }
    }
  }
  if (ids.empty()) return;  // a plan that only finishes sequences
  ForwardBatch fb;
  fb.token_ids = ids;
  fb.positions = pos;
  fb.slot_mapping = slots;
  fb.query_start_loc = qsl;
  fb.seq_lens = lens;
  fb.block_tables = bt;
  fb.max_blocks_per_seq = static_cast<int>(max_blocks);
  fb.logits_rows = rows;
  if (absl::Status s = m.Forward(fb); !s.ok()) Die(s.ToString());
  for (size_t r = 0; r < sampled.size(); ++r) {
    const int32_t token = m.argmax.tokens[r];
    if (token < 0) Die("the random-weight model produced non-finite logits");
    for (Seq& s : seqs)
      if (s.id == sampled[r]) s.last = token;
  }
}

void Run(StepPlan& plan, std::vector<Seq>& seqs) {
  Bench& b = bench();
  plan.step_id = ++b.next_step;
  if (b.random) {
    RunRandom(plan, seqs);
    return;
  }
  auto r = b.worker->Execute(plan);
  if (!r.ok()) Die(r.status().ToString());
  for (const SampledToken& t : r->tokens)
    for (Seq& s : seqs)
      if (s.id == t.seq_id) s.last = t.token_id;
}

std::vector<Seq> NewSeqs(int batch) {
  std::vector<Seq> seqs;
  seqs.reserve(batch);
  for (int i = 0; i < batch; ++i) seqs.push_back(Seq{bench().next_seq++, i * BlocksPerSeq()});
  return seqs;
}

// Feeds every sequence's prompt in plans of at most max_batched_tokens tokens.
void Prefill(std::vector<Seq>& seqs) {
  const Config& c = config();
  const std::vector<int32_t>& prompt = bench().prompt;
  StepPlan plan;
  int budget = c.max_batched_tokens;
  for (Seq& s : seqs) {
    while (s.pos < c.prompt_len) {
      const int n = std::min(budget, c.prompt_len - s.pos);
      std::vector<int32_t> chunk(prompt.begin() + s.pos, prompt.begin() + s.pos + n);
      plan.seqs.push_back(MakeStep(s, std::move(chunk), s.pos + n == c.prompt_len));
      s.pos += n;
      budget -= n;
      if (budget == 0) {
        Run(plan, seqs);
        plan = StepPlan();
        budget = c.max_batched_tokens;
      }
    }
  }
  if (!plan.seqs.empty()) Run(plan, seqs);
}

void DecodeStep(std::vector<Seq>& seqs) {
  StepPlan plan;
  for (const Seq& s : seqs) plan.seqs.push_back(MakeStep(s, {s.last}, true));
  Run(plan, seqs);
  for (Seq& s : seqs) ++s.pos;
}

// A speculative verification step (runtime/coordinator/speculative.h): every
// sequence feeds its last token and K draft tokens (prompt tokens: the ids do
// not change the cost) and is sampled at all K + 1 positions; every draft
// counts as accepted, so the next step starts K + 1 positions on.
void VerifyStep(std::vector<Seq>& seqs) {
  const int k = config().verify_tokens;
  const std::vector<int32_t>& prompt = bench().prompt;
  StepPlan plan;
  for (const Seq& s : seqs) {
    std::vector<int32_t> tokens{s.last};
    for (int j = 0; j < k; ++j) tokens.push_back(prompt[(s.pos + j) % prompt.size()]);
    SequenceStep st = MakeStep(s, std::move(tokens), true);
    st.num_draft_tokens = k;
    st.sampling.max_tokens = config().decode_steps * (k + 1) + 1;
    plan.seqs.push_back(std::move(st));
  }
  Run(plan, seqs);
  for (Seq& s : seqs) s.pos += k + 1;
}

void Finish(std::vector<Seq>& seqs) {
  StepPlan plan;
  for (const Seq& s : seqs) plan.finished.push_back(s.id);
  Run(plan, seqs);
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// steps_per_iter > 0: also steps_per_s (timed steps per second).
void Report(benchmark::State& state, double tokens_per_iter, const std::vector<double>& secs,
            int steps_per_iter = 0) {
  double total = 0, best = 0;
  for (double s : secs) {
    total += s;
    best = std::max(best, tokens_per_iter / s);
  }
  const double tps = tokens_per_iter * static_cast<double>(secs.size()) / total;
  state.counters["tokens_per_s"] = tps;
  state.counters["tokens_per_s_best"] = best;
  state.counters["layers"] = NumLayers();
  state.counters["layer_tokens_per_s"] = tps * NumLayers();
  if (steps_per_iter > 0)
    state.counters["steps_per_s"] = steps_per_iter * static_cast<double>(secs.size()) / total;
  // Device memory of the CUDA graphs captured so far (all batch sizes run
  // until now; 0 on the CPU or with --enforce-eager).
  const Bench& b = bench();
  if (b.random && b.random->cuda)
    state.counters["graph_mib"] = b.random->cuda->backend().graph_bytes() / 1048576.0;
}

void BM_Prefill(benchmark::State& state, int batch) {
  std::vector<double> secs;
  for (auto _ : state) {
    std::vector<Seq> seqs = NewSeqs(batch);
    auto t0 = std::chrono::steady_clock::now();
    Prefill(seqs);
    auto t1 = std::chrono::steady_clock::now();
    Finish(seqs);
    state.SetIterationTime(Seconds(t0, t1));
    secs.push_back(Seconds(t0, t1));
  }
  Report(state, static_cast<double>(batch) * config().prompt_len, secs);
}

// --decode_steps timed steps of `step` after an untimed prefill; each step
// feeds tokens_per_seq tokens per sequence.
void TimeSteps(benchmark::State& state, int batch, void (*step)(std::vector<Seq>&),
               int tokens_per_seq) {
  std::vector<double> secs;
  for (auto _ : state) {
    std::vector<Seq> seqs = NewSeqs(batch);
    Prefill(seqs);
    auto t0 = std::chrono::steady_clock::now();
    for (int g = 0; g < config().decode_steps; ++g) step(seqs);
    auto t1 = std::chrono::steady_clock::now();
    Finish(seqs);
    state.SetIterationTime(Seconds(t0, t1));
    secs.push_back(Seconds(t0, t1));
  }
  Report(state, static_cast<double>(batch) * config().decode_steps * tokens_per_seq, secs,
         config().decode_steps);
}

void BM_Decode(benchmark::State& state, int batch) { TimeSteps(state, batch, DecodeStep, 1); }

// The memory read bandwidth the decode figures are set against (issue 34: batch-1
// decode reads every weight once per token): OMP_NUM_THREADS threads sum the
// 64-bit words of a --read_bandwidth_mib buffer (far larger than the last-level
// cache), each its static share. One plain scan per thread leaves bandwidth
// unused where the hardware prefetcher follows one stream per core at a time
// (a 2-vCPU KVM Xeon: 12-14 GB/s plain, 20-25 GB/s with several streams and
// software prefetch, and the decode kernels, which prefetch, read 18.5 GB/s),
// so each iteration times every ReadPattern and the figure is the best:
// counter bytes_per_s_best (read bytes per second), with the pattern that gave
// it (best_streams, best_prefetch_bytes) and the plain scan's best beside it
// (bytes_per_s_plain). The buffer is written once before timing (every page
// resident).
struct ReadPattern {
  int streams;         // per thread: its share split into this many interleaved streams
  int prefetch_bytes;  // software prefetch this far ahead of each stream (0 = none)
};
constexpr ReadPattern kReadPatterns[] = {{1, 0},    {1, 4096}, {2, 4096},
                                         {4, 1024}, {4, 4096}, {8, 1024}};

// Reads `words` of `buf` once with pattern `p` (each thread's share rounded
// down to whole 64-byte lines per stream; sum into *sink). Sets *seconds and
// returns the bytes read per second.
double ReadOnce(const uint64_t* buf, size_t words, ReadPattern p, uint64_t* sink, double* seconds) {
  const size_t threads = static_cast<size_t>(omp_get_max_threads());
  const size_t share = words / threads / p.streams / 8 * 8;  // words per stream
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t sum = 0;
#pragma omp parallel num_threads(threads) reduction(+ : sum)
  {
    const uint64_t* base = buf + static_cast<size_t>(omp_get_thread_num()) * share * p.streams;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i < share; i += 8) {
      for (int s = 0; s < p.streams; ++s) {
        const uint64_t* w = base + s * share + i;
        if (p.prefetch_bytes)
          __builtin_prefetch(reinterpret_cast<const char*>(w) + p.prefetch_bytes);
        a0 += w[0] + w[4];
        a1 += w[1] + w[5];
        a2 += w[2] + w[6];
        a3 += w[3] + w[7];
      }
    }
    sum += a0 + a1 + a2 + a3;
  }
  *sink += sum;
  *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(threads * share * p.streams * sizeof(uint64_t)) / *seconds;
}

void BM_ReadBandwidth(benchmark::State& state) {
  const size_t words = static_cast<size_t>(config().read_bandwidth_mib) << 17;  // MiB / 8 bytes
  std::vector<uint64_t> buf(words);
  for (size_t i = 0; i < words; ++i) buf[i] = i;
  uint64_t sink = 0;
  double best = 0.0, plain = 0.0;
  ReadPattern best_pattern{};
  for (auto _ : state) {
    double iteration_s = 0.0;
    for (const ReadPattern& p : kReadPatterns) {
      double seconds = 0.0;
      const double rate = ReadOnce(buf.data(), words, p, &sink, &seconds);
      iteration_s += seconds;
      if (rate > best) best = rate, best_pattern = p;
      if (p.streams == 1 && p.prefetch_bytes == 0) plain = std::max(plain, rate);
    }
    state.SetIterationTime(iteration_s);
  }
  benchmark::DoNotOptimize(sink);
  state.counters["bytes_per_s_best"] = best;
  state.counters["bytes_per_s_plain"] = plain;
  state.counters["best_streams"] = best_pattern.streams;
  state.counters["best_prefetch_bytes"] = best_pattern.prefetch_bytes;
}

// verify/batch:B (--verify_tokens=K): --decode_steps verification steps of
// K + 1 tokens per sequence after an untimed prefill. tokens_per_s counts
// every fed token (B * (K + 1) per step), so the cost of one verification
// step against one decode step is decode's steps/s over verify's:
// steps_per_s is reported for both.
void BM_Verify(benchmark::State& state, int batch) {
  TimeSteps(state, batch, VerifyStep, config().verify_tokens + 1);
}

bool ParseInt(const std::string& arg, const char* name, int* out) {
  const std::string prefix = absl::StrCat("--", name, "=");
  if (arg.rfind(prefix, 0) != 0) return false;
  if (!absl::SimpleAtoi(arg.substr(prefix.size()), out) || *out < 1)
    Die(absl::StrCat(prefix, " wants a positive integer, got '", arg.substr(prefix.size()), "'"));
  return true;
}

}  // namespace
}  // namespace pagedserve

int main(int argc, char** argv) {
  using namespace pagedserve;
  benchmark::Initialize(&argc, argv);
  Config& c = config();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("--model=", 0) == 0) {
      c.model = a.substr(8);
    } else if (a == "--random-weights") {
      c.random_weights = true;
    } else if (a == "--enforce-eager") {
      c.enforce_eager = true;
    } else if (a == "--random-layers" && i + 1 < argc) {
      if (!absl::SimpleAtoi(argv[++i], &c.random_layers) || c.random_layers < 1)
        Die(absl::StrCat("--random-layers wants a positive integer, got '", argv[i], "'"));
    } else if (ParseInt(a, "random-layers", &c.random_layers)) {
    } else if (a.rfind("--device=", 0) == 0) {
      const std::string v = a.substr(9);
      if (v == "cpu")
        c.device = kernels::Device::kCPU;
      else if (v == "cuda")
        c.device = kernels::Device::kCUDA;
      else
        Die("--device: cpu or cuda");
    } else if (a.rfind("--batches=", 0) == 0) {
      c.batches.clear();
      for (absl::string_view s : absl::StrSplit(a.substr(10), ',')) {
        int v = 0;
        if (!absl::SimpleAtoi(s, &v) || v < 1)
          Die(absl::StrCat("--batches: bad batch size '", s, "'"));
        c.batches.push_back(v);
      }
    } else if (a.rfind("--dtype=", 0) == 0) {
      auto d = ParseWeightDType(a.substr(8));
      if (!d.ok()) Die(d.status().ToString());
      c.dtype = *d;
    } else if (a.rfind("--kv_cache_dtype=", 0) == 0) {
      const std::string v = a.substr(17);
      if (v == "float32")
        c.kv_cache_dtype = kernels::DType::kFloat32;
      else if (v == "float16")
        c.kv_cache_dtype = kernels::DType::kFloat16;
      else if (v == "bfloat16")
        c.kv_cache_dtype = kernels::DType::kBFloat16;
      else if (v == "fp8" || v == "fp8_e4m3")
        c.kv_cache_dtype = kernels::DType::kFloat8E4M3;
      else if (v == "fp8_e5m2")
        c.kv_cache_dtype = kernels::DType::kFloat8E5M2;
      else if (v != "auto")
        Die("--kv_cache_dtype: auto, float32, float16, bfloat16, fp8, fp8_e4m3 or fp8_e5m2");
    } else if (!ParseInt(a, "prompt_len", &c.prompt_len) &&
               !ParseInt(a, "decode_steps", &c.decode_steps) &&
               !ParseInt(a, "repeats", &c.repeats) &&
               !ParseInt(a, "verify_tokens", &c.verify_tokens) &&
               !ParseInt(a, "read_bandwidth_mib", &c.read_bandwidth_mib) &&
               !ParseInt(a, "max_batched_tokens", &c.max_batched_tokens)) {
      Die(absl::StrCat("unknown argument '", a, "'"));
    }
  }
  if (c.random_weights && !c.model.empty()) Die("--model and --random-weights exclude each other");
  if (c.model.empty() && !c.random_weights) {
    const char* env = std::getenv("PAGEDSERVE_BENCH_MODEL");
    if (env == nullptr || *env == '\0')
      Die("give --model=PATH (e.g. --model=$(scripts/fetch-model)) or --random-weights");
    c.model = env;
  }
  Setup();
  benchmark::AddCustomContext(
      "model", c.random_weights ? absl::StrCat("random Llama-3-8B shape, ", NumLayers(), " layers")
                                : c.model);
  benchmark::AddCustomContext("device", kernels::DeviceName(c.device));
  benchmark::AddCustomContext("omp_max_threads", std::to_string(omp_get_max_threads()));
  const char* blas = std::getenv("OPENBLAS_NUM_THREADS");
  benchmark::AddCustomContext("OPENBLAS_NUM_THREADS", blas ? blas : "(unset)");
  benchmark::AddCustomContext("prompt_len", std::to_string(c.prompt_len));
  benchmark::AddCustomContext("decode_steps", std::to_string(c.decode_steps));
  benchmark::AddCustomContext("max_batched_tokens", std::to_string(c.max_batched_tokens));
  benchmark::AddCustomContext("dtype", WeightDTypeName(c.dtype));
  benchmark::AddCustomContext("kv_cache_dtype", kernels::DTypeName(KvCacheDType()));
  // Warm-up: page in the weights and size the activation buffers.
  {
    std::vector<Seq> seqs = NewSeqs(1);
    Prefill(seqs);
    DecodeStep(seqs);
    Finish(seqs);
  }
  if (!c.model.empty()) {
    std::error_code ec;
    const auto bytes = std::filesystem::file_size(c.model, ec);
    if (!ec) benchmark::AddCustomContext("model_file_bytes", std::to_string(bytes));
  }
  if (c.read_bandwidth_mib > 0) {
    benchmark::RegisterBenchmark("read_bandwidth", BM_ReadBandwidth)
        ->Iterations(c.repeats)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (int b : c.batches) {
    benchmark::RegisterBenchmark(absl::StrCat("prefill/batch:", b).c_str(), BM_Prefill, b)
        ->Iterations(c.repeats)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(absl::StrCat("decode/batch:", b).c_str(), BM_Decode, b)
        ->Iterations(c.repeats)
        ->UseManualTime()
        ->Unit(benchmark::kMillisecond);
    if (c.verify_tokens > 0)
      benchmark::RegisterBenchmark(absl::StrCat("verify/batch:", b).c_str(), BM_Verify, b)
          ->Iterations(c.repeats)
          ->UseManualTime()
          ->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
