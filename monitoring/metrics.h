// Prometheus metrics of the pagedserve coordinator.
//
// One `Metrics` object lives in the coordinator (rank 0). It owns a
// prometheus::Registry with every pagedserve_* series and, when asked, a
// prometheus::Exposer that serves them in the Prometheus text exposition format
// on http://HOST:PORT/metrics. Workers do not serve metrics: their per-step
// figures (step time, time in collectives) travel back with the step results and
// the coordinator records them with ObserveRankStep().
//
// Every family that vLLM also exports is exported a second time under vLLM's
// name, type, labels and buckets (`vllm:*`, labels model_name and engine="0"),
// from the same calls: a vLLM dashboard, alert or autoscaler finds its series
// unchanged. docs/metrics.md ("vLLM names") lists them and says why both
// namespaces are always on.
//
// Naming of the pagedserve_* series follows the Prometheus conventions
// (https://prometheus.io/docs/practices/naming/): one prefix `pagedserve_`, counters end in
// `_total`, durations are in seconds
// (`_seconds`), ratios are 0..1 (`_ratio`), token counts are plain numbers.
// `promtool check metrics` reports nothing on Serialize()'s output (tested).
// Every metric, its type, labels and meaning is listed in docs/metrics.md.
//
// Thread safety: every method may be called concurrently from any thread
// (prometheus-cpp counters and gauges are atomics, histograms take a mutex).
//
// Bad input never crashes and never corrupts a series: a negative count or
// duration, a NaN, a ratio outside [0, 1] or a negative rank is dropped and
// counted in pagedserve_metrics_rejected_observations_total{method="..."}, so a
// bug in the caller shows on the dashboard instead of as a wrong figure.
#ifndef PAGEDSERVE_MONITORING_METRICS_H_
#define PAGEDSERVE_MONITORING_METRICS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace prometheus {
class Counter;
class Exposer;
class Gauge;
class Histogram;
class Registry;
template <typename T>
class Family;
}  // namespace prometheus

namespace pagedserve {

// Why a request ended. Label `finish_reason` of pagedserve_requests_finished_total.
// (Named Metrics*: runtime/coordinator declares pagedserve::FinishReason and
// pagedserve::PreemptionMode with other enumerators, and both headers meet in
// the engine and in the pagedserve binary.)
enum class MetricsFinishReason {
  kStop,    // a stop token or stop string was produced      -> "stop"
  kLength,  // max_tokens or the model's context length hit  -> "length"
  kAbort,   // the client aborted or disconnected            -> "abort"
  kError,   // the request failed inside the server          -> "error"
};
std::string_view FinishReasonName(MetricsFinishReason reason);

// How a sequence group was preempted. Label `mode` of pagedserve_preemptions_total.
enum class MetricsPreemptionMode {
  kSwap,       // KV blocks copied to the CPU swap pool, copied back later -> "swap"
  kRecompute,  // KV blocks freed, the prompt + output prefilled again     -> "recompute"
};
std::string_view PreemptionModeName(MetricsPreemptionMode mode);

// Static facts about this server, exported once as
// pagedserve_build_info{version="...", model="...", ...} 1.
struct BuildInfo {
  std::string version;           // pagedserve version, e.g. "0.1.0"
  std::string model;             // model name or path as given to --model
  int tensor_parallel_size = 1;  // --tensor-parallel-size; also pre-creates the
                                 // per-rank series for ranks 0..tp-1
  int block_size = 16;           // --block-size (tokens per KV block)
  std::string backend;           // "cpu" or "cuda"
  // Further configuration labels, e.g. {"max_num_seqs", "256"}. Names must match
  // [a-zA-Z_][a-zA-Z0-9_]*, must not start with "__" and must not repeat one of
  // the fields above.
  std::map<std::string, std::string> extra_labels;
};

struct MetricsOptions {
  // Where to serve /metrics: "HOST:PORT", e.g. "0.0.0.0:9400", "127.0.0.1:9400"
  // or "[::]:9400". Empty, or port 0, means no HTTP endpoint (the caller maps
  // `--metrics-port 0` to that); Serialize() works either way.
  std::string listen_address;
  // The served model name (what vLLM calls --served-model-name; the serve
  // command passes the model file's or folder's base name). Exported as the
  // label `model_name` on every pagedserve_* series, as vLLM labels its own, so
  // that dashboards and alerts can select one model among several servers.
  // Must not be empty (InvalidArgument).
  std::string model_name;
  BuildInfo build_info;
  // --max-model-len: the largest bucket of the vllm:request_*_tokens histograms,
  // whose buckets are vLLM's 1, 2, 5, 10, 20, 50, ... up to it. 0 means 100000.
  int64_t max_model_len = 0;
};

// Per-request figures, recorded once when the request leaves the server.
// Durations in seconds, measured with a monotonic clock:
//   queue   = arrival -> first scheduled
//   ttft    = arrival -> first output token sent
//   prefill = first scheduled -> first output token
//   decode  = first output token -> last output token
//   e2e     = arrival -> final message sent
// A request that never produced a token (aborted while waiting, rejected) has
// ttft_s, prefill_s and decode_s < 0: then only e2e, queue (if >= 0), the
// finish reason and the prompt length are recorded, and the TTFT histogram's
// count stays equal to the number of requests that produced a first token.
// One n > 1 request (parallel sampling, beam search) counts once;
// generation_len is the sum over its output sequences.
struct FinishedRequest {
  MetricsFinishReason reason = MetricsFinishReason::kStop;
  double ttft_s = -1;
  double e2e_s = -1;
  double queue_s = -1;
  double prefill_s = -1;
  double decode_s = -1;
  int64_t prompt_len = 0;
  int64_t generation_len = 0;
  // Output tokens of the request's longest sequence (vLLM's
  // request_max_num_generation_tokens); < 0 means generation_len (n = 1).
  int64_t max_generation_len = -1;
};

class Metrics {
 public:
  // Builds the registry and, when options.listen_address names a non-zero port,
  // starts the HTTP exposer. Errors (InvalidArgument) name the field:
  // a malformed listen_address, a port outside 0..65535, a bad extra label name;
  // Unavailable when the address cannot be bound (in use, no permission).
  static absl::StatusOr<std::unique_ptr<Metrics>> Create(const MetricsOptions& options);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The TCP port the exposer listens on, or 0 when none is running.
  int listening_port() const { return listening_port_; }

  // --- scheduler state (gauges, set after every scheduling step) ---
  // Sequence groups in the running, waiting and swapped queues.
  void SetRequests(int64_t running, int64_t waiting, int64_t swapped);
  // Fraction (0..1) of KV blocks in use in the device pool and the CPU swap pool
  // (a pool of 0 blocks reports 0).
  void SetKvUsage(double device_fraction, double cpu_fraction);

  // --- counters ---
  // Prefix cache lookups of a scheduling decision, in tokens: `query_tokens`
  // prompt tokens looked up, `hit_tokens` of them found in cached blocks
  // (hit_tokens <= query_tokens, else rejected).
  void AddPrefixCache(int64_t query_tokens, int64_t hit_tokens);
  // One sequence group preempted.
  void AddPreemption(MetricsPreemptionMode mode);
  // Prompt tokens prefilled (including recomputed ones after a recompute
  // preemption) and output tokens generated, per step:
  // pagedserve_prompt_tokens_total counts the computed tokens.
  void AddPromptTokens(int64_t n);
  // vLLM's vllm:prompt_tokens_total instead counts each request's whole prompt
  // once, when its first output token comes (prefix-cache hits included,
  // recomputation not; vLLM V1 IterationStats.update_from_output).
  void AddRequestPromptTokens(int64_t n);
  void AddGenerationTokens(int64_t n);
  // Speculative decoding, per step (vLLM's spec-decode counters):
  // verification entries (a sequence verifying >= 1 draft token),
  // draft tokens proposed, accepted, tokens emitted by verification entries,
  // and accepted drafts by position (accepted_per_pos[j]: draft token j + 1
  // accepted; series labelled position="j"). Negative values are rejected.
  void AddSpecDecode(int64_t drafts, int64_t draft_tokens, int64_t accepted, int64_t emitted,
                     const std::vector<int64_t>& accepted_per_pos);
  // One ZeroMQ connection whose handshake failed (a CurveZMQ server refusing a
  // client): `reason` "auth" (the ZAP handler refused the client's key),
  // "protocol" (wrong server key, mechanism mismatch, malformed greeting) or
  // "other"; any other string is rejected.
  void AddFailedHandshake(std::string_view reason);
  // One HTTP response written by the OpenAI front end (every route, errors
  // included), by its status code; a code outside 100..599 is rejected.
  void AddHttpResponse(int status);

  // --- per request / per token / per step histograms ---
  void RequestFinished(const FinishedRequest& request);
  // Time between two consecutive output tokens of one sequence.
  void ObserveInterTokenLatency(double seconds);
  // Tokens (prefill + decode) in one model step.
  void ObserveStepTokens(int64_t n);
  // One worker's step: wall time of its step and the part spent in tensor
  // parallel collectives (all-reduce / all-gather). `rank` is the worker's
  // tensor-parallel rank, 0..tensor_parallel_size-1 (larger ranks are accepted
  // and create their series on first use).
  void ObserveRankStep(int rank, double step_s, double collective_s);

  // The registry in Prometheus text format 0.0.4 (what /metrics serves minus
  // the exposer's own exposer_* series). For tests and debugging.
  std::string Serialize() const;

  // Bucket upper bounds used by the histograms (exposed for tests and docs).
  static const std::vector<double>& LatencyBuckets();      // TTFT, up to 2400 s as vLLM
  static const std::vector<double>& InterTokenBuckets();   // ITL
  static const std::vector<double>& RequestTimeBuckets();  // e2e, queue, prefill, decode (2400 s)
  static const std::vector<double>& TokenCountBuckets();   // prompt / generation length
  static const std::vector<double>& StepTokenBuckets();    // tokens per step
  static const std::vector<double>& RankStepBuckets();     // per-rank step and collectives
  // vLLM's buckets for its vllm:* histograms (vllm/v1/metrics/loggers.py).
  static const std::vector<double>& VllmTtftBuckets();
  static const std::vector<double>& VllmTpotBuckets();
  static const std::vector<double>& VllmRequestLatencyBuckets();  // e2e, queue, prefill, ...
  static const std::vector<double>& VllmPrefillPerTokenBuckets();
  // 1, 2, 5, 10, 20, 50, ... <= max_value (vLLM's build_1_2_5_buckets).
  static std::vector<double> Vllm125Buckets(int64_t max_value);

 private:
  Metrics();
  // The phases of Create, in order: register the gauges (build info, queues,
  // KV usage), the counters, the histograms (one series per rank in
  // [0, tensor_parallel_size) for the per-rank families), then start the
  // exposer. `constant` = {model_name}, on every family; `info_labels`: the
  // labels of pagedserve_build_info.
  void RegisterGauges(const std::map<std::string, std::string>& constant,
                      const std::map<std::string, std::string>& info_labels);
  void RegisterCounters(const std::map<std::string, std::string>& constant);
  void RegisterHistograms(const std::map<std::string, std::string>& constant,
                          int tensor_parallel_size);
  // The vllm:* families; labels {model_name, engine="0"}.
  void RegisterVllm(const std::string& model_name, int64_t max_model_len);
  // Serves the registry on `listen_address` (whose port is `port`, non-zero);
  // Unavailable when it cannot be bound.
  absl::Status StartExposer(const std::string& listen_address, int port);
  void Reject(std::string_view method);
  prometheus::Histogram& RankHistogram(prometheus::Family<prometheus::Histogram>* family, int rank);

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int listening_port_ = 0;

  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* waiting_ = nullptr;
  prometheus::Gauge* swapped_ = nullptr;
  prometheus::Gauge* kv_device_ = nullptr;
  prometheus::Gauge* kv_cpu_ = nullptr;
  prometheus::Counter* prefix_queries_ = nullptr;
  prometheus::Counter* prefix_hits_ = nullptr;
  prometheus::Counter* preempt_swap_ = nullptr;
  prometheus::Counter* preempt_recompute_ = nullptr;
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generation_tokens_ = nullptr;
  prometheus::Counter *spec_drafts_ = nullptr, *spec_draft_tokens_ = nullptr;
  prometheus::Counter *spec_accepted_ = nullptr, *spec_emitted_ = nullptr;
  prometheus::Family<prometheus::Counter>* spec_per_pos_ = nullptr;
  prometheus::Counter* finished_[4] = {};
  prometheus::Counter* handshake_auth_ = nullptr;
  prometheus::Counter* handshake_protocol_ = nullptr;
  prometheus::Counter* handshake_other_ = nullptr;
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Histogram* itl_ = nullptr;
  prometheus::Histogram* e2e_ = nullptr;
  prometheus::Histogram* queue_ = nullptr;
  prometheus::Histogram* prefill_ = nullptr;
  prometheus::Histogram* decode_ = nullptr;
  prometheus::Histogram* prompt_len_ = nullptr;
  prometheus::Histogram* generation_len_ = nullptr;
  prometheus::Histogram* step_tokens_ = nullptr;
  prometheus::Family<prometheus::Histogram>* rank_step_ = nullptr;
  prometheus::Family<prometheus::Histogram>* rank_collective_ = nullptr;
  prometheus::Family<prometheus::Counter>* rejected_ = nullptr;
  prometheus::Family<prometheus::Counter>* http_responses_ = nullptr;

  // The same figures under vLLM's names (RegisterVllm).
  struct Vllm {
    prometheus::Gauge *running = nullptr, *waiting = nullptr, *swapped = nullptr;
    prometheus::Gauge *gpu_cache = nullptr, *kv_cache = nullptr, *cpu_cache = nullptr;
    prometheus::Gauge* prefix_hit_rate = nullptr;
    prometheus::Counter *gpu_prefix_queries = nullptr, *gpu_prefix_hits = nullptr;
    prometheus::Counter *prefix_queries = nullptr, *prefix_hits = nullptr;
    prometheus::Counter* preemptions = nullptr;
    prometheus::Counter *prompt_tokens = nullptr, *generation_tokens = nullptr;
    prometheus::Counter *spec_drafts = nullptr, *spec_draft_tokens = nullptr;
    prometheus::Counter* spec_accepted = nullptr;
    prometheus::Family<prometheus::Counter>* spec_per_pos = nullptr;
    std::map<std::string, std::string> labels;  // vLLM's series labels
    prometheus::Counter* success[4] = {};
    prometheus::Histogram *ttft = nullptr, *tpot = nullptr, *itl = nullptr;
    prometheus::Histogram *e2e = nullptr, *queue = nullptr, *inference = nullptr;
    prometheus::Histogram *prefill = nullptr, *decode = nullptr, *prefill_per_token = nullptr;
    prometheus::Histogram *prompt_len = nullptr, *generation_len = nullptr;
    prometheus::Histogram *max_generation_len = nullptr, *iteration_tokens = nullptr;
  } vllm_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_MONITORING_METRICS_H_
