// The only translation unit that includes Boost.Beast / Boost.Asio (compile time).
#include "runtime/frontend/http_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "boost/asio/executor_work_guard.hpp"
#include "boost/asio/io_context.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/asio/post.hpp"
#include "boost/asio/ssl.hpp"
#include "boost/asio/steady_timer.hpp"
#include "boost/asio/strand.hpp"
#include "boost/asio/write.hpp"
#include "boost/beast/core/flat_buffer.hpp"
#include "boost/beast/core/stream_traits.hpp"
#include "boost/beast/http.hpp"
#include "nlohmann/json.hpp"
#include "openssl/err.h"
#include "openssl/ssl.h"
#include "runtime/engine/engine_loop.h"
#include "runtime/engine/output_accumulator.h"
#include "runtime/frontend/openai_api.h"
#include "runtime/frontend/request_log.h"
#include "spdlog/spdlog.h"

namespace pagedserve {

bool ConstantTimeEquals(std::string_view a, std::string_view b, size_t* bytes_compared) {
  // Walks max(|a|, |b|) bytes whatever the contents; the length difference is
  // folded into the result instead of returning early.
  const size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = a.size() == b.size() ? 0 : 1;
  size_t i = 0;
  for (; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | (x ^ y);
  }
  if (bytes_compared != nullptr) *bytes_compared = i;
  return diff == 0;
}

std::string_view BearerToken(std::string_view authorization) {
  // RFC 9110 11.1: the scheme is case-insensitive ("bearer", "BEARER"), then one
  // or more spaces, then the credentials.
  constexpr std::string_view kScheme = "bearer";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(absl::string_view(authorization.data(), kScheme.size()),
                              absl::string_view(kScheme.data(), kScheme.size())) ||
      authorization[kScheme.size()] != ' ') {
    return {};
  }
  authorization.remove_prefix(kScheme.size());
  while (!authorization.empty() && authorization.front() == ' ') authorization.remove_prefix(1);
  return authorization;
}

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using openai::ApiError;
using HttpRequest = http::request<http::string_body>;

int64_t UnixNow() { return static_cast<int64_t>(std::time(nullptr)); }

std::chrono::microseconds ToChrono(absl::Duration d) {
  return std::chrono::microseconds(absl::ToInt64Microseconds(d));
}

// A header value or method as absl's view (Debian's absl::string_view is not
// std::string_view).
absl::string_view View(beast::string_view v) { return {v.data(), v.size()}; }

// What a route answers when it is not a stream.
struct Reply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;
  bool close = false;  // "Connection: close": the connection ends after it
};

ApiError MakeError(int status, std::string type, std::string message, std::string code = "") {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

Reply ErrorReply(const ApiError& e, bool close = false) {
  Reply r;
  r.status = e.status;
  r.body = openai::ErrorBody(e);
  r.close = close;
  return r;
}

Reply InvalidRequest(int status, std::string message, bool close) {
  return ErrorReply(MakeError(status, "invalid_request_error", std::move(message)), close);
}

// True when the peer closed (or reset) the connection; bytes it sent before
// (a pipelined request) do not count.
bool PeerClosed(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// The path of a request target ("/v1/models?x=1" -> "/v1/models").
std::string PathOf(beast::string_view target) {
  std::string path(target.data(), target.size());
  if (const size_t q = path.find('?'); q != std::string::npos) path.resize(q);
  return path;
}

// Whether `method` is one of `allowed` ("GET, HEAD").
bool MethodAllowed(std::string_view method, std::string_view allowed) {
  for (absl::string_view m :
       absl::StrSplit(absl::string_view(allowed.data(), allowed.size()), ", ")) {
    if (m == absl::string_view(method.data(), method.size())) return true;
  }
  return false;
}

// One generation request (1..N prompts x n samples) between a connection and
// the engine. Used on its connection's strand only (the channel is the one
// thing the engine thread touches).
struct Job {
  const HttpBackend* backend = nullptr;
  openai::ValidatedRequest request;
  std::string id;  // cmpl-... / chatcmpl-...
  int64_t created = 0;
  std::optional<OutputAccumulator> output;  // set by NewJob: the engine ids, completions, usage
  std::shared_ptr<RequestChannel> channel;
  std::vector<bool> started;         // chat: role chunk sent
  std::vector<size_t> text_offsets;  // streaming: legacy logprobs offset per choice
  std::vector<openai::ToolStreamState> tool_streams;  // streaming with tool-call parsing
  bool aborted = false;                               // the client went away (or the server stops)
  std::optional<std::string> logged_prompt;  // --log-request-content: the prompts as decoded

  bool done() const { return output->done(); }
  // The error the request ended with (openai::FinishError of its choices'
  // finish reasons), nullopt when it completed.
  std::optional<ApiError> Error() const {
    for (const CompletionOutput& c : output->completions()) {
      if (std::optional<ApiError> e = openai::FinishError(c.finish_reason, output->error())) {
        return e;
      }
    }
    return std::nullopt;
  }
};

// Serialises the engine thread's posts against Stop(): once closed, an
// on_push callback posts nothing (the io_context may be gone). Shared by the
// server and every request channel's callback (channels may outlive the server).
struct PostGate {
  std::mutex mu;
  bool open = true;  // guarded by mu
};

// A connection, as Stop() sees it.
class SessionBase {
 public:
  virtual ~SessionBase() = default;
  // Stop(), I/O threads running: re-examine the request in flight (aborts it).
  virtual void Wake() = 0;
  // Stop(), I/O threads joined: abort the request in flight, close the socket.
  virtual void Shutdown() = 0;
};

// A route: the methods it takes (the Allow header of a 405) and its handler;
// generation routes have an endpoint instead.
struct Route {
  std::string allowed;
  std::function<Reply(const HttpRequest&)> handler;
  std::optional<openai::Endpoint> generation;
};

// Everything but the connections: options, routes and their logic (request to
// reply, engine outputs to response bytes), the listening socket and the
// threads. Connections (Session below) call into it on their strands.
class HttpCore {
 public:
  explicit HttpCore(const HttpServerOptions& options) : options_(options) {}

  const HttpServerOptions& options() const { return options_; }
  bool stopping() const { return stopping_.load(std::memory_order_relaxed); }
  const std::shared_ptr<PostGate>& gate() const { return gate_; }
  std::atomic<int64_t>& active_jobs() { return active_jobs_; }

  void Responded(int status) const {
    if (options_.on_response) options_.on_response(status);
  }

  const Route* FindRoute(const std::string& path) const {
    auto it = routes_.find(path);
    return it == routes_.end() ? nullptr : &it->second;
  }

  // Checks on the request line and headers alone, before any body is read:
  // 405, transfer coding (501 / 400), Content-Length (400 / 413), a POST
  // without a length (411), the API key (401). nullopt: read on.
  std::optional<Reply> PreRoute(const HttpRequest& req) const;
  // A route's reply, or a generation started (then `job` is set): parses and
  // submits the request, its channel created with `on_push`.
  struct Started {
    Reply reply;
    std::shared_ptr<Job> job;
  };
  Started StartGeneration(openai::Endpoint endpoint, const std::string& body,
                          std::function<void()> on_push);
  // Streaming: applies `out` to the job and appends its SSE events to `sse`.
  void AppendEvents(Job& job, EngineOutput& out, std::string* sse) const;
  // Streaming, the job done: the error event, usage chunk and [DONE].
  void AppendFinalEvents(const Job& job, std::string* sse) const;
  // Not streaming, the job done: the response.
  Reply FinalReply(const Job& job) const;
  static void AbortJob(Job& job);
  void LogDone(const Job& job) const;

  // Sessions, by id, for Stop().
  void Register(uint64_t id, std::weak_ptr<SessionBase> s);
  void Unregister(uint64_t id);

  absl::Status Bind(asio::ssl::context* tls);
  int port() const { return port_; }
  void Start();
  void Attach(std::unique_ptr<HttpBackend> backend) {
    backend_storage_ = std::move(backend);
    backend_.store(backend_storage_.get(), std::memory_order_release);
  }
  void Stop();

 private:
  const HttpBackend* Backend(Reply* reply) const;
  openai::ServedModel Model(const HttpBackend& b) const;
  bool Authorized(const HttpRequest& req) const;
  static bool Protected(const std::string& path) {
    return absl::StartsWith(path, "/v1/") || path == "/tokenize" || path == "/detokenize";
  }
  static std::string DescribePrompts(const openai::ValidatedRequest& request,
                                     const Tokenizer& tokenizer);
  static void LogIgnoredFields(const std::vector<std::string>& fields);
  static std::vector<std::string> DeltaEvents(Job& job, int c, const CompletionOutput& d,
                                              const Tokenizer& tok);
  std::optional<Reply> CheckFraming(const HttpRequest& req) const;
  std::shared_ptr<Job> NewJob(openai::Endpoint endpoint, openai::ValidatedRequest request,
                              const HttpBackend& b);
  void Routes();
  void InfoRoutes();
  void TokenizerRoutes();
  void Get(const std::string& path, std::function<Reply(const HttpRequest&)> handler) {
    routes_[path] = Route{"GET, HEAD", std::move(handler), std::nullopt};
  }
  void Post(const std::string& path, std::function<Reply(const HttpRequest&)> handler) {
    routes_[path] = Route{"POST", std::move(handler), std::nullopt};
  }
  void Accept();
  template <typename Stream>
  void Open(Stream stream);
  std::vector<std::shared_ptr<SessionBase>> Sessions();

  const HttpServerOptions options_;
  std::map<std::string, Route> routes_;  // filled by Bind, read-only after
  std::atomic<const HttpBackend*> backend_{nullptr};
  std::unique_ptr<HttpBackend> backend_storage_;  // written once by Attach, before publication
  std::atomic<uint64_t> next_id_{0};
  uint64_t id_salt_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> active_jobs_{0};  // sessions with a generation in flight
  std::shared_ptr<PostGate> gate_ = std::make_shared<PostGate>();

  std::unique_ptr<asio::io_context> ioc_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::unique_ptr<tcp::acceptor> acceptor_;
  std::unique_ptr<asio::steady_timer> accept_retry_;
  asio::ssl::context* tls_ = nullptr;  // not owned (HttpServer::Impl); null: plain HTTP
  int port_ = 0;
  std::vector<std::thread> threads_;
  bool started_ = false, stopped_ = false;
  uint64_t next_session_ = 0;  // accept strand only
  std::mutex sessions_mu_;
  std::unordered_map<uint64_t, std::weak_ptr<SessionBase>> sessions_;  // guarded by sessions_mu_
};

const HttpBackend* HttpCore::Backend(Reply* reply) const {
  const HttpBackend* b = backend_.load(std::memory_order_acquire);
  if (b == nullptr)
    *reply = ErrorReply(MakeError(503, "service_unavailable", "the model is loading"));
  return b;
}

openai::ServedModel HttpCore::Model(const HttpBackend& b) const {
  openai::ServedModel m;
  m.name = options_.served_model_name;
  m.max_model_len = b.loop->engine().scheduler_config().max_model_len;
  m.vocab_size = b.loop->tokenizer().vocab_size();
  m.defaults = options_.sampling_defaults;
  m.priority_scheduling = b.loop->engine().scheduler_config().enable_priority;
  if (b.tool_call_parser.has_value()) {
    m.tool_call_format = *b.tool_call_parser;
  } else if (b.chat_template.has_value()) {
    m.tool_call_format = ToolCallFormatOfTemplate(b.chat_template->source());
  }
  return m;
}

// One "Authorization: Bearer KEY" header with the key. More than one is
// refused even when one of them holds the key: the request is ambiguous (a
// proxy and the server could read different ones).
bool HttpCore::Authorized(const HttpRequest& req) const {
  if (options_.api_key.empty()) return true;
  if (req.count(http::field::authorization) != 1) return false;
  const beast::string_view header = req[http::field::authorization];
  return ConstantTimeEquals(BearerToken(std::string_view(header.data(), header.size())),
                            options_.api_key);
}

// Transfer-Encoding and Content-Length (Beast's parser has already refused
// both together, a second Transfer-Encoding, differing lengths and lengths
// that are not numbers). Only chunked is implemented (501, RFC 9112 6.1); a
// Content-Length must be one plain decimal number (RFC 9112 6.3: a second one,
// even an equal one, leaves the body's end in doubt, the shape of request
// smuggling); a length over --max-request-body-bytes is 413 before the body.
std::optional<Reply> HttpCore::CheckFraming(const HttpRequest& req) const {
  if (req.count(http::field::transfer_encoding) > 0) {
    const bool chunked =
        req.count(http::field::transfer_encoding) == 1 &&
        absl::EqualsIgnoreCase(View(req[http::field::transfer_encoding]), "chunked");
    if (!chunked)
      return InvalidRequest(501, "only the chunked transfer coding is implemented", true);
    if (req.count(http::field::content_length) > 0) {
      return InvalidRequest(400, "Transfer-Encoding and Content-Length together", true);
    }
  }
  if (req.count(http::field::content_length) == 0) return std::nullopt;
  const std::string v(View(req[http::field::content_length]));
  const bool digits =
      !v.empty() && std::all_of(v.begin(), v.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
  if (req.count(http::field::content_length) != 1 || !digits) {
    return InvalidRequest(400,
                          req.count(http::field::content_length) != 1
                              ? "more than one Content-Length header"
                              : absl::StrCat("Content-Length must be a decimal number of bytes; "
                                             "got '",
                                             v, "'"),
                          true);
  }
  uint64_t len = 0;
  if (!absl::SimpleAtoi(v, &len) || len > static_cast<uint64_t>(options_.max_request_body_bytes)) {
    return InvalidRequest(
        413,
        absl::StrCat("the request body is too large (Content-Length ", v,
                     ", --max-request-body-bytes ", options_.max_request_body_bytes, ")"),
        true);
  }
  return std::nullopt;
}

std::optional<Reply> HttpCore::PreRoute(const HttpRequest& req) const {
  const std::string path = PathOf(req.target());
  const bool has_body =
      req.count(http::field::transfer_encoding) > 0 || req.count(http::field::content_length) > 0;
  const std::string method(View(req.method_string()));
  if (const Route* route = FindRoute(path);
      route != nullptr && !MethodAllowed(method, route->allowed)) {
    // A route that exists, under another method: 405 with Allow (RFC 9110
    // 15.5.6), before any rule about bodies (a GET route takes none).
    Reply r = InvalidRequest(405,
                             absl::StrCat("method ", method, " is not allowed on ", path,
                                          " (allowed: ", route->allowed, ")"),
                             has_body);
    r.headers.emplace_back("Allow", route->allowed);
    return r;
  }
  if (std::optional<Reply> r = CheckFraming(req)) return r;
  if (!has_body && (method == "POST" || method == "PUT" || method == "PATCH")) {
    // Every POST route takes a JSON body; without a length its end is unknown.
    return InvalidRequest(411,
                          "a request body needs a Content-Length or Transfer-Encoding: chunked "
                          "header",
                          true);
  }
  if (Protected(path) && !Authorized(req)) {
    return ErrorReply(
        MakeError(401, "invalid_request_error",
                  "missing or invalid API key (Authorization: Bearer)", "invalid_api_key"),
        has_body);
  }
  return std::nullopt;
}

void HttpCore::AbortJob(Job& job) {
  if (job.aborted) return;
  job.aborted = true;
  for (const std::string& id : job.output->engine_ids()) job.backend->loop->Abort(id);
}

// The request log line (request_log.h), front end "http"; the request id is
// the response's id. Completion text only with log_request_content.
void HttpCore::LogDone(const Job& job) const {
  if (!options_.log_requests) return;
  LogRequest(LogRecordOf("http", job.id, *job.output, job.aborted, job.logged_prompt));
}

// What --log-request-content logs as the prompt: each prompt decoded (chat:
// the templated text the model saw), separated by " | " when there are several.
std::string HttpCore::DescribePrompts(const openai::ValidatedRequest& request,
                                      const Tokenizer& tokenizer) {
  std::string out;
  DecodeOptions decode;
  decode.skip_special_tokens = false;
  for (const std::vector<int32_t>& ids : request.prompts) {
    absl::StatusOr<std::string> text = tokenizer.Decode(ids, decode);
    absl::StrAppend(&out, out.empty() ? "" : " | ",
                    text.ok() ? *text : absl::StrCat("token_ids=[", absl::StrJoin(ids, ","), "]"));
  }
  return out;
}

// One warning line per request naming the fields it ignored (vLLM's
// behaviour), quoted as JSON strings, at most 8, each cut at 64 bytes.
void HttpCore::LogIgnoredFields(const std::vector<std::string>& fields) {
  std::string names;
  for (size_t i = 0; i < fields.size() && i < 8; ++i) {
    const nlohmann::json name = fields[i].substr(0, 64);
    absl::StrAppend(&names, i > 0 ? ", " : "",
                    name.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace));
  }
  if (fields.size() > 8) absl::StrAppend(&names, " and ", fields.size() - 8, " more");
  spdlog::warn("http: the request's fields {} are not known and were ignored", names);
}

std::shared_ptr<Job> HttpCore::NewJob(openai::Endpoint endpoint, openai::ValidatedRequest request,
                                      const HttpBackend& b) {
  auto job = std::make_shared<Job>();
  job->backend = &b;
  job->request = std::move(request);
  if (options_.log_requests && options_.log_request_content) {
    job->logged_prompt = DescribePrompts(job->request, b.loop->tokenizer());
  }
  job->created = UnixNow();
  const uint64_t seq = next_id_.fetch_add(1);
  const char* prefix = endpoint == openai::Endpoint::kChat ? "chatcmpl-" : "cmpl-";
  job->id = job->request.request_id.empty()
                ? absl::StrCat(
                      prefix, absl::Hex(id_salt_ ^ (seq * 0x9E3779B97F4A7C15ull), absl::kZeroPad16))
                : absl::StrCat(prefix, job->request.request_id);
  std::vector<std::string> engine_ids;
  for (size_t p = 0; p < job->request.prompts.size(); ++p) {
    engine_ids.push_back(absl::StrCat("http-", seq, "-", p));
  }
  job->output.emplace(std::move(engine_ids), job->request.params.n);
  const size_t choices = job->output->completions().size();
  job->started.assign(choices, false);
  job->text_offsets.assign(choices, 0);
  job->tool_streams.assign(choices, {});
  return job;
}

HttpCore::Started HttpCore::StartGeneration(openai::Endpoint endpoint, const std::string& body,
                                            std::function<void()> on_push) {
  Started started;
  const HttpBackend* b = Backend(&started.reply);
  if (b == nullptr) return started;
  const ChatTemplate* tmpl = b->chat_template.has_value() ? &*b->chat_template : nullptr;
  openai::ParseOutcome parsed =
      openai::ParseRequest(endpoint, body, Model(*b), b->loop->tokenizer(), tmpl);
  if (!parsed.request.has_value()) {
    started.reply = ErrorReply(parsed.error);
    return started;
  }
  if (!parsed.ignored_fields.empty()) LogIgnoredFields(parsed.ignored_fields);
  // Each prompt is one request in the waiting queue: more prompts than the
  // queue holds could never be admitted together (400, not a 429 "retry").
  if (const int64_t queue = b->loop->Snapshot().max_queue_len;
      static_cast<int64_t>(parsed.request->prompts.size()) > queue) {
    started.reply = ErrorReply(openai::BadRequest(
        absl::StrCat(parsed.request->prompts.size(),
                     " prompts in one request, but the waiting queue holds at most ", queue,
                     " requests (--max-queue-len)"),
        "prompt"));
    return started;
  }
  std::shared_ptr<Job> job = NewJob(endpoint, *std::move(parsed.request), *b);
  job->channel = std::make_shared<RequestChannel>(std::move(on_push));
  for (size_t p = 0; p < job->output->engine_ids().size(); ++p) {
    EngineRequest er;
    er.request_id = job->output->engine_ids()[p];
    er.prompt_token_ids = job->request.prompts[p];
    er.params = job->request.params;
    er.max_tokens_is_default = !job->request.max_tokens_given;
    er.priority = job->request.priority;
    er.cache_salt = job->request.cache_salt;
    if (absl::Status s = b->loop->Submit(std::move(er), job->channel); !s.ok()) {
      job->output->KeepSubmitted(p);
      AbortJob(*job);
      started.reply = ErrorReply(openai::SubmitError(s, job->request));
      return started;
    }
  }
  started.job = std::move(job);
  return started;
}

// The SSE events (their data) of one choice's news: tool-call chunks when the
// request parses tool calls, else one chunk (the role with the first).
std::vector<std::string> HttpCore::DeltaEvents(Job& job, int c, const CompletionOutput& d,
                                               const Tokenizer& tok) {
  if (job.request.parse_tool_calls) {
    return openai::ToolStreamChunks(job.request, job.id, job.created, c,
                                    job.output->completions()[c].text, d.finish_reason,
                                    &job.tool_streams[c]);
  }
  const bool first = !job.started[c];
  job.started[c] = true;
  return {openai::StreamChunk(job.request, job.id, job.created, c, d, first, tok,
                              &job.text_offsets[c])};
}

void HttpCore::AppendEvents(Job& job, EngineOutput& out, std::string* sse) const {
  std::vector<CompletionNews> news;
  job.output->Apply(out, &news);
  const Tokenizer& tok = job.backend->loop->tokenizer();
  for (const CompletionNews& item : news) {
    for (const std::string& event : DeltaEvents(job, item.choice, item.delta, tok)) {
      absl::StrAppend(sse, "data: ", event, "\n\n");
    }
  }
}

void HttpCore::AppendFinalEvents(const Job& job, std::string* sse) const {
  // A stream that failed after it started: the error object (type
  // server_error, as the 500 of a non-streaming request) before [DONE].
  if (std::optional<ApiError> e = job.Error()) {
    absl::StrAppend(sse, "data: ", openai::ErrorBody(*e), "\n\n");
  }
  if (job.request.include_usage) {
    absl::StrAppend(
        sse, "data: ", openai::UsageChunk(job.request, job.id, job.created, job.output->usage()),
        "\n\n");
  }
  absl::StrAppend(sse, "data: [DONE]\n\n");
}

Reply HttpCore::FinalReply(const Job& job) const {
  // Failed by the engine (even after some tokens): OpenAI's error object, not
  // a 200 whose choices say finish_reason "error" without a message.
  if (std::optional<ApiError> e = job.Error()) return ErrorReply(*e);
  Reply r;
  std::vector<std::vector<PromptLogprob>> prompt_logprobs;
  if (job.request.params.prompt_logprobs >= 0) {
    for (size_t p = 0; p < job.output->engine_ids().size(); ++p)
      prompt_logprobs.push_back(job.output->prompt_logprobs(p));
  }
  r.body = openai::CompletionResponse(job.request, job.id, job.created, job.output->completions(),
                                      job.output->usage(), job.backend->loop->tokenizer(),
                                      prompt_logprobs);
  return r;
}

void HttpCore::Register(uint64_t id, std::weak_ptr<SessionBase> s) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_[id] = std::move(s);
}

void HttpCore::Unregister(uint64_t id) {
  std::lock_guard<std::mutex> lock(sessions_mu_);
  sessions_.erase(id);
}

std::vector<std::shared_ptr<SessionBase>> HttpCore::Sessions() {
  std::vector<std::shared_ptr<SessionBase>> out;
  std::lock_guard<std::mutex> lock(sessions_mu_);
  for (const auto& entry : sessions_) {
    if (std::shared_ptr<SessionBase> s = entry.second.lock()) out.push_back(std::move(s));
  }
  return out;
}

// Every route: generation, the read-only endpoints and the tokenizer endpoints.
void HttpCore::Routes() {
  routes_["/v1/completions"] = Route{"POST", nullptr, openai::Endpoint::kCompletions};
  routes_["/v1/chat/completions"] = Route{"POST", nullptr, openai::Endpoint::kChat};
  InfoRoutes();
  TokenizerRoutes();
}

// GET /v1/models, /health, /version, /openapi.json, /metrics.
void HttpCore::InfoRoutes() {
  Get("/v1/models", [this](const HttpRequest&) {
    Reply r;
    if (const HttpBackend* b = Backend(&r)) r.body = openai::ModelsResponse(Model(*b), UnixNow());
    return r;
  });
  Get("/health", [this](const HttpRequest&) {
    const HttpBackend* b = backend_.load(std::memory_order_acquire);
    const bool ok = b != nullptr && b->loop->healthy();
    Reply r;
    r.status = ok ? 200 : 503;
    r.body = ok ? "{\"status\":\"ok\"}"
                : (b == nullptr ? "{\"status\":\"loading\"}" : "{\"status\":\"unhealthy\"}");
    return r;
  });
  Get("/version", [this](const HttpRequest&) {
    Reply r;
    r.body = absl::StrCat("{\"version\":\"", options_.version, "\"}");
    return r;
  });
  Get("/openapi.json", [this](const HttpRequest&) {
    const HttpBackend* b = backend_.load(std::memory_order_acquire);
    Reply r;
    r.body =
        openai::OpenApiDocument(options_.version, b ? b->loop->tokenizer().vocab_size() : 1 << 20);
    return r;
  });
  Get("/metrics", [this](const HttpRequest&) {
    const HttpBackend* b = backend_.load(std::memory_order_acquire);
    Reply r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    if (b == nullptr || !b->metrics_text) {
      r.status = 503;
      r.content_type = "text/plain";
      r.body = "# metrics are not available yet\n";
      return r;
    }
    r.body = b->metrics_text();
    return r;
  });
}

// POST /tokenize and /detokenize.
void HttpCore::TokenizerRoutes() {
  Post("/tokenize", [this](const HttpRequest& req) {
    Reply r;
    const HttpBackend* b = Backend(&r);
    if (b == nullptr) return r;
    ApiError err;
    err.status = 0;
    r.body = openai::TokenizeResponse(req.body(), Model(*b), b->loop->tokenizer(),
                                      b->chat_template ? &*b->chat_template : nullptr, &err);
    return err.status != 0 ? ErrorReply(err) : r;
  });
  Post("/detokenize", [this](const HttpRequest& req) {
    Reply r;
    const HttpBackend* b = Backend(&r);
    if (b == nullptr) return r;
    ApiError err;
    err.status = 0;
    r.body = openai::DetokenizeResponse(req.body(), b->loop->tokenizer(), &err);
    return err.status != 0 ? ErrorReply(err) : r;
  });
}

// One connection, from accept to close, plain (Stream = tcp::socket) or TLS
// (asio::ssl::stream over it): an asynchronous state machine on the socket's
// strand. Every step is one asynchronous operation whose completion handler
// holds the session (shared_ptr), so it lives exactly as long as something is
// pending, plus `keep_` while a generation is in flight (it may wait for the
// engine with nothing pending on the socket).
//
//   [TLS handshake] -> wait for the first byte (keep-alive timeout) -> header
//   (request deadline starts) -> pre-routing checks -> [100 Continue] -> body
//   -> route -> response -> next request (pipelined bytes already buffered
//   are parsed first) ... -> linger -> close
//
// Errors that leave the request stream in doubt (bad framing, an answer given
// before the body was read) end the connection after the response: FIN, then
// the input is discarded (never parsed) for at most a second and 1 MiB, so
// that the client reads the response instead of a reset.
template <typename Stream>
class Session final : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

  Session(HttpCore& core, Stream stream, uint64_t id)
      : core_(core),
        stream_(std::move(stream)),
        executor_(beast::get_lowest_layer(stream_).get_executor()),
        timer_(executor_),
        id_(id) {}
  ~Session() override {
    if (job_ != nullptr) EndJob();
    core_.Unregister(id_);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  void Start() {
    core_.Register(id_, this->shared_from_this());
    if constexpr (kTls) {
      // The handshake (client certificates as the context says) is part of the
      // first request's deadline.
      Arm(core_.options().read_timeout);
      stream_.async_handshake(asio::ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code ec) {
                                self->Disarm();
                                if (ec) return self->Close();
                                self->ReadRequest();
                              });
    } else {
      ReadRequest();
    }
  }

  void Wake() override {
    asio::post(executor_, [self = this->shared_from_this()] { self->Pump(); });
  }

  void Shutdown() override {
    if (job_ != nullptr) EndJob();
    beast::error_code ignored;
    Socket().close(ignored);
  }

 private:
  tcp::socket& Socket() { return beast::get_lowest_layer(stream_); }

  // The deadline of the operations started from now until Disarm: when it
  // passes, the socket's operations are cancelled and timed_out_ says why.
  void Arm(absl::Duration d) {
    timed_out_ = false;
    const uint64_t gen = ++timer_gen_;
    timer_.expires_after(ToChrono(d));
    timer_.async_wait([self = this->shared_from_this(), gen](beast::error_code ec) {
      if (ec || gen != self->timer_gen_) return;
      self->timed_out_ = true;
      beast::error_code ignored;
      self->Socket().cancel(ignored);
    });
  }
  void Disarm() {
    ++timer_gen_;
    timer_.cancel();
  }

  void ReadRequest() {
    if (core_.stopping()) return Close();
    parser_.emplace();
    parser_->header_limit(static_cast<std::uint32_t>(kMaxRequestHeadBytes));
    parser_->body_limit(boost::none);  // Content-Length: PreRoute; chunked: set before the body
    if (buffer_.size() > 0) return ReadHeader();  // pipelined
    // Idle keep-alive: the next request's first byte within the keep-alive
    // timeout. An idle connection holds no buffer: the read-ahead buffer is
    // released, and plain HTTP waits for readability without one (TLS reads:
    // OpenSSL may hold decrypted bytes already).
    buffer_.shrink_to_fit();
    Arm(std::max(core_.options().keep_alive_timeout, absl::Seconds(1)));
    if constexpr (kTls) {
      stream_.async_read_some(buffer_.prepare(512),
                              [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                                self->Disarm();
                                if (ec) return self->Close();
                                self->buffer_.commit(n);
                                self->ReadHeader();
                              });
    } else {
      Socket().async_wait(tcp::socket::wait_read,
                          [self = this->shared_from_this()](beast::error_code ec) {
                            self->Disarm();
                            if (ec) return self->Close();
                            self->ReadHeader();
                          });
    }
  }

  void ReadHeader() {
    Arm(core_.options().read_timeout);  // the whole request, from its first byte
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(beast::error_code ec) {
    if (ec) return OnReadError(ec);
    const HttpRequest& req = parser_->get();
    if (std::optional<Reply> r = core_.PreRoute(req)) return Send(*std::move(r));
    if (parser_->is_done()) return Dispatch();
    // Chunked bodies are bounded as they are read (413 at the chunk that
    // crosses the bound); a Content-Length was checked by PreRoute.
    parser_->body_limit(core_.options().max_request_body_bytes);
    if (absl::EqualsIgnoreCase(View(req[http::field::expect]), "100-continue")) {
      static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(stream_, asio::buffer(kContinue.data(), kContinue.size()),
                        [self = this->shared_from_this()](beast::error_code wec, size_t) {
                          if (wec) return self->Close();
                          self->ReadBody();
                        });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(stream_, buffer_, *parser_,
                     [self = this->shared_from_this()](beast::error_code ec, size_t) {
                       if (ec) return self->OnReadError(ec);
                       self->Dispatch();
                     });
  }

  // A request that could not be read: an answer where one helps (408, 431,
  // 413, 400), then the connection ends; a client that went away: closed.
  void OnReadError(beast::error_code ec) {
    Disarm();
    const bool in_body = parser_->is_header_done();
    if (timed_out_) {
      return Send(
          InvalidRequest(408,
                         absl::StrCat("the request did not arrive within --http-timeout (",
                                      absl::FormatDuration(core_.options().read_timeout), ")"),
                         true));
    }
    if (ec == http::error::header_limit) {
      return Send(InvalidRequest(431,
                                 absl::StrCat("the request line and headers are too large (over ",
                                              kMaxRequestHeadBytes, " bytes)"),
                                 true));
    }
    if (ec == http::error::body_limit) {
      return Send(InvalidRequest(413,
                                 absl::StrCat("the request body is too large (over "
                                              "--max-request-body-bytes ",
                                              core_.options().max_request_body_bytes, ")"),
                                 true));
    }
    if (ec.category() != http::make_error_code(http::error::bad_target).category() ||
        ec == http::error::end_of_stream || ec == http::error::partial_message) {
      return Close();  // the client closed or reset the connection
    }
    if (in_body && parser_->chunked()) {
      return Send(InvalidRequest(400,
                                 "malformed chunked encoding (RFC 9112 7.1: chunk sizes are hex "
                                 "digits, each chunk's data ends with CRLF)",
                                 true));
    }
    Send(InvalidRequest(400, absl::StrCat("malformed HTTP request: ", ec.message()), true));
  }

  // The request is read whole: its route.
  void Dispatch() {
    Disarm();
    const HttpRequest& req = parser_->get();
    const Route* route = core_.FindRoute(PathOf(req.target()));
    if (route == nullptr) {
      return Send(ErrorReply(MakeError(
          404, "NotFoundError",
          absl::StrCat("no route ", View(req.method_string()), " ", PathOf(req.target())))));
    }
    if (absl::StartsWith(View(req[http::field::content_type]), "multipart/form-data")) {
      return Send(
          InvalidRequest(415, "multipart bodies are not accepted; send application/json", false));
    }
    try {
      if (route->generation.has_value()) return StartGeneration(*route->generation);
      Send(route->handler(req));
    } catch (const std::exception& e) {
      spdlog::error("http: handler failed: {}", e.what());
      Send(ErrorReply(MakeError(500, "server_error", absl::StrCat("internal error: ", e.what()))));
    }
  }

  // Writes a complete response; then the next request, or the end.
  void Send(Reply r) {
    const bool head = parser_.has_value() && parser_->get().method() == http::verb::head;
    // An answer given before the body was read whole: the rest of the body
    // would be parsed as the next request.
    if (!parser_.has_value() || !parser_->is_done()) r.close = true;
    const bool keep_alive = !r.close && parser_->get().keep_alive() && !core_.stopping();
    res_ = {};
    res_.version(11);
    res_.result(static_cast<unsigned>(r.status));
    res_.set(http::field::content_type, r.content_type);
    for (const auto& header : r.headers) res_.set(header.first, header.second);
    res_.body() = std::move(r.body);
    res_.prepare_payload();
    if (head) res_.body().clear();  // Content-Length stays that of the GET
    res_.keep_alive(keep_alive);
    status_ = r.status;
    Arm(core_.options().write_timeout);
    http::async_write(stream_, res_,
                      [self = this->shared_from_this(), keep_alive](beast::error_code ec, size_t) {
                        self->Disarm();
                        self->core_.Responded(self->status_);
                        self->res_ = {};
                        self->parser_.reset();  // the request (and its body) is not kept
                        if (ec) return self->Close();
                        if (!keep_alive) return self->Linger();
                        self->ReadRequest();
                      });
  }

  // Ends the connection after a response: FIN, then what the client still
  // sends is read and dropped (at most 1 MiB, one second), then close.
  void Linger() {
    beast::error_code ignored;
    Socket().shutdown(tcp::socket::shutdown_send, ignored);
    scratch_ = std::make_unique<std::array<char, 4096>>();
    linger_left_ = 1 << 20;
    Arm(absl::Seconds(1));
    Drain();
  }
  void Drain() {
    Socket().async_read_some(asio::buffer(*scratch_),
                             [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                               if (ec || n >= self->linger_left_) return self->Close();
                               self->linger_left_ -= n;
                               self->Drain();
                             });
  }

  void Close() {
    Disarm();
    beast::error_code ignored;
    Socket().shutdown(tcp::socket::shutdown_both, ignored);
    Socket().close(ignored);
  }

  // ---- generation: driven by the request channel's on_push ----

  void StartGeneration(openai::Endpoint endpoint) {
    // The engine thread's callback: post one Pump to this strand (coalesced:
    // at most one queued), unless the server stopped.
    std::weak_ptr<Session> weak = this->shared_from_this();
    auto on_push = [gate = core_.gate(), weak] {
      std::lock_guard<std::mutex> lock(gate->mu);
      if (!gate->open) return;
      if (std::shared_ptr<Session> s = weak.lock()) s->Notify();
    };
    HttpCore::Started started =
        core_.StartGeneration(endpoint, parser_->get().body(), std::move(on_push));
    if (started.job == nullptr) return Send(std::move(started.reply));
    parser_->get().body() = std::string();  // tokenized: the body is not needed any more
    job_ = std::move(started.job);
    keep_ = this->shared_from_this();
    ++core_.active_jobs();
    WatchPeer();
    if (job_->request.stream) WriteStreamHead();
    Pump();  // outputs may be queued already
  }

  void Notify() {
    if (pump_posted_.exchange(true)) return;
    asio::post(executor_, [self = this->shared_from_this()] {
      self->pump_posted_.store(false);
      self->Pump();
    });
  }

  // Disconnect detection while a response is pending: the socket turns
  // readable when the peer closes (or sends more: a pipelined request, left in
  // the socket; watching stops then, and a failed write still ends a stream).
  void WatchPeer() {
    const uint64_t gen = ++watch_gen_;
    Socket().async_wait(tcp::socket::wait_read,
                        [self = this->shared_from_this(), gen](beast::error_code ec) {
                          if (gen != self->watch_gen_ || self->job_ == nullptr) return;
                          if (ec == asio::error::operation_aborted) return;
                          if (ec || PeerClosed(self->Socket().native_handle())) {
                            self->peer_gone_ = true;
                            self->Pump();
                          }
                        });
  }

  // Pops the outputs that arrived and moves the response on.
  void Pump() {
    if (job_ == nullptr) return;
    Job& job = *job_;
    const bool stream = job.request.stream;
    // Pops what arrived. A stream is checked against the bound after each
    // output (an engine faster than this thread must not outrun the check);
    // once aborted, the rest only completes the job (its final output included).
    const size_t max_pending = core_.options().max_pending_stream_bytes;
    while (std::optional<EngineOutput> out = job.channel->TryPop()) {
      if (!stream || job.aborted) {
        job.output->Apply(*out);
        continue;
      }
      core_.AppendEvents(job, *out, &pending_);
      if (pending_.size() > max_pending) {
        spdlog::warn("http: {} aborted: its client is over {} bytes of events behind", job.id,
                     max_pending);
        HttpCore::AbortJob(job);
        pending_.clear();
      }
    }
    if (!job.aborted && (peer_gone_ || core_.stopping())) {
      HttpCore::AbortJob(job);
      pending_.clear();
    }
    if (!job.done()) return Flush();
    if (job.aborted) return FinishAborted();
    if (!stream) {
      core_.LogDone(job);
      Reply r = core_.FinalReply(job);
      EndJob();
      return Send(std::move(r));
    }
    if (!final_) {
      core_.AppendFinalEvents(job, &pending_);
      core_.LogDone(job);
      final_ = true;
    }
    Flush();
  }

  // The job ended aborted (the client went away, or fell too far behind, or
  // the server stops): logged once its final outputs came; the connection ends.
  void FinishAborted() {
    core_.LogDone(*job_);
    core_.Responded(job_->request.stream ? 200 : 499);
    EndJob();
    Close();
  }

  void EndJob() {
    if (!job_->done()) HttpCore::AbortJob(*job_);
    job_.reset();
    --core_.active_jobs();
    ++watch_gen_;
    if (!writing_) {
      beast::error_code ignored;
      Socket().cancel(ignored);  // the peer watch (nothing else is pending)
      stream_serializer_.reset();
      stream_head_.reset();
    }  // else a write in flight may be the head's, which reads both until its handler runs
    pending_.clear();
    final_ = head_written_ = peer_gone_ = false;
    keep_.reset();  // last: callers hold their own reference
  }

  void WriteStreamHead() {
    stream_head_.emplace(http::status::ok, 11);
    stream_head_->set(http::field::content_type, "text/event-stream");
    stream_head_->set(http::field::cache_control, "no-cache");
    stream_head_->chunked(true);
    stream_head_->keep_alive(parser_->get().keep_alive());
    stream_serializer_.emplace(*stream_head_);
    writing_ = true;
    Arm(core_.options().write_timeout);
    http::async_write_header(stream_, *stream_serializer_,
                             [self = this->shared_from_this()](beast::error_code ec, size_t) {
                               self->Wrote(ec);
                               self->head_written_ = !ec;
                               if (self->job_ != nullptr) self->Pump();
                             });
  }

  // Streaming: writes what is pending as one chunk once the previous write
  // completed (backpressure); after the final events, the last chunk.
  void Flush() {
    if (job_ == nullptr || !job_->request.stream || writing_ || !head_written_ || peer_gone_) {
      return;
    }
    if (pending_.empty()) {
      if (final_) WriteLastChunk();
      return;
    }
    in_flight_ = absl::StrCat(absl::Hex(pending_.size()), "\r\n", pending_, "\r\n");
    pending_.clear();
    writing_ = true;
    Arm(core_.options().write_timeout);
    asio::async_write(stream_, asio::buffer(in_flight_),
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        self->Wrote(ec);
                        if (self->job_ != nullptr) self->Pump();
                      });
  }

  void Wrote(beast::error_code ec) {
    Disarm();
    writing_ = false;
    in_flight_.clear();
    if (ec) peer_gone_ = true;  // a failed or timed-out write: the client is gone
  }

  void WriteLastChunk() {
    static constexpr std::string_view kLastChunk = "0\r\n\r\n";
    writing_ = true;
    Arm(core_.options().write_timeout);
    asio::async_write(stream_, asio::buffer(kLastChunk.data(), kLastChunk.size()),
                      [self = this->shared_from_this()](beast::error_code ec, size_t) {
                        self->Wrote(ec);
                        if (self->job_ == nullptr) return;
                        const bool keep_alive =
                            !ec && self->stream_head_->keep_alive() && !self->core_.stopping();
                        self->core_.Responded(200);
                        self->EndJob();
                        if (ec) return self->Close();
                        if (!keep_alive) return self->Linger();
                        self->ReadRequest();
                      });
  }

  HttpCore& core_;
  Stream stream_;
  const tcp::socket::executor_type executor_;  // the connection's strand
  asio::steady_timer timer_;
  const uint64_t id_;
  uint64_t timer_gen_ = 0;
  bool timed_out_ = false;
  beast::flat_buffer buffer_;  // read ahead: the next (pipelined) request's bytes stay here
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> res_;
  int status_ = 0;
  std::unique_ptr<std::array<char, 4096>> scratch_;  // Linger only
  size_t linger_left_ = 0;
  // The generation in flight (null when none) and what keeps the session alive meanwhile.
  std::shared_ptr<Job> job_;
  std::shared_ptr<Session> keep_;
  std::atomic<bool> pump_posted_{false};  // set by the engine thread (Notify)
  uint64_t watch_gen_ = 0;
  bool peer_gone_ = false;
  // Streaming: the head, events not yet written (coalesced), the chunk being written.
  std::optional<http::response<http::empty_body>> stream_head_;
  std::optional<http::response_serializer<http::empty_body>> stream_serializer_;
  std::string pending_, in_flight_;
  bool writing_ = false, head_written_ = false, final_ = false;
};

template <typename Stream>
void HttpCore::Open(Stream stream) {
  std::make_shared<Session<Stream>>(*this, std::move(stream), ++next_session_)->Start();
}

void HttpCore::Accept() {
  acceptor_->async_accept(asio::make_strand(*ioc_), [this](beast::error_code ec, tcp::socket sock) {
    if (stopping() || ec == asio::error::operation_aborted) return;
    if (ec) {
      // Out of descriptors (EMFILE) or a connection reset before accept: try
      // again shortly instead of spinning.
      spdlog::warn("http: accept failed: {}", ec.message());
      accept_retry_->expires_after(std::chrono::milliseconds(50));
      accept_retry_->async_wait([this](beast::error_code wec) {
        if (!wec && !stopping()) Accept();
      });
      return;
    }
    beast::error_code ignored;
    sock.set_option(tcp::no_delay(true), ignored);  // SSE events and small responses at once
    if (tls_ != nullptr) {
      Open(asio::ssl::stream<tcp::socket>(std::move(sock), *tls_));
    } else {
      Open(std::move(sock));
    }
    Accept();
  });
}

absl::Status HttpCore::Bind(asio::ssl::context* tls) {
  tls_ = tls;
  std::random_device rd;
  id_salt_ = (static_cast<uint64_t>(rd()) << 32) | rd();  // ids differ across restarts
  Routes();
  ioc_ = std::make_unique<asio::io_context>(options_.io_threads);
  const auto unavailable = [this](const std::string& why) {
    return absl::UnavailableError(absl::StrCat("cannot bind the HTTP server to ", options_.host,
                                               ":", options_.port, " (", why, ")"));
  };
  beast::error_code ec;
  tcp::resolver resolver(*ioc_);
  const auto endpoints =
      resolver.resolve(options_.host, std::to_string(options_.port),
                       tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty()) return unavailable(ec ? ec.message() : "no address");
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  acceptor_ = std::make_unique<tcp::acceptor>(asio::make_strand(*ioc_));
  acceptor_->open(endpoint.protocol(), ec);
  if (!ec) acceptor_->set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_->bind(endpoint, ec);
  // The backlog is the kernel's maximum (a burst of connects must not wait
  // for SYN retransmits).
  if (!ec) acceptor_->listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return unavailable(absl::StrCat(ec.message(), ": address in use, or not of this host"));
  port_ = acceptor_->local_endpoint().port();
  accept_retry_ = std::make_unique<asio::steady_timer>(acceptor_->get_executor());
  return absl::OkStatus();
}

void HttpCore::Start() {
  started_ = true;
  work_.emplace(ioc_->get_executor());
  asio::post(acceptor_->get_executor(), [this] { Accept(); });
  for (int i = 0; i < options_.io_threads; ++i) {
    threads_.emplace_back([this] {
      for (;;) {
        try {
          ioc_->run();
          return;
        } catch (const std::exception& e) {  // a handler threw: keep serving
          spdlog::error("http: I/O thread: {}", e.what());
        }
      }
    });
  }
}

void HttpCore::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_.store(true);
  if (started_) {
    asio::post(acceptor_->get_executor(), [this] {
      beast::error_code ignored;
      acceptor_->close(ignored);
      accept_retry_->cancel();
    });
    // Requests in flight are aborted (Pump sees stopping()); responses whose
    // final output came are written. At most a second.
    for (const std::shared_ptr<SessionBase>& s : Sessions()) s->Wake();
    for (int i = 0; i < 100 && active_jobs_.load() > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  {
    std::lock_guard<std::mutex> lock(gate_->mu);
    gate_->open = false;
  }
  work_.reset();
  ioc_->stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  // No I/O thread runs now: the sessions left are ended from here.
  for (const std::shared_ptr<SessionBase>& s : Sessions()) s->Shutdown();
  accept_retry_.reset();
  acceptor_.reset();
  ioc_.reset();  // destroys the pending handlers, and with them the sessions
}

// The OpenSSL errors queued by a failed load, oldest first ("" when none).
std::string OpenSslErrors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    absl::StrAppend(&out, out.empty() ? "" : "; ", buf);
  }
  return out;
}

absl::Status CheckTlsOptions(const HttpServerOptions& options) {
  if (options.ssl_certfile.empty() != options.ssl_keyfile.empty()) {
    return absl::InvalidArgumentError(
        "--ssl-certfile and --ssl-keyfile go together (TLS needs both)");
  }
  if (options.ssl_cert_reqs < 0 || options.ssl_cert_reqs > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--ssl-cert-reqs must be 0 (CERT_NONE), 1 (CERT_OPTIONAL) or 2 (CERT_REQUIRED), got ",
        options.ssl_cert_reqs));
  }
  if (!options.ssl_ca_certs.empty() && options.ssl_certfile.empty()) {
    return absl::InvalidArgumentError(
        "--ssl-ca-certs needs --ssl-certfile and --ssl-keyfile (TLS)");
  }
  if (options.ssl_cert_reqs == 0 && !options.ssl_ca_certs.empty()) {
    // Would load the CAs and never ask for a client certificate: an operator who
    // gave the CAs expects client certificates to be checked.
    return absl::InvalidArgumentError(
        "--ssl-ca-certs needs --ssl-cert-reqs 1 (CERT_OPTIONAL) or 2 (CERT_REQUIRED); with "
        "--ssl-cert-reqs 0 (CERT_NONE, the default) no client certificate would be checked");
  }
  if (options.ssl_cert_reqs != 0 && options.ssl_ca_certs.empty()) {
    return absl::InvalidArgumentError(
        "--ssl-cert-reqs 1 or 2 needs --ssl-ca-certs (the CAs that sign client certificates)");
  }
  for (const std::string* path :
       {&options.ssl_certfile, &options.ssl_keyfile, &options.ssl_ca_certs}) {
    if (path->empty()) continue;
    if (access(path->c_str(), R_OK) != 0) {
      const char* flag = path == &options.ssl_certfile  ? "--ssl-certfile "
                         : path == &options.ssl_keyfile ? "--ssl-keyfile "
                                                        : "--ssl-ca-certs ";
      return absl::InvalidArgumentError(absl::StrCat(flag, *path, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

// Mutual TLS: trust these CAs for client certificates, name them in the
// CertificateRequest, and ask for (1) or demand (2) a client certificate.
absl::Status LoadClientCas(SSL_CTX* ctx, const HttpServerOptions& options) {
  ERR_clear_error();
  STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(options.ssl_ca_certs.c_str());
  if (names == nullptr ||
      SSL_CTX_load_verify_locations(ctx, options.ssl_ca_certs.c_str(), nullptr) != 1) {
    if (names != nullptr) sk_X509_NAME_pop_free(names, X509_NAME_free);
    const std::string why = OpenSslErrors();
    return absl::InvalidArgumentError(
        absl::StrCat("--ssl-ca-certs ", options.ssl_ca_certs, ": no PEM CA certificate loaded",
                     why.empty() ? "" : absl::StrCat(" (", why, ")")));
  }
  SSL_CTX_set_client_CA_list(ctx, names);  // takes ownership
  const int mode = options.ssl_cert_reqs == 1 ? SSL_VERIFY_PEER
                                              : SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
  SSL_CTX_set_verify(ctx, mode, nullptr);
  return absl::OkStatus();
}

// HTTPS with the PEM certificate chain and private key of --ssl-certfile /
// --ssl-keyfile (TLS 1.2 and later; ciphers are OpenSSL's defaults, i.e. the
// system openssl.cnf); null for plain HTTP.
absl::StatusOr<std::unique_ptr<asio::ssl::context>> MakeTlsContext(
    const HttpServerOptions& options) {
  if (absl::Status s = CheckTlsOptions(options); !s.ok()) return s;
  if (options.ssl_certfile.empty()) return std::unique_ptr<asio::ssl::context>();
  auto tls = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_server);
  SSL_CTX* ctx = tls->native_handle();
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  ERR_clear_error();
  if (SSL_CTX_use_certificate_chain_file(ctx, options.ssl_certfile.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx, options.ssl_keyfile.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    const std::string why = OpenSslErrors();
    return absl::InvalidArgumentError(
        absl::StrCat("--ssl-certfile ", options.ssl_certfile, " / --ssl-keyfile ",
                     options.ssl_keyfile, ": not a PEM certificate and its matching private key",
                     why.empty() ? "" : absl::StrCat(" (", why, ")")));
  }
  if (!options.ssl_ca_certs.empty()) {
    if (absl::Status s = LoadClientCas(ctx, options); !s.ok()) return s;
  }
  return tls;
}

}  // namespace

struct HttpServer::Impl {
  std::unique_ptr<asio::ssl::context> tls;  // null: plain HTTP
  std::unique_ptr<HttpCore> core;
};

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(const HttpServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port must be in [0, 65535], got ", options.port));
  }
  if (options.max_request_body_bytes < 64) {
    return absl::InvalidArgumentError("--max-request-body-bytes must be >= 64");
  }
  if (options.io_threads < 1 || options.io_threads > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--http-io-threads must be in [1, 64], got ", options.io_threads));
  }
  auto impl = std::make_unique<Impl>();
  absl::StatusOr<std::unique_ptr<asio::ssl::context>> tls = MakeTlsContext(options);
  if (!tls.ok()) return tls.status();
  impl->tls = *std::move(tls);
  impl->core = std::make_unique<HttpCore>(options);
  if (absl::Status s = impl->core->Bind(impl->tls.get()); !s.ok()) return s;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->core->port(); }

void HttpServer::Start() { impl_->core->Start(); }

void HttpServer::Attach(std::unique_ptr<HttpBackend> backend) {
  impl_->core->Attach(std::move(backend));
}

void HttpServer::Stop() {
  if (impl_ != nullptr) impl_->core->Stop();
}

}  // namespace pagedserve
