// pagedserve keygen: a CurveZMQ key pair for --zmq-curve-* (docs/security.md).
//
//   pagedserve keygen NAME
//
// Writes NAME.key (public certificate: give it to the other side) and
// NAME.key_secret (secret certificate, mode 0600: keep it), in the ZeroMQ
// certificate format that CZMQ's zcert and pyzmq's zmq.auth read
// (runtime/frontend/curve_keys.h); prints the Z85 public key on stdout.
// Existing files are never overwritten.
//
// Exit codes: 0 written, 1 an I/O error or an existing file, 2 bad arguments.
#include <cstdio>
#include <string>

#include "runtime/cli/commands.h"
#include "runtime/frontend/curve_keys.h"

namespace pagedserve::cli {

int KeygenCommand(const Args& args) {
  if (args.size() != 2 || args[1].empty()) {
    std::fprintf(stderr, "usage: pagedserve keygen NAME   (writes NAME.key and NAME.key_secret)\n");
    return 2;
  }
  absl::StatusOr<CurveKeyPair> pair = GenerateCurveKeyPair();
  if (!pair.ok()) {
    std::fprintf(stderr, "pagedserve keygen: %s\n", std::string(pair.status().message()).c_str());
    return 1;
  }
  if (absl::Status s = WriteCurveCertificates(args[1], *pair); !s.ok()) {
    std::fprintf(stderr, "pagedserve keygen: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::printf("%s\n", pair->public_key.c_str());
  std::fprintf(stderr,
               "pagedserve keygen: wrote %s.key (public) and %s.key_secret (secret, mode 0600)\n",
               args[1].c_str(), args[1].c_str());
  return 0;
}

}  // namespace pagedserve::cli
