// Reads the transformers reference fixtures written by
// tests/fixtures/make_reference.py (format: tests/fixtures/README.md).
#ifndef PAGEDSERVE_TESTS_WORKER_REFERENCE_FIXTURE_H_
#define PAGEDSERVE_TESTS_WORKER_REFERENCE_FIXTURE_H_

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace pagedserve::testing {

struct ReferenceStep {
  int context_length = 0;
  int argmax = 0;
  double top1_margin = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_logits;
  double logsumexp = 0;
};

struct ReferencePrompt {
  std::string name;
  std::vector<int32_t> prompt_ids;
  std::vector<ReferenceStep> steps;
  std::vector<int32_t> greedy_ids;
  std::vector<double> greedy_margins;  // top1 - top2 logit at each greedy step
};

inline std::string SourceDir() {
  const char* d = std::getenv("PAGEDSERVE_SOURCE_DIR");
  return d ? d : ".";
}

inline std::vector<ReferencePrompt> LoadReference(const std::string& relative_path) {
  std::ifstream in(SourceDir() + "/" + relative_path);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str());
  std::vector<ReferencePrompt> out;
  for (const auto& p : j.at("prompts")) {
    ReferencePrompt r;
    r.name = p.at("name").get<std::string>();
    r.prompt_ids = p.at("prompt_ids").get<std::vector<int32_t>>();
    for (const auto& s : p.at("steps")) {
      ReferenceStep st;
      st.context_length = s.at("context_length").get<int>();
      st.argmax = s.at("argmax").get<int>();
      st.top1_margin = s.at("top1_margin").get<double>();
      st.top_ids = s.at("top_ids").get<std::vector<int32_t>>();
      st.top_logits = s.at("top_logits").get<std::vector<float>>();
      st.logsumexp = s.at("logsumexp").get<double>();
      r.steps.push_back(std::move(st));
    }
    r.greedy_ids = p.at("greedy_ids").get<std::vector<int32_t>>();
    if (p.contains("greedy_margins"))
      r.greedy_margins = p.at("greedy_margins").get<std::vector<double>>();
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace pagedserve::testing

#endif  // PAGEDSERVE_TESTS_WORKER_REFERENCE_FIXTURE_H_
