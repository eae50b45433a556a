// End to end with a real Prometheus server (Debian package `prometheus`):
// the test serves a Metrics instance on a loopback port, starts Prometheus on
// another loopback port with a temporary data directory, a 1 s scrape interval
// and the project's alert rules, waits for the scrapes and asks PromQL
// questions through /api/v1/query. It also evaluates every expression of the
// Grafana dashboard on the real PromQL engine. The server is stopped and the
// temporary directory removed at the end, also when an assertion fails.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>
#include <chrono>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "gtest/gtest.h"
#include "monitoring/metrics.h"
#include "nlohmann/json.hpp"
#include "tests/monitoring/test_util.h"
#include "tests/monitoring/workload.h"

namespace pagedserve {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

class PrometheusServerTest : public ::testing::Test {
 protected:
  // One server for the whole suite: starting Prometheus is the slow part.
  static void SetUpTestSuite() {
    ASSERT_EQ(testing::RunCommand("command -v prometheus").exit_code, 0)
        << "prometheus not found: install the Debian package `prometheus` (scripts/install-deps)";
    char tmpl[] = "/tmp/pagedserve-prometheus-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;

    metrics_port_ = testing::FreePort();
    ASSERT_GT(metrics_port_, 0);
    auto m = Metrics::Create(testing::TestOptions("127.0.0.1:" + std::to_string(metrics_port_)));
    ASSERT_TRUE(m.ok()) << m.status();
    metrics_ = std::move(*m);
    workload_.Play(*metrics_);

    std::ofstream(dir_ + "/prometheus.yml") << "global:\n"
                                               "  scrape_interval: 1s\n"
                                               "  scrape_timeout: 900ms\n"
                                               "  evaluation_interval: 1s\n"
                                               "rule_files:\n"
                                               "  - "
                                            << testing::SourceDir() << "/monitoring/alerts.yml\n"
                                            << "scrape_configs:\n"
                                               "  - job_name: pagedserve\n"
                                               "    static_configs:\n"
                                               "      - targets: ['127.0.0.1:"
                                            << metrics_port_ << "']\n";

    prometheus_port_ = testing::FreePort();
    ASSERT_GT(prometheus_port_, 0);
    std::string config = "--config.file=" + dir_ + "/prometheus.yml";
    std::string storage = "--storage.tsdb.path=" + dir_ + "/data";
    std::string listen = "--web.listen-address=127.0.0.1:" + std::to_string(prometheus_port_);
    std::string log = dir_ + "/prometheus.log";
    pid_ = fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);  // no orphan server if the test binary dies
      int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      execlp("prometheus", "prometheus", config.c_str(), storage.c_str(), listen.c_str(),
             "--log.level=warn", static_cast<char*>(nullptr));
      _exit(127);
    }
    // Ready within 15 s or fail.
    auto deadline = Clock::now() + std::chrono::seconds(15);
    while (Clock::now() < deadline) {
      if (testing::HttpGet(prometheus_port_, "/-/ready").status == 200) return;
      int status;
      ASSERT_EQ(waitpid(pid_, &status, WNOHANG), 0) << "prometheus exited early:\n" << Log();
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    FAIL() << "prometheus not ready after 15 s:\n" << Log();
  }

  static void TearDownTestSuite() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status;
      auto deadline = Clock::now() + std::chrono::seconds(5);
      while (waitpid(pid_, &status, WNOHANG) == 0) {
        if (Clock::now() > deadline) {
          kill(pid_, SIGKILL);
          waitpid(pid_, &status, 0);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
      pid_ = -1;
    }
    metrics_.reset();
    if (!dir_.empty()) testing::RunCommand("rm -rf '" + dir_ + "'");
  }

  static std::string Log() { return testing::ReadFile(dir_ + "/prometheus.log"); }

  // Instant query; returns data.result (an array) or a null json on error.
  static json Query(const std::string& promql, std::string* error = nullptr) {
    auto r =
        testing::HttpGet(prometheus_port_, "/api/v1/query?query=" + testing::UrlEncode(promql));
    json j = json::parse(r.body, nullptr, false);
    if (r.status != 200 || j.is_discarded() || j.value("status", "") != "success") {
      if (error) *error = "HTTP " + std::to_string(r.status) + ": " + r.body;
      return json();
    }
    return j["data"]["result"];
  }

  // Polls until `promql` returns exactly one sample whose value is `want`.
  static ::testing::AssertionResult WaitForValue(
      const std::string& promql, double want,
      std::chrono::seconds timeout = std::chrono::seconds(15)) {
    auto deadline = Clock::now() + timeout;
    std::string last;
    while (Clock::now() < deadline) {
      std::string error;
      json result = Query(promql, &error);
      last = result.is_null() ? error : result.dump();
      if (result.is_array() && result.size() == 1 &&
          std::stod(result[0]["value"][1].get<std::string>()) == want) {
        return ::testing::AssertionSuccess();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    return ::testing::AssertionFailure() << promql << " != " << want << "; last answer: " << last;
  }

  void SetUp() override { ASSERT_TRUE(metrics_ != nullptr && pid_ > 0) << "suite set-up failed"; }

  static inline std::string dir_;
  static inline int metrics_port_ = 0;
  static inline int prometheus_port_ = 0;
  static inline pid_t pid_ = -1;
  static inline std::unique_ptr<Metrics> metrics_;
  static inline testing::Workload workload_;
};

TEST_F(PrometheusServerTest, ScrapesTheExposerAndAnswersPromql) {
  const std::string instance = "127.0.0.1:" + std::to_string(metrics_port_);
  ASSERT_TRUE(WaitForValue("up{job=\"pagedserve\"}", 1)) << Log();
  EXPECT_TRUE(WaitForValue("pagedserve_generation_tokens_total{instance=\"" + instance + "\"}",
                           static_cast<double>(workload_.generation_tokens())));
  EXPECT_TRUE(WaitForValue("sum(pagedserve_requests_finished_total)", 5));
  EXPECT_TRUE(WaitForValue("pagedserve_requests_finished_total{finish_reason=\"stop\"}", 2));
  EXPECT_TRUE(WaitForValue("pagedserve_time_to_first_token_seconds_count", 3));
  EXPECT_TRUE(WaitForValue("count(pagedserve_rank_step_duration_seconds_count)", 2));
  EXPECT_TRUE(WaitForValue("pagedserve_build_info{tensor_parallel_size=\"2\",backend=\"cpu\"}", 1));
  // The server follows live changes.
  metrics_->AddGenerationTokens(1000);
  metrics_->SetRequests(4, 7, 0);
  EXPECT_TRUE(WaitForValue("pagedserve_generation_tokens_total",
                           static_cast<double>(workload_.generation_tokens() + 1000)));
  EXPECT_TRUE(WaitForValue("pagedserve_requests_waiting", 7));
  // The rate over the last scrapes sees the 1000 new tokens.
  EXPECT_TRUE(WaitForValue("increase(pagedserve_generation_tokens_total[1m]) > bool 0", 1));

  // The alert rules loaded without error and are being evaluated.
  auto rules = testing::HttpGet(prometheus_port_, "/api/v1/rules");
  json rj = json::parse(rules.body, nullptr, false);
  ASSERT_FALSE(rj.is_discarded()) << rules.body;
  int alerting = 0;
  for (const auto& g : rj["data"]["groups"]) {
    for (const auto& r : g["rules"]) {
      EXPECT_EQ(r.value("health", ""), "ok") << r.dump();
      alerting += r.value("type", "") == "alerting";
    }
  }
  EXPECT_EQ(alerting, 8) << rules.body;
}

TEST_F(PrometheusServerTest, EveryDashboardExpressionEvaluates) {
  ASSERT_TRUE(WaitForValue("count_over_time(up{job=\"pagedserve\"}[1m]) >= bool 3", 1)) << Log();
  json dashboard = json::parse(
      testing::ReadFile(testing::SourceDir() + "/monitoring/grafana/pagedserve-dashboard.json"),
      nullptr, false);
  ASSERT_FALSE(dashboard.is_discarded());
  int checked = 0;
  for (const auto& panel : dashboard["panels"]) {
    if (!panel.contains("targets")) continue;
    for (const auto& t : panel["targets"]) {
      std::string expr = t.value("expr", "");
      // Grafana's variables, as Grafana would substitute them.
      for (auto [var, value] : {std::pair<std::string, std::string>{"$__rate_interval", "1m"},
                                {"$instance", ".*"},
                                {"$model_name", ".*"}}) {
        for (size_t at; (at = expr.find(var)) != std::string::npos;)
          expr.replace(at, var.size(), value);
      }
      std::string error;
      json result = Query(expr, &error);
      EXPECT_TRUE(result.is_array()) << panel.value("title", "") << ": " << expr << "\n" << error;
      EXPECT_FALSE(result.is_array() && result.empty())
          << panel.value("title", "") << ": no series for " << expr;
      ++checked;
    }
  }
  EXPECT_GE(checked, 20);
}

TEST_F(PrometheusServerTest, EveryVllmDashboardQueryEvaluates) {
  // vLLM's example dashboard's queries (tests/monitoring/vllm_dashboard_queries.txt,
  // also checked lexically by vllm_dashboard_test) on the real PromQL engine.
  ASSERT_TRUE(WaitForValue("count_over_time(up{job=\"pagedserve\"}[1m]) >= bool 3", 1)) << Log();
  const std::string model = testing::TestOptions().model_name;
  std::istringstream in(
      testing::ReadFile(testing::SourceDir() + "/tests/monitoring/vllm_dashboard_queries.txt"));
  int checked = 0;
  for (std::string expr; std::getline(in, expr);) {
    if (expr.empty() || expr[0] == '#') continue;
    if (expr.rfind("variable: ", 0) == 0) {  // label_values({__name__=~"vllm:.*"},model_name)
      auto r =
          testing::HttpGet(prometheus_port_, "/api/v1/label/model_name/values?match[]=" +
                                                 testing::UrlEncode("{__name__=~\"vllm:.*\"}"));
      EXPECT_EQ(r.status, 200) << r.body;
      EXPECT_NE(r.body.find("\"" + model + "\""), std::string::npos) << r.body;
      ++checked;
      continue;
    }
    for (auto [var, value] :
         {std::pair<std::string, std::string>{"$__rate_interval", "1m"}, {"$model_name", model}}) {
      for (size_t at; (at = expr.find(var)) != std::string::npos;)
        expr.replace(at, var.size(), value);
    }
    std::string error;
    json result = Query(expr, &error);
    EXPECT_TRUE(result.is_array()) << expr << "\n" << error;
    EXPECT_FALSE(result.is_array() && result.empty()) << "no series for " << expr;
    ++checked;
  }
  EXPECT_EQ(checked, 28);
}

}  // namespace
}  // namespace pagedserve
