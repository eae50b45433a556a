#include "runtime/chat/py_format.h"

#include <locale.h>
#include <wctype.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "runtime/chat/py_text.h"
#include "runtime/chat/str_cat.h"
#include "runtime/common/status_macros.h"

namespace pagedserve::chat {
namespace {

bool IsPrintable(char32_t c) {
  if (c < 0x7F) return c >= 0x20;
  if (c <= 0xA0 || c == 0xAD) return false;
  if ((c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
      (c >= 0x205F && c <= 0x206F) || (c >= 0xD800 && c <= 0xF8FF) || c >= 0xF0000) {
    return false;
  }
  switch (c) {
    case 0x1680:
    case 0x3000:
    case 0xFEFF:
    case 0x061C:
    case 0x06DD:
    case 0x070F:
    case 0x180E: return false;
    default: break;
  }
  static locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(nullptr));
  return loc == nullptr || iswprint_l(static_cast<wint_t>(c), loc);
}

void AppendEscapedCodePoint(char32_t c, std::string* out) {
  if (c <= 0xFF) {
    absl::StrAppendFormat(out, "\\x%02x", static_cast<unsigned>(c));
  } else if (c <= 0xFFFF) {
    absl::StrAppendFormat(out, "\\u%04x", static_cast<unsigned>(c));
  } else {
    absl::StrAppendFormat(out, "\\U%08x", static_cast<unsigned>(c));
  }
}

void AppendRepr(const Value& v, std::string* out);

std::string_view ViewName(SeqKind kind) {
  switch (kind) {
    case SeqKind::kDictKeys: return "dict_keys";
    case SeqKind::kDictValues: return "dict_values";
    case SeqKind::kDictItems: return "dict_items";
    default: return "";
  }
}

void AppendSequenceRepr(const Value& v, std::string* out) {
  if (v.is_generator()) {
    out->append("<generator object>");
    return;
  }
  const std::string_view view = ViewName(v.seq_kind());
  if (!view.empty()) CatAppend(out, view, "(");
  const bool tuple = v.is_tuple();
  out->push_back(tuple ? '(' : '[');
  const auto& items = v.items();
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out->append(", ");
    AppendRepr(items[i], out);
  }
  if (tuple && items.size() == 1) out->push_back(',');
  out->push_back(tuple ? ')' : ']');
  if (!view.empty()) out->push_back(')');
}

void AppendDictRepr(const Dict& d, std::string* out) {
  out->push_back('{');
  bool first = true;
  for (const auto& [key, value] : d.entries()) {
    if (!first) out->append(", ");
    first = false;
    AppendRepr(key, out);
    out->append(": ");
    AppendRepr(value, out);
  }
  out->push_back('}');
}

void AppendRepr(const Value& v, std::string* out) {
  switch (v.kind()) {
    case Value::Kind::kString: out->append(StringRepr(v.str())); return;
    case Value::Kind::kUndefined: out->append("Undefined"); return;
    case Value::Kind::kList: AppendSequenceRepr(v, out); return;
    case Value::Kind::kDict: AppendDictRepr(v.dict(), out); return;
    case Value::Kind::kNamespace:
      out->append("<Namespace ");
      AppendDictRepr(v.namespace_attrs(), out);
      out->push_back('>');
      return;
    case Value::Kind::kCallable: CatAppend(out, "<", v.callable().Describe(), ">"); return;
    default: out->append(PyStr(v));
  }
}

// ---------------------------------------------------------------- JSON

class JsonWriter {
 public:
  explicit JsonWriter(const JsonOptions& options) : options_(options) {}

  absl::Status Write(const Value& v, int level) {
    switch (v.kind()) {
      case Value::Kind::kNone: out_.append("null"); return absl::OkStatus();
      case Value::Kind::kBool: out_.append(v.as_bool() ? "true" : "false"); return absl::OkStatus();
      case Value::Kind::kInt: out_.append(Cat(v.as_int())); return absl::OkStatus();
      case Value::Kind::kFloat: WriteFloat(v.as_double()); return absl::OkStatus();
      case Value::Kind::kString: WriteString(v.str()); return absl::OkStatus();
      case Value::Kind::kList:
        if (!v.is_list_or_tuple()) break;
        return WriteList(v.items(), level);
      case Value::Kind::kDict: return WriteDict(v.dict(), level);
      default: break;
    }
    return absl::InvalidArgumentError(
        Cat("tojson: Object of type ", v.TypeName(), " is not JSON serializable"));
  }

  std::string Take() { return std::move(out_); }

 private:
  void WriteFloat(double d) {
    if (std::isnan(d)) {
      out_.append("NaN");
    } else if (std::isinf(d)) {
      out_.append(d > 0 ? "Infinity" : "-Infinity");
    } else {
      out_.append(FloatRepr(d));
    }
  }

  void WriteString(std::string_view s) {
    out_.push_back('"');
    for (char32_t c : DecodeUtf8(s)) WriteChar(c);
    out_.push_back('"');
  }

  void WriteChar(char32_t c) {
    switch (c) {
      case '"': out_.append("\\\""); return;
      case '\\': out_.append("\\\\"); return;
      case '\n': out_.append("\\n"); return;
      case '\r': out_.append("\\r"); return;
      case '\t': out_.append("\\t"); return;
      case '\b': out_.append("\\b"); return;
      case '\f': out_.append("\\f"); return;
      default: break;
    }
    if (c < 0x20 || (options_.ensure_ascii && c > 0x7E)) {
      WriteUnicodeEscape(c);
    } else {
      AppendUtf8(c, &out_);
    }
  }

  void WriteUnicodeEscape(char32_t c) {
    if (c >= 0x10000) {
      const char32_t v = c - 0x10000;
      absl::StrAppendFormat(&out_, "\\u%04x\\u%04x", static_cast<unsigned>(0xD800 | (v >> 10)),
                            static_cast<unsigned>(0xDC00 | (v & 0x3FF)));
    } else {
      absl::StrAppendFormat(&out_, "\\u%04x", static_cast<unsigned>(c));
    }
  }

  void NewLine(int level) {
    if (!options_.indent) return;
    out_.push_back('\n');
    for (int i = 0; i < level; ++i) out_.append(*options_.indent);
  }

  absl::Status WriteList(const std::vector<Value>& items, int level) {
    if (items.empty()) {
      out_.append("[]");
      return absl::OkStatus();
    }
    out_.push_back('[');
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out_.append(options_.item_separator);
      NewLine(level + 1);
      PS_RETURN_IF_ERROR(Write(items[i], level + 1));
    }
    NewLine(level);
    out_.push_back(']');
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> KeyText(const Value& key) {
    switch (key.kind()) {
      case Value::Kind::kString: return key.str();
      case Value::Kind::kNone: return std::string("null");
      case Value::Kind::kBool: return std::string(key.as_bool() ? "true" : "false");
      case Value::Kind::kInt: return Cat(key.as_int());
      case Value::Kind::kFloat: {
        std::string text;
        JsonWriter writer(options_);
        writer.WriteFloat(key.as_double());
        return writer.Take();
      }
      default:
        return absl::InvalidArgumentError(
            Cat("tojson: keys must be str, int, float, bool or None, not ", key.TypeName()));
    }
  }

  absl::Status WriteDict(const Dict& d, int level) {
    if (d.empty()) {
      out_.append("{}");
      return absl::OkStatus();
    }
    std::vector<const Dict::Entry*> entries;
    for (const auto& entry : d.entries()) entries.push_back(&entry);
    if (options_.sort_keys) PS_RETURN_IF_ERROR(SortEntries(&entries));
    out_.push_back('{');
    for (size_t i = 0; i < entries.size(); ++i) {
      if (i > 0) out_.append(options_.item_separator);
      NewLine(level + 1);
      PS_ASSIGN_OR_RETURN(std::string key, KeyText(entries[i]->first));
      WriteString(key);
      out_.append(options_.key_separator);
      PS_RETURN_IF_ERROR(Write(entries[i]->second, level + 1));
    }
    NewLine(level);
    out_.push_back('}');
    return absl::OkStatus();
  }

  static absl::Status SortEntries(std::vector<const Dict::Entry*>* entries) {
    for (const auto* e : *entries) {
      if (!e->first.is_string()) {
        return absl::InvalidArgumentError("tojson: sort_keys needs keys that are all strings");
      }
    }
    std::stable_sort(entries->begin(), entries->end(), [](const auto* a, const auto* b) {
      return DecodeUtf8(a->first.str()) < DecodeUtf8(b->first.str());
    });
    return absl::OkStatus();
  }

  const JsonOptions& options_;
  std::string out_;
};

// ---------------------------------------------------------------- % formatting

struct Spec {
  std::string flags;
  int width = -1;
  int precision = -1;
  char type = 0;
};

absl::StatusOr<int64_t> IntArgument(const Value& v, char type) {
  if (v.is_integral()) return v.as_int();
  if (v.is_float() && std::isfinite(v.as_double()) && std::fabs(v.as_double()) < 9.2e18) {
    return static_cast<int64_t>(v.as_double());
  }
  return absl::InvalidArgumentError(
      Cat("%", std::string(1, type), " format: a real number is required, not ", v.TypeName()));
}

absl::StatusOr<std::string> FormatOnePercent(const Spec& spec, const Value& v) {
  std::string body;
  switch (spec.type) {
    case 's':
      body = PyStr(v);
      if (spec.precision >= 0) {
        body = EncodeUtf8(DecodeUtf8(body).substr(0, spec.precision));
      }
      break;
    case 'r': body = PyRepr(v); break;
    case 'd':
    case 'i':
    case 'x':
    case 'X':
    case 'o': {
      PS_ASSIGN_OR_RETURN(int64_t n, IntArgument(v, spec.type));
      const uint64_t magnitude = n < 0 ? 0 - static_cast<uint64_t>(n) : static_cast<uint64_t>(n);
      const char* fmt = spec.type == 'x'   ? "%llx"
                        : spec.type == 'X' ? "%llX"
                        : spec.type == 'o' ? "%llo"
                                           : "%llu";
      char buf[40];
      std::snprintf(buf, sizeof(buf), fmt, static_cast<unsigned long long>(magnitude));
      body = Cat(n < 0 ? "-" : "", buf);
      break;
    }
    case 'f':
    case 'F':
    case 'e':
    case 'E': {
      if (!v.is_number()) {
        return absl::InvalidArgumentError(Cat("%", std::string(1, spec.type),
                                              " format: a real number is required, not ",
                                              v.TypeName()));
      }
      char buf[512];
      const std::string fmt = Cat("%.", spec.precision < 0 ? 6 : std::min(spec.precision, 300),
                                  std::string(1, spec.type));
      std::snprintf(buf, sizeof(buf), fmt.c_str(), v.as_double());
      body = buf;
      break;
    }
    default:
      return absl::UnimplementedError(Cat("'%' formatting: conversion type '",
                                          std::string(1, spec.type), "' is not supported"));
  }
  const size_t len = CodePointCount(body);
  if (spec.width > 0 && len < static_cast<size_t>(spec.width)) {
    const std::string pad(spec.width - len, spec.flags.find('0') != std::string::npos &&
                                                    spec.type != 's' && spec.type != 'r'
                                                ? '0'
                                                : ' ');
    if (spec.flags.find('-') != std::string::npos) {
      body += pad;
    } else if (pad[0] == '0' && !body.empty() && body[0] == '-') {
      body = "-" + pad + body.substr(1);
    } else {
      body = pad + body;
    }
  }
  return body;
}

// Parses "%[(name)][flags][width][.precision]type" at format[*i] (just past '%').
absl::StatusOr<Spec> ParsePercentSpec(std::string_view format, size_t* i, std::string* key) {
  Spec spec;
  if (*i < format.size() && format[*i] == '(') {
    const size_t close = format.find(')', *i);
    if (close == std::string_view::npos)
      return absl::InvalidArgumentError("'%' formatting: incomplete format key");
    *key = std::string(format.substr(*i + 1, close - *i - 1));
    *i = close + 1;
  }
  while (*i < format.size() &&
         std::string_view("-+ #0").find(format[*i]) != std::string_view::npos) {
    spec.flags.push_back(format[(*i)++]);
  }
  auto number = [&](int* out) {
    if (*i >= format.size() || format[*i] < '0' || format[*i] > '9') return;
    *out = 0;
    while (*i < format.size() && format[*i] >= '0' && format[*i] <= '9') {
      *out = std::min(*out * 10 + (format[(*i)++] - '0'), 100000);
    }
  };
  number(&spec.width);
  if (*i < format.size() && format[*i] == '.') {
    ++*i;
    spec.precision = 0;
    number(&spec.precision);
  }
  if (*i >= format.size()) return absl::InvalidArgumentError("'%' formatting: incomplete format");
  spec.type = format[(*i)++];
  return spec;
}

// ---------------------------------------------------------------- str.format

struct FormatSpec {
  char fill = ' ';
  char align = 0;  // '<', '>', '^', '=' or 0 (default)
  char sign = '-';
  bool zero = false;
  int width = -1;
  char grouping = 0;  // ',' or '_'
  int precision = -1;
  char type = 0;
};

// "1234567.5" -> "1,234,567.5".
std::string Group(const std::string& body, char separator) {
  const size_t begin = !body.empty() && (body[0] == '-' || body[0] == '+') ? 1 : 0;
  size_t end = begin;
  while (end < body.size() && body[end] >= '0' && body[end] <= '9') ++end;
  std::string out = body.substr(0, begin);
  for (size_t i = begin; i < end; ++i) {
    if (i > begin && (end - i) % 3 == 0) out.push_back(separator);
    out.push_back(body[i]);
  }
  return out + body.substr(end);
}

absl::StatusOr<FormatSpec> ParseFormatSpec(std::string_view s) {
  FormatSpec spec;
  size_t i = 0;
  auto is_align = [](char c) { return c == '<' || c == '>' || c == '^' || c == '='; };
  if (s.size() >= 2 && is_align(s[1])) {
    spec.fill = s[0];
    spec.align = s[1];
    i = 2;
  } else if (!s.empty() && is_align(s[0])) {
    spec.align = s[0];
    i = 1;
  }
  if (i < s.size() && (s[i] == '+' || s[i] == '-' || s[i] == ' ')) spec.sign = s[i++];
  if (i < s.size() && s[i] == '0') {
    spec.zero = true;
    ++i;
  }
  auto number = [&](int* out) {
    if (i >= s.size() || s[i] < '0' || s[i] > '9') return;
    *out = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9')
      *out = std::min(*out * 10 + (s[i++] - '0'), 100000);
  };
  number(&spec.width);
  if (i < s.size() && (s[i] == ',' || s[i] == '_')) spec.grouping = s[i++];
  if (i < s.size() && s[i] == '.') {
    ++i;
    spec.precision = 0;
    number(&spec.precision);
  }
  if (i < s.size()) spec.type = s[i++];
  if (i != s.size()) {
    return absl::UnimplementedError(Cat("str.format: format spec '", s, "' is not supported"));
  }
  return spec;
}

absl::StatusOr<std::string> FormatBody(const FormatSpec& spec, const Value& v) {
  switch (spec.type) {
    case 0:
      if (spec.precision >= 0 && v.is_float()) break;
      if (spec.precision >= 0 && v.is_string()) {
        return EncodeUtf8(DecodeUtf8(v.str()).substr(0, spec.precision));
      }
      return PyStr(v);
    case 's':
      if (!v.is_string()) break;
      return spec.precision >= 0 ? EncodeUtf8(DecodeUtf8(v.str()).substr(0, spec.precision))
                                 : v.str();
    case 'd':
      if (!v.is_integral()) break;
      return Cat(v.as_int());
    default: break;
  }
  if ((spec.type == 'f' || spec.type == 'F' || spec.type == 'e' || spec.type == '%') &&
      v.is_number()) {
    char buf[512];
    const int precision = spec.precision < 0 ? 6 : std::min(spec.precision, 300);
    const double d = spec.type == '%' ? v.as_double() * 100 : v.as_double();
    const char conv = spec.type == '%' || spec.type == 0 ? 'f' : spec.type;
    std::snprintf(buf, sizeof(buf), Cat("%.", precision, std::string(1, conv)).c_str(), d);
    return spec.type == '%' ? Cat(buf, "%") : std::string(buf);
  }
  return absl::UnimplementedError(Cat("str.format: format type '", std::string(1, spec.type),
                                      "' for ", v.TypeName(), " is not supported"));
}

absl::StatusOr<std::string> ApplyFormatSpec(std::string_view spec_text, const Value& v) {
  PS_ASSIGN_OR_RETURN(FormatSpec spec, ParseFormatSpec(spec_text));
  PS_ASSIGN_OR_RETURN(std::string body, FormatBody(spec, v));
  if (spec.grouping != 0) {
    if (!v.is_number() || spec.type == 'e') {
      return absl::InvalidArgumentError("str.format: cannot specify ',' with this format");
    }
    body = Group(body, spec.grouping);
  }
  if (v.is_number() && spec.sign == '+' && !body.empty() && body[0] != '-') body = "+" + body;
  if (v.is_number() && spec.sign == ' ' && !body.empty() && body[0] != '-') body = " " + body;
  const size_t len = CodePointCount(body);
  if (spec.width <= 0 || len >= static_cast<size_t>(spec.width)) return body;
  const size_t pad = spec.width - len;
  char align = spec.align != 0 ? spec.align : (v.is_number() ? '>' : '<');
  char fill = spec.fill;
  if (spec.zero && spec.align == 0) {
    fill = '0';
    align = v.is_number() ? '=' : '<';
  }
  switch (align) {
    case '<': return body + std::string(pad, fill);
    case '^': return std::string(pad / 2, fill) + body + std::string(pad - pad / 2, fill);
    case '=':
      if (!body.empty() && (body[0] == '-' || body[0] == '+' || body[0] == ' ')) {
        return body.substr(0, 1) + std::string(pad, fill) + body.substr(1);
      }
      return std::string(pad, fill) + body;
    default: return std::string(pad, fill) + body;
  }
}

absl::StatusOr<Value> LookupField(std::string_view name, const CallArgs& args, size_t* auto_index) {
  if (name.find_first_of(".[") != std::string_view::npos) {
    return absl::UnimplementedError(
        Cat("str.format: attribute or item access in field '", name, "' is not supported"));
  }
  size_t index;
  if (name.empty()) {
    index = (*auto_index)++;
  } else if (std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    index = name.size() > 6 ? args.positional.size() : std::stoul(std::string(name));
  } else {
    for (const auto& [key, value] : args.keywords) {
      if (key == name) return value;
    }
    return absl::InvalidArgumentError(Cat("str.format: no argument named '", name, "'"));
  }
  if (index >= args.positional.size()) {
    return absl::InvalidArgumentError(
        Cat("str.format: replacement index ", index, " out of range for positional args tuple"));
  }
  return args.positional[index];
}

absl::Status AppendField(std::string_view field, const CallArgs& args, size_t* auto_index,
                         std::string* out) {
  std::string_view spec;
  const size_t colon = field.find(':');
  if (colon != std::string_view::npos) {
    spec = field.substr(colon + 1);
    field = field.substr(0, colon);
  }
  char conversion = 0;
  const size_t bang = field.find('!');
  if (bang != std::string_view::npos) {
    if (bang + 2 != field.size()) return absl::InvalidArgumentError("str.format: bad conversion");
    conversion = field[bang + 1];
    field = field.substr(0, bang);
  }
  PS_ASSIGN_OR_RETURN(Value value, LookupField(field, args, auto_index));
  if (conversion == 'r' || conversion == 'a') value = Value(PyRepr(value));
  if (conversion == 's') value = Value(PyStr(value));
  PS_ASSIGN_OR_RETURN(std::string text, ApplyFormatSpec(spec, value));
  out->append(text);
  return absl::OkStatus();
}

}  // namespace

std::string FloatRepr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  const auto result = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string_view text(buf, result.ptr - buf);
  std::string out;
  if (text[0] == '-') {
    out.push_back('-');
    text.remove_prefix(1);
  }
  const size_t e = text.find('e');
  std::string digits;
  for (char c : text.substr(0, e)) {
    if (c != '.') digits.push_back(c);
  }
  int exp = 0;
  std::from_chars(text.data() + e + 1 + (text[e + 1] == '+' ? 1 : 0), text.data() + text.size(),
                  exp);
  if (exp >= 16 || exp < -4) {
    out.push_back(digits[0]);
    if (digits.size() > 1) CatAppend(&out, ".", digits.substr(1));
    absl::StrAppendFormat(&out, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  } else if (exp >= 0) {
    if (digits.size() <= static_cast<size_t>(exp) + 1) digits.resize(exp + 1, '0');
    const std::string frac = digits.substr(exp + 1);
    CatAppend(&out, digits.substr(0, exp + 1), ".", frac.empty() ? "0" : frac);
  } else {
    CatAppend(&out, "0.", std::string(-exp - 1, '0'), digits);
  }
  return out;
}

std::string StringRepr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : DecodeUtf8(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out.append("\\n");
    } else if (c == '\r') {
      out.append("\\r");
    } else if (c == '\t') {
      out.append("\\t");
    } else if (IsPrintable(c)) {
      AppendUtf8(c, &out);
    } else {
      AppendEscapedCodePoint(c, &out);
    }
  }
  out.push_back(quote);
  return out;
}

std::string HtmlEscape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out.append("&amp;"); break;
      case '<': out.append("&lt;"); break;
      case '>': out.append("&gt;"); break;
      case '"': out.append("&#34;"); break;
      case '\'': out.append("&#39;"); break;
      default: out.push_back(c);
    }
  }
  return out;
}

std::string PyRepr(const Value& v) {
  std::string out;
  AppendRepr(v, &out);
  return out;
}

std::string PyStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return Cat(v.as_int());
    case Value::Kind::kFloat: return FloatRepr(v.as_double());
    case Value::Kind::kString: return v.str();
    default: return PyRepr(v);
  }
}

absl::StatusOr<std::string> ToJson(const Value& v, const JsonOptions& options) {
  JsonWriter writer(options);
  PS_RETURN_IF_ERROR(writer.Write(v, 0));
  return writer.Take();
}

absl::StatusOr<std::string> PercentFormat(std::string_view format, const Value& args) {
  std::vector<Value> positional;
  if (args.is_tuple()) {
    positional = args.items();
  } else {
    positional.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size();) {
    const size_t pct = format.find('%', i);
    out.append(format.substr(i, pct == std::string_view::npos ? std::string_view::npos : pct - i));
    if (pct == std::string_view::npos) break;
    i = pct + 1;
    if (i < format.size() && format[i] == '%') {
      out.push_back('%');
      ++i;
      continue;
    }
    std::string key;
    PS_ASSIGN_OR_RETURN(Spec spec, ParsePercentSpec(format, &i, &key));
    const Value* arg = nullptr;
    if (!key.empty()) {
      arg = args.is_dict() ? args.dict().Find(std::string_view(key)) : nullptr;
      if (arg == nullptr)
        return absl::InvalidArgumentError(Cat("'%' formatting: no key '", key, "'"));
    } else {
      if (next >= positional.size()) {
        return absl::InvalidArgumentError("'%' formatting: not enough arguments for format string");
      }
      arg = &positional[next++];
    }
    PS_ASSIGN_OR_RETURN(std::string piece, FormatOnePercent(spec, *arg));
    out.append(piece);
  }
  if (!args.is_dict() && next < positional.size()) {
    return absl::InvalidArgumentError(
        "'%' formatting: not all arguments converted during string formatting");
  }
  return out;
}

namespace {

// markupsafe's _MarkupEscapeHelper: strings (and other objects' str()) escaped, numbers kept.
Value EscapeArgument(const Value& v) {
  if (v.is_number() || v.is_none() || v.is_markup()) return v;
  return Value(HtmlEscape(v.is_string() ? v.str() : PyStr(v)));
}

}  // namespace

absl::StatusOr<std::string> MarkupPercentFormat(std::string_view format, const Value& args) {
  if (args.is_tuple()) {
    std::vector<Value> items;
    for (const Value& item : args.items()) items.push_back(EscapeArgument(item));
    return PercentFormat(format, Value::Tuple(std::move(items)));
  }
  if (args.is_dict()) {
    Dict escaped;
    for (const auto& [key, value] : args.dict().entries()) escaped.Set(key, EscapeArgument(value));
    return PercentFormat(format, Value::FromDict(std::move(escaped)));
  }
  return PercentFormat(format, EscapeArgument(args));
}

absl::StatusOr<std::string> StrFormat(std::string_view format, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out.push_back('}');
        ++i;
        continue;
      }
      return absl::InvalidArgumentError("str.format: single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError("str.format: single '{' encountered in format string");
    }
    PS_RETURN_IF_ERROR(AppendField(format.substr(i + 1, close - i - 1), args, &auto_index, &out));
    i = close;
  }
  return out;
}

}  // namespace pagedserve::chat
