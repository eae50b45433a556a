// TokenizerSpec from GGUF metadata (tokenizer.ggml.* keys).
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/common/status_macros.h"
#include "runtime/model/gguf.h"
#include "runtime/tokenizer/loaders.h"

namespace pagedserve {
namespace {

// The value of an optional key: `fallback` when absent, an error on a bad type.
template <typename T, typename Getter>
absl::StatusOr<T> Optional(const GgufFile& file, std::string_view key, T fallback, Getter get) {
  if (file.Find(key) == nullptr) return fallback;
  auto value = get(key);
  if (!value.ok()) return value.status();
  return static_cast<T>(*value);
}

}  // namespace

absl::StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& file) {
  TokenizerSpec spec;
  auto model = file.GetString("tokenizer.ggml.model");
  if (!model.ok()) return model.status();
  if (*model == "gpt2") {
    spec.model = TokenizerModel::kByteLevelBpe;
  } else if (*model == "llama") {
    spec.model = TokenizerModel::kSentencePieceBpe;
  } else {
    return absl::UnimplementedError(
        absl::StrFormat("%s: tokenizer.ggml.model '%s' is not supported (only 'gpt2' and 'llama')",
                        file.path(), *model));
  }
  const bool spm = spec.model == TokenizerModel::kSentencePieceBpe;
  PS_ASSIGN_OR_RETURN(spec.tokens, file.GetStringArray("tokenizer.ggml.tokens"));
  if (file.Find("tokenizer.ggml.scores") != nullptr) {
    PS_ASSIGN_OR_RETURN(spec.scores, file.GetFloatArray("tokenizer.ggml.scores"));
  }
  if (file.Find("tokenizer.ggml.token_type") != nullptr) {
    PS_ASSIGN_OR_RETURN(const std::vector<int32_t> types,
                        file.GetIntArray("tokenizer.ggml.token_type"));
    for (size_t i = 0; i < types.size(); ++i) {
      int32_t t = types[i];
      if (t < 0 || t > 6) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "%s: tokenizer.ggml.token_type[%d]: unknown token type %d", file.path(), i, t));
      }
      spec.token_types.push_back(static_cast<TokenType>(t));
    }
  }
  if (file.Find("tokenizer.ggml.merges") != nullptr) {
    PS_ASSIGN_OR_RETURN(const std::vector<std::string> merges,
                        file.GetStringArray("tokenizer.ggml.merges"));
    spec.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const std::string& m = merges[i];
      size_t space = m.find(' ', 1);  // a part may itself start with a space
      if (space == std::string::npos) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: tokenizer.ggml.merges[%d]: '%s' is not of the form 'left right'",
                            file.path(), i, m));
      }
      spec.merges.emplace_back(m.substr(0, space), m.substr(space + 1));
    }
  } else if (!spm) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: tokenizer.ggml.merges: required for tokenizer.ggml.model 'gpt2'", file.path()));
  }
  if (!spm) {
    auto pre = Optional<std::string>(file, "tokenizer.ggml.pre", "default",
                                     [&](std::string_view k) { return file.GetString(k); });
    if (!pre.ok()) return pre.status();
    auto regexes = PreTokenizerRegexes(*pre);
    if (!regexes.ok()) {
      return absl::UnimplementedError(
          absl::StrFormat("%s: tokenizer.ggml.pre: %s", file.path(), regexes.status().message()));
    }
    spec.pre_tokenizer_regexes = std::move(*regexes);
    spec.ignore_merges = *pre == "llama3" || *pre == "llama-bpe" || *pre == "llama-v3";
  }
  auto get_int = [&](std::string_view k) { return file.GetInt(k); };
  auto get_bool = [&](std::string_view k) { return file.GetBool(k); };
  struct IdKey {
    const char* key;
    int32_t* out;
  };
  for (IdKey k : {IdKey{"tokenizer.ggml.bos_token_id", &spec.bos_id},
                  IdKey{"tokenizer.ggml.eos_token_id", &spec.eos_id},
                  IdKey{"tokenizer.ggml.unknown_token_id", &spec.unk_id},
                  IdKey{"tokenizer.ggml.padding_token_id", &spec.pad_id}}) {
    auto id = Optional<int64_t>(file, k.key, -1, get_int);
    if (!id.ok()) return id.status();
    if (*id < -1 || *id >= static_cast<int64_t>(spec.tokens.size())) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %s: %d is outside the vocabulary of %d tokens", file.path(), k.key,
                          *id, spec.tokens.size()));
    }
    *k.out = static_cast<int32_t>(*id);
  }
  auto add_bos = Optional<bool>(file, "tokenizer.ggml.add_bos_token", spm, get_bool);
  auto add_eos = Optional<bool>(file, "tokenizer.ggml.add_eos_token", false, get_bool);
  auto add_space = Optional<bool>(file, "tokenizer.ggml.add_space_prefix", spm, get_bool);
  for (const auto* s : {&add_bos, &add_eos, &add_space}) {
    if (!s->ok()) return s->status();
  }
  spec.add_bos = *add_bos && spec.bos_id >= 0;
  spec.add_eos = *add_eos && spec.eos_id >= 0;
  spec.add_space_prefix = *add_space;
  auto chat = Optional<std::string>(file, "tokenizer.chat_template", "",
                                    [&](std::string_view k) { return file.GetString(k); });
  if (!chat.ok()) return chat.status();
  spec.chat_template = std::move(*chat);
  return spec;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const std::string& path) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  PS_ASSIGN_OR_RETURN(TokenizerSpec spec, TokenizerSpecFromGguf(*file));
  auto tokenizer = Tokenizer::Create(std::move(spec));
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

}  // namespace pagedserve
