// Tokenizer conformance against llama.cpp's own corpus: the vocabulary-only
// GGUF files of llama.cpp's tree (models/ggml-vocab-NAME.gguf) with their test
// inputs (.gguf.inp: texts separated by "\n__ggml_vocab_test__\n") and the ids
// llama.cpp's reference tokenizers produced for them (.gguf.out: one line of
// space-separated ids per text; written by llama.cpp's test-tokenizer-0 from
// the Hugging Face tokenizers, encoding without special tokens and without
// parsing special-token text). tests/chat/fetch_templates.sh extracts them from
// the llama-cpp-python source package into PAGEDSERVE_TEMPLATES_DIR/vocab.
//
// Rule: every vocabulary in kSupported loads and encodes every text to exactly
// the reference ids (and decodes them back to the text where the tokenizer is
// lossless); every other vocabulary with a corpus is refused at load with
// Unimplemented or InvalidArgument naming what is missing - a tokenizer that
// loads and then disagrees is the failure this test exists for.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "runtime/tokenizer/loaders.h"
#include "runtime/tokenizer/tokenizer.h"

namespace pagedserve {
namespace {

namespace fs = std::filesystem;

// The vocabularies pagedserve claims: the tokenizer types and pre-tokenizers
// of the models it loads (runtime/tokenizer/loaders.h).
const std::set<std::string>& Supported() {
  static const auto* s = new std::set<std::string>{
      "llama-bpe",    "llama-spm",      "qwen2",  "gpt-2", "phi-3",     "starcoder", "refact",
      "deepseek-llm", "deepseek-coder", "falcon", "mpt",   "command-r", "qwen35"};
  return *s;
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Corpus {
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
};

Corpus ReadCorpus(const fs::path& gguf) {
  Corpus c;
  std::string inp = ReadFile(gguf.string() + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  // The file ends with a separator: the part after the last one is empty.
  for (absl::string_view t : absl::StrSplit(inp, absl::string_view(sep.data(), sep.size()))) {
    c.texts.emplace_back(t);
  }
  if (!c.texts.empty() && c.texts.back().empty()) c.texts.pop_back();
  std::string out = ReadFile(gguf.string() + ".out");
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    std::vector<int32_t> row;
    for (absl::string_view id : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      row.push_back(std::stoi(std::string(id)));
    }
    c.ids.push_back(std::move(row));
  }
  if (!c.ids.empty() && c.ids.size() == c.texts.size() + 1 && c.ids.back().empty())
    c.ids.pop_back();
  return c;
}

std::string Name(const fs::path& gguf) {
  std::string stem = gguf.filename().string();  // ggml-vocab-NAME.gguf
  return stem.substr(std::string("ggml-vocab-").size(),
                     stem.size() - std::string("ggml-vocab-").size() - std::string(".gguf").size());
}

std::string Ids(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) absl::StrAppend(&s, s.empty() ? "" : " ", id);
  return s;
}

TEST(LlamaCppVocabTest, EveryClaimedVocabularyMatchesAndTheRestAreRefused) {
  const char* dir_env = std::getenv("PAGEDSERVE_TEMPLATES_DIR");
  ASSERT_TRUE(dir_env != nullptr && *dir_env != '\0')
      << "PAGEDSERVE_TEMPLATES_DIR is not set: run tests/chat/fetch_templates.sh (scripts/test does)";
  const fs::path dir = fs::path(dir_env) / "vocab";
  ASSERT_TRUE(fs::is_directory(dir)) << dir << " is missing: run tests/chat/fetch_templates.sh";
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() == ".inp") files.push_back(e.path().parent_path() / e.path().stem());
  }
  std::sort(files.begin(), files.end());
  std::set<std::string> seen;
  for (const fs::path& gguf : files) {
    const std::string name = Name(gguf);
    seen.insert(name);
    SCOPED_TRACE(name);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadGgufTokenizer(gguf.string());
    if (!Supported().contains(name)) {
      EXPECT_FALSE(tok.ok()) << name << " loads but is not claimed: check it and add it to "
                             << "Supported(), or make the loader refuse it";
      if (!tok.ok()) {
        EXPECT_TRUE(absl::IsUnimplemented(tok.status()) || absl::IsInvalidArgument(tok.status()))
            << tok.status();
      }
      continue;
    }
    if (!tok.ok()) {
      ADD_FAILURE() << name << " is claimed but does not load: " << tok.status();
      continue;
    }
    const Corpus c = ReadCorpus(gguf);
    ASSERT_EQ(c.texts.size(), c.ids.size()) << "corpus files disagree";
    ASSERT_GT(c.texts.size(), 20u);
    EncodeOptions eo;
    eo.add_special_tokens = false;
    eo.parse_special = false;
    int mismatches = 0;
    for (size_t i = 0; i < c.texts.size(); ++i) {
      const std::vector<int32_t> got = (*tok)->Encode(c.texts[i], eo);
      if (got != c.ids[i] && ++mismatches <= 5) {
        ADD_FAILURE() << name << " text " << i << " '" << c.texts[i] << "'\n  want "
                      << Ids(c.ids[i]) << "\n  got  " << Ids(got);
      }
    }
    EXPECT_EQ(mismatches, 0) << name << ": " << mismatches << " of " << c.texts.size();
  }
  for (const std::string& name : Supported()) {
    EXPECT_TRUE(seen.contains(name)) << name << " is claimed but has no corpus in " << dir;
  }
}

}  // namespace
}  // namespace pagedserve
