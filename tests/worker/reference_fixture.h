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
  double mean = 0, std = 0;  // of the full vector (population std)
  // full_logits_file (empty if none) and its vector (empty if unreadable).
  std::string full_logits_file;
  std::vector<float> full_logits;
  // llamacpp_reference.json only: whether llama.cpp saw the same context.
  bool context_matches_transformers = true;
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

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// A little-endian float32 file with no header (full_logits_file); empty when
// it cannot be read.
inline std::vector<float> ReadF32(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return {};
  const std::streamsize bytes = in.tellg();
  std::vector<float> v(static_cast<size_t>(bytes) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(v.data()),
          static_cast<std::streamsize>(v.size() * sizeof(float)));
  return in ? v : std::vector<float>{};
}

inline std::string DirName(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// model.name of a reference JSON ("random_llama", "SmolLM2-135M-Instruct").
inline std::string ReferenceModelName(const std::string& relative_path) {
  return ReadJson(SourceDir() + "/" + relative_path).at("model").at("name").get<std::string>();
}

// Reads reference.json or llamacpp_reference.json (same prompt layout); full
// logit vectors are loaded from the files their steps name (relative to the
// JSON's folder).
inline std::vector<ReferencePrompt> LoadReference(const std::string& relative_path) {
  const std::string path = SourceDir() + "/" + relative_path;
  nlohmann::json j = ReadJson(path);
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
      st.mean = s.value("mean", 0.0);
      st.std = s.value("std", 0.0);
      st.context_matches_transformers = s.value("context_matches_transformers", true);
      if (s.contains("full_logits_file") && s.at("full_logits_file").is_string()) {
        st.full_logits_file = DirName(path) + "/" + s.at("full_logits_file").get<std::string>();
        st.full_logits = ReadF32(st.full_logits_file);
      }
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
