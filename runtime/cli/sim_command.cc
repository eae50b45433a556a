// pagedserve sim: the KV memory simulator (runtime/coordinator/kv_simulator.h).
//
//   pagedserve sim                                   100 requests, lengths U[50, 500]
//   pagedserve sim --sim-trace=trace.csv             arrival,prompt_len,output_len per line
//   pagedserve sim --sim-device-memory=8GiB --sim-model-shape=30,3,64,2
//                                                    capacity question for a model shape
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/flag_registry.h"
#include "runtime/coordinator/kv_simulator.h"

PAGEDSERVE_FLAG("sim", int32_t, sim_num_requests, 100,
                "sim: number of random requests (ignored with --sim-trace)");
PAGEDSERVE_FLAG("sim", int32_t, sim_min_len, 50,
                "sim: minimum total length (prompt + output) of a random request, tokens");
PAGEDSERVE_FLAG("sim", int32_t, sim_max_len, 500,
                "sim: maximum total length (prompt + output) of a random request, tokens");
PAGEDSERVE_FLAG("sim", double, sim_prompt_fraction, 0.5,
                "sim: share of a random request's length that is prompt");
PAGEDSERVE_FLAG(
    "sim", double, sim_arrival_rate, 0.0,
    "sim: random requests arriving per engine step (Poisson); 0 = all arrive at step 0");
PAGEDSERVE_FLAG("sim", uint64_t, sim_seed, 1, "sim: random seed of the workload");
PAGEDSERVE_FLAG("sim", std::string, sim_trace, "",
                "sim: trace file, one 'arrival_step,prompt_len,output_len' per line");
PAGEDSERVE_FLAG("sim", int32_t, sim_block_size, 16,
                "sim: tokens per KV block of the paged allocator");
PAGEDSERVE_FLAG("sim", int32_t, sim_naive_max_len, 512,
                "sim: tokens reserved per request by the naive allocator");
PAGEDSERVE_FLAG(
    "sim", int64_t, sim_kv_capacity_tokens, 8192,
    "sim: KV capacity in tokens shared by all allocators (ignored with --sim-device-memory)");
PAGEDSERVE_FLAG(
    "sim", std::string, sim_device_memory, "",
    "sim: device memory for the KV cache (e.g. 8GiB); with --sim-model-shape sets the capacity");
PAGEDSERVE_FLAG("sim", std::string, sim_model_shape, "30,3,64,2",
                "sim: layers,kv_heads,head_size,dtype_bytes (default SmolLM2-135M in fp16)");
PAGEDSERVE_FLAG("sim", int32_t, sim_swap_blocks, -1,
                "sim: CPU swap blocks of the paged allocator; -1 = as many as device");
PAGEDSERVE_FLAG("sim", std::string, sim_preemption_mode, "swap", "sim: swap or recompute");
PAGEDSERVE_FLAG("sim", int32_t, sim_max_num_seqs, 256, "sim: sequences per step");
PAGEDSERVE_FLAG("sim", int32_t, sim_max_num_batched_tokens, 2048, "sim: tokens per step");
PAGEDSERVE_FLAG("sim", std::string, sim_output_svg, "pagedserve_sim.svg",
                "sim: SVG file for the utilization timeline and histogram ('' = none)");

namespace pagedserve::cli {

int SimCommand(const Args& args) {
  if (args.size() > 1) {
    std::fprintf(stderr, "pagedserve sim: unexpected argument '%s' (flags start with --sim-)\n",
                 args[1].c_str());
    return 2;
  }
  std::vector<SimRequest> workload;
  const std::string trace = absl::GetFlag(FLAGS_sim_trace);
  if (!trace.empty()) {
    auto t = LoadSimTrace(trace);
    if (!t.ok()) {
      std::fprintf(stderr, "pagedserve sim: %s\n", std::string(t.status().message()).c_str());
      return 1;
    }
    workload = *std::move(t);
  } else {
    const int32_t n = absl::GetFlag(FLAGS_sim_num_requests);
    const int32_t lo = absl::GetFlag(FLAGS_sim_min_len), hi = absl::GetFlag(FLAGS_sim_max_len);
    const double frac = absl::GetFlag(FLAGS_sim_prompt_fraction);
    if (n < 1 || lo < 2 || hi < lo || !(frac > 0 && frac < 1)) {
      std::fprintf(
          stderr,
          "pagedserve sim: need --sim-num-requests >= 1, 2 <= --sim-min-len <= --sim-max-len and "
          "0 < --sim-prompt-fraction < 1\n");
      return 2;
    }
    workload = RandomSimWorkload(n, lo, hi, frac, absl::GetFlag(FLAGS_sim_arrival_rate),
                                 absl::GetFlag(FLAGS_sim_seed));
  }

  SimConfig c;
  c.block_size = absl::GetFlag(FLAGS_sim_block_size);
  c.naive_max_len = absl::GetFlag(FLAGS_sim_naive_max_len);
  c.capacity_tokens = absl::GetFlag(FLAGS_sim_kv_capacity_tokens);
  c.num_cpu_blocks = absl::GetFlag(FLAGS_sim_swap_blocks);
  c.max_num_seqs = absl::GetFlag(FLAGS_sim_max_num_seqs);
  c.max_num_batched_tokens = absl::GetFlag(FLAGS_sim_max_num_batched_tokens);
  auto mode = ParsePreemptionMode(absl::GetFlag(FLAGS_sim_preemption_mode));
  if (!mode.ok()) {
    std::fprintf(stderr, "pagedserve sim: %s\n", std::string(mode.status().message()).c_str());
    return 2;
  }
  c.preemption_mode = *mode;
  const std::string mem = absl::GetFlag(FLAGS_sim_device_memory);
  if (!mem.empty()) {
    auto bytes = ParseByteSize(mem);
    auto shape = ParseModelShape(absl::GetFlag(FLAGS_sim_model_shape));
    if (!bytes.ok() || !shape.ok()) {
      std::fprintf(stderr, "pagedserve sim: %s\n",
                   std::string((!bytes.ok() ? bytes.status() : shape.status()).message()).c_str());
      return 2;
    }
    if (c.block_size < 1) {
      std::fprintf(stderr, "pagedserve sim: --sim-block-size must be >= 1\n");
      return 2;
    }
    const int64_t block_bytes = shape->BytesPerToken() * c.block_size;
    const int64_t blocks = *bytes / block_bytes;
    std::printf(
        "Capacity: %s of KV memory / %lld bytes per block (%d layers x %d KV heads x %d head size x "
        "%d bytes x 2 (K,V) x %d tokens) = %lld blocks = %lld tokens\n",
        mem.c_str(), static_cast<long long>(block_bytes), shape->num_layers, shape->num_kv_heads,
        shape->head_size, shape->dtype_bytes, c.block_size, static_cast<long long>(blocks),
        static_cast<long long>(blocks) * c.block_size);
    c.capacity_tokens = blocks * c.block_size;
  }
  auto rep = RunKvSimulation(c, workload);
  if (!rep.ok()) {
    std::fprintf(stderr, "pagedserve sim: %s\n", std::string(rep.status().message()).c_str());
    return 1;
  }
  std::fputs(FormatSimTable(*rep).c_str(), stdout);
  const std::string svg = absl::GetFlag(FLAGS_sim_output_svg);
  if (!svg.empty()) {
    std::ofstream f(svg);
    f << RenderSimSvg(*rep);
    if (!f) {
      std::fprintf(stderr, "pagedserve sim: cannot write %s\n", svg.c_str());
      return 1;
    }
    std::printf("wrote %s\n", svg.c_str());
  }
  return 0;
}

}  // namespace pagedserve::cli
