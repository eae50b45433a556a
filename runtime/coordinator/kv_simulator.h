// The KV memory simulator behind `pagedserve sim`: replays a workload (random
// or a trace) against
//   * a naive allocator that gives every request one contiguous region of
//     max_len tokens (first fit over one arena), as systems before
//     PagedAttention did (the SOSP'23 paper's baseline);
//   * the same naive allocator sized exactly to prompt + output (an oracle that
//     knows the output length; it shows external fragmentation);
//   * paged allocation driven by the real Scheduler and BlockManager, with no
//     model: every sampled token is a dummy non-EOS id.
// All three get the same KV capacity (in tokens) and the same per-step budgets.
// One simulated step = one engine iteration: a request's prompt is prefilled
// (the paged scheduler may chunk it), then it gains one token per step.
//
// Measured after every step, over the steps until the last request finishes:
//   utilization        tokens whose K/V are stored / capacity
//   internal frag.     (reserved - stored) / reserved, reserved = tokens of the
//                      regions (naive) or blocks (paged) held by requests
//   external frag.     when the head request waits for memory although the
//                      free total would hold it: free tokens / capacity (0 for
//                      paged allocation by construction: any free block fits)
//   concurrency        requests holding KV memory
//   preemptions        paged only (swap or recompute; naive never preempts, it
//                      reserves the whole region up front)
#ifndef PAGEDSERVE_RUNTIME_COORDINATOR_KV_SIMULATOR_H_
#define PAGEDSERVE_RUNTIME_COORDINATOR_KV_SIMULATOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/coordinator/scheduler.h"

namespace pagedserve {

struct SimRequest {
  double arrival_step = 0.0;  // the request joins at the first step >= this
  int32_t prompt_len = 1;
  int32_t output_len = 1;
};

// Reads a trace: one request per line, "arrival,prompt_len,output_len"
// (arrival in steps; commas or whitespace). '#' starts a comment; a first line
// that does not start with a number is a header. Errors name file:line.
absl::StatusOr<std::vector<SimRequest>> LoadSimTrace(const std::string& path);

// n requests whose total length (prompt + output) is uniform in
// [min_len, max_len]; the prompt is round(prompt_fraction * total), at least
// 1, and the output at least 1. Arrivals: all at step 0 when
// requests_per_step <= 0, else a Poisson process of that rate. Deterministic
// for a seed.
std::vector<SimRequest> RandomSimWorkload(int32_t n, int32_t min_len, int32_t max_len,
                                          double prompt_fraction, double requests_per_step,
                                          uint64_t seed);

// Transformer KV shape for capacity questions.
struct ModelShape {
  int32_t num_layers = 30;
  int32_t num_kv_heads = 3;
  int32_t head_size = 64;
  int32_t dtype_bytes = 2;
  // K and V of one token over all layers, in bytes.
  int64_t BytesPerToken() const {
    return 2LL * num_layers * num_kv_heads * head_size * dtype_bytes;
  }
};
// "layers,kv_heads,head_size,dtype_bytes", e.g. "30,3,64,2".
absl::StatusOr<ModelShape> ParseModelShape(const std::string& s);
// "123", "512MiB", "24GiB", "1.5GB" -> bytes.
absl::StatusOr<int64_t> ParseByteSize(const std::string& s);

struct SimConfig {
  int32_t block_size = 16;
  int64_t capacity_tokens = 8192;  // device KV capacity shared by all allocators
  int32_t naive_max_len = 512;     // region per request of the naive allocator
  int32_t num_cpu_blocks = -1;     // paged swap space; -1: as many as device blocks
  int32_t max_num_seqs = 256;
  int32_t max_num_batched_tokens = 2048;
  bool enable_chunked_prefill = true;
  PreemptionMode preemption_mode = PreemptionMode::kSwap;
  double watermark = 0.01;
  int64_t max_steps = 10'000'000;  // safety stop
};

struct AllocatorReport {
  std::string name;
  int64_t steps = 0;  // until every request finished or was rejected
  int32_t completed = 0;
  int32_t rejected = 0;  // could never fit (region or admission bound)
  int32_t max_concurrent = 0;
  double mean_concurrent = 0.0;
  double mean_utilization = 0.0;
  double peak_utilization = 0.0;
  double internal_fragmentation = 0.0;  // time average over steps holding memory
  double external_fragmentation = 0.0;  // mean over memory-blocked steps
  int64_t external_blocked_steps = 0;   // steps in which that happened
  int64_t preemptions_swap = 0;
  int64_t preemptions_recompute = 0;
  int64_t generated_tokens = 0;
  std::vector<float> utilization;  // per step
};

struct SimReport {
  SimConfig config;
  int32_t num_requests = 0;
  int32_t num_device_blocks = 0;
  std::vector<AllocatorReport> allocators;  // naive max_len, naive exact, paged
};

// InvalidArgument for a bad config (non-positive sizes, a capacity below one
// block) or an empty workload.
absl::StatusOr<SimReport> RunKvSimulation(const SimConfig& config,
                                          const std::vector<SimRequest>& workload);

// The comparison table (plain text).
std::string FormatSimTable(const SimReport& report);
// An SVG image: utilization over time per allocator, and its histogram.
std::string RenderSimSvg(const SimReport& report);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COORDINATOR_KV_SIMULATOR_H_
