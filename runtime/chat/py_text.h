// Python's str semantics over UTF-8: code points, whitespace, case mapping and
// the str methods chat templates call (strip, split, splitlines, replace,
// title, capitalize ...), written to give the results CPython gives.
//
// Decoding maps a byte that is not part of valid UTF-8 to U+DC80..U+DCFF and
// encoding maps those back (Python's surrogateescape), so every byte string
// round-trips. Case mapping is Unicode's simple mapping (glibc's C.UTF-8
// tables) plus the one full mapping templates meet (ß upper-cases to SS).
#ifndef PAGEDSERVE_RUNTIME_CHAT_PY_TEXT_H_
#define PAGEDSERVE_RUNTIME_CHAT_PY_TEXT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace pagedserve::chat {

std::u32string DecodeUtf8(std::string_view s);
std::string EncodeUtf8(std::u32string_view s);
void AppendUtf8(char32_t c, std::string* out);
// len(s) in code points.
size_t CodePointCount(std::string_view s);
bool IsAscii(std::string_view s);

// str.isspace() of one code point.
bool IsPySpace(char32_t c);
// \w of Python's re (letters, digits, underscore).
bool IsWordChar(char32_t c);
bool IsCased(char32_t c);
bool IsUpperChar(char32_t c);
bool IsLowerChar(char32_t c);
bool IsAlphaChar(char32_t c);
bool IsDigitChar(char32_t c);

std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
std::string PyTitle(std::string_view s);
std::string PyCapitalize(std::string_view s);
std::string PySwapcase(std::string_view s);

// str.strip / lstrip / rstrip: whitespace when `chars` is nullopt.
std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right);
// str.split / rsplit: on runs of whitespace when `sep` is nullopt; maxsplit < 0 is unlimited.
// An empty separator is the caller's error (Python raises ValueError).
std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit);
std::vector<std::string> PyRSplit(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit);
// str.splitlines(keepends).
std::vector<std::string> PySplitLines(std::string_view s, bool keepends);
// str.replace(old, new, count); count < 0 replaces all.
std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl,
                      int64_t count);
// str.find / rfind / count over code point positions; -1 when absent.
int64_t PyFind(std::string_view s, std::string_view sub, bool reverse);
int64_t PyCount(std::string_view s, std::string_view sub);

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_PY_TEXT_H_
