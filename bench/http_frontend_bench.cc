// The HTTP front end alone (issue 31): pagedserve's HttpServer over a real
// EngineLoop and Engine (scheduler, block manager, detokenizer, output
// accumulation, SSE encoding) whose executor is a stand-in that samples a token
// for every scheduled sequence at once, with no model. What is measured is
// everything a request costs except the forward pass.
//
// The server runs in a child process pinned to one CPU (--server-cpu), the
// client in the parent pinned to another (--client-cpu): one thread running an
// epoll loop over every connection, plus one thread timing probe requests.
//
//   throughput   --streams C connections, each a loop of streaming completions
//                of --max-tokens tokens, for --seconds: streamed tokens/s (token
//                events the client received) and the server's CPU use.
//   connections  TTFT of a fresh streaming chat request (connect to its first
//                content event, --ttft-samples each) on the idle server, with
//                --idle keep-alive connections open (each made one GET /health,
//                then stays silent), and with --streams SSE streams as well,
//                each a loop of streaming completions of --max-tokens tokens
//                with pauses of mean --think-ms between (exponential, so the
//                streams' requests arrive as a Poisson process); the server's
//                threads and RSS at each stage.
//
// Results: docs/benchmarks.md, "HTTP front end". Example:
//   build/bench/bench_http_frontend --mode=throughput --streams=64 --seconds=10
//   build/bench/bench_http_frontend --mode=connections --idle=9000 --streams=1000 --think_ms=2000
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <queue>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/engine/engine_loop.h"
#include "runtime/frontend/http_server.h"
#include "runtime/tokenizer/loaders.h"

ABSL_FLAG(std::string, mode, "throughput", "throughput or connections");
ABSL_FLAG(std::string, tokenizer, "",
          "Hugging Face tokenizer folder (default: "
          "$PAGEDSERVE_SOURCE_DIR/tests/fixtures/smollm2-tokenizer, source dir '.')");
ABSL_FLAG(int, server_cpu, 0, "CPU the server process is pinned to (-1: not pinned)");
ABSL_FLAG(int, client_cpu, 1, "CPU the client is pinned to (-1: not pinned)");
ABSL_FLAG(int, io_threads, 1, "--http-io-threads of the server");
ABSL_FLAG(int, streams, 64, "concurrent SSE streams");
ABSL_FLAG(int, max_tokens, 256, "tokens per streamed completion");
ABSL_FLAG(int, think_ms, 0,
          "mean pause of a stream between two of its requests (exponential: Poisson arrivals)");
ABSL_FLAG(double, seconds, 10, "throughput mode: how long the streams run");
ABSL_FLAG(int, idle, 9000, "connections mode: idle keep-alive connections");
ABSL_FLAG(int, ttft_samples, 50, "connections mode: probe requests per stage");
ABSL_FLAG(int, rounds, 1, "connections mode: rounds, each with fresh connections");
ABSL_FLAG(int, probe_gap_ms, 50, "connections mode: pause between two probe requests");
ABSL_FLAG(int, max_num_seqs, 1024, "the stand-in engine's --max-num-seqs");
ABSL_FLAG(int, port, 0,
          "measure a running server on 127.0.0.1:PORT (e.g. `pagedserve serve` with a real "
          "model) instead of starting the stand-in; give --server_pid for its figures");
ABSL_FLAG(int, server_pid, 0, "with --port: the server's process id (threads, RSS, CPU)");

namespace pagedserve {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "bench_http_frontend: %s\n", why.c_str());
  std::exit(2);
}

void PinTo(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) != 0) Die(absl::StrCat("cannot pin to CPU ", cpu));
}

// The engine stand-in: one token (`token`) for every sampled sequence, at once.
class StandInExecutor : public Executor {
 public:
  StandInExecutor(int32_t token, int64_t blocks) : token_(token), blocks_(blocks) {}
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    StepResult r;
    r.step_id = plan.step_id;
    for (const SequenceStep& st : plan.seqs) {
      if (!st.sample) continue;
      for (int32_t k = 0; k < st.num_samples; ++k) {
        SampledToken t;
        t.seq_id = st.seq_id;
        t.token_id = token_;
        r.tokens.push_back(std::move(t));
      }
    }
    return r;
  }
  absl::Status Shutdown() override { return absl::OkStatus(); }
  int64_t num_device_blocks() const override { return blocks_; }
  int64_t num_cpu_blocks() const override { return 0; }

 private:
  int32_t token_;
  int64_t blocks_;
};

// The child: serves until SIGTERM; writes its port to `port_fd` once serving.
[[noreturn]] void RunServer(int port_fd) {
  PinTo(absl::GetFlag(FLAGS_server_cpu));
  std::string dir = absl::GetFlag(FLAGS_tokenizer);
  if (dir.empty()) {
    const char* src = std::getenv("PAGEDSERVE_SOURCE_DIR");
    dir = std::string(src ? src : ".") + "/tests/fixtures/smollm2-tokenizer";
  }
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadHfTokenizer(dir);
  if (!tok.ok()) Die(tok.status().ToString());
  EncodeOptions eo;
  eo.add_special_tokens = false;
  const int32_t token = (*tok)->Encode(" x", eo).at(0);
  const int32_t max_num_seqs = absl::GetFlag(FLAGS_max_num_seqs);
  EngineOptions o;
  o.scheduler.block_size = 16;
  o.scheduler.max_model_len = 1024;
  o.scheduler.max_num_seqs = max_num_seqs;
  o.scheduler.max_num_batched_tokens = 16384;
  auto engine = Engine::Create(
      o, tok->get(), std::make_unique<StandInExecutor>(token, int64_t{max_num_seqs} * 64 + 64),
      {(*tok)->eos_id()});
  if (!engine.ok()) Die(engine.status().ToString());
  EngineLoopOptions lo;
  lo.max_queue_len = 1 << 16;
  EngineLoop loop(engine->get(), lo);
  std::atomic<bool> stop{false}, abort_now{false};
  std::thread engine_thread([&] { loop.Run(stop, abort_now).IgnoreError(); });
  HttpServerOptions ho;
  ho.port = 0;
  ho.served_model_name = "stand-in";
  ho.io_threads = absl::GetFlag(FLAGS_io_threads);
  ho.keep_alive_timeout = absl::Hours(1);
  ho.log_requests = false;
  auto http = HttpServer::Create(ho);
  if (!http.ok()) Die(http.status().ToString());
  (*http)->Start();
  auto backend = std::make_unique<HttpBackend>();
  backend->loop = &loop;
  absl::StatusOr<ChatTemplate> ct =
      ChatTemplate::Create((*tok)->spec().chat_template, (*tok)->BosText(), (*tok)->EosText());
  if (!ct.ok()) Die(ct.status().ToString());
  backend->chat_template = *std::move(ct);
  (*http)->Attach(std::move(backend));
  const int port = (*http)->port();
  if (write(port_fd, &port, sizeof(port)) != sizeof(port)) Die("cannot report the port");
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  int sig = 0;
  sigwait(&set, &sig);
  (*http)->Stop();
  stop = abort_now = true;
  engine_thread.join();
  std::_Exit(0);
}

struct ServerStats {
  int threads = 0;
  double rss_kb = 0;
  double cpu_s = 0;  // user + system
};

ServerStats StatsOf(pid_t pid) {
  ServerStats s;
  if (pid <= 0) return s;
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  for (std::string line; std::getline(status, line);) {
    if (absl::StartsWith(line, "Threads:")) (void)absl::SimpleAtoi(line.substr(8), &s.threads);
    if (absl::StartsWith(line, "VmRSS:")) {
      (void)absl::SimpleAtod(line.substr(6, line.size() - 6 - 3), &s.rss_kb);
    }
  }
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  // Fields after the ")" closing the command: state is field 3; utime 14, stime 15.
  std::vector<std::string> f;
  size_t p = all.rfind(')') + 2;
  while (p < all.size()) {
    const size_t e = all.find(' ', p);
    f.push_back(all.substr(p, e - p));
    if (e == std::string::npos) break;
    p = e + 1;
  }
  double ut = 0, st = 0;
  if (f.size() > 12 && absl::SimpleAtod(f[11], &ut) && absl::SimpleAtod(f[12], &st)) {
    s.cpu_s = (ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  return s;
}

int ConnectTo(int port, bool nonblocking) {
  const int fd = socket(AF_INET, SOCK_STREAM | (nonblocking ? SOCK_NONBLOCK : 0), 0);
  if (fd < 0) Die(absl::StrCat("socket: ", std::strerror(errno)));
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 && errno != EINPROGRESS) {
    Die(absl::StrCat("connect: ", std::strerror(errno)));
  }
  return fd;
}

std::string Post(const std::string& path, const std::string& body) {
  return absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                      "Content-Type: application/json\r\nContent-Length: ", body.size(), "\r\n\r\n",
                      body);
}

// The client's connections on one epoll loop: idle ones (a GET /health, then
// nothing) and streams (streaming completions back to back, with a pause).
class Client {
 public:
  Client(int port, int max_tokens, int think_ms)
      : port_(port),
        think_(std::chrono::milliseconds(think_ms)),
        stream_request_(Post(
            "/v1/completions",
            absl::StrCat(R"({"prompt": "A", "stream": true, "max_tokens": )", max_tokens, "}"))) {
    epoll_ = epoll_create1(0);
  }
  ~Client() {
    for (const std::unique_ptr<Conn>& c : conns_) close(c->fd);
    close(epoll_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Opens `n` idle connections, `wave` at a time, each answered once.
  void OpenIdle(int n, int wave = 500) {
    for (int done = 0; done < n; done += wave) {
      const int count = std::min(wave, n - done);
      const int64_t target = idle_answered_ + count;
      for (int i = 0; i < count; ++i) Add(kIdle);
      while (idle_answered_ < target) Poll(100);
    }
  }
  // Opens `n` stream connections; with a think time each sends its first
  // request after a pause drawn like the later ones (no synchronised burst).
  void OpenStreams(int n) {
    for (int i = 0; i < n; ++i) {
      Add(kStream);
      if (think_.count() > 0) {
        conns_.back()->out.clear();
        Pause(conns_.back().get());
      }
    }
  }
  // Runs the loop until `until` (the streams keep going).
  void RunUntil(Clock::time_point until) {
    while (Clock::now() < until) Poll(10);
  }
  int64_t tokens() const { return tokens_.load(); }
  int64_t completed() const { return completed_; }
  int64_t errors() const { return errors_; }

 private:
  enum Kind { kIdle, kStream };
  struct Conn {
    int fd = -1;
    Kind kind = kIdle;
    std::string out;  // bytes still to send
    std::string in;   // bytes of the response being read
    size_t scan = 0;
    bool answered = false;
  };

  void Add(Kind kind) {
    auto c = std::make_unique<Conn>();
    c->fd = ConnectTo(port_, true);
    c->kind = kind;
    c->out = kind == kIdle ? "GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" : stream_request_;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLOUT;
    ev.data.ptr = c.get();
    epoll_ctl(epoll_, EPOLL_CTL_ADD, c->fd, &ev);
    conns_.push_back(std::move(c));
  }

  void Poll(int timeout_ms) {
    const auto now = Clock::now();
    while (!waiting_.empty() && waiting_.top().first <= now) {
      Conn* c = waiting_.top().second;
      waiting_.pop();
      c->out = stream_request_;
      Send(c);
    }
    epoll_event evs[256];
    const int n = epoll_wait(epoll_, evs, 256, timeout_ms);
    for (int i = 0; i < n; ++i) {
      Conn* c = static_cast<Conn*>(evs[i].data.ptr);
      if (evs[i].events & (EPOLLERR | EPOLLHUP)) {
        ++errors_;
        epoll_ctl(epoll_, EPOLL_CTL_DEL, c->fd, nullptr);
        continue;
      }
      if (evs[i].events & EPOLLOUT) Send(c);
      if (evs[i].events & EPOLLIN) Read(c);
    }
  }

  void Send(Conn* c) {
    while (!c->out.empty()) {
      const ssize_t n = send(c->fd, c->out.data(), c->out.size(), MSG_NOSIGNAL);
      if (n <= 0) break;
      c->out.erase(0, static_cast<size_t>(n));
    }
    epoll_event ev{};
    ev.events = c->out.empty() ? uint32_t{EPOLLIN} : uint32_t{EPOLLIN | EPOLLOUT};
    ev.data.ptr = c;
    epoll_ctl(epoll_, EPOLL_CTL_MOD, c->fd, &ev);
  }

  void Read(Conn* c) {
    char buf[65536];
    for (;;) {
      const ssize_t n = recv(c->fd, buf, sizeof(buf), 0);
      if (n == 0) {
        ++errors_;  // the server closed a connection: never expected here
        epoll_ctl(epoll_, EPOLL_CTL_DEL, c->fd, nullptr);
        return;
      }
      if (n < 0) break;
      c->in.append(buf, static_cast<size_t>(n));
    }
    if (c->kind == kIdle) {
      if (!c->answered && absl::StrContains(c->in, "\r\n\r\n") &&
          absl::StrContains(c->in, "\"status\"")) {
        c->answered = true;
        ++idle_answered_;
        if (!absl::StartsWith(c->in, "HTTP/1.1 200")) ++errors_;
        c->in.clear();
      }
      return;
    }
    int64_t events = 0;
    for (size_t p = c->in.find("data: {", c->scan); p != std::string::npos;
         p = c->in.find("data: {", p + 7)) {
      ++events;
      c->scan = p + 7;
    }
    tokens_ += events;
    if (c->in.find("data: [DONE]\n\n\r\n0\r\n\r\n", c->scan) != std::string::npos) {
      if (!absl::StartsWith(c->in, "HTTP/1.1 200")) ++errors_;
      ++completed_;
      c->in.clear();
      c->scan = 0;
      if (think_.count() == 0) {
        c->out = stream_request_;
        Send(c);
      } else {
        Pause(c);
      }
    }
  }

  void Pause(Conn* c) {
    std::exponential_distribution<double> pause(1.0 / static_cast<double>(think_.count()));
    waiting_.emplace(
        Clock::now() + std::chrono::microseconds(static_cast<int64_t>(1000.0 * pause(rng_))), c);
  }

  const int port_;
  const std::chrono::milliseconds think_;
  const std::string stream_request_;
  int epoll_ = -1;
  std::vector<std::unique_ptr<Conn>> conns_;
  using Wake = std::pair<Clock::time_point, Conn*>;
  std::priority_queue<Wake, std::vector<Wake>, std::greater<>> waiting_;
  std::mt19937_64 rng_{42};
  int64_t idle_answered_ = 0;
  std::atomic<int64_t> tokens_{0};
  int64_t completed_ = 0, errors_ = 0;
};

// One fresh streaming chat request on a new connection: milliseconds from
// connect to its first content event (-1 on failure).
double ProbeTtftMs(int port) {
  const auto t0 = Clock::now();
  const int fd = ConnectTo(port, false);
  timeval tv{60, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  const std::string req =
      Post("/v1/chat/completions",
           R"({"messages": [{"role": "user", "content": "Say something."}], "stream": true, )"
           R"("max_tokens": 4})");
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return -1;
  }
  std::string in;
  char buf[4096];
  double ms = -1;
  while (ms < 0) {
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
    for (size_t p = in.find("\"content\":\""); p != std::string::npos;
         p = in.find("\"content\":\"", p + 1)) {
      if (p + 11 < in.size() && in[p + 11] != '"') {
        ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        break;
      }
    }
  }
  close(fd);
  return ms;
}

struct Percentiles {
  double p50 = 0, p99 = 0, max = 0;
  int failed = 0;
};

Percentiles Probe(int port, int samples) {
  std::vector<double> v;
  Percentiles r;
  for (int i = 0; i < samples; ++i) {
    if (i > 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(absl::GetFlag(FLAGS_probe_gap_ms)));
    const double ms = ProbeTtftMs(port);
    if (ms < 0) {
      ++r.failed;
    } else {
      v.push_back(ms);
    }
  }
  if (v.empty()) return r;
  std::sort(v.begin(), v.end());
  auto at = [&](double q) {
    return v[std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size())))];
  };
  r.p50 = at(0.5);
  r.p99 = at(0.99);
  r.max = v.back();
  return r;
}

void PrintStage(const char* stage, const ServerStats& s, const Percentiles& t) {
  std::printf(
      "{\"stage\": \"%s\", \"server_threads\": %d, \"server_rss_kb\": %.0f, "
      "\"ttft_p50_ms\": %.2f, \"ttft_p99_ms\": %.2f, \"ttft_max_ms\": %.2f, "
      "\"ttft_failed\": %d}\n",
      stage, s.threads, s.rss_kb, t.p50, t.p99, t.max, t.failed);
  std::fflush(stdout);
}

// One round of the connections mode on `client` (fresh): 0 when no error.
int ConnectionsRound(pid_t server, int port, Client& client) {
  const int streams = absl::GetFlag(FLAGS_streams);
  const int samples = absl::GetFlag(FLAGS_ttft_samples);
  const int idle = absl::GetFlag(FLAGS_idle);
  (void)Probe(port, 5);  // warm-up
  const ServerStats s_idle = StatsOf(server);
  PrintStage("idle server", s_idle, Probe(port, samples));
  client.OpenIdle(idle);
  const ServerStats s_open = StatsOf(server);
  std::printf("{\"idle_connections\": %d, \"rss_growth_per_connection_kb\": %.2f}\n", idle,
              (s_open.rss_kb - s_idle.rss_kb) / std::max(1, idle));
  PrintStage("idle connections open", s_open, Probe(port, samples));
  client.OpenStreams(streams);
  // The probes run on their own thread while this one drives the streams.
  client.RunUntil(Clock::now() + std::chrono::seconds(2));  // the streams under way
  std::atomic<bool> probing{true};
  Percentiles loaded;
  const int64_t tok0 = client.tokens();
  const auto t0 = Clock::now();
  std::thread prober([&] {
    loaded = Probe(port, samples);
    probing = false;
  });
  while (probing) client.RunUntil(Clock::now() + std::chrono::milliseconds(50));
  prober.join();
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  PrintStage("idle connections and streams", StatsOf(server), loaded);
  std::printf(
      "{\"streams\": %d, \"think_ms\": %d, \"max_tokens\": %d, \"streamed_tokens_per_s\": %.0f, "
      "\"completed\": %lld, \"errors\": %lld}\n",
      streams, absl::GetFlag(FLAGS_think_ms), absl::GetFlag(FLAGS_max_tokens),
      static_cast<double>(client.tokens() - tok0) / secs,
      static_cast<long long>(client.completed()), static_cast<long long>(client.errors()));
  return client.errors() == 0 ? 0 : 1;
}

int Main(pid_t server, int port) {
  PinTo(absl::GetFlag(FLAGS_client_cpu));
  const std::string mode = absl::GetFlag(FLAGS_mode);
  const int streams = absl::GetFlag(FLAGS_streams);
  Client client(port, absl::GetFlag(FLAGS_max_tokens), absl::GetFlag(FLAGS_think_ms));
  if (mode == "throughput") {
    client.OpenStreams(streams);
    client.RunUntil(Clock::now() + std::chrono::seconds(1));  // warm-up
    const ServerStats s0 = StatsOf(server);
    const int64_t tok0 = client.tokens();
    const auto t0 = Clock::now();
    client.RunUntil(t0 + std::chrono::duration_cast<Clock::duration>(
                             std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds))));
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const ServerStats s1 = StatsOf(server);
    const double tps = static_cast<double>(client.tokens() - tok0) / secs;
    std::printf(
        "{\"mode\": \"throughput\", \"streams\": %d, \"max_tokens\": %d, \"seconds\": %.2f, "
        "\"streamed_tokens_per_s\": %.0f, \"server_cpu_per_s\": %.3f, \"server_threads\": %d, "
        "\"completed\": %lld, \"errors\": %lld}\n",
        streams, absl::GetFlag(FLAGS_max_tokens), secs, tps, (s1.cpu_s - s0.cpu_s) / secs,
        s1.threads, static_cast<long long>(client.completed()),
        static_cast<long long>(client.errors()));
    return client.errors() == 0 ? 0 : 1;
  }
  if (mode != "connections") Die("--mode: throughput or connections");
  int errors = 0;
  for (int round = 1; round <= absl::GetFlag(FLAGS_rounds); ++round) {
    std::printf("{\"round\": %d, \"server_rss_kb\": %.0f}\n", round, StatsOf(server).rss_kb);
    Client c(port, absl::GetFlag(FLAGS_max_tokens), absl::GetFlag(FLAGS_think_ms));
    errors += ConnectionsRound(server, port, c);
  }
  // The server's RSS once the last round's connections are gone.
  std::this_thread::sleep_for(std::chrono::seconds(2));
  std::printf("{\"after_last_round_server_rss_kb\": %.0f}\n", StatsOf(server).rss_kb);
  return errors == 0 ? 0 : 1;
}

}  // namespace
}  // namespace pagedserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (const int port = absl::GetFlag(FLAGS_port); port > 0) {
    return pagedserve::Main(absl::GetFlag(FLAGS_server_pid), port);
  }
  // SIGTERM is waited for (sigwait) in the child; blocked before any thread.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int fds[2];
  if (pipe(fds) != 0) pagedserve::Die("pipe");
  const pid_t child = fork();
  if (child < 0) pagedserve::Die("fork");
  if (child == 0) {
    close(fds[0]);
    pagedserve::RunServer(fds[1]);
  }
  close(fds[1]);
  int port = 0;
  if (read(fds[0], &port, sizeof(port)) != sizeof(port))
    pagedserve::Die("the server did not start");
  const int rc = pagedserve::Main(child, port);
  kill(child, SIGTERM);
  waitpid(child, nullptr, 0);
  return rc;
}
