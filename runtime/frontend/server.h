// The ZeroMQ front end of the coordinator: protocol v1 (docs/protocol.md) on a
// ROUTER socket, joined with the Engine.
//
// Threading: Run() runs on the front end's own thread (not the engine's). It
// polls the ROUTER socket, the socket monitor and an eventfd that the engine
// thread signals when it pushes outputs into a request's RequestChannel
// (engine_loop.h); it parses messages, submits requests to the EngineLoop and
// sends the outputs. The ZeroMQ sockets and every member of the server are
// used only by the thread that calls Run() (Create may run on another thread
// before). health and stats are answered from EngineLoop::Snapshot() and never
// wait for an engine step.
//
// Clients: any number of DEALER sockets, each with any number of requests in
// flight. A request is keyed by (ROUTER routing id of the connection, client's
// request id); the engine request id is "<hex routing id>/<client id>", so two
// clients may use the same ids.
//
// Message framing: after the routing id the ROUTER must see exactly one frame
// (one JSON object). Any other frame count (a REQ-style empty delimiter, a
// multipart message) is answered with an `invalid_request` error and dropped.
// ZeroMQ delivers multipart messages atomically, so a client that sends half a
// multipart message and stops is never seen by the server (it blocks no one);
// if it later completes it, the whole message is answered with that error.
//
// Limits:
//  - message size: a frame over `max_message_bytes` (default 1 MiB) is answered
//    with `message_too_large` without being parsed. ZMQ_MAXMSGSIZE is set to
//    max(16 MiB, 4 x max_message_bytes): a frame beyond that makes libzmq drop
//    the connection while reading it (memory bound), which then counts as a
//    disconnect (below). A 10 MB message thus gets a structured error.
//  - admission: the EngineLoop's one check (Engine::CheckRequest and the
//    waiting-queue bound): a full queue or a server shutting down is `busy`,
//    a prompt of max_model_len tokens or more `prompt_too_long` (prompt +
//    max_tokens beyond max_model_len is admitted and ends with `length` at
//    max_model_len, as in vLLM), other refusals `invalid_request`.
//
// Disconnects (a client that goes away or stops answering has its requests
// aborted and their KV blocks freed by the next step):
//  - The ROUTER socket is monitored (zmq_socket_monitor) for ACCEPTED and
//    DISCONNECTED events, which carry the connection's file descriptor, and
//    every received message's descriptor is read with ZMQ_SRCFD. A
//    DISCONNECTED event aborts the requests of the routing ids last seen on that
//    descriptor. Monitor events are drained after each receive and before the
//    message's descriptor is recorded, so the disconnect of an old connection
//    is applied before a new connection that reuses its descriptor is mapped.
//  - Silent clients: ZMTP heartbeats (ZMQ_HEARTBEAT_IVL / _TIMEOUT) make libzmq
//    close a connection whose peer stops answering PINGs (process frozen, host
//    gone, network cut) - which is then a DISCONNECTED event. libzmq answers
//    PINGs in its own I/O thread, so a client busy in its own code is not cut.
//  - Sends use ZMQ_ROUTER_MANDATORY without blocking: EHOSTUNREACH (the peer is
//    gone) aborts that client's requests; EAGAIN (the client does not read and
//    `send_high_water_mark` replies are queued for it) aborts them too, so a
//    stuck reader cannot make the server block or grow without bound.
//  Aborted requests of a vanished client end with finish_reason "abort"; their
//  replies are dropped.
//
// Authentication (optional, docs/security.md): with options.curve set the
// ROUTER socket is a CURVE server, and with an authorized-clients folder a ZAP
// handler thread (curve_auth.h) refuses unlisted client keys during the
// handshake; refused or failed handshakes never produce a message here, only
// a count (Counters::handshakes_failed, options.on_handshake_failed).
//
// Shutdown: the EngineLoop drains (`generate` -> `busy`, `health` unhealthy,
// grace period, aborts); Run() returns once `stop` is set and every request it
// admitted has had its final message. The caller sets `stop` after
// EngineLoop::Run returned.
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_SERVER_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_SERVER_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/frontend/curve_keys.h"
#include "runtime/frontend/tool_calls.h"
#include "runtime/tokenizer/chat_template.h"

namespace pagedserve {

class EngineLoop;

struct ServerOptions {
  // ZeroMQ endpoint to bind, e.g. "tcp://127.0.0.1:5555", "tcp://0.0.0.0:5555",
  // "ipc:///tmp/pagedserve.sock"; "tcp://127.0.0.1:*" picks a free port (see
  // Server::endpoint()).
  std::string endpoint = "tcp://127.0.0.1:5555";
  // --tool-call-parser; unset: the format the chat template's markers imply
  // (ToolCallFormatOfTemplate), as on the HTTP API.
  std::optional<ToolCallFormat> tool_call_parser;
  size_t max_message_bytes = 1 << 20;  // larger frames: message_too_large
  int idle_poll_ms = 50;               // poll timeout (how often `stop` is looked at)
  int max_messages_per_step = 4096;    // messages handled between two output deliveries
  // ZMTP heartbeats to every client; 0 disables them (disconnects of live
  // processes are still seen through TCP).
  int heartbeat_interval_ms = 2000;
  int heartbeat_timeout_ms = 10000;
  int send_high_water_mark = 100000;  // queued replies per client before it is cut
  // Request log (request_log.h): one line per finished request with ids,
  // token counts and timings; prompt and completion text only with
  // log_request_content (--log-request-content).
  bool log_requests = true;
  bool log_request_content = false;
  // CurveZMQ (curve_auth.h): off when curve.secret_key_file is empty.
  CurveServerOptions curve;
  // Called on the Run() thread for every connection whose handshake failed
  // (the socket monitor's ZMQ_EVENT_HANDSHAKE_FAILED_* events): reason "auth"
  // (the ZAP handler refused the client's key), "protocol" (wrong server key,
  // mechanism mismatch, malformed greeting) or "other". May be empty.
  std::function<void(std::string_view reason)> on_handshake_failed;
};

class Server {
 public:
  // Binds the socket. `loop` (not owned) must outlive the server. `chat_template` is the model's
  // (nullopt: `messages` prompts are answered with invalid_request).
  // Errors: InvalidArgument for bad options, Unavailable when the endpoint
  // cannot be bound (address in use, bad address), naming the endpoint.
  static absl::StatusOr<std::unique_ptr<Server>> Create(const ServerOptions& options,
                                                        EngineLoop* loop,
                                                        std::optional<ChatTemplate> chat_template);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // The bound endpoint with the actual port (ZMQ_LAST_ENDPOINT).
  const std::string& endpoint() const;

  // Serves until `stop` is true and every admitted request has had its final
  // message. Returns OK, or Internal on a ZeroMQ failure.
  absl::Status Run(const std::atomic<bool>& stop);

  // Read by the thread that runs Run() (or after it returned).
  struct Counters {
    int64_t messages = 0;     // received, well-formed or not
    int64_t errors_sent = 0;  // error replies
    int64_t requests_admitted = 0;
    int64_t requests_finished = 0;
    int64_t disconnect_aborts = 0;  // requests aborted because their client went away
    int64_t handshakes_failed = 0;  // connections refused in the handshake (CURVE)
  };
  const Counters& counters() const;

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_SERVER_H_
