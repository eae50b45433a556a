#include "runtime/chat/filters.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "runtime/chat/call_args.h"
#include "runtime/chat/interpreter.h"
#include "runtime/chat/methods.h"
#include "runtime/chat/operators.h"
#include "runtime/chat/py_format.h"
#include "runtime/chat/py_text.h"
#include "runtime/chat/str_cat.h"
#include "runtime/common/status_macros.h"

namespace pagedserve::chat {
namespace {

using FilterFn = absl::StatusOr<Value> (*)(Interpreter&, const Value&, const CallArgs&);

struct Filter {
  std::string_view name;
  FilterFn fn;
};

absl::Status ArgumentError(const std::string& message) {
  return absl::InvalidArgumentError(message);
}

absl::StatusOr<Value> Text(Interpreter& in, std::string s, bool markup = false) {
  PS_RETURN_IF_ERROR(in.ChargeBytes(s.size()));
  return markup ? Value::Markup(std::move(s)) : Value(std::move(s));
}

Value Generator(std::vector<Value> items) {
  return Value::Sequence(std::move(items), SeqKind::kGenerator);
}

// markupsafe's soft_str: a string stays (Markup included), anything else is str().
std::string SoftStr(const Value& v) { return v.is_string() ? v.str() : PyStr(v); }

// ---------------------------------------------------------------- attribute paths

// jinja2's _prepare_attribute_parts: "a.0.b" -> ["a", 0, "b"].
std::vector<Value> AttributeParts(const Value& attribute) {
  std::vector<Value> parts;
  if (attribute.is_none() || attribute.is_undefined()) return parts;
  if (!attribute.is_string()) return {attribute};
  for (const std::string& part : PySplit(attribute.str(), std::string("."), -1)) {
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
    int64_t n = 0;
    if (digits && std::from_chars(part.data(), part.data() + part.size(), n).ec == std::errc()) {
      parts.emplace_back(n);
    } else {
      parts.emplace_back(part);
    }
  }
  return parts;
}

// make_attrgetter: environment.getitem along the parts; `fallback` replaces an undefined.
absl::StatusOr<Value> GetPath(const std::vector<Value>& parts, Value item,
                              const Value* fallback = nullptr) {
  for (const Value& part : parts) {
    PS_ASSIGN_OR_RETURN(item, GetItem(item, part));
    if (fallback != nullptr && !fallback->is_none() && item.is_undefined()) item = *fallback;
  }
  return item;
}

Value IgnoreCase(const Value& v) { return v.is_string() ? Value(PyLower(v.str())) : v; }

// sorted(items, key=keys[i], reverse=reverse): stable, errors of the comparisons returned.
absl::Status SortByKeys(std::vector<Value>* items, const std::vector<Value>& keys, bool reverse) {
  std::vector<size_t> order(items->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  absl::Status error;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (!error.ok()) return false;
    absl::StatusOr<bool> less = reverse ? LessThan(keys[b], keys[a]) : LessThan(keys[a], keys[b]);
    if (!less.ok()) {
      error = less.status();
      return false;
    }
    return *less;
  });
  PS_RETURN_IF_ERROR(error);
  std::vector<Value> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back((*items)[i]);
  *items = std::move(sorted);
  return absl::OkStatus();
}

// ---------------------------------------------------------------- strings

absl::StatusOr<Value> Trim(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("trim", args, {{"chars", Value(nullptr)}}));
  PS_ASSIGN_OR_RETURN(auto chars, OptionalStringArg("trim", "chars", a[0]));
  return Text(in, PyStrip(SoftStr(v), chars, true, true), v.is_markup());
}

template <std::string (*Fn)(std::string_view)>
absl::StatusOr<Value> CaseFilter(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("filter", args, {}).status());
  return Text(in, Fn(SoftStr(v)), v.is_markup());
}

// jinja2's title: each word (split after runs of -, whitespace, (, {, [ or <)
// gets its first character upper-cased and the rest lower-cased.
std::string JinjaTitle(std::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  auto separator = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsPySpace(c);
  };
  std::string out;
  for (size_t i = 0; i < u.size();) {
    size_t j = i;
    const bool sep = separator(u[i]);
    while (j < u.size() && separator(u[j]) == sep) ++j;
    const std::u32string_view run = std::u32string_view(u).substr(i, j - i);
    if (sep) {
      out += EncodeUtf8(run);
    } else {
      out += PyUpper(EncodeUtf8(run.substr(0, 1))) + PyLower(EncodeUtf8(run.substr(1)));
    }
    i = j;
  }
  return out;
}

absl::StatusOr<Value> Replace(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(
      auto a, BindArgs("replace", args,
                       {{"old", std::nullopt}, {"new", std::nullopt}, {"count", Value(nullptr)}}));
  const std::string s = PyStr(v), old_text = PyStr(a[0]), new_text = PyStr(a[1]);
  int64_t count = -1;
  if (!a[2].is_none()) {
    PS_ASSIGN_OR_RETURN(count, IntArg("replace", "count", a[2]));
  }
  const int64_t hits =
      old_text.empty() ? static_cast<int64_t>(CodePointCount(s)) + 1 : PyCount(s, old_text);
  const int64_t n = count < 0 ? hits : std::min(count, hits);
  PS_RETURN_IF_ERROR(in.ChargeBytes(s.size() + static_cast<size_t>(n) * new_text.size()));
  return Value(PyReplace(s, old_text, new_text, count));
}

absl::StatusOr<Value> Indent(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(
      auto a, BindArgs("indent", args,
                       {{"width", Value(4)}, {"first", Value(false)}, {"blank", Value(false)}}));
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_string())
    return ArgumentError(
        Cat("indent: unsupported operand type(s) for +=: '", v.TypeName(), "' and 'str'"));
  std::string indention;
  if (a[0].is_string()) {
    indention = a[0].str();
  } else {
    PS_ASSIGN_OR_RETURN(int64_t width, IntArg("indent", "width", a[0]));
    indention = std::string(std::clamp<int64_t>(width, 0, 4096), ' ');
  }
  const std::vector<std::string> lines = PySplitLines(v.str() + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += "\n";
    if (i > 0 && (a[2].Truthy() || !lines[i].empty())) out += indention;
    out += lines[i];
    PS_RETURN_IF_ERROR(in.ChargeBytes(lines[i].size() + indention.size() + 1));
  }
  if (a[1].Truthy()) out = indention + out;
  return Text(in, std::move(out), v.is_markup());
}

absl::StatusOr<Value> WordCount(Interpreter&, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("wordcount", args, {}).status());
  int64_t words = 0;
  bool in_word = false;
  for (char32_t c : DecodeUtf8(SoftStr(v))) {
    const bool w = IsWordChar(c);
    if (w && !in_word) ++words;
    in_word = w;
  }
  return Value(words);
}

absl::StatusOr<Value> Center(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("center", args, {{"width", Value(80)}}));
  PS_ASSIGN_OR_RETURN(int64_t width, IntArg("center", "width", a[0]));
  const std::string s = SoftStr(v);
  const int64_t len = static_cast<int64_t>(CodePointCount(s));
  if (width <= len) return Value(s);
  PS_RETURN_IF_ERROR(in.ChargeBytes(static_cast<size_t>(width)));
  const int64_t pad = width - len;
  const int64_t left = pad / 2 + (pad & width & 1);
  return Value(std::string(left, ' ') + s + std::string(pad - left, ' '));
}

absl::StatusOr<Value> Truncate(Interpreter&, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("truncate", args,
                                       {{"length", Value(255)},
                                        {"killwords", Value(false)},
                                        {"end", Value("...")},
                                        {"leeway", Value(nullptr)}}));
  PS_ASSIGN_OR_RETURN(int64_t length, IntArg("truncate", "length", a[0]));
  PS_ASSIGN_OR_RETURN(std::string end, StringArg("truncate", "end", a[2]));
  int64_t leeway = 5;
  if (!a[3].is_none()) {
    PS_ASSIGN_OR_RETURN(leeway, IntArg("truncate", "leeway", a[3]));
  }
  const std::u32string s = DecodeUtf8(SoftStr(v));
  const auto end_len = static_cast<int64_t>(CodePointCount(end));
  if (length < end_len || leeway < 0)
    return ArgumentError("truncate: expected length >= len(end) and leeway >= 0");
  if (static_cast<int64_t>(s.size()) <= length + leeway) return Value(EncodeUtf8(s));
  std::string head = EncodeUtf8(std::u32string_view(s).substr(0, length - end_len));
  if (!a[1].Truthy()) head = PyRSplit(head, std::string(" "), 1)[0];
  return Value(head + end);
}

absl::StatusOr<Value> Escape(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("escape", args, {}).status());
  if (v.is_markup()) return v;
  return Text(in, HtmlEscape(PyStr(v)), true);
}

absl::StatusOr<Value> ForceEscape(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("forceescape", args, {}).status());
  return Text(in, HtmlEscape(PyStr(v)), true);
}

absl::StatusOr<Value> Safe(Interpreter&, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("safe", args, {}).status());
  return Value::Markup(SoftStr(v));
}

absl::StatusOr<Value> String(Interpreter&, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("string", args, {}).status());
  if (v.is_callable() || v.is_generator()) {
    return ArgumentError(
        Cat("string: cannot convert a ", v.TypeName(), " (jinja2 would give its memory address)"));
  }
  return v.is_string() ? v : Value(PyStr(v));
}

absl::StatusOr<Value> Format(Interpreter& in, const Value& v, const CallArgs& args) {
  Value operands;
  if (!args.keywords.empty()) {
    Dict d;
    for (const auto& [k, value] : args.keywords) d.Set(Value(k), value);
    operands = Value::FromDict(std::move(d));
  } else {
    operands = Value::Tuple(args.positional);
  }
  PS_ASSIGN_OR_RETURN(std::string text, v.is_markup() ? MarkupPercentFormat(v.str(), operands)
                                                      : PercentFormat(SoftStr(v), operands));
  return Text(in, std::move(text), v.is_markup());
}

absl::StatusOr<Value> ToJsonFilter(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("tojson", args,
                                       {{"ensure_ascii", Value(false)},
                                        {"indent", Value(nullptr)},
                                        {"separators", Value(nullptr)},
                                        {"sort_keys", Value(false)}}));
  JsonOptions options;
  options.ensure_ascii = a[0].Truthy();
  options.sort_keys = a[3].Truthy();
  if (a[1].is_string()) {
    options.indent = a[1].str();
  } else if (!a[1].is_none()) {
    PS_ASSIGN_OR_RETURN(int64_t n, IntArg("tojson", "indent", a[1]));
    options.indent = std::string(std::clamp<int64_t>(n, 0, 4096), ' ');
  }
  if (options.indent) options.item_separator = ",";
  if (!a[2].is_none()) {
    if (!a[2].is_list_or_tuple() || a[2].items().size() != 2 || !a[2].items()[0].is_string() ||
        !a[2].items()[1].is_string()) {
      return ArgumentError("tojson: separators must be a pair of strings");
    }
    options.item_separator = a[2].items()[0].str();
    options.key_separator = a[2].items()[1].str();
  }
  PS_ASSIGN_OR_RETURN(std::string text, ToJson(v, options));
  return Text(in, std::move(text));
}

// ---------------------------------------------------------------- numbers

absl::StatusOr<Value> Abs(Interpreter&, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("abs", args, {}).status());
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_float()) return Value(std::fabs(v.as_double()));
  if (!v.is_integral())
    return ArgumentError(Cat("bad operand type for abs(): '", v.TypeName(), "'"));
  if (v.as_int() == INT64_MIN)
    return ArgumentError("integer overflow (integers are limited to 64 bits)");
  return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
}

// Python's float(str): surrounding whitespace, underscores between digits, inf/nan.
std::optional<double> ParseFloat(std::string_view s) {
  const std::string t = PyStrip(s, std::nullopt, true, true);
  std::string digits;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] != '_') {
      digits.push_back(t[i]);
      continue;
    }
    const bool between = i > 0 && i + 1 < t.size() &&
                         std::isdigit(static_cast<unsigned char>(t[i - 1])) &&
                         std::isdigit(static_cast<unsigned char>(t[i + 1]));
    if (!between) return std::nullopt;
  }
  if (digits.empty()) return std::nullopt;
  const std::string lower = PyLower(digits);
  const size_t sign = lower[0] == '+' || lower[0] == '-' ? 1 : 0;
  const std::string body = lower.substr(sign);
  if (body == "inf" || body == "infinity" || body == "nan") {
    const double x = body == "nan" ? NAN : HUGE_VAL;
    return lower[0] == '-' ? -x : x;
  }
  const char* begin = digits.data() + (digits[0] == '+' ? 1 : 0);
  double x = 0;
  const auto r = std::from_chars(begin, digits.data() + digits.size(), x);
  if (r.ptr != digits.data() + digits.size()) return std::nullopt;
  if (r.ec == std::errc::result_out_of_range) x = std::strtod(digits.c_str(), nullptr);
  return x;
}

// Python's int(str, base) for base 10 (and 0/2/8/16 prefixes when base allows).
std::optional<int64_t> ParseInt(std::string_view s, int64_t base) {
  std::string t = PyStrip(s, std::nullopt, true, true);
  bool negative = false;
  if (!t.empty() && (t[0] == '+' || t[0] == '-')) {
    negative = t[0] == '-';
    t.erase(0, 1);
  }
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    const std::string p = t.size() > 1 ? PyLower(t.substr(0, 2)) : "";
    const int64_t prefixed = p == "0x" ? 16 : p == "0o" ? 8 : p == "0b" ? 2 : 0;
    if (prefixed != 0 && (base == 0 || base == prefixed)) {
      base = prefixed;
      t.erase(0, 2);
      if (!t.empty() && t[0] == '_') t.erase(0, 1);
    }
  }
  if (base == 0) base = 10;
  if (base < 2 || base > 36 || t.empty() || t.front() == '_' || t.back() == '_')
    return std::nullopt;
  std::string digits;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '_' && t[i + 1] == '_') return std::nullopt;
    if (t[i] != '_') digits.push_back(t[i]);
  }
  uint64_t magnitude = 0;
  const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude,
                                 static_cast<int>(base));
  if (r.ec != std::errc() || r.ptr != digits.data() + digits.size()) return std::nullopt;
  if (magnitude > static_cast<uint64_t>(INT64_MAX) + (negative ? 1 : 0)) return std::nullopt;
  return negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
}

std::optional<int64_t> TruncateToInt(double d) {
  if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return std::nullopt;
  return static_cast<int64_t>(d);
}

absl::StatusOr<Value> Int(Interpreter&, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("int", args, {{"default", Value(0)}, {"base", Value(10)}}));
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_integral()) return Value(v.as_int());
  if (v.is_float()) {
    if (auto i = TruncateToInt(v.as_double())) return Value(*i);
    return ArgumentError(
        "int: cannot convert float infinity or NaN (or a float beyond 64 bits) to integer");
  }
  if (v.is_string()) {
    PS_ASSIGN_OR_RETURN(int64_t base, IntArg("int", "base", a[1]));
    if (auto i = ParseInt(v.str(), base)) return Value(*i);
    if (auto d = ParseFloat(v.str())) {  // "42.23"|int is 42, as jinja2
      if (auto i = TruncateToInt(*d)) return Value(*i);
    }
  }
  return a[0];
}

absl::StatusOr<Value> Float(Interpreter&, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("float", args, {{"default", Value(0.0)}}));
  if (v.is_undefined()) return UndefinedError(v);
  if (v.is_number()) return Value(v.as_double());
  if (v.is_string()) {
    if (auto d = ParseFloat(v.str())) return Value(*d);
  }
  return a[0];
}

// Python's round(x, n) for a float: correctly rounded, ties to even (glibc's
// printf rounds the exact binary value the same way).
double RoundFloat(double x, int64_t n) {
  if (!std::isfinite(x) || n > 300) return x;
  if (n < 0) {
    const double p = std::pow(10.0, static_cast<double>(-n));
    const double r = std::nearbyint(x / p) * p;
    return std::isfinite(r) ? r : x;
  }
  char buf[512];
  std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(n), x);
  return std::strtod(buf, nullptr);
}

absl::StatusOr<Value> Round(Interpreter&, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(
      auto a, BindArgs("round", args, {{"precision", Value(0)}, {"method", Value("common")}}));
  PS_ASSIGN_OR_RETURN(int64_t precision, IntArg("round", "precision", a[0]));
  PS_ASSIGN_OR_RETURN(std::string method, StringArg("round", "method", a[1]));
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_number())
    return ArgumentError(Cat("type ", v.TypeName(), " doesn't define __round__ method"));
  if (method == "common") {
    if (v.is_integral()) return Value(v.as_int());  // round(int, n) is an int
    return Value(RoundFloat(v.as_double(), precision));
  }
  if (method != "ceil" && method != "floor")
    return ArgumentError("method must be common, ceil or floor");
  const double p = std::pow(10.0, static_cast<double>(precision));
  const double x = v.as_double() * p;
  return Value((method == "ceil" ? std::ceil(x) : std::floor(x)) / p);
}

// ---------------------------------------------------------------- sequences

absl::StatusOr<Value> LengthFilter(Interpreter&, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("length", args, {}).status());
  PS_ASSIGN_OR_RETURN(int64_t n, Length(v));
  return Value(n);
}

absl::StatusOr<Value> Default(Interpreter&, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(
      auto a, BindArgs("default", args, {{"default_value", Value("")}, {"boolean", Value(false)}}));
  if (v.is_undefined() || (a[1].Truthy() && !v.Truthy())) return a[0];
  return v;
}

absl::StatusOr<Value> First(Interpreter&, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("first", args, {}).status());
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

absl::StatusOr<Value> Last(Interpreter&, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("last", args, {}).status());
  if (v.is_generator()) return ArgumentError("'generator' object is not reversible");
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

absl::StatusOr<Value> ListFilter(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("list", args, {}).status());
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  PS_RETURN_IF_ERROR(in.CountIterations(static_cast<int64_t>(items.size())));
  return Value::List(std::move(items));
}

absl::StatusOr<Value> Items(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("items", args, {}).status());
  if (v.is_undefined()) return Generator({});
  if (!v.is_dict()) return ArgumentError("Can only get item pairs from a mapping.");
  PS_RETURN_IF_ERROR(in.CountIterations(static_cast<int64_t>(v.dict().size())));
  std::vector<Value> pairs;
  for (const auto& [key, value] : v.dict().entries()) pairs.push_back(Value::Tuple({key, value}));
  return Generator(std::move(pairs));
}

absl::StatusOr<Value> DictSort(Interpreter&, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("dictsort", args,
                                       {{"case_sensitive", Value(false)},
                                        {"by", Value("key")},
                                        {"reverse", Value(false)}}));
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_dict())
    return ArgumentError(Cat("dictsort: '", v.TypeName(), "' object has no attribute 'items'"));
  const std::string by = a[1].is_string() ? a[1].str() : "";
  if (by != "key" && by != "value")
    return ArgumentError("You can only sort by either \"key\" or \"value\"");
  std::vector<Value> pairs, keys;
  for (const auto& [key, value] : v.dict().entries()) {
    pairs.push_back(Value::Tuple({key, value}));
    const Value& k = by == "key" ? key : value;
    keys.push_back(a[0].Truthy() ? k : IgnoreCase(k));
  }
  PS_RETURN_IF_ERROR(SortByKeys(&pairs, keys, a[2].Truthy()));
  return Value::List(std::move(pairs));
}

absl::StatusOr<Value> Sort(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("sort", args,
                                       {{"reverse", Value(false)},
                                        {"case_sensitive", Value(false)},
                                        {"attribute", Value(nullptr)}}));
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  PS_RETURN_IF_ERROR(in.CountIterations(static_cast<int64_t>(items.size())));
  std::vector<std::vector<Value>> paths;
  if (a[2].is_string()) {
    for (const std::string& part : PySplit(a[2].str(), std::string(","), -1)) {
      paths.push_back(AttributeParts(Value(part)));
    }
  } else {
    paths.push_back(AttributeParts(a[2]));
  }
  std::vector<Value> keys;
  for (const Value& item : items) {
    std::vector<Value> key;
    for (const auto& path : paths) {
      PS_ASSIGN_OR_RETURN(Value k, GetPath(path, item));
      key.push_back(a[1].Truthy() ? k : IgnoreCase(k));
    }
    keys.push_back(Value::List(std::move(key)));
  }
  PS_RETURN_IF_ERROR(SortByKeys(&items, keys, a[0].Truthy()));
  return Value::List(std::move(items));
}

absl::StatusOr<Value> Unique(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(
      auto a,
      BindArgs("unique", args, {{"case_sensitive", Value(false)}, {"attribute", Value(nullptr)}}));
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  PS_RETURN_IF_ERROR(
      in.CountIterations(static_cast<int64_t>(items.size() * items.size() / 64 + items.size())));
  const std::vector<Value> path = AttributeParts(a[1]);
  std::vector<Value> seen, out;
  for (const Value& item : items) {
    PS_ASSIGN_OR_RETURN(Value key, GetPath(path, item));
    if (!a[0].Truthy()) key = IgnoreCase(key);
    if (!IsHashable(key)) return ArgumentError(Cat("unhashable type: '", key.TypeName(), "'"));
    if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return Equals(s, key); }))
      continue;
    seen.push_back(key);
    out.push_back(item);
  }
  return Generator(std::move(out));
}

absl::StatusOr<Value> Reverse(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("reverse", args, {}).status());
  if (v.is_string()) {
    std::u32string s = DecodeUtf8(v.str());
    std::reverse(s.begin(), s.end());
    return Text(in, EncodeUtf8(s), v.is_markup());
  }
  if (v.is_undefined() || v.is_list() || v.is_dict()) {
    PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
    std::reverse(items.begin(), items.end());
    // reversed() of a sequence or dict is an iterator; a generator becomes a list
    return v.is_generator() ? Value::List(std::move(items)) : Generator(std::move(items));
  }
  return ArgumentError("reverse: argument must be iterable");
}

absl::StatusOr<Value> Join(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a,
                      BindArgs("join", args, {{"d", Value("")}, {"attribute", Value(nullptr)}}));
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  const std::vector<Value> path = AttributeParts(a[1]);
  const std::string separator = PyStr(a[0]);
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    PS_ASSIGN_OR_RETURN(Value item, GetPath(path, items[i]));
    if (item.is_callable() || item.is_generator()) {
      return ArgumentError(Cat("join: cannot convert a ", item.TypeName(), " to text"));
    }
    const std::string text = item.is_string() ? item.str() : PyStr(item);
    PS_RETURN_IF_ERROR(in.ChargeBytes(text.size() + separator.size()));
    if (i > 0) out += separator;
    out += text;
  }
  return Value(std::move(out));
}

absl::StatusOr<Value> Sum(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a,
                      BindArgs("sum", args, {{"attribute", Value(nullptr)}, {"start", Value(0)}}));
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  const std::vector<Value> path = AttributeParts(a[0]);
  Value total = a[1];
  for (const Value& item : items) {
    PS_ASSIGN_OR_RETURN(Value x, GetPath(path, item));
    PS_ASSIGN_OR_RETURN(total, BinaryOperation(BinaryOp::kAdd, total, x, in));
  }
  return total;
}

absl::StatusOr<Value> MinMax(const Value& v, const CallArgs& args, bool max) {
  PS_ASSIGN_OR_RETURN(auto a,
                      BindArgs(max ? "max" : "min", args,
                               {{"case_sensitive", Value(false)}, {"attribute", Value(nullptr)}}));
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  const std::vector<Value> path = AttributeParts(a[1]);
  size_t best = 0;
  Value best_key;
  for (size_t i = 0; i < items.size(); ++i) {
    PS_ASSIGN_OR_RETURN(Value key, GetPath(path, items[i]));
    if (!a[0].Truthy()) key = IgnoreCase(key);
    if (i > 0) {
      PS_ASSIGN_OR_RETURN(bool better, max ? LessThan(best_key, key) : LessThan(key, best_key));
      if (!better) continue;
    }
    best = i;
    best_key = key;
  }
  return items[best];
}
absl::StatusOr<Value> Min(Interpreter&, const Value& v, const CallArgs& a) {
  return MinMax(v, a, false);
}
absl::StatusOr<Value> Max(Interpreter&, const Value& v, const CallArgs& a) {
  return MinMax(v, a, true);
}

absl::StatusOr<Value> Attr(Interpreter&, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("attr", args, {{"name", std::nullopt}}));
  PS_ASSIGN_OR_RETURN(std::string name, StringArg("attr", "name", a[0]));
  if (v.is_undefined()) return UndefinedError(v);
  // Only real attributes (methods, a namespace's attributes), never dict keys.
  if (v.is_number()) return GetAttribute(v, name);
  if (std::optional<Value> method = LookupMethod(v, name)) return *method;
  if (v.is_namespace()) {
    if (const Value* attr = v.namespace_attrs().Find(name)) return *attr;
  }
  return Value::Undefined(Cat("'", v.TypeName(), " object' has no attribute '", name, "'"));
}

// ---------------------------------------------------------------- map / select

// The positional arguments after the first `skip`.
CallArgs Rest(const CallArgs& args, size_t skip) {
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + std::min(skip, args.positional.size()),
                         args.positional.end());
  rest.keywords = args.keywords;
  return rest;
}

absl::StatusOr<Value> Map(Interpreter& in, const Value& v, const CallArgs& args) {
  if (!v.Truthy()) return Generator({});
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::vector<Value> out;
  if (args.positional.empty()) {
    Value attribute, fallback(nullptr);
    bool has_attribute = false;
    for (const auto& [k, value] : args.keywords) {
      if (k == "attribute") {
        attribute = value;
        has_attribute = true;
      } else if (k == "default") {
        fallback = value;
      } else {
        return ArgumentError(Cat("map: Unexpected keyword argument '", k, "'"));
      }
    }
    if (!has_attribute) return ArgumentError("map requires a filter argument");
    const std::vector<Value> path = AttributeParts(attribute);
    for (const Value& item : items) {
      PS_ASSIGN_OR_RETURN(Value x, GetPath(path, item, &fallback));
      out.push_back(std::move(x));
    }
    return Generator(std::move(out));
  }
  PS_ASSIGN_OR_RETURN(std::string filter, StringArg("map", "filter", args.positional[0]));
  const CallArgs rest = Rest(args, 1);
  for (const Value& item : items) {
    PS_ASSIGN_OR_RETURN(Value x, in.ApplyFilter(filter, item, rest));
    out.push_back(std::move(x));
  }
  return Generator(std::move(out));
}

absl::StatusOr<Value> SelectOrReject(Interpreter& in, const Value& v, const CallArgs& args,
                                     bool select, bool lookup_attr) {
  if (!v.Truthy()) return Generator({});
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  std::vector<Value> path;
  size_t offset = 0;
  if (lookup_attr) {
    if (args.positional.empty()) return ArgumentError("Missing parameter for attribute name");
    path = AttributeParts(args.positional[0]);
    offset = 1;
  }
  std::optional<std::string> test;
  if (args.positional.size() > offset) {
    PS_ASSIGN_OR_RETURN(test, StringArg("select", "test", args.positional[offset]));
  }
  const CallArgs rest = Rest(args, offset + 1);
  std::vector<Value> out;
  for (const Value& item : items) {
    PS_ASSIGN_OR_RETURN(Value x, GetPath(path, item));
    bool passed;
    if (test) {
      PS_ASSIGN_OR_RETURN(passed, in.ApplyTest(*test, x, rest));
    } else {
      passed = x.Truthy();
    }
    if (passed == select) out.push_back(item);
  }
  return Generator(std::move(out));
}
absl::StatusOr<Value> Select(Interpreter& in, const Value& v, const CallArgs& a) {
  return SelectOrReject(in, v, a, true, false);
}
absl::StatusOr<Value> Reject(Interpreter& in, const Value& v, const CallArgs& a) {
  return SelectOrReject(in, v, a, false, false);
}
absl::StatusOr<Value> SelectAttr(Interpreter& in, const Value& v, const CallArgs& a) {
  return SelectOrReject(in, v, a, true, true);
}
absl::StatusOr<Value> RejectAttr(Interpreter& in, const Value& v, const CallArgs& a) {
  return SelectOrReject(in, v, a, false, true);
}

absl::StatusOr<Value> Batch(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(
      auto a,
      BindArgs("batch", args, {{"linecount", std::nullopt}, {"fill_with", Value(nullptr)}}));
  PS_ASSIGN_OR_RETURN(int64_t n, IntArg("batch", "linecount", a[0]));
  if (n < 1) return ArgumentError("batch: linecount must be at least 1");
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(v));
  PS_RETURN_IF_ERROR(in.CountIterations(static_cast<int64_t>(items.size()) + n));
  std::vector<Value> batches, current;
  for (Value& item : items) {
    current.push_back(std::move(item));
    if (static_cast<int64_t>(current.size()) == n)
      batches.push_back(Value::List(std::exchange(current, {})));
  }
  if (!current.empty()) {
    if (!a[1].is_none()) current.resize(n, a[1]);
    batches.push_back(Value::List(std::move(current)));
  }
  return Generator(std::move(batches));
}

absl::StatusOr<Value> SliceFilter(Interpreter& in, const Value& v, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(
      auto a, BindArgs("slice", args, {{"slices", std::nullopt}, {"fill_with", Value(nullptr)}}));
  PS_ASSIGN_OR_RETURN(int64_t slices, IntArg("slice", "slices", a[0]));
  if (slices < 1) return ArgumentError("slice: slices must be at least 1");
  PS_ASSIGN_OR_RETURN(std::vector<Value> seq, Iterate(v));
  PS_RETURN_IF_ERROR(in.CountIterations(static_cast<int64_t>(seq.size()) + slices));
  const auto length = static_cast<int64_t>(seq.size());
  const int64_t per_slice = length / slices, with_extra = length % slices;
  std::vector<Value> out;
  int64_t offset = 0;
  for (int64_t i = 0; i < slices; ++i) {
    const int64_t start = offset + i * per_slice;
    if (i < with_extra) ++offset;
    const int64_t end = offset + (i + 1) * per_slice;
    std::vector<Value> part(seq.begin() + start, seq.begin() + end);
    if (!a[1].is_none() && i >= with_extra) part.push_back(a[1]);
    out.push_back(Value::List(std::move(part)));
  }
  return Generator(std::move(out));
}

absl::StatusOr<Value> NotImplemented(Interpreter&, const Value&, const CallArgs&) {
  return absl::UnimplementedError("this filter is not supported");
}

constexpr Filter kFilters[] = {
    {"abs", Abs},
    {"attr", Attr},
    {"batch", Batch},
    {"capitalize", CaseFilter<PyCapitalize>},
    {"center", Center},
    {"count", LengthFilter},
    {"d", Default},
    {"default", Default},
    {"dictsort", DictSort},
    {"e", Escape},
    {"escape", Escape},
    {"filesizeformat", NotImplemented},
    {"first", First},
    {"float", Float},
    {"forceescape", ForceEscape},
    {"format", Format},
    {"groupby", NotImplemented},
    {"indent", Indent},
    {"int", Int},
    {"items", Items},
    {"join", Join},
    {"last", Last},
    {"length", LengthFilter},
    {"list", ListFilter},
    {"lower", CaseFilter<PyLower>},
    {"map", Map},
    {"max", Max},
    {"min", Min},
    {"pprint", NotImplemented},
    {"random", NotImplemented},
    {"reject", Reject},
    {"rejectattr", RejectAttr},
    {"replace", Replace},
    {"reverse", Reverse},
    {"round", Round},
    {"safe", Safe},
    {"select", Select},
    {"selectattr", SelectAttr},
    {"slice", SliceFilter},
    {"sort", Sort},
    {"string", String},
    {"striptags", NotImplemented},
    {"sum", Sum},
    {"title", CaseFilter<JinjaTitle>},
    {"tojson", ToJsonFilter},
    {"trim", Trim},
    {"truncate", Truncate},
    {"unique", Unique},
    {"upper", CaseFilter<PyUpper>},
    {"urlencode", NotImplemented},
    {"urlize", NotImplemented},
    {"wordcount", WordCount},
    {"wordwrap", NotImplemented},
    {"xmlattr", NotImplemented},
};

const Filter* FindFilter(std::string_view name) {
  const auto it = std::find_if(std::begin(kFilters), std::end(kFilters),
                               [&](const Filter& f) { return f.name == name; });
  return it == std::end(kFilters) ? nullptr : it;
}

}  // namespace

bool IsKnownFilter(std::string_view name) { return FindFilter(name) != nullptr; }

absl::StatusOr<Value> ApplyBuiltinFilter(Interpreter& interpreter, std::string_view name,
                                         const Value& operand, const CallArgs& args) {
  const Filter* filter = FindFilter(name);
  if (filter == nullptr) return absl::InvalidArgumentError(Cat("No filter named '", name, "'."));
  absl::StatusOr<Value> result = filter->fn(interpreter, operand, args);
  if (!result.ok() && absl::IsUnimplemented(result.status())) {
    return absl::UnimplementedError(Cat("the '", name, "' filter: ", result.status().message()));
  }
  return result;
}

}  // namespace pagedserve::chat
