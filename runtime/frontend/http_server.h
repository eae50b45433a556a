// The HTTP front end of the coordinator: the OpenAI-compatible API
// (openai_api.h, docs/http.md) on Boost.Beast over Boost.Asio (HTTP/1.1),
// beside the ZeroMQ server.
//
// Routes: POST /v1/completions, POST /v1/chat/completions (JSON or
// Server-Sent Events), GET /v1/models, GET /health, GET /version,
// POST /tokenize, POST /detokenize, GET /metrics, GET /openapi.json.
//
// Threads: a fixed pool of `io_threads` threads runs one asio::io_context;
// every connection is an asynchronous state machine on a strand of it (read
// a request with beast::http::request_parser, run the route, write the
// response, wait for the next request), so connections cost memory, not
// threads, and no thread ever blocks on a client or on the engine. No route
// touches the Engine: generation goes through EngineLoop::Submit / Abort and
// the request's RequestChannel, whose on_push callback (engine thread) posts
// to the connection's strand, which then pops the outputs; health / models /
// metrics read EngineLoop::Snapshot() or the metrics registry, so they never
// wait for an engine step. The backend (engine loop, chat template, metrics)
// is published once by Attach() through an atomic pointer; before that every
// route except /health, /version, /openapi.json and /metrics answers 503
// (loading).
//
// Deadlines: a request (request line, headers, body) must arrive whole within
// `read_timeout` from its first byte (408 after it), each response write
// within `write_timeout`, and an idle keep-alive connection sends the first
// byte of its next request within `keep_alive_timeout` (closed otherwise).
//
// Disconnects: while a generation runs, the connection waits for its socket
// to turn readable; a peer that closed (POLLRDHUP / HUP / ERR) or a failed
// write aborts the request, whose KV blocks the engine frees in its next step.
// SSE backpressure: the next chunk is written when the previous write has
// completed; events produced meanwhile are coalesced into one pending buffer,
// and a client more than max_pending_stream_bytes behind has its request
// aborted and its connection closed.
//
// Security: with a non-empty api_key every /v1/* route and /tokenize,
// /detokenize need "Authorization: Bearer <key>" (401 otherwise), compared in
// constant time; /health, /version, /metrics and /openapi.json stay open.
// With ssl_certfile / ssl_keyfile the server speaks only HTTPS (asio::ssl on
// OpenSSL, the same state machine over an ssl::stream), with ssl_ca_certs /
// ssl_cert_reqs it also checks client certificates (mutual TLS);
// docs/security.md.
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_HTTP_SERVER_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_HTTP_SERVER_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/frontend/openai_api.h"
#include "runtime/frontend/tool_calls.h"
#include "runtime/tokenizer/chat_template.h"

namespace pagedserve {

class EngineLoop;

// The request line and headers of one request together: beyond this many
// bytes the server answers 431 (RFC 6585 5) and closes the connection
// (Beast's request_parser header_limit). 64 KiB is above what browsers and SDKs send (nginx's
// default allows 33 KiB) and bounds what a connection can make the server hold before any route
// runs.
inline constexpr size_t kMaxRequestHeadBytes = 64 << 10;

// A streaming (SSE) response whose client reads slower than the engine
// produces: events wait in one pending buffer while the previous write is in
// flight; beyond this many pending bytes the request is aborted and the
// connection closed (a slow reader cannot grow the server's memory). 1 MiB is
// thousands of ordinary token events (a few hundred with top-20 logprobs).
inline constexpr size_t kMaxPendingStreamBytes = 1 << 20;

struct HttpServerOptions {
  std::string host = "127.0.0.1";                    // --host
  int port = 8000;                                   // --port; 0 picks a free port (see port())
  std::string api_key;                               // --api-key / PAGEDSERVE_API_KEY; empty = open
  std::string served_model_name;                     // --served-model-name
  openai::SamplingDefaults sampling_defaults;        // --generation-config
  size_t max_request_body_bytes = 1 << 20;           // --max-request-body-bytes: 413 beyond
  absl::Duration read_timeout = absl::Seconds(30);   // request line, headers and body
  absl::Duration write_timeout = absl::Seconds(30);  // a client that stops reading
  absl::Duration keep_alive_timeout = absl::Seconds(5);  // idle keep-alive connections
  // SSE backpressure bound per stream (see kMaxPendingStreamBytes): the events
  // that may wait behind a write in flight before the request is aborted.
  size_t max_pending_stream_bytes = kMaxPendingStreamBytes;
  // --http-io-threads: the threads that run every connection (1..64). They
  // never block on a client or the engine; a route's own work (parsing,
  // chat template, tokenizing) runs on them.
  int io_threads = 2;
  bool log_requests = true;          // --disable-log-requests: false (request_log.h)
  bool log_request_content = false;  // --log-request-content: prompt and text too
  // TLS (HTTPS) with these PEM files (certificate chain, private key); both or
  // neither. Read once by Create; InvalidArgument when unreadable or not a
  // matching pair.
  std::string ssl_certfile;  // --ssl-certfile
  std::string ssl_keyfile;   // --ssl-keyfile
  // Mutual TLS, with uvicorn's / vLLM's names and values: ssl_cert_reqs is
  // Python's ssl.VerifyMode, 0 CERT_NONE (no client certificate asked for),
  // 1 CERT_OPTIONAL (a client may present none; one it presents must verify
  // against ssl_ca_certs), 2 CERT_REQUIRED (the handshake fails without a
  // certificate that verifies). ssl_ca_certs: PEM file of the CA certificates
  // that sign client certificates; needs ssl_certfile, and ssl_cert_reqs 1 or 2
  // needs it. InvalidArgument otherwise, or when the file does not load.
  std::string ssl_ca_certs;  // --ssl-ca-certs
  int ssl_cert_reqs = 0;     // --ssl-cert-reqs
  std::string version = "0.1.0";
  // Called once per response written, with its status code, on an I/O
  // thread (so it must be thread-safe; 499 for a non-streaming request whose
  // client went away before its answer): the serve command counts
  // them in pagedserve_http_responses_total. Empty: not called.
  std::function<void(int status)> on_response;
};

// What the routes need once the model is loaded. Not owned; must outlive the
// server's Stop().
struct HttpBackend {
  EngineLoop* loop = nullptr;
  std::optional<ChatTemplate> chat_template;
  // --tool-call-parser; none: chosen from the chat template's markers.
  std::optional<ToolCallFormat> tool_call_parser;
  std::function<std::string()> metrics_text;  // Prometheus text; empty: /metrics 404
};

// Thread safety: Create, Start, Attach and Stop are called by one owner thread;
// the connections run on the I/O threads and share only the atomically
// published backend and the counter of request ids (atomic).
class HttpServer {
 public:
  // Binds host:port. Errors: InvalidArgument (bad options), Unavailable (the
  // address cannot be bound), naming host and port.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Create(const HttpServerOptions& options);
  ~HttpServer();  // Stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;
  // Starts the I/O threads (503 on model routes until Attach).
  void Start();
  // Publishes the backend: from now on the API routes serve. Call once.
  void Attach(std::unique_ptr<HttpBackend> backend);
  // Stops accepting, lets responses whose final output already came finish
  // (at most a second), ends the connections and joins the threads. Requests
  // still waiting for output are aborted through the loop (which must still
  // exist). Idempotent.
  void Stop();

 private:
  struct Impl;
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Constant-time comparison: the time depends only on the lengths of `a` and
// `b` combined, never on where they first differ (no early exit on a length
// mismatch either). For API keys. `bytes_compared`, when given, receives the
// number of byte positions the loop visited: always max(|a|, |b|) (tests check
// that no input makes it stop early).
bool ConstantTimeEquals(std::string_view a, std::string_view b, size_t* bytes_compared = nullptr);

// The credentials of an "Authorization: Bearer <token>" header value: the
// scheme matched case-insensitively (RFC 9110 11.1: "bearer", "BEARER"), one or
// more spaces, then the rest; empty for another scheme or no credentials. A view
// into `authorization`.
std::string_view BearerToken(std::string_view authorization);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_HTTP_SERVER_H_
