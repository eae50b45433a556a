// CurveZMQ key files (curve_keys.h) and the ZAP handler (curve_auth.h), in
// process with real libzmq sockets. End-to-end checks against `pagedserve
// serve` are in tests/frontend/security_test.py.
#include "runtime/frontend/curve_auth.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "runtime/frontend/curve_keys.h"

namespace pagedserve {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "pagedserve-curve-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void WriteFile(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TEST(CurveKeysTest, KeygenFilesRoundTripWithModesAndNoOverwrite) {
  TempDir dir;
  absl::StatusOr<CurveKeyPair> pair = GenerateCurveKeyPair();
  ASSERT_TRUE(pair.ok()) << pair.status();
  EXPECT_EQ(pair->public_key.size(), 40u);
  ASSERT_TRUE(WriteCurveCertificates(dir / "server", *pair).ok());
  struct stat st;
  ASSERT_EQ(stat((dir / "server.key_secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  absl::StatusOr<CurveKeyPair> secret = ReadCurveSecretCertificate(dir / "server.key_secret");
  ASSERT_TRUE(secret.ok()) << secret.status();
  EXPECT_EQ(secret->public_key, pair->public_key);
  EXPECT_EQ(secret->secret_key, pair->secret_key);
  absl::StatusOr<CurveKeyPair> pub = ReadCurveCertificate(dir / "server.key");
  ASSERT_TRUE(pub.ok()) << pub.status();
  EXPECT_EQ(pub->public_key, pair->public_key);
  EXPECT_TRUE(pub->secret_key.empty()) << "the public file must not hold the secret";
  EXPECT_EQ(WriteCurveCertificates(dir / "server", *pair).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ReadCurveSecretCertificate(dir / "server.key").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The layout CZMQ's zcert_save and pyzmq's zmq.auth.create_certificates write.
TEST(CurveKeysTest, ReadsCzmqStyleCertificatesAndRejectsBrokenOnes) {
  TempDir dir;
  // Keys from ZeroMQ RFC 26's test vectors are not needed: any valid pair will do.
  absl::StatusOr<CurveKeyPair> pair = GenerateCurveKeyPair();
  ASSERT_TRUE(pair.ok());
  WriteFile(dir / "czmq.key_secret",
            "#   ****  Generated on 2024-01-01 by CZMQ  ****\r\n"
            "#   ZeroMQ CURVE **Secret** Certificate\r\n\r\nmetadata\r\n    name = 'x'\r\ncurve\r\n"
            "    public-key = \"" +
                pair->public_key + "\"\r\n    secret-key = '" + pair->secret_key + "'\r\n");
  absl::StatusOr<CurveKeyPair> read = ReadCurveSecretCertificate(dir / "czmq.key_secret");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->secret_key, pair->secret_key);

  absl::StatusOr<CurveKeyPair> other = GenerateCurveKeyPair();
  ASSERT_TRUE(other.ok());
  WriteFile(dir / "mismatch", "curve\n    public-key = \"" + other->public_key +
                                  "\"\n    secret-key = \"" + pair->secret_key + "\"\n");
  EXPECT_NE(ReadCurveCertificate(dir / "mismatch").status().message().find("does not belong"),
            std::string::npos);
  WriteFile(dir / "nosection", "metadata\n    public-key = \"" + pair->public_key + "\"\n");
  EXPECT_NE(ReadCurveCertificate(dir / "nosection").status().message().find("no `curve` section"),
            std::string::npos);
  WriteFile(dir / "short", "curve\n    public-key = \"abc\"\n");
  EXPECT_NE(ReadCurveCertificate(dir / "short").status().message().find("40 Z85 characters"),
            std::string::npos);
  WriteFile(dir / "badchar", "curve\n    public-key = \"" + std::string(39, 'a') + "~\"\n");
  EXPECT_EQ(ReadCurveCertificate(dir / "badchar").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadCurveCertificate(dir / "missing").status().code(), absl::StatusCode::kNotFound);
}

TEST(CurveKeysTest, AuthorizedFolderTakesPublicCertificatesOnly) {
  TempDir dir;
  EXPECT_EQ(ReadAuthorizedKeys(dir.path()).status().code(), absl::StatusCode::kInvalidArgument)
      << "empty";
  absl::StatusOr<CurveKeyPair> a = GenerateCurveKeyPair(), b = GenerateCurveKeyPair();
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE(WriteCurveCertificates(dir / "alice", *a).ok());
  ASSERT_TRUE(WriteCurveCertificates(dir / "bob", *b).ok());
  WriteFile(dir / "notes.txt", "not a key");
  absl::StatusOr<std::vector<std::string>> keys = ReadAuthorizedKeys(dir.path());
  ASSERT_TRUE(keys.ok()) << keys.status();
  EXPECT_EQ(*keys, (std::vector<std::string>{a->public_key, b->public_key}));
  WriteFile(dir / "broken.key", "curve\n");
  EXPECT_NE(ReadAuthorizedKeys(dir.path()).status().message().find("broken.key"),
            std::string::npos);
  EXPECT_EQ(ReadAuthorizedKeys(dir / "nope").status().code(), absl::StatusCode::kNotFound);
}

// A CURVE ROUTER with an allow-list: the listed client's message arrives; an
// unlisted client and a client with a wrong server key are refused during the
// handshake (the authenticator counts the refusal; the ROUTER sees nothing).
TEST(CurveAuthTest, OnlyListedClientsReachTheRouter) {
  TempDir dir;
  absl::StatusOr<CurveKeyPair> server = GenerateCurveKeyPair(), alice = GenerateCurveKeyPair(),
                               mallory = GenerateCurveKeyPair();
  ASSERT_TRUE(server.ok() && alice.ok() && mallory.ok());
  fs::create_directory(dir / "clients");
  ASSERT_TRUE(WriteCurveCertificates(dir / "server", *server).ok());
  ASSERT_TRUE(WriteCurveCertificates(dir / "clients/alice", *alice).ok());
  ASSERT_TRUE(WriteCurveCertificates(dir / "mallory", *mallory).ok());

  zmq::context_t context(1);
  std::unique_ptr<CurveAuthenticator> auth;
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  CurveServerOptions o{dir / "server.key_secret", dir / "clients"};
  ASSERT_TRUE(ConfigureCurveServer(o, context, router, &auth).ok());
  ASSERT_NE(auth, nullptr);
  router.bind("tcp://127.0.0.1:*");
  const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
  // A second ZAP handler in the same context is refused, not raced.
  EXPECT_FALSE(CurveAuthenticator::Start(context, {alice->public_key}).ok());

  auto client = [&](const std::string& server_key_file, const std::string& secret_file) {
    zmq::socket_t s(context, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    EXPECT_TRUE(ConfigureCurveClient(server_key_file, secret_file, s).ok());
    s.connect(endpoint);
    return s;
  };
  auto wait_refused = [&](int64_t n) {
    for (int i = 0; i < 1000 && auth->refused() < n; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    return auth->refused() >= n;
  };
  zmq::socket_t m = client(dir / "server.key", dir / "mallory.key_secret");
  m.send(zmq::str_buffer("from mallory"), zmq::send_flags::none);
  ASSERT_TRUE(wait_refused(1)) << "the unlisted key was never seen by the ZAP handler";
  zmq::socket_t anon = client(dir / "server.key", "");  // fresh key pair: not listed either
  anon.send(zmq::str_buffer("from anon"), zmq::send_flags::none);
  ASSERT_TRUE(wait_refused(2));
  EXPECT_EQ(auth->allowed(), 0);

  zmq::socket_t a = client(dir / "server.key", dir / "clients/alice.key_secret");
  a.send(zmq::str_buffer("from alice"), zmq::send_flags::none);
  zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
  ASSERT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(10000)), 1);
  zmq::message_t id, body;
  ASSERT_TRUE(router.recv(id).has_value());
  ASSERT_TRUE(router.recv(body).has_value());
  EXPECT_EQ(body.to_string(), "from alice") << "only alice's message may arrive";
  EXPECT_EQ(std::string(body.gets("User-Id")), alice->public_key);
  EXPECT_EQ(auth->allowed(), 1);
  EXPECT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(200)), 0) << "a refused message arrived";
  router.close();
  a.close();
  m.close();
  anon.close();
  auth.reset();
}

TEST(CurveAuthTest, FlagErrorsNameTheFlag) {
  TempDir dir;
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  std::unique_ptr<CurveAuthenticator> auth;
  absl::Status s = ConfigureCurveServer({"", dir.path()}, context, router, &auth);
  EXPECT_NE(s.message().find("--zmq-curve-authorized-clients needs --zmq-curve-secret-key-file"),
            std::string::npos);
  s = ConfigureCurveServer({dir / "none.key_secret", ""}, context, router, &auth);
  EXPECT_NE(s.message().find("--zmq-curve-secret-key-file"), std::string::npos) << s;
  absl::StatusOr<CurveKeyPair> k = GenerateCurveKeyPair();
  ASSERT_TRUE(k.ok());
  ASSERT_TRUE(WriteCurveCertificates(dir / "server", *k).ok());
  s = ConfigureCurveServer({dir / "server.key_secret", dir.path() + "/empty-nonexistent"}, context,
                           router, &auth);
  EXPECT_NE(s.message().find("--zmq-curve-authorized-clients"), std::string::npos) << s;
  EXPECT_EQ(auth, nullptr);
  EXPECT_TRUE(ConfigureCurveServer({}, context, router, &auth).ok()) << "no flags: nothing changes";
}

}  // namespace
}  // namespace pagedserve
