#include "runtime/chat/lexer.h"

#include <charconv>
#include <cmath>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "runtime/chat/py_text.h"
#include "runtime/chat/str_cat.h"
#include "runtime/common/status_macros.h"

namespace pagedserve::chat {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsHex(char c) { return IsDigit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }
int HexValue(char c) { return IsDigit(c) ? c - '0' : (c | 0x20) - 'a' + 10; }

// The source with "\r\n" and "\r" turned into "\n" and one trailing newline dropped.
std::string NormalizeNewlines(std::string_view source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out.push_back(source[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

bool IsAllWhitespace(std::string_view s) {
  for (char32_t c : DecodeUtf8(s)) {
    if (!IsPySpace(c)) return false;
  }
  return true;
}

// Python's unicode-escape decoding of a string literal's body, after the
// backslashreplace encoding jinja2 applies first (so a backslash before a
// non-ASCII character stays a backslash followed by that character's escape text).
class StringUnescaper {
 public:
  StringUnescaper(std::string_view body, int line) : body_(body), line_(line) {}

  absl::StatusOr<std::string> Run() {
    for (i_ = 0; i_ < body_.size();) {
      if (body_[i_] != '\\') {
        out_.push_back(body_[i_++]);
        continue;
      }
      ++i_;
      PS_RETURN_IF_ERROR(Escape());
    }
    return std::move(out_);
  }

 private:
  absl::Status Escape() {
    const char c = body_[i_++];
    switch (c) {
      case '\n': return absl::OkStatus();
      case '\\':
      case '\'':
      case '"': out_.push_back(c); return absl::OkStatus();
      case 'a': out_.push_back('\a'); return absl::OkStatus();
      case 'b': out_.push_back('\b'); return absl::OkStatus();
      case 'f': out_.push_back('\f'); return absl::OkStatus();
      case 'n': out_.push_back('\n'); return absl::OkStatus();
      case 'r': out_.push_back('\r'); return absl::OkStatus();
      case 't': out_.push_back('\t'); return absl::OkStatus();
      case 'v': out_.push_back('\v'); return absl::OkStatus();
      case 'x': return Hex(2, "truncated \\xXX escape");
      case 'u': return Hex(4, "truncated \\uXXXX escape");
      case 'U': return Hex(8, "truncated \\UXXXXXXXX escape");
      case 'N': return Error("\\N{...} escapes in string literals are not supported");
      default: break;
    }
    if (c >= '0' && c <= '7') {
      char32_t value = c - '0';
      for (int k = 0; k < 2 && i_ < body_.size() && body_[i_] >= '0' && body_[i_] <= '7'; ++k) {
        value = value * 8 + (body_[i_++] - '0');
      }
      AppendUtf8(value, &out_);
      return absl::OkStatus();
    }
    out_.push_back('\\');
    if ((c & 0x80) == 0) {
      out_.push_back(c);
      return absl::OkStatus();
    }
    // A non-ASCII character: backslashreplace wrote it as \xNN, \uNNNN or \UNNNNNNNN,
    // and the backslash before it escaped that backslash.
    --i_;
    size_t len = 1;
    while (i_ + len < body_.size() && (body_[i_ + len] & 0xC0) == 0x80) ++len;
    const std::u32string cps = DecodeUtf8(body_.substr(i_, len));
    i_ += len;
    for (size_t k = 0; k < cps.size(); ++k) {
      if (k > 0) out_.push_back('\\');
      const auto cp = static_cast<unsigned>(cps[k]);
      out_.append(cp <= 0xFF     ? absl::StrFormat("x%02x", cp)
                  : cp <= 0xFFFF ? absl::StrFormat("u%04x", cp)
                                 : absl::StrFormat("U%08x", cp));
    }
    return absl::OkStatus();
  }

  absl::Status Hex(int digits, std::string_view message) {
    char32_t value = 0;
    for (int k = 0; k < digits; ++k) {
      if (i_ >= body_.size() || !IsHex(body_[i_])) return Error(message);
      value = value * 16 + HexValue(body_[i_++]);
    }
    if (value > 0x10FFFF) return Error("illegal Unicode character in a string literal");
    AppendUtf8(value, &out_);
    return absl::OkStatus();
  }

  absl::Status Error(std::string_view message) const {
    return absl::InvalidArgumentError(Cat("line ", line_, ": ", message));
  }

  std::string_view body_;
  int line_;
  size_t i_ = 0;
  std::string out_;
};

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(NormalizeNewlines(source)) {}

  absl::StatusOr<std::vector<Token>> Run() {
    while (pos_ < src_.size()) PS_RETURN_IF_ERROR(LexRoot());
    Emit(TokenType::kEof, "");
    return std::move(tokens_);
  }

 private:
  // ------------------------------------------------------------ root state

  absl::Status LexRoot() {
    const size_t q = FindTagStart(pos_);
    if (q == std::string::npos) {
      EmitData(std::string_view(src_).substr(pos_));
      pos_ = src_.size();
      return absl::OkStatus();
    }
    const char kind = src_[q + 1];
    const char sign =
        q + 2 < src_.size() && (src_[q + 2] == '-' || src_[q + 2] == '+') ? src_[q + 2] : 0;
    const std::optional<size_t> raw_end = kind == '%' ? MatchRawBegin(q) : std::nullopt;
    const std::string_view text = std::string_view(src_).substr(pos_, q - pos_);
    EmitData(LeftStrip(text, sign, kind != '{'));
    line_ += Newlines(text);
    pos_ = q + 2 + (sign != 0 ? 1 : 0);
    line_starting_ = false;
    if (raw_end) {
      line_ += Newlines(std::string_view(src_).substr(pos_, *raw_end - pos_));
      pos_ = *raw_end;
      line_starting_ = src_[pos_ - 1] == '\n';
      return LexRaw();
    }
    if (kind == '#') return LexComment();
    Emit(kind == '%' ? TokenType::kBlockBegin : TokenType::kVariableBegin, "");
    return LexTag(kind == '%');
  }

  size_t FindTagStart(size_t from) const {
    for (size_t q = src_.find('{', from); q != std::string::npos; q = src_.find('{', q + 1)) {
      if (q + 1 < src_.size() && (src_[q + 1] == '%' || src_[q + 1] == '{' || src_[q + 1] == '#')) {
        return q;
      }
    }
    return std::string::npos;
  }

  // {%[-+]?\s*raw\s*(-%}\s*|%}) at q: the position after it.
  std::optional<size_t> MatchRawBegin(size_t q) const {
    size_t i = q + 2;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) ++i;
    i = SkipSpaces(i);
    if (src_.compare(i, 3, "raw") != 0) return std::nullopt;
    i = SkipSpaces(i + 3);
    if (src_.compare(i, 3, "-%}") == 0) return SkipSpaces(i + 3);
    if (src_.compare(i, 2, "%}") == 0) return i + 2;
    return std::nullopt;
  }

  // The data before a tag after whitespace control: `-` strips all trailing
  // whitespace; lstrip_blocks strips a block or comment tag's indentation.
  std::string_view LeftStrip(std::string_view text, char sign, bool block) const {
    if (sign == '-') {
      const std::u32string cps = DecodeUtf8(text);
      size_t k = cps.size();
      while (k > 0 && IsPySpace(cps[k - 1])) --k;
      return text.substr(0, EncodeUtf8(std::u32string_view(cps).substr(0, k)).size());
    }
    if (sign == '+' || !block) return text;
    const size_t newline = text.rfind('\n');
    const size_t l_pos = newline == std::string_view::npos ? 0 : newline + 1;
    if ((l_pos > 0 || line_starting_) && l_pos < text.size() &&
        IsAllWhitespace(text.substr(l_pos))) {
      return text.substr(0, l_pos);
    }
    return text;
  }

  // ------------------------------------------------------------ comments and raw

  absl::Status LexComment() {
    const size_t q = src_.find("#}", pos_);
    if (q == std::string::npos) return Error("Missing end of comment tag");
    const char sign = q > pos_ && (src_[q - 1] == '-' || src_[q - 1] == '+') ? src_[q - 1] : 0;
    line_ += Newlines(std::string_view(src_).substr(pos_, q - pos_));
    pos_ = q + 2;
    FinishTag(sign);
    return absl::OkStatus();
  }

  absl::Status LexRaw() {
    for (size_t q = src_.find("{%", pos_); q != std::string::npos; q = src_.find("{%", q + 1)) {
      size_t i = q + 2;
      const char sign = i < src_.size() && (src_[i] == '-' || src_[i] == '+') ? src_[i] : 0;
      i = SkipSpaces(i + (sign != 0 ? 1 : 0));
      if (src_.compare(i, 6, "endraw") != 0) continue;
      i = SkipSpaces(i + 6);
      const char end_sign = i < src_.size() && (src_[i] == '-' || src_[i] == '+') ? src_[i] : 0;
      if (src_.compare(i + (end_sign != 0 ? 1 : 0), 2, "%}") != 0) continue;
      const std::string_view text = std::string_view(src_).substr(pos_, q - pos_);
      EmitData(LeftStrip(text, sign, true));
      line_ += Newlines(std::string_view(src_).substr(pos_, i - pos_));
      pos_ = i + (end_sign != 0 ? 1 : 0) + 2;
      FinishTag(end_sign);
      return absl::OkStatus();
    }
    return Error("Missing end of raw directive");
  }

  // After a block or comment end at pos_: `-` eats all whitespace, `+` none,
  // otherwise trim_blocks eats one newline.
  void FinishTag(char sign) {
    const size_t start = pos_;
    if (sign == '-') {
      pos_ = SkipSpaces(pos_);
    } else if (sign == 0 && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_ += Newlines(std::string_view(src_).substr(start, pos_ - start));
    line_starting_ = pos_ > start && src_[pos_ - 1] == '\n';
  }

  // ------------------------------------------------------------ inside {% %} and {{ }}

  absl::Status LexTag(bool block) {
    while (true) {
      if (pos_ >= src_.size())
        return Error(block ? "unexpected end of template, expected '%}'"
                           : "unexpected end of template, expected '}}'");
      if (balance_.empty() && MatchTagEnd(block)) return absl::OkStatus();
      const size_t spaces_end = SkipSpaces(pos_);
      if (spaces_end != pos_) {
        line_ += Newlines(std::string_view(src_).substr(pos_, spaces_end - pos_));
        pos_ = spaces_end;
        continue;
      }
      PS_RETURN_IF_ERROR(LexTagToken());
    }
  }

  bool MatchTagEnd(bool block) {
    const char close = block ? '%' : '}';
    const char sign = src_[pos_] == '-' || (block && src_[pos_] == '+') ? src_[pos_] : 0;
    const size_t at = pos_ + (sign != 0 ? 1 : 0);
    if (at + 1 >= src_.size() || src_[at] != close || src_[at + 1] != '}') return false;
    Emit(block ? TokenType::kBlockEnd : TokenType::kVariableEnd, "");
    pos_ = at + 2;
    if (block) {
      FinishTag(sign);
    } else if (sign == '-') {
      FinishTag('-');
    } else {
      line_starting_ = false;
    }
    return true;
  }

  absl::Status LexTagToken() {
    const char c = src_[pos_];
    if (IsDigit(c)) return LexNumber();
    if (c == '\'' || c == '"') return LexString(c);
    if (c == '_' || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || (c & 0x80) != 0) return LexName();
    return LexOperator();
  }

  absl::Status LexName() {
    size_t i = pos_;
    while (i < src_.size()) {
      char32_t cp;
      size_t len = 1;
      const auto b = static_cast<unsigned char>(src_[i]);
      if (b < 0x80) {
        cp = b;
      } else {
        while (i + len < src_.size() && (src_[i + len] & 0xC0) == 0x80 && len < 4) ++len;
        const std::u32string one = DecodeUtf8(std::string_view(src_).substr(i, len));
        cp = one.size() == 1 ? one[0] : 0;
      }
      const bool ok = i == pos_ ? (cp == '_' || IsAlphaChar(cp)) : IsWordChar(cp);
      if (!ok) break;
      i += len;
    }
    if (i == pos_) return Error(Cat("unexpected char '", src_.substr(pos_, 1), "'"));
    Emit(TokenType::kName, src_.substr(pos_, i - pos_));
    pos_ = i;
    return absl::OkStatus();
  }

  absl::Status LexString(char quote) {
    size_t i = pos_ + 1;
    while (i < src_.size() && src_[i] != quote) i += src_[i] == '\\' ? 2 : 1;
    if (i >= src_.size())
      return Error("unexpected char '" + std::string(1, quote) + "' (unterminated string)");
    const std::string_view body = std::string_view(src_).substr(pos_ + 1, i - pos_ - 1);
    PS_ASSIGN_OR_RETURN(std::string value, StringUnescaper(body, line_).Run());
    Emit(TokenType::kString, std::move(value));
    line_ += Newlines(body);
    pos_ = i + 1;
    return absl::OkStatus();
  }

  // float_re, else integer_re (jinja2's lexer tries them in that order).
  absl::Status LexNumber() {
    if (pos_ > 0 && src_[pos_ - 1] == '.') return LexInteger();  // (?<!\.) of float_re
    const size_t end = MatchFloat(pos_);
    if (end == pos_) return LexInteger();
    std::string digits;
    for (size_t i = pos_; i < end; ++i) {
      if (src_[i] != '_') digits.push_back(src_[i]);
    }
    double value = 0;
    const auto result = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (result.ec == std::errc::result_out_of_range) {
      const size_t e = digits.find_first_of("eE");
      value = e != std::string::npos && digits[e + 1] == '-' ? 0.0 : HUGE_VAL;
    }
    Token& t = Emit(TokenType::kFloat, src_.substr(pos_, end - pos_));
    t.float_value = value;
    pos_ = end;
    return absl::OkStatus();
  }

  // (\d+_)*\d+ at i: its end, or i.
  size_t MatchDigits(size_t i) const {
    size_t j = i;
    while (true) {
      size_t k = j;
      while (k < src_.size() && IsDigit(src_[k])) ++k;
      if (k == j) return j == i ? i : j - 1;  // j - 1: a trailing '_' is not part of it
      j = k;
      if (j + 1 < src_.size() && src_[j] == '_' && IsDigit(src_[j + 1])) {
        ++j;
        continue;
      }
      return j;
    }
  }

  size_t MatchFloat(size_t i) const {
    const size_t int_end = MatchDigits(i);
    if (int_end == i) return i;
    size_t j = int_end;
    bool fraction = false;
    if (j + 1 < src_.size() && src_[j] == '.' && IsDigit(src_[j + 1])) {
      j = MatchDigits(j + 1);
      fraction = true;
    }
    if (j < src_.size() && (src_[j] | 0x20) == 'e') {
      size_t k = j + 1;
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) ++k;
      const size_t exp_end = MatchDigits(k);
      if (exp_end != k) return exp_end;
    }
    return fraction ? j : i;
  }

  absl::Status LexInteger() {
    size_t i = pos_;
    int base = 10;
    if (src_[i] == '0' && i + 1 < src_.size()) {
      const char p = static_cast<char>(src_[i + 1] | 0x20);
      base = p == 'b' ? 2 : p == 'o' ? 8 : p == 'x' ? 16 : 10;
    }
    std::string digits;
    if (base != 10) {
      i += 2;
      while (i < src_.size()) {
        if (src_[i] == '_' && i + 1 < src_.size() && DigitOk(src_[i + 1], base)) ++i;
        if (!DigitOk(src_[i], base)) break;
        digits.push_back(src_[i++]);
      }
      if (digits.empty()) {  // "0x" without digits: just the integer 0
        base = 10;
        i = pos_ + 1;
        digits = "0";
      }
    } else if (src_[i] == '0') {
      digits = "0";
      ++i;
      while (i + 1 < src_.size() && (src_[i] == '0' || (src_[i] == '_' && src_[i + 1] == '0'))) ++i;
      if (i < src_.size() && src_[i] == '0') ++i;
    } else {
      const size_t end = MatchDigits(i);
      for (; i < end; ++i) {
        if (src_[i] != '_') digits.push_back(src_[i]);
      }
    }
    int64_t value = 0;
    const auto result = std::from_chars(digits.data(), digits.data() + digits.size(), value, base);
    if (result.ec != std::errc()) return Error("integer literal does not fit in 64 bits");
    Token& t = Emit(TokenType::kInteger, src_.substr(pos_, i - pos_));
    t.int_value = value;
    pos_ = i;
    return absl::OkStatus();
  }

  static bool DigitOk(char c, int base) {
    if (base == 2) return c == '0' || c == '1';
    if (base == 8) return c >= '0' && c <= '7';
    return IsHex(c);
  }

  absl::Status LexOperator() {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    for (std::string_view op : kTwo) {
      if (src_.compare(pos_, 2, op) == 0) {
        Emit(TokenType::kOperator, std::string(op));
        pos_ += 2;
        return absl::OkStatus();
      }
    }
    const char c = src_[pos_];
    if (std::string_view("+-/*%~[](){}><=.:|,;").find(c) == std::string_view::npos) {
      return Error(Cat("unexpected char '", src_.substr(pos_, 1), "'"));
    }
    PS_RETURN_IF_ERROR(Balance(c));
    Emit(TokenType::kOperator, std::string(1, c));
    ++pos_;
    return absl::OkStatus();
  }

  absl::Status Balance(char c) {
    if (c == '(' || c == '[' || c == '{') {
      balance_.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (balance_.empty()) return Error(Cat("unexpected '", std::string(1, c), "'"));
      if (balance_.back() != c) {
        return Error(Cat("unexpected '", std::string(1, c), "', expected '",
                         std::string(1, balance_.back()), "'"));
      }
      balance_.pop_back();
    }
    return absl::OkStatus();
  }

  // ------------------------------------------------------------ helpers

  size_t SkipSpaces(size_t i) const {
    while (i < src_.size()) {
      const auto b = static_cast<unsigned char>(src_[i]);
      if (b < 0x80) {
        if (!IsPySpace(b)) break;
        ++i;
        continue;
      }
      size_t len = 1;
      while (i + len < src_.size() && (src_[i + len] & 0xC0) == 0x80 && len < 4) ++len;
      const std::u32string one = DecodeUtf8(std::string_view(src_).substr(i, len));
      if (one.size() != 1 || !IsPySpace(one[0])) break;
      i += len;
    }
    return i;
  }

  static int Newlines(std::string_view s) {
    int n = 0;
    for (char c : s) n += c == '\n';
    return n;
  }

  void EmitData(std::string_view text) {
    if (!text.empty()) Emit(TokenType::kData, std::string(text));
  }

  Token& Emit(TokenType type, std::string text) {
    tokens_.push_back(Token{type, std::move(text), 0, 0, line_});
    return tokens_.back();
  }

  absl::Status Error(std::string_view message) const {
    return absl::InvalidArgumentError(Cat("line ", line_, ": ", message));
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::string balance_;
  std::vector<Token> tokens_;
};

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view source) { return Lexer(source).Run(); }

}  // namespace pagedserve::chat
