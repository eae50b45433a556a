#include "runtime/grammar/regex.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pagedserve::grammar {
namespace {

constexpr uint32_t kMaxCp = 0x10FFFF;

int Utf8Len(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

// UTF-8 byte-range sequences for [lo, hi] (Russ Cox's utf8 range splitting, as
// in Go's regexp/syntax and Rust's utf8-ranges).
void Utf8Ranges(uint32_t lo, uint32_t hi,
                std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  if (lo > hi) return;
  static constexpr uint32_t kLimits[] = {0x7F, 0x7FF, 0xFFFF};
  for (uint32_t limit : kLimits) {
    if (lo <= limit && hi > limit) {
      Utf8Ranges(lo, limit, out);
      Utf8Ranges(limit + 1, hi, out);
      return;
    }
  }
  const int n = Utf8Len(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Utf8Ranges(lo, lo | m, out);
        Utf8Ranges((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Utf8Ranges(lo, (hi & ~m) - 1, out);
        Utf8Ranges(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = EncodeUtf8(lo), z = EncodeUtf8(hi);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (size_t i = 0; i < a.size(); ++i) {
    seq.emplace_back(static_cast<uint8_t>(a[i]), static_cast<uint8_t>(z[i]));
  }
  out.push_back(std::move(seq));
}

std::string JsonEscape(uint32_t cp) {
  switch (cp) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case '\b': return "\\b";
    case '\f': return "\\f";
    case '\n': return "\\n";
    case '\r': return "\\r";
    case '\t': return "\\t";
    default: return absl::StrFormat("\\u%04x", cp);
  }
}

}  // namespace

std::string EncodeUtf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::optional<uint32_t> DecodeUtf8(std::string_view s, size_t* pos) {
  if (*pos >= s.size()) return std::nullopt;
  const auto c0 = static_cast<uint8_t>(s[*pos]);
  const int n = c0 < 0x80 ? 1 : (c0 >> 5) == 6 ? 2 : (c0 >> 4) == 14 ? 3 : (c0 >> 3) == 30 ? 4 : 0;
  if (n == 0 || *pos + n > s.size()) return std::nullopt;
  uint32_t cp = n == 1 ? c0 : c0 & (0x7F >> n);
  for (int i = 1; i < n; ++i) {
    const auto cc = static_cast<uint8_t>(s[*pos + i]);
    if ((cc & 0xC0) != 0x80) return std::nullopt;
    cp = (cp << 6) | (cc & 0x3F);
  }
  *pos += n;
  return cp;
}

std::optional<uint32_t> ParseHex(std::string_view s, size_t* pos, int digits) {
  if (*pos + digits > s.size()) return std::nullopt;
  uint32_t v = 0;
  for (int i = 0; i < digits; ++i) {
    const char h = s[*pos + i];
    const int d = h >= '0' && h <= '9'   ? h - '0'
                  : h >= 'a' && h <= 'f' ? h - 'a' + 10
                  : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                         : -1;
    if (d < 0) return std::nullopt;
    v = v * 16 + d;
  }
  *pos += digits;
  return v;
}

CodepointSet Normalize(CodepointSet set) {
  std::sort(set.begin(), set.end());
  CodepointSet out;
  for (const auto& [lo, hi] : set) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

CodepointSet Complement(const CodepointSet& set) {
  CodepointSet n = Normalize(set);
  n.emplace_back(0xD800, 0xDFFF);  // surrogates are not scalar values
  n = Normalize(n);
  CodepointSet out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : n) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCp) out.emplace_back(next, kMaxCp);
  return out;
}

GrammarBuilder::Seq CharClassSeq(GrammarBuilder& b, const CodepointSet& in, CharEncoding encoding) {
  CodepointSet set = Normalize(in);
  std::vector<GrammarBuilder::Seq> alts;
  ByteSet ascii;
  for (const auto& [lo, hi] : set) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x7F); ++c) {
      const bool escaped = encoding == CharEncoding::kJson && (c < 0x20 || c == '"' || c == '\\');
      if (!escaped) {
        ascii.set(c);
        continue;
      }
      GrammarBuilder::Seq s;
      b.AppendLiteral(s, JsonEscape(c));
      alts.push_back(std::move(s));
    }
    if (hi < 0x80) continue;
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    Utf8Ranges(std::max<uint32_t>(lo, 0x80), hi, seqs);
    for (const auto& rs : seqs) {
      GrammarBuilder::Seq s;
      for (const auto& [a, z] : rs) {
        ByteSet bs;
        for (int x = a; x <= z; ++x) bs.set(x);
        s.push_back(b.Bytes(bs));
      }
      alts.push_back(std::move(s));
    }
  }
  if (ascii.any()) alts.insert(alts.begin(), GrammarBuilder::Seq{b.Bytes(ascii)});
  if (alts.size() == 1 && alts[0].size() == 1) return alts[0];
  if (alts.empty()) {
    // The empty class matches nothing: a byte class with no byte.
    return {b.Bytes(ByteSet())};
  }
  return {GrammarBuilder::Ref(b.Alternatives(alts))};
}

namespace {

class RegexParser {
 public:
  RegexParser(GrammarBuilder& b, std::string_view p, CharEncoding enc) : b_(b), p_(p), enc_(enc) {}

  absl::StatusOr<GrammarBuilder::Seq> Parse(bool search) {
    bool start_anchor = false, end_anchor = false;
    if (!p_.empty() && p_[0] == '^') {
      start_anchor = true;
      pos_ = 1;
    }
    if (p_.size() > pos_ && p_.back() == '$' && !EscapedAt(p_.size() - 1)) {
      end_anchor = true;
      p_.remove_suffix(1);
    }
    auto body = ParseAlt();
    if (!body.ok()) return body.status();
    if (pos_ < p_.size()) return Error(absl::StrCat("unbalanced ')' at offset ", pos_));
    if (!search) return body;
    GrammarBuilder::Seq out;
    const auto any = CharClassSeq(b_, AnyCodepoint(), enc_);
    if (!start_anchor) out.push_back(GrammarBuilder::Ref(b_.Star(any)));
    out.insert(out.end(), body->begin(), body->end());
    if (!end_anchor) out.push_back(GrammarBuilder::Ref(b_.Star(any)));
    return out;
  }

 private:
  absl::Status Error(const std::string& what) const {
    return absl::InvalidArgumentError(absl::StrCat("regex: ", what));
  }
  bool EscapedAt(size_t i) const {
    size_t n = 0;
    while (i > n && p_[i - 1 - n] == '\\') ++n;
    return n % 2 == 1;
  }
  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return p_[pos_]; }

  absl::StatusOr<GrammarBuilder::Seq> ParseAlt() {
    std::vector<GrammarBuilder::Seq> branches;
    while (true) {
      auto c = ParseConcat();
      if (!c.ok()) return c.status();
      branches.push_back(*std::move(c));
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    return b_.Group(branches);
  }

  absl::StatusOr<GrammarBuilder::Seq> ParseConcat() {
    GrammarBuilder::Seq seq;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      if (++depth_guard_ > 100000 || b_.over_limit()) return Error("pattern too large");
      auto atom = ParseAtom();
      if (!atom.ok()) return atom.status();
      auto q = ParseQuantifier(*atom);
      if (!q.ok()) return q.status();
      seq.insert(seq.end(), q->begin(), q->end());
    }
    return seq;
  }

  absl::StatusOr<int> ParseInt() {
    size_t start = pos_;
    int64_t v = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      if (v > 100000) return Error("repetition count over 100000");
      ++pos_;
    }
    if (pos_ == start) return -1;
    return static_cast<int>(v);
  }

  absl::StatusOr<GrammarBuilder::Seq> ParseQuantifier(const GrammarBuilder::Seq& atom) {
    if (AtEnd()) return atom;
    int min = 1, max = 1;
    const char c = Peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      min = c == '+' ? 1 : 0;
      max = c == '?' ? 1 : -1;
    } else if (c == '{') {
      const size_t save = pos_++;
      auto lo = ParseInt();
      if (!lo.ok()) return lo.status();
      int hi = *lo;
      if (!AtEnd() && Peek() == ',') {
        ++pos_;
        auto h = ParseInt();
        if (!h.ok()) return h.status();
        hi = *h;  // -1 = unbounded
      }
      if (*lo < 0 || AtEnd() || Peek() != '}') {
        pos_ = save;  // not a quantifier: a literal '{' (as Python re)
        return atom;
      }
      ++pos_;
      min = *lo;
      max = hi;
      if (max >= 0 && max < min) return Error("repetition {m,n} with n < m");
    } else {
      return atom;
    }
    if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: same language
    if (!AtEnd() && (Peek() == '+' || Peek() == '*' || Peek() == '{')) {
      return Error(absl::StrCat("unsupported quantifier '", std::string(1, Peek()),
                                "' after a quantifier at offset ", pos_));
    }
    if (std::max(min, max) > GrammarBuilder::kMaxNullableRepeat && b_.Nullable(atom)) {
      return Error(
          absl::StrCat("unsupported: a repetition count over ", GrammarBuilder::kMaxNullableRepeat,
                       " of a pattern that can match the empty string (at offset ", pos_, ")"));
    }
    return GrammarBuilder::Seq{GrammarBuilder::Ref(b_.Repeat(atom, min, max))};
  }

  // Next UTF-8 code point of the pattern.
  absl::StatusOr<uint32_t> NextCodepoint() {
    std::optional<uint32_t> cp = DecodeUtf8(p_, &pos_);
    if (!cp) return Error("invalid UTF-8 in the pattern");
    return *cp;
  }

  absl::StatusOr<uint32_t> Hex(int digits) {
    if (pos_ + digits > p_.size()) return Error("truncated hex escape");
    std::optional<uint32_t> v = ParseHex(p_, &pos_, digits);
    if (!v) return Error("bad hex escape");
    if (*v >= 0xD800 && *v <= 0xDFFF) return Error("surrogate code point in \\u escape");
    return *v;
  }

  // After a backslash: a class (\d ...) or one code point.
  absl::StatusOr<CodepointSet> Escape() {
    if (AtEnd()) return Error("trailing backslash");
    const char c = Peek();
    ++pos_;
    const CodepointSet digit{{'0', '9'}};
    const CodepointSet word{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
    const CodepointSet space{{'\t', '\r'}, {' ', ' '}};
    switch (c) {
      case 'd': return digit;
      case 'D': return Complement(digit);
      case 'w': return word;
      case 'W': return Complement(word);
      case 's': return space;
      case 'S': return Complement(space);
      case 'n': return CodepointSet{{'\n', '\n'}};
      case 't': return CodepointSet{{'\t', '\t'}};
      case 'r': return CodepointSet{{'\r', '\r'}};
      case 'f': return CodepointSet{{'\f', '\f'}};
      case 'v': return CodepointSet{{'\v', '\v'}};
      case '0': return CodepointSet{{0, 0}};
      case 'x': {
        auto v = Hex(2);
        if (!v.ok()) return v.status();
        return CodepointSet{{*v, *v}};
      }
      case 'u': {
        auto v = Hex(4);
        if (!v.ok()) return v.status();
        return CodepointSet{{*v, *v}};
      }
      default: break;
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
      return Error(absl::StrCat("unsupported escape '\\", std::string(1, c), "'"));
    }
    --pos_;
    auto cp = NextCodepoint();
    if (!cp.ok()) return cp.status();
    return CodepointSet{{*cp, *cp}};
  }

  absl::StatusOr<CodepointSet> ParseClass() {
    bool negate = false;
    if (!AtEnd() && Peek() == '^') {
      negate = true;
      ++pos_;
    }
    CodepointSet set;
    bool first = true;
    while (true) {
      if (AtEnd()) return Error("unterminated character class");
      if (Peek() == ']' && !first) break;
      first = false;
      if (Peek() == '[' && pos_ + 1 < p_.size() && p_[pos_ + 1] == ':') {
        return Error("POSIX character classes are not supported");
      }
      absl::StatusOr<CodepointSet> item;
      if (Peek() == '\\') {
        ++pos_;
        item = Escape();
      } else {
        auto cp = NextCodepoint();
        if (!cp.ok()) return cp.status();
        item = CodepointSet{{*cp, *cp}};
      }
      if (!item.ok()) return item.status();
      // A range a-b (both single code points; a '-' before ']' is literal).
      if (item->size() == 1 && (*item)[0].first == (*item)[0].second && pos_ + 1 < p_.size() &&
          Peek() == '-' && p_[pos_ + 1] != ']') {
        ++pos_;
        absl::StatusOr<CodepointSet> hi;
        if (Peek() == '\\') {
          ++pos_;
          hi = Escape();
        } else {
          auto cp = NextCodepoint();
          if (!cp.ok()) return cp.status();
          hi = CodepointSet{{*cp, *cp}};
        }
        if (!hi.ok()) return hi.status();
        if (hi->size() != 1 || (*hi)[0].first != (*hi)[0].second) return Error("bad class range");
        if ((*hi)[0].first < (*item)[0].first) return Error("class range out of order");
        set.emplace_back((*item)[0].first, (*hi)[0].first);
        continue;
      }
      set.insert(set.end(), item->begin(), item->end());
    }
    ++pos_;  // ']'
    return negate ? Complement(set) : Normalize(set);
  }

  absl::StatusOr<GrammarBuilder::Seq> ParseAtom() {
    const char c = Peek();
    if (c == '(') {
      if (++nesting_ > kMaxNesting) return Error("groups nested too deeply");
      ++pos_;
      if (!AtEnd() && Peek() == '?') {
        ++pos_;
        if (!AtEnd() && Peek() == ':') {
          ++pos_;
        } else if (!AtEnd() && (Peek() == 'P' || Peek() == '<') && p_.substr(pos_, 2) != "<=" &&
                   p_.substr(pos_, 2) != "<!") {
          const size_t close = p_.find('>', pos_);
          if (close == std::string_view::npos) return Error("unterminated group name");
          pos_ = close + 1;
        } else {
          return Error("unsupported group '(?' (lookaround, flags)");
        }
      }
      auto inner = ParseAlt();
      if (!inner.ok()) return inner.status();
      if (AtEnd() || Peek() != ')') return Error("missing ')'");
      ++pos_;
      --nesting_;
      return inner;
    }
    if (c == '[') {
      ++pos_;
      auto set = ParseClass();
      if (!set.ok()) return set.status();
      return CharClassSeq(b_, *set, enc_);
    }
    if (c == '.') {
      ++pos_;
      return CharClassSeq(b_, Complement({{'\n', '\n'}}), enc_);
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') {
      if (c != '{') return Error(absl::StrCat("nothing to repeat at offset ", pos_));
    }
    if (c == '^' || c == '$') {
      return Error(absl::StrCat("anchor '", std::string(1, c),
                                "' inside the pattern (only ^ first and $ last are supported)"));
    }
    if (c == '\\') {
      ++pos_;
      auto set = Escape();
      if (!set.ok()) return set.status();
      return CharClassSeq(b_, *set, enc_);
    }
    auto cp = NextCodepoint();
    if (!cp.ok()) return cp.status();
    return CharClassSeq(b_, {{*cp, *cp}}, enc_);
  }

  GrammarBuilder& b_;
  std::string_view p_;
  CharEncoding enc_;
  size_t pos_ = 0;
  int depth_guard_ = 0;
  int nesting_ = 0;
  static constexpr int kMaxNesting = 200;
};

}  // namespace

absl::StatusOr<GrammarBuilder::Seq> CompileRegex(GrammarBuilder& b, std::string_view pattern,
                                                 CharEncoding encoding, bool search) {
  RegexParser parser(b, pattern, encoding);
  return parser.Parse(search);
}

}  // namespace pagedserve::grammar
