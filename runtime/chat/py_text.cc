#include "runtime/chat/py_text.h"

#include <locale.h>
#include <wctype.h>

#include <algorithm>

namespace pagedserve::chat {
namespace {

constexpr char32_t kEscapeBase = 0xDC00;  // surrogateescape: byte b -> U+DC00 + b

// glibc's Unicode character tables (C.UTF-8); nullptr when the locale is missing,
// and then only ASCII is classified and case-mapped.
locale_t UnicodeLocale() {
  static locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  return loc;
}

// Length of the UTF-8 sequence at s[i] and its code point; 0 when invalid.
int DecodeOne(std::string_view s, size_t i, char32_t* out) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  int len;
  char32_t cp;
  if (b0 < 0x80) {
    *out = b0;
    return 1;
  } else if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    cp = b0 & 0x0F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    cp = b0 & 0x07;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b & 0x3F);
  }
  const bool overlong = (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
  if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  *out = cp;
  return len;
}

char32_t MapCase(char32_t c, bool upper) {
  if (c < 0x80) {
    if (upper && c >= 'a' && c <= 'z') return c - 32;
    if (!upper && c >= 'A' && c <= 'Z') return c + 32;
    return c;
  }
  locale_t loc = UnicodeLocale();
  if (loc == nullptr || (c >= 0xDC80 && c <= 0xDCFF)) return c;
  return static_cast<char32_t>(upper ? towupper_l(static_cast<wint_t>(c), loc)
                                     : towlower_l(static_cast<wint_t>(c), loc));
}

// Unicode's unconditional full case mappings (SpecialCasing.txt) that Python applies.
const char* SpecialUpper(char32_t c) {
  switch (c) {
    case 0xDF: return "SS";
    case 0x149: return "\u02BCN";
    case 0xFB00: return "FF";
    case 0xFB01: return "FI";
    case 0xFB02: return "FL";
    case 0xFB03: return "FFI";
    case 0xFB04: return "FFL";
    case 0xFB05:
    case 0xFB06: return "ST";
    default: return nullptr;
  }
}

const char* SpecialTitle(char32_t c) {
  switch (c) {
    case 0xDF: return "Ss";
    case 0x149: return "\u02BCN";
    case 0xFB00: return "Ff";
    case 0xFB01: return "Fi";
    case 0xFB02: return "Fl";
    case 0xFB03: return "Ffi";
    case 0xFB04: return "Ffl";
    case 0xFB05:
    case 0xFB06: return "St";
    default: return nullptr;
  }
}

void AppendUpper(char32_t c, std::string* out) {
  if (const char* special = SpecialUpper(c)) {
    out->append(special);
    return;
  }
  AppendUtf8(MapCase(c, true), out);
}

// Title case: the upper case, except for the Latin digraphs (DŽ Dž dž -> Dž ...).
void AppendTitle(char32_t c, std::string* out) {
  if (const char* special = SpecialTitle(c)) {
    out->append(special);
  } else if (c >= 0x1C4 && c <= 0x1CC) {
    AppendUtf8(0x1C5 + 3 * ((c - 0x1C4) / 3), out);
  } else if (c >= 0x1F1 && c <= 0x1F3) {
    AppendUtf8(0x1F2, out);
  } else {
    AppendUtf8(MapCase(c, true), out);
  }
}

// The lower case of s[i]: İ becomes i + combining dot, and a capital sigma
// ending a word becomes a final sigma (Python's Final_Sigma rule).
void AppendLower(const std::u32string& s, size_t i, std::string* out) {
  const char32_t c = s[i];
  if (c == 0x130) {
    out->append("i\u0307");
  } else if (c == 0x3A3) {
    const bool after_cased = i > 0 && IsCased(s[i - 1]);
    const bool before_cased = i + 1 < s.size() && IsCased(s[i + 1]);
    AppendUtf8(after_cased && !before_cased ? 0x3C2 : 0x3C3, out);
  } else {
    AppendUtf8(MapCase(c, false), out);
  }
}

bool InChars(char32_t c, const std::u32string& chars) {
  return chars.find(c) != std::u32string::npos;
}

bool IsLineBreak(char32_t c) {
  switch (c) {
    case '\n':
    case '\r':
    case 0x0B:
    case 0x0C:
    case 0x1C:
    case 0x1D:
    case 0x1E:
    case 0x85:
    case 0x2028:
    case 0x2029: return true;
    default: return false;
  }
}

std::vector<std::string> SplitWhitespace(std::string_view s, int64_t maxsplit) {
  const std::u32string u = DecodeUtf8(s);
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < u.size()) {
    while (i < u.size() && IsPySpace(u[i])) ++i;
    if (i == u.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      parts.push_back(EncodeUtf8(std::u32string_view(u).substr(i)));
      break;
    }
    size_t j = i;
    while (j < u.size() && !IsPySpace(u[j])) ++j;
    parts.push_back(EncodeUtf8(std::u32string_view(u).substr(i, j - i)));
    i = j;
  }
  return parts;
}

std::vector<std::string> RSplitWhitespace(std::string_view s, int64_t maxsplit) {
  const std::u32string u = DecodeUtf8(s);
  std::vector<std::string> parts;
  size_t end = u.size();
  while (end > 0) {
    while (end > 0 && IsPySpace(u[end - 1])) --end;
    if (end == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      parts.push_back(EncodeUtf8(std::u32string_view(u).substr(0, end)));
      break;
    }
    size_t start = end;
    while (start > 0 && !IsPySpace(u[start - 1])) --start;
    parts.push_back(EncodeUtf8(std::u32string_view(u).substr(start, end - start)));
    end = start;
  }
  std::reverse(parts.begin(), parts.end());
  return parts;
}

}  // namespace

void AppendUtf8(char32_t c, std::string* out) {
  if (c >= 0xDC80 && c <= 0xDCFF) {
    out->push_back(static_cast<char>(c - kEscapeBase));
  } else if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::u32string DecodeUtf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    char32_t c;
    const int len = DecodeOne(s, i, &c);
    if (len == 0) {
      out.push_back(kEscapeBase + static_cast<unsigned char>(s[i]));
      ++i;
    } else {
      out.push_back(c);
      i += len;
    }
  }
  return out;
}

std::string EncodeUtf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendUtf8(c, &out);
  return out;
}

size_t CodePointCount(std::string_view s) {
  if (IsAscii(s)) return s.size();
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    char32_t c;
    const int len = DecodeOne(s, i, &c);
    i += len == 0 ? 1 : len;
  }
  return n;
}

bool IsAscii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return (c & 0x80) == 0; });
}

bool IsPySpace(char32_t c) {
  if (c <= 0x20) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  switch (c) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000: return true;
    default: return c >= 0x2000 && c <= 0x200A;
  }
}

bool IsWordChar(char32_t c) {
  if (c < 0x80)
    return c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z');
  return IsAlphaChar(c) || IsDigitChar(c);
}

bool IsCased(char32_t c) {
  return MapCase(c, true) != c || MapCase(c, false) != c || SpecialUpper(c) != nullptr;
}
bool IsUpperChar(char32_t c) { return MapCase(c, false) != c; }
bool IsLowerChar(char32_t c) { return MapCase(c, true) != c || SpecialUpper(c) != nullptr; }

bool IsAlphaChar(char32_t c) {
  if (c < 0x80) return (c | 0x20) >= 'a' && (c | 0x20) <= 'z';
  locale_t loc = UnicodeLocale();
  return loc != nullptr && !(c >= 0xDC80 && c <= 0xDCFF) && iswalpha_l(static_cast<wint_t>(c), loc);
}

bool IsDigitChar(char32_t c) { return c >= '0' && c <= '9'; }

std::string PyUpper(std::string_view s) {
  std::string out;
  for (char32_t c : DecodeUtf8(s)) AppendUpper(c, &out);
  return out;
}

std::string PyLower(std::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i) AppendLower(u, i, &out);
  return out;
}

std::string PySwapcase(std::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (IsUpperChar(u[i])) {
      AppendLower(u, i, &out);
    } else {
      AppendUpper(u[i], &out);
    }
  }
  return out;
}

std::string PyTitle(std::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  std::string out;
  bool previous_cased = false;
  for (size_t i = 0; i < u.size(); ++i) {
    if (previous_cased) {
      AppendLower(u, i, &out);
    } else {
      AppendTitle(u[i], &out);
    }
    previous_cased = IsCased(u[i]);
  }
  return out;
}

std::string PyCapitalize(std::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  std::string out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 0) {
      AppendTitle(u[i], &out);
    } else {
      AppendLower(u, i, &out);
    }
  }
  return out;
}

std::string PyStrip(std::string_view s, const std::optional<std::string>& chars, bool left,
                    bool right) {
  const std::u32string u = DecodeUtf8(s);
  const std::u32string set = chars ? DecodeUtf8(*chars) : std::u32string();
  auto strip = [&](char32_t c) { return chars ? InChars(c, set) : IsPySpace(c); };
  size_t begin = 0;
  size_t end = u.size();
  if (left) {
    while (begin < end && strip(u[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(u[end - 1])) --end;
  }
  return EncodeUtf8(std::u32string_view(u).substr(begin, end - begin));
}

std::vector<std::string> PySplit(std::string_view s, const std::optional<std::string>& sep,
                                 int64_t maxsplit) {
  if (!sep) return SplitWhitespace(s, maxsplit);
  std::vector<std::string> parts;
  size_t start = 0;
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    const size_t pos = s.find(*sep, start);
    if (pos == std::string_view::npos) break;
    parts.emplace_back(s.substr(start, pos - start));
    start = pos + sep->size();
  }
  parts.emplace_back(s.substr(start));
  return parts;
}

std::vector<std::string> PyRSplit(std::string_view s, const std::optional<std::string>& sep,
                                  int64_t maxsplit) {
  if (!sep) return RSplitWhitespace(s, maxsplit);
  std::vector<std::string> parts;
  size_t end = s.size();
  while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
    if (end < sep->size()) break;
    const size_t pos = s.rfind(*sep, end - sep->size());
    if (pos == std::string_view::npos) break;
    parts.emplace_back(s.substr(pos + sep->size(), end - pos - sep->size()));
    end = pos;
  }
  parts.emplace_back(s.substr(0, end));
  std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> PySplitLines(std::string_view s, bool keepends) {
  const std::u32string u = DecodeUtf8(s);
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    if (!IsLineBreak(u[i])) continue;
    size_t end = i + 1;
    if (u[i] == '\r' && end < u.size() && u[end] == '\n') ++end;
    lines.push_back(EncodeUtf8(std::u32string_view(u).substr(start, (keepends ? end : i) - start)));
    start = end;
    i = end - 1;
  }
  if (start < u.size()) lines.push_back(EncodeUtf8(std::u32string_view(u).substr(start)));
  return lines;
}

std::string PyReplace(std::string_view s, std::string_view old, std::string_view repl,
                      int64_t count) {
  std::string out;
  if (old.empty()) {  // Python inserts `repl` before every code point and at the end
    const std::u32string u = DecodeUtf8(s);
    int64_t done = 0;
    for (char32_t c : u) {
      if (count < 0 || done < count) {
        out.append(repl);
        ++done;
      }
      AppendUtf8(c, &out);
    }
    if (count < 0 || done < count) out.append(repl);
    return out;
  }
  size_t start = 0;
  for (int64_t done = 0; count < 0 || done < count; ++done) {
    const size_t pos = s.find(old, start);
    if (pos == std::string_view::npos) break;
    out.append(s.substr(start, pos - start));
    out.append(repl);
    start = pos + old.size();
  }
  out.append(s.substr(start));
  return out;
}

int64_t PyFind(std::string_view s, std::string_view sub, bool reverse) {
  const size_t pos = reverse ? s.rfind(sub) : s.find(sub);
  if (pos == std::string_view::npos) return -1;
  return static_cast<int64_t>(CodePointCount(s.substr(0, pos)));
}

int64_t PyCount(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(CodePointCount(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != std::string_view::npos;
       pos = s.find(sub, pos + sub.size())) {
    ++n;
  }
  return n;
}

}  // namespace pagedserve::chat
