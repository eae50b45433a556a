// pagedserve serve: the server. Protocol v1 over ZeroMQ (docs/protocol.md),
// the OpenAI-compatible HTTP API (docs/http.md), metrics over HTTP
// (docs/metrics.md), serving guide in docs/serving.md.
//
//   pagedserve serve MODEL | --model MODEL [--zmq-endpoint tcp://127.0.0.1:5555]
//                    [--host 127.0.0.1 --port 8000 --api-key KEY --served-model-name NAME]
//                    [--metrics-host 127.0.0.1 --metrics-port 9400] [--max-queue-len 256]
//                    [--zmq-curve-secret-key-file server.key_secret
//                     [--zmq-curve-authorized-clients DIR]] [--require-cache-salt]
//                    [--log-request-content | --disable-log-requests]
//                    [--log-stats-interval 10 | --disable-log-stats] [--seed S]
//                    [engine flags, see common_flags.h]
//   mpirun -np 1+TP pagedserve serve --model PATH --tensor-parallel-size TP ...
//
// Under mpirun rank 0 is the coordinator (front end, engine, metrics) and ranks
// 1..TP run RunWorkerRank; without mpirun one process runs the coordinator and
// an in-process worker.
//
// Signals: the first SIGTERM or SIGINT to the coordinator stops admitting
// (`generate` -> `busy`, `health` -> unhealthy), lets in-flight requests finish
// for up to --shutdown-grace seconds, aborts the rest (finish_reason "abort"),
// stops the worker ranks (executor Shutdown) and exits 0. A second signal skips
// the rest of the grace period. Worker ranks ignore SIGTERM and SIGINT: they
// stop when the coordinator shuts them down (mpirun forwards a SIGTERM sent to
// it to every rank and kills them odls_base_sigkill_timeout seconds later; to
// drain under mpirun signal rank 0, whose pid --pid-file records, or raise
// OMPI_MCA_odls_base_sigkill_timeout above the grace period).
//
// Exit codes: 0 clean shutdown, 1 runtime failure (model, bind, engine),
// 2 bad flags.
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/common_flags.h"
#include "runtime/common/status_macros.h"
#include "runtime/engine/engine.h"
#include "runtime/engine/engine_loop.h"
#include "runtime/engine/executor.h"
#include "runtime/engine/stats_logger.h"
#include "runtime/frontend/http_server.h"
#include "runtime/frontend/serve_metrics.h"
#include "runtime/frontend/server.h"
#include "runtime/launch/local_executor.h"
#include "runtime/launch/mpi_executor.h"
#include "runtime/launch/mpi_process.h"
#include "runtime/launch/worker_rank.h"
#include "runtime/model/generation_config.h"
#include "runtime/tokenizer/chat_template.h"
#include "runtime/worker/worker.h"
#include "spdlog/spdlog.h"

PAGEDSERVE_FLAG("serve,client", std::string, zmq_endpoint, "tcp://127.0.0.1:5555",
                "ZeroMQ endpoint: serve binds a ROUTER socket there, client connects to it "
                "(tcp://0.0.0.0:5555 for every interface; tcp://127.0.0.1:* picks a free port)");
PAGEDSERVE_FLAG("serve", std::string, metrics_host, "127.0.0.1",
                "serve: address of the Prometheus /metrics endpoint");
PAGEDSERVE_FLAG("serve", int32_t, metrics_port, 0,
                "serve: port of the Prometheus /metrics endpoint; 0 = no endpoint");
PAGEDSERVE_FLAG("serve", int64_t, max_queue_len, 256,
                "serve: waiting requests before new ones are answered 'busy'");
PAGEDSERVE_FLAG("serve", int64_t, max_message_bytes, 1 << 20,
                "serve: largest accepted request message (message_too_large beyond)");
PAGEDSERVE_FLAG(
    "serve", double, shutdown_grace, 30,
    "serve: seconds in-flight requests may still run after SIGTERM/SIGINT before they are aborted");
PAGEDSERVE_FLAG(
    "serve", int32_t, zmq_heartbeat_interval_ms, 2000,
    "serve: ZMTP heartbeat interval to clients; a client that misses --zmq-heartbeat-timeout-ms "
    "of them is disconnected and its requests aborted; 0 = no heartbeats");
PAGEDSERVE_FLAG("serve", int32_t, zmq_heartbeat_timeout_ms, 10000,
                "serve: see --zmq-heartbeat-interval-ms");
PAGEDSERVE_FLAG("serve", std::string, pid_file, "",
                "serve: write the coordinator's process id to this file (removed at exit)");
PAGEDSERVE_FLAG("serve", std::string, host, "127.0.0.1",
                "serve: address of the OpenAI-compatible HTTP API (0.0.0.0: every interface)");
PAGEDSERVE_FLAG("serve", int32_t, port, 8000,
                "serve: port of the HTTP API; 0 picks a free port; -1 = no HTTP API");
PAGEDSERVE_FLAG("serve", std::string, api_key, "",
                "serve: require 'Authorization: Bearer KEY' on the HTTP API's /v1/*, /tokenize "
                "and /detokenize (default: the environment variable PAGEDSERVE_API_KEY; empty = "
                "no key). HTTP only: the ZeroMQ front end is protected by CurveZMQ "
                "(--zmq-curve-secret-key-file, --zmq-curve-authorized-clients), never by this key");
PAGEDSERVE_FLAG("serve", std::string, tool_call_parser, "",
                "how chat outputs are parsed into OpenAI tool_calls when a request gives tools: "
                "hermes, llama3_json or mistral (vLLM's names); empty: chosen from the chat "
                "template's markers");
PAGEDSERVE_FLAG("serve", std::string, served_model_name, "",
                "serve: the model name of the HTTP API (/v1/models, 'model' field) and of the "
                "metrics' model_name label; default the model file's name");
PAGEDSERVE_FLAG("serve", std::string, generation_config, "auto",
                "serve: sampling defaults (temperature, top_p, top_k, min_p, repetition_penalty) "
                "for HTTP requests that leave them out, as vLLM's --generation-config: 'auto' = "
                "the model folder's generation_config.json, 'vllm' = none (the OpenAI defaults), "
                "or a folder holding a generation_config.json");
PAGEDSERVE_FLAG("serve", bool, disable_log_requests, false,
                "serve: no request log line per finished request (both the ZeroMQ and the "
                "HTTP front end)");
PAGEDSERVE_FLAG("serve", bool, log_request_content, false,
                "serve: also write prompt and completion text to the request log of both "
                "front ends (default: ids, token counts and timings only)");
PAGEDSERVE_FLAG("serve", int64_t, max_request_body_bytes, 1 << 20,
                "serve: largest accepted HTTP request body (413 beyond)");
PAGEDSERVE_FLAG("serve", double, http_timeout, 30,
                "serve: seconds a client has to send a whole HTTP request (request line, "
                "headers and body: a deadline, 408 after it) and a response write may wait for "
                "a client that stops reading");
PAGEDSERVE_FLAG("serve", double, http_keep_alive_timeout, 5,
                "serve: seconds an idle HTTP keep-alive connection may wait before its next "
                "request (closed after; uvicorn's --timeout-keep-alive, also 5 s there)");
PAGEDSERVE_FLAG("serve", int32_t, http_io_threads, 2,
                "serve: threads that run every HTTP connection (Boost.Asio; 1..64): idle "
                "keep-alive and slow clients cost memory, not threads");
PAGEDSERVE_FLAG("serve", std::string, ssl_certfile, "",
                "serve: HTTPS on the HTTP API with this PEM certificate (chain); needs "
                "--ssl-keyfile");
PAGEDSERVE_FLAG("serve", std::string, ssl_keyfile, "",
                "serve: the PEM private key of --ssl-certfile");
PAGEDSERVE_FLAG("serve", std::string, ssl_ca_certs, "",
                "serve: PEM file of the CA certificates that sign client certificates (mutual "
                "TLS; needs --ssl-certfile and --ssl-cert-reqs 1 or 2)");
PAGEDSERVE_FLAG("serve", int32_t, ssl_cert_reqs, 0,
                "serve: client certificates, as Python's ssl.VerifyMode (uvicorn, vLLM): 0 not "
                "asked for, 1 optional (a presented one must verify against --ssl-ca-certs), 2 "
                "required");
PAGEDSERVE_FLAG("serve,client", std::string, zmq_curve_secret_key_file, "",
                "serve: turn on CurveZMQ (encryption + server authentication) with this secret "
                "certificate (NAME.key_secret from `pagedserve keygen`); client: this client's own "
                "key pair (default: a fresh one per run)");
PAGEDSERVE_FLAG("serve", std::string, zmq_curve_authorized_clients, "",
                "serve: with --zmq-curve-secret-key-file, serve only clients whose public "
                "certificate (*.key) is in this folder; others are refused during the handshake");
PAGEDSERVE_FLAG("serve", bool, disable_log_stats, false,
                "serve: no periodic stats line (throughputs, requests, KV cache usage, "
                "prefix-cache hit rate; see --log-stats-interval)");
PAGEDSERVE_FLAG("serve", double, log_stats_interval, 10,
                "serve: seconds between two stats lines (prompt and generation throughput over "
                "the interval, running / waiting / swapped requests, device KV cache and CPU swap "
                "usage, prefix-cache hit rate); written while the server is busy and once when it "
                "turns idle (idle lines at debug level); 0.01 to 86400");
PAGEDSERVE_FLAG("serve", bool, require_cache_salt, false,
                "serve: refuse requests without a cache_salt (multi-tenant prefix-cache "
                "isolation)");

namespace pagedserve::cli {
namespace {

std::atomic<bool> g_stop{false};
std::atomic<bool> g_abort_now{false};

extern "C" void OnStopSignal(int) {
  if (g_stop.load()) g_abort_now.store(true);
  g_stop.store(true);
}

void InstallSignals(void (*handler)(int)) {
  struct sigaction sa = {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: zmq_poll returns EINTR and the loop looks at the flag
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void PrintError(const absl::Status& s) {
  std::fprintf(stderr, "pagedserve serve: %s\n", std::string(s.message()).c_str());
}

struct ServeOptions {
  ServerOptions zmq;
  EngineLoopOptions loop;
  HttpServerOptions http;
  bool http_enabled = true;
  std::optional<uint64_t> default_seed;  // --seed
  // --log-stats-interval; none with --disable-log-stats.
  std::optional<absl::Duration> log_stats_interval;
};

// Blocks SIGTERM / SIGINT in the calling thread while alive, so that threads
// started meanwhile (front ends) inherit the mask and the signals reach the
// main thread, which runs the engine loop and looks at the stop flags.
class StopSignalsBlocked {
 public:
  StopSignalsBlocked() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, &old_);
  }
  ~StopSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

 private:
  sigset_t old_;
};

// --generation-config: the sampling defaults of the OpenAI API (vLLM's
// auto / vllm / folder); one line on stderr names what a model file set.
absl::StatusOr<openai::SamplingDefaults> SamplingDefaultsFromFlags(const std::string& model_path) {
  const std::string flag = absl::GetFlag(FLAGS_generation_config);
  if (flag == "vllm") return openai::SamplingDefaults{};
  std::error_code ec;
  if (flag != "auto" && !std::filesystem::is_directory(flag, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--generation-config must be auto, vllm or a folder holding generation_config.json, got '",
        flag, "'"));
  }
  const std::string folder = flag == "auto" ? model_path : flag;
  absl::StatusOr<GenerationDefaults> g = LoadGenerationDefaults(folder);
  if (!g.ok()) return g.status();
  openai::SamplingDefaults d;
  std::string applied;
  auto note = [&](const char* name, auto v) { absl::StrAppend(&applied, " ", name, " ", v); };
  if (g->temperature) note("temperature", *(d.temperature = static_cast<float>(*g->temperature)));
  if (g->top_p) note("top_p", *(d.top_p = static_cast<float>(*g->top_p)));
  if (g->top_k) note("top_k", *(d.top_k = *g->top_k));
  if (g->min_p) note("min_p", *(d.min_p = static_cast<float>(*g->min_p)));
  if (g->repetition_penalty)
    note("repetition_penalty",
         *(d.repetition_penalty = static_cast<float>(*g->repetition_penalty)));
  if (!applied.empty()) {
    std::fprintf(stderr,
                 "pagedserve serve: default sampling parameters from %s/generation_config.json "
                 "(--generation-config vllm turns them off):%s\n",
                 folder.c_str(), applied.c_str());
  }
  return d;
}

absl::StatusOr<HttpServerOptions> HttpOptionsFromFlags(const std::string& model_path) {
  HttpServerOptions h;
  absl::StatusOr<openai::SamplingDefaults> defaults = SamplingDefaultsFromFlags(model_path);
  if (!defaults.ok()) return defaults.status();
  h.sampling_defaults = *defaults;
  h.host = absl::GetFlag(FLAGS_host);
  h.port = absl::GetFlag(FLAGS_port);
  if (h.port < -1 || h.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--port must be in [-1, 65535], got ", h.port));
  }
  h.api_key = absl::GetFlag(FLAGS_api_key);
  if (h.api_key.empty()) {
    if (const char* env = std::getenv("PAGEDSERVE_API_KEY")) h.api_key = env;
  }
  h.served_model_name = absl::GetFlag(FLAGS_served_model_name);
  if (h.served_model_name.empty()) h.served_model_name = DefaultServedModelName(model_path);
  h.log_requests = !absl::GetFlag(FLAGS_disable_log_requests);
  h.log_request_content = absl::GetFlag(FLAGS_log_request_content);
  h.ssl_certfile = absl::GetFlag(FLAGS_ssl_certfile);
  h.ssl_keyfile = absl::GetFlag(FLAGS_ssl_keyfile);
  h.ssl_ca_certs = absl::GetFlag(FLAGS_ssl_ca_certs);
  h.ssl_cert_reqs = absl::GetFlag(FLAGS_ssl_cert_reqs);
  const int64_t body = absl::GetFlag(FLAGS_max_request_body_bytes);
  if (body < 64 || body > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-request-body-bytes must be in [64, 2^30], got ", body));
  }
  h.max_request_body_bytes = static_cast<size_t>(body);
  const double timeout = absl::GetFlag(FLAGS_http_timeout);
  if (!(timeout > 0 && timeout <= 3600)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-timeout must be in (0, 3600], got ", timeout));
  }
  h.read_timeout = h.write_timeout = absl::Seconds(timeout);
  const double keep_alive = absl::GetFlag(FLAGS_http_keep_alive_timeout);
  if (!(keep_alive > 0 && keep_alive <= 86400)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-keep-alive-timeout must be in (0, 86400], got ", keep_alive));
  }
  h.keep_alive_timeout = absl::Seconds(keep_alive);
  h.io_threads = absl::GetFlag(FLAGS_http_io_threads);
  if (h.io_threads < 1 || h.io_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-io-threads must be in [1, 64], got ", h.io_threads));
  }
  return h;
}

// A ZeroMQ endpoint that only this host can reach: tcp on a 127.x.y.z or ::1
// address or "localhost", or a transport that is not a network (ipc, inproc).
bool IsLoopbackEndpoint(std::string_view endpoint) {
  if (!endpoint.starts_with("tcp://")) return true;
  std::string_view host = endpoint.substr(6);
  if (host.starts_with("[")) {
    host = host.substr(1, host.find(']') == std::string_view::npos ? 0 : host.find(']') - 1);
    return host == "::1";
  }
  host = host.substr(0, host.rfind(':'));
  return host.starts_with("127.") || host == "localhost";
}

absl::StatusOr<ServeOptions> ServeOptionsFromFlags(const std::string& model_path) {
  ServeOptions so;
  ServerOptions& o = so.zmq;
  o.endpoint = absl::GetFlag(FLAGS_zmq_endpoint);
  const int64_t max_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  if (max_bytes < 64 || max_bytes > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-message-bytes must be in [64, 2^30], got ", max_bytes));
  }
  o.max_message_bytes = static_cast<size_t>(max_bytes);
  so.loop.max_queue_len = absl::GetFlag(FLAGS_max_queue_len);
  if (so.loop.max_queue_len < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-queue-len must be >= 1, got ", so.loop.max_queue_len));
  }
  const double grace = absl::GetFlag(FLAGS_shutdown_grace);
  if (!(grace >= 0))
    return absl::InvalidArgumentError(absl::StrCat("--shutdown-grace must be >= 0, got ", grace));
  so.loop.shutdown_grace = absl::Seconds(grace);
  o.heartbeat_interval_ms = absl::GetFlag(FLAGS_zmq_heartbeat_interval_ms);
  o.heartbeat_timeout_ms = absl::GetFlag(FLAGS_zmq_heartbeat_timeout_ms);
  if (o.heartbeat_interval_ms < 0 || o.heartbeat_timeout_ms < 0) {
    return absl::InvalidArgumentError(
        "--zmq-heartbeat-interval-ms and --zmq-heartbeat-timeout-ms must be >= 0");
  }
  o.curve.secret_key_file = absl::GetFlag(FLAGS_zmq_curve_secret_key_file);
  o.curve.authorized_clients_dir = absl::GetFlag(FLAGS_zmq_curve_authorized_clients);
  if (!o.curve.authorized_clients_dir.empty() && !o.curve.enabled()) {
    return absl::InvalidArgumentError(
        "--zmq-curve-authorized-clients needs --zmq-curve-secret-key-file (CURVE is off without it)");
  }
  o.log_requests = !absl::GetFlag(FLAGS_disable_log_requests);
  o.log_request_content = absl::GetFlag(FLAGS_log_request_content);
  const int32_t port = absl::GetFlag(FLAGS_metrics_port);
  if (port > 0 && absl::StrContains(absl::GetFlag(FLAGS_metrics_host), ':')) {
    // prometheus-cpp's civetweb (Debian's) is built without IPv6: it failed
    // with "null context when constructing CivetServer".
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-host must be an IPv4 address or host name (the metrics server has no IPv6), "
        "got '",
        absl::GetFlag(FLAGS_metrics_host), "'; /metrics on the HTTP API takes IPv6"));
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-port must be in [0, 65535], got ", port));
  }
  PS_ASSIGN_OR_RETURN(so.default_seed, SeedFromFlags());
  const double stats_interval = absl::GetFlag(FLAGS_log_stats_interval);
  // At least 10 ms: a smaller interval only floods the log (1e-9 wrote 9 MB in 5 s).
  if (!(stats_interval >= 0.01 && stats_interval <= 86400)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log-stats-interval must be in [0.01, 86400] seconds, got ", stats_interval));
  }
  if (!absl::GetFlag(FLAGS_disable_log_stats)) {
    so.log_stats_interval = absl::Seconds(stats_interval);
  }
  PS_ASSIGN_OR_RETURN(so.http, HttpOptionsFromFlags(model_path));
  so.http_enabled = so.http.port >= 0;
  if (so.http_enabled && !so.http.api_key.empty() && !o.curve.enabled() &&
      !IsLoopbackEndpoint(o.endpoint)) {
    spdlog::warn(
        "--api-key protects the HTTP API only: the ZeroMQ front end on {} listens beyond "
        "loopback without CurveZMQ, so any host that reaches it is served without a key "
        "(add --zmq-curve-secret-key-file and --zmq-curve-authorized-clients, or bind ZeroMQ to "
        "127.0.0.1)",
        o.endpoint);
  }
  return so;
}

// The HTTP API holds one descriptor per connection (no thread: --http-io-threads
// serve them all): the soft descriptor limit is raised towards the hard one (as
// Go's runtime does, at most 65,536), so a default of 1024 does not cap the
// connections.
void RaiseDescriptorLimit() {
  if (rlimit nofile{}; getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur != RLIM_INFINITY &&
                       nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, 65536);
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) {
      spdlog::warn("cannot raise the descriptor limit: {}", std::strerror(errno));
    }
  }
}

// Rank 0 (or the only process), in the order RunCoordinator calls its phases:
// Load (tokenizer, chat template, metrics registry), StartHttp (the HTTP API
// answers 503 on the model routes, /health "loading", while the model loads
// and the workers start), StartEngine (executor over the workers, engine,
// engine loop), Serve (the front ends on their own threads, the engine loop on
// this one: it calls the executor, and MPI is initialized FUNNELED), then
// StopWorkers. Members are destroyed in reverse order: the ZeroMQ server
// before the loop and the engine, the HTTP server after them.
class CoordinatorRank {
 public:
  CoordinatorRank(const LaunchInfo& info, const ModelSetup& setup, const ServeOptions& options)
      : info_(info), setup_(setup), options_(options) {}

  // Each phase below returns 0 to go on, or the exit code after printing why.
  int Load() {
    absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadTokenizer(setup_.worker.model_path);
    if (!tokenizer.ok()) {
      PrintError(tokenizer.status());
      return 1;
    }
    tokenizer_ = *std::move(tokenizer);
    if (const std::string name = absl::GetFlag(FLAGS_tool_call_parser); !name.empty()) {
      absl::StatusOr<ToolCallFormat> format = ToolCallFormatFromName(name);
      if (!format.ok()) {
        PrintError(format.status());
        return 1;
      }
      tool_call_parser_ = *format;
    }
    absl::StatusOr<ChatTemplate> ct = ChatTemplateFromFlags(*tokenizer_);
    if (ct.ok()) {
      chat_template_ = *std::move(ct);
    } else if (!absl::GetFlag(FLAGS_chat_template).empty()) {
      PrintError(ct.status());  // the template asked for must work
      return 1;
    } else {
      std::fprintf(stderr,
                   "pagedserve serve: no chat template (%s): 'messages' requests will be refused\n",
                   std::string(ct.status().message()).c_str());
    }
    // One registry, served on --metrics-port (if any) and on the HTTP API's /metrics.
    ServeMetricsOptions mo;
    mo.host = absl::GetFlag(FLAGS_metrics_host);
    mo.port = absl::GetFlag(FLAGS_metrics_port);
    mo.model = setup_.worker.model_path;
    mo.model_name = options_.http.served_model_name;  // also without an HTTP API
    mo.tensor_parallel_size = setup_.tensor_parallel_size;
    mo.block_size = setup_.worker.block_size;
    mo.max_model_len = setup_.scheduler.max_model_len;
#ifdef PAGEDSERVE_WITH_CUDA
    mo.backend = "cuda";
#else
    mo.backend = "cpu";
#endif
    mo.extra_labels["max_num_seqs"] = std::to_string(setup_.scheduler.max_num_seqs);
    absl::StatusOr<std::shared_ptr<Metrics>> m = CreateServeMetrics(mo);
    if (!m.ok()) {
      PrintError(m.status());
      return 1;
    }
    metrics_ = *std::move(m);
    return 0;
  }

  int StartHttp() {
    if (!options_.http_enabled) return 0;
    HttpServerOptions ho = options_.http;
    RaiseDescriptorLimit();
    if (metrics_ != nullptr) {
      ho.on_response = [m = metrics_.get()](int status) { RecordHttpResponse(*m, status); };
    }
    absl::StatusOr<std::unique_ptr<HttpServer>> h = HttpServer::Create(ho);
    if (!h.ok()) {
      PrintError(h.status());
      return 1;
    }
    http_ = *std::move(h);
    {
      StopSignalsBlocked blocked;
      http_->Start();
    }
    std::fprintf(stderr,
                 "pagedserve serve: HTTP API on %s://%s:%d (model '%s'; 503 until the model is "
                 "loaded)\n",
                 options_.http.ssl_certfile.empty() ? "http" : "https", options_.http.host.c_str(),
                 http_->port(), options_.http.served_model_name.c_str());
    std::fflush(stderr);
    return 0;
  }

  int StartEngine() {
    absl::StatusOr<std::unique_ptr<Executor>> executor =
        info_.world_size > 1
            ? MakeMpiExecutor(info_, setup_.scheduler.block_size, setup_.worker_startup_timeout,
                              setup_.worker_step_timeout)
            : CreateLocalExecutor(setup_.worker);
    if (!executor.ok()) {
      PrintError(executor.status());
      return 1;
    }
    exec_ = executor->get();
    EngineOptions options;
    options.scheduler = setup_.scheduler;
    options.require_cache_salt = absl::GetFlag(FLAGS_require_cache_salt);
    options.default_seed = options_.default_seed;
    options.fit_max_model_len = setup_.fit_max_model_len;
    absl::StatusOr<std::unique_ptr<Engine>> engine =
        Engine::Create(options, tokenizer_.get(), *std::move(executor),
                       EosTokenIds(setup_.model, *tokenizer_), metrics_.get());
    if (!engine.ok()) {
      exec_ = nullptr;  // destroyed with the executor Engine::Create was given
      PrintError(engine.status());
      return engine.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
    }
    engine_ = *std::move(engine);
    if (std::string note = MaxModelLenNote(setup_, engine_->scheduler_config()); !note.empty()) {
      std::fprintf(stderr, "pagedserve serve: %s\n", note.c_str());
    }
    loop_ = std::make_unique<EngineLoop>(engine_.get(), options_.loop);
    return 0;
  }

  // The ZeroMQ front end, the HTTP API's backend and the engine loop until a
  // stop signal (or an engine error). Returns the exit code so far.
  int Serve() {
    if (absl::Status s = CreateZmqServer(); !s.ok()) {
      PrintError(s);
      return 1;
    }
    std::atomic<bool> zmq_stop{false};
    absl::Status zmq_status;
    std::thread zmq_thread;
    {
      StopSignalsBlocked blocked;
      zmq_thread = std::thread([&] { zmq_status = server_->Run(zmq_stop); });
    }
    AttachHttpBackend();
    PrintServing();
    std::unique_ptr<StatsLogger> stats_logger;  // stopped before the front ends
    if (options_.log_stats_interval) {
      StopSignalsBlocked blocked;
      stats_logger = std::make_unique<StatsLogger>(loop_.get(), *options_.log_stats_interval);
    }
    // The front ends stop once: after Run, or from the loss watcher below.
    std::once_flag front_ends_stopped;
    auto stop_front_ends = [&] {
      std::call_once(front_ends_stopped, [&] {
        zmq_stop.store(true);
        zmq_thread.join();
        if (http_ != nullptr) http_->Stop();
      });
    };
    std::atomic<bool> watch_stop{false};
    std::thread watcher;
    if (info_.world_size > 1) {
      StopSignalsBlocked blocked;
      watcher = std::thread([&] { WatchForLostWorkers(watch_stop, stop_front_ends); });
    }
    absl::Status s = loop_->Run(g_stop, g_abort_now);
    stats_logger.reset();
    watch_stop.store(true);
    if (watcher.joinable()) watcher.join();
    // Every request has had its final output: let the front ends send them and stop.
    stop_front_ends();
    if (!s.ok()) {
      PrintError(s);
      // An engine step error means the executor is unusable (dead rank, timeout).
      executor_failed_ = true;
      return 1;
    }
    if (!zmq_status.ok()) {
      PrintError(zmq_status);
      return 1;
    }
    return 0;
  }

  // Stops the HTTP API and, unless the executor failed, the workers (executor
  // Shutdown). Returns the final exit code; *workers_stopped: the worker ranks
  // ended cleanly.
  int StopWorkers(int rc, bool* workers_stopped) {
    if (http_ != nullptr) http_->Stop();
    if (!executor_failed_) {
      if (absl::Status s = exec_->Shutdown(); !s.ok()) {
        PrintError(s);
        if (rc == 0) rc = 1;
      } else {
        *workers_stopped = true;
      }
    }
    if (rc == 0) std::fprintf(stderr, "pagedserve serve: stopped\n");
    return rc;
  }

 private:
  absl::Status CreateZmqServer() {
    StopSignalsBlocked blocked;  // the CURVE authenticator's ZAP thread is started here
    ServerOptions zo = options_.zmq;
    zo.tool_call_parser = tool_call_parser_;
    if (metrics_ != nullptr) {
      zo.on_handshake_failed = [m = metrics_.get()](std::string_view reason) {
        RecordFailedHandshake(*m, reason);
      };
    }
    PS_ASSIGN_OR_RETURN(server_, Server::Create(zo, loop_.get(), chat_template_));
    return absl::OkStatus();
  }

  // From here on the HTTP API's model routes answer (no more 503).
  void AttachHttpBackend() {
    if (http_ == nullptr) return;
    auto backend = std::make_unique<HttpBackend>();
    backend->loop = loop_.get();
    backend->chat_template = chat_template_;
    backend->tool_call_parser = tool_call_parser_;
    backend->metrics_text = [m = metrics_.get()] { return SerializeServeMetrics(*m); };
    http_->Attach(std::move(backend));
  }

  void PrintServing() {
    const SchedulerConfig& sc = engine_->scheduler_config();
    // Which LongRoPE factor set the workers chose (SelectLongRopeFactors).
    std::string rope;
    if (const RopeScaling& rs = setup_.model.rope_scaling;
        rs.type == RopeScaling::Type::kLongRope) {
      const bool use_long = setup_.worker.max_model_len > rs.original_max_position_embeddings;
      rope = absl::StrCat(", LongRoPE ", use_long ? "long" : "short",
                          " factors: requested max_model_len ", setup_.worker.max_model_len,
                          use_long ? " > " : " <= ", rs.original_max_position_embeddings);
      // The set is fixed before the KV pool is sized; say when the fit made
      // the short one the better choice.
      if (use_long && sc.max_model_len <= rs.original_max_position_embeddings)
        absl::StrAppend(&rope, "; the pool holds only ", sc.max_model_len,
                        " tokens: --max-model-len ", sc.max_model_len, " gives the short set");
    }
    std::fprintf(stderr,
                 "pagedserve serve: serving %s on %s (ranks %d, KV blocks %d x %d tokens, "
                 "KV cache dtype %s, max_model_len %d%s%s)\n",
                 setup_.worker.model_path.c_str(), server_->endpoint().c_str(), info_.world_size,
                 sc.num_device_blocks, sc.block_size,
                 kernels::DTypeName(ResolveKvCacheDType(setup_.worker, &setup_.model)),
                 sc.max_model_len, rope.c_str(),
                 MetricsListeningPort(*metrics_) > 0
                     ? absl::StrCat(", metrics on port ", MetricsListeningPort(*metrics_)).c_str()
                     : "");
    std::fflush(stderr);
  }

  // Loss watcher (ranks on other processes; runs on its own thread until
  // `stop`): the engine thread is the only one that calls MPI, and once a
  // worker died an MPI call can block it for good (OpenMPI 4.1 over TCP, seen
  // after `kill -9` of a worker: no step error until mpirun's SIGKILL 6 s
  // later, the client never told). When the liveness links report a lost
  // worker while requests are in flight and the engine has not failed them
  // within kEngineReportGrace, this thread fails them (EngineLoop::FailAll, no
  // MPI), lets the front ends send the replies and ends the process
  // (_exit(1)): mpirun then stops the other ranks, and the workers see the
  // liveness links close.
  void WatchForLostWorkers(const std::atomic<bool>& stop,
                           const std::function<void()>& stop_front_ends) {
    constexpr auto kEngineReportGrace = std::chrono::seconds(1);
    // Time for ZeroMQ's I/O thread to write the replies queued by the
    // front end before the process ends (its sockets have linger 0).
    constexpr auto kReplyFlush = std::chrono::milliseconds(300);
    // Since when a loss with requests in flight is seen (a plain time point
    // and flag: GCC 12 warns about std::optional here, -Wmaybe-uninitialized).
    bool losing = false;
    std::chrono::steady_clock::time_point lost_since{};
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      absl::Status lost = CheckWorkerLiveness();
      const EngineSnapshot snap = loop_->Snapshot();
      if (lost.ok() || snap.failed || snap.in_flight == 0) {
        losing = false;
        continue;
      }
      const auto now = std::chrono::steady_clock::now();
      if (!losing) {
        losing = true;
        lost_since = now;
      }
      if (now - lost_since < kEngineReportGrace) continue;
      const int64_t failed = loop_->FailAll(lost);
      std::fprintf(stderr,
                   "pagedserve serve: %s; the engine thread did not fail the requests "
                   "within 1s (blocked in MPI): %lld failed from the loss watcher; exiting\n",
                   std::string(lost.message()).c_str(), static_cast<long long>(failed));
      std::fflush(stderr);
      stop_front_ends();
      std::this_thread::sleep_for(kReplyFlush);
      std::fflush(nullptr);
      _exit(1);
    }
  }

  const LaunchInfo info_;
  const ModelSetup& setup_;
  const ServeOptions& options_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::optional<ChatTemplate> chat_template_;
  std::optional<ToolCallFormat> tool_call_parser_;
  std::shared_ptr<Metrics> metrics_;
  std::unique_ptr<HttpServer> http_;
  Executor* exec_ = nullptr;  // owned by engine_
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<EngineLoop> loop_;
  std::unique_ptr<Server> server_;
  bool executor_failed_ = false;
};

// Rank 0 (or the only process): the phases of CoordinatorRank.
// *workers_stopped: the worker ranks ended cleanly (always true without mpirun).
int RunCoordinator(const LaunchInfo& info, const ModelSetup& setup,
                   const ServeOptions& serve_options, bool* workers_stopped) {
  *workers_stopped = info.world_size == 1;
  CoordinatorRank coordinator(info, setup, serve_options);
  if (int rc = coordinator.Load(); rc != 0) return rc;
  if (int rc = coordinator.StartHttp(); rc != 0) return rc;
  if (int rc = coordinator.StartEngine(); rc != 0) return rc;
  const int rc = coordinator.Serve();
  return coordinator.StopWorkers(rc, workers_stopped);
}

}  // namespace

int ServeCommand(const Args& args) {
  if (absl::Status s = ApplyModelArgument(args); !s.ok()) {
    PrintError(s);
    return 2;
  }
  std::vector<std::string> storage(args.begin(), args.begin() + 1);
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
  if (info->coordinator()) {
    InstallSignals(OnStopSignal);
    // A write to a client that hung up must fail with EPIPE (and abort its
    // request), not kill the server, whatever library writes it.
    signal(SIGPIPE, SIG_IGN);
  } else {
    // Workers stop when the coordinator shuts them down.
    InstallSignals(SIG_IGN);
  }
  absl::StatusOr<ModelSetup> setup = ModelSetupFromFlags();
  absl::StatusOr<ServeOptions> server_options =
      setup.ok() ? ServeOptionsFromFlags(setup->worker.model_path)
                 : absl::StatusOr<ServeOptions>(setup.status());
  absl::Status flags_status = !setup.ok() ? setup.status() : server_options.status();
  if (flags_status.ok()) flags_status = CheckWorldSize(*info, setup->tensor_parallel_size);
  if (!flags_status.ok()) {
    if (info->coordinator()) PrintError(flags_status);
    FinalizeMpi();
    return flags_status.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  if (!info->coordinator()) {
    const int rc = RunWorkerRank(*info, setup->worker);
    FinalizeMpi(rc != 0, rc);
    return rc;
  }
  const std::string pid_file = absl::GetFlag(FLAGS_pid_file);
  if (!pid_file.empty()) {
    std::ofstream out(pid_file);
    out << getpid() << "\n";
    out.close();
    if (!out) {
      PrintError(absl::InvalidArgumentError(absl::StrCat(
          "--pid-file ", pid_file, ": cannot write the process id: ", std::strerror(errno))));
      FinalizeMpi(/*abort=*/true, 2);  // workers wait for plans: stop them too
      return 2;
    }
  }
  bool workers_stopped = false;
  const int rc = RunCoordinator(*info, *setup, *server_options, &workers_stopped);
  if (!pid_file.empty()) std::remove(pid_file.c_str());
  // Worker ranks wait for plans until the executor shuts them down; when it
  // could not, abort the job instead of hanging.
  FinalizeMpi(!workers_stopped, rc == 0 ? 1 : rc);
  return rc;
}

}  // namespace pagedserve::cli
