// The only translation unit that includes httplib.h (compile time).
#include "runtime/frontend/http_server.h"
#include "nlohmann/json.hpp"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "httplib.h"
#include "openssl/err.h"
#include "openssl/ssl.h"
#include "runtime/common/status_macros.h"
#include "runtime/engine/engine_loop.h"
#include "runtime/frontend/elastic_thread_pool.h"
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

using openai::ApiError;

int64_t UnixNow() { return static_cast<int64_t>(std::time(nullptr)); }

// cpp-httplib's TaskQueue over ElasticThreadPool: one thread per open
// connection, created on demand (elastic_thread_pool.h says why), at most
// `max_threads`; 8 are kept, the others retire after a minute without work.
class ElasticTaskQueue : public httplib::TaskQueue {
 public:
  explicit ElasticTaskQueue(size_t max_threads)
      : pool_(max_threads, /*min_threads=*/8, std::chrono::seconds(60)) {}
  void enqueue(std::function<void()> fn) override { pool_.Enqueue(std::move(fn)); }
  void shutdown() override { pool_.Shutdown(); }

 private:
  ElasticThreadPool pool_;
};

// One HTTP connection, from accept to close, plain or TLS (an OpenSSL `ssl`
// over the socket, handshake done; the socket then non-blocking): the
// httplib::Stream that cpp-httplib 0.11 reads requests from and writes
// responses to, kept for the whole connection (ConnectionLoop below). What cpp-httplib's own
// connection loop does not do, this does:
//  * a total deadline for reading a request: from the request's first byte,
//    request line, headers and body must arrive within `read_timeout`
//    (cpp-httplib bounds only each read, so a client trickling one byte per
//    timeout could hold the connection for ever); after it every read fails
//    and deadline_exceeded() says so;
//  * pipelining: bytes read ahead of the current request (a client that sent
//    two requests in one TCP write) stay buffered for the next one
//    (cpp-httplib 0.11 makes a new stream, and drops its read-ahead buffer,
//    per request: the second request was lost and the connection hung until
//    the keep-alive timeout);
//  * the framing of a chunked body is checked byte by byte as cpp-httplib
//    consumes it (RFC 9112 7.1: chunk-size = 1*HEXDIG, optional extensions,
//    CRLF; chunk-data; CRLF; last-chunk "0"; trailer lines; CRLF): a negative
//    or non-hex size, or bytes where the CRLF after chunk data belongs, fail
//    the read at once (cpp-httplib 0.11 parses the size with strtoul, so "-5"
//    became a wait for 2^64 - 5 bytes, and it ended the body early, without
//    an error, at a missing CRLF); malformed_body() says so;
//  * whether the current request's body was read whole, so that a response
//    sent before the body was read (413, 401, a malformed body) ends the
//    connection instead of parsing the rest of the body as the next request.
// Used by one connection thread only; the handlers reach it through
// CurrentConnection() (they run on that thread).
class Connection final : public httplib::Stream {
 public:
  Connection(int fd, SSL* ssl, absl::Duration read_timeout, absl::Duration write_timeout)
      : fd_(fd), ssl_(ssl), read_timeout_(read_timeout), write_timeout_(write_timeout) {}

  bool is_readable() const override {
    return Pending() || PollFor(POLLIN, std::min(read_timeout_, ReadBudget()));
  }
  bool is_writable() const override { return PollFor(POLLOUT, write_timeout_); }

  ssize_t read(char* ptr, size_t size) override {
    if (failed_) return -1;
    if (buffered() == 0 && !Fill()) return -1;
    size_t n = std::min(size, buffered());
    if (in_head_) {
      if (head_bytes_ >= kMaxRequestHeadBytes) {
        failed_ = head_too_large_ = true;
        return -1;
      }
      n = std::min(n, kMaxRequestHeadBytes - head_bytes_);
      head_bytes_ += n;
    }
    const char* data = buf_.data() + begin_;
    if (chunked_ && !CheckChunked(data, n)) {
      failed_ = malformed_ = true;
      return -1;
    }
    if (body_remaining_ > 0) body_remaining_ -= std::min<uint64_t>(body_remaining_, n);
    std::memcpy(ptr, data, n);
    begin_ += n;
    return static_cast<ssize_t>(n);
  }

  ssize_t write(const char* ptr, size_t size) override {
    size_t sent = 0;
    while (ssl_ != nullptr && sent < size) {
      ERR_clear_error();
      const int n =
          SSL_write(ssl_, ptr + sent, static_cast<int>(std::min<size_t>(size - sent, 1 << 30)));
      if (n > 0) {
        sent += static_cast<size_t>(n);
        continue;
      }
      const short wait = WaitFor(SSL_get_error(ssl_, n));
      if (wait == 0 || !PollFor(wait, write_timeout_)) return -1;
    }
    while (sent < size) {
      if (!PollFor(POLLOUT, write_timeout_)) return -1;
      const ssize_t n = ::send(fd_, ptr + sent, size - sent, MSG_NOSIGNAL);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0) return -1;
      sent += static_cast<size_t>(n);
    }
    return static_cast<ssize_t>(sent);
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }

  // Waits up to `idle` for the next request: true when a byte of it is
  // buffered or readable; false on the keep-alive timeout, a closed or failed
  // connection, or `stopping`.
  bool WaitForRequest(absl::Duration idle, const std::function<bool()>& stopping) const {
    if (Pending()) return true;
    const absl::Time end = absl::Now() + idle;
    while (!stopping()) {
      const absl::Duration left = end - absl::Now();
      if (left <= absl::ZeroDuration()) return false;
      pollfd p{fd_, POLLIN, 0};
      const int r = poll(&p, 1,
                         static_cast<int>(std::min<int64_t>(
                             10, std::max<int64_t>(1, absl::ToInt64Milliseconds(left)))));
      if (r < 0 && errno != EINTR) return false;
      if (r > 0) return (p.revents & POLLIN) != 0;
    }
    return false;
  }

  // A new request starts: its deadline is `read_timeout` from now.
  void BeginRequest() {
    deadline_ = absl::Now() + read_timeout_;
    failed_ = malformed_ = deadline_exceeded_ = close_ = chunked_ = head_too_large_ = false;
    body_remaining_ = 0;
    in_head_ = true;
    head_bytes_ = 0;
  }
  // The headers are read and the body (if any) comes next: its framing.
  void BeginBody(const httplib::Request& req) {
    in_head_ = false;
    if (req.has_header("Transfer-Encoding")) {
      chunked_ = true;
      chunk_state_ = ChunkState::kSizeFirst;
      return;
    }
    uint64_t len = 0;
    if (absl::SimpleAtoi(req.get_header_value("Content-Length"), &len)) body_remaining_ = len;
  }
  // True when the request's body has not been read whole (or its framing
  // is unknown): the connection cannot be used for another request.
  bool BodyUnread() const {
    return body_remaining_ > 0 || (chunked_ && chunk_state_ != ChunkState::kDone);
  }
  void RequestClose() { close_ = true; }
  void KeepOpen() { close_ = false; }
  bool close_requested() const { return close_ || failed_; }
  bool deadline_exceeded() const { return deadline_exceeded_; }
  bool malformed_body() const { return malformed_; }
  // The request line and headers of the current request went past
  // kMaxRequestHeadBytes: the read failed there (cpp-httplib answers 400, the
  // error handler makes it 431).
  bool head_too_large() const { return head_too_large_; }
  int fd() const { return fd_; }

 private:
  enum class ChunkState {
    kSizeFirst,   // the first hex digit of a chunk size
    kSize,        // more hex digits, ';' (extension) or CR
    kExtension,   // chunk extension up to CR
    kSizeLf,      // LF after the size line
    kData,        // chunk_left_ bytes of data
    kDataCr,      // CR after chunk data
    kDataLf,      // LF after chunk data
    kTrailer,     // a trailer line (or the empty line that ends the body)
    kTrailerAny,  // the rest of a non-empty trailer line up to CR
    kTrailerLf,   // LF after a trailer line
    kEndLf,       // LF of the final empty line
    kDone,
  };

  size_t buffered() const { return end_ - begin_; }
  // Bytes of the request stream already here: buffered, or decrypted by OpenSSL.
  bool Pending() const { return buffered() > 0 || (ssl_ != nullptr && SSL_pending(ssl_) > 0); }
  // What a non-blocking OpenSSL call waits for (0: it failed for good).
  static short WaitFor(int ssl_error) {
    return ssl_error == SSL_ERROR_WANT_READ    ? POLLIN
           : ssl_error == SSL_ERROR_WANT_WRITE ? POLLOUT
                                               : 0;
  }

  absl::Duration ReadBudget() const { return deadline_ - absl::Now(); }

  // Reads what the socket has into the buffer, waiting at most the per-read
  // timeout and never past the request's deadline.
  bool Fill() {
    const absl::Duration budget = ReadBudget();
    if (budget <= absl::ZeroDuration()) {
      failed_ = deadline_exceeded_ = true;
      return false;
    }
    begin_ = end_ = 0;
    if (ssl_ != nullptr) return FillTls();
    if (!PollFor(POLLIN, std::min(read_timeout_, budget))) {
      deadline_exceeded_ = budget <= read_timeout_;  // the wait ended at the deadline
      failed_ = true;
      return false;
    }
    ssize_t n;
    do {
      n = ::recv(fd_, buf_.data(), buf_.size(), 0);
    } while (n < 0 && errno == EINTR);
    if (n <= 0) {
      failed_ = true;
      return false;
    }
    end_ = static_cast<size_t>(n);
    return true;
  }

  bool FillTls() {
    for (;;) {
      ERR_clear_error();
      const int n = SSL_read(ssl_, buf_.data(), static_cast<int>(buf_.size()));
      if (n > 0) {
        end_ = static_cast<size_t>(n);
        return true;
      }
      const short wait = WaitFor(SSL_get_error(ssl_, n));
      const absl::Duration budget = ReadBudget();
      if (wait == 0 || budget <= absl::ZeroDuration() ||
          !PollFor(wait, std::min(read_timeout_, budget))) {
        deadline_exceeded_ = wait != 0 && budget <= read_timeout_;  // ended at the deadline
        failed_ = true;
        return false;
      }
    }
  }

  bool PollFor(short events, absl::Duration timeout) const {
    const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(timeout));
    pollfd p{fd_, events, 0};
    int r;
    do {
      r = poll(&p, 1, static_cast<int>(std::min<int64_t>(ms, 1 << 30)));
    } while (r < 0 && errno == EINTR);
    return r > 0 && (p.revents & events) != 0;
  }

  static bool IsHex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
  }
  static int HexValue(char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; }

  // Advances the chunked-framing state over `n` bytes; false at the first
  // byte that breaks it.
  bool CheckChunked(const char* data, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const char c = data[i];
      switch (chunk_state_) {
        case ChunkState::kSizeFirst:
          if (!IsHex(c)) return false;
          chunk_left_ = static_cast<uint64_t>(HexValue(c));
          size_digits_ = 1;
          chunk_state_ = ChunkState::kSize;
          break;
        case ChunkState::kSize:
          if (IsHex(c)) {
            if (++size_digits_ > 15) return false;  // beyond any body we accept
            chunk_left_ = chunk_left_ * 16 + static_cast<uint64_t>(HexValue(c));
          } else if (c == ';' || c == ' ' || c == '\t') {
            chunk_state_ = ChunkState::kExtension;
          } else if (c == '\r') {
            chunk_state_ = ChunkState::kSizeLf;
          } else {
            return false;
          }
          break;
        case ChunkState::kExtension:
          if (c == '\r')
            chunk_state_ = ChunkState::kSizeLf;
          else if (c == '\n')
            return false;
          break;
        case ChunkState::kSizeLf:
          if (c != '\n') return false;
          chunk_state_ = chunk_left_ == 0 ? ChunkState::kTrailer : ChunkState::kData;
          break;
        case ChunkState::kData: {
          const uint64_t take = std::min<uint64_t>(chunk_left_, n - i);
          chunk_left_ -= take;
          i += take - 1;
          if (chunk_left_ == 0) chunk_state_ = ChunkState::kDataCr;
          break;
        }
        case ChunkState::kDataCr:
          if (c != '\r') return false;
          chunk_state_ = ChunkState::kDataLf;
          break;
        case ChunkState::kDataLf:
          if (c != '\n') return false;
          chunk_state_ = ChunkState::kSizeFirst;
          break;
        case ChunkState::kTrailer:
          if (c == '\r')
            chunk_state_ = ChunkState::kEndLf;
          else if (c == '\n')
            return false;
          else
            chunk_state_ = ChunkState::kTrailerAny;
          break;
        case ChunkState::kTrailerAny:
          if (c == '\r')
            chunk_state_ = ChunkState::kTrailerLf;
          else if (c == '\n')
            return false;
          break;
        case ChunkState::kTrailerLf:
          if (c != '\n') return false;
          chunk_state_ = ChunkState::kTrailer;
          break;
        case ChunkState::kEndLf:
          if (c != '\n') return false;
          chunk_state_ = ChunkState::kDone;
          break;
        case ChunkState::kDone:
          // Bytes after the body belong to the next request: checked no more.
          chunked_ = false;
          return true;
      }
    }
    if (chunk_state_ == ChunkState::kDone) chunked_ = false;
    return true;
  }

  template <typename Getter>
  void Address(Getter getter, std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    ip.clear();
    port = -1;
    if (getter(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    char host[INET6_ADDRSTRLEN] = {0};
    if (addr.ss_family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
      port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
      port = ntohs(a->sin6_port);
    }
    ip = host;
  }

  const int fd_;
  SSL* const ssl_;  // null: plain HTTP
  const absl::Duration read_timeout_, write_timeout_;
  std::array<char, 16384> buf_{};
  size_t begin_ = 0, end_ = 0;
  absl::Time deadline_ = absl::InfiniteFuture();
  bool failed_ = false, malformed_ = false, deadline_exceeded_ = false, close_ = false;
  bool in_head_ = false, head_too_large_ = false;
  size_t head_bytes_ = 0;  // request line and headers read so far
  uint64_t body_remaining_ = 0;
  bool chunked_ = false;
  ChunkState chunk_state_ = ChunkState::kDone;
  uint64_t chunk_left_ = 0;
  int size_digits_ = 0;
};

thread_local Connection* current_connection = nullptr;

// The connection the calling handler serves (nullptr outside a handler).
Connection* CurrentConnection() { return current_connection; }

// "Connection: close" on the response, and the connection ends after it.
void CloseAfter(httplib::Response& res) {
  res.set_header("Connection", "close");
  if (Connection* c = CurrentConnection()) c->RequestClose();
}

// cpp-httplib's Server (plain) or SSLServer (TLS) with its connection loop
// replaced (Connection above): keep-alive up to keep_alive_max_count requests,
// each read under one deadline, pipelined requests answered in order, and the
// connection ended after any response whose request body was not read whole or
// that said "Connection: close". A connection that ends with unread input is
// closed gracefully: FIN after the response, then the input is discarded
// (never parsed) for at most a second, so that the client reads the response
// instead of a reset. TLS: the handshake (client certificates as the
// SSL_CTX says, MakeHttplibServer) must also finish within the read timeout.
template <typename Base>
class ConnectionLoop final : public Base {
 public:
  template <typename... Args>
  ConnectionLoop(absl::Duration read_timeout, absl::Duration write_timeout,
                 absl::Duration keep_alive, Args&&... base_args)
      : Base(std::forward<Args>(base_args)...),
        read_timeout_(read_timeout),
        write_timeout_(write_timeout),
        keep_alive_(std::max(keep_alive, absl::Seconds(1))) {}

 private:
  bool process_and_close_socket(socket_t sock) override {
    SSL* ssl = nullptr;
    if constexpr (std::is_base_of_v<httplib::SSLServer, Base>) {
      ssl = Handshake(sock);
      if (ssl == nullptr) {
        ::shutdown(sock, SHUT_RDWR);
        ::close(sock);
        return false;
      }
    }
    Connection conn(sock, ssl, read_timeout_, write_timeout_);
    current_connection = &conn;
    bool ret = false;
    bool linger = false;
    auto stopping = [this] { return this->svr_sock_ == INVALID_SOCKET; };
    for (size_t count = this->keep_alive_max_count_; count > 0 && !stopping(); --count) {
      if (!conn.WaitForRequest(keep_alive_, stopping)) break;
      conn.BeginRequest();
      bool connection_closed = false;
      ret =
          this->process_request(conn, /*close_connection=*/count == 1, connection_closed, nullptr);
      if (conn.BodyUnread() || conn.close_requested()) {
        linger = true;
        break;
      }
      if (!ret || connection_closed) break;
    }
    current_connection = nullptr;
    if (ssl != nullptr) SSL_shutdown(ssl);  // close_notify (non-blocking: best effort)
    if (linger) {
      ::shutdown(sock, SHUT_WR);
      char scratch[4096];
      const absl::Time end = absl::Now() + absl::Seconds(1);
      size_t drained = 0;
      while (drained < (1u << 20)) {
        const int64_t ms = absl::ToInt64Milliseconds(end - absl::Now());
        pollfd p{sock, POLLIN, 0};
        if (ms <= 0 || poll(&p, 1, static_cast<int>(ms)) <= 0) break;
        const ssize_t n = ::recv(sock, scratch, sizeof(scratch), 0);
        if (n <= 0) break;
        drained += static_cast<size_t>(n);
      }
    }
    if (ssl != nullptr) SSL_free(ssl);
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
    return ret;
  }

  // The server side of the TLS handshake on a socket made non-blocking, within
  // the read timeout; nullptr when it fails or times out.
  SSL* Handshake(int sock) {
    const int flags = fcntl(sock, F_GETFL, 0);
    if (flags < 0 || fcntl(sock, F_SETFL, flags | O_NONBLOCK) != 0) return nullptr;
    SSL* ssl = SSL_new(this->ssl_context());
    if (ssl == nullptr) return nullptr;
    SSL_set_fd(ssl, sock);
    const absl::Time end = absl::Now() + read_timeout_;
    for (;;) {
      ERR_clear_error();
      const int r = SSL_accept(ssl);
      if (r == 1) return ssl;
      const int err = SSL_get_error(ssl, r);
      const short wait = err == SSL_ERROR_WANT_READ    ? POLLIN
                         : err == SSL_ERROR_WANT_WRITE ? POLLOUT
                                                       : 0;
      const int64_t ms = absl::ToInt64Milliseconds(end - absl::Now());
      pollfd p{sock, wait, 0};
      if (wait == 0 || ms <= 0 || poll(&p, 1, static_cast<int>(ms)) <= 0) {
        SSL_free(ssl);
        return nullptr;
      }
    }
  }

  const absl::Duration read_timeout_, write_timeout_, keep_alive_;
};

void SendError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(openai::ErrorBody(e), "application/json");
}

ApiError MakeError(int status, std::string type, std::string message, std::string code = "") {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

// The connected socket of `req` (the handler runs on its connection's thread
// and cpp-httplib closes the socket only after the handler and its content
// provider returned, so the descriptor is stable meanwhile). -1 when not found.
int FindConnectionFd(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    int fd;
    if (!absl::SimpleAtoi(e->d_name, &fd) || fd == dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &ll) != 0) continue;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &pl) != 0) continue;
    char host[INET6_ADDRSTRLEN] = {0};
    int lport = -1, pport = -1;
    if (peer.ss_family == AF_INET) {
      auto* p = reinterpret_cast<sockaddr_in*>(&peer);
      inet_ntop(AF_INET, &p->sin_addr, host, sizeof(host));
      pport = ntohs(p->sin_port);
      lport = ntohs(reinterpret_cast<sockaddr_in*>(&local)->sin_port);
    } else if (peer.ss_family == AF_INET6) {
      auto* p = reinterpret_cast<sockaddr_in6*>(&peer);
      inet_ntop(AF_INET6, &p->sin6_addr, host, sizeof(host));
      pport = ntohs(p->sin6_port);
      lport = ntohs(reinterpret_cast<sockaddr_in6*>(&local)->sin6_port);
    } else {
      continue;
    }
    if (pport == req.remote_port && lport == req.local_port && req.remote_addr == host) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

// True when the peer closed (or reset) the connection.
bool PeerClosed(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// One generation request (1..N prompts x n samples) between the handler and
// the engine. Used by one connection thread only.
struct Job {
  openai::ValidatedRequest request;
  std::string id;  // cmpl-... / chatcmpl-...
  int64_t created = 0;
  std::vector<std::string> engine_ids;  // one per prompt
  std::shared_ptr<RequestChannel> channel = std::make_shared<RequestChannel>();
  std::vector<openai::ChoiceState> choices;  // prompt p, sample i -> p * n + i
  std::vector<bool> started;                 // chat: role chunk sent
  std::vector<size_t> text_offsets;          // streaming: legacy logprobs offset per choice
  std::vector<openai::ToolStreamState> tool_streams;  // streaming with tool-call parsing
  openai::UsageTotals usage;
  size_t finished_requests = 0;
  absl::Status error;
  std::chrono::steady_clock::time_point start, first_token;
  bool has_token = false;
  bool aborted = false;  // the client went away
  int fd = -1;
  std::optional<std::string> logged_prompt;  // --log-request-content: the prompts as decoded

  bool done() const { return finished_requests == engine_ids.size(); }
  // The error the request ended with (openai::FinishError of its choices'
  // finish reasons), nullopt when it completed.
  std::optional<ApiError> Error() const {
    for (const openai::ChoiceState& c : choices) {
      if (std::optional<ApiError> e = openai::FinishError(c.finish_reason, error)) return e;
    }
    return std::nullopt;
  }
};

}  // namespace

struct HttpServer::Impl {
  HttpServerOptions options;
  std::unique_ptr<httplib::Server> server;  // an httplib::SSLServer with TLS
  // Each route's path -> the methods it takes (the Allow header of a 405).
  // Filled by Get/Post below while routes are registered, read-only after.
  std::map<std::string, std::string> allowed_methods;
  int port = 0;
  std::thread thread;
  std::atomic<const HttpBackend*> backend{nullptr};
  std::unique_ptr<HttpBackend> backend_storage;  // written once by Attach, before publication
  std::atomic<uint64_t> next_id{0};
  std::atomic<bool> stopping{false};
  uint64_t id_salt = 0;

  const HttpBackend* Backend(httplib::Response& res) {
    const HttpBackend* b = backend.load(std::memory_order_acquire);
    if (b == nullptr) SendError(res, MakeError(503, "service_unavailable", "the model is loading"));
    return b;
  }

  openai::ServedModel Model(const HttpBackend& b) const {
    openai::ServedModel m;
    m.name = options.served_model_name;
    m.max_model_len = b.loop->engine().scheduler_config().max_model_len;
    m.vocab_size = b.loop->tokenizer().vocab_size();
    m.defaults = options.sampling_defaults;
    if (b.tool_call_parser.has_value()) {
      m.tool_call_format = *b.tool_call_parser;
    } else if (b.chat_template.has_value()) {
      m.tool_call_format = ToolCallFormatOfTemplate(b.chat_template->source());
    }
    return m;
  }

  // One "Authorization: Bearer KEY" header with the key. More than one is
  // refused even when one of them holds the key: the request is ambiguous
  // (a proxy and the server could read different ones).
  bool Authorized(const httplib::Request& req) const {
    if (options.api_key.empty()) return true;
    if (req.get_header_value_count("Authorization") != 1) return false;
    return ConstantTimeEquals(BearerToken(req.get_header_value("Authorization")), options.api_key);
  }

  static bool Protected(const std::string& path) {
    return absl::StartsWith(path, "/v1/") || path == "/tokenize" || path == "/detokenize";
  }

  // Applies one engine output to the job; fills `deltas` (streaming) with the
  // per-choice news.
  void Apply(Job& job, EngineOutput& out,
             std::vector<std::pair<int, openai::ChoiceState>>* deltas) {
    size_t p = 0;
    while (p < job.engine_ids.size() && job.engine_ids[p] != out.request_id) ++p;
    if (p == job.engine_ids.size()) return;
    const int n = job.request.params.n;
    for (SequenceDelta& d : out.deltas) {
      if (d.index < 0 || d.index >= n) continue;
      const int c = static_cast<int>(p) * n + d.index;
      openai::ChoiceState& acc = job.choices[c];
      openai::ChoiceState news;
      news.text = d.text;
      news.token_ids = d.token_ids;
      news.logprobs = d.logprobs;
      news.top_token_ids = d.top_token_ids;
      news.top_logprobs = d.top_logprobs;
      if (d.finished) news.finish_reason = d.finish_reason;
      if (!d.token_ids.empty() && !job.has_token) {
        job.has_token = true;
        job.first_token = std::chrono::steady_clock::now();
      }
      acc.text += d.text;
      acc.token_ids.insert(acc.token_ids.end(), d.token_ids.begin(), d.token_ids.end());
      acc.logprobs.insert(acc.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
      acc.top_token_ids.insert(acc.top_token_ids.end(), d.top_token_ids.begin(),
                               d.top_token_ids.end());
      acc.top_logprobs.insert(acc.top_logprobs.end(), d.top_logprobs.begin(), d.top_logprobs.end());
      if (d.finished) acc.finish_reason = d.finish_reason;
      if (deltas != nullptr && (!news.text.empty() || !news.token_ids.empty() || d.finished)) {
        deltas->emplace_back(c, std::move(news));
      }
    }
    if (out.finished) {
      ++job.finished_requests;
      job.usage.prompt_tokens += out.usage.prompt_tokens;
      job.usage.completion_tokens += out.usage.completion_tokens;
      job.usage.cached_tokens += out.usage.cached_prompt_tokens;
      if (!out.error.ok() && job.error.ok()) job.error = out.error;
      for (int i = 0; i < n; ++i) {
        openai::ChoiceState& acc = job.choices[p * n + i];
        acc.finish_reason = EndedWithRequest(acc.finish_reason, !out.error.ok());
      }
    }
  }

  void AbortJob(Job& job, const HttpBackend& b) {
    if (job.aborted) return;
    job.aborted = true;
    for (const std::string& id : job.engine_ids) b.loop->Abort(id);
  }

  // The client went away: aborts the job, waits for its final outputs (the
  // engine's next step) so that the log line has the real figures, and logs it.
  void AbortAndLog(Job& job, const HttpBackend& b) {
    AbortJob(job, b);
    while (!job.done()) {
      std::optional<EngineOutput> out = job.channel->WaitPop(absl::Milliseconds(100));
      if (out.has_value()) {
        Apply(job, *out, nullptr);
      } else if (stopping.load() && !b.loop->healthy()) {
        break;  // shutting down: the loop may already be gone
      }
    }
    LogDone(job);
  }

  // The request log line (request_log.h), front end "http"; the request id is
  // the response's id. Completion text only with log_request_content.
  void LogDone(const Job& job) {
    if (!options.log_requests) return;
    using std::chrono::duration;
    RequestLogRecord r;
    r.front_end = "http";
    r.request_id = job.id;
    r.prompt_tokens = job.usage.prompt_tokens;
    r.completion_tokens = job.usage.completion_tokens;
    r.cached_prompt_tokens = job.usage.cached_tokens;
    r.e2e_s = duration<double>(std::chrono::steady_clock::now() - job.start).count();
    if (job.has_token) r.first_output_s = duration<double>(job.first_token - job.start).count();
    for (const auto& c : job.choices) {
      r.finish_reasons.push_back(std::string(FinishReasonName(c.finish_reason)));
      if (job.logged_prompt.has_value()) r.completions.push_back(c.text);
    }
    r.client_disconnected = job.aborted;
    r.prompt = job.logged_prompt;
    LogRequest(r);
  }

  // What --log-request-content logs as the prompt: each prompt decoded (chat:
  // the templated text the model saw), separated by " | " when there are several.
  static std::string DescribePrompts(const openai::ValidatedRequest& request,
                                     const Tokenizer& tokenizer) {
    std::string out;
    DecodeOptions decode;
    decode.skip_special_tokens = false;
    for (const std::vector<int32_t>& ids : request.prompts) {
      absl::StatusOr<std::string> text = tokenizer.Decode(ids, decode);
      absl::StrAppend(
          &out, out.empty() ? "" : " | ",
          text.ok() ? *text : absl::StrCat("token_ids=[", absl::StrJoin(ids, ","), "]"));
    }
    return out;
  }

  // The body of a POST, read through cpp-httplib's ContentReader: with a
  // Content-Length (one over the limit was answered 413 before routing) or
  // Transfer-Encoding: chunked, which cpp-httplib 0.11 does not bound by its
  // payload limit (it would read a chunked body whole). The bound is kept
  // here: reading stops at the first chunk that would take the body beyond
  // max_request_body_bytes (413), so at most that much is ever held. False:
  // the error response is set (413; 400 for malformed chunked framing or
  // an unreadable body; 408 past the request deadline; 415 for multipart,
  // which no route takes) with "Connection: close": the unread rest of the
  // body makes the connection unusable, and ConnectionLoop ends it.
  bool ReadBody(const httplib::Request& req, httplib::Response& res,
                const httplib::ContentReader& reader, std::string* body) {
    CloseAfter(res);  // undone once the body is read whole
    if (req.is_multipart_form_data()) {
      SendError(res, MakeError(415, "invalid_request_error",
                               "multipart bodies are not accepted; send application/json"));
      return false;
    }
    const size_t limit = options.max_request_body_bytes;
    bool too_large = false;
    const bool read = reader([&](const char* data, size_t n) {
      if (n > limit - body->size()) {
        too_large = true;
        return false;
      }
      body->append(data, n);
      return true;
    });
    if (too_large) {
      SendError(res, MakeError(413, "invalid_request_error",
                               absl::StrCat(
                                   "the request body is too large (over --max-request-body-bytes ",
                                   limit, ")")));
      return false;
    }
    const Connection* conn = CurrentConnection();
    if (!read && conn != nullptr && conn->deadline_exceeded()) {
      SendError(res, MakeError(408, "invalid_request_error",
                               absl::StrCat("the request did not arrive within --http-timeout (",
                                            absl::FormatDuration(options.read_timeout), ")")));
      return false;
    }
    if (!read && conn != nullptr && conn->malformed_body()) {
      SendError(res, MakeError(400, "invalid_request_error",
                               "malformed chunked encoding (RFC 9112 7.1: chunk sizes are hex "
                               "digits, each chunk's data ends with CRLF)"));
      return false;
    }
    if (!read) {
      SendError(
          res, MakeError(
                   400, "invalid_request_error",
                   "the request body could not be read (malformed chunked encoding, or too slow)"));
      return false;
    }
    res.headers.erase("Connection");
    if (Connection* c = CurrentConnection()) c->KeepOpen();
    return true;
  }

  // One warning line per request naming the fields it ignored (vLLM's
  // behaviour), quoted as JSON strings, at most 8, each cut at 64 bytes.
  static void LogIgnoredFields(const std::vector<std::string>& fields) {
    std::string names;
    for (size_t i = 0; i < fields.size() && i < 8; ++i) {
      const nlohmann::json name = fields[i].substr(0, 64);
      absl::StrAppend(&names, i > 0 ? ", " : "",
                      name.dump(-1, ' ', true, nlohmann::json::error_handler_t::replace));
    }
    if (fields.size() > 8) absl::StrAppend(&names, " and ", fields.size() - 8, " more");
    spdlog::warn("http: the request's fields {} are not known and were ignored", names);
  }

  void HandleGeneration(openai::Endpoint endpoint, const httplib::Request& req,
                        const std::string& body, httplib::Response& res) {
    const HttpBackend* b = Backend(res);
    if (b == nullptr) return;
    const ChatTemplate* tmpl = b->chat_template.has_value() ? &*b->chat_template : nullptr;
    openai::ParseOutcome parsed =
        openai::ParseRequest(endpoint, body, Model(*b), b->loop->tokenizer(), tmpl);
    if (!parsed.request.has_value()) return SendError(res, parsed.error);
    if (!parsed.ignored_fields.empty()) LogIgnoredFields(parsed.ignored_fields);
    auto job = std::make_shared<Job>();
    job->request = *std::move(parsed.request);
    if (options.log_requests && options.log_request_content) {
      job->logged_prompt = DescribePrompts(job->request, b->loop->tokenizer());
    }
    job->start = std::chrono::steady_clock::now();
    job->created = UnixNow();
    const uint64_t seq = next_id.fetch_add(1);
    job->id = absl::StrCat(endpoint == openai::Endpoint::kChat ? "chatcmpl-" : "cmpl-",
                           absl::Hex(id_salt ^ (seq * 0x9E3779B97F4A7C15ull), absl::kZeroPad16));
    // Each prompt is one request in the waiting queue: more prompts than the
    // queue holds could never be admitted together (400, not a 429 "retry").
    if (const int64_t queue = b->loop->Snapshot().max_queue_len;
        static_cast<int64_t>(job->request.prompts.size()) > queue) {
      return SendError(
          res, openai::BadRequest(absl::StrCat(job->request.prompts.size(),
                                               " prompts in one request, but the waiting queue "
                                               "holds at most ",
                                               queue, " requests (--max-queue-len)"),
                                  "prompt"));
    }
    const int n = job->request.params.n;
    job->choices.resize(job->request.prompts.size() * n);
    job->started.assign(job->choices.size(), false);
    job->text_offsets.assign(job->choices.size(), 0);
    job->tool_streams.assign(job->choices.size(), {});
    for (size_t p = 0; p < job->request.prompts.size(); ++p) {
      EngineRequest er;
      er.request_id = absl::StrCat("http-", seq, "-", p);
      er.prompt_token_ids = job->request.prompts[p];
      er.params = job->request.params;
      er.cache_salt = job->request.cache_salt;
      const std::string eid = er.request_id;
      if (absl::Status s = b->loop->Submit(std::move(er), job->channel); !s.ok()) {
        AbortJob(*job, *b);
        return SendError(res, openai::SubmitError(s, job->request));
      }
      job->engine_ids.push_back(eid);
    }
    const Connection* conn = CurrentConnection();
    job->fd = conn != nullptr ? conn->fd() : FindConnectionFd(req);
    if (job->request.stream) return Stream(job, b, res);

    // The peer is looked at when no output came for disconnect_poll, and at
    // least every disconnect_poll while outputs keep coming (steps shorter
    // than the poll would otherwise never let it look, and a hung-up client's
    // request would run to max_tokens).
    absl::Time next_check = absl::Now() + options.disconnect_poll;
    while (!job->done()) {
      std::optional<EngineOutput> out = job->channel->WaitPop(options.disconnect_poll);
      if (out.has_value()) Apply(*job, *out, nullptr);
      const absl::Time now = absl::Now();
      if (job->done() || (out.has_value() && now < next_check)) continue;
      next_check = now + options.disconnect_poll;
      if (PeerClosed(job->fd) || stopping.load()) {
        AbortAndLog(*job, *b);
        SendError(res, MakeError(499, "client_closed_request", "the client closed the connection"));
        return;
      }
    }
    LogDone(*job);
    // Failed by the engine (even after some tokens): OpenAI's error object, not a
    // 200 whose choices say finish_reason "error" without a message.
    if (std::optional<ApiError> e = job->Error()) return SendError(res, *e);
    res.set_content(openai::CompletionResponse(job->request, job->id, job->created, job->choices,
                                               job->usage, b->loop->tokenizer()),
                    "application/json");
  }

  // The SSE events (their data) of one choice's news: tool-call chunks when
  // the request parses tool calls, else one chunk (the role with the first).
  static std::vector<std::string> DeltaEvents(Job& job, int c, const openai::ChoiceState& d,
                                              const Tokenizer& tok) {
    if (job.request.parse_tool_calls) {
      return openai::ToolStreamChunks(job.request, job.id, job.created, c, job.choices[c].text,
                                      d.finish_reason, &job.tool_streams[c]);
    }
    const bool first = !job.started[c];
    job.started[c] = true;
    return {openai::StreamChunk(job.request, job.id, job.created, c, d, first, tok,
                                &job.text_offsets[c])};
  }

  void Stream(const std::shared_ptr<Job>& job, const HttpBackend* b, httplib::Response& res) {
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, job, b](size_t, httplib::DataSink& sink) {
          auto send = [&](const std::string& data) {
            const std::string event = absl::StrCat("data: ", data, "\n\n");
            return sink.write(event.data(), event.size());
          };
          const Tokenizer& tok = b->loop->tokenizer();
          while (!job->done()) {
            std::optional<EngineOutput> out = job->channel->WaitPop(options.disconnect_poll);
            if (!out.has_value()) {
              if (PeerClosed(job->fd) || !sink.is_writable() || stopping.load()) {
                AbortAndLog(*job, *b);
                return false;
              }
              continue;
            }
            std::vector<std::pair<int, openai::ChoiceState>> deltas;
            Apply(*job, *out, &deltas);
            for (const auto& [c, d] : deltas) {
              for (const std::string& event : DeltaEvents(*job, c, d, tok)) {
                if (!send(event)) {
                  AbortAndLog(*job, *b);
                  return false;
                }
              }
            }
          }
          bool ok = true;
          if (std::optional<ApiError> e = job->Error()) ok = send(openai::ErrorBody(*e));
          if (ok && job->request.include_usage) {
            ok = send(openai::UsageChunk(job->request, job->id, job->created, job->usage));
          }
          if (ok) ok = send("[DONE]");
          LogDone(*job);
          if (ok) sink.done();
          return ok;
        },
        [this, job, b](bool success) {
          // Called also when the provider never ran (the client went away first).
          if (!job->done()) AbortJob(*job, *b);
        });
  }

  httplib::Server::HandlerResponse PreRouting(const httplib::Request& req, httplib::Response& res) {
    // Runs before cpp-httplib reads the body. A chunked body is read by
    // the POST routes under --max-request-body-bytes (ReadBody: cpp-httplib
    // 0.11's payload limit covers only bodies with a Content-Length); any
    // other transfer coding is not implemented (501, RFC 9112 6.1), and
    // one beside a Content-Length is refused (400: the two disagree on
    // where the body ends, the shape of request smuggling). An oversized
    // Content-Length is answered 413 without waiting for the body. The
    // unread body makes the connection unusable: "Connection: close" (see
    // ReadBody; ConnectionLoop ends the connection after such a response).
    if (Connection* c = CurrentConnection()) c->BeginBody(req);
    const bool has_body = req.has_header("Transfer-Encoding") || req.has_header("Content-Length");
    if (const auto route = allowed_methods.find(req.path);
        route != allowed_methods.end() && !MethodAllowed(req.method, route->second)) {
      // A route that exists, under another method: 405 with Allow (RFC 9110
      // 15.5.6), before any rule about bodies (a GET route takes none).
      if (has_body) CloseAfter(res);  // the body stays unread
      res.set_header("Allow", route->second);
      SendError(res, MakeError(405, "invalid_request_error",
                               absl::StrCat("method ", req.method, " is not allowed on ", req.path,
                                            " (allowed: ", route->second, ")")));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.has_header("Transfer-Encoding")) {
      const bool chunked =
          req.get_header_value_count("Transfer-Encoding") == 1 &&
          absl::EqualsIgnoreCase(req.get_header_value("Transfer-Encoding"), "chunked");
      if (!chunked || req.has_header("Content-Length")) {
        CloseAfter(res);
        SendError(res, chunked ? MakeError(400, "invalid_request_error",
                                           "Transfer-Encoding and Content-Length together")
                               : MakeError(501, "invalid_request_error",
                                           "only the chunked transfer coding is implemented"));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (req.has_header("Content-Length")) {
      // Content-Length = 1*DIGIT, once (RFC 9112 6.3): two of them (even
      // equal ones: cpp-httplib reads by the first) or a sign, space or
      // letter leave the body's end in doubt, another shape of smuggling.
      const std::string& v = req.get_header_value("Content-Length");
      const bool digits = !v.empty() && std::all_of(v.begin(), v.end(),
                                                    [](char ch) { return ch >= '0' && ch <= '9'; });
      if (req.get_header_value_count("Content-Length") != 1 || !digits) {
        CloseAfter(res);
        SendError(res, MakeError(400, "invalid_request_error",
                                 req.get_header_value_count("Content-Length") != 1
                                     ? "more than one Content-Length header"
                                     : absl::StrCat("Content-Length must be a decimal number of "
                                                    "bytes; got '",
                                                    v, "'")));
        return httplib::Server::HandlerResponse::Handled;
      }
      uint64_t len = 0;
      if (!absl::SimpleAtoi(v, &len) ||
          len > static_cast<uint64_t>(options.max_request_body_bytes)) {
        CloseAfter(res);
        SendError(res, MakeError(413, "invalid_request_error",
                                 absl::StrCat("the request body is too large (Content-Length ", v,
                                              ", --max-request-body-bytes ",
                                              options.max_request_body_bytes, ")")));
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (!has_body && (req.method == "POST" || req.method == "PUT" || req.method == "PATCH")) {
      // cpp-httplib 0.11 would read such a body until the client closes (the
      // read timeout, 30 s); every POST route here takes a JSON body.
      CloseAfter(res);
      SendError(res, MakeError(411, "invalid_request_error",
                               "a request body needs a Content-Length or "
                               "Transfer-Encoding: chunked header"));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (Protected(req.path) && !Authorized(req)) {
      if (has_body) CloseAfter(res);  // the body stays unread
      SendError(res,
                MakeError(401, "invalid_request_error",
                          "missing or invalid API key (Authorization: Bearer)", "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  }

  // Whether `method` is one of `allowed` ("GET, HEAD").
  static bool MethodAllowed(std::string_view method, std::string_view allowed) {
    for (absl::string_view m :
         absl::StrSplit(absl::string_view(allowed.data(), allowed.size()), ", ")) {
      if (m == absl::string_view(method.data(), method.size())) return true;
    }
    return false;
  }

  // A route, recorded for 405 answers (cpp-httplib also serves HEAD on GET routes).
  template <typename Handler>
  void Get(const std::string& path, Handler&& handler) {
    allowed_methods[path] = "GET, HEAD";
    server->Get(path, std::forward<Handler>(handler));
  }
  template <typename Handler>
  void Post(const std::string& path, Handler&& handler) {
    allowed_methods[path] = "POST";
    server->Post(path, std::forward<Handler>(handler));
  }

  // Every handler: pre-routing checks, failures, generation, the read-only
  // endpoints and the tokenizer endpoints.
  void Routes() {
    RegisterHandlers();
    RegisterGenerationRoutes();
    RegisterInfoRoutes();
    RegisterTokenizerRoutes();
  }

  // Pre-routing (body size, API key), uncaught exceptions and cpp-httplib's own errors.
  void RegisterHandlers() {
    server->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      return PreRouting(req, res);
    });
    server->set_exception_handler(
        [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
          std::string what = "unknown exception";
          try {
            std::rethrow_exception(std::move(ep));
          } catch (const std::exception& e) {
            what = e.what();
          } catch (...) {
          }
          spdlog::error("http: handler failed: {}", what);
          SendError(res, MakeError(500, "server_error", absl::StrCat("internal error: ", what)));
        });
    server->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const Connection* conn = CurrentConnection();
      if (res.status == 400 && conn != nullptr && conn->head_too_large()) {
        CloseAfter(res);  // the rest of the headers stays unread
        SendError(res, MakeError(431, "invalid_request_error",
                                 absl::StrCat("the request line and headers are too large (over ",
                                              kMaxRequestHeadBytes, " bytes)")));
        return;
      }
      // cpp-httplib's own errors: a request it could not parse (400), a body over the
      // limit (413), a request line too long (414): what follows cannot be trusted.
      if (res.status == 400 || res.status == 413 || res.status == 414) CloseAfter(res);
      if (res.status == 413) {
        SendError(res, MakeError(413, "invalid_request_error", "the request body is too large"));
      } else if (res.status == 404) {
        SendError(res, MakeError(404, "NotFoundError",
                                 absl::StrCat("no route ", req.method, " ", req.path)));
      } else {
        SendError(
            res, MakeError(res.status, "invalid_request_error", absl::StrCat("HTTP ", res.status)));
      }
    });
  }

  // POST /v1/completions and /v1/chat/completions. POST routes read their body
  // themselves (ReadBody: the bound for chunked bodies).
  void RegisterGenerationRoutes() {
    using httplib::ContentReader;
    auto generation = [this](openai::Endpoint endpoint) {
      return [this, endpoint](const httplib::Request& req, httplib::Response& res,
                              const ContentReader& reader) {
        std::string body;
        if (ReadBody(req, res, reader, &body)) HandleGeneration(endpoint, req, body, res);
      };
    };
    Post("/v1/completions", generation(openai::Endpoint::kCompletions));
    Post("/v1/chat/completions", generation(openai::Endpoint::kChat));
  }

  // GET /v1/models, /health, /version, /openapi.json, /metrics.
  void RegisterInfoRoutes() {
    Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      if (const HttpBackend* b = Backend(res)) {
        res.set_content(openai::ModelsResponse(Model(*b), UnixNow()), "application/json");
      }
    });
    Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      const HttpBackend* b = backend.load(std::memory_order_acquire);
      const bool ok = b != nullptr && b->loop->healthy();
      res.status = ok ? 200 : 503;
      res.set_content(
          ok ? "{\"status\":\"ok\"}"
             : (b == nullptr ? "{\"status\":\"loading\"}" : "{\"status\":\"unhealthy\"}"),
          "application/json");
    });
    Get("/version", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(absl::StrCat("{\"version\":\"", options.version, "\"}"), "application/json");
    });
    Get("/openapi.json", [this](const httplib::Request&, httplib::Response& res) {
      const HttpBackend* b = backend.load(std::memory_order_acquire);
      res.set_content(
          openai::OpenApiDocument(options.version, b ? b->loop->tokenizer().vocab_size() : 1 << 20),
          "application/json");
    });
    Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      const HttpBackend* b = backend.load(std::memory_order_acquire);
      if (b == nullptr || !b->metrics_text) {
        res.status = 503;
        res.set_content("# metrics are not available yet\n", "text/plain");
        return;
      }
      res.set_content(b->metrics_text(), "text/plain; version=0.0.4; charset=utf-8");
    });
  }

  // POST /tokenize and /detokenize.
  void RegisterTokenizerRoutes() {
    using httplib::ContentReader;
    Post("/tokenize",
         [this](const httplib::Request& req, httplib::Response& res, const ContentReader& reader) {
           std::string req_body;
           if (!ReadBody(req, res, reader, &req_body)) return;
           const HttpBackend* b = Backend(res);
           if (b == nullptr) return;
           ApiError err;
           err.status = 0;
           std::string body =
               openai::TokenizeResponse(req_body, Model(*b), b->loop->tokenizer(),
                                        b->chat_template ? &*b->chat_template : nullptr, &err);
           if (err.status != 0) return SendError(res, err);
           res.set_content(body, "application/json");
         });
    Post("/detokenize",
         [this](const httplib::Request& req, httplib::Response& res, const ContentReader& reader) {
           std::string req_body;
           if (!ReadBody(req, res, reader, &req_body)) return;
           const HttpBackend* b = Backend(res);
           if (b == nullptr) return;
           ApiError err;
           err.status = 0;
           std::string body = openai::DetokenizeResponse(req_body, b->loop->tokenizer(), &err);
           if (err.status != 0) return SendError(res, err);
           res.set_content(body, "application/json");
         });
  }
};

namespace {

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

// Plain HTTP, or HTTPS with the PEM certificate chain and private key of
// --ssl-certfile / --ssl-keyfile (httplib::SSLServer; protocol versions and
// ciphers are OpenSSL's defaults, i.e. the system openssl.cnf).
absl::StatusOr<std::unique_ptr<httplib::Server>> MakeHttplibServer(
    const HttpServerOptions& options) {
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
  if (options.ssl_certfile.empty()) {
    return std::make_unique<ConnectionLoop<httplib::Server>>(
        options.read_timeout, options.write_timeout, options.keep_alive_timeout);
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
  ERR_clear_error();
  auto server = std::make_unique<ConnectionLoop<httplib::SSLServer>>(
      options.read_timeout, options.write_timeout, options.keep_alive_timeout,
      options.ssl_certfile.c_str(), options.ssl_keyfile.c_str());
  if (!server->is_valid()) {
    const std::string why = OpenSslErrors();
    return absl::InvalidArgumentError(
        absl::StrCat("--ssl-certfile ", options.ssl_certfile, " / --ssl-keyfile ",
                     options.ssl_keyfile, ": not a PEM certificate and its matching private key",
                     why.empty() ? "" : absl::StrCat(" (", why, ")")));
  }
  if (!options.ssl_ca_certs.empty()) {
    // Mutual TLS: trust these CAs for client certificates, name them in the
    // CertificateRequest, and ask for (1) or demand (2) a client certificate.
    SSL_CTX* ctx = server->ssl_context();
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
    const int mode = options.ssl_cert_reqs == 0 ? SSL_VERIFY_NONE
                     : options.ssl_cert_reqs == 1
                         ? SSL_VERIFY_PEER
                         : SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
    SSL_CTX_set_verify(ctx, mode, nullptr);
  }
  return server;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Create(const HttpServerOptions& options) {
  if (options.port < 0 || options.port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port must be in [0, 65535], got ", options.port));
  }
  if (options.max_request_body_bytes < 64) {
    return absl::InvalidArgumentError("--max-request-body-bytes must be >= 64");
  }
  if (options.num_threads < 2) return absl::InvalidArgumentError("num_threads must be >= 2");
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  PS_ASSIGN_OR_RETURN(impl->server, MakeHttplibServer(options));
  std::random_device rd;
  impl->id_salt = (static_cast<uint64_t>(rd()) << 32) | rd();  // ids differ across restarts
  httplib::Server& s = *impl->server;
  const int threads = options.num_threads;
  s.new_task_queue = [threads] { return new ElasticTaskQueue(static_cast<size_t>(threads)); };
  s.set_payload_max_length(options.max_request_body_bytes);
  s.set_tcp_nodelay(true);  // SSE events and small responses go out at once (no Nagle delay)
  auto split = [](absl::Duration d, auto setter) {
    const int64_t us = absl::ToInt64Microseconds(d);
    setter(static_cast<time_t>(us / 1000000), static_cast<time_t>(us % 1000000));
  };
  split(options.read_timeout, [&](time_t sec, time_t usec) { s.set_read_timeout(sec, usec); });
  split(options.write_timeout, [&](time_t sec, time_t usec) { s.set_write_timeout(sec, usec); });
  s.set_keep_alive_timeout(std::max<time_t>(1, absl::ToInt64Seconds(options.keep_alive_timeout)));
  impl->Routes();
  if (options.on_response) {
    // cpp-httplib calls its logger once per response written, errors included.
    s.set_logger(
        [on_response = options.on_response](const httplib::Request&, const httplib::Response& res) {
          on_response(res.status);
        });
  }
  // cpp-httplib 0.11 listens with a backlog of 5 (CPPHTTPLIB_LISTEN_BACKLOG, fixed
  // in Debian's compiled library): a burst of connections then waits for SYN
  // retransmits (1 s, 3 s, 7 s, ...) before the accept loop even sees it. The
  // listening socket is remembered here and listen() called again with SOMAXCONN
  // (Linux adjusts the backlog of a listening socket).
  auto listen_fd = std::make_shared<int>(-1);
  s.set_socket_options([listen_fd](socket_t sock) {
    httplib::default_socket_options(sock);
    *listen_fd = sock;
  });
  const int port = options.port == 0
                       ? s.bind_to_any_port(options.host)
                       : (s.bind_to_port(options.host, options.port) ? options.port : -1);
  if (port < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot bind the HTTP server to ", options.host, ":", options.port,
                     " (address in use, or not an address of this host)"));
  }
  int accepting = 0;
  socklen_t len = sizeof(accepting);
  if (*listen_fd >= 0 && getsockopt(*listen_fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &len) == 0 &&
      accepting != 0) {
    if (::listen(*listen_fd, SOMAXCONN) != 0) {
      spdlog::warn("http: cannot raise the listen backlog: {}", std::strerror(errno));
    }
  }
  impl->port = port;
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() { Stop(); }

int HttpServer::port() const { return impl_->port; }

void HttpServer::Start() {
  impl_->thread = std::thread([impl = impl_.get()] { impl->server->listen_after_bind(); });
}

void HttpServer::Attach(std::unique_ptr<HttpBackend> backend) {
  impl_->backend_storage = std::move(backend);
  impl_->backend.store(impl_->backend_storage.get(), std::memory_order_release);
}

void HttpServer::Stop() {
  if (impl_ == nullptr) return;
  impl_->stopping.store(true);
  if (impl_->thread.joinable()) {
    // stop() only takes effect once the listening loop runs.
    for (int i = 0; i < 2000 && !impl_->server->is_running(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    impl_->server->stop();
    impl_->thread.join();
  }
}

}  // namespace pagedserve
