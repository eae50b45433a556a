// Checks with Prometheus' own tool (promtool, Debian package `prometheus`):
// the exposition lints clean, the scrape config and alert rules load, the
// alert unit tests pass; and the Grafana dashboard only queries metrics that
// Metrics exports.
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "monitoring/metrics.h"
#include "nlohmann/json.hpp"
#include "tests/monitoring/promql_names.h"
#include "tests/monitoring/test_util.h"
#include "tests/monitoring/workload.h"

namespace pagedserve {
namespace {

using testing::RunCommand;
using testing::SourceDir;

class PromtoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(RunCommand("command -v promtool").exit_code, 0)
        << "promtool not found: install the Debian package `prometheus` (scripts/install-deps)";
    char tmpl[] = "/tmp/pagedserve-promtool-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) RunCommand("rm -rf '" + dir_ + "'");
  }
  std::string Write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
  std::string dir_;
};

std::string TouchedExposition() {
  auto m = Metrics::Create(testing::TestOptions());
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return "";
  testing::Workload().Play(**m);
  (*m)->SetKvUsage(2.0, 0.0);  // creates the rejected-observations series too
  return (*m)->Serialize();
}

// promtool's lint findings other than the two it must make about vLLM's own
// names, which pagedserve exports unchanged for vLLM's dashboards (see
// docs/metrics.md, "vLLM names"): every `vllm:NAME` contains ':' (promtool
// reserves colons for recording rules), and vLLM's histogram
// vllm:iteration_tokens_total ends in _total. Every pagedserve_* and exposer_*
// finding, and any other vllm:* finding, is returned.
std::vector<std::string> UnexpectedLintFindings(const std::string& output) {
  std::vector<std::string> unexpected;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const bool vllm = line.rfind("vllm:", 0) == 0;
    const bool colon = line.find(" metric names should not contain ':'") != std::string::npos;
    const bool total = line ==
                       "vllm:iteration_tokens_total non-counter metrics should not have "
                       "\"_total\" suffix";
    if (!vllm || !(colon || total)) unexpected.push_back(line);
  }
  return unexpected;
}

TEST_F(PromtoolTest, CheckMetricsReportsNothing) {
  std::string text = TouchedExposition();
  ASSERT_NE(text.find("pagedserve_metrics_rejected_observations_total{"), std::string::npos);
  std::string path = Write("metrics.prom", text);
  auto r = RunCommand("promtool check metrics < '" + path + "'");
  // Exit 3 = lint findings only (vLLM's names, below); no parse error.
  EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 3) << r.output;
  EXPECT_EQ(UnexpectedLintFindings(r.output), std::vector<std::string>{}) << r.output;
  // Exactly the expected findings about vLLM's names: one ':' finding per vllm:
  // family, so the filter above cannot hide a missing or extra family.
  EXPECT_NE(r.output.find("vllm:num_requests_waiting metric names should not contain ':'"),
            std::string::npos)
      << r.output;
}

TEST_F(PromtoolTest, CheckMetricsReportsNothingOnTheLiveEndpoint) {
  // What Prometheus really scrapes: our registry plus the exposer's own series.
  int port = testing::FreePort();
  ASSERT_GT(port, 0);
  auto m = Metrics::Create(testing::TestOptions("127.0.0.1:" + std::to_string(port)));
  ASSERT_TRUE(m.ok()) << m.status();
  testing::Workload().Play(**m);
  auto r = testing::HttpGet(port, "/metrics");
  ASSERT_EQ(r.status, 200);
  ASSERT_NE(r.body.find("pagedserve_generation_tokens_total"), std::string::npos);
  std::string path = Write("live.prom", r.body);
  auto check = RunCommand("promtool check metrics < '" + path + "'");
  EXPECT_TRUE(check.exit_code == 0 || check.exit_code == 3) << check.output;
  EXPECT_EQ(UnexpectedLintFindings(check.output), std::vector<std::string>{}) << check.output;
}

TEST_F(PromtoolTest, LintFilterLetsOnlyVllmNamesThrough) {
  // Negative control of UnexpectedLintFindings: a pagedserve_ name with a
  // colon, a vllm: counter without _total and a vllm: histogram ending in
  // _total other than vLLM's are all reported.
  std::string path = Write("mixed.prom",
                           "# TYPE pagedserve_a:b gauge\npagedserve_a:b 1\n"
                           "# TYPE vllm:bad counter\nvllm:bad 1\n"
                           "# TYPE vllm:other_total histogram\nvllm:other_total_count 1\n"
                           "vllm:other_total_sum 1\nvllm:other_total_bucket{le=\"+Inf\"} 1\n");
  auto r = RunCommand("promtool check metrics < '" + path + "'");
  std::vector<std::string> found = UnexpectedLintFindings(r.output);
  std::string all;
  for (const std::string& f : found) all += f + "\n";
  EXPECT_NE(all.find("pagedserve_a:b"), std::string::npos) << r.output;
  EXPECT_NE(all.find("vllm:bad counter metrics should have \"_total\" suffix"), std::string::npos)
      << r.output;
  EXPECT_NE(all.find("vllm:other_total non-counter"), std::string::npos) << r.output;
}

TEST_F(PromtoolTest, CheckMetricsCatchesBadNames) {
  // Negative control: proves the lint above would speak up.
  std::string path = Write("bad.prom",
                           "# HELP pagedserve_latency_ms Latency.\n"
                           "# TYPE pagedserve_latency_ms counter\n"
                           "pagedserve_latency_ms 3\n");
  auto r = RunCommand("promtool check metrics < '" + path + "'");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("_total"), std::string::npos) << r.output;
}

TEST_F(PromtoolTest, ScrapeConfigIsValid) {
  auto r = RunCommand("promtool check config '" + SourceDir() + "/monitoring/prometheus.yml'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("SUCCESS: 1 rule files found"), std::string::npos) << r.output;
}

TEST_F(PromtoolTest, AlertRulesAreValid) {
  auto r = RunCommand("promtool check rules '" + SourceDir() + "/monitoring/alerts.yml'");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("SUCCESS"), std::string::npos) << r.output;
}

TEST_F(PromtoolTest, AlertRuleUnitTestsPass) {
  auto r = RunCommand("cd '" + SourceDir() +
                      "/tests/monitoring' && promtool test rules alerts_test.yml");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("SUCCESS"), std::string::npos) << r.output;
}

TEST(PromqlNamesTest, ExtractsOnlyMetricNames) {
  auto names = testing::PromqlMetricNames(
      "histogram_quantile(0.99, sum by (le, job) (rate(a_bucket{instance=~\"$instance\", "
      "x=\"rate(b)\"}[$__rate_interval]))) / on (job) group_left sum(c) > bool 1e3 "
      "and min without (rank) (d:mean5m offset 5m)");
  EXPECT_EQ(names, (std::set<std::string>{"a_bucket", "c", "d:mean5m"}));
}

std::set<std::string> ExportedSampleNames(const std::string& text,
                                          std::set<std::string>* families) {
  std::set<std::string> names;
  auto samples = testing::ParseExposition(text);
  EXPECT_TRUE(samples.has_value());
  for (const auto& s : samples.value_or(std::vector<testing::Sample>{})) names.insert(s.name);
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("# TYPE ", 0) == 0) families->insert(line.substr(7, line.find(' ', 7) - 7));
  }
  return names;
}

TEST(DashboardTest, ParsesAndQueriesOnlyExportedMetrics) {
  std::string path = SourceDir() + "/monitoring/grafana/pagedserve-dashboard.json";
  std::string text = testing::ReadFile(path);
  ASSERT_FALSE(text.empty()) << path;
  nlohmann::json d = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(d.is_discarded()) << path << " is not valid JSON";
  EXPECT_GE(d.value("schemaVersion", 0), 36);
  EXPECT_FALSE(d.value("uid", "").empty());
  bool has_ds_variable = false;
  for (const auto& v : d["templating"]["list"]) {
    if (v.value("name", "") == "DS_PROMETHEUS" && v.value("type", "") == "datasource")
      has_ds_variable = true;
  }
  EXPECT_TRUE(has_ds_variable) << "the data source must be the ${DS_PROMETHEUS} variable";
  bool has_model_variable = false;
  for (const auto& v : d["templating"]["list"])
    has_model_variable |= v.value("name", "") == "model_name";
  EXPECT_TRUE(has_model_variable)
      << "a model_name variable selects the served model, as vLLM's dashboards do";

  std::set<std::string> families;
  std::set<std::string> exported = ExportedSampleNames(TouchedExposition(), &families);
  std::set<std::string> used;
  int exprs = 0;
  for (const auto& panel : d["panels"]) {
    if (panel.value("type", "") == "row") continue;
    SCOPED_TRACE(panel.value("title", "?"));
    EXPECT_EQ(panel["datasource"].value("uid", ""), "${DS_PROMETHEUS}");
    ASSERT_TRUE(panel.contains("targets"));
    for (const auto& t : panel["targets"]) {
      std::string expr = t.value("expr", "");
      ASSERT_FALSE(expr.empty());
      ++exprs;
      // Every series selector filters by the served model (label model_name).
      size_t selectors = 0, filtered = 0;
      for (size_t p = expr.find('{'); p != std::string::npos; p = expr.find('{', p + 1))
        ++selectors;
      for (size_t p = expr.find("model_name=~\"$model_name\""); p != std::string::npos;
           p = expr.find("model_name=~\"$model_name\"", p + 1)) {
        ++filtered;
      }
      EXPECT_EQ(filtered, selectors)
          << "`" << expr << "` does not select model_name=~\"$model_name\"";
      for (const std::string& name : testing::PromqlMetricNames(expr)) {
        EXPECT_TRUE(exported.count(name))
            << "'" << name << "' in `" << expr << "` is not exported by Metrics";
        used.insert(name);
      }
    }
  }
  EXPECT_GE(exprs, 20);
  // Every exported family is on the dashboard, except the caller-bug counter
  // (alerted on instead).
  for (const std::string& family : families) {
    if (family == "pagedserve_metrics_rejected_observations_total") continue;
    // vLLM's names are for vLLM's dashboards (vllm_dashboard_test); this one
    // shows each figure once, under its pagedserve_* name.
    if (family.rfind("vllm:", 0) == 0) continue;
    bool shown = false;
    for (const std::string& u : used) shown |= u.rfind(family, 0) == 0;
    EXPECT_TRUE(shown) << family << " is not on the dashboard";
  }
}

}  // namespace
}  // namespace pagedserve

namespace pagedserve {
namespace {

TEST(DocsTest, EveryExportedMetricIsDocumented) {
  std::string docs = testing::ReadFile(SourceDir() + "/docs/metrics.md");
  ASSERT_FALSE(docs.empty());
  std::set<std::string> families;
  ExportedSampleNames(TouchedExposition(), &families);
  EXPECT_GE(families.size(), 23u);
  for (const std::string& f : families) {
    EXPECT_NE(docs.find("| `" + f + "` |"), std::string::npos)
        << f << " is missing from docs/metrics.md";
  }
}

}  // namespace
}  // namespace pagedserve
