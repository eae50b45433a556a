#include "runtime/grammar/gbnf.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "runtime/grammar/regex.h"

namespace pagedserve::grammar {
namespace {

using Seq = GrammarBuilder::Seq;

// Groups nest at most this deep (the parser recurses once per level).
constexpr int kMaxNesting = 100;
// The largest m or n of a {m,n} repetition (the grammar's size bound applies too).
constexpr int kMaxRepetition = 100000;

bool IsWordChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : s_(text) {}

  absl::StatusOr<std::shared_ptr<const Grammar>> Parse() {
    SkipSpace(/*newline_ok=*/true);
    while (!AtEnd()) {
      if (absl::Status st = ParseRule(); !st.ok()) return st;
      SkipSpace(/*newline_ok=*/true);
    }
    for (const auto& [name, rule] : rules_) {
      if (!rule.defined) {
        return absl::InvalidArgumentError(
            absl::StrCat("grammar: ", Where(rule.first_use), ": undefined rule '", name, "'"));
      }
    }
    auto root = rules_.find("root");
    if (root == rules_.end()) return absl::InvalidArgumentError("grammar: no 'root' rule");
    absl::StatusOr<std::shared_ptr<const Grammar>> g = b_.Build(root->second.id);
    if (!g.ok()) return absl::InvalidArgumentError(absl::StrCat("grammar: ", g.status().message()));
    return g;
  }

 private:
  struct Rule {
    int32_t id = 0;
    bool defined = false;
    size_t first_use = 0;  // offset of the first reference or definition
  };

  bool AtEnd() const { return pos_ >= s_.size(); }
  char Peek() const { return AtEnd() ? '\0' : s_[pos_]; }

  // "line L, column C" of byte offset `at` (both from 1).
  std::string Where(size_t at) const {
    at = std::min(at, s_.size());
    const size_t line = 1 + std::count(s_.begin(), s_.begin() + at, '\n');
    const size_t line_start = s_.rfind('\n', at == 0 ? 0 : at - 1);
    const size_t column =
        line_start == std::string_view::npos || at == 0 ? at + 1 : at - line_start;
    return absl::StrCat("line ", line, ", column ", column);
  }
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("grammar: ", Where(pos_), ": ", what));
  }

  // Blanks and comments; newlines too when `newline_ok`.
  void SkipSpace(bool newline_ok) {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == ' ' || c == '\t' || ((c == '\n' || c == '\r') && newline_ok)) {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n' && Peek() != '\r') ++pos_;
      } else {
        return;
      }
    }
  }

  std::string ParseName() {
    const size_t start = pos_;
    while (!AtEnd() && IsWordChar(Peek())) ++pos_;
    return std::string(s_.substr(start, pos_ - start));
  }

  Rule& RuleNamed(const std::string& name, size_t at) {
    auto [it, inserted] = rules_.try_emplace(name);
    if (inserted) {
      it->second.id = b_.NewRule();
      it->second.first_use = at;
    }
    return it->second;
  }

  // name ::= alternatives, then a newline or the end.
  absl::Status ParseRule() {
    const size_t start = pos_;
    const std::string name = ParseName();
    if (name.empty()) return Error("expecting a rule name");
    SkipSpace(/*newline_ok=*/false);
    if (s_.substr(pos_, 3) != "::=") return Error("expecting '::=' after the rule name");
    pos_ += 3;
    SkipSpace(/*newline_ok=*/true);
    absl::StatusOr<std::vector<Seq>> alts = ParseAlternatives(/*depth=*/0);
    if (!alts.ok()) return alts.status();
    Rule& rule = RuleNamed(name, start);
    if (rule.defined) {
      pos_ = start;
      return Error(absl::StrCat("rule '", name, "' is defined twice"));
    }
    rule.defined = true;
    // With an empty alternative the rule is built as a group (x|y|...)?, so
    // that repetitions of it fold (GrammarBuilder::Group).
    const bool has_empty =
        std::any_of(alts->begin(), alts->end(), [](const Seq& a) { return a.empty(); });
    if (has_empty) {
      b_.AddAlt(rule.id, b_.Group(*alts));
    } else {
      for (const Seq& alt : *alts) b_.AddAlt(rule.id, alt);
    }
    if (!AtEnd() && Peek() != '\n' && Peek() != '\r')
      return Error("expecting a newline or the end");
    if (b_.over_limit()) return Error("grammar too large");
    return absl::OkStatus();
  }

  // sequence ("|" sequence)*; inside a group (depth > 0) newlines are blanks.
  absl::StatusOr<std::vector<Seq>> ParseAlternatives(int depth) {
    std::vector<Seq> alts;
    while (true) {
      absl::StatusOr<Seq> seq = ParseSequence(depth);
      if (!seq.ok()) return seq.status();
      alts.push_back(*std::move(seq));
      if (Peek() != '|') return alts;
      ++pos_;
      SkipSpace(/*newline_ok=*/true);
    }
  }

  absl::StatusOr<Seq> ParseSequence(int depth) {
    Seq seq;
    while (!AtEnd()) {
      const char c = Peek();
      if (c == '|' || c == ')' || c == '\n' || c == '\r') break;
      absl::StatusOr<Seq> term = ParseTerm(depth);
      if (!term.ok()) return term.status();
      absl::StatusOr<Seq> repeated = ParsePostfix(*std::move(term));
      if (!repeated.ok()) return repeated.status();
      seq.insert(seq.end(), repeated->begin(), repeated->end());
      if (b_.over_limit()) return Error("grammar too large");
      SkipSpace(/*newline_ok=*/depth > 0);
    }
    return seq;
  }

  absl::StatusOr<Seq> ParseTerm(int depth) {
    const char c = Peek();
    if (c == '"') return ParseLiteral();
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      return CharClassSeq(b_, AnyCodepoint(), CharEncoding::kRaw);
    }
    if (c == '(') {
      if (depth + 1 > kMaxNesting) return Error("groups nested too deep");
      ++pos_;
      SkipSpace(/*newline_ok=*/true);
      absl::StatusOr<std::vector<Seq>> alts = ParseAlternatives(depth + 1);
      if (!alts.ok()) return alts.status();
      if (Peek() != ')') return Error("expecting ')'");
      ++pos_;
      return b_.Group(*alts);
    }
    if (IsWordChar(c)) {
      const size_t at = pos_;
      const std::string name = ParseName();
      return Seq{GrammarBuilder::Ref(RuleNamed(name, at).id)};
    }
    return Error(absl::StrCat("unexpected '", std::string(1, c), "'"));
  }

  // * + ? {m} {m,} {m,n} after a term (at most one, as in llama.cpp's parser
  // where a second one applies to the repeated term).
  absl::StatusOr<Seq> ParsePostfix(Seq term) {
    for (bool first = true; !AtEnd(); first = false) {
      const char c = Peek();
      // * + ? after * + ? fold into one (GrammarBuilder::Repeat); a counted
      // repetition of a repeated term that can match nothing only adds
      // ambiguity, which nesting multiplies: refused.
      if (!first && c == '{' && b_.Nullable(term)) {
        return Error(
            "a counted repetition after a quantifier, on a term that can match the empty string");
      }
      if (c == '*' || c == '+' || c == '?') {
        ++pos_;
        term = Seq{GrammarBuilder::Ref(b_.Repeat(term, c == '+' ? 1 : 0, c == '?' ? 1 : -1))};
      } else if (c == '{') {
        ++pos_;
        absl::StatusOr<std::optional<int>> lo = ParseCount();
        if (!lo.ok()) return lo.status();
        if (!*lo) return Error("expecting a repetition count after '{'");
        int hi = **lo;
        if (Peek() == ',') {
          ++pos_;
          absl::StatusOr<std::optional<int>> n = ParseCount();
          if (!n.ok()) return n.status();
          hi = *n ? **n : -1;
          if (*n && **n < **lo) return Error("repetition {m,n} with n < m");
        }
        if (Peek() != '}') return Error("expecting '}'");
        ++pos_;
        // Rules defined further down count as not nullable here.
        if (std::max(**lo, hi) > GrammarBuilder::kMaxNullableRepeat && b_.Nullable(term)) {
          return Error(absl::StrCat("a repetition count over ", GrammarBuilder::kMaxNullableRepeat,
                                    " of a term that can match the empty string"));
        }
        term = Seq{GrammarBuilder::Ref(b_.Repeat(term, **lo, hi))};
      } else {
        return term;
      }
      if (b_.over_limit()) return Error("grammar too large");
    }
    return term;
  }

  // A decimal count (nullopt when there is none).
  absl::StatusOr<std::optional<int>> ParseCount() {
    SkipSpace(/*newline_ok=*/false);
    const size_t start = pos_;
    int64_t v = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      v = v * 10 + (Peek() - '0');
      ++pos_;
      if (v > kMaxRepetition) {
        return Error(absl::StrCat("repetition count over ", kMaxRepetition));
      }
    }
    const bool found = pos_ > start;
    SkipSpace(/*newline_ok=*/false);
    if (!found) return std::optional<int>();
    return std::optional<int>(static_cast<int>(v));
  }

  // One character of a literal or class: an escape or one UTF-8 code point.
  absl::StatusOr<uint32_t> ParseChar() {
    if (Peek() != '\\') {
      std::optional<uint32_t> cp = DecodeUtf8(s_, &pos_);
      if (!cp) return Error("invalid UTF-8");
      return *cp;
    }
    ++pos_;
    if (AtEnd()) return Error("a backslash at the end");
    const char e = s_[pos_++];
    std::optional<uint32_t> cp;
    switch (e) {
      case 'n': return uint32_t{'\n'};
      case 'r': return uint32_t{'\r'};
      case 't': return uint32_t{'\t'};
      case 'x': cp = ParseHex(s_, &pos_, 2); break;
      case 'u': cp = ParseHex(s_, &pos_, 4); break;
      case 'U': cp = ParseHex(s_, &pos_, 8); break;
      case '\\':
      case '"':
      case '[':
      case ']':
      case '-':
      case '^': return static_cast<uint32_t>(e);
      default: return Error(absl::StrCat("unknown escape '\\", std::string(1, e), "'"));
    }
    if (!cp || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) {
      return Error("bad hex escape (not a Unicode scalar value)");
    }
    return *cp;
  }

  // "text": its UTF-8 bytes.
  absl::StatusOr<Seq> ParseLiteral() {
    ++pos_;  // the opening quote
    std::string bytes;
    while (Peek() != '"') {
      if (AtEnd()) return Error("unterminated literal");
      absl::StatusOr<uint32_t> cp = ParseChar();
      if (!cp.ok()) return cp.status();
      bytes += EncodeUtf8(*cp);
    }
    ++pos_;
    Seq seq;
    b_.AppendLiteral(seq, bytes);
    return seq;
  }

  // [chars] or [^chars], with ranges a-z.
  absl::StatusOr<Seq> ParseClass() {
    ++pos_;  // '['
    const bool negated = Peek() == '^';
    if (negated) ++pos_;
    CodepointSet set;
    while (Peek() != ']') {
      if (AtEnd()) return Error("unterminated character class");
      absl::StatusOr<uint32_t> lo = ParseChar();
      if (!lo.ok()) return lo.status();
      uint32_t hi = *lo;
      if (Peek() == '-' && pos_ + 1 < s_.size() && s_[pos_ + 1] != ']') {
        ++pos_;
        absl::StatusOr<uint32_t> end = ParseChar();
        if (!end.ok()) return end.status();
        if (*end < *lo) return Error("character range out of order");
        hi = *end;
      }
      set.emplace_back(*lo, hi);
    }
    ++pos_;
    set = negated ? Complement(set) : Normalize(std::move(set));
    if (set.empty()) return Error("a character class that matches nothing");
    return CharClassSeq(b_, set, CharEncoding::kRaw);
  }

  std::string_view s_;
  size_t pos_ = 0;
  GrammarBuilder b_;
  std::map<std::string, Rule> rules_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const Grammar>> CompileGbnf(std::string_view text) {
  return GbnfParser(text).Parse();
}

}  // namespace pagedserve::grammar
