#include "runtime/coordinator/kv_simulator.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <deque>
#include <fstream>
#include <map>
#include <sstream>

#include <random>
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace pagedserve {

absl::StatusOr<std::vector<SimRequest>> LoadSimTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open trace file '", path, "'"));
  std::vector<SimRequest> out;
  std::string line;
  int lineno = 0;
  bool first_content = true;
  while (std::getline(in, line)) {
    ++lineno;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    absl::string_view v = absl::StripAsciiWhitespace(line);
    if (v.empty()) continue;
    std::vector<absl::string_view> f =
        absl::StrSplit(v, absl::ByAnyChar(", \t;"), absl::SkipEmpty());
    const bool numeric =
        !f.empty() && (std::isdigit(static_cast<unsigned char>(f[0][0])) || f[0][0] == '.');
    if (first_content && !numeric) {  // header
      first_content = false;
      continue;
    }
    first_content = false;
    SimRequest r;
    if (f.size() != 3 || !absl::SimpleAtod(f[0], &r.arrival_step) ||
        !absl::SimpleAtoi(f[1], &r.prompt_len) || !absl::SimpleAtoi(f[2], &r.output_len)) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", lineno, ": expected 'arrival,prompt_len,output_len', got '", v, "'"));
    }
    if (!(r.arrival_step >= 0) || r.prompt_len < 1 || r.output_len < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", lineno, ": arrival must be >= 0 and lengths >= 1, got '", v, "'"));
    }
    out.push_back(r);
  }
  if (out.empty())
    return absl::InvalidArgumentError(absl::StrCat(path, ": no requests in the trace"));
  return out;
}

std::vector<SimRequest> RandomSimWorkload(int32_t n, int32_t min_len, int32_t max_len,
                                          double prompt_fraction, double requests_per_step,
                                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<SimRequest> out;
  double t = 0.0;
  min_len = std::max(min_len, 2);
  max_len = std::max(max_len, min_len);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t total = std::uniform_int_distribution<int32_t>(min_len, max_len)(rng);
    SimRequest r;
    r.prompt_len = std::clamp<int32_t>(static_cast<int32_t>(std::lround(prompt_fraction * total)),
                                       1, total - 1);
    r.output_len = total - r.prompt_len;
    if (requests_per_step > 0) {
      t += std::exponential_distribution<double>(requests_per_step)(rng);
      r.arrival_step = std::floor(t);
    }
    out.push_back(r);
  }
  return out;
}

absl::StatusOr<ModelShape> ParseModelShape(const std::string& s) {
  std::vector<absl::string_view> f = absl::StrSplit(s, ',');
  ModelShape m;
  if (f.size() != 4 || !absl::SimpleAtoi(f[0], &m.num_layers) ||
      !absl::SimpleAtoi(f[1], &m.num_kv_heads) || !absl::SimpleAtoi(f[2], &m.head_size) ||
      !absl::SimpleAtoi(f[3], &m.dtype_bytes) || m.num_layers < 1 || m.num_kv_heads < 1 ||
      m.head_size < 1 || m.dtype_bytes < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model shape must be 'layers,kv_heads,head_size,dtype_bytes' with positive integers, got '",
        s, "'"));
  }
  return m;
}

absl::StatusOr<int64_t> ParseByteSize(const std::string& s) {
  absl::string_view v = absl::StripAsciiWhitespace(s);
  size_t i = 0;
  while (i < v.size() && (std::isdigit(static_cast<unsigned char>(v[i])) || v[i] == '.')) ++i;
  double num = 0;
  if (i == 0 || !absl::SimpleAtod(v.substr(0, i), &num)) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad byte size '", s, "' (e.g. 24GiB, 512MiB, 1000000)"));
  }
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(v.substr(i)));
  static const std::map<std::string, double> kUnits = {{"", 1},
                                                       {"b", 1},
                                                       {"kb", 1e3},
                                                       {"mb", 1e6},
                                                       {"gb", 1e9},
                                                       {"tb", 1e12},
                                                       {"kib", 1024.0},
                                                       {"mib", 1048576.0},
                                                       {"gib", 1073741824.0},
                                                       {"tib", 1099511627776.0}};
  auto it = kUnits.find(unit);
  if (it == kUnits.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bad byte size unit in '", s, "' (B, KB, MB, GB, KiB, MiB, GiB)"));
  }
  return static_cast<int64_t>(num * it->second);
}

namespace {

// Accumulates the per-step figures of one allocator.
struct Meter {
  AllocatorReport r;
  double util_sum = 0, internal_sum = 0, conc_sum = 0, ext_sum = 0;
  int64_t holding_steps = 0;
  void Step(int64_t stored, int64_t reserved, int64_t capacity, int32_t concurrent) {
    const double u = capacity ? static_cast<double>(stored) / capacity : 0.0;
    r.utilization.push_back(static_cast<float>(u));
    util_sum += u;
    r.peak_utilization = std::max(r.peak_utilization, u);
    conc_sum += concurrent;
    r.max_concurrent = std::max(r.max_concurrent, concurrent);
    if (reserved > 0) {
      internal_sum += static_cast<double>(reserved - stored) / reserved;
      ++holding_steps;
    }
    ++r.steps;
  }
  AllocatorReport Finish() {
    if (r.steps > 0) {
      r.mean_utilization = util_sum / r.steps;
      r.mean_concurrent = conc_sum / r.steps;
    }
    if (holding_steps > 0) r.internal_fragmentation = internal_sum / holding_steps;
    if (r.external_blocked_steps > 0) r.external_fragmentation = ext_sum / r.external_blocked_steps;
    return r;
  }
};

// First-fit contiguous arena of token slots.
class Arena {
 public:
  explicit Arena(int64_t capacity) : free_total_(capacity) {
    if (capacity > 0) holes_[0] = capacity;
  }
  int64_t Allocate(int64_t size) {
    for (auto it = holes_.begin(); it != holes_.end(); ++it) {
      if (it->second >= size) {
        const int64_t start = it->first, len = it->second;
        holes_.erase(it);
        if (len > size) holes_[start + size] = len - size;
        free_total_ -= size;
        return start;
      }
    }
    return -1;
  }
  void Free(int64_t start, int64_t size) {
    free_total_ += size;
    auto next = holes_.lower_bound(start);
    if (next != holes_.end() && next->first == start + size) {
      size += next->second;
      next = holes_.erase(next);
    }
    if (next != holes_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        prev->second += size;
        return;
      }
    }
    holes_[start] = size;
  }
  int64_t free_total() const { return free_total_; }

 private:
  std::map<int64_t, int64_t> holes_;
  int64_t free_total_;
};

AllocatorReport SimulateNaive(const SimConfig& c, const std::vector<SimRequest>& w, bool exact) {
  Meter m;
  m.r.name = exact ? "naive contiguous, exact size (oracle)"
                   : absl::StrCat("naive contiguous, max_len=", c.naive_max_len);
  struct Active {
    int64_t start, size;
    int32_t prompt, output, generated;
  };
  Arena arena(c.capacity_tokens);
  std::deque<int32_t> queue;
  std::vector<Active> active;
  size_t next = 0;
  for (int64_t step = 0; step < c.max_steps; ++step) {
    while (next < w.size() && w[next].arrival_step <= step)
      queue.push_back(static_cast<int32_t>(next++));
    if (queue.empty() && active.empty() && next == w.size()) break;
    int32_t budget = c.max_num_batched_tokens - static_cast<int32_t>(active.size());
    std::vector<Active> admitted;
    while (!queue.empty() &&
           static_cast<int32_t>(active.size() + admitted.size()) < c.max_num_seqs) {
      const SimRequest& r = w[queue.front()];
      const int64_t size = exact ? r.prompt_len + r.output_len : c.naive_max_len;
      if (size > c.capacity_tokens || r.prompt_len + r.output_len > size ||
          r.prompt_len > c.max_num_batched_tokens) {
        ++m.r.rejected;
        queue.pop_front();
        continue;
      }
      if (r.prompt_len > budget) break;
      const int64_t start = arena.Allocate(size);
      if (start < 0) {
        if (arena.free_total() >= size) {
          ++m.r.external_blocked_steps;
          m.ext_sum += static_cast<double>(arena.free_total()) / c.capacity_tokens;
        }
        break;
      }
      budget -= r.prompt_len;
      admitted.push_back({start, size, r.prompt_len, r.output_len, 0});
      queue.pop_front();
    }
    // One engine step: decodes gain a token, admitted requests are prefilled.
    // Decodes gain a token (admitted requests start at 0, so the prefill's
    // token makes it 1); a request that reached its output length is freed.
    std::vector<Active> still;
    auto generate_one = [&](Active& a) {
      ++a.generated;
      ++m.r.generated_tokens;
      if (a.generated >= a.output) {
        arena.Free(a.start, a.size);
        ++m.r.completed;
      } else {
        still.push_back(a);
      }
    };
    for (Active& a : active) generate_one(a);
    for (Active& a : admitted) generate_one(a);
    active.swap(still);
    int64_t stored = 0, reserved = 0;
    for (const Active& a : active) {
      stored += a.prompt + a.generated - 1;
      reserved += a.size;
    }
    m.Step(stored, reserved, c.capacity_tokens, static_cast<int32_t>(active.size()));
  }
  return m.Finish();
}

absl::StatusOr<AllocatorReport> SimulatePaged(const SimConfig& c, const std::vector<SimRequest>& w,
                                              int32_t num_blocks) {
  Meter m;
  m.r.name = absl::StrCat("paged, block_size=", c.block_size);
  SchedulerConfig sc;
  sc.block_size = c.block_size;
  sc.num_device_blocks = num_blocks;
  sc.num_cpu_blocks = c.num_cpu_blocks < 0 ? num_blocks : c.num_cpu_blocks;
  sc.max_num_seqs = c.max_num_seqs;
  sc.max_num_batched_tokens = c.max_num_batched_tokens;
  sc.enable_chunked_prefill = c.enable_chunked_prefill;
  sc.preemption_mode = c.preemption_mode;
  sc.watermark = c.watermark;
  int32_t longest = 2;
  for (const SimRequest& r : w) longest = std::max(longest, r.prompt_len + r.output_len);
  const int32_t fit = static_cast<int32_t>(
      (num_blocks - static_cast<int64_t>(c.watermark * num_blocks)) * c.block_size);
  sc.max_model_len = std::min(longest + 1, fit);
  if (!c.enable_chunked_prefill)
    sc.max_model_len = std::min(sc.max_model_len, c.max_num_batched_tokens);
  auto sched_or = Scheduler::Create(sc, /*eos_token_ids=*/{});
  if (!sched_or.ok()) return sched_or.status();
  Scheduler& sched = **sched_or;
  size_t next = 0;
  for (int64_t step = 0;; ++step) {
    if (step >= c.max_steps) {
      return absl::DeadlineExceededError(
          absl::StrCat("paged simulation did not finish in ", c.max_steps, " steps"));
    }
    while (next < w.size() && w[next].arrival_step <= step) {
      const SimRequest& r = w[next];
      Request req;
      req.request_id = absl::StrCat("r", next);
      req.arrival_time = static_cast<double>(step);
      for (int32_t i = 0; i < r.prompt_len; ++i) {
        req.prompt_token_ids.push_back(static_cast<int32_t>((next * 7919 + i) % 30000) + 1);
      }
      req.params.max_tokens = r.output_len;
      req.params.ignore_eos = true;
      req.params.temperature = 0.0f;
      if (!sched.AddRequest(std::move(req)).ok()) ++m.r.rejected;
      ++next;
    }
    if (!sched.HasUnfinishedRequests() && next == w.size()) break;
    auto plan = sched.Schedule();
    if (!plan.ok()) return plan.status();
    StepResult result;
    result.step_id = plan->step_id;
    for (const SequenceStep& s : plan->seqs) {
      if (!s.sample) continue;
      for (int32_t i = 0; i < s.num_samples; ++i) {
        SampledToken t;
        t.seq_id = s.seq_id;
        t.token_id = 7;
        result.tokens.push_back(t);
      }
    }
    auto outs = sched.ProcessResult(result);
    if (!outs.ok()) return outs.status();
    for (const RequestOutput& o : *outs) {
      for (const SequenceOutput& so : o.seqs) m.r.generated_tokens += so.new_tokens.size();
      m.r.completed += o.finished;
    }
    int64_t stored = 0;
    for (const SequenceGroup* g : sched.running_requests()) {
      for (const auto& s : g->seqs) {
        if (!s->finished()) stored += s->num_computed_tokens;
      }
    }
    const int64_t reserved =
        static_cast<int64_t>(sched.block_manager().device().num_in_use()) * c.block_size;
    m.Step(stored, reserved, c.capacity_tokens,
           static_cast<int32_t>(sched.running_requests().size()));
  }
  const SchedulerStats st = sched.stats();
  m.r.preemptions_swap = st.num_preemptions_swap;
  m.r.preemptions_recompute = st.num_preemptions_recompute;
  return m.Finish();
}

}  // namespace

absl::StatusOr<SimReport> RunKvSimulation(const SimConfig& config,
                                          const std::vector<SimRequest>& workload) {
  if (workload.empty()) return absl::InvalidArgumentError("the workload has no requests");
  if (config.block_size < 1) return absl::InvalidArgumentError("block size must be >= 1");
  if (config.naive_max_len < 1) return absl::InvalidArgumentError("naive max_len must be >= 1");
  if (config.capacity_tokens < config.block_size) {
    return absl::InvalidArgumentError(absl::StrCat("KV capacity (", config.capacity_tokens,
                                                   " tokens) is below one block (",
                                                   config.block_size, ")"));
  }
  if (config.max_num_seqs < 1 || config.max_num_batched_tokens < 1) {
    return absl::InvalidArgumentError("max_num_seqs and max_num_batched_tokens must be >= 1");
  }
  std::vector<SimRequest> w = workload;
  std::stable_sort(w.begin(), w.end(), [](const SimRequest& a, const SimRequest& b) {
    return a.arrival_step < b.arrival_step;
  });
  SimReport rep;
  rep.config = config;
  rep.num_requests = static_cast<int32_t>(w.size());
  // Both allocators get the same capacity: the paged pool rounds down to blocks.
  rep.num_device_blocks = static_cast<int32_t>(config.capacity_tokens / config.block_size);
  SimConfig c = config;
  c.capacity_tokens = static_cast<int64_t>(rep.num_device_blocks) * config.block_size;
  rep.config = c;
  rep.allocators.push_back(SimulateNaive(c, w, /*exact=*/false));
  rep.allocators.push_back(SimulateNaive(c, w, /*exact=*/true));
  auto paged = SimulatePaged(c, w, rep.num_device_blocks);
  if (!paged.ok()) return paged.status();
  rep.allocators.push_back(*std::move(paged));
  return rep;
}

std::string FormatSimTable(const SimReport& rep) {
  std::string out = absl::StrFormat(
      "KV capacity: %d tokens (%d blocks of %d), %d requests, budgets: %d seqs / %d tokens per step\n\n",
      rep.config.capacity_tokens, rep.num_device_blocks, rep.config.block_size, rep.num_requests,
      rep.config.max_num_seqs, rep.config.max_num_batched_tokens);
  absl::StrAppendFormat(&out, "%-40s %7s %6s %6s %8s %8s %8s %8s %8s %8s %9s\n", "allocator",
                        "steps", "done", "rej", "max conc", "avg conc", "util avg", "util max",
                        "int frag", "ext frag", "preempt");
  for (const AllocatorReport& a : rep.allocators) {
    absl::StrAppendFormat(
        &out, "%-40s %7d %6d %6d %8d %8.1f %7.1f%% %7.1f%% %7.1f%% %7.1f%% %4d/%-4d\n", a.name,
        a.steps, a.completed, a.rejected, a.max_concurrent, a.mean_concurrent,
        100 * a.mean_utilization, 100 * a.peak_utilization, 100 * a.internal_fragmentation,
        100 * a.external_fragmentation, a.preemptions_swap, a.preemptions_recompute);
  }
  if (rep.allocators.size() == 3) {
    const AllocatorReport& naive = rep.allocators[0];
    const AllocatorReport& paged = rep.allocators[2];
    absl::StrAppendFormat(
        &out,
        "\npaged vs naive max_len: %.2fx max concurrent requests, %.2fx mean concurrent, "
        "%.2fx fewer steps\n",
        naive.max_concurrent ? double(paged.max_concurrent) / naive.max_concurrent : 0.0,
        naive.mean_concurrent > 0 ? paged.mean_concurrent / naive.mean_concurrent : 0.0,
        paged.steps ? double(naive.steps) / paged.steps : 0.0);
  }
  out +=
      "int frag = reserved but unused / reserved (time average); ext frag = free memory stranded while the "
      "head request waited for a contiguous hole (mean over such steps; 0 for paged by construction); "
      "preempt = swap/recompute.\n";
  return out;
}

std::string RenderSimSvg(const SimReport& rep) {
  const int W = 960, H = 640, L = 70, R = 20;
  const int top_y0 = 40, top_h = 280, hist_y0 = 380, hist_h = 200;
  const char* colors[] = {"#d62728", "#ff7f0e", "#1f77b4", "#2ca02c"};
  int64_t max_steps = 1;
  for (const auto& a : rep.allocators)
    max_steps = std::max<int64_t>(max_steps, a.utilization.size());
  std::string s = absl::StrFormat(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
      "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
      "<text x=\"%d\" y=\"22\" font-size=\"15\">KV memory utilization (stored tokens / capacity %d tokens), "
      "%d requests</text>\n",
      W, H, L, rep.config.capacity_tokens, rep.num_requests);
  const int pw = W - L - R;
  // Axes and grid of the timeline.
  for (int p = 0; p <= 100; p += 25) {
    const double y = top_y0 + top_h * (1 - p / 100.0);
    absl::StrAppendFormat(&s,
                          "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>"
                          "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%d%%</text>\n",
                          L, y, L + pw, y, L - 6, y + 4, p);
  }
  absl::StrAppendFormat(
      &s, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">engine step (0 .. %d)</text>\n",
      L + pw / 2, top_y0 + top_h + 20, max_steps);
  for (size_t k = 0; k < rep.allocators.size(); ++k) {
    const auto& u = rep.allocators[k].utilization;
    if (u.empty()) continue;
    std::string pts;
    const size_t stride = std::max<size_t>(1, u.size() / 1200);
    for (size_t i = 0; i < u.size(); i += stride) {
      absl::StrAppendFormat(&pts, "%.1f,%.1f ", L + pw * double(i) / max_steps,
                            top_y0 + top_h * (1 - u[i]));
    }
    absl::StrAppendFormat(
        &s, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>\n",
        colors[k % 4], pts);
    absl::StrAppendFormat(&s,
                          "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>"
                          "<text x=\"%d\" y=\"%d\">%s (mean %.1f%%)</text>\n",
                          L + 10, top_y0 + 8 + 18 * int(k), colors[k % 4], L + 28,
                          top_y0 + 18 + 18 * int(k), rep.allocators[k].name,
                          100 * rep.allocators[k].mean_utilization);
  }
  // Histogram: share of steps per 5% utilization bin.
  const int bins = 20;
  absl::StrAppendFormat(
      &s,
      "<text x=\"%d\" y=\"%d\" font-size=\"14\">Histogram: share of steps by utilization</text>\n",
      L, hist_y0 - 12);
  std::vector<std::vector<double>> share(rep.allocators.size(), std::vector<double>(bins, 0));
  double max_share = 0.01;
  for (size_t k = 0; k < rep.allocators.size(); ++k) {
    const auto& u = rep.allocators[k].utilization;
    for (float v : u) share[k][std::clamp(int(v * bins), 0, bins - 1)] += 1.0 / u.size();
    for (double x : share[k]) max_share = std::max(max_share, x);
  }
  const double bw = double(pw) / bins;
  const double barw = bw / (rep.allocators.size() + 1);
  for (int b = 0; b < bins; ++b) {
    for (size_t k = 0; k < rep.allocators.size(); ++k) {
      const double h = hist_h * share[k][b] / max_share;
      absl::StrAppendFormat(
          &s, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n",
          L + b * bw + (k + 0.5) * barw, hist_y0 + hist_h - h, barw, h, colors[k % 4]);
    }
    if (b % 2 == 0) {
      absl::StrAppendFormat(&s, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d%%</text>\n",
                            L + b * bw, hist_y0 + hist_h + 16, b * 100 / bins);
    }
  }
  absl::StrAppendFormat(&s,
                        "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>"
                        "<text x=\"%d\" y=\"%d\" text-anchor=\"end\">%.0f%%</text>\n</svg>\n",
                        L, hist_y0 + hist_h, L + pw, hist_y0 + hist_h, L - 6, hist_y0 + 4,
                        100 * max_share);
  return s;
}

}  // namespace pagedserve
