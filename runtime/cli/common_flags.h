// Flags shared by the sub-commands that load a model (generate, serve) and by
// those that send sampling parameters (generate, client), and the helpers that
// turn them into WorkerOptions / SchedulerConfig / SamplingParams and load the
// model's tokenizer. Names follow vLLM's command line.
//
// Model and engine:
//   --model PATH                 .gguf file or Hugging Face directory (required; serve
//                                also takes it as its argument, ApplyModelArgument)
//   --tensor-parallel-size N     worker ranks (mpirun -np 1+N); 1 without mpirun
//   --block-size N               tokens per KV block (8, 16, 32)
//   --kv-cache-memory BYTES      KV pool per worker rank, all layers, K and V
//   --swap-space GIB             CPU swap pool per worker rank
//   --max-num-blocks N           cap on the device pool (0 = the budget decides)
//   --dtype auto|float32|float16|bfloat16      weight precision (WorkerOptions::dtype)
//   --kv-cache-dtype auto|float32|float16|bfloat16|fp8|fp8_e4m3|fp8_e5m2
//                                                    KV pool element type
//   --enforce-eager, --max-seq-len-to-capture N   CUDA graphs of decode steps
//                                (WorkerOptions::graphs)
//   --max-model-len N            prompt + output tokens per sequence
//                                (0 = min(model max_position_embeddings, 2048))
//   --max-num-seqs N, --max-num-batched-tokens N, --enable-chunked-prefill,
//   --[no-]enable-prefix-caching (on by default), --preemption-mode swap|recompute
//   --worker-startup-timeout S, --worker-step-timeout S   (mpirun only)
// Sampling:
//   --max-tokens, --temperature, --top-p, --top-k, --min-p,
//   --seed (-1 = none; serve: the engine-wide default seed, EngineOptions::default_seed),
//   --n, --stop (comma separated, and repeatable: every occurrence adds),
//   --stop-token-ids, --ignore-eos, --logprobs,
//   --repetition-penalty, --presence-penalty, --frequency-penalty,
//   --use-beam-search, --best-of, --length-penalty, --early-stopping (true/false/never)
// Prompt:
//   --prompt TEXT (stdin when absent), --chat (as one user message through the
//   model's chat template)
// Chat template (generate, serve):
//   --chat-template FILE|TEMPLATE  instead of the model's (vLLM's flag): a file,
//                                or the template itself when it holds '{', '}' or
//                                a newline (backslash escapes resolved)
// Logging:
//   --log-color auto|always|never   ANSI colours in log lines (ConfigureLogging)
//   --log-level debug|info|warning|error   lowest spdlog level written (ConfigureLogging)
//   --log-format text|json       one JSON object per log line (json_log_format.h)
//
// Adding a flag: one line at namespace scope in the .cc of the sub-command that
// reads it (or here, in common_flags.cc, when several do), naming the
// sub-commands it applies to (flag_registry.h):
//
//   PAGEDSERVE_FLAG("serve", int32_t, port, 8000, "serve: port of the HTTP API");
//   PAGEDSERVE_FLAG("generate,serve", bool, enable_foo, false, "...");
//
// plus ABSL_DECLARE_FLAG(type, name) in the header of whoever else reads it.
// `pagedserve SUBCOMMAND --help` then lists it, and giving it to any other
// sub-command is an error (exit 2). A plain ABSL_FLAG under runtime/cli/ makes
// every command exit 70 at startup (CheckRegistry): it applies to nothing.
// A flag with .OnUpdate() is ABSL_FLAG(...).OnUpdate(f); followed by
// PAGEDSERVE_REGISTER_FLAG("generate,client", name);
#ifndef PAGEDSERVE_RUNTIME_CLI_COMMON_FLAGS_H_
#define PAGEDSERVE_RUNTIME_CLI_COMMON_FLAGS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/cli/flag_registry.h"
#include "runtime/common/sampling_params.h"
#include "runtime/coordinator/scheduler.h"
#include "runtime/grammar/token_mask.h"
#include "runtime/model/model_config.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/tokenizer/tokenizer.h"
#include "runtime/worker/worker.h"
#include "spdlog/common.h"

ABSL_DECLARE_FLAG(std::string, model);
ABSL_DECLARE_FLAG(int32_t, tensor_parallel_size);
ABSL_DECLARE_FLAG(int32_t, block_size);
ABSL_DECLARE_FLAG(int64_t, kv_cache_memory);
ABSL_DECLARE_FLAG(double, swap_space);
ABSL_DECLARE_FLAG(int64_t, max_num_blocks);
ABSL_DECLARE_FLAG(std::string, dtype);
ABSL_DECLARE_FLAG(std::string, kv_cache_dtype);
ABSL_DECLARE_FLAG(bool, enforce_eager);
ABSL_DECLARE_FLAG(int32_t, max_seq_len_to_capture);
ABSL_DECLARE_FLAG(int32_t, max_model_len);
ABSL_DECLARE_FLAG(int32_t, max_num_seqs);
ABSL_DECLARE_FLAG(int32_t, max_num_batched_tokens);
ABSL_DECLARE_FLAG(bool, enable_chunked_prefill);
ABSL_DECLARE_FLAG(bool, enable_prefix_caching);
ABSL_DECLARE_FLAG(std::string, preemption_mode);
ABSL_DECLARE_FLAG(std::string, scheduling_policy);
ABSL_DECLARE_FLAG(double, worker_startup_timeout);
ABSL_DECLARE_FLAG(double, worker_step_timeout);

ABSL_DECLARE_FLAG(std::string, log_color);
ABSL_DECLARE_FLAG(std::string, log_level);
ABSL_DECLARE_FLAG(std::string, log_format);

ABSL_DECLARE_FLAG(std::optional<int32_t>, max_tokens);
ABSL_DECLARE_FLAG(double, temperature);
ABSL_DECLARE_FLAG(double, top_p);
ABSL_DECLARE_FLAG(int32_t, top_k);
ABSL_DECLARE_FLAG(double, min_p);
ABSL_DECLARE_FLAG(int64_t, seed);
ABSL_DECLARE_FLAG(int32_t, n);
ABSL_DECLARE_FLAG(std::vector<std::string>, stop);
ABSL_DECLARE_FLAG(std::vector<std::string>, stop_token_ids);
ABSL_DECLARE_FLAG(bool, ignore_eos);
ABSL_DECLARE_FLAG(int32_t, logprobs);
ABSL_DECLARE_FLAG(double, repetition_penalty);
ABSL_DECLARE_FLAG(double, presence_penalty);
ABSL_DECLARE_FLAG(double, frequency_penalty);

ABSL_DECLARE_FLAG(std::string, prompt);
ABSL_DECLARE_FLAG(bool, chat);
ABSL_DECLARE_FLAG(std::string, chat_template);

namespace pagedserve::cli {

// Everything a process needs to load the model and run the engine, from the
// model and engine flags above.
struct ModelSetup {
  ModelConfig model;          // the model's config.json / GGUF metadata
  WorkerOptions worker;       // for Worker::Create / RunWorkerRank
  SchedulerConfig scheduler;  // block counts left 0: the engine takes them from the executor
  // --max-model-len 0: scheduler.max_model_len is the model's context, for the
  // engine to lower to the KV pool (EngineOptions::fit_max_model_len).
  bool fit_max_model_len = false;
  int32_t tensor_parallel_size = 1;
  absl::Duration worker_startup_timeout;
  absl::Duration worker_step_timeout;
};

// Reads the model's config (not its weights) and checks the flags. Errors
// (InvalidArgument) name the flag, e.g. "--block-size must be 8, 16 or 32, got 7";
// a missing or unreadable model gives the loader's error.
absl::StatusOr<ModelSetup> ModelSetupFromFlags();

// The line the commands log once the engine exists when --max-model-len was
// left at 0: the max_model_len chosen and why (the model's context, or the
// longest sequence `engine_config`'s KV pool holds). Empty when the flag was set.
std::string MaxModelLenNote(const ModelSetup& setup, const SchedulerConfig& engine_config);

// The tokenizer of a model path: GGUF file -> LoadGgufTokenizer, directory ->
// LoadHfTokenizer. NotFound when the path does not exist.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_path);

// The vocabulary of structured output (runtime/grammar/token_mask.h): every
// token's bytes (Tokenizer::TokenBytes, special tokens empty) and the end ids
// (EosTokenIds). WorkerOptions::constraint_vocabulary calls it on first use.
absl::StatusOr<std::shared_ptr<const grammar::TokenVocabulary>> ConstraintVocabularyOf(
    const std::string& model_path, const ModelConfig& model);

// The name a server reports for a model path (vLLM's --served-model-name
// default is the path; ours is its last component): "/m/SmolLM2.Q4_1.gguf" ->
// "SmolLM2.Q4_1.gguf", "/models/llama/" -> "llama". The path itself when it has
// no non-empty component.
std::string DefaultServedModelName(const std::string& model_path);

// End-of-sequence ids: the model config's eos_token_ids plus the tokenizer's
// eos id, without duplicates.
std::vector<int32_t> EosTokenIds(const ModelConfig& model, const Tokenizer& tokenizer);

// SamplingParams from the sampling flags, checked with SamplingParams::Validate
// (its message, prefixed by the flag syntax, on error). Stop strings: every
// --stop occurrence, each split at commas.
// --max-tokens unset: 16 (SamplingParams' default), which the engine lowers to
// the context's room (EngineRequest::max_tokens_is_default).
absl::StatusOr<SamplingParams> SamplingParamsFromFlags();
inline constexpr int32_t kDefaultMaxTokens = 16;
// Whether --max-tokens was given (a value the engine refuses, not lowers,
// when the context has no room for it).
bool MaxTokensFlagGiven();

// The prompt text: --prompt, or all of stdin when the flag was not given.
// InvalidArgument when it is empty.
absl::StatusOr<std::string> ReadPromptFromFlags();

// The text of a --chat-template argument, as vLLM's load_chat_template: the
// file it names; else, when it holds a Jinja character ('{', '}' or a
// newline), the argument itself with backslash escapes (\n, \t, \\, \', \",
// \xNN, \uNNNN) resolved; else InvalidArgument ("looks like a file path, but
// it could not be read: ...").
absl::StatusOr<std::string> ChatTemplateSource(const std::string& arg);

// The chat template to run: --chat-template when given (its errors name the
// flag), else the one the tokenizer's model ships (FailedPrecondition when it
// has none), with the tokenizer's BOS and EOS texts.
absl::StatusOr<ChatTemplate> ChatTemplateFromFlags(const Tokenizer& tokenizer);

// Prompt text -> token ids: with `chat` the text becomes one user message
// rendered through the chat template (ChatTemplateFromFlags; generation prompt added,
// special tokens parsed, no extra BOS: the template has its own), otherwise
// Encode with the tokenizer's default special tokens.
absl::StatusOr<std::vector<int32_t>> TokenizePrompt(const Tokenizer& tokenizer,
                                                    const std::string& text, bool chat);

// Whether log lines get ANSI colour codes, for --log-color `mode`:
// "always", "never", or "auto": colour only when the stream is a terminal
// (`is_terminal`), NO_COLOR is unset or empty (`no_color`, the environment
// value or null; no-color.org) and the process was not started by mpirun
// (`under_mpirun`: OpenMPI hands every rank a pseudo-terminal as stdout, so a
// rank's isatty says nothing about where mpirun's output goes - a log file, a
// pipe, `kubectl logs`). InvalidArgument naming the flag for another mode.
absl::StatusOr<bool> UseLogColor(const std::string& mode, bool is_terminal, const char* no_color,
                                 bool under_mpirun);

// Whether mpirun started this process (OMPI_COMM_WORLD_SIZE or PMIX_RANK in
// the environment). The first call's answer is kept: a singleton MPI_Init (a
// command run without mpirun) sets those variables itself. ConfigureLogging
// makes the first call, before any command initializes MPI.
bool StartedByMpirun();

// The spdlog level of a --log-level value: debug, info, warning, error (any
// case). InvalidArgument naming the flag and the four values otherwise.
absl::StatusOr<spdlog::level::level_enum> ParseLogLevel(const std::string& name);

// Applies --log-color (UseLogColor with this process's stdout / stderr,
// NO_COLOR and StartedByMpirun) to spdlog's default logger
// (stdout) and to the "launch" logger (stderr, runtime/launch/process_state.cc),
// and --log-level and --log-format (json: MakeJsonLogFormatter, colour off) to
// every spdlog logger (lines written with fprintf - usage errors, the serving
// banner on stderr - are neither levelled nor formatted). Call once after the
// flags are parsed, before anything logs. Errors: UseLogColor's,
// ParseLogLevel's, InvalidArgument naming --log-format for another format.
absl::Status ConfigureLogging();

// --seed as an optional seed: nullopt for -1, InvalidArgument naming the flag
// below -1.
absl::StatusOr<std::optional<uint64_t>> SeedFromFlags();

// `pagedserve serve MODEL` (as `vllm serve MODEL`): `args` are the command's
// positional arguments (args[0] the command); a model argument sets --model.
// InvalidArgument for more than one argument, or for a model argument and a
// different --model (the message names both).
absl::Status ApplyModelArgument(const std::vector<std::string>& args);

}  // namespace pagedserve::cli

#endif  // PAGEDSERVE_RUNTIME_CLI_COMMON_FLAGS_H_
