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
#include <vector>

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

// One label matcher of a selector: label op "value", op one of = != =~ !~.
struct PromqlMatcher {
  std::string label, op, value;
};
// One series selector: `name{matchers}`, `name` or `{matchers}` (name empty).
struct PromqlSelector {
  std::string name;
  std::vector<PromqlMatcher> matchers;
};

// The series selectors of a PromQL expression, lexically: every `{...}` with
// the identifier right before it (if any) as its metric name, plus every
// metric name of PromqlMetricNames that has no braces. Matcher values are
// unquoted (", ' or `; backslash escapes in " and ' strings). Returns false
// (and leaves a partial result) on a malformed matcher list.
inline bool PromqlSelectors(const std::string& expr, std::vector<PromqlSelector>* out) {
  auto ident_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == ':';
  };
  auto skip_space = [&expr](size_t i) {
    while (i < expr.size() && std::isspace(static_cast<unsigned char>(expr[i]))) ++i;
    return i;
  };
  std::set<std::string> with_braces;
  for (size_t i = 0; i < expr.size(); ++i) {
    const char c = expr[i];
    if (c == '"' || c == '\'' || c == '`') {  // a string outside braces
      for (++i; i < expr.size() && expr[i] != c; ++i) {
        if (expr[i] == '\\' && c != '`') ++i;
      }
      continue;
    }
    if (c != '{') continue;
    PromqlSelector sel;
    size_t end = i;
    while (end > 0 && std::isspace(static_cast<unsigned char>(expr[end - 1]))) --end;
    size_t start = end;
    while (start > 0 && ident_char(expr[start - 1])) --start;
    sel.name = expr.substr(start, end - start);
    size_t j = skip_space(i + 1);
    while (j < expr.size() && expr[j] != '}') {
      PromqlMatcher m;
      while (j < expr.size() && ident_char(expr[j])) m.label += expr[j++];
      j = skip_space(j);
      if (m.label.empty() || j + 1 >= expr.size()) return false;
      if (expr.compare(j, 2, "=~") == 0 || expr.compare(j, 2, "!~") == 0 ||
          expr.compare(j, 2, "!=") == 0) {
        m.op = expr.substr(j, 2);
        j += 2;
      } else if (expr[j] == '=') {
        m.op = "=";
        ++j;
      } else {
        return false;
      }
      j = skip_space(j);
      if (j >= expr.size()) return false;
      const char q = expr[j];
      if (q != '"' && q != '\'' && q != '`') return false;
      for (++j; j < expr.size() && expr[j] != q; ++j) {
        if (expr[j] == '\\' && q != '`' && j + 1 < expr.size()) ++j;
        m.value += expr[j];
      }
      if (j >= expr.size()) return false;
      j = skip_space(j + 1);
      if (j < expr.size() && expr[j] == ',') j = skip_space(j + 1);
      sel.matchers.push_back(std::move(m));
    }
    if (j >= expr.size()) return false;
    if (!sel.name.empty()) with_braces.insert(sel.name);
    out->push_back(std::move(sel));
    i = j;
  }
  for (const std::string& name : PromqlMetricNames(expr)) {
    if (!with_braces.count(name)) out->push_back({name, {}});
  }
  return true;
}

// The label names of every `by (...)` / `without (...)` clause.
inline std::set<std::string> PromqlGroupingLabels(const std::string& expr) {
  std::set<std::string> labels;
  for (const char* keyword : {"by", "without"}) {
    const std::string k = keyword;
    for (size_t p = expr.find(k); p != std::string::npos; p = expr.find(k, p + 1)) {
      const bool word_start = p == 0 || !(std::isalnum(static_cast<unsigned char>(expr[p - 1])) ||
                                          expr[p - 1] == '_' || expr[p - 1] == ':');
      size_t j = p + k.size();
      while (j < expr.size() && std::isspace(static_cast<unsigned char>(expr[j]))) ++j;
      if (!word_start || j >= expr.size() || expr[j] != '(') continue;
      const size_t close = expr.find(')', j);
      if (close == std::string::npos) break;
      std::string label;
      for (size_t i = j + 1; i <= close; ++i) {
        const char c = expr[i];
        if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
          label += c;
        } else if (!label.empty()) {
          labels.insert(label);
          label.clear();
        }
      }
    }
  }
  return labels;
}

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_MONITORING_PROMQL_NAMES_H_
