#include "runtime/cli/common_flags.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <limits>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "runtime/cli/json_log_format.h"
#include "runtime/cli/load_progress.h"
#include "runtime/common/status_macros.h"
#include "runtime/coordinator/speculative.h"
#include "runtime/frontend/chat_messages.h"
#include "runtime/model/weights.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/loaders.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"

PAGEDSERVE_FLAG(
    "generate,serve", std::string, log_color, "auto",
    "ANSI colours in log lines: auto (only when the output is a terminal, NO_COLOR is "
    "unset and not under mpirun, whose ranks write to a pseudo-terminal), always, never");
PAGEDSERVE_FLAG("generate,serve", std::string, log_level, "info",
                "lowest level of the log lines written: debug, info, warning or error "
                "(spdlog levels; debug adds the stats line while the server is idle)");
PAGEDSERVE_FLAG("generate,serve", std::string, log_format, "text",
                "log line format: text (\"[time] [level] message\") or json (one object per "
                "line: time in UTC, level, message; no colour)");
PAGEDSERVE_FLAG("generate,serve", std::string, model, "",
                "model: a .gguf file or a Hugging Face directory (config.json, *.safetensors, "
                "tokenizer.json); serve also takes it as its argument: `pagedserve serve MODEL`");
PAGEDSERVE_FLAG("generate,serve", int32_t, tensor_parallel_size, 1,
                "worker ranks sharding the model's heads; run under `mpirun -np 1+N` when N > 1");
PAGEDSERVE_FLAG("generate,serve", int32_t, block_size, 16,
                "tokens per KV-cache block: 8, 16 or 32");
PAGEDSERVE_FLAG(
    "generate,serve", int64_t, kv_cache_memory, int64_t{1} << 30,
    "bytes of KV cache per worker rank (all layers, K and V); sets the number of device blocks");
PAGEDSERVE_FLAG("generate,serve", double, gpu_memory_utilization, 0.9,
                "CUDA workers: fraction of the device's memory the worker may hold in all "
                "(weights, activations and KV cache, as vLLM), in (0, 1]; the KV cache gets what "
                "is left and sets the number of device blocks (--kv-cache-memory is then unused)");
PAGEDSERVE_FLAG("generate,serve", double, swap_space, 1.0,
                "GiB of CPU swap space per worker rank for preempted sequences");
PAGEDSERVE_FLAG("generate,serve", std::string, dtype, "auto",
                "weight precision: auto (CPU: GGUF/safetensors matrices run in their stored "
                "formats, quantized kernels; CUDA: bfloat16), float32 (dequantize at load; the "
                "exact fp32 path), float16, bfloat16 (CUDA: tensor-core GEMMs)");
PAGEDSERVE_FLAG("generate,serve", std::string, kv_cache_dtype, "auto",
                "KV cache element type: auto (float32 with --dtype float32, bfloat16 with --dtype "
                "bfloat16 and on CUDA with --dtype auto, else float16), float32, float16, "
                "bfloat16, fp8 (= fp8_e4m3, as vLLM), fp8_e4m3, fp8_e5m2 (per-layer scales 1.0)");
PAGEDSERVE_FLAG(
    "generate,serve", bool, enforce_eager, false,
    "CUDA workers: run every step eagerly instead of replaying CUDA graphs captured "
    "for decode steps (batch padded to 1, 2, 4 or a multiple of 8, up to 256 sequences; as "
    "vLLM)");
PAGEDSERVE_FLAG("generate,serve", int32_t, max_seq_len_to_capture, 8192,
                "CUDA workers: decode steps whose longest sequence is longer run eagerly");
PAGEDSERVE_FLAG("generate,serve", int64_t, max_num_blocks, 0,
                "cap on the device KV blocks per rank (0 = only --kv-cache-memory decides)");
PAGEDSERVE_FLAG(
    "generate,serve", int32_t, max_model_len, 0,
    "prompt + output tokens per sequence (0 = the model's context, lowered to the longest "
    "sequence the KV cache holds when it holds less, as vLLM does)");
PAGEDSERVE_FLAG("generate,serve", int32_t, max_num_seqs, 128, "sequences per engine step");
PAGEDSERVE_FLAG(
    "generate,serve", int32_t, max_num_batched_tokens, 0,
    "tokens per engine step (prefill chunks + decodes); 0 = max(128, --max-num-seqs) with chunked "
    "prefill (short steps keep decodes flowing while long prompts are prefilled; the trade-off "
    "is in docs/benchmarks-history.md, \"Step budget and inter-token latency\"), else "
    "--max-model-len");
PAGEDSERVE_FLAG("generate,serve", bool, enable_chunked_prefill, true,
                "split long prompts into chunks that share steps with decodes");
PAGEDSERVE_FLAG("generate,serve", bool, prefill_first, false,
                "a step with requests waiting runs only their prefills (running decodes wait a "
                "step, as in vLLM V0 without chunked prefill and SGLang): lower TTFT for arrivals "
                "while others generate, higher TPOT for those (docs/coordinator.md)");
PAGEDSERVE_FLAG("serve", std::string, scheduling_policy, "fcfs",
                "the order requests are admitted and kept in: fcfs (arrival) or priority (a "
                "request's `priority`, lower first, then arrival; the newest of the lowest "
                "priority is preempted first), as vLLM's flag");
PAGEDSERVE_FLAG("generate,serve", bool, enable_prefix_caching, true,
                "reuse the KV blocks of identical prompt prefixes (on by default, as in vLLM's V1 "
                "engine; --no-enable-prefix-caching turns it off)");
PAGEDSERVE_FLAG("generate,serve", std::string, preemption_mode, "recompute",
                "what happens to a preempted sequence's KV blocks: swap (to CPU) or recompute");
PAGEDSERVE_FLAG("generate,serve", std::string, speculative_config, "",
                "speculative decoding, as vLLM's JSON: '{\"method\": \"ngram\", "
                "\"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, \"prompt_lookup_min\": "
                "2}', or a draft model of the same vocabulary: '{\"model\": PATH, "
                "\"num_speculative_tokens\": 4}' (CPU workers); optional "
                "\"disable_by_batch_size\"; empty = off. Exact: the output "
                "distribution is the model's (docs/coordinator.md, \"Speculative decoding\")");
PAGEDSERVE_FLAG("generate,serve", double, worker_startup_timeout, 600,
                "seconds to wait for the worker ranks to load the model (mpirun)");
PAGEDSERVE_FLAG("generate,serve", double, worker_step_timeout, 120,
                "seconds the coordinator waits for the worker ranks in one step before declaring "
                "them hung (mpirun); "
                "must exceed the longest step. A worker that dies on the coordinator's host is "
                "noticed at once");

PAGEDSERVE_FLAG("generate,client", std::optional<int32_t>, max_tokens, std::nullopt,
                "tokens to generate per sample; unset: 16, lowered to what the context has room "
                "for (a value given beyond --max-model-len minus the prompt is refused)");
PAGEDSERVE_FLAG("generate,client", double, temperature, 1.0, "sampling temperature; 0 = greedy");
PAGEDSERVE_FLAG("generate,client", double, top_p, 1.0,
                "nucleus sampling: smallest set of tokens with this probability mass, in (0, 1]");
PAGEDSERVE_FLAG("generate,client", int32_t, top_k, -1,
                "sample among the k most likely tokens; -1 = off");
PAGEDSERVE_FLAG("generate,client", double, min_p, 0.0,
                "drop tokens less likely than min_p times the most likely one, in [0, 1]");
PAGEDSERVE_FLAG(
    "generate,client,serve", int64_t, seed, -1,
    "generate, client: the request's random seed (reproducible sampling); serve: the engine-wide "
    "default seed (as vLLM's --seed): a request that gives no seed samples with one derived from "
    "this seed and its arrival order, so the same requests sent in the same order give the same "
    "text on every run (a request's own seed still wins); -1 = none (unseeded requests are not "
    "reproducible)");
PAGEDSERVE_FLAG("generate,client", int32_t, n, 1, "samples per prompt");

namespace {
// Every --stop occurrence adds its strings (absl keeps only the last value).
std::vector<std::string>& StopAccumulator() {
  static auto* v = new std::vector<std::string>();
  return *v;
}
void OnStopFlag();
}  // namespace

ABSL_FLAG(std::vector<std::string>, stop, {},
          "stop strings, comma separated; the flag may be repeated. Output ends before the first "
          "one found")
    .OnUpdate(OnStopFlag);
PAGEDSERVE_REGISTER_FLAG("generate,client", stop);
PAGEDSERVE_FLAG("generate,client", std::vector<std::string>, stop_token_ids, {},
                "token ids that end a sample, comma separated");
PAGEDSERVE_FLAG("generate,client", bool, ignore_eos, false,
                "keep generating after the end-of-sequence token");
PAGEDSERVE_FLAG("generate,client", int32_t, logprobs, -1,
                "-1: none; 0: logprob of each sampled token; N: also the top N (<= 20)");
PAGEDSERVE_FLAG("generate,client", double, repetition_penalty, 1.0,
                "CTRL repetition penalty over prompt and output; 1 = off");
PAGEDSERVE_FLAG("generate,client", double, presence_penalty, 0.0,
                "OpenAI presence penalty over output tokens, in [-2, 2]");
PAGEDSERVE_FLAG("generate,client", double, frequency_penalty, 0.0,
                "OpenAI frequency penalty over output tokens, in [-2, 2]");
PAGEDSERVE_FLAG("generate,client", bool, use_beam_search, false,
                "beam search (needs --temperature 0): returns the --n best of --best-of beams");
PAGEDSERVE_FLAG("generate,client", int32_t, best_of, 0,
                "beam width with --use-beam-search, in [n, 10]; 0 = n");
PAGEDSERVE_FLAG("generate,client", double, length_penalty, 1.0,
                "beam score = cumulative logprob / generated_len ^ length_penalty");
PAGEDSERVE_FLAG("generate,client", std::string, early_stopping, "false",
                "when beam search stops: true, false or never (docs/protocol.md)");

PAGEDSERVE_FLAG("generate,client", std::string, prompt, "",
                "prompt text (read from stdin when absent)");
PAGEDSERVE_FLAG("generate,client", bool, chat, false,
                "send the prompt as one user message through the model's chat template");
PAGEDSERVE_FLAG("generate,serve", std::string, chat_template, "",
                "chat template instead of the model's: a file, or the Jinja template itself "
                "(as vLLM's flag of this name)");

namespace {
void OnStopFlag() {
  const std::vector<std::string> v = absl::GetFlag(FLAGS_stop);
  StopAccumulator().insert(StopAccumulator().end(), v.begin(), v.end());
}
}  // namespace

namespace pagedserve::cli {
namespace {

absl::Status BadFlag(const std::string& flag, const std::string& what, auto value) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, " ", what, ", got ", value));
}

// --speculative-config into the scheduler's config and, for a draft model,
// the workers'.
absl::Status SpeculativeFromFlags(ModelSetup* s) {
  SchedulerConfig& c = s->scheduler;
  absl::StatusOr<SpeculativeConfig> spec =
      ParseSpeculativeConfig(absl::GetFlag(FLAGS_speculative_config));
  if (!spec.ok()) return spec.status();  // names --speculative-config and the key
  c.speculative = *std::move(spec);
  s->worker.draft_model_path = c.speculative.model;
  if (c.speculative.model.empty()) return absl::OkStatus();
  // Before the target loads (minutes for a large one): the path names a model
  // of the target's vocabulary size. Worker::Create checks the loaded draft
  // again (every front end).
  const std::string& draft = c.speculative.model;
  std::error_code ec;
  if (!std::filesystem::exists(draft, ec))
    return absl::NotFoundError(
        absl::StrCat("--speculative-config: draft model '", draft, "' does not exist"));
  absl::StatusOr<ModelConfig> config = LoadModelConfig(draft);
  if (!config.ok())
    return absl::Status(
        config.status().code(),
        absl::StrCat("--speculative-config: draft model ", draft, ": ", config.status().message()));
  if (config->vocab_size != s->model.vocab_size)
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative-config: draft model '", draft, "' has a vocabulary of ",
                     config->vocab_size, " tokens, the target ", s->model.vocab_size,
                     ": a draft model must share the target's vocabulary"));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSetup> ModelSetupFromFlags() {
  ModelSetup s;
  const std::string path = absl::GetFlag(FLAGS_model);
  if (path.empty())
    return absl::InvalidArgumentError("--model is required (a .gguf file or a model directory)");
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) {
    return absl::NotFoundError(absl::StrCat("--model: '", path, "' does not exist"));
  }
  absl::StatusOr<ModelConfig> model = LoadModelConfig(path);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("--model ", path, ": ", model.status().message()));
  }
  s.model = *std::move(model);

  s.tensor_parallel_size = absl::GetFlag(FLAGS_tensor_parallel_size);
  if (s.tensor_parallel_size < 1)
    return BadFlag("tensor-parallel-size", "must be >= 1", s.tensor_parallel_size);

  s.worker.model_path = path;
  s.worker.constraint_vocabulary = [path, model = s.model]() {
    return ConstraintVocabularyOf(path, model);
  };
  s.worker.block_size = absl::GetFlag(FLAGS_block_size);
  if (s.worker.block_size != 8 && s.worker.block_size != 16 && s.worker.block_size != 32) {
    return BadFlag("block-size", "must be 8, 16 or 32", s.worker.block_size);
  }
  s.worker.kv_cache_memory = absl::GetFlag(FLAGS_kv_cache_memory);
  if (s.worker.kv_cache_memory <= 0)
    return BadFlag("kv-cache-memory", "must be > 0 bytes", s.worker.kv_cache_memory);
  const double gmu = absl::GetFlag(FLAGS_gpu_memory_utilization);
  if (!(gmu > 0.0 && gmu <= 1.0))
    return BadFlag("gpu-memory-utilization", "must be in (0, 1]", gmu);
  s.worker.gpu_memory_utilization = gmu;
  const double swap_gib = absl::GetFlag(FLAGS_swap_space);
  if (!(swap_gib >= 0 && swap_gib <= 1024))
    return BadFlag("swap-space", "must be in [0, 1024] GiB", swap_gib);
  s.worker.swap_space = static_cast<int64_t>(swap_gib * static_cast<double>(int64_t{1} << 30));
  absl::StatusOr<WeightDType> dtype = ParseWeightDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok())
    return absl::InvalidArgumentError(absl::StrCat("--dtype: ", dtype.status().message()));
  s.worker.dtype = *dtype;
  const std::string kv = absl::GetFlag(FLAGS_kv_cache_dtype);
  if (kv == "float32") {
    s.worker.kv_cache_dtype = kernels::DType::kFloat32;
  } else if (kv == "float16") {
    s.worker.kv_cache_dtype = kernels::DType::kFloat16;
  } else if (kv == "bfloat16") {
    s.worker.kv_cache_dtype = kernels::DType::kBFloat16;
  } else if (kv == "fp8" || kv == "fp8_e4m3") {  // fp8 = e4m3, as in vLLM
    s.worker.kv_cache_dtype = kernels::DType::kFloat8E4M3;
  } else if (kv == "fp8_e5m2") {
    s.worker.kv_cache_dtype = kernels::DType::kFloat8E5M2;
  } else if (kv != "auto") {
    return BadFlag("kv-cache-dtype",
                   "must be auto, float32, float16, bfloat16, fp8, fp8_e4m3 or fp8_e5m2", kv);
  }
  s.worker.graphs.enforce_eager = absl::GetFlag(FLAGS_enforce_eager);
  s.worker.graphs.max_seq_len_to_capture = absl::GetFlag(FLAGS_max_seq_len_to_capture);
  if (s.worker.graphs.max_seq_len_to_capture < 1)
    return BadFlag("max-seq-len-to-capture", "must be >= 1",
                   s.worker.graphs.max_seq_len_to_capture);
  s.worker.load_progress = MakeLoadProgress();
  s.worker.max_num_blocks = absl::GetFlag(FLAGS_max_num_blocks);
  if (s.worker.max_num_blocks < 0)
    return BadFlag("max-num-blocks", "must be >= 0", s.worker.max_num_blocks);

  SchedulerConfig& c = s.scheduler;
  c.block_size = s.worker.block_size;
  const int32_t len = absl::GetFlag(FLAGS_max_model_len);
  if (len < 0) return BadFlag("max-model-len", "must be >= 0 (0 = from the model)", len);
  if (len > s.model.max_position_embeddings) {
    return BadFlag("max-model-len",
                   absl::StrCat("must be <= the model's max_position_embeddings ",
                                s.model.max_position_embeddings),
                   len);
  }
  // 0: the model's context; the engine lowers it to what the KV pool holds
  // (EngineOptions::fit_max_model_len), once the workers have sized the pool.
  c.max_model_len =
      len > 0 ? len
              : static_cast<int32_t>(std::min<int64_t>(s.model.max_position_embeddings,
                                                       std::numeric_limits<int32_t>::max()));
  s.fit_max_model_len = len == 0;
  s.worker.max_model_len = c.max_model_len;  // LongRoPE's factor set, before the fit
  // Blocks out of the window are freed only when no layer attends further back.
  c.sliding_window = s.model.sliding_window;
  for (int l = 0; l < s.model.num_layers; ++l) {
    if (s.model.LayerSlidingWindow(l) != s.model.sliding_window) c.sliding_window = 0;
  }
  c.max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  c.enable_chunked_prefill = absl::GetFlag(FLAGS_enable_chunked_prefill);
  const int32_t batched = absl::GetFlag(FLAGS_max_num_batched_tokens);
  if (batched < 0) return BadFlag("max-num-batched-tokens", "must be >= 0 (0 = default)", batched);
  c.max_num_batched_tokens =
      batched > 0 ? batched
                  : (c.enable_chunked_prefill ? std::max(128, c.max_num_seqs) : c.max_model_len);
  c.enable_prefix_caching = absl::GetFlag(FLAGS_enable_prefix_caching);
  c.prefill_first = absl::GetFlag(FLAGS_prefill_first);
  const std::string policy = absl::GetFlag(FLAGS_scheduling_policy);
  if (policy != "fcfs" && policy != "priority") {
    return BadFlag("scheduling-policy", "must be fcfs or priority", policy);
  }
  c.enable_priority = policy == "priority";
  absl::StatusOr<PreemptionMode> mode = ParsePreemptionMode(absl::GetFlag(FLAGS_preemption_mode));
  if (!mode.ok()) return mode.status();  // names --preemption-mode
  c.preemption_mode = *mode;
  PS_RETURN_IF_ERROR(SpeculativeFromFlags(&s));

  const double startup = absl::GetFlag(FLAGS_worker_startup_timeout);
  const double step = absl::GetFlag(FLAGS_worker_step_timeout);
  if (!(startup > 0)) return BadFlag("worker-startup-timeout", "must be > 0 seconds", startup);
  if (!(step > 0)) return BadFlag("worker-step-timeout", "must be > 0 seconds", step);
  s.worker_startup_timeout = absl::Seconds(startup);
  s.worker_step_timeout = absl::Seconds(step);
  return s;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_path) {
  std::error_code ec;
  if (!std::filesystem::exists(model_path, ec)) {
    return absl::NotFoundError(absl::StrCat("model '", model_path, "' does not exist"));
  }
  if (std::filesystem::is_directory(model_path, ec)) return LoadHfTokenizer(model_path);
  return LoadGgufTokenizer(model_path);
}

absl::StatusOr<std::shared_ptr<const grammar::TokenVocabulary>> ConstraintVocabularyOf(
    const std::string& model_path, const ModelConfig& model) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tokenizer, LoadTokenizer(model_path));
  // Each token's bytes as the detokenizer emits them after earlier output
  // (special tokens skipped: they carry no text a constraint could match).
  DecodeOptions options;
  options.skip_special_tokens = true;
  options.strip_leading_space = false;
  std::vector<std::string> bytes(static_cast<size_t>(tokenizer->vocab_size()));
  for (int32_t id = 0; id < tokenizer->vocab_size(); ++id) {
    bytes[id] = tokenizer->TokenBytes(id, /*first=*/false, options);
  }
  std::vector<int32_t> ends;
  for (int32_t id : EosTokenIds(model, *tokenizer)) {
    if (id >= 0 && id < tokenizer->vocab_size()) ends.push_back(id);
  }
  return grammar::TokenVocabulary::Create(std::move(bytes), std::move(ends));
}

std::string MaxModelLenNote(const ModelSetup& setup, const SchedulerConfig& engine_config) {
  if (!setup.fit_max_model_len) return "";
  const int32_t model_len = setup.scheduler.max_model_len;
  if (engine_config.max_model_len >= model_len) {
    return absl::StrCat("max_model_len ", engine_config.max_model_len, ": the model's context");
  }
  return absl::StrCat("max_model_len ", engine_config.max_model_len,
                      ": the longest sequence the KV cache holds (",
                      engine_config.num_device_blocks, " blocks of ", engine_config.block_size,
                      " tokens); the model's context is ", model_len,
                      " (more --kv-cache-memory / --gpu-memory-utilization raises it)");
}

std::string DefaultServedModelName(const std::string& model_path) {
  std::string_view p = model_path;
  while (p.size() > 1 && p.back() == '/') p.remove_suffix(1);
  const size_t slash = p.rfind('/');
  std::string_view name = slash == std::string_view::npos ? p : p.substr(slash + 1);
  return name.empty() ? model_path : std::string(name);
}

std::vector<int32_t> EosTokenIds(const ModelConfig& model, const Tokenizer& tokenizer) {
  std::vector<int32_t> ids = model.eos_token_ids;
  if (tokenizer.eos_id() >= 0) ids.push_back(tokenizer.eos_id());
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}
bool MaxTokensFlagGiven() { return absl::GetFlag(FLAGS_max_tokens).has_value(); }

absl::StatusOr<SamplingParams> SamplingParamsFromFlags() {
  SamplingParams p;
  p.n = absl::GetFlag(FLAGS_n);
  p.max_tokens = absl::GetFlag(FLAGS_max_tokens).value_or(kDefaultMaxTokens);
  p.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature));
  p.top_p = static_cast<float>(absl::GetFlag(FLAGS_top_p));
  p.top_k = absl::GetFlag(FLAGS_top_k);
  p.min_p = static_cast<float>(absl::GetFlag(FLAGS_min_p));
  p.repetition_penalty = static_cast<float>(absl::GetFlag(FLAGS_repetition_penalty));
  p.presence_penalty = static_cast<float>(absl::GetFlag(FLAGS_presence_penalty));
  p.frequency_penalty = static_cast<float>(absl::GetFlag(FLAGS_frequency_penalty));
  PS_ASSIGN_OR_RETURN(p.seed, SeedFromFlags());
  p.stop = StopAccumulator();
  if (p.stop.empty()) p.stop = absl::GetFlag(FLAGS_stop);  // set programmatically (SetFlag)
  for (const std::string& t : absl::GetFlag(FLAGS_stop_token_ids)) {
    int32_t id = 0;
    if (!absl::SimpleAtoi(t, &id))
      return BadFlag("stop-token-ids", "must be a comma-separated list of token ids", t);
    p.stop_token_ids.push_back(id);
  }
  p.ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  p.logprobs = absl::GetFlag(FLAGS_logprobs);
  p.use_beam_search = absl::GetFlag(FLAGS_use_beam_search);
  p.best_of = absl::GetFlag(FLAGS_best_of);
  p.length_penalty = static_cast<float>(absl::GetFlag(FLAGS_length_penalty));
  const std::string es = absl::GetFlag(FLAGS_early_stopping);
  if (es == "true") {
    p.early_stopping = EarlyStopping::kTrue;
  } else if (es == "never") {
    p.early_stopping = EarlyStopping::kNever;
  } else if (es != "false") {
    return BadFlag("early-stopping", "must be true, false or never", es);
  }
  if (absl::Status s = p.Validate(); !s.ok()) {
    // "top_p must be in (0, 1], got 1.5" -> "--top-p must be ...".
    std::string msg(s.message());
    const size_t sp = msg.find(' ');
    if (sp != std::string::npos)
      msg = "--" + absl::StrReplaceAll(msg.substr(0, sp), {{"_", "-"}}) + msg.substr(sp);
    return absl::InvalidArgumentError(msg);
  }
  return p;
}

absl::StatusOr<std::optional<uint64_t>> SeedFromFlags() {
  const int64_t seed = absl::GetFlag(FLAGS_seed);
  if (seed < -1) return BadFlag("seed", "must be >= 0 (or -1 for none)", seed);
  if (seed < 0) return std::optional<uint64_t>();
  return std::optional<uint64_t>(static_cast<uint64_t>(seed));
}

absl::Status ApplyModelArgument(const std::vector<std::string>& args) {
  if (args.size() > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument '", args[2], "' (one model path at most)"));
  }
  if (args.size() < 2) return absl::OkStatus();
  const std::string flag = absl::GetFlag(FLAGS_model);
  if (!flag.empty() && flag != args[1]) {
    return absl::InvalidArgumentError(absl::StrCat("the model is given twice: as the argument '",
                                                   args[1], "' and as --model '", flag,
                                                   "'; give one"));
  }
  absl::SetFlag(&FLAGS_model, args[1]);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadPromptFromFlags() {
  std::string text = absl::GetFlag(FLAGS_prompt);
  if (text.empty()) {
    std::ostringstream ss;
    ss << std::cin.rdbuf();
    text = ss.str();
  }
  if (text.empty())
    return absl::InvalidArgumentError("empty prompt: give --prompt TEXT or text on stdin");
  return text;
}

namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

void AppendCodePoint(uint32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

// The character a one-letter escape stands for (\n, \t ...), or 0.
char SimpleEscape(char c) {
  switch (c) {
    case 'n': return '\n';
    case 't': return '\t';
    case 'r': return '\r';
    case 'a': return '\a';
    case 'b': return '\b';
    case 'f': return '\f';
    case 'v': return '\v';
    case '\\':
    case '\'':
    case '"': return c;
    default: return 0;
  }
}

// \xNN, \uNNNN or \UNNNNNNNN at s[i] (the letter): the code point, or -1.
int64_t HexEscape(const std::string& s, size_t i) {
  const size_t digits = s[i] == 'x' ? 2 : s[i] == 'u' ? 4 : s[i] == 'U' ? 8 : 0;
  if (digits == 0 || i + digits >= s.size()) return -1;
  int64_t value = 0;
  for (size_t k = 1; k <= digits; ++k) {
    const int d = HexDigit(s[i + k]);
    if (d < 0) return -1;
    value = value * 16 + d;
  }
  return value <= 0x10FFFF ? value : -1;
}

// Python's unicode_escape decoding (as vLLM applies it to a template given on
// the command line), leaving non-ASCII text as it is.
std::string ResolveEscapes(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 >= s.size()) {
      out.push_back(s[i]);
      continue;
    }
    ++i;
    if (const int64_t cp = HexEscape(s, i); cp >= 0) {
      AppendCodePoint(static_cast<uint32_t>(cp), &out);
      i += s[i] == 'x' ? 2 : s[i] == 'u' ? 4 : 8;
    } else if (const char c = SimpleEscape(s[i]); c != 0) {
      out.push_back(c);
    } else {
      out.push_back('\\');
      out.push_back(s[i]);
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> ChatTemplateSource(const std::string& arg) {
  std::ifstream in(arg, std::ios::binary);
  if (in) {
    std::ostringstream ss;
    ss << in.rdbuf();
    if (!in.bad()) return ss.str();
  }
  if (arg.find_first_of("{}\n") == std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--chat-template: '", arg,
                     "' looks like a file path, but it could not be read: ", std::strerror(errno)));
  }
  return ResolveEscapes(arg);
}

absl::StatusOr<ChatTemplate> ChatTemplateFromFlags(const Tokenizer& tokenizer) {
  const std::string arg = absl::GetFlag(FLAGS_chat_template);
  if (arg.empty()) {
    return ChatTemplate::Create(tokenizer.spec().chat_template, tokenizer.BosText(),
                                tokenizer.EosText());
  }
  PS_ASSIGN_OR_RETURN(std::string source, ChatTemplateSource(arg));
  absl::StatusOr<ChatTemplate> tmpl =
      ChatTemplate::Create(source, tokenizer.BosText(), tokenizer.EosText());
  if (!tmpl.ok()) {
    return absl::Status(tmpl.status().code(),
                        absl::StrCat("--chat-template: ", tmpl.status().message()));
  }
  return tmpl;
}

absl::StatusOr<std::vector<int32_t>> TokenizePrompt(const Tokenizer& tokenizer,
                                                    const std::string& text, bool chat) {
  if (!chat) return tokenizer.Encode(text);
  absl::StatusOr<ChatTemplate> tmpl = ChatTemplateFromFlags(tokenizer);
  if (!tmpl.ok()) {
    return absl::Status(tmpl.status().code(), absl::StrCat("--chat: ", tmpl.status().message()));
  }
  const ChatMessage message{"user", text};
  return EncodeChat(&*tmpl, tokenizer, {&message, 1});
}

absl::StatusOr<bool> UseLogColor(const std::string& mode, bool is_terminal, const char* no_color,
                                 bool under_mpirun) {
  if (mode == "always") return true;
  if (mode == "never") return false;
  if (mode != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-color must be auto, always or never, got '", mode, "'"));
  }
  return is_terminal && (no_color == nullptr || no_color[0] == '\0') && !under_mpirun;
}

absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "debug") return spdlog::level::debug;
  if (lower == "info") return spdlog::level::info;
  if (lower == "warning" || lower == "warn") return spdlog::level::warn;
  if (lower == "error") return spdlog::level::err;
  return absl::InvalidArgumentError(
      absl::StrCat("--log-level must be debug, info, warning or error, got '", name, "'"));
}

bool StartedByMpirun() {
  static const bool started =
      std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
  return started;
}

absl::Status ConfigureLogging() {
  PS_ASSIGN_OR_RETURN(const spdlog::level::level_enum level,
                      ParseLogLevel(absl::GetFlag(FLAGS_log_level)));
  const std::string format = absl::GetFlag(FLAGS_log_format);
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log-format must be text or json, got '", format, "'"));
  }
  const bool json = format == "json";
  const std::string mode = absl::GetFlag(FLAGS_log_color);
  const bool under_mpirun = StartedByMpirun();
  const char* no_color = std::getenv("NO_COLOR");
  PS_ASSIGN_OR_RETURN(bool out_color,
                      UseLogColor(mode, isatty(STDOUT_FILENO) == 1, no_color, under_mpirun));
  PS_ASSIGN_OR_RETURN(bool err_color,
                      UseLogColor(mode, isatty(STDERR_FILENO) == 1, no_color, under_mpirun));
  if (json) out_color = err_color = false;  // escape codes are not JSON
  // spdlog's own `automatic` would colour any terminal whose TERM looks like
  // a colour one, NO_COLOR or not: the decision is made here instead.
  using spdlog::color_mode;
  auto stdout_logger =
      std::make_shared<spdlog::logger>("", std::make_shared<spdlog::sinks::stdout_color_sink_mt>(
                                               out_color ? color_mode::always : color_mode::never));
  stdout_logger->set_level(spdlog::default_logger()->level());
  spdlog::set_default_logger(stdout_logger);
  spdlog::drop("launch");
  spdlog::stderr_color_mt("launch", err_color ? color_mode::always : color_mode::never);
  spdlog::set_level(level);  // every registered logger, and those created later
  if (json) spdlog::set_formatter(MakeJsonLogFormatter());
  return absl::OkStatus();
}

}  // namespace pagedserve::cli
