// The HTTP front end in process: a real HttpServer (Boost.Beast, a socket on
// 127.0.0.1, port 0) over a real EngineLoop whose Engine runs a scripted
// executor (tests/engine/scripted_executor.h, no model) that can be held at a
// gate or made to fail a step. Clients are raw sockets on their own threads,
// so the request bytes (chunked bodies, a body that never ends) are exactly
// what each test says. Covers what needs the server and the engine thread
// together: fatal engine errors as OpenAI error objects (500 server_error, JSON
// and SSE), chunked request bodies under --max-request-body-bytes, and
// concurrent clients (streaming, an abandoned stream, health during a held
// step). Labelled tsan: written to be ThreadSanitizer-clean, no timed asserts
// (waits are bounded only to turn a hang into a failure).
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "runtime/engine/engine_loop.h"
#include "runtime/frontend/http_server.h"
#include "runtime/tokenizer/loaders.h"
#include "tests/common/fixture_tokenizer.h"
#include "tests/engine/scripted_executor.h"

namespace pagedserve {
namespace {

using json = nlohmann::json;
using testing::ScriptedExecutor;

const Tokenizer& Tok() { return testing::FixtureTokenizer(); }

int32_t Id(const std::string& text) {
  EncodeOptions o;
  o.add_special_tokens = false;
  return Tok().Encode(text, o).at(0);
}

// A ScriptedExecutor whose steps wait at a gate (closed: step k waits unless
// k <= free_steps) and whose step `fail_at` (1-based, 0 = never) returns an
// error, as a lost worker makes Execute fail.
class GatedExecutor : public Executor {
 public:
  explicit GatedExecutor(std::unique_ptr<ScriptedExecutor> inner) : inner_(std::move(inner)) {}
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    std::unique_lock<std::mutex> lock(mu_);
    const int step = ++entered_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_ || step <= free_steps_; });
    if (fail_at_ > 0 && step >= fail_at_)
      return absl::UnavailableError("worker rank 1 lost: scripted");
    return inner_->Execute(plan);
  }
  absl::Status Shutdown() override { return absl::OkStatus(); }
  int64_t num_device_blocks() const override { return inner_->num_device_blocks(); }
  int64_t num_cpu_blocks() const override { return inner_->num_cpu_blocks(); }

  void Hold(int free_steps) {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = false;
    free_steps_ = free_steps;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // Held: lets steps up to `free_steps` run.
  void Allow(int free_steps) {
    std::lock_guard<std::mutex> lock(mu_);
    free_steps_ = free_steps;
    cv_.notify_all();
  }
  void FailAt(int step) {
    std::lock_guard<std::mutex> lock(mu_);
    fail_at_ = step;
  }
  // Waits until `n` steps have entered Execute (false after 60 s: a hang).
  bool WaitEntered(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return entered_ >= n; });
  }
  int entered() {
    std::lock_guard<std::mutex> lock(mu_);
    return entered_;
  }

 private:
  std::unique_ptr<ScriptedExecutor> inner_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = true;
  int free_steps_ = 0;
  int fail_at_ = 0;
  int entered_ = 0;
};

constexpr size_t kMaxBody = 4096;

struct Server {
  GatedExecutor* exec = nullptr;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<EngineLoop> loop;
  std::unique_ptr<HttpServer> http;
  std::atomic<bool> stop{false}, abort_now{false};
  std::thread engine_thread;
  std::mutex status_mu;
  std::map<int, int> statuses;  // HttpServerOptions::on_response: responses by status code

  // What a test may change; the rest is fixed above.
  struct Config {
    absl::Duration read_timeout = absl::Seconds(5);  // --http-timeout: reading one request
    // false: the HTTP server runs without its backend, as `pagedserve serve`
    // before the model is loaded and every worker rank answered (Attach()).
    bool attach = true;
    size_t max_body = kMaxBody;  // --max-request-body-bytes
    int64_t max_queue_len = 256;
    size_t max_pending_stream_bytes = kMaxPendingStreamBytes;
    int32_t max_model_len = 256;
    int64_t device_blocks = 64;                            // of 16 tokens
    absl::Duration keep_alive_timeout = absl::Seconds(5);  // --http-keep-alive-timeout
  };

  explicit Server(absl::Duration read_timeout = absl::Seconds(5), bool attach = true,
                  size_t max_body = kMaxBody, int64_t max_queue_len = 256)
      : Server(Config{read_timeout, attach, max_body, max_queue_len}) {}

  explicit Server(const Config& c) {
    // Prompt "A" continues " one two three", then " x" for ever (no EOS).
    auto inner = std::make_unique<ScriptedExecutor>(
        ScriptedExecutor::Script{{Id("A"), {{Id(" one"), Id(" two"), Id(" three")}}}},
        c.device_blocks, 0, 16, Id(" x"));
    auto gated = std::make_unique<GatedExecutor>(std::move(inner));
    exec = gated.get();
    EngineOptions o;
    o.scheduler.block_size = 16;
    o.scheduler.max_model_len = c.max_model_len;
    o.scheduler.max_num_batched_tokens = 512;
    auto e = Engine::Create(o, &Tok(), std::move(gated), {Tok().eos_id()});
    EXPECT_TRUE(e.ok()) << e.status();
    engine = *std::move(e);
    EngineLoopOptions lo;
    lo.idle_wait = absl::Milliseconds(5);
    lo.max_queue_len = c.max_queue_len;
    loop = std::make_unique<EngineLoop>(engine.get(), lo);
    engine_thread = std::thread([this] { loop->Run(stop, abort_now).IgnoreError(); });
    HttpServerOptions ho;
    ho.port = 0;
    ho.served_model_name = "scripted";
    ho.max_request_body_bytes = c.max_body;
    ho.max_pending_stream_bytes = c.max_pending_stream_bytes;
    ho.read_timeout = c.read_timeout;
    ho.keep_alive_timeout = c.keep_alive_timeout;
    ho.io_threads = 2;
    ho.log_requests = false;
    ho.on_response = [this](int status) {
      std::lock_guard<std::mutex> lock(status_mu);
      ++statuses[status];
    };
    auto h = HttpServer::Create(ho);
    EXPECT_TRUE(h.ok()) << h.status();
    http = *std::move(h);
    http->Start();
    if (c.attach) Attach();
  }
  void Attach() {
    auto backend = std::make_unique<HttpBackend>();
    backend->loop = loop.get();
    backend->metrics_text = [] { return std::string("# scripted\n"); };
    http->Attach(std::move(backend));
  }
  ~Server() {
    exec->Open();
    http->Stop();
    stop.store(true);
    abort_now.store(true);
    engine_thread.join();
  }
  int port() const { return http->port(); }

  // Waits (bounded: the callback runs after the response is written, so it may
  // come after the client read it) until on_response counted `n` responses of
  // `status`; the count then.
  int WaitStatusCount(int status, int n) {
    for (int i = 0; i < 3000; ++i) {
      {
        std::lock_guard<std::mutex> lock(status_mu);
        if (statuses[status] >= n) return statuses[status];
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::lock_guard<std::mutex> lock(status_mu);
    return statuses[status];
  }

  // Waits (bounded) until no request is in flight and no KV block is used.
  bool WaitIdle() {
    for (int i = 0; i < 6000; ++i) {
      const EngineSnapshot s = loop->Snapshot();
      if (s.in_flight == 0 && s.kv_blocks_used == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
};

// A connected client socket with a receive timeout (a hang becomes a failure).
int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_GE(fd, 0);
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << std::strerror(errno);
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// Reads until `until` occurs in what was read (empty: until the peer closes
// or the receive timeout).
std::string Receive(int fd, const std::string& until = "") {
  std::string out;
  char buf[4096];
  while (until.empty() || !absl::StrContains(out, until)) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

struct Response {
  int status = 0;
  std::string head;  // status line and headers
  std::string body;  // as sent (SSE: still in chunked framing)
};

Response Parse(const std::string& raw) {
  Response r;
  const size_t end = raw.find("\r\n\r\n");
  r.head = raw.substr(0, end);
  if (end != std::string::npos) r.body = raw.substr(end + 4);
  std::vector<std::string> first = absl::StrSplit(r.head.substr(0, r.head.find("\r\n")), ' ');
  if (first.size() < 2 || !absl::SimpleAtoi(first[1], &r.status)) r.status = -1;
  if (const size_t p = r.head.find("Content-Length: "); p != std::string::npos) {
    size_t len = 0;
    if (absl::SimpleAtoi(r.head.substr(p + 16, r.head.find("\r\n", p) - p - 16), &len) &&
        len <= r.body.size()) {
      r.body.resize(len);  // what follows belongs to another response
    }
  }
  return r;
}

// One request on a fresh connection (Connection: close); the whole response.
Response Request(int port, const std::string& method, const std::string& path,
                 const std::string& body = "") {
  const int fd = Connect(port);
  std::string req =
      absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
  if (method == "POST") {
    absl::StrAppend(&req, "Content-Type: application/json\r\nContent-Length: ", body.size(),
                    "\r\n");
  }
  absl::StrAppend(&req, "\r\n", body);
  EXPECT_TRUE(SendAll(fd, req));
  Response r = Parse(Receive(fd));
  close(fd);
  return r;
}

// The request headers of a chunked POST (the chunks follow separately).
std::string ChunkedHead(const std::string& path) {
  return absl::StrCat(
      "POST ", path,
      " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Type: application/json\r\n"
      "Transfer-Encoding: chunked\r\n\r\n");
}
std::string Chunk(const std::string& data) {
  return absl::StrCat(absl::Hex(data.size()), "\r\n", data, "\r\n");
}

json ErrorOf(const Response& r) {
  json j = json::parse(r.body, nullptr, false);
  return j.is_object() && j.contains("error") ? j["error"] : json();
}

// The JSON payloads of the SSE events in a streamed body.
std::vector<std::string> Events(const std::string& body) {
  std::vector<std::string> out;
  for (size_t p = body.find("data: "); p != std::string::npos; p = body.find("data: ", p)) {
    const size_t end = body.find("\n\n", p);
    out.push_back(body.substr(p + 6, end - p - 6));
    if (end == std::string::npos) break;
    p = end;
  }
  return out;
}

TEST(HttpServerTest, CompletesARequest) {
  Server s;
  Response r = Request(s.port(), "POST", "/v1/completions", R"({"prompt": "A", "max_tokens": 3})");
  ASSERT_EQ(r.status, 200) << r.head << r.body;
  json j = json::parse(r.body);
  EXPECT_EQ(j["choices"][0]["text"], " one two three");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u) << j["id"];
  // vLLM's request_id names the response; two requests may share one.
  for (int i = 0; i < 2; ++i) {
    Response named = Request(s.port(), "POST", "/v1/completions",
                             R"({"prompt": "A", "max_tokens": 1, "request_id": "trace-7"})");
    ASSERT_EQ(named.status, 200) << named.head << named.body;
    EXPECT_EQ(json::parse(named.body)["id"], "cmpl-trace-7");
  }
}

// One crafted request used to end the process: a chat message whose content
// nests 200,000 levels deep (400 KB, under the 1 MiB body limit) overflowed the
// handler thread's stack in a recursive JSON copy (SIGSEGV: HTTP, ZeroMQ and
// metrics gone). Now every route that parses JSON refuses it before parsing
// (json_limits.h) with a 400 that says why, and the server keeps serving.
TEST(HttpServerTest, DeeplyNestedBodiesAre400AndTheServerKeepsServing) {
  Server s(absl::Seconds(5), /*attach=*/true, /*max_body=*/1 << 20);
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const std::pair<std::string, std::string> attacks[] = {
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": )" + deep + "}]}"},
      {"/v1/completions", R"({"prompt": )" + deep + "}"},
      {"/tokenize", R"({"messages": [{"role": "user", "content": )" + deep + "}]}"},
      {"/detokenize", R"({"tokens": )" + deep + "}"},
  };
  for (const auto& [path, body] : attacks) {
    Response r = Request(s.port(), "POST", path, body);
    ASSERT_EQ(r.status, 400) << path << ": " << r.head;
    const json e = ErrorOf(r);
    EXPECT_NE(e.value("message", "").find("JSON nests deeper than 32 levels"), std::string::npos)
        << path << ": " << r.body;
  }
  Response ok = Request(s.port(), "POST", "/v1/completions", R"({"prompt": "A", "max_tokens": 3})");
  ASSERT_EQ(ok.status, 200) << ok.head << ok.body;
  EXPECT_EQ(json::parse(ok.body)["choices"][0]["text"], " one two three");
  EXPECT_TRUE(s.WaitIdle());
  // Every response was counted once, by status (pagedserve_http_responses_total).
  EXPECT_EQ(s.WaitStatusCount(400, 4), 4);
  EXPECT_EQ(s.WaitStatusCount(200, 1), 1);
  Response missing = Request(s.port(), "GET", "/no/such/route");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(s.WaitStatusCount(404, 1), 1);
}

// prompt + max_tokens over --max-model-len: 400 naming max_tokens when the
// client sent it (vLLM's answer), not a reply cut short with "length"; the
// completions default (16) is lowered to the room instead, per prompt.
TEST(HttpServerTest, MaxTokensBeyondTheContextIs400UnlessItIsTheDefault) {
  Server::Config c;
  c.max_model_len = 20;
  Server s(c);
  std::string prompt = "A";
  for (int i = 0; i < 14; ++i) prompt += " A";
  // As the server encodes a completions prompt (special tokens added).
  const int room = 20 - static_cast<int>(Tok().Encode(prompt).size());
  ASSERT_GE(room, 2);
  ASSERT_LT(room, 16);
  auto body = [&](const std::string& extra) {
    return absl::StrCat(R"({"prompt": ")", prompt, R"(")", extra, "}");
  };
  Response over = Request(s.port(), "POST", "/v1/completions",
                          body(absl::StrCat(R"(, "max_tokens": )", room + 1)));
  ASSERT_EQ(over.status, 400) << over.head << over.body;
  EXPECT_EQ(ErrorOf(over)["param"], "max_tokens");
  EXPECT_NE(ErrorOf(over).value("message", "").find(absl::StrCat("at most ", room, " tokens")),
            std::string::npos)
      << over.body;
  Response fits =
      Request(s.port(), "POST", "/v1/completions", body(absl::StrCat(R"(, "max_tokens": )", room)));
  ASSERT_EQ(fits.status, 200) << fits.head << fits.body;
  EXPECT_EQ(json::parse(fits.body)["usage"]["completion_tokens"], room);
  // No max_tokens: the default 16 becomes the room for the long prompt and
  // stays 16 for "A" (the room is below 16).
  Response defaulted = Request(s.port(), "POST", "/v1/completions",
                               absl::StrCat(R"({"prompt": [")", prompt, R"(", "A"]})"));
  ASSERT_EQ(defaulted.status, 200) << defaulted.head << defaulted.body;
  const json d = json::parse(defaulted.body);
  EXPECT_EQ(d["usage"]["completion_tokens"], room + 16) << d.dump();
  for (const json& choice : d["choices"]) EXPECT_EQ(choice["finish_reason"], "length");
  // n samples of the completions default over the KV cache: the client sent
  // n, not max_tokens, so n is named (and no "rest of the context": that is chat's).
  Response wide = Request(s.port(), "POST", "/v1/completions", R"({"prompt": "A", "n": 64})");
  ASSERT_EQ(wide.status, 400) << wide.head << wide.body;
  EXPECT_EQ(ErrorOf(wide)["param"], "n");
  const std::string why = ErrorOf(wide).value("message", "");
  EXPECT_NE(why.find("the default 16 tokens each"), std::string::npos) << why;
  EXPECT_EQ(why.find("rest of the context"), std::string::npos) << why;
  EXPECT_TRUE(s.WaitIdle());
}

// A request whose prompts outnumber the waiting queue (--max-queue-len) can
// never be admitted: 400 naming the prompt, not 429 "retry later" (each prompt
// is one engine request); one that fits is served.
TEST(HttpServerTest, MorePromptsThanTheQueueHoldsIs400) {
  Server s(absl::Seconds(5), /*attach=*/true, kMaxBody, /*max_queue_len=*/2);
  Response r = Request(s.port(), "POST", "/v1/completions",
                       R"({"prompt": ["A", "A", "A"], "max_tokens": 1})");
  ASSERT_EQ(r.status, 400) << r.head << r.body;
  EXPECT_EQ(ErrorOf(r)["param"], "prompt");
  EXPECT_NE(ErrorOf(r).value("message", "").find("--max-queue-len"), std::string::npos) << r.body;
  Response ok =
      Request(s.port(), "POST", "/v1/completions", R"({"prompt": ["A", "A"], "max_tokens": 1})");
  ASSERT_EQ(ok.status, 200) << ok.head << ok.body;
  EXPECT_EQ(json::parse(ok.body)["choices"].size(), 2u);
  EXPECT_TRUE(s.WaitIdle());
}

// The startup and readiness probes (GET /health): 503 while `pagedserve serve`
// is loading (the HTTP server listens before the model is loaded and before
// every worker rank sent its hello; serve_command.cc attaches the backend
// after MakeMpiExecutor returned), 200 once attached. Requests are refused
// meanwhile, not queued.
TEST(HttpServerTest, HealthIs503UntilTheModelIsLoadedAndEveryWorkerAnswered) {
  Server s(absl::Seconds(5), /*attach=*/false);
  Response h = Request(s.port(), "GET", "/health");
  EXPECT_EQ(h.status, 503) << h.head << h.body;
  EXPECT_EQ(json::parse(h.body, nullptr, false), json::parse(R"({"status": "loading"})"));
  Response r = Request(s.port(), "POST", "/v1/completions", R"({"prompt": "A", "max_tokens": 3})");
  EXPECT_EQ(r.status, 503) << r.head << r.body;
  s.Attach();
  h = Request(s.port(), "GET", "/health");
  EXPECT_EQ(h.status, 200) << h.head << h.body;
  r = Request(s.port(), "POST", "/v1/completions", R"({"prompt": "A", "max_tokens": 3})");
  EXPECT_EQ(r.status, 200) << r.head << r.body;
}

// A fatal engine error after some tokens (a lost worker: the loss watcher's
// EngineLoop::FailAll while the engine thread is stuck in a step) ends a
// non-streaming request with OpenAI's error object: 500 server_error with the
// engine's message, not a 200 whose choice says finish_reason "error".
TEST(HttpServerTest, RequestFailedByTheEngineIsA500ServerError) {
  Server s;
  s.exec->Hold(2);  // prefill and one decode, then the third step waits
  Response r;
  std::thread client([&] {
    r = Request(s.port(), "POST", "/v1/completions", R"({"prompt": "A", "max_tokens": 20})");
  });
  ASSERT_TRUE(s.exec->WaitEntered(3));  // steps 1 and 2 delivered a token each
  EXPECT_EQ(s.loop->FailAll(absl::UnavailableError("worker rank 1 lost")), 1);
  client.join();
  ASSERT_EQ(r.status, 500) << r.head << r.body;
  const json e = ErrorOf(r);
  ASSERT_TRUE(e.is_object()) << r.body;
  EXPECT_EQ(e["type"], "server_error");
  EXPECT_TRUE(absl::StrContains(e["message"].get<std::string>(), "worker rank 1 lost")) << e;
  EXPECT_FALSE(s.loop->healthy());
  EXPECT_EQ(Request(s.port(), "GET", "/health").status, 503);
}

// The same through the engine's own failure (Execute returns an error at the
// third step, after both requests got tokens; Engine::FailAll then reports
// their usage): the non-streaming reply is a 500, the stream ends with an
// error event of type server_error before [DONE].
TEST(HttpServerTest, StepFailureIsAServerErrorForJsonAndStream) {
  Server s;
  s.exec->Hold(0);
  s.exec->FailAt(3);
  std::string streamed;
  Response plain;
  std::thread stream_client([&] {
    streamed = Request(s.port(), "POST", "/v1/completions",
                       R"({"prompt": "A", "max_tokens": 20, "stream": true})")
                   .body;
  });
  std::thread plain_client([&] {
    plain = Request(s.port(), "POST", "/v1/completions", R"({"prompt": "A", "max_tokens": 20})");
  });
  // Both requests submitted (in the held first step or queued behind it), then
  // steps 1 and 2 run and step 3 fails.
  for (int i = 0; i < 6000 && s.loop->Snapshot().in_flight < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(s.loop->Snapshot().in_flight, 2);
  s.exec->Open();
  stream_client.join();
  plain_client.join();
  EXPECT_EQ(plain.status, 500) << plain.head << plain.body;
  EXPECT_EQ(ErrorOf(plain)["type"], "server_error") << plain.body;
  std::vector<std::string> events = Events(streamed);
  ASSERT_GE(events.size(), 2u) << streamed;  // the error event and [DONE] at least
  EXPECT_EQ(events.back(), "[DONE]");
  bool error_event = false;
  for (const std::string& ev : events) {
    json j = json::parse(ev, nullptr, false);
    if (j.is_object() && j.contains("error")) {
      error_event = true;
      EXPECT_EQ(j["error"]["type"], "server_error") << ev;
      EXPECT_TRUE(absl::StrContains(j["error"]["message"].get<std::string>(), "worker rank 1 lost"))
          << ev;
    }
  }
  EXPECT_TRUE(error_event) << streamed;
}

// Transfer-Encoding: chunked request bodies are read (Beast's parser) on
// every POST route.
TEST(HttpServerTest, AcceptsChunkedRequestBodies) {
  Server s;
  {
    const int fd = Connect(s.port());
    ASSERT_TRUE(SendAll(fd, ChunkedHead("/v1/completions") + Chunk(R"({"prompt": "A",)") +
                                Chunk(R"( "max_tokens": 3})") + "0\r\n\r\n"));
    Response r = Parse(Receive(fd));
    close(fd);
    ASSERT_EQ(r.status, 200) << r.head << r.body;
    EXPECT_EQ(json::parse(r.body)["choices"][0]["text"], " one two three");
  }
  {
    const int fd = Connect(s.port());
    ASSERT_TRUE(SendAll(
        fd, ChunkedHead("/tokenize") + Chunk(R"({"prompt")") + Chunk(R"(: "A"})") + "0\r\n\r\n"));
    Response r = Parse(Receive(fd));
    close(fd);
    ASSERT_EQ(r.status, 200) << r.head << r.body;
    EXPECT_EQ(json::parse(r.body)["tokens"], json::array({Id("A")}));
  }
}

// A chunked body beyond --max-request-body-bytes gets 413 as soon as it
// crosses the bound: the body here never ends (no last chunk), so a server
// that read it to the end before deciding would never answer. Other transfer
// codings are 501; Transfer-Encoding beside Content-Length is 400.
TEST(HttpServerTest, ChunkedBodyOverTheLimitIs413WithoutReadingItAll) {
  Server s;
  const int fd = Connect(s.port());
  ASSERT_TRUE(SendAll(fd, ChunkedHead("/v1/completions") + Chunk(R"({"prompt": ")")));
  const std::string filler(1024, 'a');
  for (size_t sent = 0; sent <= kMaxBody; sent += filler.size())
    ASSERT_TRUE(SendAll(fd, Chunk(filler)));
  Response r = Parse(Receive(fd, "}}"));  // the end of the error object
  close(fd);
  ASSERT_EQ(r.status, 413) << r.head << r.body;
  EXPECT_EQ(ErrorOf(r)["type"], "invalid_request_error") << r.body;
  EXPECT_TRUE(absl::StrContains(r.head, "Connection: close")) << r.head;

  const int gz = Connect(s.port());
  ASSERT_TRUE(SendAll(gz, "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"));
  EXPECT_EQ(Parse(Receive(gz, "}}")).status, 501);
  close(gz);
  const int both = Connect(s.port());
  ASSERT_TRUE(SendAll(both,
                      "POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
                      "Content-Length: 5\r\n\r\n0\r\n\r\n"));
  EXPECT_EQ(Parse(Receive(both, "}}")).status, 400);
  close(both);
  EXPECT_EQ(Request(s.port(), "GET", "/health").status, 200);  // still serving
}

// The number of HTTP responses in `raw` (status lines at the start of a
// response: the first bytes, or right after the previous response's body).
int CountResponses(const std::string& raw) {
  int n = 0;
  for (size_t p = raw.find("HTTP/1.1 "); p != std::string::npos; p = raw.find("HTTP/1.1 ", p + 1))
    ++n;
  return n;
}

// Two requests in one TCP write (pipelining, RFC 9112 9.3.2): both are
// answered, in order, on the one connection. (cpp-httplib 0.11's own loop
// dropped the bytes it had read ahead: one answer, then the connection hung
// until the keep-alive timeout.)
TEST(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  Server s;
  const int fd = Connect(s.port());
  const std::string body = R"({"prompt": "A"})";
  ASSERT_TRUE(SendAll(
      fd, absl::StrCat("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       "Content-Length: ",
                       body.size(), "\r\n\r\n", body,
                       "GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")));
  const std::string raw = Receive(fd);  // until the server closes (Connection: close)
  close(fd);
  ASSERT_EQ(CountResponses(raw), 2) << raw;
  const size_t second = raw.find("HTTP/1.1 ", 1);
  const Response first = Parse(raw.substr(0, second));
  EXPECT_EQ(first.status, 200) << raw;
  EXPECT_EQ(json::parse(first.body)["tokens"], json::array({Id("A")})) << raw;
  const Response version = Parse(raw.substr(second));
  EXPECT_EQ(version.status, 200) << raw;
  EXPECT_TRUE(absl::StrContains(version.body, "\"version\"")) << raw;
}

// A 413 sent before the body was read ends the connection: what the client
// sends after it (here a request, as a smuggler would write it into the body)
// is never parsed as another request. (cpp-httplib 0.11 kept reading the
// connection and answered it.) The smuggled bytes go out after the 413 has
// arrived, so that they cannot be lost in a read-ahead buffer either.
TEST(HttpServerTest, NothingAfterA413IsParsedAsARequest) {
  Server s;
  const std::string smuggled = "GET /version HTTP/1.1\r\nHost: x\r\n\r\n";
  auto after_answer = [&](const std::string& head, int status) {
    const int fd = Connect(s.port());
    ASSERT_TRUE(SendAll(fd, head));
    std::string raw = Receive(fd, "}}");  // the end of the error object
    SendAll(fd, smuggled);                // may fail: the server closed
    raw += Receive(fd);                   // until the server closes
    close(fd);
    EXPECT_EQ(CountResponses(raw), 1) << raw;
    EXPECT_EQ(Parse(raw).status, status) << raw;
    EXPECT_TRUE(absl::StrContains(raw, "Connection: close")) << raw;
  };
  // An oversized Content-Length: 413 before the body is read.
  after_answer(absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: ",
                            kMaxBody + 1, "\r\n\r\n"),
               413);
  // A chunked body that crosses the bound: 413 at the crossing.
  std::string chunked = ChunkedHead("/v1/completions");
  for (size_t sent = 0; sent <= kMaxBody; sent += 1024) chunked += Chunk(std::string(1024, 'a'));
  after_answer(chunked, 413);
  // Any answer given before the body was read (here 501, an unknown transfer coding).
  after_answer("POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501);
  EXPECT_EQ(Request(s.port(), "GET", "/health").status, 200);  // still serving
}

// Content-Length framing that leaves the body's end in doubt is a 400 before
// the body is read, and nothing after it is parsed as a request (found by a
// break test: two Content-Length headers, 30 and 83, were served by the first,
// and the rest of the "body" answered as a second request). A POST with no
// length at all is a 411 at once (cpp-httplib 0.11 waited for the client to
// close: a 408 at the read timeout).
TEST(HttpServerTest, AmbiguousOrMissingContentLengthIsRefusedAtOnce) {
  Server s;
  const std::string body = R"({"prompt": "A"})";
  const std::string smuggled = "GET /version HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const std::vector<std::tuple<std::string, std::string, int>> cases = {
      {"two lengths",
       absl::StrCat("Content-Length: ", body.size(),
                    "\r\nContent-Length: ", body.size() + smuggled.size(), "\r\n"),
       400},
      {"two equal lengths",
       absl::StrCat("Content-Length: ", body.size(), "\r\nContent-Length: ", body.size(), "\r\n"),
       400},
      {"signed length", absl::StrCat("Content-Length: +", body.size(), "\r\n"), 400},
      {"not a number", "Content-Length: abc\r\n", 400},
      {"no length", "", 411},
  };
  for (const auto& [name, headers, status] : cases) {
    const int fd = Connect(s.port());
    ASSERT_TRUE(SendAll(fd, absl::StrCat("POST /tokenize HTTP/1.1\r\nHost: x\r\n", headers, "\r\n",
                                         body, smuggled)))
        << name;
    const std::string raw = Receive(fd);  // until the server closes
    close(fd);
    EXPECT_EQ(CountResponses(raw), 1) << name << ": " << raw;
    EXPECT_EQ(Parse(raw).status, status) << name << ": " << raw;
    EXPECT_TRUE(absl::StrContains(raw, "Connection: close")) << name << ": " << raw;
  }
  EXPECT_EQ(Request(s.port(), "GET", "/health").status, 200);  // still serving
}

// A route under a method it does not take is a 405 naming the methods it
// does (Allow, RFC 9110 15.5.6); a path that is no route stays a 404.
TEST(HttpServerTest, WrongMethodIs405WithAllow) {
  Server s;
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"GET", "/v1/completions", "POST"}, {"PUT", "/v1/chat/completions", "POST"},
      {"DELETE", "/health", "GET, HEAD"}, {"PATCH", "/metrics", "GET, HEAD"},
      {"GET", "/tokenize", "POST"},
  };
  for (const auto& [method, path, allow] : cases) {
    const Response r = Request(s.port(), method, path);
    EXPECT_EQ(r.status, 405) << method << " " << path << ": " << r.head << r.body;
    EXPECT_TRUE(absl::StrContains(r.head, absl::StrCat("Allow: ", allow, "\r\n")))
        << method << " " << path << ": " << r.head;
    EXPECT_TRUE(absl::StrContains(ErrorOf(r)["message"].get<std::string>(), method)) << r.body;
  }
  EXPECT_EQ(Request(s.port(), "GET", "/v1/nothing").status, 404);
  EXPECT_EQ(Request(s.port(), "DELETE", "/v1/nothing").status, 404);
  EXPECT_EQ(Request(s.port(), "GET", "/health").status, 200);
}

// The request line and headers together are bounded (kMaxRequestHeadBytes):
// a flood of headers is a 431 once the bound is passed, with the connection
// closed, and the server keeps serving (found by a break test: 200 MB of
// headers within --http-timeout were read and kept; eight such clients grew
// the server by 1.1 GB). Headers just under the bound are served.
TEST(HttpServerTest, HeaderFloodIs431AndTheServerKeepsServing) {
  Server s;
  const std::string line = absl::StrCat("X-Filler: ", std::string(1000, 'f'), "\r\n");
  {  // headers that never end, a little past the bound
    const int fd = Connect(s.port());
    std::string head = "GET /health HTTP/1.1\r\nHost: x\r\n";
    while (head.size() < kMaxRequestHeadBytes + 4096) head += line;
    ASSERT_TRUE(SendAll(fd, head));
    const std::string raw = Receive(fd);  // until the server closes
    close(fd);
    EXPECT_EQ(CountResponses(raw), 1) << raw;
    const Response r = Parse(raw);
    EXPECT_EQ(r.status, 431) << raw;
    EXPECT_TRUE(
        absl::StrContains(ErrorOf(r)["message"].get<std::string>(), "headers are too large"))
        << raw;
    EXPECT_TRUE(absl::StrContains(raw, "Connection: close")) << raw;
  }
  {  // the same lines, ending under the bound: served
    const int fd = Connect(s.port());
    std::string head = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
    while (head.size() + line.size() + 2 < kMaxRequestHeadBytes) head += line;
    ASSERT_TRUE(SendAll(fd, head + "\r\n"));
    const std::string raw = Receive(fd);
    close(fd);
    EXPECT_EQ(Parse(raw).status, 200) << raw;
  }
  EXPECT_EQ(Request(s.port(), "GET", "/health").status, 200);  // still serving
}

// Chunked framing is checked as the body is read: a negative chunk size is a
// 400 at once (cpp-httplib 0.11's strtoul made "-5" a wait for 2^64 - 5 bytes,
// ended only by --http-timeout; the server here has a 60 s timeout and the
// client waits 30 s at most), and so are bytes where the CRLF after a chunk's
// data belongs (cpp-httplib 0.11 ended the body there without an error and
// served the request, here a valid one).
TEST(HttpServerTest, MalformedChunkedBodiesAre400AtOnce) {
  Server s(absl::Seconds(60));
  const std::string body = R"({"prompt": "A"})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"negative size", "-5\r\nhello\r\n0\r\n\r\n"},
      {"hex prefix", "0x5\r\nhello\r\n0\r\n\r\n"},
      {"no CRLF after the data",
       absl::StrCat(absl::Hex(body.size()), "\r\n", body, "XX\r\n0\r\n\r\n")},
      {"LF alone after the size",
       absl::StrCat(absl::Hex(body.size()), "\n", body, "\r\n0\r\n\r\n")},
  };
  for (const auto& [name, chunks] : cases) {
    const int fd = Connect(s.port());
    ASSERT_TRUE(SendAll(fd, ChunkedHead("/tokenize") + chunks)) << name;
    const std::string raw = Receive(fd);  // the server closes after the 400
    close(fd);
    EXPECT_EQ(CountResponses(raw), 1) << name << ": " << raw;
    const Response r = Parse(raw);
    EXPECT_EQ(r.status, 400) << name << ": " << raw;
    EXPECT_TRUE(absl::StrContains(ErrorOf(r)["message"].get<std::string>(), "RFC 9112"))
        << name << ": " << raw;
  }
  // The well-formed body, with an extension and a trailer, still works.
  const int fd = Connect(s.port());
  ASSERT_TRUE(
      SendAll(fd, ChunkedHead("/tokenize") +
                      absl::StrCat(absl::Hex(body.size()), ";ext=1\r\n", body, "\r\n0\r\n\r\n")));
  const Response ok = Parse(Receive(fd));
  close(fd);
  EXPECT_EQ(ok.status, 200) << ok.head << ok.body;
}

// --http-timeout is a deadline for the whole request, not for each read: a
// client that trickles its body one byte every 100 ms (each read well within
// the 1 s timeout) is answered 408 and cut off before it has sent the whole
// 100-byte body (10 s). With only a per-read timeout the body would arrive
// whole and be served.
TEST(HttpServerTest, ATrickledBodyMeetsTheRequestDeadline) {
  Server s(absl::Seconds(1));
  const std::string body = absl::StrCat(R"({"prompt": ")", std::string(86, 'a'), R"("})");
  ASSERT_EQ(body.size(), 100u);
  const int fd = Connect(s.port());
  ASSERT_TRUE(SendAll(fd, absl::StrCat("POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                       "application/json\r\nContent-Length: ",
                                       body.size(), "\r\n\r\n")));
  size_t sent = 0;
  std::string raw;
  for (; sent < body.size(); ++sent) {
    if (!SendAll(fd, body.substr(sent, 1))) break;  // the server closed
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 0) > 0) break;  // an answer (or the close) came
  }
  raw = Receive(fd);
  close(fd);
  EXPECT_LT(sent, body.size()) << "the whole trickled body was read: " << raw;
  EXPECT_EQ(Parse(raw).status, 408) << raw;
  EXPECT_EQ(Request(s.port(), "GET", "/health").status, 200);  // still serving
}

// The threads of this process (/proc/self/task).
int ThreadCount() {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(dir)) n += e->d_name[0] != '.';
  closedir(dir);
  return n;
}

// Open connections cost no thread: 300 clients, half idle in keep-alive after
// an answered request and half stalled half-way through a request line, leave
// the process's thread count where it was, /health is answered meanwhile, and
// none of them is answered or closed early. (The cpp-httplib server ran one
// thread per connection: 300 more.)
TEST(HttpServerTest, OpenConnectionsCostNoThreads) {
  Server s;
  ASSERT_EQ(Request(s.port(), "GET", "/health").status, 200);
  const int before = ThreadCount();
  ASSERT_GT(before, 0);
  std::vector<int> fds;
  for (int i = 0; i < 300; ++i) {
    const int fd = Connect(s.port());
    fds.push_back(fd);
    if (i % 2 == 0) {
      ASSERT_TRUE(SendAll(fd, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"));
      ASSERT_EQ(Parse(Receive(fd, "}")).status, 200);  // answered; the connection stays open
    } else {
      ASSERT_TRUE(SendAll(fd, "GET /hea"));
    }
  }
  EXPECT_EQ(Request(s.port(), "GET", "/health").status, 200);
  EXPECT_EQ(ThreadCount(), before);
  int answered_or_closed = 0;
  for (const int fd : fds) {
    pollfd p{fd, POLLIN, 0};
    answered_or_closed += poll(&p, 1, 0) != 0;
    close(fd);
  }
  EXPECT_EQ(answered_or_closed, 0);
}

// --ssl-ca-certs with --ssl-cert-reqs 0 (CERT_NONE) would load the CAs and check
// no client certificate: refused at start, naming both flags.
TEST(HttpServerTest, CaCertsWithoutClientCertificateChecksIsAnError) {
  HttpServerOptions o;
  o.port = 0;
  o.ssl_certfile = "/nonexistent/cert.pem";
  o.ssl_keyfile = "/nonexistent/key.pem";
  o.ssl_ca_certs = "/nonexistent/ca.pem";
  o.ssl_cert_reqs = 0;
  auto h = HttpServer::Create(o);
  ASSERT_FALSE(h.ok());
  EXPECT_EQ(h.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(h.status().message(), "--ssl-cert-reqs")) << h.status();
  EXPECT_TRUE(absl::StrContains(h.status().message(), "--ssl-ca-certs")) << h.status();
}

// Concurrent clients on the HTTP threads while the engine thread steps:
// streaming and non-streaming requests, a stream abandoned after its first
// event (the request is aborted, its blocks come back), and health / models /
// metrics answered while a step is held at the gate (order, not time: the
// step cannot finish before they answer).
// SSE backpressure: a client that stops reading while its stream is produced
// has its request aborted once more than max_pending_stream_bytes of events
// wait behind the write in flight, so the server holds a bounded amount for it
// (not the whole stream); its KV blocks are freed and the server keeps
// serving. The control: a stream of the same shape read as it comes completes.
TEST(HttpServerTest, AStreamWhoseClientStopsReadingIsAbortedNotBuffered) {
  Server::Config c;
  c.max_pending_stream_bytes = 64 << 10;
  c.max_model_len = 12288;
  c.device_blocks = 8 * 12288 / 16 + 16;
  Server s(c);
  // The slow stream (8 x 12,000 events, ~16 MB) is several times what the
  // socket buffers of both ends can hold (tcp_wmem's maximum: 4 MiB by default).
  constexpr int kN = 8, kControlTokens = 200, kSlowTokens = 12000;
  auto body = [](int max_tokens) {
    return absl::StrCat(R"({"prompt": "A", "stream": true, "n": )", kN, R"(, "max_tokens": )",
                        max_tokens, "}");
  };
  // The control: 8 x 200 events (~270 KB, four times the bound) read as they
  // come, the engine paced 10 steps at a time behind the reader (an engine
  // stand-in that produces a whole stream at once would be over the bound
  // before the first write).
  {
    s.exec->Hold(0);
    const int fd = Connect(s.port());
    const std::string b = body(kControlTokens);
    ASSERT_TRUE(SendAll(fd, absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                         "Content-Type: application/json\r\nContent-Length: ",
                                         b.size(), "\r\nConnection: close\r\n\r\n", b)));
    std::atomic<int> seen{0};
    std::string raw;
    std::thread reader([&] {
      char buf[4096];
      size_t scan = 0;
      for (;;) {
        const ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n <= 0) break;
        raw.append(buf, static_cast<size_t>(n));
        int found = 0;
        for (size_t p = raw.find("data: ", scan); p != std::string::npos;
             p = raw.find("data: ", p + 6)) {
          ++found;
          scan = p + 6;
        }
        seen += found;
      }
    });
    for (int step = 10; step <= kControlTokens; step += 10) {
      s.exec->Allow(step);
      bool caught_up = false;  // every event of `step` steps read (bounded wait)
      for (int i = 0; i < 6000 && !caught_up; ++i) {
        caught_up = seen.load() >= kN * step;
        if (!caught_up) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      ASSERT_TRUE(caught_up) << "step " << step << ": " << seen.load() << " events read";
    }
    s.exec->Open();
    reader.join();
    close(fd);
    const Response control = Parse(raw);
    ASSERT_EQ(control.status, 200) << control.head;
    const std::vector<std::string> events = Events(control.body);
    ASSERT_FALSE(events.empty()) << control.head;
    EXPECT_EQ(events.back(), "[DONE]");
    EXPECT_EQ(static_cast<int>(events.size()), kN * kControlTokens + 1)
        << "an event per choice and step (the last with its finish reason), [DONE]";
  }
  const int64_t before = s.loop->Snapshot().tokens.generation_tokens;
  ASSERT_EQ(before, kN * kControlTokens);

  // The slow reader: a small receive window, and nothing read until the
  // server has ended the response (on_response counts it). The engine runs
  // 10 steps at a time, as a model would, until the request is gone.
  s.exec->Hold(0);
  const int held_at = s.exec->entered();
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  const int rcvbuf = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(s.port()));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string slow = body(kSlowTokens);
  ASSERT_TRUE(SendAll(fd, absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                       "Content-Type: application/json\r\nContent-Length: ",
                                       slow.size(), "\r\n\r\n", slow)));
  ASSERT_TRUE(s.exec->WaitEntered(held_at + 1));
  for (int step = 10; step <= kSlowTokens; step += 10) {
    s.exec->Allow(held_at + step);
    bool moved = false;  // the engine is at its next step, or has no request left
    for (int i = 0; i < 60000 && !moved; ++i) {
      moved = s.exec->entered() > held_at + step || s.loop->Snapshot().in_flight == 0;
      if (!moved) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_TRUE(moved) << "the engine stalled at step " << step;
    if (s.loop->Snapshot().in_flight == 0) break;
  }
  s.exec->Open();
  ASSERT_EQ(s.WaitStatusCount(200, 2), 2) << "the slow stream never ended";
  ASSERT_TRUE(s.WaitIdle()) << "the aborted stream left requests or KV blocks";
  const std::string received = Receive(fd);  // until the server's close
  close(fd);
  const int64_t generated = s.loop->Snapshot().tokens.generation_tokens - before;
  EXPECT_FALSE(absl::StrContains(received, "[DONE]")) << received.size() << " bytes received";
  EXPECT_LT(generated, kN * kSlowTokens) << "the engine produced the whole stream";
  // What the client got is what the socket buffers held (the server's send
  // buffer at most tcp_wmem's maximum, its own receive buffer) plus the chunk
  // in flight and the pending events, each at most the bound.
  size_t wmem_max = 4 << 20;
  if (std::FILE* f = std::fopen("/proc/sys/net/ipv4/tcp_wmem", "r")) {
    unsigned long lo = 0, mid = 0, hi = 0;  // NOLINT(google-runtime-int): fscanf's type
    if (std::fscanf(f, "%lu %lu %lu", &lo, &mid, &hi) == 3) wmem_max = hi;
    std::fclose(f);
  }
  const size_t bound = wmem_max + 2 * c.max_pending_stream_bytes + (256 << 10);
  EXPECT_LT(received.size(), bound);
  ASSERT_LT(bound, static_cast<size_t>(kN) * kSlowTokens * 130) << "the stream must be larger";
  std::printf("slow reader: %zu bytes received, %lld of %d tokens generated before the abort\n",
              received.size(), static_cast<long long>(generated), kN * kSlowTokens);

  Response after =
      Request(s.port(), "POST", "/v1/completions", R"({"prompt": "A", "max_tokens": 3})");
  EXPECT_EQ(after.status, 200) << after.body;
}

// Stop() while streams start, run and stall: it returns (a bounded wait) and
// every connection ends. Found by bench/http_frontend_bench.cc: a stream
// whose job ended (aborted by Stop) while its response head was still being
// written destroyed the head's serializer under the write; the write's
// handler then read freed memory (spinning an I/O thread for ever, so Stop
// never returned; ASan: heap-use-after-free).
TEST(HttpServerTest, StopWithStreamsInFlightReturnsAndEndsEveryConnection) {
  Server s;
  std::atomic<bool> quit{false};
  std::atomic<int> completed{0};
  std::vector<std::thread> clients;
  clients.reserve(24);
  for (int i = 0; i < 24; ++i) {
    clients.emplace_back([&, i] {
      const bool reader = i % 4 != 0;  // every fourth client never reads
      const int fd = Connect(s.port());
      if (!reader) {
        const int rcvbuf = 4096;
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
      }
      const std::string body = R"({"prompt": "A", "max_tokens": 200, "stream": true})";
      const std::string req = absl::StrCat(
          "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          "Content-Length: ",
          body.size(), "\r\n\r\n", body);
      while (!quit.load()) {
        if (!SendAll(fd, req)) break;
        if (!reader) {
          while (!quit.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
          break;
        }
        // One whole response (its last chunk), then the next request.
        const std::string r = Receive(fd, "data: [DONE]\n\n\r\n0\r\n\r\n");
        if (!absl::StrContains(r, "0\r\n\r\n")) break;
        ++completed;
      }
      close(fd);
    });
  }
  for (int i = 0; i < 6000 && completed.load() < 100; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(completed.load(), 100) << "the streams never got going";
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    s.http->Stop();
    stopped = true;
  });
  for (int i = 0; i < 6000 && !stopped.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const bool returned = stopped.load();
  EXPECT_TRUE(returned) << "HttpServer::Stop did not return within 60 s";
  quit = true;
  for (auto& t : clients) t.join();
  if (!returned) std::abort();  // a hung I/O thread: the stopper cannot be joined
  stopper.join();
}

// --http-keep-alive-timeout: a connection idle between requests for longer is
// closed by the server; a request sent within it is answered on the same
// connection.
TEST(HttpServerTest, IdleKeepAliveConnectionsCloseAfterTheKeepAliveTimeout) {
  Server::Config c;
  c.keep_alive_timeout = absl::Milliseconds(300);
  Server s(c);
  const int fd = Connect(s.port());
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {  // back to back: well within the timeout
    ASSERT_TRUE(SendAll(fd, health));
    EXPECT_EQ(Parse(Receive(fd, "\"status\"")).status, 200) << "request " << i;
  }
  char byte = 0;
  EXPECT_EQ(recv(fd, &byte, 1, 0), 0) << "the idle connection was not closed (30 s)";
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.3) << "closed before the keep-alive timeout";
  close(fd);
}

TEST(HttpServerTest, ConcurrentClientsStreamingAbortAndHealthDuringAStep) {
  Server s;
  s.exec->Hold(0);
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  clients.reserve(4);
  for (int i = 0; i < 4; ++i) {
    clients.emplace_back([&, i] {
      const bool stream = i % 2 == 1;
      Response r = Request(s.port(), "POST", "/v1/completions",
                           absl::StrCat(R"({"prompt": "A", "max_tokens": 6, "stream": )",
                                        stream ? "true" : "false", "}"));
      EXPECT_EQ(r.status, 200) << r.body;
      if (stream) {
        const std::vector<std::string> events = Events(r.body);
        EXPECT_TRUE(!events.empty() && events.back() == "[DONE]") << r.body;
      } else {
        json j = json::parse(r.body, nullptr, false);
        EXPECT_TRUE(j.is_object() && j["choices"][0]["finish_reason"] == "length") << r.body;
      }
      ++ok;
    });
  }
  // An abandoned stream: read its first event, then close the connection.
  std::thread quitter([&] {
    const int fd = Connect(s.port());
    const std::string body = R"({"prompt": "A", "max_tokens": 200, "stream": true})";
    EXPECT_TRUE(
        SendAll(fd, absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                 "application/json\r\nContent-Length: ",
                                 body.size(), "\r\n\r\n", body)));
    EXPECT_TRUE(absl::StrContains(Receive(fd, "data: "), "data: "));
    close(fd);
  });
  ASSERT_TRUE(s.exec->WaitEntered(1));  // the engine thread is inside a step, held
  const int held = s.exec->entered();
  EXPECT_EQ(Request(s.port(), "GET", "/health").status, 200);
  EXPECT_EQ(Request(s.port(), "GET", "/v1/models").status, 200);
  EXPECT_EQ(Request(s.port(), "GET", "/metrics").status, 200);
  EXPECT_EQ(s.exec->entered(), held);  // answered during that same step
  s.exec->Open();
  for (auto& t : clients) t.join();
  quitter.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_TRUE(s.WaitIdle()) << "requests or KV blocks left after the clients finished";
}

}  // namespace
}  // namespace pagedserve
