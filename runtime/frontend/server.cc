#include "runtime/frontend/server.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <mutex>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "runtime/common/status_macros.h"
#include "runtime/engine/engine_loop.h"
#include "runtime/engine/output_accumulator.h"
#include "runtime/frontend/chat_messages.h"
#include "runtime/frontend/curve_auth.h"
#include "runtime/frontend/protocol.h"
#include "runtime/frontend/request_fields.h"
#include "runtime/frontend/request_log.h"
#include "runtime/frontend/tool_calls.h"
#include "spdlog/spdlog.h"
#include "zmq.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

namespace pagedserve {
namespace {

using protocol::ErrorCode;

// The protocol's per-token logprobs of a completion (or of its news).
std::vector<protocol::TokenLogprob> TokenLogprobs(const CompletionOutput& c) {
  std::vector<protocol::TokenLogprob> out;
  for (size_t i = 0; i < c.logprobs.size() && i < c.token_ids.size(); ++i) {
    protocol::TokenLogprob lp;
    lp.token_id = c.token_ids[i];
    lp.logprob = c.logprobs[i];
    if (i < c.top_token_ids.size()) lp.top_token_ids = c.top_token_ids[i];
    if (i < c.top_logprobs.size()) lp.top_logprobs = c.top_logprobs[i];
    out.push_back(std::move(lp));
  }
  return out;
}

}  // namespace

struct Server::Impl {
  // One generate request in flight.
  struct InFlight {
    InFlight(const std::string& engine_id, int32_t n) : output({engine_id}, n) {}
    std::string identity;   // ROUTER routing id of the client's connection
    std::string client_id;  // the client's request id
    bool stream = false;
    bool orphaned = false;                     // the client went away: replies are dropped
    OutputAccumulator output;                  // the n completions, usage, timings
    std::optional<std::string> logged_prompt;  // --log-request-content
    ToolFields tools;                          // tool calling: the request's fields
  };
  // A connection with requests in flight.
  struct Peer {
    int fd = -1;                           // ZMQ_SRCFD of its last message
    absl::flat_hash_set<std::string> ids;  // client request ids in flight
  };

  ServerOptions options;
  EngineLoop* loop = nullptr;
  std::optional<ChatTemplate> chat_template;
  zmq::context_t context{1};
  // Declared after the context and before the router: it outlives the ROUTER
  // socket (libzmq admits CURVE clients when no ZAP handler is bound).
  std::unique_ptr<CurveAuthenticator> curve_authenticator;
  zmq::socket_t router;
  zmq::socket_t monitor;
  std::string bound_endpoint;
  Counters counters;

  absl::flat_hash_map<std::string, InFlight> inflight;  // engine request id -> state
  absl::flat_hash_map<std::string, Peer> peers;         // routing id -> peer
  absl::flat_hash_set<int> closed_fds;                  // DISCONNECTED, not re-ACCEPTED
  // Outputs: the engine thread pushes into a request's channel, then (on_push)
  // appends the request id to `ready` and writes to `wake_fd`, which Run polls.
  int wake_fd = -1;
  std::mutex ready_mu;
  std::vector<std::string> ready;  // guarded by ready_mu
  absl::flat_hash_map<std::string, std::shared_ptr<RequestChannel>>
      channels;  // engine id -> channel

  ~Impl() {
    if (wake_fd >= 0) close(wake_fd);
  }

  void Notify(const std::string& eid) {
    {
      std::lock_guard<std::mutex> lock(ready_mu);
      ready.push_back(eid);
    }
    const uint64_t one = 1;
    (void)!write(wake_fd, &one, sizeof(one));
  }

  static std::string EngineId(const std::string& identity, const std::string& client_id) {
    return absl::StrCat(absl::BytesToHexString(identity), "/", client_id);
  }

  // ---------------------------------------------------------------- sending
  // Sends one reply frame to `identity`. A peer that is gone (EHOSTUNREACH) or
  // does not read (EAGAIN at the high-water mark) has its requests aborted.
  void Send(const std::string& identity, const std::string& payload) {
    if (peer_gone_guard_.contains(identity)) return;
    try {
      zmq::send_result_t r;
      while (true) {
        try {
          r = router.send(zmq::buffer(identity),
                          zmq::send_flags::sndmore | zmq::send_flags::dontwait);
          break;
        } catch (const zmq::error_t& e) {
          if (e.num() != EINTR) throw;
        }
      }
      if (!r.has_value()) {
        spdlog::warn(
            "frontend: client {} does not read its replies ({} queued); aborting its requests",
            absl::BytesToHexString(identity), options.send_high_water_mark);
        PeerGone(identity);
        return;
      }
      router.send(zmq::buffer(payload), zmq::send_flags::dontwait);
    } catch (const zmq::error_t& e) {
      if (e.num() == EHOSTUNREACH) {
        spdlog::info("frontend: client {} is gone (send: {}); aborting its requests",
                     absl::BytesToHexString(identity), e.what());
      } else {
        spdlog::warn("frontend: send to client {} failed: {}; aborting its requests",
                     absl::BytesToHexString(identity), e.what());
      }
      PeerGone(identity);
    }
  }

  void SendReply(const std::string& identity, const protocol::Reply& reply) {
    Send(identity, protocol::SerializeReply(reply));
  }

  void SendError(const std::string& identity, std::string_view id, ErrorCode code,
                 std::string_view message) {
    ++counters.errors_sent;
    Send(identity, protocol::ErrorMessage(id, code, message));
  }

  // ------------------------------------------------------------ disconnects
  // Aborts every request of a client that went away; their replies are dropped.
  void PeerGone(const std::string& identity) {
    auto it = peers.find(identity);
    if (it == peers.end()) return;
    for (const std::string& client_id : it->second.ids) {
      const std::string eid = EngineId(identity, client_id);
      auto f = inflight.find(eid);
      if (f == inflight.end() || f->second.orphaned) continue;
      f->second.orphaned = true;
      ++counters.disconnect_aborts;
      loop->Abort(eid);
    }
    // The peer entry stays until its requests' final outputs arrive (they are
    // dropped); a guard keeps further sends from retrying the dead socket.
    peer_gone_guard_.insert(identity);
  }

  // Drains the socket monitor: ACCEPTED reopens a descriptor, DISCONNECTED
  // aborts the requests of every peer last seen on it.
  void DrainMonitor() {
    while (true) {
      zmq::message_t event, address;
      std::optional<size_t> got;
      try {
        got = monitor.recv(event, zmq::recv_flags::dontwait);
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        throw;
      }
      if (!got.has_value()) return;
      if (event.more()) (void)monitor.recv(address);  // the endpoint frame
      if (event.size() < 6) continue;
      uint16_t kind;
      uint32_t value;
      std::memcpy(&kind, event.data(), 2);
      std::memcpy(&value, static_cast<const char*>(event.data()) + 2, 4);
      const int fd = static_cast<int>(value);
      if (kind & (ZMQ_EVENT_HANDSHAKE_FAILED_AUTH | ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                  ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)) {
        ++counters.handshakes_failed;
        const char* reason = kind == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH       ? "auth"
                             : kind == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ? "protocol"
                                                                           : "other";
        spdlog::debug("frontend: handshake failed ({}, code {})", reason, value);
        if (options.on_handshake_failed) options.on_handshake_failed(reason);
      } else if (kind == ZMQ_EVENT_ACCEPTED) {
        closed_fds.erase(fd);
      } else if (kind == ZMQ_EVENT_DISCONNECTED) {
        closed_fds.insert(fd);
        std::vector<std::string> gone;
        for (const auto& [identity, peer] : peers) {
          if (peer.fd == fd) gone.push_back(identity);
        }
        for (const std::string& identity : gone) {
          spdlog::info("frontend: client {} disconnected; aborting its requests",
                       absl::BytesToHexString(identity));
          PeerGone(identity);
        }
      }
    }
  }

  // ---------------------------------------------------------------- receiving
  // Receives one message without blocking. Returns false when none is waiting.
  bool ReceiveOne() {
    zmq::message_t identity_frame;
    std::optional<size_t> got;
    try {
      got = router.recv(identity_frame, zmq::recv_flags::dontwait);
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) return true;
      throw;
    }
    if (!got.has_value()) return false;
    ++counters.messages;
    const std::string identity = identity_frame.to_string();
    zmq::message_t payload;
    size_t frames = 0;
    int fd = -1;
    bool more = identity_frame.more();
    while (more) {
      zmq::message_t frame;
      // The rest of a multipart message is already here (delivery is atomic).
      while (true) {
        try {
          (void)router.recv(frame);
          break;
        } catch (const zmq::error_t& e) {
          if (e.num() != EINTR) throw;
        }
      }
      more = frame.more();
      if (frames == 0) {
        fd = frame.get(ZMQ_SRCFD);
        payload = std::move(frame);
      }
      ++frames;
    }
    // Apply disconnects seen so far before recording this message's descriptor.
    DrainMonitor();
    if (fd >= 0 && closed_fds.contains(fd)) {
      // Sent by a connection that is already gone: nobody would read the reply.
      return true;
    }
    peer_gone_guard_.erase(identity);  // a routing id that talks is alive
    if (auto it = peers.find(identity); it != peers.end()) it->second.fd = fd;

    if (frames != 1) {
      SendError(
          identity, "", ErrorCode::kInvalidRequest,
          absl::StrCat(
              "expected one frame (one JSON object) per message, got ", frames,
              frames == 0 ? "" : " (multipart messages and REQ envelopes are not supported)"));
      return true;
    }
    HandleMessage(identity, fd,
                  std::string_view(static_cast<const char*>(payload.data()), payload.size()));
    return true;
  }

  void HandleMessage(const std::string& identity, int fd, std::string_view bytes) {
    protocol::ParseOptions po;
    po.max_message_bytes = options.max_message_bytes;
    po.vocab_size = loop->tokenizer().vocab_size();
    po.priority_scheduling = loop->engine().scheduler_config().enable_priority;
    protocol::ParseResult parsed = protocol::ParseRequest(bytes, po);
    if (!parsed.ok()) {
      ++counters.errors_sent;
      SendReply(identity, parsed.error);
      return;
    }
    std::visit(
        [&](auto& request) {
          using T = std::decay_t<decltype(request)>;
          if constexpr (std::is_same_v<T, protocol::GenerateRequest>) {
            HandleGenerate(identity, fd, request);
          } else if constexpr (std::is_same_v<T, protocol::AbortRequest>) {
            HandleAbort(identity, request);
          } else if constexpr (std::is_same_v<T, protocol::HealthRequest>) {
            protocol::HealthReply reply;
            reply.id = request.id;
            reply.ok = loop->healthy();
            SendReply(identity, reply);
          } else {
            SendReply(identity, Stats(request.id));
          }
        },
        *parsed.request);
  }

  protocol::StatsReply Stats(const std::string& id) const {
    const EngineSnapshot s = loop->Snapshot();
    protocol::StatsReply r;
    r.id = id;
    r.num_waiting = s.scheduler.num_waiting + s.queued_adds;
    r.num_running = s.scheduler.num_running;
    r.num_swapped = s.scheduler.num_swapped;
    r.kv_blocks_total = s.kv_blocks_total;
    r.kv_blocks_used = s.kv_blocks_used;
    r.kv_usage = s.scheduler.device_kv_usage;
    r.max_num_seqs = s.max_num_seqs;
    r.max_model_len = s.max_model_len;
    r.max_waiting = s.max_queue_len;
    return r;
  }

  // Prompt -> token ids. Errors are sent; returns nullopt then.
  std::optional<std::vector<int32_t>> Tokenize(const std::string& identity,
                                               const protocol::GenerateRequest& g) {
    const Tokenizer& tok = loop->tokenizer();
    if (const auto* text = std::get_if<std::string>(&g.prompt)) {
      return tok.Encode(*text);
    }
    if (const auto* ids = std::get_if<std::vector<int32_t>>(&g.prompt)) return *ids;
    const auto& messages = std::get<std::vector<protocol::ChatMessage>>(g.prompt);
    std::vector<ChatMessage> chat;
    chat.reserve(messages.size());
    for (const auto& m : messages)
      chat.push_back(ChatMessage{m.role, m.content, m.tool_calls, m.tool_call_id, m.name});
    absl::StatusOr<std::vector<int32_t>> ids =
        EncodeChat(chat_template ? &*chat_template : nullptr, tok, chat, g.tools.tools_json,
                   g.chat_template_kwargs);
    if (!ids.ok()) {
      SendError(identity, g.id, ErrorCode::kInvalidRequest, std::string(ids.status().message()));
      return std::nullopt;
    }
    return *std::move(ids);
  }

  static ErrorCode CodeOf(const absl::Status& s) {
    switch (SubmitErrorKindOf(s)) {
      case SubmitErrorKind::kInvalidRequest: return ErrorCode::kInvalidRequest;
      case SubmitErrorKind::kPromptTooLong: return ErrorCode::kPromptTooLong;
      case SubmitErrorKind::kDuplicateId: return ErrorCode::kDuplicateId;
      case SubmitErrorKind::kBusy: return ErrorCode::kBusy;
      // Not "busy" (retrying here will not help): another replica should take it.
      case SubmitErrorKind::kUnavailable: return ErrorCode::kUnavailable;
      case SubmitErrorKind::kInternal: break;
    }
    return ErrorCode::kInternal;
  }

  void HandleGenerate(const std::string& identity, int fd, protocol::GenerateRequest& g) {
    if (auto it = peers.find(identity); it != peers.end() && it->second.ids.contains(g.id)) {
      SendError(identity, g.id, ErrorCode::kDuplicateId,
                absl::StrCat("request id '", g.id, "' is already in flight on this connection"));
      return;
    }
    std::optional<std::vector<int32_t>> ids = Tokenize(identity, g);
    if (!ids.has_value()) return;
    if (ids->empty()) {
      SendError(identity, g.id, ErrorCode::kInvalidRequest, "the prompt tokenizes to no tokens");
      return;
    }
    const std::string eid = EngineId(identity, g.id);
    EngineRequest er;
    er.request_id = eid;
    er.prompt_token_ids = *std::move(ids);
    er.params = g.sampling;
    er.max_tokens_is_default = !g.max_tokens_given;
    er.cache_salt = g.cache_salt;
    er.priority = g.priority;
    if (g.tools.parse_tool_calls()) {
      absl::StatusOr<StructuredOutput> c = ToolFieldsConstraint(g.tools, ToolFormat());
      if (!c.ok()) {
        SendError(identity, g.id, ErrorCode::kInvalidRequest, std::string(c.status().message()));
        return;
      }
      if (c->active()) er.params.structured_output = *std::move(c);
    }
    const int n = g.sampling.n;
    auto channel = std::make_shared<RequestChannel>([this, eid] { Notify(eid); });
    // The one admission check (Engine::CheckRequest, queue bound, shutdown).
    if (absl::Status s = loop->Submit(std::move(er), channel); !s.ok()) {
      SendError(identity, g.id, CodeOf(s), std::string(s.message()));
      return;
    }
    channels.emplace(eid, std::move(channel));
    InFlight f(eid, n);
    f.identity = identity;
    f.client_id = g.id;
    f.stream = g.stream;
    f.tools = g.tools;
    if (options.log_request_content) f.logged_prompt = DescribePrompt(g.prompt);
    inflight.emplace(eid, std::move(f));
    Peer& peer = peers[identity];
    peer.fd = fd;
    peer.ids.insert(g.id);
    ++counters.requests_admitted;
  }

  void HandleAbort(const std::string& identity, const protocol::AbortRequest& a) {
    const std::string eid = EngineId(identity, a.id);
    auto it = inflight.find(eid);
    if (it == inflight.end()) {
      SendError(identity, a.id, ErrorCode::kNotFound,
                absl::StrCat("no request with id '", a.id, "' is in flight on this connection"));
      return;
    }
    loop->Abort(eid);
    protocol::AbortReply reply;
    reply.id = a.id;
    SendReply(identity, reply);
  }

  // ------------------------------------------------------------------ outputs
  // Sends what the engine thread pushed since the last call.
  void DeliverReady() {
    uint64_t count;
    (void)!read(wake_fd, &count, sizeof(count));
    std::vector<std::string> ids;
    {
      std::lock_guard<std::mutex> lock(ready_mu);
      ids.swap(ready);
    }
    for (const std::string& eid : ids) {
      auto c = channels.find(eid);
      if (c == channels.end()) continue;
      std::shared_ptr<RequestChannel> channel = c->second;
      std::vector<EngineOutput> outputs;
      while (std::optional<EngineOutput> out = channel->TryPop()) {
        const bool finished = out->finished;
        outputs.push_back(*std::move(out));
        if (finished) {
          channels.erase(eid);
          break;
        }
      }
      Deliver(outputs);
    }
  }

  void Deliver(std::vector<EngineOutput>& outputs) {
    for (EngineOutput& out : outputs) {
      auto it = inflight.find(out.request_id);
      if (it == inflight.end()) {
        spdlog::warn("frontend: output for unknown request {}", out.request_id);
        continue;
      }
      InFlight& f = it->second;
      std::vector<CompletionNews> news;
      f.output.Apply(out, f.stream ? &news : nullptr);
      if (!f.orphaned && !news.empty()) SendReply(f.identity, DeltaOf(f.client_id, news));
      if (!out.finished) continue;
      if (!f.output.error().ok() && !f.output.produced_output()) {
        // Refused by the engine before it ran: an error reply, as at admission.
        // (A request that already streamed gets the final reply below, with
        // finish_reason error: EngineLoop::FailAll sends no deltas.)
        if (!f.orphaned) {
          SendError(f.identity, f.client_id, CodeOf(f.output.error()),
                    std::string(f.output.error().message()));
        }
        ForgetRequest(it);
        continue;
      }
      if (options.log_requests) {
        LogRequest(LogRecordOf("zmq", out.request_id, f.output, f.orphaned, f.logged_prompt));
      }
      if (!f.orphaned) SendReply(f.identity, FinalReplyOf(f));
      ++counters.requests_finished;
      ForgetRequest(it);
    }
  }

  static protocol::DeltaReply DeltaOf(const std::string& client_id,
                                      std::vector<CompletionNews>& news) {
    protocol::DeltaReply delta;
    delta.id = client_id;
    for (CompletionNews& item : news) {
      protocol::SequenceDelta sd;
      sd.index = item.choice;
      sd.logprobs = TokenLogprobs(item.delta);
      sd.text = std::move(item.delta.text);
      sd.token_ids = std::move(item.delta.token_ids);
      if (item.delta.finish_reason != FinishReason::kNone) {
        sd.finish_reason = item.delta.finish_reason;
      }
      delta.outputs.push_back(std::move(sd));
    }
    return delta;
  }

  // The final message: per sequence its finish reason (and, not streamed, its
  // text, ids and logprobs; with tools, its parsed calls), usage, the error.
  protocol::FinalReply FinalReplyOf(const InFlight& f) const {
    protocol::FinalReply reply;
    reply.id = f.client_id;
    reply.streamed = f.stream;
    const std::vector<CompletionOutput>& completions = f.output.completions();
    for (size_t i = 0; i < completions.size(); ++i) {
      const CompletionOutput& c = completions[i];
      protocol::SequenceFinal o;
      o.index = static_cast<int32_t>(i);
      o.finish_reason = c.finish_reason;
      o.cumulative_logprob = c.cumulative_logprob;
      if (!f.stream) {
        o.text = c.text;
        o.token_ids = c.token_ids;
        o.logprobs = TokenLogprobs(c);
      }
      if (f.tools.parse_tool_calls()) {
        ParsedToolCalls parsed = ParseToolCalls(ToolFormat(), c.text);
        if (!parsed.calls.empty()) {
          if (!f.tools.parallel_tool_calls) parsed.calls.resize(1);
          o.tool_calls = std::move(parsed.calls);
          if (!parsed.content.empty()) o.content = std::move(parsed.content);
        }
      }
      reply.outputs.push_back(std::move(o));
    }
    for (const PromptLogprob& p : f.output.prompt_logprobs(0)) {
      reply.prompt_logprobs.push_back(
          {p.token_id, p.logprob, p.rank, p.top_token_ids, p.top_logprobs});
    }
    reply.usage.prompt_tokens = f.output.usage().prompt_tokens;
    reply.usage.completion_tokens = f.output.usage().completion_tokens;
    reply.usage.cached_prompt_tokens = f.output.usage().cached_prompt_tokens;
    if (!f.output.error().ok()) reply.error_message = std::string(f.output.error().message());
    return reply;
  }

  ToolCallFormat ToolFormat() const {
    if (options.tool_call_parser.has_value()) return *options.tool_call_parser;
    return chat_template ? ToolCallFormatOfTemplate(chat_template->source())
                         : ToolCallFormat::kHermes;
  }

  void ForgetRequest(absl::flat_hash_map<std::string, InFlight>::iterator it) {
    const InFlight& f = it->second;
    if (auto p = peers.find(f.identity); p != peers.end()) {
      p->second.ids.erase(f.client_id);
      if (p->second.ids.empty()) {
        peer_gone_guard_.erase(f.identity);
        peers.erase(p);
      }
    }
    inflight.erase(it);
  }

  absl::Status Run(const std::atomic<bool>& stop) {
    while (true) {
      if (stop.load() && inflight.empty()) break;
      zmq::pollitem_t items[] = {{router.handle(), 0, ZMQ_POLLIN, 0},
                                 {monitor.handle(), 0, ZMQ_POLLIN, 0},
                                 {nullptr, wake_fd, ZMQ_POLLIN, 0}};
      try {
        zmq::poll(items, 3, std::chrono::milliseconds(options.idle_poll_ms));
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) return absl::InternalError(absl::StrCat("zmq_poll: ", e.what()));
      }
      DrainMonitor();
      for (int i = 0; i < options.max_messages_per_step && ReceiveOne(); ++i) {
      }
      DeliverReady();
    }
    spdlog::info("frontend: ZeroMQ front end stopped; {} requests served",
                 counters.requests_finished);
    return absl::OkStatus();
  }

  absl::flat_hash_set<std::string> peer_gone_guard_;  // routing ids whose sends failed
};

absl::StatusOr<std::unique_ptr<Server>> Server::Create(const ServerOptions& options,
                                                       EngineLoop* loop,
                                                       std::optional<ChatTemplate> chat_template) {
  if (loop == nullptr) return absl::InvalidArgumentError("Server::Create: loop is null");
  if (options.max_message_bytes < 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes must be >= 64, got ", options.max_message_bytes));
  }
  if (options.idle_poll_ms < 1 || options.max_messages_per_step < 1 ||
      options.send_high_water_mark < 1) {
    return absl::InvalidArgumentError(
        "idle_poll_ms, max_messages_per_step and send_high_water_mark must be >= 1");
  }
  if (options.heartbeat_interval_ms < 0 || options.heartbeat_timeout_ms < 0) {
    return absl::InvalidArgumentError(
        "heartbeat_interval_ms and heartbeat_timeout_ms must be >= 0");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->loop = loop;
  impl->chat_template = std::move(chat_template);
  impl->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl->wake_fd < 0)
    return absl::InternalError(absl::StrCat("eventfd: ", std::strerror(errno)));
  try {
    impl->router = zmq::socket_t(impl->context, zmq::socket_type::router);
    impl->router.set(zmq::sockopt::router_mandatory, 1);
    impl->router.set(zmq::sockopt::linger, 0);
    impl->router.set(zmq::sockopt::sndhwm, options.send_high_water_mark);
    impl->router.set(
        zmq::sockopt::maxmsgsize,
        static_cast<int64_t>(std::max<size_t>(size_t{16} << 20, 4 * options.max_message_bytes)));
    if (options.heartbeat_interval_ms > 0) {
      impl->router.set(zmq::sockopt::heartbeat_ivl, options.heartbeat_interval_ms);
      impl->router.set(zmq::sockopt::heartbeat_timeout, options.heartbeat_timeout_ms > 0
                                                            ? options.heartbeat_timeout_ms
                                                            : 5 * options.heartbeat_interval_ms);
    }
    PS_RETURN_IF_ERROR(ConfigureCurveServer(options.curve, impl->context, impl->router,
                                            &impl->curve_authenticator));
    const std::string monitor_endpoint = absl::StrCat("inproc://pagedserve-frontend-monitor-",
                                                      reinterpret_cast<uintptr_t>(impl.get()));
    if (zmq_socket_monitor(
            impl->router.handle(), monitor_endpoint.c_str(),
            ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0) {
      return absl::InternalError(absl::StrCat("zmq_socket_monitor: ", zmq_strerror(zmq_errno())));
    }
    impl->monitor = zmq::socket_t(impl->context, zmq::socket_type::pair);
    impl->monitor.set(zmq::sockopt::linger, 0);
    impl->monitor.connect(monitor_endpoint);
    try {
      impl->router.bind(options.endpoint);
    } catch (const zmq::error_t& e) {
      return absl::UnavailableError(
          absl::StrCat("cannot bind --zmq-endpoint ", options.endpoint, ": ", e.what()));
    }
    impl->bound_endpoint = impl->router.get(zmq::sockopt::last_endpoint);
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrCat("ZeroMQ setup failed: ", e.what()));
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Server::~Server() {
  if (impl_ != nullptr && impl_->router.handle() != nullptr) {
    zmq_socket_monitor(impl_->router.handle(), nullptr, 0);
  }
}

const std::string& Server::endpoint() const { return impl_->bound_endpoint; }

const Server::Counters& Server::counters() const { return impl_->counters; }

absl::Status Server::Run(const std::atomic<bool>& stop) {
  try {
    return impl_->Run(stop);
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrCat("ZeroMQ error in the serve loop: ", e.what()));
  }
}

}  // namespace pagedserve
