// pagedserve generate: offline generation, one prompt, no server.
//
//   pagedserve generate --model PATH --prompt TEXT [--max-tokens N] [--temperature T]
//                       [--top-p P] [--top-k K] [--min-p P] [--seed S] [--n N]
//                       [--stop STR]... [--chat] [engine flags, see common_flags.h]
//   echo TEXT | pagedserve generate --model PATH
//   mpirun -np 1+TP pagedserve generate --model PATH --tensor-parallel-size TP ...
//
// stdout: the generated text, streamed as it arrives (n = 1), or each sample
// after a "[sample i]" line (n > 1); a final newline only on a terminal.
// stderr: one usage line (finish reasons, prompt / completion / cached prompt
// tokens, time). Exit codes: 0 success, 1 runtime failure (model, request,
// engine), 2 bad flags or arguments.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/common_flags.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/executor.h"
#include "runtime/engine/output_accumulator.h"
#include "runtime/launch/local_executor.h"
#include "runtime/launch/mpi_executor.h"
#include "runtime/launch/mpi_process.h"
#include "runtime/launch/worker_rank.h"

namespace pagedserve::cli {
namespace {

void PrintError(const absl::Status& s) {
  std::fprintf(stderr, "pagedserve generate: %s\n", std::string(s.message()).c_str());
}

// Bad input (a bad flag or parameter, a prompt of --max-model-len tokens or
// more) exits 2; anything else 1.
int ExitCodeFor(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument || s.code() == absl::StatusCode::kOutOfRange
             ? 2
             : 1;
}

// stdout: the samples (n > 1; n = 1 streamed already); stderr, when the request
// succeeded: the usage line and, with speculative decoding, its counters.
void PrintOutput(const OutputAccumulator& output, int n, bool succeeded, const Engine& engine) {
  if (n > 1) {
    for (int i = 0; i < n; ++i) {
      std::printf("%s[sample %d]\n%s\n", i ? "\n" : "", i, output.completions()[i].text.c_str());
    }
  } else if (isatty(fileno(stdout))) {
    std::printf("\n");
  }
  std::fflush(stdout);
  if (!succeeded) return;
  const double secs = output.elapsed_s();
  std::vector<std::string> reasons;
  for (const CompletionOutput& c : output.completions()) {
    reasons.emplace_back(FinishReasonName(c.finish_reason));
  }
  const Usage& usage = output.usage();
  std::fprintf(stderr,
               "pagedserve generate: finish_reason=%s prompt_tokens=%d completion_tokens=%d "
               "cached_prompt_tokens=%d time=%.2fs (%.1f tokens/s)\n",
               absl::StrJoin(reasons, ",").c_str(), usage.prompt_tokens, usage.completion_tokens,
               usage.cached_prompt_tokens, secs, secs > 0 ? usage.completion_tokens / secs : 0.0);
  const SchedulerStats st = engine.stats();
  if (st.spec_num_drafts > 0) {
    std::fprintf(stderr,
                 "pagedserve generate: speculative steps=%lld verifications=%lld "
                 "draft_tokens=%lld accepted=%lld emitted=%lld\n",
                 static_cast<long long>(st.num_steps), static_cast<long long>(st.spec_num_drafts),
                 static_cast<long long>(st.spec_draft_tokens),
                 static_cast<long long>(st.spec_accepted_tokens),
                 static_cast<long long>(st.spec_emitted_tokens));
  }
}

// Rank 0 (or the only process): tokenizer, engine, the one request.
// *workers_stopped: the worker ranks ended cleanly (always true without mpirun).
int RunCoordinator(const LaunchInfo& info, const ModelSetup& setup, bool* workers_stopped) {
  *workers_stopped = info.world_size == 1;
  bool executor_failed = false;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(setup.worker.model_path);
  if (!tokenizer.ok()) {
    PrintError(tokenizer.status());
    return 1;
  }
  absl::StatusOr<SamplingParams> params = SamplingParamsFromFlags();
  if (!params.ok()) {
    PrintError(params.status());
    return 2;
  }
  absl::StatusOr<std::string> text = ReadPromptFromFlags();
  if (!text.ok()) {
    PrintError(text.status());
    return 2;
  }
  absl::StatusOr<std::vector<int32_t>> ids =
      TokenizePrompt(**tokenizer, *text, absl::GetFlag(FLAGS_chat));
  if (!ids.ok()) {
    PrintError(ids.status());
    return 1;
  }

  absl::StatusOr<std::unique_ptr<Executor>> executor =
      info.world_size > 1 ? MakeMpiExecutor(info, setup.scheduler.block_size,
                                            setup.worker_startup_timeout, setup.worker_step_timeout)
                          : CreateLocalExecutor(setup.worker);
  if (!executor.ok()) {
    PrintError(executor.status());
    return 1;
  }
  EngineOptions options;
  options.scheduler = setup.scheduler;
  options.fit_max_model_len = setup.fit_max_model_len;
  Executor* exec = executor->get();
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(
      options, tokenizer->get(), *std::move(executor), EosTokenIds(setup.model, **tokenizer));
  if (!engine.ok()) {
    // The engine was not built: the executor went with the failed Create.
    PrintError(engine.status());
    return ExitCodeFor(engine.status());
  }
  // Quiet unless the KV pool lowered the model's context (serve always logs it).
  if (const SchedulerConfig& sc = (*engine)->scheduler_config();
      setup.fit_max_model_len && sc.max_model_len < setup.scheduler.max_model_len) {
    std::fprintf(stderr, "pagedserve generate: %s\n", MaxModelLenNote(setup, sc).c_str());
  }
  int rc = 0;
  OutputAccumulator output({"generate-0"}, params->n);
  EngineRequest request;
  request.request_id = "generate-0";
  request.prompt_token_ids = *std::move(ids);
  request.params = *params;
  request.max_tokens_is_default = !MaxTokensFlagGiven();
  const int n = params->n;
  const absl::Status added = (*engine)->AddRequest(std::move(request));
  if (!added.ok()) {
    PrintError(added);
    rc = ExitCodeFor(added);
  }

  while (rc == 0 && (*engine)->HasUnfinishedRequests()) {
    absl::StatusOr<std::vector<EngineOutput>> outs = (*engine)->Step();
    if (!outs.ok()) {
      (*engine)->FailAll(outs.status());
      PrintError(outs.status());
      executor_failed = true;
      rc = 1;
      break;
    }
    for (const EngineOutput& out : *outs) {
      std::vector<CompletionNews> news;
      output.Apply(out, &news);
      for (const CompletionNews& item : news) {
        if (n == 1) {
          std::fwrite(item.delta.text.data(), 1, item.delta.text.size(), stdout);
          std::fflush(stdout);
        }
      }
      if (!out.error.ok()) {
        PrintError(out.error);
        rc = 1;
      }
    }
  }
  if (added.ok()) PrintOutput(output, n, rc == 0, **engine);  // nothing ran otherwise
  if (!executor_failed) {
    if (absl::Status s = exec->Shutdown(); !s.ok()) {
      PrintError(s);
      if (rc == 0) rc = 1;
    } else {
      *workers_stopped = true;
    }
  }
  return rc;
}

}  // namespace

int GenerateCommand(const Args& args) {
  if (args.size() > 1) {
    std::fprintf(
        stderr,
        "pagedserve generate: unexpected argument '%s' (the prompt goes in --prompt or stdin)\n",
        args[1].c_str());
    return 2;
  }
  // MPI_Init may inspect argc/argv; give it the command's own.
  std::vector<std::string> storage(args.begin(), args.end());
  std::vector<char*> argv_vec;
  argv_vec.reserve(storage.size() + 1);
  for (std::string& a : storage) argv_vec.push_back(a.data());
  argv_vec.push_back(nullptr);
  int argc = static_cast<int>(storage.size());
  char** argv = argv_vec.data();
  absl::StatusOr<LaunchInfo> info = InitMpi(&argc, &argv);
  if (!info.ok()) {
    PrintError(info.status());
    return 1;
  }
  absl::StatusOr<ModelSetup> setup = ModelSetupFromFlags();
  if (!setup.ok()) {
    if (info->coordinator()) PrintError(setup.status());
    FinalizeMpi();
    return ExitCodeFor(setup.status());
  }
  if (absl::Status s = CheckWorldSize(*info, setup->tensor_parallel_size); !s.ok()) {
    if (info->coordinator()) PrintError(s);
    FinalizeMpi();
    return 2;
  }
  if (!info->coordinator()) {
    const int rc = RunWorkerRank(*info, setup->worker);
    FinalizeMpi(rc != 0, rc);
    return rc;
  }
  bool workers_stopped = false;
  const int rc = RunCoordinator(*info, *setup, &workers_stopped);
  // Worker ranks wait for plans until the executor shuts them down; when it
  // could not (or never existed), abort the job instead of hanging.
  FinalizeMpi(!workers_stopped, rc == 0 ? 1 : rc);
  return rc;
}

}  // namespace pagedserve::cli
