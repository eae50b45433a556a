#include "runtime/tokenizer/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdio>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"

namespace pagedserve {
namespace {

// Debian's Abseil is built with its own absl::string_view (not std's).
inline absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581 "▁"
constexpr size_t kMaxCacheEntries = 1 << 16;

// GPT-2 byte alphabet (encoder.py bytes_to_unicode): printable Latin-1 bytes map
// to themselves, the other 68 bytes to U+0100.. in byte order.
struct ByteAlphabet {
  std::string byte_to_utf8[256];
  absl::flat_hash_map<uint32_t, uint8_t> codepoint_to_byte;
  ByteAlphabet() {
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      uint32_t cp = printable ? b : next++;
      std::string s;
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
      byte_to_utf8[b] = s;
      codepoint_to_byte[cp] = static_cast<uint8_t>(b);
    }
  }
};

const ByteAlphabet& Alphabet() {
  static const ByteAlphabet* alphabet = new ByteAlphabet();
  return *alphabet;
}

// Length of the valid UTF-8 character starting at s[i], or 0 when the bytes
// there are invalid or incomplete.
size_t ValidUtf8Length(std::string_view s, size_t i) {
  uint8_t b = static_cast<uint8_t>(s[i]);
  if (b < 0x80) return 1;
  size_t len;
  uint8_t lo = 0x80, hi = 0xBF;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    uint8_t c = static_cast<uint8_t>(s[i + k]);
    if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xBF)) return 0;
  }
  return len;
}

// Decodes one UTF-8 character of a valid string.
uint32_t DecodeCodepoint(std::string_view s, size_t* i) {
  uint8_t b = static_cast<uint8_t>(s[*i]);
  int len = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
  uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
  for (int k = 1; k < len && *i + k < s.size(); ++k) {
    cp = (cp << 6) | (static_cast<uint8_t>(s[*i + k]) & 0x3F);
  }
  *i += len;
  return cp;
}

size_t Utf8CharLength(uint8_t b) {
  return b < 0x80 ? 1 : b < 0xC0 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
}

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// A compiled pre-tokenizer regex.
class Regex {
 public:
  static absl::StatusOr<std::unique_ptr<Regex>> Compile(const std::string& pattern,
                                                        std::string_view field) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: regex does not compile at offset %d: %s", field, offset,
                          reinterpret_cast<const char*>(message)));
    }
    auto regex = std::unique_ptr<Regex>(new Regex(code));
    regex->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
    return regex;
  }
  ~Regex() { pcre2_code_free(code_); }

  // Splits valid UTF-8 `text` into matches and the gaps between them,
  // appending non-empty pieces (offsets relative to text) to `out`.
  void Split(std::string_view text, std::vector<std::string_view>* out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0, gap_start = 0;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    while (pos <= text.size()) {
      int rc = jit_
                   ? pcre2_jit_match(code_, subject, text.size(), pos, 0, md, nullptr)
                   : pcre2_match(code_, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t start = ov[0], end = ov[1];
      if (end == start) {  // empty match: advance one character
        if (start >= text.size()) break;
        pos = start + Utf8CharLength(static_cast<uint8_t>(text[start]));
        continue;
      }
      if (start > gap_start) out->push_back(text.substr(gap_start, start - gap_start));
      out->push_back(text.substr(start, end - start));
      pos = gap_start = end;
    }
    if (gap_start < text.size()) out->push_back(text.substr(gap_start));
    pcre2_match_data_free(md);
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
  bool jit_ = false;
};

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> PreTokenizerRegexes(std::string_view name) {
  static const std::string kGpt2 =
      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
  static const std::string kLlama3 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  static const std::string kQwen2 =
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
  if (name == "gpt2" || name == "gpt-2" || name == "default")
    return std::vector<std::string>{kGpt2};
  if (name == "smollm" || name == "starcoder" || name == "refact" || name == "command-r" ||
      name == "codeshell" || name == "exaone" || name == "minerva") {
    return std::vector<std::string>{"\\p{N}", kGpt2};
  }
  if (name == "llama3" || name == "llama-bpe" || name == "llama-v3" || name == "dbrx" ||
      name == "smaug-bpe") {
    return std::vector<std::string>{kLlama3};
  }
  if (name == "qwen2" || name == "deepseek-r1-qwen") return std::vector<std::string>{kQwen2};
  if (name == "mpt" || name == "olmo") return std::vector<std::string>{kGpt2};
  if (name == "qwen35") {
    // Qwen2's split with combining marks (\p{M}) kept inside words.
    return std::vector<std::string>{
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| "
        "?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"};
  }
  if (name == "falcon") {
    return std::vector<std::string>{
        "[\\p{P}\\$\\+<=>\\^~\\|`]+",
        "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)",
        "[0-9][0-9][0-9]"};
  }
  if (name == "deepseek-coder") {
    return std::vector<std::string>{"[\\r\\n]", "\\s?\\p{L}+", "\\s?\\p{P}+",
                                    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", "\\p{N}"};
  }
  if (name == "deepseek-llm") {
    // Latin, Greek, Cyrillic, ... letters as the ranges of DeepSeek's
    // tokenizer.json (not \p{L}: CJK is split by the fifth regex).
    return std::vector<std::string>{
        "[\\r\\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
        "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a"
        "\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556"
        "\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b"
        "\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d"
        "\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
        "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
        "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128"
        "\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184"
        "\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b"
        "\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17"
        "\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3"
        "\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df"
        "\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        "\\s+$",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        "\\p{N}+"};
  }
  return absl::NotFoundError(absl::StrCat("unknown pre-tokenizer type '", Av(name), "'"));
}

std::string SanitizeUtf8(std::string_view s, bool final, size_t* consumed) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  size_t i = 0, n = s.size();
  while (i < n) {
    uint8_t b = static_cast<uint8_t>(s[i]);
    if (b < 0x80) {
      out.push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    int need = 0;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b >= 0xC2 && b <= 0xDF) {
      need = 1;
    } else if (b == 0xE0) {
      need = 2, lo = 0xA0;
    } else if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) {
      need = 2;
    } else if (b == 0xED) {
      need = 2, hi = 0x9F;
    } else if (b == 0xF0) {
      need = 3, lo = 0x90;
    } else if (b >= 0xF1 && b <= 0xF3) {
      need = 3;
    } else if (b == 0xF4) {
      need = 3, hi = 0x8F;
    } else {
      out.append(kReplacement);
      ++i;
      continue;
    }
    size_t j = i + 1;
    bool ok = true;
    for (int k = 0; k < need; ++k, ++j) {
      if (j >= n) {
        if (!final) {
          if (consumed) *consumed = i;
          return out;
        }
        ok = false;
        break;
      }
      uint8_t c = static_cast<uint8_t>(s[j]);
      uint8_t l = k == 0 ? lo : 0x80, h = k == 0 ? hi : 0xBF;
      if (c < l || c > h) {
        ok = false;
        break;
      }
    }
    if (ok) {
      out.append(s.substr(i, j - i));
    } else {
      out.append(kReplacement);
    }
    i = j;
  }
  if (consumed) *consumed = n;
  return out;
}

struct Tokenizer::Impl {
  TokenizerSpec spec;
  absl::flat_hash_map<std::string, int32_t> vocab;
  // (left id, right id) -> (rank, merged id).
  absl::flat_hash_map<uint64_t, std::pair<int32_t, int32_t>> merges;
  std::vector<std::unique_ptr<Regex>> regexes;
  int32_t byte_ids[256];                  // byte-level: id of each byte character
  int32_t byte_fallback_ids[256];         // SentencePiece: id of "<0xXX>" or -1
  std::vector<int16_t> byte_token_value;  // SentencePiece: byte of a <0xXX> token or -1
  std::vector<bool> is_special;
  std::vector<int32_t> added_index;  // id -> index into spec.added_tokens or -1
  // Added tokens grouped by first byte, longest first.
  std::vector<int32_t> added_by_first_byte[256];

  mutable absl::Mutex cache_mu;
  mutable absl::flat_hash_map<std::string, std::vector<int32_t>> cache ABSL_GUARDED_BY(cache_mu);

  struct Symbol {
    int32_t id;
    uint32_t start, len;
    int32_t prev, next;
  };
  struct Candidate {
    double priority;
    int32_t left, right;
    uint32_t merged_len;
    bool operator<(const Candidate& o) const {  // for a min-heap via std::priority_queue
      if (priority != o.priority) return priority > o.priority;
      return left > o.left;
    }
  };

  // Priority of merging symbols a and b (lower first); false when they do not merge.
  bool PairPriority(std::string_view text, const Symbol& a, const Symbol& b, double* priority,
                    int32_t* merged_id) const {
    if (!merges.empty() || spec.model == TokenizerModel::kByteLevelBpe) {
      if (a.id < 0 || b.id < 0) return false;
      auto it = merges.find(PairKey(a.id, b.id));
      if (it == merges.end()) return false;
      *priority = it->second.first;
      *merged_id = it->second.second;
      return true;
    }
    auto it = vocab.find(Av(text.substr(a.start, a.len + b.len)));
    if (it == vocab.end()) return false;
    *priority = spec.scores.empty() ? 0.0 : -static_cast<double>(spec.scores[it->second]);
    *merged_id = it->second;
    return true;
  }

  // Merges `symbols` (a linked list over `text`) in priority order.
  void MergeAll(std::string_view text, std::vector<Symbol>& symbols) const {
    std::priority_queue<Candidate> queue;
    auto push = [&](int32_t left) {
      if (left < 0) return;
      int32_t right = symbols[left].next;
      if (right < 0) return;
      double priority;
      int32_t merged;
      if (PairPriority(text, symbols[left], symbols[right], &priority, &merged)) {
        queue.push({priority, left, right, symbols[left].len + symbols[right].len});
      }
    };
    for (size_t i = 0; i + 1 < symbols.size(); ++i) push(static_cast<int32_t>(i));
    while (!queue.empty()) {
      Candidate c = queue.top();
      queue.pop();
      Symbol& l = symbols[c.left];
      if (l.len == 0 || l.next != c.right) continue;
      Symbol& r = symbols[c.right];
      if (r.len == 0 || l.len + r.len != c.merged_len) continue;
      double priority;
      int32_t merged;
      if (!PairPriority(text, l, r, &priority, &merged) || priority != c.priority) continue;
      l.id = merged;
      l.len += r.len;
      l.next = r.next;
      r.len = 0;
      if (r.next >= 0) symbols[r.next].prev = c.left;
      push(l.prev);
      push(c.left);
    }
  }

  void EncodeByteLevelWord(std::string_view word, std::vector<int32_t>* out) const {
    {
      absl::MutexLock lock(&cache_mu);
      auto it = cache.find(Av(word));
      if (it != cache.end()) {
        out->insert(out->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::string mapped;
    mapped.reserve(word.size() * 2);
    for (unsigned char b : word) mapped += Alphabet().byte_to_utf8[b];
    std::vector<int32_t> ids;
    auto whole = spec.ignore_merges ? vocab.find(mapped) : vocab.end();
    if (whole != vocab.end()) {
      ids.push_back(whole->second);
    } else {
      std::vector<Symbol> symbols;
      symbols.reserve(word.size());
      uint32_t pos = 0;
      for (size_t i = 0; i < word.size(); ++i) {
        uint32_t len = Alphabet().byte_to_utf8[static_cast<uint8_t>(word[i])].size();
        symbols.push_back({byte_ids[static_cast<uint8_t>(word[i])], pos, len,
                           static_cast<int32_t>(i) - 1,
                           i + 1 < word.size() ? static_cast<int32_t>(i) + 1 : -1});
        pos += len;
      }
      MergeAll(mapped, symbols);
      for (const Symbol& s : symbols) {
        if (s.len == 0) continue;
        if (s.id >= 0) {
          ids.push_back(s.id);
        } else if (spec.unk_id >= 0) {
          ids.push_back(spec.unk_id);
        }
      }
    }
    out->insert(out->end(), ids.begin(), ids.end());
    absl::MutexLock lock(&cache_mu);
    if (cache.size() >= kMaxCacheEntries) cache.clear();
    cache.emplace(std::string(word), std::move(ids));
  }

  void EncodeByteLevel(std::string_view text, std::vector<int32_t>* out) const {
    std::string prefixed;
    if (spec.byte_level_add_prefix_space && !text.empty() && text[0] != ' ') {
      prefixed = absl::StrCat(" ", Av(text));
      text = prefixed;
    }
    // Regexes run on valid UTF-8 only: invalid bytes become words of their own.
    std::vector<std::string_view> pieces;
    size_t run = 0, i = 0;
    while (i <= text.size()) {
      size_t len = i < text.size() ? ValidUtf8Length(text, i) : 0;
      if (len > 0) {
        i += len;
        continue;
      }
      if (i > run) pieces.push_back(text.substr(run, i - run));
      if (i < text.size()) pieces.push_back(text.substr(i, 1));
      run = ++i;
    }
    std::vector<std::string_view> words;
    for (std::string_view piece : pieces) {
      std::vector<std::string_view> current{piece};
      bool valid = !(piece.size() == 1 && static_cast<uint8_t>(piece[0]) >= 0x80);
      if (valid) {
        for (const auto& regex : regexes) {
          std::vector<std::string_view> next;
          for (std::string_view p : current) regex->Split(p, &next);
          current = std::move(next);
        }
      }
      words.insert(words.end(), current.begin(), current.end());
    }
    for (std::string_view w : words) EncodeByteLevelWord(w, out);
  }

  void EncodeSentencePiece(std::string_view raw, bool add_prefix, std::vector<int32_t>* out) const {
    std::string text;
    if (add_prefix && !raw.empty()) text.append(kSpmSpace);
    for (char c : raw) {
      if (c == ' ') {
        text.append(kSpmSpace);
      } else {
        text.push_back(c);
      }
    }
    std::vector<Symbol> symbols;
    for (size_t i = 0; i < text.size();) {
      size_t len = ValidUtf8Length(text, i);
      if (len == 0) len = 1;
      auto it = vocab.find(Av(std::string_view(text).substr(i, len)));
      int32_t n = static_cast<int32_t>(symbols.size());
      symbols.push_back({it == vocab.end() ? -1 : it->second, static_cast<uint32_t>(i),
                         static_cast<uint32_t>(len), n - 1, -1});
      if (n > 0) symbols[n - 1].next = n;
      i += len;
    }
    MergeAll(text, symbols);
    for (const Symbol& s : symbols) {
      if (s.len == 0) continue;
      if (s.id >= 0) {
        out->push_back(s.id);
        continue;
      }
      std::string_view piece = std::string_view(text).substr(s.start, s.len);
      bool all_bytes = std::all_of(piece.begin(), piece.end(), [&](char c) {
        return byte_fallback_ids[static_cast<uint8_t>(c)] >= 0;
      });
      if (all_bytes) {
        for (char c : piece) out->push_back(byte_fallback_ids[static_cast<uint8_t>(c)]);
      } else if (spec.unk_id >= 0) {
        out->push_back(spec.unk_id);
      }
    }
  }
};

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::Create(TokenizerSpec spec) {
  auto impl = std::make_unique<Impl>();
  const int32_t n = static_cast<int32_t>(spec.tokens.size());
  if (n == 0) return absl::InvalidArgumentError("tokens: the vocabulary is empty");
  if (!spec.scores.empty() && spec.scores.size() != spec.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("scores: %d entries for %d tokens",
                                                      spec.scores.size(), spec.tokens.size()));
  }
  if (!spec.token_types.empty() && spec.token_types.size() != spec.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrFormat("token_types: %d entries for %d tokens",
                                                      spec.token_types.size(), spec.tokens.size()));
  }
  for (auto [name, id] : {std::pair<const char*, int32_t>{"bos_id", spec.bos_id},
                          {"eos_id", spec.eos_id},
                          {"unk_id", spec.unk_id},
                          {"pad_id", spec.pad_id}}) {
    if (id < -1 || id >= n) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s: %d is outside the vocabulary of %d tokens", name, id, n));
    }
  }
  if (spec.add_bos && spec.bos_id < 0) {
    return absl::InvalidArgumentError("add_bos: set but the tokenizer has no bos_id");
  }
  if (spec.add_eos && spec.eos_id < 0) {
    return absl::InvalidArgumentError("add_eos: set but the tokenizer has no eos_id");
  }
  impl->vocab.reserve(n);
  for (int32_t id = 0; id < n; ++id) impl->vocab.emplace(spec.tokens[id], id);

  if (spec.added_tokens.empty() && !spec.token_types.empty()) {
    for (int32_t id = 0; id < n; ++id) {
      TokenType t = spec.token_types[id];
      // As llama.cpp's special-token cache (CONTROL | USER_DEFINED | UNKNOWN):
      // "<unk>" written in the text is the unknown token under parse_special,
      // as in HF, where it is an added special token.
      if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) {
        spec.added_tokens.push_back(
            {id, spec.tokens[id], t != TokenType::kUserDefined, false, false});
      }
    }
  }
  impl->is_special.assign(n, false);
  impl->added_index.assign(n, -1);
  for (size_t i = 0; i < spec.added_tokens.size(); ++i) {
    const AddedToken& t = spec.added_tokens[i];
    if (t.id < 0 || t.id >= n) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "added_tokens[%d]: id %d is outside the vocabulary of %d tokens", i, t.id, n));
    }
    if (t.content.empty()) {
      return absl::InvalidArgumentError(absl::StrFormat("added_tokens[%d]: empty content", i));
    }
    impl->is_special[t.id] = impl->is_special[t.id] || t.special;
    impl->added_index[t.id] = static_cast<int32_t>(i);
    impl->added_by_first_byte[static_cast<uint8_t>(t.content[0])].push_back(
        static_cast<int32_t>(i));
  }
  for (auto& list : impl->added_by_first_byte) {
    std::stable_sort(list.begin(), list.end(), [&](int32_t a, int32_t b) {
      return spec.added_tokens[a].content.size() > spec.added_tokens[b].content.size();
    });
  }

  impl->merges.reserve(spec.merges.size());
  for (size_t i = 0; i < spec.merges.size(); ++i) {
    const auto& [left, right] = spec.merges[i];
    auto l = impl->vocab.find(left), r = impl->vocab.find(right);
    auto m = impl->vocab.find(absl::StrCat(left, right));
    if (l == impl->vocab.end() || r == impl->vocab.end() || m == impl->vocab.end()) {
      return absl::InvalidArgumentError(
          absl::StrFormat("merges[%d]: '%s %s': %s is not in the vocabulary", i, left, right,
                          l == impl->vocab.end()   ? "the left part"
                          : r == impl->vocab.end() ? "the right part"
                                                   : "the merged token"));
    }
    // The first occurrence of a pair defines its rank.
    impl->merges.try_emplace(PairKey(l->second, r->second), static_cast<int32_t>(i), m->second);
  }

  std::fill(std::begin(impl->byte_ids), std::end(impl->byte_ids), -1);
  std::fill(std::begin(impl->byte_fallback_ids), std::end(impl->byte_fallback_ids), -1);
  impl->byte_token_value.assign(n, -1);
  if (spec.model == TokenizerModel::kByteLevelBpe) {
    // Vocabularies may lack characters of bytes never seen in training (SmolLM2
    // lacks some control bytes); such bytes encode as unk_id (dropped without one).
    for (int b = 0; b < 256; ++b) {
      auto it = impl->vocab.find(Alphabet().byte_to_utf8[b]);
      if (it != impl->vocab.end()) impl->byte_ids[b] = it->second;
    }
    for (size_t i = 0; i < spec.pre_tokenizer_regexes.size(); ++i) {
      auto regex = Regex::Compile(spec.pre_tokenizer_regexes[i],
                                  absl::StrFormat("pre_tokenizer_regexes[%d]", i));
      if (!regex.ok()) return regex.status();
      impl->regexes.push_back(std::move(regex).value());
    }
  } else {
    if (!spec.pre_tokenizer_regexes.empty()) {
      return absl::InvalidArgumentError(
          "pre_tokenizer_regexes: not supported for the SentencePiece model");
    }
    for (int b = 0; b < 256; ++b) {
      auto it = impl->vocab.find(absl::StrFormat("<0x%02X>", b));
      if (it != impl->vocab.end()) {
        impl->byte_fallback_ids[b] = it->second;
        impl->byte_token_value[it->second] = static_cast<int16_t>(b);
      }
    }
  }
  impl->spec = std::move(spec);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, const EncodeOptions& options) const {
  const Impl& m = *impl_;
  const TokenizerSpec& spec = m.spec;
  std::vector<int32_t> out;
  if (options.add_special_tokens && spec.add_bos) out.push_back(spec.bos_id);

  bool prev_special = true;
  auto encode_text = [&](size_t offset, std::string_view piece) {
    if (piece.empty()) return;
    if (spec.model == TokenizerModel::kByteLevelBpe) {
      m.EncodeByteLevel(piece, &out);
    } else {
      bool prefix =
          spec.add_space_prefix && (spec.space_prefix_first_only ? offset == 0 : prev_special);
      m.EncodeSentencePiece(piece, prefix, &out);
    }
    prev_special = false;
  };

  size_t text_start = 0, i = 0;
  while (i < text.size()) {
    const AddedToken* match = nullptr;
    for (int32_t index : m.added_by_first_byte[static_cast<uint8_t>(text[i])]) {
      const AddedToken& t = spec.added_tokens[index];
      if (t.special && !options.parse_special) continue;
      if (text.substr(i, t.content.size()) == t.content) {
        match = &t;
        break;
      }
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    size_t text_end = i;
    if (match->lstrip) {
      while (text_end > text_start && IsAsciiSpace(text[text_end - 1])) --text_end;
    }
    encode_text(text_start, text.substr(text_start, text_end - text_start));
    out.push_back(match->id);
    prev_special = true;
    i += match->content.size();
    if (match->rstrip) {
      while (i < text.size() && IsAsciiSpace(text[i])) ++i;
    }
    text_start = i;
  }
  encode_text(text_start, text.substr(text_start));
  if (options.add_special_tokens && spec.add_eos) out.push_back(spec.eos_id);
  return out;
}

std::string Tokenizer::TokenBytes(int32_t id, bool first, const DecodeOptions& options) const {
  const Impl& m = *impl_;
  if (m.is_special[id] && options.skip_special_tokens) return "";
  if (m.added_index[id] >= 0) return m.spec.added_tokens[m.added_index[id]].content;
  const std::string& text = m.spec.tokens[id];
  std::string out;
  if (m.spec.model == TokenizerModel::kByteLevelBpe) {
    for (size_t i = 0; i < text.size();) {
      size_t start = i;
      uint32_t cp = DecodeCodepoint(text, &i);
      auto it = Alphabet().codepoint_to_byte.find(cp);
      if (it != Alphabet().codepoint_to_byte.end()) {
        out.push_back(static_cast<char>(it->second));
      } else {
        out.append(text, start, std::min(i, text.size()) - start);
      }
    }
    return out;
  }
  if (m.byte_token_value[id] >= 0) {
    out.push_back(static_cast<char>(m.byte_token_value[id]));
  } else {
    for (size_t i = 0; i < text.size();) {
      if (text.compare(i, kSpmSpace.size(), kSpmSpace) == 0) {
        out.push_back(' ');
        i += kSpmSpace.size();
      } else {
        out.push_back(text[i++]);
      }
    }
  }
  if (first && options.strip_leading_space && m.spec.add_space_prefix && !out.empty() &&
      out[0] == ' ') {
    out.erase(0, 1);
  }
  return out;
}

absl::StatusOr<std::string> Tokenizer::Decode(std::span<const int32_t> ids,
                                              const DecodeOptions& options) const {
  std::string bytes;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "ids[%d]: token id %d is outside the vocabulary of %d tokens", i, ids[i], vocab_size()));
    }
    bytes += TokenBytes(ids[i], bytes.empty(), options);
  }
  return SanitizeUtf8(bytes, /*final=*/true);
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->spec.tokens.size()); }
const std::string& Tokenizer::TokenText(int32_t id) const { return impl_->spec.tokens[id]; }
int32_t Tokenizer::TokenId(std::string_view text) const {
  auto it = impl_->vocab.find(Av(text));
  return it == impl_->vocab.end() ? -1 : it->second;
}
bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && impl_->is_special[id];
}
const TokenizerSpec& Tokenizer::spec() const { return impl_->spec; }
std::string Tokenizer::BosText() const {
  return bos_id() < 0 ? "" : TokenBytes(bos_id(), false, {.skip_special_tokens = false});
}
std::string Tokenizer::EosText() const {
  return eos_id() < 0 ? "" : TokenBytes(eos_id(), false, {.skip_special_tokens = false});
}

}  // namespace pagedserve
