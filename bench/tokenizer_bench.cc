// Encode throughput of the SmolLM2 tokenizer (tests/fixtures/smollm2-tokenizer)
// on ~4 KB of English text (the per-word merge cache is warm after the first
// iteration, as in serving where common words repeat).
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>

#include "runtime/tokenizer/loaders.h"

namespace {

const pagedserve::Tokenizer& Smollm2() {
  static auto* tok = [] {
    const char* dir = std::getenv("PAGEDSERVE_SOURCE_DIR");
    auto t = pagedserve::LoadHfTokenizer(std::string(dir ? dir : ".") +
                                         "/tests/fixtures/smollm2-tokenizer");
    if (!t.ok()) std::abort();
    return t->release();
  }();
  return *tok;
}

std::string EnglishText() {
  std::string base =
      "PagedAttention stores the key and value cache in fixed-size blocks, much as an "
      "operating system pages memory. A block table maps each sequence's logical blocks to "
      "physical ones, so memory is allocated on demand and shared between sequences with "
      "copy-on-write. The scheduler batches prefill and decode steps continuously, and "
      "preempts sequences by swapping their blocks to host memory when the pool runs low.\n";
  std::string text;
  while (text.size() < 4096) text += base;
  return text;
}

void BM_Encode(benchmark::State& state) {
  const auto& tok = Smollm2();
  std::string text = EnglishText();
  size_t tokens = 0;
  for (auto _ : state) {
    auto ids = tok.Encode(text);
    tokens += ids.size();
    benchmark::DoNotOptimize(ids.data());
  }
  state.SetBytesProcessed(state.iterations() * text.size());
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_Encode);

}  // namespace

BENCHMARK_MAIN();
