#include "runtime/grammar/json_schema.h"

#include <charconv>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"
#include "runtime/grammar/regex.h"

namespace pagedserve::grammar {
namespace {

using json = nlohmann::ordered_json;
using Seq = GrammarBuilder::Seq;

const std::set<std::string>& Annotations() {
  static const auto* s = new std::set<std::string>{
      "$schema", "$id",      "$comment",   "$defs",    "definitions", "title",        "description",
      "default", "examples", "deprecated", "readOnly", "writeOnly",   "discriminator"};
  return *s;
}

const std::set<std::string>& TypeKeywords(const std::string& type) {
  static const auto* m = new std::map<std::string, std::set<std::string>>{
      {"string", {"minLength", "maxLength", "pattern", "format"}},
      {"integer", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}},
      {"number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}},
      {"object", {"properties", "required", "additionalProperties"}},
      {"array", {"items", "prefixItems", "minItems", "maxItems", "uniqueItems"}},
      {"boolean", {}},
      {"null", {}}};
  return m->at(type);
}

const char* const kAllTypes[] = {"null", "boolean", "object", "array", "number", "string"};

// Regex text for the decimal integers in [lo, hi] (0 <= lo <= hi), digits only.
std::string SameLengthRange(const std::string& a, const std::string& b) {
  if (a.size() == 1) return a == b ? a : absl::StrCat("[", a, "-", b, "]");
  if (a[0] == b[0]) return absl::StrCat(a.substr(0, 1), SameLengthRange(a.substr(1), b.substr(1)));
  const std::string nines(a.size() - 1, '9'), zeros(a.size() - 1, '0');
  if (a.substr(1) == zeros && b.substr(1) == nines) {
    return absl::StrCat("[", a.substr(0, 1), "-", b.substr(0, 1), "][0-9]{", a.size() - 1, "}");
  }
  std::vector<std::string> parts;
  parts.push_back(absl::StrCat(a.substr(0, 1), "(?:", SameLengthRange(a.substr(1), nines), ")"));
  if (a[0] + 1 <= b[0] - 1) {
    parts.push_back(absl::StrCat("[", std::string(1, a[0] + 1), "-", std::string(1, b[0] - 1),
                                 "][0-9]{", a.size() - 1, "}"));
  }
  parts.push_back(absl::StrCat(b.substr(0, 1), "(?:", SameLengthRange(zeros, b.substr(1)), ")"));
  return absl::StrCat("(?:", absl::StrJoin(parts, "|"), ")");
}

// Non-negative integers in [lo, hi]; hi < 0 = unbounded.
std::string NonNegativeRange(int64_t lo, int64_t hi) {
  std::vector<std::string> parts;
  const std::string slo = std::to_string(lo);
  const size_t max_len = hi < 0 ? 19 : std::to_string(hi).size();
  for (size_t len = slo.size(); len <= max_len; ++len) {
    const std::string first = len == slo.size() ? slo : "1" + std::string(len - 1, '0');
    std::string last = std::string(len, '9');
    if (hi >= 0 && len == max_len) last = std::to_string(hi);
    parts.push_back(SameLengthRange(first, last));
  }
  if (hi < 0) parts.push_back("[1-9][0-9]{19,}");
  return absl::StrCat("(?:", absl::StrJoin(parts, "|"), ")");
}

// Bounds on `number` (exact). A bound is an exact decimal; a number x written
// -?I(.F)? is compared with it digit by digit: on its integer part I first
// (NonNegativeRange for the parts strictly between the bounds'), then, where I
// equals a bound's integer part, on the fraction F. Under bounds no exponent
// is generated (a documented subset of the valid instances).

// sign * int_part.frac: int_part without leading zeros ("0" for zero), frac
// without trailing zeros; zero is never negative.
struct Decimal {
  bool neg = false;
  std::string int_part = "0";
  std::string frac;
  bool zero() const { return int_part == "0" && frac.empty(); }
};

// Text "-?D(.D)?([eE][+-]?D)?" (a JSON number) as a Decimal.
Decimal ParseDecimal(const std::string& text) {
  Decimal d;
  size_t i = 0;
  d.neg = i < text.size() && text[i] == '-';
  if (d.neg) ++i;
  std::string digits;
  int64_t point = -1;
  for (; i < text.size() && text[i] != 'e' && text[i] != 'E'; ++i) {
    if (text[i] == '.') {
      point = static_cast<int64_t>(digits.size());
    } else {
      digits += text[i];
    }
  }
  if (point < 0) point = static_cast<int64_t>(digits.size());
  if (i < text.size()) point += std::stoll(text.substr(i + 1));  // stoll reads "+17", "-07"
  if (point <= 0) {
    digits.insert(0, static_cast<size_t>(-point), '0');
    point = 0;
  } else if (point > static_cast<int64_t>(digits.size())) {
    digits.append(static_cast<size_t>(point) - digits.size(), '0');
  }
  d.int_part = digits.substr(0, static_cast<size_t>(point));
  d.frac = digits.substr(static_cast<size_t>(point));
  d.int_part.erase(0, std::min(d.int_part.find_first_not_of('0'), d.int_part.size()));
  if (d.int_part.empty()) d.int_part = "0";
  d.frac.erase(std::min(d.frac.find_last_not_of('0') + 1, d.frac.size()));
  if (d.zero()) d.neg = false;
  return d;
}

// -1, 0, 1 as a <, ==, > b.
int Compare(const Decimal& a, const Decimal& b) {
  if (a.neg != b.neg) return a.neg ? -1 : 1;
  int mag = 0;
  if (a.int_part.size() != b.int_part.size()) {
    mag = a.int_part.size() < b.int_part.size() ? -1 : 1;
  } else if (a.int_part != b.int_part) {
    mag = a.int_part < b.int_part ? -1 : 1;
  } else if (a.frac != b.frac) {
    mag = a.frac < b.frac ? -1 : 1;  // no trailing zeros: string order is numeric order
  }
  return a.neg ? -mag : mag;
}

struct NumBound {
  Decimal value;
  bool strict = false;
};

// A bound on the fraction digits F (value 0.F): digits without trailing zeros.
struct FracBound {
  std::string digits;
  bool strict = false;
  bool operator==(const FracBound& o) const { return digits == o.digits && strict == o.strict; }
};

// Digit strings F with lo <= 0.F <= hi (each side optional, < where strict):
// `ne` the regex of the non-empty ones (nullopt: none), `eps` whether F = "" is in.
struct FracLang {
  std::optional<std::string> ne;
  bool eps = false;
};

std::string Optional(const FracLang& l) { return l.eps ? absl::StrCat("(?:", *l.ne, ")?") : *l.ne; }

FracLang FracRange(std::optional<FracBound> lo, const std::optional<FracBound>& hi) {
  if (lo && lo->digits.empty() && !lo->strict) lo.reset();  // >= 0: no constraint
  // Base cases, where a bound is 0 (an empty digit string).
  if (hi && hi->digits.empty()) {
    if (hi->strict || lo) return {};  // < 0, or <= 0 and > 0
    return {"0+", true};
  }
  if (!lo && !hi) return {"[0-9]+", true};
  if (lo && lo->digits.empty() && !hi) return {"[0-9]*[1-9][0-9]*", false};
  // The first digit d decides each side: past the bound's digit the side holds
  // whatever follows, on it the rest is compared with the bound's rest, short of
  // it (beyond it for hi) nothing follows.
  struct Next {
    bool fail = false;
    std::optional<FracBound> lo, hi;
    bool operator==(const Next& o) const { return fail == o.fail && lo == o.lo && hi == o.hi; }
  };
  auto next = [&](int d) {
    Next n;
    if (lo) {
      const int a = lo->digits.empty() ? 0 : lo->digits[0] - '0';
      if (d < a) n.fail = true;
      if (d == a) n.lo = FracBound{lo->digits.empty() ? "" : lo->digits.substr(1), lo->strict};
    }
    if (hi) {
      const int b = hi->digits[0] - '0';
      if (d > b) n.fail = true;
      if (d == b) n.hi = FracBound{hi->digits.substr(1), hi->strict};
    }
    return n;
  };
  std::vector<std::string> alts;
  for (int d = 0; d <= 9;) {
    const Next n = next(d);
    int e = d;
    while (e < 9 && next(e + 1) == n) ++e;
    if (!n.fail) {
      const FracLang rest = FracRange(n.lo, n.hi);
      const std::string cls =
          d == e ? std::string(1, static_cast<char>('0' + d)) : absl::StrCat("[", d, "-", e, "]");
      if (rest.ne) alts.push_back(cls + Optional(rest));
      if (!rest.ne && rest.eps) alts.push_back(cls);
    }
    d = e + 1;
  }
  FracLang out;
  out.eps = !lo;  // 0 >= lo fails for any lo left; 0 <= hi holds (hi > 0 here)
  if (!alts.empty()) out.ne = absl::StrCat("(?:", absl::StrJoin(alts, "|"), ")");
  return out;
}

// The regex of the part after the integer digits: "" and/or "." F.
std::optional<std::string> FracSuffix(const FracLang& l) {
  if (!l.ne) return l.eps ? std::optional<std::string>("") : std::nullopt;
  const std::string dotted = absl::StrCat("\\.", *l.ne);
  return l.eps ? absl::StrCat("(?:", dotted, ")?") : dotted;
}

// Regexes of the magnitudes I(.F)? (no sign) m with lo <= m (<= hi); lo >= 0.
void MagnitudeRange(const NumBound& lo, const std::optional<NumBound>& hi,
                    std::vector<std::string>& parts) {
  const int64_t li = std::stoll(lo.value.int_part);
  const int64_t hi_i = hi ? std::stoll(hi->value.int_part) : -1;
  const FracBound lof{lo.value.frac, lo.strict};
  std::optional<FracBound> hif;
  if (hi) hif = FracBound{hi->value.frac, hi->strict};
  auto add = [&](const std::string& int_part, const FracLang& l) {
    if (auto suffix = FracSuffix(l)) parts.push_back(int_part + *suffix);
  };
  if (hi && li > hi_i) return;
  if (hi && li == hi_i) {
    add(lo.value.int_part, FracRange(lof, hif));
    return;
  }
  add(lo.value.int_part, FracRange(lof, std::nullopt));
  if (!hi || hi_i - 1 >= li + 1) {
    parts.push_back(NonNegativeRange(li + 1, hi ? hi_i - 1 : -1) + "(?:\\.[0-9]+)?");
  }
  if (hi) add(hi->value.int_part, FracRange(std::nullopt, hif));
}

// The regex of the numbers x, written -?I(.F)?, with lo <= x <= hi (< where strict).
std::string NumberRangeRegex(const std::optional<NumBound>& lo, const std::optional<NumBound>& hi) {
  auto abs_of = [](const NumBound& b) {
    NumBound a = b;
    a.value.neg = false;
    return a;
  };
  std::vector<std::string> parts;
  // x = m >= 0, written without a sign.
  if (!hi || !hi->value.neg) {
    MagnitudeRange(lo && !lo->value.neg ? *lo : NumBound{}, hi, parts);
  }
  // x = -m, written with "-" (m = 0 included: "-0" is 0): -hi <= m <= -lo.
  if (!lo || lo->value.neg || lo->value.zero()) {
    std::vector<std::string> neg;
    const bool hi_le0 = hi && (hi->value.neg || hi->value.zero());
    std::optional<NumBound> m_hi;
    if (lo) m_hi = abs_of(*lo);
    MagnitudeRange(hi_le0 ? abs_of(*hi) : NumBound{}, m_hi, neg);
    if (!neg.empty()) parts.push_back(absl::StrCat("-(?:", absl::StrJoin(neg, "|"), ")"));
  }
  return absl::StrJoin(parts, "|");
}

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, GrammarBuilder& b) : root_(root), b_(b) {}

  absl::StatusOr<int32_t> Compile(const json& s, const std::string& path) {
    if (b_.over_limit()) return TooLarge();
    if (++depth_ > 200) return Error(path, "schema nested too deeply");
    auto r = CompileInner(s, path);
    --depth_;
    return r;
  }

  GrammarBuilder& builder() { return b_; }

  // Rules shared by every schema.
  int32_t AnyValue() {
    if (any_value_ >= 0) return any_value_;
    any_value_ = b_.NewRule();
    const int32_t obj = AnyObjectOf(any_value_);
    const int32_t arr = ArrayOf(any_value_, 0, -1, {}, any_value_);
    Seq t, f, n;
    b_.AppendLiteral(t, "true");
    b_.AppendLiteral(f, "false");
    b_.AppendLiteral(n, "null");
    for (const Seq& s :
         {Seq{Ref(obj)}, Seq{Ref(arr)}, Seq{Ref(String())}, Seq{Ref(Number())}, t, f, n}) {
      b_.AddAlt(any_value_, s);
    }
    return any_value_;
  }

  int32_t AnyObjectOf(int32_t value_rule) {
    // "{" (member ("," member)*)? "}"
    Seq member{Ref(String()), b_.Byte(':'), Ref(value_rule)};
    Seq more{b_.Byte(',')};
    more.insert(more.end(), member.begin(), member.end());
    Seq body = member;
    body.push_back(Ref(b_.Star(more)));
    return b_.Alternatives({Seq{b_.Byte('{'), Ref(b_.Optional(body)), b_.Byte('}')}});
  }

 private:
  static Element Ref(int32_t r) { return GrammarBuilder::Ref(r); }

  absl::Status Error(const std::string& path, const std::string& what) const {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " at ", path.empty() ? std::string("#") : path));
  }
  absl::Status TooLarge() const {
    return absl::InvalidArgumentError(absl::StrCat(
        "constraint too large: its automaton would exceed ", Grammar::kMaxElements, " elements"));
  }

  int32_t String() {
    if (string_ >= 0) return string_;
    // char ::= [unescaped] | "\" (["\/bfnrt] | "u" hex{4})
    CodepointSet plain = Complement({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}});
    Seq ch = CharClassSeq(b_, plain, CharEncoding::kRaw);
    ByteSet esc, hex;
    for (char c : std::string("\"\\/bfnrt")) esc.set(static_cast<uint8_t>(c));
    for (char c : std::string("0123456789abcdefABCDEF")) hex.set(static_cast<uint8_t>(c));
    const Element h = b_.Bytes(hex);
    const int32_t chr = b_.Alternatives(
        {ch, Seq{b_.Byte('\\'), b_.Bytes(esc)}, Seq{b_.Byte('\\'), b_.Byte('u'), h, h, h, h}});
    string_char_ = chr;
    string_ = b_.Alternatives({Seq{b_.Byte('"'), Ref(b_.Star({Ref(chr)})), b_.Byte('"')}});
    return string_;
  }

  int32_t IntegerPart() {
    ByteSet d19, d09;
    for (int c = '1'; c <= '9'; ++c) d19.set(c);
    for (int c = '0'; c <= '9'; ++c) d09.set(c);
    const int32_t digits = b_.Star({b_.Bytes(d09)});
    const int32_t mag = b_.Alternatives({Seq{b_.Byte('0')}, Seq{b_.Bytes(d19), Ref(digits)}});
    return b_.Alternatives({Seq{b_.Byte('-'), Ref(mag)}, Seq{Ref(mag)}});
  }

  int32_t Integer() {
    if (integer_ < 0) integer_ = IntegerPart();
    return integer_;
  }

  int32_t Number() {
    if (number_ >= 0) return number_;
    ByteSet d09, e, sign;
    for (int c = '0'; c <= '9'; ++c) d09.set(c);
    e.set('e');
    e.set('E');
    sign.set('+');
    sign.set('-');
    const Element d = b_.Bytes(d09);
    const int32_t digits1 = b_.Alternatives({Seq{d, Ref(b_.Star({d}))}});
    const int32_t frac = b_.Optional({b_.Byte('.'), Ref(digits1)});
    const int32_t exp =
        b_.Optional({b_.Bytes(e), Ref(b_.Optional({b_.Bytes(sign)})), Ref(digits1)});
    number_ = b_.Alternatives({Seq{Ref(Integer()), Ref(frac), Ref(exp)}});
    return number_;
  }

  // "[" elements "]" where element i has schema rule slot(i): prefix[i] for
  // i < prefix.size(), else `items` (-1 = no more elements allowed).
  int32_t ArrayOf(int32_t items, int64_t min, int64_t max, const std::vector<int32_t>& prefix,
                  int32_t /*unused*/) {
    const auto k = static_cast<int64_t>(prefix.size());
    if (items < 0) max = max < 0 ? k : std::min(max, k);
    if (max >= 0 && min > max) return b_.Alternatives({Seq{b_.Bytes(ByteSet())}});  // empty
    auto slot = [&](int64_t i) { return i < k ? prefix[i] : items; };
    if (max == 0) return b_.Alternatives({Seq{b_.Byte('['), b_.Byte(']')}});
    const int64_t top = max >= 0 ? max : std::max<int64_t>({k, min, 1});
    // rest(i): elements i.. each preceded by ",".
    int32_t rest = max >= 0 ? b_.Alternatives({Seq{}}) : b_.Star({b_.Byte(','), Ref(slot(top))});
    for (int64_t i = top - 1; i >= 1 && !b_.over_limit(); --i) {
      Seq elem{b_.Byte(','), Ref(slot(i)), Ref(rest)};
      rest = i >= min ? b_.Optional(elem) : b_.Alternatives({elem});
    }
    Seq first{Ref(slot(0)), Ref(rest)};
    const int32_t body = min == 0 ? b_.Optional(first) : b_.Alternatives({first});
    return b_.Alternatives({Seq{b_.Byte('['), Ref(body), b_.Byte(']')}});
  }

  absl::StatusOr<int32_t> CompileInner(const json& s, const std::string& path);
  absl::StatusOr<int32_t> CompileRef(const std::string& ref, const std::string& path);
  absl::StatusOr<int32_t> CompileLiterals(const json& values, const json& s,
                                          const std::string& path);
  absl::StatusOr<int32_t> CompileType(const std::string& type, const json& s,
                                      const std::string& path);
  absl::StatusOr<int32_t> CompileString(const json& s, const std::string& path);
  absl::StatusOr<int32_t> CompileInteger(const json& s, const std::string& path);
  absl::StatusOr<int32_t> CompileNumber(const json& s, const std::string& path);
  absl::StatusOr<int32_t> CompileObject(const json& s, const std::string& path);
  absl::StatusOr<int32_t> CompileArray(const json& s, const std::string& path);
  absl::StatusOr<int32_t> CompileBranches(const json& list, const std::string& key,
                                          const std::string& path);
  absl::StatusOr<int64_t> NonNegative(const json& s, const char* key, const std::string& path,
                                      int64_t dflt);

  // The schema a "#..." reference points to; nullptr when it does not resolve.
  const json* ResolveRef(const std::string& ref) const;
  // `s` with $ref and one-element allOf followed; nullptr when a reference does
  // not resolve or the chain is longer than 32.
  const json* Deref(const json& s) const;
  // The JSON types ("number" standing for integer too) some instance valid
  // under `s` may have: an over-approximation.
  std::set<std::string> BaseTypes(const json& s, int depth) const;
  // True only when no JSON value is valid under both `a` and `b` (a sound,
  // incomplete proof; `budget` bounds the work, false once spent).
  bool Disjoint(const json& a, const json& b, int depth, int& budget) const;
  bool DisjointAs(const std::string& type, const json& a, const json& b, int depth,
                  int& budget) const;

  const json& root_;
  GrammarBuilder& b_;
  std::map<std::string, int32_t> refs_;
  int any_value_ = -1, string_ = -1, string_char_ = -1, integer_ = -1, number_ = -1;
  int depth_ = 0;
};

absl::StatusOr<int64_t> SchemaCompiler::NonNegative(const json& s, const char* key,
                                                    const std::string& path, int64_t dflt) {
  if (!s.contains(key)) return dflt;
  const json& v = s[key];
  if (!v.is_number() || v.get<double>() < 0 || v.get<double>() != std::floor(v.get<double>()) ||
      v.get<double>() > 1e9) {
    return Error(path, absl::StrCat("'", key, "' must be a non-negative integer"));
  }
  return v.get<int64_t>();
}

absl::StatusOr<int32_t> SchemaCompiler::CompileInner(const json& s, const std::string& path) {
  if (s.is_boolean()) {
    if (s.get<bool>()) return AnyValue();
    return b_.Alternatives({Seq{b_.Bytes(ByteSet())}});  // false: nothing matches
  }
  if (!s.is_object()) return Error(path, "a schema must be an object or a boolean");
  if (!path.empty() && s.contains("$id")) {
    // A nested $id changes the base URI of the references below it.
    return Error(path, "unsupported JSON Schema keyword '$id' below the root");
  }
  std::vector<std::string> constraining;
  for (const auto& [k, v] : s.items()) {
    if (!Annotations().count(k)) constraining.push_back(k);
  }
  auto only = [&](const std::set<std::string>& allowed) -> absl::Status {
    for (const std::string& k : constraining) {
      if (!allowed.count(k)) {
        return Error(path, absl::StrCat("unsupported JSON Schema keyword '", k, "' beside '",
                                        *allowed.begin(), "'"));
      }
    }
    return absl::OkStatus();
  };
  if (s.contains("$ref")) {
    if (absl::Status st = only({"$ref"}); !st.ok()) return st;
    if (!s["$ref"].is_string()) return Error(path, "'$ref' must be a string");
    return CompileRef(s["$ref"].get<std::string>(), path);
  }
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    if (!s.contains(key)) continue;
    if (absl::Status st = only({key}); !st.ok()) return st;
    if (std::string(key) == "allOf") {
      if (!s[key].is_array() || s[key].size() != 1) {
        return Error(path, "unsupported JSON Schema keyword 'allOf' (with more than one schema)");
      }
      return Compile(s[key][0], path + "/allOf/0");
    }
    return CompileBranches(s[key], key, path);
  }
  if (s.contains("enum") || s.contains("const")) {
    if (absl::Status st = only({s.contains("enum") ? "enum" : "const", "type"}); !st.ok())
      return st;
    if (s.contains("enum") && s.contains("const"))
      return Error(path, "unsupported: both 'enum' and 'const'");
    json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
    if (!values.is_array()) return Error(path, "'enum' must be an array");
    return CompileLiterals(values, s, path);
  }
  std::vector<std::string> types;
  if (s.contains("type")) {
    const json& t = s["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array() && !t.empty()) {
      for (const json& x : t) {
        if (!x.is_string()) return Error(path, "'type' entries must be strings");
        types.push_back(x.get<std::string>());
      }
    } else {
      return Error(path, "'type' must be a string or a non-empty array");
    }
  } else {
    types.assign(std::begin(kAllTypes), std::end(kAllTypes));
  }
  // Every keyword must belong to one of the JSON Schema types (any type when
  // `type` is absent: keywords of other types do not apply then).
  for (const std::string& k : constraining) {
    if (k == "type") continue;
    bool known = false;
    for (const char* t : kAllTypes)
      known = known || TypeKeywords(t).count(k) || TypeKeywords("integer").count(k);
    if (!known) return Error(path, absl::StrCat("unsupported JSON Schema keyword '", k, "'"));
  }
  std::vector<Seq> alts;
  const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
  for (const std::string& t : types) {
    if (t == "integer" && has_number) continue;  // number covers it
    if (!std::count(std::begin(kAllTypes), std::end(kAllTypes), t) && t != "integer") {
      return Error(path, absl::StrCat("unknown type '", t, "'"));
    }
    auto r = CompileType(t, s, path);
    if (!r.ok()) return r.status();
    alts.push_back({Ref(*r)});
  }
  return b_.Alternatives(alts);
}

absl::StatusOr<int32_t> SchemaCompiler::CompileBranches(const json& list, const std::string& key,
                                                        const std::string& path) {
  if (!list.is_array() || list.empty())
    return Error(path, absl::StrCat("'", key, "' must be a non-empty array"));
  if (key == "oneOf") {
    // oneOf is compiled as the union of its branches, which is exact only when
    // no instance is valid under two of them: that must be proved, or refused.
    int budget = 100000;
    for (size_t i = 0; i < list.size(); ++i) {
      for (size_t j = i + 1; j < list.size(); ++j) {
        if (Disjoint(list[i], list[j], 0, budget)) continue;
        return Error(path,
                     absl::StrCat("unsupported 'oneOf': branches ", i, " and ", j,
                                  " may both match one instance (oneOf is supported where its "
                                  "branches are provably exclusive: different types, different "
                                  "const/enum values, or a required property or array item whose "
                                  "schemas are exclusive; use anyOf to allow overlaps)"));
      }
    }
  }
  std::vector<Seq> alts;
  for (size_t i = 0; i < list.size(); ++i) {
    auto r = Compile(list[i], absl::StrCat(path, "/", key, "/", i));
    if (!r.ok()) return r.status();
    alts.push_back({Ref(*r)});
  }
  return b_.Alternatives(alts);
}

absl::StatusOr<int32_t> SchemaCompiler::CompileRef(const std::string& ref,
                                                   const std::string& path) {
  if (ref.empty() || ref[0] != '#') {
    return Error(path,
                 absl::StrCat("unsupported '$ref' \"", ref, "\" (only local references \"#...\")"));
  }
  if (auto it = refs_.find(ref); it != refs_.end()) return it->second;
  const json* target = ResolveRef(ref);
  if (target == nullptr) return Error(path, absl::StrCat("'$ref' \"", ref, "\" does not resolve"));
  const int32_t rule = b_.NewRule();
  refs_[ref] = rule;
  auto r = Compile(*target, ref);
  if (!r.ok()) return r.status();
  b_.AddAlt(rule, {Ref(*r)});
  return rule;
}

const json* SchemaCompiler::ResolveRef(const std::string& ref) const {
  if (ref.empty() || ref[0] != '#') return nullptr;
  const std::string pointer = ref.substr(1);
  std::string decoded;  // percent-decoding of the fragment
  for (size_t i = 0; i < pointer.size(); ++i) {
    if (pointer[i] == '%' && i + 2 < pointer.size() &&
        std::isxdigit(static_cast<unsigned char>(pointer[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(pointer[i + 2]))) {
      decoded += static_cast<char>(std::stoi(pointer.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else {
      decoded += pointer[i];
    }
  }
  try {
    return &root_.at(json::json_pointer(decoded));
  } catch (const json::exception&) {
    return nullptr;
  }
}

const json* SchemaCompiler::Deref(const json& s) const {
  const json* p = &s;
  for (int hops = 0; hops < 32; ++hops) {
    if (p->is_object() && p->contains("$ref") && (*p)["$ref"].is_string()) {
      p = ResolveRef((*p)["$ref"].get<std::string>());
      if (p == nullptr) return nullptr;
    } else if (p->is_object() && p->contains("allOf") && (*p)["allOf"].is_array() &&
               (*p)["allOf"].size() == 1) {
      p = &(*p)["allOf"][0];
    } else {
      return p;
    }
  }
  return nullptr;
}

// The base type of a JSON value ("number" for integers too).
std::string BaseTypeOf(const json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  if (v.is_array()) return "array";
  return "number";
}

// The values `s` lists in enum/const (with their `type` applied as
// CompileLiterals does) of base type `type`; nullopt when `s` lists none.
std::optional<std::vector<json>> Literals(const json& s, const std::string& type) {
  if (!s.is_object() || !(s.contains("enum") || s.contains("const"))) return std::nullopt;
  const json values = s.contains("const") ? json::array({s["const"]}) : s["enum"];
  if (!values.is_array()) return std::nullopt;
  std::vector<json> out;
  for (const json& v : values) {
    if (BaseTypeOf(v) == type) out.push_back(v);
  }
  return out;
}

// JSON Schema equality: numbers by value, object members in any order.
bool JsonEqual(const json& a, const json& b) {
  return nlohmann::json::parse(a.dump()) == nlohmann::json::parse(b.dump());
}

// The schema of member `name` of an object valid under `s` (an object schema).
const json& MemberSchema(const json& s, const std::string& name) {
  static const json* const kTrue = new json(true);
  if (!s.is_object()) return *kTrue;
  if (s.contains("properties") && s["properties"].is_object() && s["properties"].contains(name))
    return s["properties"][name];
  if (s.contains("additionalProperties")) return s["additionalProperties"];
  return *kTrue;
}

// The schema of element `i` of an array valid under `s` (an array schema).
const json& ItemSchema(const json& s, size_t i) {
  static const json* const kTrue = new json(true);
  if (!s.is_object()) return *kTrue;
  if (s.contains("prefixItems") && s["prefixItems"].is_array() && i < s["prefixItems"].size())
    return s["prefixItems"][i];
  if (s.contains("items")) return s["items"];
  return *kTrue;
}

int64_t Count(const json& s, const char* key, int64_t dflt) {
  if (!s.is_object() || !s.contains(key) || !s[key].is_number_unsigned()) return dflt;
  return static_cast<int64_t>(std::min<uint64_t>(s[key].get<uint64_t>(), 1u << 30));
}

std::set<std::string> SchemaCompiler::BaseTypes(const json& schema, int depth) const {
  const std::set<std::string> all(std::begin(kAllTypes), std::end(kAllTypes));
  const json* s = Deref(schema);
  if (s == nullptr || depth > 32) return all;
  if (s->is_boolean()) return s->get<bool>() ? all : std::set<std::string>{};
  if (!s->is_object()) return all;
  for (const char* key : {"anyOf", "oneOf"}) {
    if (!s->contains(key) || !(*s)[key].is_array()) continue;
    std::set<std::string> out;
    for (const json& branch : (*s)[key]) out.merge(BaseTypes(branch, depth + 1));
    return out;
  }
  std::set<std::string> declared = all;
  if (s->contains("type")) {
    declared.clear();
    const json& t = (*s)["type"];
    for (const json& x : t.is_array() ? t : json::array({t})) {
      if (!x.is_string()) return all;
      declared.insert(x.get<std::string>() == "integer" ? "number" : x.get<std::string>());
    }
  }
  if (!s->contains("enum") && !s->contains("const")) return declared;
  std::set<std::string> listed;
  for (const char* t : kAllTypes) {
    const auto values = Literals(*s, t);
    if (!values || (declared.count(t) && !values->empty())) listed.insert(t);
  }
  return listed;
}

bool SchemaCompiler::Disjoint(const json& a_in, const json& b_in, int depth, int& budget) const {
  if (--budget < 0 || depth > 32) return false;
  const json* a = Deref(a_in);
  const json* b = Deref(b_in);
  if (a == nullptr || b == nullptr) return false;
  for (const json* s : {a, b}) {
    if (s->is_boolean() && !s->get<bool>()) return true;
  }
  // A union is exclusive of b when each of its branches is.
  for (auto [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!x->is_object() || !x->contains(key) || !(*x)[key].is_array()) continue;
      for (const json& branch : (*x)[key]) {
        if (!Disjoint(branch, *y, depth + 1, budget)) return false;
      }
      return true;
    }
  }
  const std::set<std::string> ta = BaseTypes(*a, depth), tb = BaseTypes(*b, depth);
  for (const std::string& t : ta) {
    if (tb.count(t) && !DisjointAs(t, *a, *b, depth, budget)) return false;
  }
  return true;
}

bool SchemaCompiler::DisjointAs(const std::string& type, const json& a, const json& b, int depth,
                                int& budget) const {
  const auto la = Literals(a, type), lb = Literals(b, type);
  if (la && lb) {
    for (const json& x : *la) {
      for (const json& y : *lb) {
        if (JsonEqual(x, y)) return false;
      }
    }
    return true;
  }
  if (la || lb) return false;  // a listed value may be valid under the other: not checked
  if (type == "object") {
    // A member required by either must be valid under both member schemas.
    for (const json* s : {&a, &b}) {
      if (!s->is_object() || !s->contains("required") || !(*s)["required"].is_array()) continue;
      for (const json& name : (*s)["required"]) {
        if (!name.is_string()) continue;
        const std::string n = name.get<std::string>();
        if (Disjoint(MemberSchema(a, n), MemberSchema(b, n), depth + 1, budget)) return true;
      }
    }
    return false;
  }
  if (type == "array") {
    const int64_t min_a = Count(a, "minItems", 0), max_a = Count(a, "maxItems", -1);
    const int64_t min_b = Count(b, "minItems", 0), max_b = Count(b, "maxItems", -1);
    if ((max_a >= 0 && max_a < min_b) || (max_b >= 0 && max_b < min_a)) return true;
    // Elements every instance of both has.
    for (int64_t i = 0; i < std::min<int64_t>(std::max(min_a, min_b), 64); ++i) {
      if (Disjoint(ItemSchema(a, static_cast<size_t>(i)), ItemSchema(b, static_cast<size_t>(i)),
                   depth + 1, budget)) {
        return true;
      }
    }
    return false;
  }
  return false;
}

absl::StatusOr<int32_t> SchemaCompiler::CompileLiterals(const json& values, const json& s,
                                                        const std::string& path) {
  std::set<std::string> types;
  if (s.contains("type")) {
    const json& t = s["type"];
    if (t.is_string()) types.insert(t.get<std::string>());
    if (t.is_array()) {
      for (const json& x : t) {
        if (x.is_string()) types.insert(x.get<std::string>());
      }
    }
  }
  auto type_ok = [&](const json& v) {
    if (types.empty()) return true;
    if (v.is_null()) return types.count("null") > 0;
    if (v.is_boolean()) return types.count("boolean") > 0;
    if (v.is_string()) return types.count("string") > 0;
    if (v.is_object()) return types.count("object") > 0;
    if (v.is_array()) return types.count("array") > 0;
    if (v.is_number_integer() ||
        (v.is_number_float() && v.get<double>() == std::floor(v.get<double>()))) {
      if (types.count("integer")) return true;
    }
    return types.count("number") > 0;
  };
  std::vector<Seq> alts;
  for (const json& v : values) {
    if (!type_ok(v)) continue;
    Seq seq;
    b_.AppendLiteral(seq, v.dump());
    alts.push_back(std::move(seq));
  }
  if (alts.empty()) alts.push_back({b_.Bytes(ByteSet())});
  return b_.Alternatives(alts);
}

absl::StatusOr<int32_t> SchemaCompiler::CompileType(const std::string& t, const json& s,
                                                    const std::string& path) {
  if (t == "null")
    return b_.Alternatives({[&] {
      Seq q;
      b_.AppendLiteral(q, "null");
      return q;
    }()});
  if (t == "boolean") {
    Seq a, c;
    b_.AppendLiteral(a, "true");
    b_.AppendLiteral(c, "false");
    return b_.Alternatives({a, c});
  }
  if (t == "number") return CompileNumber(s, path);
  if (t == "integer") return CompileInteger(s, path);
  if (t == "string") return CompileString(s, path);
  if (t == "object") return CompileObject(s, path);
  return CompileArray(s, path);
}

absl::StatusOr<int32_t> SchemaCompiler::CompileString(const json& s, const std::string& path) {
  auto min = NonNegative(s, "minLength", path, 0);
  if (!min.ok()) return min.status();
  auto max = NonNegative(s, "maxLength", path, -1);
  if (!max.ok()) return max.status();
  const bool lengths = s.contains("minLength") || s.contains("maxLength");
  std::string regex;
  if (s.contains("format")) {
    if (!s["format"].is_string()) return Error(path, "'format' must be a string");
    const std::string f = s["format"].get<std::string>();
    const std::string date = R"(\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01]))";
    const std::string time =
        R"((?:[01]\d|2[0-3]):[0-5]\d:(?:[0-5]\d|60)(?:\.\d+)?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d))";
    if (f == "date")
      regex = "^" + date + "$";
    else if (f == "time")
      regex = "^" + time + "$";
    else if (f == "date-time")
      regex = "^" + date + "[Tt]" + time + "$";
    else if (f == "uuid")
      regex = R"(^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$)";
    else if (f == "email")
      regex = R"(^[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+$)";
    else if (f == "ipv4")
      regex =
          R"(^(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)$)";
    else
      return Error(path, absl::StrCat("unsupported JSON Schema format '", f, "'"));
  }
  if (s.contains("pattern")) {
    if (!regex.empty()) return Error(path, "unsupported: both 'pattern' and 'format'");
    if (!s["pattern"].is_string()) return Error(path, "'pattern' must be a string");
    regex = s["pattern"].get<std::string>();
  }
  if (!regex.empty() && lengths) {
    return Error(path, "unsupported: 'minLength'/'maxLength' together with 'pattern' or 'format'");
  }
  if (!regex.empty()) {
    auto seq = CompileRegex(b_, regex, CharEncoding::kJson, /*search=*/true);
    if (!seq.ok()) return Error(path, absl::StrCat("in 'pattern': ", seq.status().message()));
    Seq q{b_.Byte('"')};
    q.insert(q.end(), seq->begin(), seq->end());
    q.push_back(b_.Byte('"'));
    return b_.Alternatives({q});
  }
  if (!lengths) return String();
  String();
  if (*max >= 0 && *max < *min) return b_.Alternatives({Seq{b_.Bytes(ByteSet())}});
  const int32_t chars =
      b_.Repeat({Ref(string_char_)}, static_cast<int>(*min), static_cast<int>(*max));
  if (b_.over_limit()) return TooLarge();
  return b_.Alternatives({Seq{b_.Byte('"'), Ref(chars), b_.Byte('"')}});
}

absl::StatusOr<int32_t> SchemaCompiler::CompileInteger(const json& s, const std::string& path) {
  constexpr double kLimit = 1e18;
  std::optional<double> lo, hi;
  for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
    if (!s.contains(k)) continue;
    if (!s[k].is_number()) return Error(path, absl::StrCat("'", k, "' must be a number"));
    const double v = s[k].get<double>();
    if (std::fabs(v) > kLimit)
      return Error(path, absl::StrCat("'", k, "' beyond +-1e18 is not supported"));
    const std::string key = k;
    if (key == "minimum") lo = std::max(lo.value_or(-kLimit * 10), std::ceil(v));
    if (key == "exclusiveMinimum") lo = std::max(lo.value_or(-kLimit * 10), std::floor(v) + 1);
    if (key == "maximum") hi = std::min(hi.value_or(kLimit * 10), std::floor(v));
    if (key == "exclusiveMaximum") hi = std::min(hi.value_or(kLimit * 10), std::ceil(v) - 1);
  }
  if (!lo && !hi) return Integer();
  if (lo && hi && *lo > *hi) return b_.Alternatives({Seq{b_.Bytes(ByteSet())}});
  // Non-negative part [max(lo,0), hi] and negative part [lo, min(hi,-1)].
  std::vector<std::string> parts;
  const bool any_neg = !lo || *lo < 0;
  const bool any_pos = !hi || *hi >= 0;
  if (any_pos) {
    const auto a = static_cast<int64_t>(lo ? std::max(*lo, 0.0) : 0.0);
    const int64_t z = hi ? static_cast<int64_t>(*hi) : -1;
    parts.push_back(NonNegativeRange(a, z));
  }
  if (any_neg) {
    // -x for x in [max(1, -hi), -lo]
    const auto a = static_cast<int64_t>(hi ? std::max(1.0, -*hi) : 1.0);
    const int64_t z = lo ? static_cast<int64_t>(-*lo) : -1;
    parts.push_back("-" + NonNegativeRange(a, z));
  }
  auto seq = CompileRegex(b_, absl::StrJoin(parts, "|"), CharEncoding::kRaw, /*search=*/false);
  if (!seq.ok()) return seq.status();
  return b_.Alternatives({*seq});
}

absl::StatusOr<int32_t> SchemaCompiler::CompileNumber(const json& s, const std::string& path) {
  constexpr double kLimit = 1e18;
  constexpr size_t kMaxFractionDigits = 30;
  std::optional<NumBound> lo, hi;
  for (const char* k : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
    if (!s.contains(k)) continue;
    const json& v = s[k];
    if (!v.is_number()) return Error(path, absl::StrCat("'", k, "' must be a number"));
    if (std::fabs(v.get<double>()) > kLimit)
      return Error(path, absl::StrCat("'", k, "' beyond +-1e18 is not supported"));
    // Integers exactly as written; a decimal as the shortest text that reads back
    // as the same double (what was written, up to 15 significant digits).
    std::string text = v.dump();
    if (v.is_number_float()) {
      char buf[64];
      const auto r =
          std::to_chars(buf, buf + sizeof buf, v.get<double>(), std::chars_format::scientific);
      text.assign(buf, r.ptr);
    }
    const NumBound b{ParseDecimal(text), std::string(k).rfind("exclusive", 0) == 0};
    if (b.value.frac.size() > kMaxFractionDigits) {
      return Error(path, absl::StrCat("'", k, "' with more than ", kMaxFractionDigits,
                                      " fraction digits is not supported"));
    }
    // Two lower (upper) bounds: the tighter one; at a tie the exclusive one.
    const bool lower = std::string(k).find("inimum") != std::string::npos;
    std::optional<NumBound>& slot = lower ? lo : hi;
    const int c = slot ? Compare(b.value, slot->value) : 0;
    if (!slot || (lower ? c > 0 : c < 0) || (c == 0 && b.strict)) slot = b;
  }
  if (!lo && !hi) return Number();
  const std::string regex = NumberRangeRegex(lo, hi);
  if (regex.empty()) return b_.Alternatives({Seq{b_.Bytes(ByteSet())}});  // no number
  auto seq = CompileRegex(b_, regex, CharEncoding::kRaw, /*search=*/false);
  if (!seq.ok()) return seq.status();
  if (b_.over_limit()) return TooLarge();
  return b_.Alternatives({*seq});
}

absl::StatusOr<int32_t> SchemaCompiler::CompileObject(const json& s, const std::string& path) {
  json props = s.value("properties", json::object());
  if (!props.is_object()) return Error(path, "'properties' must be an object");
  json additional = s.value("additionalProperties", json(true));
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) return Error(path, "'required' must be an array");
    for (const json& r : s["required"]) {
      if (!r.is_string()) return Error(path, "'required' entries must be strings");
      required.insert(r.get<std::string>());
    }
  }
  // Required names missing from `properties` take the additionalProperties schema.
  // A member whose schema is `false` may not appear: left out (the object is
  // unsatisfiable when it is required).
  std::vector<std::pair<std::string, json>> members;
  bool left_out = false;
  auto add_member = [&](const std::string& name, const json& sub) {
    if (sub.is_boolean() && !sub.get<bool>()) {
      left_out = true;
      return !required.count(name);
    }
    members.emplace_back(name, sub);
    return true;
  };
  for (const auto& [k, v] : props.items()) {
    if (!add_member(k, v)) return b_.Alternatives({Seq{b_.Bytes(ByteSet())}});
  }
  for (const std::string& r : required) {
    if (!props.contains(r) && !add_member(r, additional)) {
      return b_.Alternatives({Seq{b_.Bytes(ByteSet())}});
    }
  }
  if (members.empty() && left_out) {  // not any names: they could be the left-out ones
    return b_.Alternatives({Seq{b_.Byte('{'), b_.Byte('}')}});
  }
  if (members.empty()) {
    if (additional.is_boolean() && !additional.get<bool>()) {
      return b_.Alternatives({Seq{b_.Byte('{'), b_.Byte('}')}});
    }
    auto v = Compile(additional, path + "/additionalProperties");
    if (!v.ok()) return v.status();
    return AnyObjectOf(*v);
  }
  std::vector<Seq> member_seqs;
  std::vector<bool> optional;
  for (const auto& [name, sub] : members) {
    auto v = Compile(sub, absl::StrCat(path, "/properties/", name));
    if (!v.ok()) return v.status();
    Seq m;
    b_.AppendLiteral(m, json(name).dump() + ":");
    m.push_back(Ref(*v));
    member_seqs.push_back(std::move(m));
    optional.push_back(!required.count(name));
  }
  const size_t n = member_seqs.size();
  // tail[i]: members i.. each preceded by ",".
  std::vector<int32_t> tail(n + 1);
  tail[n] = b_.Alternatives({Seq{}});
  for (size_t i = n; i-- > 0;) {
    Seq with{b_.Byte(',')};
    with.insert(with.end(), member_seqs[i].begin(), member_seqs[i].end());
    with.push_back(Ref(tail[i + 1]));
    tail[i] =
        optional[i] ? b_.Alternatives({with, Seq{Ref(tail[i + 1])}}) : b_.Alternatives({with});
  }
  std::vector<Seq> firsts;
  for (size_t k = 0; k < n; ++k) {
    Seq f = member_seqs[k];
    f.push_back(Ref(tail[k + 1]));
    firsts.push_back(std::move(f));
    if (!optional[k]) break;
  }
  if (std::all_of(optional.begin(), optional.end(), [](bool o) { return o; })) firsts.push_back({});
  return b_.Alternatives({Seq{b_.Byte('{'), Ref(b_.Alternatives(firsts)), b_.Byte('}')}});
}

absl::StatusOr<int32_t> SchemaCompiler::CompileArray(const json& s, const std::string& path) {
  if (s.contains("uniqueItems") &&
      !(s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>())) {
    return Error(path, "unsupported JSON Schema keyword 'uniqueItems' (true)");
  }
  auto min = NonNegative(s, "minItems", path, 0);
  if (!min.ok()) return min.status();
  auto max = NonNegative(s, "maxItems", path, -1);
  if (!max.ok()) return max.status();
  std::vector<int32_t> prefix;
  if (s.contains("prefixItems")) {
    if (!s["prefixItems"].is_array()) return Error(path, "'prefixItems' must be an array");
    for (size_t i = 0; i < s["prefixItems"].size(); ++i) {
      auto r = Compile(s["prefixItems"][i], absl::StrCat(path, "/prefixItems/", i));
      if (!r.ok()) return r.status();
      prefix.push_back(*r);
    }
  }
  int32_t items = -1;
  const json item_schema = s.value("items", json(true));
  if (!(item_schema.is_boolean() && !item_schema.get<bool>())) {
    auto r = Compile(item_schema, path + "/items");
    if (!r.ok()) return r.status();
    items = *r;
  }
  const int32_t a = ArrayOf(items, *min, *max, prefix, 0);
  if (b_.over_limit()) return TooLarge();
  return a;
}

}  // namespace

absl::StatusOr<int32_t> AddJsonSchemaRules(GrammarBuilder& b, std::string_view schema_json) {
  json root = json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("the JSON schema is not valid JSON");
  SchemaCompiler c(root, b);
  return c.Compile(root, "");
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonSchema(std::string_view schema_json) {
  GrammarBuilder b;
  auto rule = AddJsonSchemaRules(b, schema_json);
  if (!rule.ok()) return rule.status();
  return b.Build(*rule);
}

absl::StatusOr<std::shared_ptr<const Grammar>> CompileJsonObject() {
  json root = json::object();
  GrammarBuilder b;
  SchemaCompiler c(root, b);
  const int32_t obj = c.AnyObjectOf(c.AnyValue());
  return b.Build(obj);
}

}  // namespace pagedserve::grammar
