// pagedserve client: a command-line client of protocol v1 (docs/protocol.md).
//
//   pagedserve client [--zmq-endpoint tcp://127.0.0.1:5555] "prompt text"
//   echo "prompt text" | pagedserve client --chat --max-tokens 64 --temperature 0
//   pagedserve client --health            exit 0 when the server answers healthy
//   pagedserve client --stats             prints the stats reply (JSON) on stdout
//   pagedserve client --zmq-curve-server-key-file server.key
//       --zmq-curve-secret-key-file me.key_secret "prompt"      CurveZMQ (docs/security.md)
//   pagedserve client --cache-salt tenant-a "prompt"            prefix-cache isolation
//
// The prompt is the positional argument, else --prompt, else all of stdin.
// Sampling flags are the ones of `pagedserve generate` (common_flags.h): the
// same flag objects, sent as the request's sampling fields. With --chat the
// prompt is sent as `messages` (one user turn, after --system when given).
//
// stdout: the generated text, streamed as deltas arrive (n = 1), or each sample
// after a "[sample i]" line (n > 1); a final newline only on a terminal.
// stderr: a usage line (finish reasons, prompt / completion / cached tokens).
// SIGINT while generating sends an `abort` for the request and waits briefly
// for its final message.
//
// Exit codes: 0 success; 1 an error reply, a sequence that ended with
// finish_reason "error" or "abort", no reply within the timeout, or (--health)
// an unhealthy server; 2 bad flags or arguments.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <variant>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "runtime/cli/commands.h"
#include "runtime/cli/common_flags.h"
#include "runtime/frontend/curve_auth.h"
#include "runtime/frontend/protocol.h"
#include "zmq.hpp"

ABSL_DECLARE_FLAG(std::string, zmq_endpoint);
ABSL_DECLARE_FLAG(std::string, zmq_curve_secret_key_file);
PAGEDSERVE_FLAG(
    "client", std::string, zmq_curve_server_key_file, "",
    "client: talk CurveZMQ to a server with this public certificate (its NAME.key); the "
    "client's own key pair is --zmq-curve-secret-key-file");
PAGEDSERVE_FLAG("client", std::string, cache_salt, "",
                "client: the request's cache_salt (prefix-cache isolation; 1..256 visible ASCII "
                "characters)");
PAGEDSERVE_FLAG("client", bool, health, false,
                "client: ask the server whether it is healthy; exit 0 when it is");
PAGEDSERVE_FLAG("client", bool, stats, false,
                "client: print the server's stats (queue, running, KV usage, capacity) as JSON");
PAGEDSERVE_FLAG("client", bool, stream, true,
                "client: stream the text as it is generated (false: one final message)");
PAGEDSERVE_FLAG("client", std::string, system, "",
                "client: with --chat, a system message before the user message");
PAGEDSERVE_FLAG(
    "client", double, client_timeout, -1,
    "client: seconds to wait for a reply; -1 = 3 s for --health/--stats, 300 s between two replies "
    "of a generation");

namespace pagedserve::cli {
namespace {

namespace pp = protocol;

std::atomic<bool> g_interrupted{false};
extern "C" void OnInterrupt(int) { g_interrupted.store(true); }

void PrintError(const std::string& message) {
  std::fprintf(stderr, "pagedserve client: %s\n", message.c_str());
}

class Connection {
 public:
  explicit Connection(const std::string& endpoint) : socket_(context_, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    const std::string server_key = absl::GetFlag(FLAGS_zmq_curve_server_key_file);
    if (!server_key.empty()) {
      absl::Status s =
          ConfigureCurveClient(server_key, absl::GetFlag(FLAGS_zmq_curve_secret_key_file), socket_);
      if (!s.ok()) throw std::invalid_argument(std::string(s.message()));
    }
    socket_.connect(endpoint);
  }
  void Send(const std::string& message) {
    socket_.send(zmq::buffer(message), zmq::send_flags::none);
  }

  // The next message within `timeout`; nullopt on timeout. Returns early
  // (nullopt) when `interrupt` becomes true.
  std::optional<std::string> Receive(std::chrono::milliseconds timeout,
                                     const std::atomic<bool>* interrupt) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      if (interrupt != nullptr && interrupt->load()) return std::nullopt;
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      try {
        zmq::poll(&item, 1, std::min(left, std::chrono::milliseconds(100)));
      } catch (const zmq::error_t& e) {
        if (e.num() == EINTR) continue;
        throw;
      }
      if (!(item.revents & ZMQ_POLLIN)) continue;
      // The server sends one frame per message; keep the last of any others.
      zmq::message_t frame;
      std::string last;
      do {
        (void)socket_.recv(frame);
        last = frame.to_string();
      } while (frame.more());
      return last;
    }
  }

 private:
  zmq::context_t context_{1};
  zmq::socket_t socket_;
};

// With CURVE a refused handshake looks like silence: say what to check.
std::string NoReplyHint() {
  return absl::GetFlag(FLAGS_zmq_curve_server_key_file).empty()
             ? ""
             : " (CURVE: a wrong server key or a client key the server does not authorize also gets no reply)";
}

std::chrono::milliseconds TimeoutMs(double default_seconds) {
  double t = absl::GetFlag(FLAGS_client_timeout);
  if (t < 0) t = default_seconds;
  return std::chrono::milliseconds(static_cast<int64_t>(t * 1000));
}

int HealthOrStats(Connection& conn, bool health) {
  const std::string id = health ? "cli-health" : "cli-stats";
  pp::Request request =
      health ? pp::Request(pp::HealthRequest{id}) : pp::Request(pp::StatsRequest{id});
  conn.Send(pp::SerializeRequest(request));
  const auto timeout = TimeoutMs(3);
  std::optional<std::string> raw = conn.Receive(timeout, nullptr);
  if (!raw.has_value()) {
    PrintError(absl::StrCat("no reply from ", absl::GetFlag(FLAGS_zmq_endpoint), " within ",
                            timeout.count() / 1000.0, " s", NoReplyHint()));
    return 1;
  }
  absl::StatusOr<pp::Reply> reply = pp::ParseReply(*raw);
  if (!reply.ok()) {
    PrintError(absl::StrCat("unreadable reply: ", reply.status().message()));
    return 1;
  }
  if (const auto* e = std::get_if<pp::ErrorReply>(&*reply)) {
    PrintError(absl::StrCat(std::string(pp::ErrorCodeName(e->code)), ": ", e->message));
    return 1;
  }
  if (health) {
    const auto* h = std::get_if<pp::HealthReply>(&*reply);
    if (h == nullptr) {
      PrintError("the reply to health is not a health message");
      return 1;
    }
    std::printf("%s\n", h->ok ? "ok" : "unhealthy");
    return h->ok ? 0 : 1;
  }
  if (!std::holds_alternative<pp::StatsReply>(*reply)) {
    PrintError("the reply to stats is not a stats message");
    return 1;
  }
  std::printf("%s\n", raw->c_str());
  return 0;
}

int Generate(Connection& conn, const std::string& text) {
  absl::StatusOr<SamplingParams> params = SamplingParamsFromFlags();
  if (!params.ok()) {
    PrintError(std::string(params.status().message()));
    return 2;
  }
  pp::GenerateRequest g;
  g.id = absl::StrCat("cli-", getpid());
  if (absl::GetFlag(FLAGS_chat)) {
    std::vector<pp::ChatMessage> messages;
    if (const std::string system = absl::GetFlag(FLAGS_system); !system.empty()) {
      messages.push_back({"system", system});
    }
    messages.push_back({"user", text});
    g.prompt = std::move(messages);
  } else {
    g.prompt = text;
  }
  g.sampling = *params;
  g.max_tokens_given = MaxTokensFlagGiven();
  g.stream = absl::GetFlag(FLAGS_stream);
  g.cache_salt = absl::GetFlag(FLAGS_cache_salt);
  const int n = params->n;
  conn.Send(pp::SerializeRequest(g));

  struct sigaction sa = {};
  sa.sa_handler = OnInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);

  const auto timeout = TimeoutMs(300);
  std::vector<std::string> texts(n);
  bool abort_sent = false;
  while (true) {
    std::optional<std::string> raw =
        conn.Receive(abort_sent ? std::chrono::milliseconds(5000) : timeout,
                     abort_sent ? nullptr : &g_interrupted);
    if (!raw.has_value()) {
      if (g_interrupted.load() && !abort_sent) {
        conn.Send(pp::SerializeRequest(pp::AbortRequest{g.id}));
        abort_sent = true;
        continue;
      }
      PrintError(abort_sent ? "no final message after the abort"
                            : absl::StrCat("no reply within ", timeout.count() / 1000.0, " s",
                                           NoReplyHint()));
      return 1;
    }
    absl::StatusOr<pp::Reply> reply = pp::ParseReply(*raw);
    if (!reply.ok()) {
      PrintError(absl::StrCat("unreadable reply: ", reply.status().message()));
      return 1;
    }
    if (const auto* e = std::get_if<pp::ErrorReply>(&*reply)) {
      PrintError(absl::StrCat(std::string(pp::ErrorCodeName(e->code)), ": ", e->message));
      return 1;
    }
    if (const auto* d = std::get_if<pp::DeltaReply>(&*reply)) {
      for (const pp::SequenceDelta& s : d->outputs) {
        if (s.index < 0 || s.index >= n) continue;
        if (n == 1) {
          std::fwrite(s.text.data(), 1, s.text.size(), stdout);
          std::fflush(stdout);
        }
        texts[s.index] += s.text;
      }
      continue;
    }
    const auto* f = std::get_if<pp::FinalReply>(&*reply);
    if (f == nullptr) continue;  // abort_ack
    std::vector<std::string> reasons;
    bool failed = false;
    for (const pp::SequenceFinal& o : f->outputs) {
      reasons.push_back(std::string(pp::FinishReasonName(o.finish_reason)));
      if (o.finish_reason == pp::FinishReason::kError ||
          o.finish_reason == pp::FinishReason::kAbort)
        failed = true;
      if (!f->streamed && o.index >= 0 && o.index < n) texts[o.index] = o.text;
    }
    if (n > 1) {
      for (int i = 0; i < n; ++i)
        std::printf("%s[sample %d]\n%s\n", i ? "\n" : "", i, texts[i].c_str());
    } else if (!f->streamed) {
      std::fwrite(texts[0].data(), 1, texts[0].size(), stdout);
    }
    if (n == 1 && isatty(fileno(stdout))) std::printf("\n");
    std::fflush(stdout);
    std::fprintf(stderr,
                 "pagedserve client: finish_reason=%s prompt_tokens=%lld completion_tokens=%lld "
                 "cached_prompt_tokens=%lld\n",
                 absl::StrJoin(reasons, ",").c_str(),
                 static_cast<long long>(f->usage.prompt_tokens),
                 static_cast<long long>(f->usage.completion_tokens),
                 static_cast<long long>(f->usage.cached_prompt_tokens));
    if (!f->error_message.empty()) PrintError(f->error_message);
    return failed ? 1 : 0;
  }
}

}  // namespace

int ClientCommand(const Args& args) {
  if (args.size() > 2) {
    PrintError(
        absl::StrCat("unexpected argument '", args[2], "' (quote the prompt: one argument)"));
    return 2;
  }
  const bool health = absl::GetFlag(FLAGS_health), stats = absl::GetFlag(FLAGS_stats);
  if (health && stats) {
    PrintError("--health and --stats are exclusive");
    return 2;
  }
  try {
    Connection conn(absl::GetFlag(FLAGS_zmq_endpoint));
    if (health || stats) return HealthOrStats(conn, health);
    std::string text;
    if (args.size() == 2) {
      text = args[1];
    } else {
      absl::StatusOr<std::string> t = ReadPromptFromFlags();
      if (!t.ok()) {
        PrintError(std::string(t.status().message()));
        return 2;
      }
      text = *std::move(t);
    }
    if (text.empty()) {
      PrintError("the prompt is empty");
      return 2;
    }
    return Generate(conn, text);
  } catch (const zmq::error_t& e) {
    PrintError(
        absl::StrCat("ZeroMQ: ", e.what(), " (endpoint ", absl::GetFlag(FLAGS_zmq_endpoint), ")"));
    return 1;
  } catch (const std::invalid_argument& e) {
    PrintError(absl::StrCat("--zmq-curve-*: ", e.what()));
    return 2;
  }
}

}  // namespace pagedserve::cli
