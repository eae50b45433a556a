// Extracts the metric names that a PromQL expression reads, lexically: drops
// string literals, label matchers {...}, ranges [...] and the label lists of
// by/without/on/ignoring/group_left/group_right, then keeps the identifiers
// that are neither functions/aggregations (followed by "(" or an aggregation
// keyword) nor PromQL keywords. Good enough for the expressions this project
// writes; the Prometheus server test evaluates them with the real parser.
#ifndef PAGEDSERVE_TESTS_MONITORING_PROMQL_NAMES_H_
#define PAGEDSERVE_TESTS_MONITORING_PROMQL_NAMES_H_

#include <cctype>
#include <set>
#include <string>

namespace pagedserve::testing {

inline std::set<std::string> PromqlMetricNames(const std::string& expr) {
  static const std::set<std::string> kKeywords = {
      "by",     "without", "on",      "ignoring", "group_left",   "group_right", "bool",
      "and",    "or",      "unless",  "offset",   "inf",          "nan",         "Inf",
      "NaN",    "sum",     "min",     "max",      "avg",          "count",       "stddev",
      "stdvar", "topk",    "bottomk", "quantile", "count_values", "group",       "atan2"};
  static const std::set<std::string> kLabelLists = {"by",       "without",    "on",
                                                    "ignoring", "group_left", "group_right"};
  auto ident_start = [](char c) {
    return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':';
  };
  auto ident_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':';
  };
  // Pass 1: blank out strings, {...} and [...].
  std::string s = expr;
  for (size_t i = 0; i < s.size(); ++i) {
    char open = s[i];
    char close = open == '{' ? '}' : open == '[' ? ']' : (open == '"' || open == '\'') ? open : 0;
    if (!close) continue;
    size_t j = i + 1;
    while (j < s.size() && s[j] != close) {
      if (s[j] == '\\') ++j;
      ++j;
    }
    for (size_t k = i; k <= j && k < s.size(); ++k) s[k] = ' ';
    i = j;
  }
  std::set<std::string> names;
  for (size_t i = 0; i < s.size();) {
    char c = s[i];
    if (std::isdigit(static_cast<unsigned char>(c)) || c == '.') {  // number, e.g. 0.99 or 1e3
      while (i < s.size() && (ident_char(s[i]) || s[i] == '.')) ++i;
      continue;
    }
    if (c == '$') {  // Grafana variable
      ++i;
      while (i < s.size() && ident_char(s[i])) ++i;
      continue;
    }
    if (!ident_start(c)) {
      ++i;
      continue;
    }
    size_t start = i;
    while (i < s.size() && ident_char(s[i])) ++i;
    std::string word = s.substr(start, i - start);
    size_t next = i;
    while (next < s.size() && std::isspace(static_cast<unsigned char>(s[next]))) ++next;
    if (kLabelLists.count(word) && next < s.size() && s[next] == '(') {
      size_t close = s.find(')', next);
      i = close == std::string::npos ? s.size() : close + 1;
      continue;
    }
    if (kKeywords.count(word)) continue;
    if (next < s.size() && s[next] == '(') continue;  // function call
    names.insert(word);
  }
  return names;
}

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_MONITORING_PROMQL_NAMES_H_
