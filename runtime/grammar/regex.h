// Regular expressions and character sets compiled into grammar rules
// (runtime/grammar/grammar.h).
//
// Supported syntax (the subset of Python `re` / ECMA-262 that constraint
// authors use): literals (UTF-8), `.` (any code point but "\n"), classes
// `[...]` / `[^...]` with ranges and escapes, `\d \w \s \D \W \S` (ASCII
// meanings, as ECMA-262 and re.ASCII), `\n \t \r \f \v \0 \xHH \uHHHH` and escaped
// punctuation, groups `(...)`, `(?:...)` and named `(?P<n>...)` / `(?<n>...)`,
// alternation `|`, quantifiers `* + ? {m} {m,} {m,n}` (a trailing lazy `?` is
// accepted and means nothing here: the constraint is the set of strings, not
// a search). `^` is accepted only at the very start and `$` only at the very
// end. Anything else (backreferences, lookaround, `\b`, inline flags,
// possessive quantifiers, POSIX classes) is InvalidArgument naming it.
//
// Two encodings of the matched characters:
//   kRaw   the UTF-8 bytes of the string (guided_regex: the whole output);
//   kJson  the characters as they appear inside a JSON string literal: `"`,
//          `\` and control characters as JSON escapes (\", \\, \b \f \n \r \t,
//          else \u00xx lowercase, as Python's json.dumps), everything else as
//          UTF-8 (JSON Schema `pattern` inside a string value).
#ifndef PAGEDSERVE_RUNTIME_GRAMMAR_REGEX_H_
#define PAGEDSERVE_RUNTIME_GRAMMAR_REGEX_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/grammar/grammar.h"

namespace pagedserve::grammar {

enum class CharEncoding { kRaw, kJson };

// The UTF-8 encoding of Unicode scalar value `cp`.
std::string EncodeUtf8(uint32_t cp);
// The code point at s[*pos], *pos moved past it; nullopt (and *pos unchanged)
// for invalid or truncated UTF-8.
std::optional<uint32_t> DecodeUtf8(std::string_view s, size_t* pos);
// `digits` hex digits at s[*pos], *pos moved past them; nullopt (unchanged)
// when fewer remain or one is not a hex digit.
std::optional<uint32_t> ParseHex(std::string_view s, size_t* pos, int digits);

// A set of Unicode scalar values as sorted, disjoint, non-adjacent closed ranges.
using CodepointSet = std::vector<std::pair<uint32_t, uint32_t>>;

CodepointSet Normalize(CodepointSet set);
CodepointSet Complement(const CodepointSet& set);  // within [0, 0x10FFFF] minus surrogates
inline CodepointSet AnyCodepoint() { return Complement({}); }

// A sequence matching exactly one character of `set` in `encoding`.
GrammarBuilder::Seq CharClassSeq(GrammarBuilder& b, const CodepointSet& set, CharEncoding encoding);

// A sequence matching the regex. With `search` (JSON Schema `pattern`), the
// regex matches anywhere in the string unless anchored by ^ / $; without it,
// the whole string must match (Python re.fullmatch).
absl::StatusOr<GrammarBuilder::Seq> CompileRegex(GrammarBuilder& b, std::string_view pattern,
                                                 CharEncoding encoding, bool search);

}  // namespace pagedserve::grammar

#endif  // PAGEDSERVE_RUNTIME_GRAMMAR_REGEX_H_
