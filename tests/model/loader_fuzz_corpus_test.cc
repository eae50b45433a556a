// Replays the committed seed corpora of the loader fuzz targets (and the
// regression inputs the fuzzer found, corpus/<target>/regress-*) through the
// fuzz entry points of loader_fuzz_entry.h, so that the invariants the fuzzers
// check run on every build, with any compiler. Prefixes of every seed are
// replayed too: truncated files are the most common malformed input.
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "runtime/model/gguf.h"
#include "runtime/model/model_config.h"
#include "runtime/model/safetensors.h"
#include "runtime/model/weights.h"
#include "runtime/tokenizer/loaders.h"
#include "runtime/tokenizer/tokenizer.h"
#include "tests/model/loader_fuzz_entry.h"
#include "tests/model/test_util.h"

namespace pagedserve {
namespace {

using Entry = std::string (*)(const uint8_t*, size_t);

std::string ReadAll(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::filesystem::path SourceDir() {
  const char* root = std::getenv("PAGEDSERVE_SOURCE_DIR");
  return root ? std::filesystem::path(root) : std::filesystem::path(".");
}

// Runs `entry` on `bytes` and on prefixes of it (every `step` bytes, and the
// last 64 byte counts), each expected to hold every invariant.
void Replay(Entry entry, const std::string& bytes, const std::string& label) {
  auto run = [&](size_t n) {
    EXPECT_EQ(entry(reinterpret_cast<const uint8_t*>(bytes.data()), n), "")
        << label << " prefix " << n << " of " << bytes.size();
  };
  run(bytes.size());
  const size_t step = std::max<size_t>(1, bytes.size() / 256);
  for (size_t n = 0; n < bytes.size(); n += step) run(n);
  for (size_t n = bytes.size() > 64 ? bytes.size() - 64 : 0; n < bytes.size(); ++n) run(n);
}

int ReplayDir(Entry entry, const std::string& target) {
  const std::filesystem::path dir = SourceDir() / "tests/model/corpus" / target;
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    Replay(entry, ReadAll(e.path()), e.path().string());
    ++files;
  }
  return files;
}

TEST(LoaderFuzzCorpusTest, Gguf) {
  ASSERT_NE(std::getenv("PAGEDSERVE_SOURCE_DIR"), nullptr) << "set by ctest";
  EXPECT_GE(ReplayDir(GgufFuzzOneInput, "gguf"), 4);
  // The committed fixtures too (larger than the seeds).
  for (const char* f : {"tests/model/fixtures/dequant_fixtures.gguf",
                        "tests/fixtures/spm-tiny-tokenizer/spm-tiny.vocab.gguf"}) {
    const std::string bytes = ReadAll(SourceDir() / f);
    ASSERT_FALSE(bytes.empty()) << f;
    EXPECT_EQ(GgufFuzzOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()), "")
        << f;
  }
}

TEST(LoaderFuzzCorpusTest, Safetensors) {
  EXPECT_GE(ReplayDir(SafetensorsFuzzOneInput, "safetensors"), 3);
}

TEST(LoaderFuzzCorpusTest, HfConfig) { EXPECT_GE(ReplayDir(HfConfigFuzzOneInput, "hf_config"), 3); }

TEST(LoaderFuzzCorpusTest, HfTokenizer) {
  EXPECT_GE(ReplayDir(HfTokenizerFuzzOneInput, "hf_tokenizer"), 2);
  std::string spm = ReadAll(SourceDir() / "tests/fixtures/spm-tiny-tokenizer/tokenizer.json");
  ASSERT_FALSE(spm.empty());
  spm += '\0';
  spm += ReadAll(SourceDir() / "tests/fixtures/spm-tiny-tokenizer/tokenizer_config.json");
  EXPECT_EQ(HfTokenizerFuzzOneInput(reinterpret_cast<const uint8_t*>(spm.data()), spm.size()), "");
}

// The seeds reach the deep code: the loaders accept them whole (so that the
// fuzzers start from valid files of every layout, not from early rejections).
TEST(LoaderFuzzCorpusTest, SeedsAreValidFiles) {
  const std::filesystem::path dir = SourceDir() / "tests/model/corpus";
  auto bytes = [&](const char* f) {
    std::string s = ReadAll(dir / f);
    return std::vector<uint8_t>(s.begin(), s.end());
  };
  for (const char* f : {"gguf/seed-llama-gpt2.gguf", "gguf/seed-llama3-rope-freqs.gguf",
                        "gguf/seed-qwen3-qk-norm.gguf", "gguf/seed-qwen2-spm-v2.gguf",
                        "gguf/seed-qwen3moe-experts.gguf"}) {
    auto g = GgufFile::FromBytes(f, bytes(f));
    ASSERT_TRUE(g.ok()) << g.status();
    auto config = ModelConfigFromGguf(**g);
    EXPECT_TRUE(config.ok()) << config.status();
    if (config.ok() && std::string_view(f) == "gguf/seed-llama3-rope-freqs.gguf") {
      EXPECT_EQ(config->rope_scaling.freq_factors.size(), 8u);  // Llama 3's rope_freqs.weight
    }
    if (config.ok() && std::string_view(f) == "gguf/seed-qwen3-qk-norm.gguf") {
      EXPECT_TRUE(config->qk_norm);
      EXPECT_EQ(config->head_size, 16);
    }
    auto spec = TokenizerSpecFromGguf(**g);
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto tok = Tokenizer::Create(std::move(*spec));
    EXPECT_TRUE(tok.ok()) << f << ": " << tok.status();
  }
  // The llama, qwen3 and qwen3moe seeds are whole models: the weights load,
  // also sharded (the experts' down slices of 16 columns are not whole Q4_0
  // blocks there: dequantized to fp32).
  for (const char* f : {"gguf/seed-llama-gpt2.gguf", "gguf/seed-qwen3-qk-norm.gguf",
                        "gguf/seed-qwen3moe-experts.gguf"}) {
    const std::string path = (dir / f).string();
    for (auto [rank, size, dtype] :
         {std::tuple{0, 1, WeightDType::kFloat32}, std::tuple{1, 2, WeightDType::kAuto}}) {
      auto w = LoadLlamaWeights(path, rank, size, dtype);
      ASSERT_TRUE(w.ok()) << f << ": " << w.status();
      EXPECT_EQ(w->layers.size(), 1u);
      EXPECT_EQ(w->embed_tokens.rows, 12);
      EXPECT_EQ(w->layers[0].q_norm.size(), w->config.qk_norm ? 16u : 0u);
      if (w->config.moe.enabled()) {
        ASSERT_EQ(w->layers[0].expert_down.size(), 4u) << f;
        EXPECT_EQ(w->layers[0].expert_gate[3].rows, 32 / size) << f;
        EXPECT_EQ(w->layers[0].expert_down[3].cols, 32 / size) << f;
        EXPECT_EQ(w->layers[0].router.rows, 4) << f;
      }
    }
  }
  auto all = GgufFile::FromBytes("all", bytes("gguf/seed-all-types.gguf"));
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ((*all)->tensors().size(), 20u);  // every ggml type the reader knows
  EXPECT_TRUE(GgufFile::FromBytes("v", bytes("gguf/seed-value-types.gguf")).ok());
  for (const char* f :
       {"safetensors/seed-float.safetensors", "safetensors/seed-int-scalar-empty.safetensors",
        "safetensors/seed-u-types.safetensors"}) {
    auto st = SafetensorsFile::FromBytes(f, bytes(f));
    EXPECT_TRUE(st.ok()) << st.status();
  }
  for (const char* f :
       {"hf_config/seed-llama3.json", "hf_config/seed-qwen2.json", "hf_config/seed-qwen3.json",
        "hf_config/seed-mistral-linear.json", "hf_config/seed-qwen2-window.json",
        "hf_config/seed-gemma2.json", "hf_config/seed-gemma3.json", "hf_config/seed-mixtral.json",
        "hf_config/seed-qwen3-moe.json"}) {
    auto c = ModelConfigFromHfJson(ReadAll(dir / f), f);
    EXPECT_TRUE(c.ok()) << c.status();
    if (c.ok()) {
      const std::string_view name(f);
      EXPECT_EQ(c->qk_norm, name == "hf_config/seed-qwen3.json" ||
                                name == "hf_config/seed-gemma3.json" ||
                                name == "hf_config/seed-qwen3-moe.json")
          << f;
      EXPECT_EQ(c->moe.num_experts,
                name.ends_with("moe.json") || name.ends_with("mixtral.json") ? 4 : 0)
          << f;
      const bool window = name == "hf_config/seed-qwen2-window.json";
      const bool gemma = name.starts_with("hf_config/seed-gemma");
      EXPECT_EQ(c->post_norms, gemma) << f;
      EXPECT_EQ(c->LayerSlidingWindow(1), window ? 32 : 0) << f;
      EXPECT_EQ(c->LayerSlidingWindow(0), gemma ? 16 : 0) << f;  // Gemma: even layers windowed
    }
  }
  for (const char* f : {"hf_tokenizer/seed-bytelevel.json", "hf_tokenizer/seed-spm.json",
                        "hf_tokenizer/seed-metaspace.json"}) {
    const std::string s = ReadAll(dir / f);
    const size_t nul = s.find('\0');
    auto spec = TokenizerSpecFromHfJson(s.substr(0, nul),
                                        nul == std::string::npos ? "" : s.substr(nul + 1));
    ASSERT_TRUE(spec.ok()) << f << ": " << spec.status();
    auto tok = Tokenizer::Create(std::move(*spec));
    EXPECT_TRUE(tok.ok()) << f << ": " << tok.status();
  }
}

// A block_count far beyond the layers in the file used to resize the layer
// vector first (2^31 - 1 layers: bad_alloc, a crash). Now a count above the
// config's bound (4096) is refused as such, and one within it fails on the
// first missing tensor; both name the file.
TEST(LoaderFuzzCorpusTest, HugeBlockCountFailsOnTheMissingLayer) {
  const std::string seed = ReadAll(SourceDir() / "tests/model/corpus/gguf/seed-llama-gpt2.gguf");
  const std::string key = "llama.block_count";
  const size_t at = seed.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t value = at + key.size() + 4;  // after the uint32 value type
  ASSERT_EQ(seed[value], 1);
  const std::string dir = ::pagedserve::testing::MakeTempDir();
  for (const auto& [count, needle] : {std::pair<uint32_t, std::string>{4096, ": layer 1: "},
                                      {0x7fffffff,
                                       ": model config: num_layers 2147483647 is "
                                       "above the bound 4096"}}) {
    std::string bytes = seed;
    std::memcpy(bytes.data() + value, &count, 4);
    const std::string path = absl::StrCat(dir, "/block_count_", count, ".gguf");
    std::ofstream(path, std::ios::binary) << bytes;
    auto w = LoadLlamaWeights(path);
    ASSERT_FALSE(w.ok());
    EXPECT_NE(w.status().message().find(path + needle), std::string::npos) << w.status();
  }
}

// Found by fuzz_gguf: a shape mismatch of embed_tokens / norm / lm_head (and a
// shard layout error) did not name the file, unlike the layers' errors.
TEST(LoaderFuzzCorpusTest, WeightErrorsNameTheFile) {
  std::string bytes = ReadAll(SourceDir() / "tests/model/corpus/gguf/seed-llama-gpt2.gguf");
  const std::string key = "llama.embedding_length";
  const size_t at = bytes.find(key);
  ASSERT_NE(at, std::string::npos);
  const size_t value = at + key.size() + 4;  // after the uint32 value type
  ASSERT_EQ(bytes[value], 32);
  bytes[value] = 64;
  const std::string path = ::pagedserve::testing::MakeTempDir() + "/wide.gguf";
  std::ofstream(path, std::ios::binary) << bytes;
  auto w = LoadLlamaWeights(path);
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().message().rfind(path + ": tensor 'model.embed_tokens.weight': shape", 0), 0u)
      << w.status();
}

// An empty file is rejected by every loader, with the file named.
TEST(LoaderFuzzCorpusTest, EntryPointsAcceptEmptyInput) {
  for (Entry e :
       {GgufFuzzOneInput, SafetensorsFuzzOneInput, HfConfigFuzzOneInput, HfTokenizerFuzzOneInput}) {
    EXPECT_EQ(e(nullptr, 0), "");
  }
}

}  // namespace
}  // namespace pagedserve
