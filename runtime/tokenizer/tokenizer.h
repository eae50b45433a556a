// Tokenizer: text <-> token ids for Llama-family models.
//
// Two models are supported, both BPE:
//  * kByteLevelBpe: GPT-2 style byte-level BPE (SmolLM2, Llama 3, Qwen2). The text
//    is split into words by the model's pre-tokenizer regexes (PCRE2, UTF + UCP),
//    each word's UTF-8 bytes are mapped to the printable GPT-2 byte alphabet and
//    merged by merge rank (lowest rank first, leftmost first among equal ranks;
//    Sennrich et al. 2016 / GPT-2 encoder.py; same order as HF `tokenizers`).
//  * kSentencePieceBpe: SentencePiece-style BPE (Llama 2). Spaces become U+2581
//    "▁", a dummy "▁" prefix is added at the start of the text and after every
//    special token (add_space_prefix), characters merge by merge rank when merges
//    are given and otherwise by the highest score of the merged piece (as
//    llama.cpp's llm_tokenizer_spm), and characters missing from the vocabulary
//    fall back to byte tokens "<0xXX>" (or to unk_id without byte tokens).
//
// Special and added tokens (TokenizerSpec::added_tokens) are matched in the raw
// text before pre-tokenization, leftmost and then longest first (as HF's
// Aho-Corasick "leftmost longest" matching). Tokens with special == true are
// matched only when EncodeOptions::parse_special is set; otherwise text that
// looks like "<|im_start|>" is encoded as ordinary text. Non-special added
// tokens are always matched (HF and llama.cpp behave the same).
//
// Ids are int32 in [0, vocab_size). Encode never fails on any byte string:
// invalid UTF-8 in the input is handled byte-wise (byte-level BPE) or through
// byte fallback / unk (SentencePiece); a byte whose character is missing from a
// byte-level vocabulary encodes as unk_id (dropped when there is none), as HF. Decode replaces each
// maximal invalid UTF-8 subsequence by U+FFFD (as Python's errors="replace" and Rust's
// from_utf8_lossy); an out-of-range id is an error.
//
// A Tokenizer is immutable after Create() and safe to use from several threads
// (the merge cache is guarded by a mutex).
#ifndef PAGEDSERVE_RUNTIME_TOKENIZER_TOKENIZER_H_
#define PAGEDSERVE_RUNTIME_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace pagedserve {

enum class TokenizerModel {
  kByteLevelBpe,      // GGUF tokenizer.ggml.model "gpt2"; HF BPE + ByteLevel
  kSentencePieceBpe,  // GGUF tokenizer.ggml.model "llama"; HF BPE + byte_fallback
};

// Token types; numbering fixed by GGUF (tokenizer.ggml.token_type) and llama.cpp.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // special tokens: <|im_start|>, <s>, ...
  kUserDefined = 4,  // added (non-special) tokens
  kUnused = 5,
  kByte = 6,  // <0xXX> byte-fallback tokens (SentencePiece)
};

// A token matched verbatim in the raw text before BPE.
struct AddedToken {
  int32_t id = -1;
  std::string content;  // exact UTF-8 text
  bool special = true;  // matched only with parse_special; skippable in Decode
  bool lstrip = false;  // also swallows whitespace on its left
  bool rstrip = false;  // also swallows whitespace on its right
};

// Everything needed to build a Tokenizer. Filled from GGUF metadata
// (gguf_tokenizer.h) or a Hugging Face tokenizer.json (hf_tokenizer.h), or by
// hand in tests.
struct TokenizerSpec {
  TokenizerModel model = TokenizerModel::kByteLevelBpe;
  // Vocabulary: tokens[id] is the token's text in the model's alphabet (GPT-2
  // byte characters for byte-level BPE, "▁" for spaces in SentencePiece).
  std::vector<std::string> tokens;
  std::vector<float> scores;           // empty or tokens.size() (SentencePiece)
  std::vector<TokenType> token_types;  // empty (all kNormal) or tokens.size()
  // Merges (left, right), rank = index; both parts and their concatenation are
  // vocab tokens. May be empty for SentencePiece (scores are used instead).
  std::vector<std::pair<std::string, std::string>> merges;
  // Pre-tokenizer: regexes applied in sequence, each splitting every piece of
  // the previous step into matches and the text between them ("Isolated" in HF
  // terms). Empty for SentencePiece. PreTokenizerRegexes() gives the lists of
  // the known GGUF tokenizer.ggml.pre names.
  std::vector<std::string> pre_tokenizer_regexes;
  bool byte_level_add_prefix_space = false;  // HF ByteLevel add_prefix_space
  bool ignore_merges = false;                // a word that is a whole vocab token is not merged
  // SentencePiece dummy "▁" prefix: added to each text fragment (start of the
  // text and after every special token), or with space_prefix_first_only only
  // to a fragment at the very start of the text (HF Metaspace "first").
  bool add_space_prefix = true;
  bool space_prefix_first_only = false;
  // Special and added tokens. When empty, Create() derives them from
  // token_types: kControl and kUnknown -> special, kUserDefined -> non-special
  // (llama.cpp's special-token cache: CONTROL | USER_DEFINED | UNKNOWN).
  std::vector<AddedToken> added_tokens;
  int32_t bos_id = -1;  // -1: none
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = false;
  bool add_eos = false;
  std::string chat_template;  // Jinja source as stored by the model; may be empty
};

// Pre-tokenizer regexes of a GGUF tokenizer.ggml.pre name: "gpt2", "default"
// (same as gpt2), "smollm" (and the other names that split digits one by one
// before the GPT-2 regex: "starcoder", "refact", "command-r", "codeshell",
// "exaone", "minerva"), "llama3"/"llama-bpe"/"dbrx"/"smaug-bpe", "qwen2"
// (also "deepseek-r1-qwen"), "qwen35", "mpt"/"olmo" (GPT-2's), "falcon",
// "deepseek-coder", "deepseek-llm". The expressions are those of each model's
// Hugging Face tokenizer.json as llama.cpp lists them (src/llama-vocab.cpp);
// tests/tokenizer/llamacpp_vocab_test.cc checks them on llama.cpp's corpus.
// NotFound for another name.
absl::StatusOr<std::vector<std::string>> PreTokenizerRegexes(std::string_view pre_name);

struct EncodeOptions {
  bool add_special_tokens = true;  // prepend BOS / append EOS per add_bos/add_eos
  bool parse_special = true;       // match special tokens in the text
};

struct DecodeOptions {
  bool skip_special_tokens = true;  // drop tokens with AddedToken::special
  // SentencePiece with add_space_prefix: drop the single leading space that the
  // dummy prefix produced on the first decoded token (HF's Strip decoder). Has
  // no effect for byte-level BPE.
  bool strip_leading_space = true;
};

class Tokenizer {
 public:
  // Validates the spec: ids of bos/eos/unk/pad/added tokens in range, sizes of
  // scores/token_types, merges of the form "a b" whose parts and concatenation
  // are vocab tokens, regexes
  // that PCRE2 compiles. Errors name the field, e.g. "merges[12]: ...".
  static absl::StatusOr<std::unique_ptr<Tokenizer>> Create(TokenizerSpec spec);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Token ids of `text` (any bytes; never fails, see the file comment), with
  // BOS / EOS added per the spec when options.add_special_tokens is set.
  std::vector<int32_t> Encode(std::string_view text, const EncodeOptions& options = {}) const;

  // One-shot decode; InvalidArgument naming the position for an id out of range.
  absl::StatusOr<std::string> Decode(std::span<const int32_t> ids,
                                     const DecodeOptions& options = {}) const;

  // The raw bytes a token contributes to the output (possibly an incomplete
  // UTF-8 sequence, e.g. one byte of an emoji); empty for a skipped special
  // token. `first` applies strip_leading_space. Id must be in range.
  std::string TokenBytes(int32_t id, bool first, const DecodeOptions& options) const;

  int32_t vocab_size() const;
  // Token text in the model's alphabet ("Ġhello", "▁hello", "<0x0A>"). Id must
  // be in [0, vocab_size()).
  const std::string& TokenText(int32_t id) const;
  // -1 when the text is not a vocab token.
  int32_t TokenId(std::string_view text) const;
  bool IsSpecial(int32_t id) const;  // an AddedToken with special == true
  const TokenizerSpec& spec() const;
  int32_t bos_id() const { return spec().bos_id; }
  int32_t eos_id() const { return spec().eos_id; }
  // The text of bos/eos (empty when the id is -1); used by chat templates.
  std::string BosText() const;
  std::string EosText() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Replaces every maximal invalid UTF-8 subsequence of `bytes` by U+FFFD and
// returns the result. With final == false an incomplete but so far valid
// sequence at the end is not consumed; *consumed (if not null) receives the
// number of input bytes consumed. The replacement is prefix-consistent: feeding
// bytes in chunks gives the same text as one call.
std::string SanitizeUtf8(std::string_view bytes, bool final, size_t* consumed = nullptr);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_TOKENIZER_TOKENIZER_H_
