// Progress of the weight load (LoadLlamaWeights' LoadProgressFn, passed in
// WorkerOptions::load_progress): a bar redrawn in place on a terminal,
//
//   Loading weights [##########----------]  50%  135.0 / 270.1 MiB  2.0 s
//
// plain log lines on stderr otherwise (a file, a pipe, mpirun, --log-format
// json; the "launch" logger, so that generate's stdout holds only its text),
// one every `every` seconds or each quarter of the bytes, never one per tensor:
//
//   Loading weights: 135.0 / 270.1 MiB (50%), 2.0 s
//
// and a last line either way: "Loaded weights: 270.1 MiB in 4.1 s". Seconds
// count from the first report (LoadLlamaWeights reports 0 bytes first).
// Thread safety: Update from one thread at a time (the loading one).
#ifndef PAGEDSERVE_RUNTIME_CLI_LOAD_PROGRESS_H_
#define PAGEDSERVE_RUNTIME_CLI_LOAD_PROGRESS_H_

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

#include "runtime/model/weights.h"

namespace pagedserve::cli {

class LoadProgressPrinter {
 public:
  // `bar`: redraw a bar on `terminal` (stderr) with "\r"; else spdlog info
  // lines every `every_seconds` (> 0) or quarter.
  LoadProgressPrinter(bool bar, double every_seconds, std::FILE* terminal = stderr);

  void Update(uint64_t loaded_bytes, uint64_t total_bytes);

  // The texts, for a given state (pure; tests).
  static std::string BarText(uint64_t loaded, uint64_t total, double seconds);
  static std::string LineText(uint64_t loaded, uint64_t total, double seconds);
  static std::string DoneText(uint64_t total, double seconds);

 private:
  using Clock = std::chrono::steady_clock;
  const bool bar_;
  const double every_seconds_;
  std::FILE* const terminal_;
  bool started_ = false;
  bool done_ = false;  // the last line was written; later updates are ignored
  Clock::time_point start_, last_shown_;
  int last_quarter_ = 0;  // quarters of `total` already reported by a line
};

// Whether the load shows a bar: stderr is a terminal (`is_terminal`), not
// under mpirun (its ranks' outputs are pseudo-terminals whatever mpirun's
// is) and the log format is text.
bool UseLoadProgressBar(bool is_terminal, bool under_mpirun, bool json_logs);

// The LoadProgressFn of this process (UseLoadProgressBar with stderr,
// StartedByMpirun and --log-format; lines every 5 s).
LoadProgressFn MakeLoadProgress();

}  // namespace pagedserve::cli

#endif  // PAGEDSERVE_RUNTIME_CLI_LOAD_PROGRESS_H_
