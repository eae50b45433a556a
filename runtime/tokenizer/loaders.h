// Building a TokenizerSpec from the files a model ships with.
//
// GGUF (llama.cpp convention, keys tokenizer.ggml.*):
//   model ("gpt2" -> kByteLevelBpe, "llama" -> kSentencePieceBpe; others are
//   Unimplemented), tokens, scores, token_type, merges ("left right"), pre (the
//   pre-tokenizer name, see PreTokenizerRegexes; absent means "default"),
//   bos/eos/unknown/padding_token_id, add_bos_token, add_eos_token,
//   add_space_prefix, and tokenizer.chat_template. Missing optional keys take
//   llama.cpp's defaults (SentencePiece: add_bos true, add_space_prefix true).
//
// Hugging Face: tokenizer.json (model BPE with vocab, merges as "a b" strings or
// [a, b] pairs, byte_fallback, ignore_merges, unk_token; normalizer null or
// Prepend("▁") / Replace(" ", "▁"); pre_tokenizer null, ByteLevel, Digits,
// Split(regex, Isolated), Metaspace or a Sequence of those; added_tokens) plus
// the optional tokenizer_config.json (chat_template, bos_token, eos_token,
// unk_token, pad_token, add_bos_token, add_eos_token). Without add_bos_token the
// post_processor (TemplateProcessing starting with the BOS token) decides.
// Anything else (other models, normalizers or split behaviours) is rejected
// with Unimplemented naming the JSON field, so a tokenizer is never silently
// approximated; malformed JSON or wrongly typed fields give InvalidArgument
// naming the file and the field (e.g. "tokenizer.json: model.vocab: ...").
#ifndef PAGEDSERVE_RUNTIME_TOKENIZER_LOADERS_H_
#define PAGEDSERVE_RUNTIME_TOKENIZER_LOADERS_H_

#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "runtime/tokenizer/tokenizer.h"

namespace pagedserve {

class GgufFile;

absl::StatusOr<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& file);
// Opens the GGUF at `path`, reads its tokenizer metadata, builds the tokenizer.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const std::string& path);

// `tokenizer_config_json` may be empty (no tokenizer_config.json).
absl::StatusOr<TokenizerSpec> TokenizerSpecFromHfJson(std::string_view tokenizer_json,
                                                      std::string_view tokenizer_config_json);
// Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadHfTokenizer(const std::string& dir);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_TOKENIZER_LOADERS_H_
