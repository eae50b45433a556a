// Structured output costs on SmolLM2's tokenizer (tests/fixtures/smollm2-tokenizer):
//   BM_Compile50Properties  JSON Schema of 50 properties (mixed types) -> grammar
//   BM_MaskStep/cold        per decode step of a valid 50-property instance, the mask
//                           (first visit of each automaton state: trie walk) + advance
//   BM_MaskStep/warm        the same with the constraint's state cache warm (what every
//                           request after the first with the same schema pays)
//   BM_SampleMasked         Sampler::Sample at batch 32, vocab 49152, with / without
//                           an allowed-token mask (the masking cost in the sampler)
// Run: PAGEDSERVE_SOURCE_DIR=. build/bench/bench_grammar
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/grammar/json_schema.h"
#include "runtime/grammar/token_mask.h"
#include "runtime/sampling/sampler.h"
#include "runtime/tokenizer/loaders.h"

namespace pagedserve {
namespace {

const Tokenizer& Smollm2() {
  static auto* tok = [] {
    const char* dir = std::getenv("PAGEDSERVE_SOURCE_DIR");
    auto t = LoadHfTokenizer(std::string(dir ? dir : ".") + "/tests/fixtures/smollm2-tokenizer");
    if (!t.ok()) std::abort();
    return t->release();
  }();
  return *tok;
}

std::shared_ptr<const grammar::TokenVocabulary> Vocab() {
  static auto v = [] {
    const Tokenizer& t = Smollm2();
    DecodeOptions o;
    o.strip_leading_space = false;
    std::vector<std::string> bytes(t.vocab_size());
    for (int32_t id = 0; id < t.vocab_size(); ++id) bytes[id] = t.TokenBytes(id, false, o);
    return *grammar::TokenVocabulary::Create(std::move(bytes), {t.eos_id()});
  }();
  return v;
}

// 50 properties cycling through string (maxLength), integer (bounds), enum,
// boolean, array of numbers, nested object; all required.
std::string Schema50() {
  nlohmann::ordered_json props = nlohmann::ordered_json::object();
  nlohmann::ordered_json required = nlohmann::ordered_json::array();
  for (int i = 0; i < 50; ++i) {
    const std::string name = "field_" + std::to_string(i);
    nlohmann::ordered_json s;
    switch (i % 6) {
      case 0: s = {{"type", "string"}, {"maxLength", 16}}; break;
      case 1: s = {{"type", "integer"}, {"minimum", 0}, {"maximum", 1000}}; break;
      case 2: s = {{"enum", {"red", "green", "blue"}}}; break;
      case 3: s = {{"type", "boolean"}}; break;
      case 4: s = {{"type", "array"}, {"items", {{"type", "number"}}}, {"maxItems", 4}}; break;
      default:
        s = {{"type", "object"},
             {"properties", {{"x", {{"type", "number"}}}, {"y", {{"type", "string"}}}}},
             {"required", {"x"}}};
    }
    props[name] = s;
    required.push_back(name);
  }
  return nlohmann::ordered_json{{"type", "object"}, {"properties", props}, {"required", required}}
      .dump();
}

std::string Instance50() {
  std::string out = "{";
  for (int i = 0; i < 50; ++i) {
    if (i) out += ",";
    out += "\"field_" + std::to_string(i) + "\":";
    switch (i % 6) {
      case 0: out += "\"value " + std::to_string(i) + "\""; break;
      case 1: out += std::to_string(i * 17); break;
      case 2: out += "\"green\""; break;
      case 3: out += "true"; break;
      case 4: out += "[1.5,2,-3e2]"; break;
      default: out += "{\"x\":" + std::to_string(i) + ".25,\"y\":\"ok\"}";
    }
  }
  return out + "}";
}

void BM_Compile50Properties(benchmark::State& state) {
  const std::string schema = Schema50();
  for (auto _ : state) {
    auto g = grammar::CompileJsonSchema(schema);
    if (!g.ok()) state.SkipWithError("compile failed");
    benchmark::DoNotOptimize(g);
  }
}
BENCHMARK(BM_Compile50Properties)->Unit(benchmark::kMillisecond);

void BM_MaskStep(benchmark::State& state) {
  const bool warm = state.range(0) == 1;
  auto g = *grammar::CompileJsonSchema(Schema50());
  const std::vector<int32_t> tokens = Smollm2().Encode(Instance50(), EncodeOptions{false, false});
  auto shared = std::make_shared<grammar::CompiledConstraint>(g, Vocab());
  int64_t steps = 0;
  for (auto _ : state) {
    auto c = warm ? shared : std::make_shared<grammar::CompiledConstraint>(g, Vocab());
    grammar::ConstraintMatcher m(c);
    for (int32_t t : tokens) {
      auto mask = m.Mask();
      if (!grammar::MaskAllows(*mask, t) || !m.Accept(t)) state.SkipWithError("token refused");
      benchmark::DoNotOptimize(mask);
    }
    steps += static_cast<int64_t>(tokens.size());
  }
  state.counters["us_per_step"] = benchmark::Counter(
      static_cast<double>(steps), benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
  state.counters["tokens"] = static_cast<double>(tokens.size());
}
BENCHMARK(BM_MaskStep)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

void BM_SampleMasked(benchmark::State& state) {
  constexpr int kVocab = 49152, kBatch = 32;
  const bool masked = state.range(0) == 1;
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> logits(static_cast<size_t>(kBatch) * kVocab);
  for (float& x : logits) x = nd(rng);
  std::vector<uint64_t> mask(kVocab / 64, 0);
  for (int i = 0; i < kVocab; i += 7) mask[i / 64] |= uint64_t{1} << (i % 64);
  SamplingParams p;
  std::vector<SamplerRow> rows(kBatch);
  for (auto& r : rows) {
    r.params = &p;
    if (masked) r.allowed_tokens = mask;
  }
  Sampler sampler(kVocab);
  for (auto _ : state) benchmark::DoNotOptimize(sampler.Sample(logits, rows));
}
BENCHMARK(BM_SampleMasked)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace pagedserve

BENCHMARK_MAIN();
