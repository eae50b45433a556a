// CurveZMQ on the ZeroMQ front end: server and client socket setup, and the
// ZAP handler that restricts a CURVE server to known client keys.
//
// CURVE (ZeroMQ RFC 26, libzmq's built-in mechanism) encrypts and authenticates
// every connection: a client must know the server's public key to complete the
// handshake, so a client without it (plain NULL mechanism, or a wrong server
// key) is dropped by libzmq's I/O thread before any message reaches the
// application. With an allow-list, the ZAP handler below (ZeroMQ RFC 27,
// inproc://zeromq.zap.01) also refuses every client whose public key is not
// listed, again inside the handshake: no JSON of a refused client is ever
// received, parsed or queued.
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_CURVE_AUTH_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_CURVE_AUTH_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "runtime/frontend/curve_keys.h"
#include "zmq.hpp"

namespace pagedserve {

// A ZAP handler on its own thread that answers CURVE handshakes of `context`'s
// sockets: status 200 (user id = the client's Z85 public key) for a listed key,
// 400 for any other key or mechanism.
//
// Threading: Start() binds the handler's REP socket on the calling thread (so a
// second handler in the same context is an error, not a silent race), then
// hands it to a new thread that owns it alone; the allow-list is immutable
// after Start. The destructor (from the thread that called Start) stops and
// joins that thread; it must run before `context` is closed. allowed() and
// refused() may be read from any thread.
//
// Fail-closed only while it runs: libzmq (without the draft option
// ZMQ_ZAP_ENFORCE_DOMAIN) accepts CURVE clients when no handler is bound, so
// the owner must keep the authenticator alive as long as its server socket
// accepts connections (Server keeps it until the ROUTER socket is closed).
class CurveAuthenticator {
 public:
  // `authorized_public_keys`: Z85 keys (ReadAuthorizedKeys). InvalidArgument for
  // a bad key or an empty list; Internal when the ZAP endpoint is taken.
  static absl::StatusOr<std::unique_ptr<CurveAuthenticator>> Start(
      zmq::context_t& context, const std::vector<std::string>& authorized_public_keys);
  ~CurveAuthenticator();
  CurveAuthenticator(const CurveAuthenticator&) = delete;
  CurveAuthenticator& operator=(const CurveAuthenticator&) = delete;

  int64_t allowed() const { return allowed_.load(std::memory_order_relaxed); }
  int64_t refused() const { return refused_.load(std::memory_order_relaxed); }

 private:
  CurveAuthenticator() = default;
  void Loop(zmq::socket_t zap, zmq::socket_t stop);
  // One ZAP request (frames after the REP envelope) -> the reply frames.
  std::vector<std::string> Answer(const std::vector<zmq::message_t>& request);

  absl::flat_hash_set<std::string> keys_;  // 32-byte binary public keys
  zmq::socket_t stop_sender_;              // used by the owner thread only
  std::thread thread_;
  std::atomic<int64_t> allowed_{0}, refused_{0};
};

// Makes `router` a CURVE server (before it binds): reads the secret
// certificate, sets ZMQ_CURVE_SERVER and the secret key, and, when
// `options.authorized_clients_dir` is set, starts a CurveAuthenticator on
// `context` with its keys (stored in *authenticator). Errors name the flag
// (--zmq-curve-secret-key-file / --zmq-curve-authorized-clients).
absl::Status ConfigureCurveServer(const CurveServerOptions& options, zmq::context_t& context,
                                  zmq::socket_t& router,
                                  std::unique_ptr<CurveAuthenticator>* authenticator);

// Makes `socket` a CURVE client (before it connects) of the server whose public
// key is in `server_public_key_file` (its NAME.key), with the key pair of
// `secret_key_file` (NAME.key_secret), or a fresh key pair when that is empty
// (enough for a server without an allow-list). Errors name the file.
absl::Status ConfigureCurveClient(const std::string& server_public_key_file,
                                  const std::string& secret_key_file, zmq::socket_t& socket);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_CURVE_AUTH_H_
