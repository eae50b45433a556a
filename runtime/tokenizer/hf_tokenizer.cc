// TokenizerSpec from a Hugging Face tokenizer.json (+ tokenizer_config.json).
#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "runtime/tokenizer/loaders.h"

namespace pagedserve {
namespace {

using json = nlohmann::json;
constexpr char kSpmSpace[] = "\xE2\x96\x81";

absl::Status Bad(std::string_view file, std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrFormat("%s: %s: %s", file, field, what));
}
absl::Status Unsupported(std::string_view file, std::string_view field, std::string_view what) {
  return absl::UnimplementedError(absl::StrFormat("%s: %s: %s", file, field, what));
}

// Optional typed members: absent or null -> fallback; wrong type -> error.
absl::StatusOr<bool> GetBool(const json& obj, const char* key, bool fallback, std::string_view file,
                             const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Bad(file, absl::StrCat(path, key), "expected a boolean");
  return it->get<bool>();
}
absl::StatusOr<std::string> GetString(const json& obj, const char* key, std::string_view file,
                                      const std::string& path) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::string();
  if (!it->is_string()) return Bad(file, absl::StrCat(path, key), "expected a string");
  return it->get<std::string>();
}
// A special token in tokenizer_config.json: "text" or {"content": "text", ...}.
absl::StatusOr<std::string> GetTokenText(const json& obj, const char* key, std::string_view file) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return std::string();
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return Bad(file, key, "expected a string or an object with a string 'content'");
}

struct PreTokenizerResult {
  std::vector<std::string> regexes;
  bool byte_level = false;
  bool add_prefix_space = false;
  bool metaspace = false;
  bool metaspace_first_only = false;
  bool metaspace_prepend = false;
};

// Sequences nested deeper than this are rejected (bounds the recursion; real
// tokenizers nest one level).
constexpr int kMaxPreTokenizerDepth = 8;

absl::Status ParsePreTokenizer(const json& node, const std::string& field, std::string_view file,
                               PreTokenizerResult* out, int depth = 0) {
  if (node.is_null()) return absl::OkStatus();
  if (depth > kMaxPreTokenizerDepth) {
    return Unsupported(file, field,
                       absl::StrCat("Sequences nested deeper than ", kMaxPreTokenizerDepth));
  }
  if (!node.is_object() || !node.contains("type") || !node["type"].is_string()) {
    return Bad(file, field, "expected an object with a string 'type'");
  }
  const std::string type = node["type"].get<std::string>();
  if (type == "Sequence") {
    if (!node.contains("pretokenizers") || !node["pretokenizers"].is_array()) {
      return Bad(file, field + ".pretokenizers", "expected an array");
    }
    for (size_t i = 0; i < node["pretokenizers"].size(); ++i) {
      absl::Status s = ParsePreTokenizer(node["pretokenizers"][i],
                                         absl::StrFormat("%s.pretokenizers[%d]", field, i), file,
                                         out, depth + 1);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    auto use_regex = GetBool(node, "use_regex", true, file, field + ".");
    auto prefix = GetBool(node, "add_prefix_space", false, file, field + ".");
    if (!use_regex.ok()) return use_regex.status();
    if (!prefix.ok()) return prefix.status();
    out->byte_level = true;
    out->add_prefix_space = *prefix;
    if (*use_regex) {
      auto gpt2 = PreTokenizerRegexes("gpt2");
      out->regexes.push_back(gpt2->front());
    }
    return absl::OkStatus();
  }
  if (type == "Digits") {
    auto individual = GetBool(node, "individual_digits", false, file, field + ".");
    if (!individual.ok()) return individual.status();
    out->regexes.push_back(*individual ? "\\p{N}" : "\\p{N}+");
    return absl::OkStatus();
  }
  if (type == "Split") {
    const json* pattern = node.contains("pattern") ? &node["pattern"] : nullptr;
    std::string regex;
    if (pattern != nullptr && pattern->is_object() && pattern->contains("Regex") &&
        (*pattern)["Regex"].is_string()) {
      regex = (*pattern)["Regex"].get<std::string>();
    } else if (pattern != nullptr && pattern->is_object() && pattern->contains("String") &&
               (*pattern)["String"].is_string()) {
      // A literal string: quote it for PCRE2.
      regex = absl::StrCat("\\Q", (*pattern)["String"].get<std::string>(), "\\E");
    } else {
      return Bad(file, field + ".pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    }
    auto behavior = GetString(node, "behavior", file, field + ".");
    auto invert = GetBool(node, "invert", false, file, field + ".");
    if (!behavior.ok()) return behavior.status();
    if (!invert.ok()) return invert.status();
    if (*behavior != "Isolated" || *invert) {
      return Unsupported(file, field + ".behavior",
                         absl::StrCat("only behavior 'Isolated' without invert is supported, got '",
                                      *behavior, "'", *invert ? " with invert" : ""));
    }
    out->regexes.push_back(std::move(regex));
    return absl::OkStatus();
  }
  if (type == "Metaspace") {
    auto replacement = GetString(node, "replacement", file, field + ".");
    auto scheme = GetString(node, "prepend_scheme", file, field + ".");
    auto split = GetBool(node, "split", true, file, field + ".");
    for (const auto* s : {&replacement, &scheme}) {
      if (!s->ok()) return s->status();
    }
    if (!split.ok()) return split.status();
    if (*replacement != kSpmSpace) {
      return Unsupported(file, field + ".replacement", "only U+2581 is supported");
    }
    if (*split) return Unsupported(file, field + ".split", "split = true is not supported");
    out->metaspace = true;
    out->metaspace_prepend = *scheme != "never";
    out->metaspace_first_only = *scheme == "first";
    return absl::OkStatus();
  }
  return Unsupported(file, field + ".type", absl::StrCat("pre-tokenizer '", type, "'"));
}

constexpr std::string_view kFile = "tokenizer.json";
constexpr std::string_view kConfig = "tokenizer_config.json";

// Parses tokenizer.json into `root` and tokenizer_config.json (empty text:
// no config) into `config`; both must be JSON objects.
absl::Status ParseDocuments(std::string_view tokenizer_json, std::string_view tokenizer_config_json,
                            json* root, json* config) {
  *root = json::parse(tokenizer_json.begin(), tokenizer_json.end(), nullptr, false);
  if (root->is_discarded()) return Bad(kFile, "(document)", "not valid JSON");
  if (!root->is_object()) return Bad(kFile, "(document)", "expected an object");
  *config = json::object();
  if (!tokenizer_config_json.empty()) {
    *config =
        json::parse(tokenizer_config_json.begin(), tokenizer_config_json.end(), nullptr, false);
    if (config->is_discarded()) return Bad(kConfig, "(document)", "not valid JSON");
    if (!config->is_object()) return Bad(kConfig, "(document)", "expected an object");
  }
  return absl::OkStatus();
}

// root["model"]: a BPE model (type "BPE" or none) without a continuing-subword
// prefix or end-of-word suffix, with a "vocab" object.
absl::StatusOr<const json*> CheckBpeModel(const json& root) {
  if (!root.contains("model") || !root["model"].is_object()) {
    return Bad(kFile, "model", "missing or not an object");
  }
  const json& model = root["model"];
  auto model_type = GetString(model, "type", kFile, "model.");
  if (!model_type.ok()) return model_type.status();
  if (!model_type->empty() && *model_type != "BPE") {
    return Unsupported(kFile, "model.type",
                       absl::StrCat("model '", *model_type, "' (only BPE is supported)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    auto v = GetString(model, key, kFile, "model.");
    if (!v.ok()) return v.status();
    if (!v->empty()) return Unsupported(kFile, absl::StrCat("model.", key), "must be empty");
  }
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return Bad(kFile, "model.vocab", "missing or not an object");
  }
  return &model;
}

// The id -> token table built from model.vocab and added_tokens together,
// which must cover 0..max without holes. An id at or past the number of
// entries means a hole below it (reported by Finish); such an id is not
// placed, so that one large id cannot size the vocabulary.
class VocabTable {
 public:
  explicit VocabTable(uint64_t entries) : entries_(entries) {}

  // Places `text` at the id `id_json` (a JSON integer, range-checked before
  // any narrowing: nlohmann's get<int32_t> / get<int64_t> would wrap
  // 4294967297 or 2^64-1 silently). An id may repeat only with the same text.
  absl::Status Place(const std::string& text, const json& id_json, const std::string& field) {
    const bool in_range = id_json.is_number_unsigned()
                              ? id_json.get<uint64_t>() <= (1u << 24)
                              : id_json.get<int64_t>() >= 0 && id_json.get<int64_t>() <= (1 << 24);
    if (!in_range) return Bad(kFile, field, absl::StrCat("id ", id_json.dump(), " out of range"));
    const int64_t id = id_json.get<int64_t>();
    if (static_cast<uint64_t>(id) >= entries_) {
      id_past_entries_ = true;
      return absl::OkStatus();
    }
    if (static_cast<size_t>(id) >= tokens_.size()) {
      tokens_.resize(id + 1);
      seen_.resize(id + 1, false);
    }
    if (seen_[id] && tokens_[id] != text) {
      return Bad(kFile, field,
                 absl::StrFormat("id %d is used by '%s' and '%s'", id, tokens_[id], text));
    }
    tokens_[id] = text;
    seen_[id] = true;
    return absl::OkStatus();
  }

  // The tokens by id; an error names the lowest id no token has.
  absl::StatusOr<std::vector<std::string>> Finish() && {
    const size_t id_end = id_past_entries_ ? entries_ : seen_.size();  // a hole lies below
    for (size_t id = 0; id < id_end; ++id) {
      if (id >= seen_.size() || !seen_[id]) {
        return Bad(kFile, "model.vocab", absl::StrFormat("no token has id %d", id));
      }
    }
    return std::move(tokens_);
  }

 private:
  uint64_t entries_;
  bool id_past_entries_ = false;
  std::vector<std::string> tokens_;
  std::vector<bool> seen_;
};

// added_tokens (an array of {id, content, special?, lstrip?, rstrip?}) into
// `table` and spec->added_tokens.
absl::Status ReadAddedTokens(const json& added, VocabTable& table, TokenizerSpec* spec) {
  if (!added.is_array()) return Bad(kFile, "added_tokens", "expected an array");
  for (size_t i = 0; i < added.size(); ++i) {
    std::string field = absl::StrFormat("added_tokens[%d]", i);
    const json& t = added[i];
    if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
        !t.contains("content") || !t["content"].is_string()) {
      return Bad(kFile, field, "expected an object with an integer 'id' and a string 'content'");
    }
    AddedToken token;
    token.content = t["content"].get<std::string>();
    auto special = GetBool(t, "special", false, kFile, field + ".");
    auto lstrip = GetBool(t, "lstrip", false, kFile, field + ".");
    auto rstrip = GetBool(t, "rstrip", false, kFile, field + ".");
    for (const auto* s : {&special, &lstrip, &rstrip}) {
      if (!s->ok()) return s->status();
    }
    token.special = *special;
    token.lstrip = *lstrip;
    token.rstrip = *rstrip;
    absl::Status s = table.Place(token.content, t["id"], field + ".id");
    if (!s.ok()) return s;
    token.id = static_cast<int32_t>(t["id"].get<int64_t>());  // in [0, 2^24] (Place)
    spec->added_tokens.push_back(std::move(token));
  }
  return absl::OkStatus();
}

// spec->tokens (model.vocab and added_tokens) and spec->added_tokens.
absl::Status ReadVocabulary(const json& root, const json& model, TokenizerSpec* spec) {
  const json& vocab = model["vocab"];
  const json* added_json = root.contains("added_tokens") ? &root["added_tokens"] : nullptr;
  const uint64_t entries =
      vocab.size() + (added_json != nullptr && added_json->is_array() ? added_json->size() : 0);
  VocabTable table(entries);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    std::string field = absl::StrCat("model.vocab[\"", it.key(), "\"]");
    if (!it.value().is_number_integer()) return Bad(kFile, field, "expected an integer id");
    absl::Status s = table.Place(it.key(), it.value(), field);
    if (!s.ok()) return s;
  }
  if (added_json != nullptr && !added_json->is_null()) {
    absl::Status s = ReadAddedTokens(*added_json, table, spec);
    if (!s.ok()) return s;
  }
  absl::StatusOr<std::vector<std::string>> tokens = std::move(table).Finish();
  if (!tokens.ok()) return tokens.status();
  spec->tokens = *std::move(tokens);
  return absl::OkStatus();
}

// model.merges: "left right" strings or [left, right] pairs, into spec->merges.
absl::Status ReadMerges(const json& model, TokenizerSpec* spec) {
  if (!model.contains("merges") || model["merges"].is_null()) return absl::OkStatus();
  const json& merges = model["merges"];
  if (!merges.is_array()) return Bad(kFile, "model.merges", "expected an array");
  spec->merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const json& m = merges[i];
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      size_t space = s.find(' ', 1);
      if (space == std::string::npos) {
        return Bad(kFile, absl::StrFormat("model.merges[%d]", i), "expected 'left right'");
      }
      spec->merges.emplace_back(s.substr(0, space), s.substr(space + 1));
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      spec->merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      return Bad(kFile, absl::StrFormat("model.merges[%d]", i),
                 "expected a string 'left right' or a pair of strings");
    }
  }
  return absl::OkStatus();
}

// The model's flags that the later phases need.
struct ModelOptions {
  bool byte_fallback = false;
  std::string unk_token;  // empty: none
};

// model.byte_fallback, model.ignore_merges (into spec->ignore_merges), model.unk_token.
absl::StatusOr<ModelOptions> ReadModelOptions(const json& model, TokenizerSpec* spec) {
  auto byte_fallback = GetBool(model, "byte_fallback", false, kFile, "model.");
  auto ignore_merges = GetBool(model, "ignore_merges", false, kFile, "model.");
  auto unk = GetString(model, "unk_token", kFile, "model.");
  if (!byte_fallback.ok()) return byte_fallback.status();
  if (!ignore_merges.ok()) return ignore_merges.status();
  if (!unk.ok()) return unk.status();
  spec->ignore_merges = *ignore_merges;
  return ModelOptions{*byte_fallback, *std::move(unk)};
}

// Which of the SentencePiece normalizer pair Prepend("▁") + Replace(" ", "▁")
// root["normalizer"] holds (alone or in a Sequence); anything else is unsupported.
struct NormalizerResult {
  bool prepend = false;
  bool replace = false;
};

absl::StatusOr<NormalizerResult> ReadNormalizer(const json& root) {
  NormalizerResult out;
  if (!root.contains("normalizer") || root["normalizer"].is_null()) return out;
  const json& norm = root["normalizer"];
  std::vector<std::pair<const json*, std::string>> parts;
  if (norm.is_object() && norm.value("type", "") == "Sequence" && norm.contains("normalizers") &&
      norm["normalizers"].is_array()) {
    for (size_t i = 0; i < norm["normalizers"].size(); ++i) {
      parts.emplace_back(&norm["normalizers"][i], absl::StrFormat("normalizer.normalizers[%d]", i));
    }
  } else {
    parts.emplace_back(&norm, "normalizer");
  }
  for (const auto& [n, field] : parts) {
    std::string type = n->is_object() ? n->value("type", "") : "";
    if (type == "Prepend" && n->value("prepend", "") == kSpmSpace) {
      out.prepend = true;
    } else if (type == "Replace" && n->contains("pattern") && (*n)["pattern"].is_object() &&
               (*n)["pattern"].value("String", "") == " " && n->value("content", "") == kSpmSpace) {
      out.replace = true;
    } else {
      return Unsupported(kFile, field + ".type",
                         absl::StrCat("normalizer '", type, "' is not supported"));
    }
  }
  return out;
}

// spec->model from the pre-tokenizer, decoder and normalizer: byte-level BPE
// (ByteLevel pre-tokenizer or decoder) or SentencePiece-style BPE (▁
// normalizer, Metaspace or byte fallback), with their settings.
absl::Status ChooseModel(const json& root, const NormalizerResult& normalizer,
                         const PreTokenizerResult& pre, bool byte_fallback, TokenizerSpec* spec) {
  std::string decoder_type;
  if (root.contains("decoder") && root["decoder"].is_object()) {
    decoder_type = root["decoder"].value("type", "");
  }
  if (pre.byte_level || decoder_type == "ByteLevel") {
    spec->model = TokenizerModel::kByteLevelBpe;
    spec->pre_tokenizer_regexes = pre.regexes;
    spec->byte_level_add_prefix_space = pre.add_prefix_space;
    if (normalizer.prepend || normalizer.replace || pre.metaspace) {
      return Unsupported(kFile, "normalizer", "SentencePiece normalization with a ByteLevel model");
    }
  } else if (normalizer.replace || pre.metaspace || byte_fallback) {
    spec->model = TokenizerModel::kSentencePieceBpe;
    if (!pre.regexes.empty()) {
      return Unsupported(kFile, "pre_tokenizer", "regex splits with a SentencePiece-style model");
    }
    spec->add_space_prefix = normalizer.prepend || pre.metaspace_prepend;
    spec->space_prefix_first_only = pre.metaspace && pre.metaspace_first_only;
  } else {
    return Unsupported(kFile, "pre_tokenizer",
                       "neither ByteLevel nor SentencePiece-style (Metaspace / ▁ normalizer)");
  }
  return absl::OkStatus();
}

// The id of the token whose text is `text`; -1 for none (or empty text).
int32_t IdOf(const TokenizerSpec& spec, const std::string& text) {
  if (text.empty()) return -1;
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    if (spec.tokens[i] == text) return static_cast<int32_t>(i);
  }
  return -1;
}

// spec->unk_id from model.unk_token, then bos/eos/unk/pad ids from
// tokenizer_config.json, whose texts must be tokens.
absl::Status ResolveSpecialTokens(const json& config, const std::string& unk_token,
                                  TokenizerSpec* spec) {
  spec->unk_id = IdOf(*spec, unk_token);
  for (auto [key, out] : {std::pair<const char*, int32_t*>{"bos_token", &spec->bos_id},
                          {"eos_token", &spec->eos_id},
                          {"unk_token", &spec->unk_id},
                          {"pad_token", &spec->pad_id}}) {
    auto text = GetTokenText(config, key, kConfig);
    if (!text.ok()) return text.status();
    if (text->empty()) continue;
    int32_t id = IdOf(*spec, *text);
    if (id < 0) return Bad(kConfig, key, absl::StrCat("'", *text, "' is not a token"));
    *out = id;
  }
  return absl::OkStatus();
}

// spec->add_bos / add_eos: the config's flags; add_bos defaults to whether the
// post-processor starts with BOS. Either needs the token to exist.
absl::Status ReadAddBosEos(const json& root, const json& config, TokenizerSpec* spec) {
  bool post_bos = false;
  if (root.contains("post_processor") && root["post_processor"].is_object()) {
    const json& pp = root["post_processor"];
    if (pp.value("type", "") == "TemplateProcessing" && pp.contains("single") &&
        pp["single"].is_array() && !pp["single"].empty() && pp["single"][0].is_object() &&
        pp["single"][0].contains("SpecialToken")) {
      const json& st = pp["single"][0]["SpecialToken"];
      post_bos = st.is_object() && st.contains("id") && st["id"].is_string() &&
                 IdOf(*spec, st["id"].get<std::string>()) == spec->bos_id && spec->bos_id >= 0;
    }
  }
  auto add_bos = GetBool(config, "add_bos_token", post_bos, kConfig, "");
  auto add_eos = GetBool(config, "add_eos_token", false, kConfig, "");
  if (!add_bos.ok()) return add_bos.status();
  if (!add_eos.ok()) return add_eos.status();
  spec->add_bos = *add_bos && spec->bos_id >= 0;
  spec->add_eos = *add_eos && spec->eos_id >= 0;
  return absl::OkStatus();
}

// spec->chat_template: the config's string, or the template named "default"
// in a list of named templates.
absl::Status ReadChatTemplate(const json& config, TokenizerSpec* spec) {
  if (!config.contains("chat_template") || config["chat_template"].is_null()) {
    return absl::OkStatus();
  }
  const json& ct = config["chat_template"];
  if (ct.is_string()) {
    spec->chat_template = ct.get<std::string>();
  } else if (ct.is_array()) {  // [{"name": "default", "template": "..."}, ...]
    for (const json& entry : ct) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        spec->chat_template = entry["template"].get<std::string>();
      }
    }
  } else {
    return Bad(kConfig, "chat_template", "expected a string or a list of named templates");
  }
  return absl::OkStatus();
}

}  // namespace

// The phases in the order their errors are reported: documents, BPE model,
// vocabulary (vocab + added tokens), merges, model options, normalizer,
// pre-tokenizer, model kind, special tokens, add_bos / add_eos, chat template.
absl::StatusOr<TokenizerSpec> TokenizerSpecFromHfJson(std::string_view tokenizer_json,
                                                      std::string_view tokenizer_config_json) {
  json root, config;
  if (absl::Status s = ParseDocuments(tokenizer_json, tokenizer_config_json, &root, &config);
      !s.ok())
    return s;
  absl::StatusOr<const json*> model = CheckBpeModel(root);
  if (!model.ok()) return model.status();
  TokenizerSpec spec;
  if (absl::Status s = ReadVocabulary(root, **model, &spec); !s.ok()) return s;
  if (absl::Status s = ReadMerges(**model, &spec); !s.ok()) return s;
  absl::StatusOr<ModelOptions> options = ReadModelOptions(**model, &spec);
  if (!options.ok()) return options.status();
  absl::StatusOr<NormalizerResult> normalizer = ReadNormalizer(root);
  if (!normalizer.ok()) return normalizer.status();
  PreTokenizerResult pre;
  if (root.contains("pre_tokenizer")) {
    absl::Status s = ParsePreTokenizer(root["pre_tokenizer"], "pre_tokenizer", kFile, &pre);
    if (!s.ok()) return s;
  }
  if (absl::Status s = ChooseModel(root, *normalizer, pre, options->byte_fallback, &spec); !s.ok())
    return s;
  if (absl::Status s = ResolveSpecialTokens(config, options->unk_token, &spec); !s.ok()) return s;
  if (absl::Status s = ReadAddBosEos(root, config, &spec); !s.ok()) return s;
  if (absl::Status s = ReadChatTemplate(config, &spec); !s.ok()) return s;
  return spec;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& dir) {
  auto read = [](const std::string& path, bool required) -> absl::StatusOr<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) {
      if (!required) return std::string();
      return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
    }
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  auto tokenizer_json = read(dir + "/tokenizer.json", true);
  if (!tokenizer_json.ok()) return tokenizer_json.status();
  auto config_json = read(dir + "/tokenizer_config.json", false);
  if (!config_json.ok()) return config_json.status();
  auto spec = TokenizerSpecFromHfJson(*tokenizer_json, *config_json);
  if (!spec.ok()) {
    return absl::Status(spec.status().code(), absl::StrCat(dir, "/", spec.status().message()));
  }
  auto tokenizer = Tokenizer::Create(std::move(*spec));
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(dir, "/tokenizer.json: ", tokenizer.status().message()));
  }
  return tokenizer;
}

}  // namespace pagedserve
