// CurveZMQ key pairs and their certificate files.
//
// Keys are libzmq's CURVE keys (Curve25519, 32 bytes), written as 40-character
// Z85 text (ZeroMQ RFC 32). Files use the certificate format of CZMQ's zcert
// (ZPL text, ZeroMQ RFC 4), which pyzmq's zmq.auth.load_certificate and
// CZMQ-based tools read and write:
//
//   NAME.key         public certificate:  curve / public-key = "<Z85>"
//   NAME.key_secret  secret certificate:  curve / public-key = "<Z85>"
//                                                 secret-key = "<Z85>"
//
// All functions are thread-safe (no shared state). Errors are absl::Status
// naming the file.
#ifndef PAGEDSERVE_RUNTIME_FRONTEND_CURVE_KEYS_H_
#define PAGEDSERVE_RUNTIME_FRONTEND_CURVE_KEYS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pagedserve {

inline constexpr size_t kCurveKeyZ85Chars = 40;

struct CurveKeyPair {
  std::string public_key;  // Z85, 40 characters
  std::string secret_key;  // Z85, 40 characters; empty in a public certificate
};

// A fresh key pair from libzmq's zmq_curve_keypair (libsodium's random source).
// Unimplemented when libzmq was built without CURVE.
absl::StatusOr<CurveKeyPair> GenerateCurveKeyPair();

// Writes `base`.key (public certificate, mode 0644) and `base`.key_secret
// (secret certificate, mode 0600; created with O_EXCL so no other user ever
// sees it half-written). AlreadyExists when either file exists (keys are never
// overwritten); PermissionDenied / Internal for other I/O errors.
absl::Status WriteCurveCertificates(const std::string& base, const CurveKeyPair& pair);

// Reads a public or secret certificate: the `public-key` (and, when present,
// `secret-key`) of its `curve` section. Keys are checked to be valid Z85 of 32
// bytes; in a secret certificate the public key must belong to the secret key.
// InvalidArgument naming the file and the problem (missing section or key, bad
// Z85, mismatched pair); NotFound when the file does not exist.
absl::StatusOr<CurveKeyPair> ReadCurveCertificate(const std::string& path);

// Like ReadCurveCertificate, and InvalidArgument when there is no secret key.
absl::StatusOr<CurveKeyPair> ReadCurveSecretCertificate(const std::string& path);

// The public keys (Z85) of every `*.key` file in `dir` (other files, such as
// `*.key_secret`, are ignored; a broken `*.key` file is an error naming it).
// InvalidArgument when `dir` holds no `*.key` file (an empty allow-list would
// refuse every client: almost certainly a mistake); NotFound when `dir` is not
// a readable directory.
absl::StatusOr<std::vector<std::string>> ReadAuthorizedKeys(const std::string& dir);

// Z85 key -> its 32 bytes. InvalidArgument when `z85` is not 40 Z85 characters.
absl::StatusOr<std::string> DecodeCurveKey(const std::string& z85);

// What `pagedserve serve` needs for CURVE (empty paths = off).
struct CurveServerOptions {
  std::string secret_key_file;         // --zmq-curve-secret-key-file (a secret certificate)
  std::string authorized_clients_dir;  // --zmq-curve-authorized-clients (public certificates)
  bool enabled() const { return !secret_key_file.empty(); }
};

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_FRONTEND_CURVE_KEYS_H_
