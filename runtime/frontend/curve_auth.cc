#include "runtime/frontend/curve_auth.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace pagedserve {
namespace {

constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
constexpr char kZapVersion[] = "1.0";

void SetKey(zmq::socket_t& socket, int option, const std::string& bytes) {
  if (zmq_setsockopt(socket.handle(), option, bytes.data(), bytes.size()) != 0)
    throw zmq::error_t();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CurveAuthenticator>> CurveAuthenticator::Start(
    zmq::context_t& context, const std::vector<std::string>& authorized_public_keys) {
  if (authorized_public_keys.empty()) {
    return absl::InvalidArgumentError("CurveAuthenticator: the list of authorized keys is empty");
  }
  std::unique_ptr<CurveAuthenticator> a(new CurveAuthenticator());
  for (const std::string& z85 : authorized_public_keys) {
    absl::StatusOr<std::string> key = DecodeCurveKey(z85);
    if (!key.ok()) return key.status();
    a->keys_.insert(*std::move(key));
  }
  try {
    zmq::socket_t zap(context, zmq::socket_type::rep);
    zap.set(zmq::sockopt::linger, 0);
    try {
      zap.bind(kZapEndpoint);
    } catch (const zmq::error_t& e) {
      return absl::InternalError(
          absl::StrCat("cannot bind the ZAP handler on ", kZapEndpoint, ": ", e.what()));
    }
    const std::string stop_endpoint =
        absl::StrCat("inproc://pagedserve-zap-stop-", reinterpret_cast<uintptr_t>(a.get()));
    zmq::socket_t stop(context, zmq::socket_type::pair);
    stop.set(zmq::sockopt::linger, 0);
    stop.bind(stop_endpoint);
    a->stop_sender_ = zmq::socket_t(context, zmq::socket_type::pair);
    a->stop_sender_.set(zmq::sockopt::linger, 0);
    a->stop_sender_.connect(stop_endpoint);
    CurveAuthenticator* self = a.get();
    // Thread creation is a full barrier: the sockets move to the new thread.
    a->thread_ = std::thread([self, zap = std::move(zap), stop = std::move(stop)]() mutable {
      self->Loop(std::move(zap), std::move(stop));
    });
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrCat("ZAP handler setup: ", e.what()));
  }
  return a;
}

CurveAuthenticator::~CurveAuthenticator() {
  if (thread_.joinable()) {
    try {
      stop_sender_.send(zmq::str_buffer("stop"), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      spdlog::error("ZAP handler: cannot signal the stop: {}", e.what());
    }
    thread_.join();
  }
  stop_sender_.close();
}

void CurveAuthenticator::Loop(zmq::socket_t zap, zmq::socket_t stop) {
  while (true) {
    zmq::pollitem_t items[] = {{zap.handle(), 0, ZMQ_POLLIN, 0}, {stop.handle(), 0, ZMQ_POLLIN, 0}};
    try {
      zmq::poll(items, 2, std::chrono::milliseconds(-1));
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      spdlog::error("ZAP handler: poll failed: {}; CURVE clients are no longer checked", e.what());
      return;
    }
    if (items[1].revents & ZMQ_POLLIN) return;
    if (!(items[0].revents & ZMQ_POLLIN)) continue;
    std::vector<zmq::message_t> request;
    try {
      do {
        zmq::message_t frame;
        (void)zap.recv(frame);
        request.push_back(std::move(frame));
      } while (request.back().more());
      const std::vector<std::string> reply = Answer(request);
      for (size_t i = 0; i < reply.size(); ++i) {
        zap.send(zmq::buffer(reply[i]),
                 i + 1 < reply.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      spdlog::error("ZAP handler: {}; CURVE clients are no longer checked", e.what());
      return;
    }
  }
}

std::vector<std::string> CurveAuthenticator::Answer(const std::vector<zmq::message_t>& request) {
  // Request: version, request id, domain, address, routing id, mechanism, credentials...
  // Reply:   version, request id, status code, status text, user id, metadata.
  const std::string request_id = request.size() > 1 ? request[1].to_string() : "";
  auto refuse = [&](const std::string& why) {
    const int64_t n = refused_.fetch_add(1, std::memory_order_relaxed) + 1;
    // Bounded logging under a flood: the 1st, 2nd, 4th, 8th, ... refusal.
    if ((n & (n - 1)) == 0) {
      spdlog::info("frontend: CURVE handshakes refused so far: {} (latest: {})", n, why);
    } else {
      spdlog::debug("frontend: CURVE handshake refused ({})", why);
    }
    return std::vector<std::string>{kZapVersion, request_id, "400", why, "", ""};
  };
  if (request.size() < 6 || request[0].to_string() != kZapVersion)
    return refuse("malformed ZAP request");
  const std::string address = request[3].to_string();
  if (request[5].to_string() != "CURVE" || request.size() != 7 || request[6].size() != 32) {
    return refuse(absl::StrCat("not a CURVE handshake, from ", address));
  }
  const std::string key = request[6].to_string();
  if (!keys_.contains(key))
    return refuse(absl::StrCat("client key not authorized, from ", address));
  allowed_.fetch_add(1, std::memory_order_relaxed);
  char z85[41] = {};
  zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(key.data()), key.size());
  return {kZapVersion, request_id, "200", "OK", z85, ""};
}

absl::Status ConfigureCurveServer(const CurveServerOptions& options, zmq::context_t& context,
                                  zmq::socket_t& router,
                                  std::unique_ptr<CurveAuthenticator>* authenticator) {
  if (!options.enabled()) {
    if (!options.authorized_clients_dir.empty()) {
      return absl::InvalidArgumentError(
          "--zmq-curve-authorized-clients needs --zmq-curve-secret-key-file (CURVE is off without "
          "it)");
    }
    return absl::OkStatus();
  }
  if (!zmq_has("curve")) {
    return absl::UnimplementedError(
        "--zmq-curve-secret-key-file: this libzmq was built without CURVE");
  }
  absl::StatusOr<CurveKeyPair> pair = ReadCurveSecretCertificate(options.secret_key_file);
  if (!pair.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--zmq-curve-secret-key-file: ", pair.status().message()));
  }
  absl::StatusOr<std::string> secret = DecodeCurveKey(pair->secret_key);
  if (!secret.ok()) return secret.status();
  if (!options.authorized_clients_dir.empty()) {
    absl::StatusOr<std::vector<std::string>> keys =
        ReadAuthorizedKeys(options.authorized_clients_dir);
    if (!keys.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--zmq-curve-authorized-clients: ", keys.status().message()));
    }
    absl::StatusOr<std::unique_ptr<CurveAuthenticator>> a =
        CurveAuthenticator::Start(context, *keys);
    if (!a.ok()) return a.status();
    *authenticator = *std::move(a);
    spdlog::info("frontend: CURVE on; {} authorized client keys from {}", keys->size(),
                 options.authorized_clients_dir);
  } else {
    spdlog::info("frontend: CURVE on; any client holding the server's public key is served");
  }
  router.set(zmq::sockopt::curve_server, 1);
  SetKey(router, ZMQ_CURVE_SECRETKEY, *secret);
  router.set(zmq::sockopt::zap_domain, "pagedserve");
  return absl::OkStatus();
}

absl::Status ConfigureCurveClient(const std::string& server_public_key_file,
                                  const std::string& secret_key_file, zmq::socket_t& socket) {
  absl::StatusOr<CurveKeyPair> server = ReadCurveCertificate(server_public_key_file);
  if (!server.ok()) return server.status();
  absl::StatusOr<CurveKeyPair> own = secret_key_file.empty()
                                         ? GenerateCurveKeyPair()
                                         : ReadCurveSecretCertificate(secret_key_file);
  if (!own.ok()) return own.status();
  absl::StatusOr<std::string> server_key = DecodeCurveKey(server->public_key);
  absl::StatusOr<std::string> pub = DecodeCurveKey(own->public_key);
  absl::StatusOr<std::string> sec = DecodeCurveKey(own->secret_key);
  if (!server_key.ok() || !pub.ok() || !sec.ok())
    return absl::InternalError("CURVE keys did not decode");
  SetKey(socket, ZMQ_CURVE_SERVERKEY, *server_key);
  SetKey(socket, ZMQ_CURVE_PUBLICKEY, *pub);
  SetKey(socket, ZMQ_CURVE_SECRETKEY, *sec);
  return absl::OkStatus();
}

}  // namespace pagedserve
