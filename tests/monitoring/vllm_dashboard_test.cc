// vLLM's example Grafana dashboard finds its series in our /metrics.
//
// tests/monitoring/vllm_dashboard_queries.txt holds the PromQL queries of
// vLLM's examples/online_serving/prometheus_grafana/grafana.json (source and
// revision named there). For every query this test parses out the series
// selectors (metric name and label matchers, Grafana's $model_name replaced by
// the served model name) and the grouping labels, and checks the exposition
// of a Metrics registry after the monitoring workload (tests/monitoring/
// workload.h, which touches every family) on the live HTTP endpoint:
//   - every selector matches at least one sample: its name exists and every
//     matcher (=, !=, =~, !~) holds on that sample's labels;
//   - every by(...) label is on a matching sample (a panel split by
//     finished_reason has a finished_reason to split by);
//   - the counters and histograms the queries read have been filled (> 0), so
//     the vllm:* series are wired to the calls, not merely registered.
// A negative control drops one family from the exposition and expects the
// check to name it.
#include <initializer_list>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "monitoring/metrics.h"
#include "tests/monitoring/promql_names.h"
#include "tests/monitoring/test_util.h"
#include "tests/monitoring/workload.h"

namespace pagedserve {
namespace {

using testing::PromqlSelector;
using testing::Sample;

struct Query {
  std::string expr;
  bool variable = false;  // a template variable's label_values(SELECTOR, LABEL)
  int line = 0;
};

std::vector<Query> ReadQueries() {
  const std::string path = testing::SourceDir() + "/tests/monitoring/vllm_dashboard_queries.txt";
  std::istringstream in(testing::ReadFile(path));
  std::vector<Query> out;
  int n = 0;
  for (std::string line; std::getline(in, line);) {
    ++n;
    if (line.empty() || line[0] == '#') continue;
    Query q;
    q.line = n;
    const std::string prefix = "variable: ";
    if (line.rfind(prefix, 0) == 0) {
      q.variable = true;
      line = line.substr(prefix.size());
    }
    q.expr = line;
    out.push_back(q);
  }
  return out;
}

// Replaces Grafana's $model_name / ${model_name} / [[model_name]].
std::string Substitute(std::string value, const std::string& model_name) {
  for (const std::string var : {"${model_name}", "[[model_name]]", "$model_name"}) {
    for (size_t p = value.find(var); p != std::string::npos; p = value.find(var, p)) {
      value.replace(p, var.size(), model_name);
      p += model_name.size();
    }
  }
  return value;
}

bool Holds(const testing::PromqlMatcher& m, const std::string& name, const Sample& s) {
  std::string actual = name;
  if (m.label != "__name__") {
    auto it = s.labels.find(m.label);
    actual = it == s.labels.end() ? "" : it->second;  // a missing label is ""
  }
  if (m.op == "=") return actual == m.value;
  if (m.op == "!=") return actual != m.value;
  const bool match = std::regex_match(actual, std::regex(m.value));  // anchored, as in PromQL
  return m.op == "=~" ? match : !match;
}

// The samples a selector selects (name empty: any name, __name__ matchers apply).
std::vector<const Sample*> Select(const std::vector<Sample>& samples, const PromqlSelector& sel,
                                  const std::string& model_name) {
  std::vector<const Sample*> out;
  for (const Sample& s : samples) {
    if (!sel.name.empty() && s.name != sel.name) continue;
    bool all = true;
    for (testing::PromqlMatcher m : sel.matchers) {
      m.value = Substitute(m.value, model_name);
      all = all && Holds(m, s.name, s);
    }
    if (all) out.push_back(&s);
  }
  return out;
}

std::string Cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

// The PromQL part of a query: for label_values(SELECTOR, LABEL), SELECTOR.
std::string SelectorPart(const Query& q) {
  if (!q.variable) return q.expr;
  const size_t open = q.expr.find('(');
  const size_t comma = q.expr.rfind(',');
  if (open == std::string::npos || comma == std::string::npos || comma < open) return "";
  return q.expr.substr(open + 1, comma - open - 1);
}

// Everything a dashboard query of `queries` would miss in `exposition`, one
// line per problem; empty when every query finds its series.
std::vector<std::string> Problems(const std::vector<Query>& queries, const std::string& exposition,
                                  const std::string& model_name) {
  std::vector<std::string> problems;
  auto samples = testing::ParseExposition(exposition);
  if (!samples) return {"the exposition does not parse"};
  for (const Query& q : queries) {
    const std::string where = "line " + std::to_string(q.line) + " `" + q.expr + "`: ";
    std::vector<PromqlSelector> selectors;
    if (!testing::PromqlSelectors(SelectorPart(q), &selectors)) {
      problems.push_back(where + "cannot parse its label matchers");
      continue;
    }
    if (selectors.empty()) problems.push_back(where + "no series selector found");
    std::vector<const Sample*> selected_all;
    bool all_found = true;
    for (const PromqlSelector& sel : selectors) {
      std::vector<const Sample*> selected = Select(*samples, sel, model_name);
      if (selected.empty()) {
        std::string m;
        for (const auto& x : sel.matchers) m += " " + x.label + x.op + "\"" + x.value + "\"";
        problems.push_back(where + "no series " + (sel.name.empty() ? "{}" : sel.name) + " with" +
                           (m.empty() ? " any labels" : m));
        all_found = false;
        continue;
      }
      // A counter or histogram the dashboard plots has seen the workload.
      const std::string& n = sel.name;
      auto ends = [&n](const std::string& suffix) {
        return n.size() > suffix.size() &&
               n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0;
      };
      if (ends("_total") || ends("_sum") || ends("_count") || ends("_bucket")) {
        double total = 0;
        for (const Sample* s : selected) total += s->value;
        if (!(total > 0)) problems.push_back(where + n + " is 0 after the workload");
      }
      selected_all.insert(selected_all.end(), selected.begin(), selected.end());
    }
    if (!all_found) continue;  // said once, not again for its labels
    for (const std::string& label : testing::PromqlGroupingLabels(q.expr)) {
      bool has = false;
      for (const Sample* s : selected_all) has |= s->labels.count(label) > 0;
      if (!has) problems.push_back(Cat({where, "no selected series has the label ", label}));
    }
    if (q.variable) {  // label_values(SELECTOR, LABEL): LABEL is on a selected series
      const size_t comma = q.expr.rfind(',');
      const size_t close = q.expr.rfind(')');
      std::string label = comma == std::string::npos || close == std::string::npos
                              ? ""
                              : q.expr.substr(comma + 1, close - comma - 1);
      label.erase(0, label.find_first_not_of(' '));
      label.erase(label.find_last_not_of(' ') + 1);
      bool has = false;
      for (const Sample* s : selected_all) {
        auto it = s->labels.find(label);
        has |= it != s->labels.end() && it->second == model_name;
      }
      if (!has) {
        problems.push_back(Cat({where, "no selected series has ", label, "=", model_name}));
      }
    }
  }
  return problems;
}

// The exposition without the lines of family `family` (its samples and
// # HELP / # TYPE lines).
std::string DropFamily(const std::string& text, const std::string& family) {
  std::istringstream in(text);
  std::string out;
  for (std::string line; std::getline(in, line);) {
    const bool comment_of = line.rfind("# HELP " + family + " ", 0) == 0 ||
                            line.rfind("# TYPE " + family + " ", 0) == 0;
    const bool sample_of =
        line.rfind(family, 0) == 0 && line.size() > family.size() &&
        (line[family.size()] == '{' || line[family.size()] == ' ' || line[family.size()] == '_');
    if (!comment_of && !sample_of) out += line + "\n";
  }
  return out;
}

class VllmDashboardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    queries_ = ReadQueries();
    const int port = testing::FreePort();
    ASSERT_GT(port, 0);
    auto m = Metrics::Create(testing::TestOptions("127.0.0.1:" + std::to_string(port)));
    ASSERT_TRUE(m.ok()) << m.status();
    testing::Workload().Play(**m);
    // What Prometheus scrapes: the live endpoint.
    testing::HttpResponse r = testing::HttpGet(port, "/metrics");
    ASSERT_EQ(r.status, 200);
    exposition_ = r.body;
    model_name_ = testing::TestOptions().model_name;
  }
  std::vector<Query> queries_;
  std::string exposition_;
  std::string model_name_;
};

TEST_F(VllmDashboardTest, QueryFileIsTheDashboards) {
  // 27 panel queries and the model_name variable, over 15 vllm:* families.
  ASSERT_EQ(queries_.size(), 28u);
  std::set<std::string> names;
  for (const Query& q : queries_) {
    std::vector<PromqlSelector> selectors;
    ASSERT_TRUE(testing::PromqlSelectors(SelectorPart(q), &selectors)) << q.expr;
    ASSERT_FALSE(selectors.empty()) << q.expr;
    for (const PromqlSelector& s : selectors) {
      if (s.name.empty()) continue;
      EXPECT_EQ(s.name.rfind("vllm:", 0), 0u) << q.expr;
      names.insert(s.name);
      // Every panel query selects the dashboard's model.
      ASSERT_EQ(s.matchers.size(), 1u) << q.expr;
      EXPECT_EQ(s.matchers[0].label, "model_name");
      EXPECT_EQ(s.matchers[0].value, "$model_name");
    }
  }
  EXPECT_EQ(names.size(), 21u);  // _bucket/_sum/_count counted apart
}

TEST_F(VllmDashboardTest, EveryQueryFindsItsSeries) {
  std::vector<std::string> problems = Problems(queries_, exposition_, model_name_);
  for (const std::string& p : problems) ADD_FAILURE() << p;
  EXPECT_TRUE(problems.empty());
}

TEST_F(VllmDashboardTest, AnotherModelNameFindsNothing) {
  // The model_name matchers are checked, not ignored.
  std::vector<std::string> problems = Problems(queries_, exposition_, "some-other-model");
  // One per selector (the 3 "Average" queries have two) and the model_name
  // variable's label_values.
  EXPECT_EQ(problems.size(), queries_.size() + 3) << ::testing::PrintToString(problems);
}

TEST_F(VllmDashboardTest, NegativeControlDroppedFamilyIsNamed) {
  for (const std::string family :
       {"vllm:num_requests_waiting", "vllm:request_success_total",
        "vllm:request_max_num_generation_tokens", "vllm:gpu_cache_usage_perc"}) {
    SCOPED_TRACE(family);
    std::string dropped = DropFamily(exposition_, family);
    ASSERT_LT(dropped.size(), exposition_.size());
    std::vector<std::string> problems = Problems(queries_, dropped, model_name_);
    ASSERT_FALSE(problems.empty());
    for (const std::string& p : problems) {
      EXPECT_NE(p.find("no series " + family), std::string::npos) << p;
    }
  }
}

TEST_F(VllmDashboardTest, NegativeControlLabelsAndEmptyFamilies) {
  // finished_reason renamed: the Finish Reason panel's by(finished_reason) fails.
  std::string renamed = exposition_;
  for (size_t p = renamed.find("finished_reason="); p != std::string::npos;
       p = renamed.find("finished_reason=", p)) {
    renamed.replace(p, 15, "finish_reason");
  }
  std::vector<std::string> problems = Problems(queries_, renamed, model_name_);
  ASSERT_EQ(problems.size(), 1u) << ::testing::PrintToString(problems);
  EXPECT_NE(problems[0].find("no selected series has the label finished_reason"),
            std::string::npos);
  // A registry that saw no traffic has every series, but the check on filled
  // families speaks up.
  auto idle = Metrics::Create(testing::TestOptions());
  ASSERT_TRUE(idle.ok());
  problems = Problems(queries_, (*idle)->Serialize(), model_name_);
  bool zero = false;
  for (const std::string& p : problems)
    zero |= p.find("is 0 after the workload") != std::string::npos;
  EXPECT_TRUE(zero) << ::testing::PrintToString(problems);
}

TEST(VllmNamesTest, TwinsCarryTheSameFigures) {
  // Each vllm:* series reports what its pagedserve_* twin does.
  auto m = Metrics::Create(testing::TestOptions());
  ASSERT_TRUE(m.ok());
  testing::Workload().Play(**m);
  (*m)->SetRequests(2, 7, 1);
  (*m)->SetKvUsage(0.25, 0.5);
  auto samples = testing::ParseExposition((*m)->Serialize());
  ASSERT_TRUE(samples.has_value());
  auto value = [&](const std::string& name, const std::map<std::string, std::string>& labels = {}) {
    auto found = testing::Find(*samples, name, labels);
    EXPECT_EQ(found.size(), 1u) << name;
    return found.empty() ? -1.0 : found[0].value;
  };
  const std::pair<const char*, const char*> same[] = {
      {"vllm:num_requests_running", "pagedserve_requests_running"},
      {"vllm:num_requests_waiting", "pagedserve_requests_waiting"},
      {"vllm:num_requests_swapped", "pagedserve_requests_swapped"},
      {"vllm:generation_tokens_total", "pagedserve_generation_tokens_total"},
      {"vllm:prefix_cache_queries_total", "pagedserve_prefix_cache_queries_tokens_total"},
      {"vllm:gpu_prefix_cache_queries_total", "pagedserve_prefix_cache_queries_tokens_total"},
      {"vllm:prefix_cache_hits_total", "pagedserve_prefix_cache_hits_tokens_total"},
      {"vllm:gpu_prefix_cache_hits_total", "pagedserve_prefix_cache_hits_tokens_total"},
      {"vllm:time_to_first_token_seconds_count", "pagedserve_time_to_first_token_seconds_count"},
      {"vllm:time_to_first_token_seconds_sum", "pagedserve_time_to_first_token_seconds_sum"},
      {"vllm:time_per_output_token_seconds_count", "pagedserve_inter_token_latency_seconds_count"},
      {"vllm:inter_token_latency_seconds_sum", "pagedserve_inter_token_latency_seconds_sum"},
      {"vllm:e2e_request_latency_seconds_sum", "pagedserve_request_e2e_latency_seconds_sum"},
      {"vllm:request_queue_time_seconds_count", "pagedserve_request_queue_time_seconds_count"},
      {"vllm:request_prefill_time_seconds_sum", "pagedserve_request_prefill_time_seconds_sum"},
      {"vllm:request_decode_time_seconds_sum", "pagedserve_request_decode_time_seconds_sum"},
      {"vllm:request_prompt_tokens_sum", "pagedserve_request_prompt_tokens_sum"},
      {"vllm:request_generation_tokens_sum", "pagedserve_request_generation_tokens_sum"},
      {"vllm:iteration_tokens_total_sum", "pagedserve_step_tokens_sum"},
  };
  for (const auto& [vllm, ours] : same) EXPECT_DOUBLE_EQ(value(vllm), value(ours)) << vllm;
  // vLLM counts whole prompts (cache hits included), pagedserve_* computed tokens.
  const testing::Workload w;
  EXPECT_EQ(value("vllm:prompt_tokens_total"), w.prompt_tokens());
  EXPECT_EQ(value("pagedserve_prompt_tokens_total"),
            w.prompt_tokens() - testing::Workload::kCachedPromptTokens);
  EXPECT_EQ(value("vllm:gpu_cache_usage_perc"), 0.25);
  EXPECT_EQ(value("vllm:kv_cache_usage_perc"), 0.25);
  EXPECT_EQ(value("vllm:cpu_cache_usage_perc"), 0.5);
  EXPECT_DOUBLE_EQ(value("vllm:gpu_prefix_cache_hit_rate"),
                   value("pagedserve_prefix_cache_hits_tokens_total") /
                       value("pagedserve_prefix_cache_queries_tokens_total"));
  EXPECT_EQ(value("vllm:num_preemptions_total"), 3);  // 2 swap + 1 recompute
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    EXPECT_EQ(value("vllm:request_success_total", {{"finished_reason", reason}}),
              value("pagedserve_requests_finished_total", {{"finish_reason", reason}}))
        << reason;
  }
  // inference = prefill + decode, per request that produced a token.
  EXPECT_DOUBLE_EQ(value("vllm:request_inference_time_seconds_sum"),
                   value("pagedserve_request_prefill_time_seconds_sum") +
                       value("pagedserve_request_decode_time_seconds_sum"));
  // Every vllm:* sample carries model_name and engine="0".
  int vllm_samples = 0;
  for (const Sample& s : *samples) {
    if (s.name.rfind("vllm:", 0) != 0) continue;
    ++vllm_samples;
    EXPECT_EQ(s.labels.count("model_name"), 1u) << s.name;
    auto engine = s.labels.find("engine");
    EXPECT_TRUE(engine != s.labels.end() && engine->second == "0") << s.name;
  }
  EXPECT_GT(vllm_samples, 250);
}

TEST(VllmNamesTest, BucketsAreVllms) {
  auto m = Metrics::Create(testing::TestOptions());
  ASSERT_TRUE(m.ok());
  auto samples = testing::ParseExposition((*m)->Serialize());
  ASSERT_TRUE(samples.has_value());
  auto bounds = [&](const std::string& family) {
    std::vector<std::string> les;
    for (const Sample& s : testing::Find(*samples, family + "_bucket"))
      les.push_back(s.labels.at("le"));
    return ::testing::PrintToString(les);
  };
  // vllm/v1/metrics/loggers.py at 005a810bc40faa25b8870fbc8559c3462581eee3.
  EXPECT_EQ(bounds("vllm:time_to_first_token_seconds"),
            "{ \"0.001\", \"0.005\", \"0.01\", \"0.02\", \"0.04\", \"0.06\", \"0.08\", \"0.1\", "
            "\"0.25\", \"0.5\", \"0.75\", \"1\", \"2.5\", \"5\", \"7.5\", \"10\", \"20\", \"40\", "
            "\"80\", \"160\", \"640\", \"2560\", \"+Inf\" }");
  EXPECT_EQ(bounds("vllm:time_per_output_token_seconds"),
            "{ \"0.01\", \"0.025\", \"0.05\", \"0.075\", \"0.1\", \"0.15\", \"0.2\", \"0.3\", "
            "\"0.4\", \"0.5\", \"0.75\", \"1\", \"2.5\", \"5\", \"7.5\", \"10\", \"20\", \"40\", "
            "\"80\", \"+Inf\" }");
  EXPECT_EQ(bounds("vllm:e2e_request_latency_seconds"),
            "{ \"0.3\", \"0.5\", \"0.8\", \"1\", \"1.5\", \"2\", \"2.5\", \"5\", \"10\", \"15\", "
            "\"20\", \"30\", \"40\", \"50\", \"60\", \"120\", \"240\", \"480\", \"960\", \"1920\", "
            "\"7680\", \"+Inf\" }");
  EXPECT_EQ(bounds("vllm:iteration_tokens_total"),
            "{ \"1\", \"8\", \"16\", \"32\", \"64\", \"128\", \"256\", \"512\", \"1024\", "
            "\"2048\", \"4096\", \"8192\", \"16384\", \"+Inf\" }");
  // build_1_2_5_buckets(max_model_len).
  EXPECT_EQ(Metrics::Vllm125Buckets(100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(Metrics::Vllm125Buckets(2048),
            (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000}));
  MetricsOptions o = testing::TestOptions();
  o.max_model_len = 2048;
  auto m2 = Metrics::Create(o);
  ASSERT_TRUE(m2.ok());
  samples = testing::ParseExposition((*m2)->Serialize());
  ASSERT_TRUE(samples.has_value());
  EXPECT_EQ(bounds("vllm:request_prompt_tokens"),
            "{ \"1\", \"2\", \"5\", \"10\", \"20\", \"50\", \"100\", \"200\", \"500\", \"1000\", "
            "\"2000\", \"+Inf\" }");
}

}  // namespace
}  // namespace pagedserve
