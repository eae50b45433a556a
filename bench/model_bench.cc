// Model throughput on CPU (issue 3): prefill and decode tokens/s of a real
// model (SmolLM2-135M-Instruct by default) through the Worker, with hand-made
// step plans (the coordinator's job done by hand, so that only the forward pass
// and greedy sampling are timed). The llama.cpp side of the comparison is
// bench/llamacpp_baseline.py; bench/model_side_by_side.sh runs both and prints
// one table. Results: docs/benchmarks.md, "Model (CPU): pagedserve vs llama.cpp".
//
//   OMP_NUM_THREADS=2 OPENBLAS_NUM_THREADS=2 build-bench/bench/bench_model --model=PATH [--prompt_len=128] [--decode_steps=32]
//       [--batches=1,8,32] [--repeats=3] [--max_batched_tokens=512]
//       [--dtype=auto|float32|float16|bfloat16] [--kv_cache_dtype=auto|float32|float16|bfloat16]
//       [benchmark flags]
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
//  * each benchmark runs --repeats iterations on a fresh KV state (the finished
//    plan drops the sequences; their blocks are reused); counters: tokens_per_s
//    (over all iterations) and tokens_per_s_best (best iteration).
// Threads: OpenMP (OMP_NUM_THREADS) for our loops and OpenBLAS
// (OPENBLAS_NUM_THREADS) for the GEMMs; the context records both.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "benchmark/benchmark.h"
#include "distributed/communicator.h"
#include "runtime/common/step_plan.h"
#include "runtime/tokenizer/loaders.h"
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
  WeightDType dtype = WeightDType::kAuto;          // --dtype=auto|float32|float16|bfloat16
  std::optional<kernels::DType> kv_cache_dtype;    // --kv_cache_dtype=float32|float16|bfloat16|fp8|fp8_e4m3|fp8_e5m2
};

Config& config() {
  static Config c;
  return c;
}

struct Bench {
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Worker> worker;
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
  return (c.prompt_len + c.decode_steps + kBlockSize - 1) / kBlockSize;
}

void Setup() {
  Config& c = config();
  Bench& b = bench();
  auto tokenizer = LoadGgufTokenizer(c.model);
  if (!tokenizer.ok()) Die(tokenizer.status().ToString());
  EncodeOptions enc;
  enc.add_special_tokens = false;
  enc.parse_special = false;
  std::vector<int32_t> text = (*tokenizer)->Encode(kText, enc);
  if (text.empty()) Die("the benchmark text tokenizes to nothing");
  while (static_cast<int>(b.prompt.size()) < c.prompt_len) b.prompt.insert(b.prompt.end(), text.begin(), text.end());
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
  auto w = Worker::Create(o, b.comm.get());
  if (!w.ok()) Die(w.status().ToString());
  b.worker = *std::move(w);
  if (b.worker->num_device_blocks() < o.max_num_blocks)
    Die(absl::StrCat("KV pool has ", b.worker->num_device_blocks(), " blocks, need ", o.max_num_blocks));
}

struct Seq {
  SeqId id;
  int first_block;
  int pos = 0;           // tokens cached so far
  int32_t last = 0;      // last sampled token
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
  for (int blk = 0; blk < (end + kBlockSize - 1) / kBlockSize; ++blk) st.block_table.push_back(s.first_block + blk);
  return st;
}

void Run(StepPlan& plan, std::vector<Seq>& seqs) {
  Bench& b = bench();
  plan.step_id = ++b.next_step;
  auto r = b.worker->Execute(plan);
  if (!r.ok()) Die(r.status().ToString());
  for (const SampledToken& t : r->tokens)
    for (Seq& s : seqs)
      if (s.id == t.seq_id) s.last = t.token_id;
}

std::vector<Seq> NewSeqs(int batch) {
  std::vector<Seq> seqs;
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

void Finish(std::vector<Seq>& seqs) {
  StepPlan plan;
  for (const Seq& s : seqs) plan.finished.push_back(s.id);
  Run(plan, seqs);
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void Report(benchmark::State& state, double tokens_per_iter, const std::vector<double>& secs) {
  double total = 0, best = 0;
  for (double s : secs) {
    total += s;
    best = std::max(best, tokens_per_iter / s);
  }
  state.counters["tokens_per_s"] = tokens_per_iter * static_cast<double>(secs.size()) / total;
  state.counters["tokens_per_s_best"] = best;
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

void BM_Decode(benchmark::State& state, int batch) {
  std::vector<double> secs;
  for (auto _ : state) {
    std::vector<Seq> seqs = NewSeqs(batch);
    Prefill(seqs);
    auto t0 = std::chrono::steady_clock::now();
    for (int g = 0; g < config().decode_steps; ++g) DecodeStep(seqs);
    auto t1 = std::chrono::steady_clock::now();
    Finish(seqs);
    state.SetIterationTime(Seconds(t0, t1));
    secs.push_back(Seconds(t0, t1));
  }
  Report(state, static_cast<double>(batch) * config().decode_steps, secs);
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
    } else if (a.rfind("--batches=", 0) == 0) {
      c.batches.clear();
      for (absl::string_view s : absl::StrSplit(a.substr(10), ',')) {
        int v = 0;
        if (!absl::SimpleAtoi(s, &v) || v < 1) Die(absl::StrCat("--batches: bad batch size '", s, "'"));
        c.batches.push_back(v);
      }
    } else if (a.rfind("--dtype=", 0) == 0) {
      auto d = ParseWeightDType(a.substr(8));
      if (!d.ok()) Die(d.status().ToString());
      c.dtype = *d;
    } else if (a.rfind("--kv_cache_dtype=", 0) == 0) {
      const std::string v = a.substr(17);
      if (v == "float32") c.kv_cache_dtype = kernels::DType::kFloat32;
      else if (v == "float16") c.kv_cache_dtype = kernels::DType::kFloat16;
      else if (v == "bfloat16") c.kv_cache_dtype = kernels::DType::kBFloat16;
      else if (v == "fp8" || v == "fp8_e4m3") c.kv_cache_dtype = kernels::DType::kFloat8E4M3;
      else if (v == "fp8_e5m2") c.kv_cache_dtype = kernels::DType::kFloat8E5M2;
      else if (v != "auto")
        Die("--kv_cache_dtype: auto, float32, float16, bfloat16, fp8, fp8_e4m3 or fp8_e5m2");
    } else if (!ParseInt(a, "prompt_len", &c.prompt_len) && !ParseInt(a, "decode_steps", &c.decode_steps) &&
               !ParseInt(a, "repeats", &c.repeats) && !ParseInt(a, "max_batched_tokens", &c.max_batched_tokens)) {
      Die(absl::StrCat("unknown argument '", a, "'"));
    }
  }
  if (c.model.empty()) {
    const char* env = std::getenv("PAGEDSERVE_BENCH_MODEL");
    if (env == nullptr || *env == '\0') Die("give --model=PATH (e.g. --model=$(scripts/fetch-model))");
    c.model = env;
  }
  Setup();
  benchmark::AddCustomContext("model", c.model);
  benchmark::AddCustomContext("omp_max_threads", std::to_string(omp_get_max_threads()));
  const char* blas = std::getenv("OPENBLAS_NUM_THREADS");
  benchmark::AddCustomContext("OPENBLAS_NUM_THREADS", blas ? blas : "(unset)");
  benchmark::AddCustomContext("prompt_len", std::to_string(c.prompt_len));
  benchmark::AddCustomContext("decode_steps", std::to_string(c.decode_steps));
  benchmark::AddCustomContext("max_batched_tokens", std::to_string(c.max_batched_tokens));
  benchmark::AddCustomContext("dtype", WeightDTypeName(c.dtype));
  benchmark::AddCustomContext("kv_cache_dtype",
                              kernels::DTypeName(bench().worker->kv_cache_dtype()));
  // Warm-up: page in the weights and size the activation buffers.
  {
    std::vector<Seq> seqs = NewSeqs(1);
    Prefill(seqs);
    DecodeStep(seqs);
    Finish(seqs);
  }
  for (int b : c.batches) {
    benchmark::RegisterBenchmark(absl::StrCat("prefill/batch:", b).c_str(), BM_Prefill, b)
        ->Iterations(c.repeats)->UseManualTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(absl::StrCat("decode/batch:", b).c_str(), BM_Decode, b)
        ->Iterations(c.repeats)->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
