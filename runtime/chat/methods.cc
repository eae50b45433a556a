#include "runtime/chat/methods.h"

#include <algorithm>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "runtime/chat/call_args.h"
#include "runtime/chat/interpreter.h"
#include "runtime/chat/operators.h"
#include "runtime/chat/py_format.h"
#include "runtime/chat/py_text.h"
#include "runtime/chat/str_cat.h"
#include "runtime/common/status_macros.h"

namespace pagedserve::chat {
namespace {

using MethodFn = absl::StatusOr<Value> (*)(Interpreter&, const Value& self, const CallArgs& args);

struct Method {
  std::string_view name;
  MethodFn fn;
};

class BoundMethod final : public Callable {
 public:
  BoundMethod(Value self, std::string_view name, MethodFn fn)
      : self_(std::move(self)), name_(name), fn_(fn) {}
  std::string Describe() const override {
    return Cat("built-in method ", name_, " of ", self_.TypeName(), " object");
  }
  absl::StatusOr<Value> Call(Interpreter& interpreter, CallArgs args) const override {
    absl::StatusOr<Value> result = fn_(interpreter, self_, args);
    // markupsafe: a Markup's str methods return Markup
    if (result.ok() && self_.is_markup() && result->is_string())
      return Value::Markup(result->str());
    return result;
  }

 private:
  Value self_;
  std::string_view name_;
  MethodFn fn_;
};

// A Python method this engine does not implement: calling it is Unimplemented.
class MissingMethod final : public Callable {
 public:
  MissingMethod(std::string_view type, std::string_view name) : type_(type), name_(name) {}
  std::string Describe() const override {
    return Cat("built-in method ", name_, " of ", type_, " object");
  }
  absl::StatusOr<Value> Call(Interpreter&, CallArgs) const override {
    return absl::UnimplementedError(Cat(type_, ".", name_, "() is not supported"));
  }

 private:
  std::string type_;
  std::string name_;
};

std::vector<Value> Strings(std::vector<std::string> parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (std::string& p : parts) out.emplace_back(std::move(p));
  return out;
}

absl::StatusOr<Value> Text(Interpreter& in, std::string s) {
  PS_RETURN_IF_ERROR(in.ChargeBytes(s.size()));
  return Value(std::move(s));
}

// ---------------------------------------------------------------- str

absl::StatusOr<Value> StripImpl(Interpreter& in, const Value& self, const CallArgs& args,
                                std::string_view name, bool left, bool right) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {{"chars", Value(nullptr)}}));
  PS_ASSIGN_OR_RETURN(auto chars, OptionalStringArg(name, "chars", a[0]));
  return Text(in, PyStrip(self.str(), chars, left, right));
}
absl::StatusOr<Value> StrStrip(Interpreter& in, const Value& s, const CallArgs& a) {
  return StripImpl(in, s, a, "str.strip", true, true);
}
absl::StatusOr<Value> StrLStrip(Interpreter& in, const Value& s, const CallArgs& a) {
  return StripImpl(in, s, a, "str.lstrip", true, false);
}
absl::StatusOr<Value> StrRStrip(Interpreter& in, const Value& s, const CallArgs& a) {
  return StripImpl(in, s, a, "str.rstrip", false, true);
}

absl::StatusOr<Value> SplitImpl(Interpreter& in, const Value& self, const CallArgs& args,
                                bool reverse) {
  const std::string_view name = reverse ? "str.rsplit" : "str.split";
  PS_ASSIGN_OR_RETURN(auto a,
                      BindArgs(name, args, {{"sep", Value(nullptr)}, {"maxsplit", Value(-1)}}));
  PS_ASSIGN_OR_RETURN(auto sep, OptionalStringArg(name, "sep", a[0]));
  PS_ASSIGN_OR_RETURN(int64_t maxsplit, IntArg(name, "maxsplit", a[1]));
  if (sep && sep->empty()) return absl::InvalidArgumentError(Cat(name, ": empty separator"));
  std::vector<std::string> parts =
      reverse ? PyRSplit(self.str(), sep, maxsplit) : PySplit(self.str(), sep, maxsplit);
  PS_RETURN_IF_ERROR(in.CountIterations(static_cast<int64_t>(parts.size())));
  PS_RETURN_IF_ERROR(in.ChargeBytes(self.str().size()));
  return Value::List(Strings(std::move(parts)));
}
absl::StatusOr<Value> StrSplit(Interpreter& in, const Value& s, const CallArgs& a) {
  return SplitImpl(in, s, a, false);
}
absl::StatusOr<Value> StrRSplit(Interpreter& in, const Value& s, const CallArgs& a) {
  return SplitImpl(in, s, a, true);
}

absl::StatusOr<Value> StrSplitLines(Interpreter& in, const Value& self, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("str.splitlines", args, {{"keepends", Value(false)}}));
  std::vector<std::string> lines = PySplitLines(self.str(), a[0].Truthy());
  PS_RETURN_IF_ERROR(in.CountIterations(static_cast<int64_t>(lines.size())));
  PS_RETURN_IF_ERROR(in.ChargeBytes(self.str().size()));
  return Value::List(Strings(std::move(lines)));
}

// startswith / endswith: a prefix or a tuple of prefixes.
absl::StatusOr<Value> AffixImpl(const Value& self, const CallArgs& args, bool start) {
  const std::string_view name = start ? "str.startswith" : "str.endswith";
  PS_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {{"affix", std::nullopt}}));
  std::vector<Value> affixes = a[0].is_tuple() ? a[0].items() : std::vector<Value>{a[0]};
  const std::string& s = self.str();
  for (const Value& v : affixes) {
    PS_ASSIGN_OR_RETURN(std::string affix, StringArg(name, "prefix", v));
    const bool match = affix.size() <= s.size() &&
                       (start ? s.compare(0, affix.size(), affix) == 0
                              : s.compare(s.size() - affix.size(), affix.size(), affix) == 0);
    if (match) return Value(true);
  }
  return Value(false);
}
absl::StatusOr<Value> StrStartsWith(Interpreter&, const Value& s, const CallArgs& a) {
  return AffixImpl(s, a, true);
}
absl::StatusOr<Value> StrEndsWith(Interpreter&, const Value& s, const CallArgs& a) {
  return AffixImpl(s, a, false);
}

template <std::string (*Fn)(std::string_view)>
absl::StatusOr<Value> CaseImpl(Interpreter& in, const Value& self, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("str method", args, {}).status());
  return Text(in, Fn(self.str()));
}

absl::StatusOr<Value> StrReplace(Interpreter& in, const Value& self, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(
      auto a, BindArgs("str.replace", args,
                       {{"old", std::nullopt}, {"new", std::nullopt}, {"count", Value(-1)}}));
  PS_ASSIGN_OR_RETURN(std::string old_text, StringArg("str.replace", "old", a[0]));
  PS_ASSIGN_OR_RETURN(std::string new_text, StringArg("str.replace", "new", a[1]));
  PS_ASSIGN_OR_RETURN(int64_t count, IntArg("str.replace", "count", a[2]));
  const int64_t hits = old_text.empty() ? static_cast<int64_t>(CodePointCount(self.str())) + 1
                                        : PyCount(self.str(), old_text);
  const int64_t n = count < 0 ? hits : std::min(count, hits);
  PS_RETURN_IF_ERROR(in.ChargeBytes(self.str().size() + static_cast<size_t>(n) * new_text.size()));
  return Value(PyReplace(self.str(), old_text, new_text, count));
}

// Markup.replace: the plain-string arguments are HTML-escaped first.
absl::StatusOr<Value> MarkupReplace(Interpreter& in, const Value& self, const CallArgs& args) {
  CallArgs escaped = args;
  for (Value& v : escaped.positional) {
    if (v.is_string() && !v.is_markup()) v = Value(HtmlEscape(v.str()));
  }
  for (auto& [key, v] : escaped.keywords) {
    if (v.is_string() && !v.is_markup()) v = Value(HtmlEscape(v.str()));
  }
  return StrReplace(in, self, escaped);
}

absl::StatusOr<Value> StrFormatMethod(Interpreter& in, const Value& self, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(std::string text, StrFormat(self.str(), args));
  return Text(in, std::move(text));
}

absl::StatusOr<Value> FindImpl(const Value& self, const CallArgs& args, std::string_view name,
                               bool reverse, bool raise) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {{"sub", std::nullopt}}));
  PS_ASSIGN_OR_RETURN(std::string sub, StringArg(name, "sub", a[0]));
  const int64_t at = PyFind(self.str(), sub, reverse);
  if (at < 0 && raise) return absl::InvalidArgumentError(Cat(name, ": substring not found"));
  return Value(at);
}
absl::StatusOr<Value> StrFind(Interpreter&, const Value& s, const CallArgs& a) {
  return FindImpl(s, a, "str.find", false, false);
}
absl::StatusOr<Value> StrRFind(Interpreter&, const Value& s, const CallArgs& a) {
  return FindImpl(s, a, "str.rfind", true, false);
}
absl::StatusOr<Value> StrIndex(Interpreter&, const Value& s, const CallArgs& a) {
  return FindImpl(s, a, "str.index", false, true);
}
absl::StatusOr<Value> StrRIndex(Interpreter&, const Value& s, const CallArgs& a) {
  return FindImpl(s, a, "str.rindex", true, true);
}

absl::StatusOr<Value> StrCount(Interpreter&, const Value& self, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("str.count", args, {{"sub", std::nullopt}}));
  PS_ASSIGN_OR_RETURN(std::string sub, StringArg("str.count", "sub", a[0]));
  return Value(PyCount(self.str(), sub));
}

absl::StatusOr<Value> StrJoin(Interpreter& in, const Value& self, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("str.join", args, {{"iterable", std::nullopt}}));
  PS_ASSIGN_OR_RETURN(std::vector<Value> items, Iterate(a[0]));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].is_string()) {
      return absl::InvalidArgumentError(
          Cat("sequence item ", i, ": expected str instance, ", items[i].TypeName(), " found"));
    }
    if (i > 0) out += self.str();
    out += items[i].str();
    PS_RETURN_IF_ERROR(in.ChargeBytes(items[i].str().size() + self.str().size()));
  }
  return Value(std::move(out));
}

template <bool (*Pred)(char32_t)>
absl::StatusOr<Value> IsImpl(Interpreter&, const Value& self, const CallArgs&) {
  const std::u32string cps = DecodeUtf8(self.str());
  return Value(!cps.empty() && std::all_of(cps.begin(), cps.end(), Pred));
}
bool IsAlnumChar(char32_t c) { return IsAlphaChar(c) || IsDigitChar(c); }
bool IsAsciiChar(char32_t c) { return c < 0x80; }

absl::StatusOr<Value> CaseTest(const Value& self, bool upper) {
  bool cased = false;
  for (char32_t c : DecodeUtf8(self.str())) {
    if (upper ? IsLowerChar(c) : IsUpperChar(c)) return Value(false);
    cased = cased || IsCased(c);
  }
  return Value(cased);
}
absl::StatusOr<Value> StrIsUpper(Interpreter&, const Value& s, const CallArgs&) {
  return CaseTest(s, true);
}
absl::StatusOr<Value> StrIsLower(Interpreter&, const Value& s, const CallArgs&) {
  return CaseTest(s, false);
}

absl::StatusOr<Value> PadImpl(Interpreter& in, const Value& self, const CallArgs& args,
                              std::string_view name, char align) {
  PS_ASSIGN_OR_RETURN(auto a,
                      BindArgs(name, args, {{"width", std::nullopt}, {"fillchar", Value(" ")}}));
  PS_ASSIGN_OR_RETURN(int64_t width, IntArg(name, "width", a[0]));
  PS_ASSIGN_OR_RETURN(std::string fill, StringArg(name, "fillchar", a[1]));
  if (CodePointCount(fill) != 1)
    return absl::InvalidArgumentError(
        Cat(name, ": the fill character must be exactly one character long"));
  const int64_t len = static_cast<int64_t>(CodePointCount(self.str()));
  if (width <= len) return self;
  PS_RETURN_IF_ERROR(in.ChargeBytes(static_cast<size_t>(width) * fill.size()));
  const int64_t pad = width - len;
  // CPython's center puts the odd extra fill on the left when the width is odd.
  const int64_t left = align == '<' ? 0 : align == '>' ? pad : pad / 2 + (pad & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += self.str();
  for (int64_t i = 0; i < pad - left; ++i) out += fill;
  return Value(std::move(out));
}
absl::StatusOr<Value> StrCenter(Interpreter& in, const Value& s, const CallArgs& a) {
  return PadImpl(in, s, a, "str.center", '^');
}
absl::StatusOr<Value> StrLJust(Interpreter& in, const Value& s, const CallArgs& a) {
  return PadImpl(in, s, a, "str.ljust", '<');
}
absl::StatusOr<Value> StrRJust(Interpreter& in, const Value& s, const CallArgs& a) {
  return PadImpl(in, s, a, "str.rjust", '>');
}

absl::StatusOr<Value> StrZFill(Interpreter& in, const Value& self, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("str.zfill", args, {{"width", std::nullopt}}));
  PS_ASSIGN_OR_RETURN(int64_t width, IntArg("str.zfill", "width", a[0]));
  const std::string& s = self.str();
  const int64_t len = static_cast<int64_t>(CodePointCount(s));
  if (width <= len) return self;
  PS_RETURN_IF_ERROR(in.ChargeBytes(static_cast<size_t>(width)));
  const bool sign = !s.empty() && (s[0] == '+' || s[0] == '-');
  return Value(
      Cat(sign ? s.substr(0, 1) : "", std::string(width - len, '0'), s.substr(sign ? 1 : 0)));
}

absl::StatusOr<Value> AffixRemove(const Value& self, const CallArgs& args, bool prefix) {
  const std::string_view name = prefix ? "str.removeprefix" : "str.removesuffix";
  PS_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {{"affix", std::nullopt}}));
  PS_ASSIGN_OR_RETURN(std::string affix, StringArg(name, "affix", a[0]));
  const std::string& s = self.str();
  if (affix.size() > s.size()) return self;
  if (prefix && s.compare(0, affix.size(), affix) == 0) return Value(s.substr(affix.size()));
  if (!prefix && s.compare(s.size() - affix.size(), affix.size(), affix) == 0) {
    return Value(s.substr(0, s.size() - affix.size()));
  }
  return self;
}
absl::StatusOr<Value> StrRemovePrefix(Interpreter&, const Value& s, const CallArgs& a) {
  return AffixRemove(s, a, true);
}
absl::StatusOr<Value> StrRemoveSuffix(Interpreter&, const Value& s, const CallArgs& a) {
  return AffixRemove(s, a, false);
}

absl::StatusOr<Value> PartitionImpl(const Value& self, const CallArgs& args, bool reverse) {
  const std::string_view name = reverse ? "str.rpartition" : "str.partition";
  PS_ASSIGN_OR_RETURN(auto a, BindArgs(name, args, {{"sep", std::nullopt}}));
  PS_ASSIGN_OR_RETURN(std::string sep, StringArg(name, "sep", a[0]));
  if (sep.empty()) return absl::InvalidArgumentError(Cat(name, ": empty separator"));
  const std::string& s = self.str();
  const size_t at = reverse ? s.rfind(sep) : s.find(sep);
  if (at == std::string::npos) {
    return reverse ? Value::Tuple({Value(""), Value(""), self})
                   : Value::Tuple({self, Value(""), Value("")});
  }
  return Value::Tuple({Value(s.substr(0, at)), Value(sep), Value(s.substr(at + sep.size()))});
}
absl::StatusOr<Value> StrPartition(Interpreter&, const Value& s, const CallArgs& a) {
  return PartitionImpl(s, a, false);
}
absl::StatusOr<Value> StrRPartition(Interpreter&, const Value& s, const CallArgs& a) {
  return PartitionImpl(s, a, true);
}

constexpr Method kStrMethods[] = {
    {"strip", StrStrip},
    {"lstrip", StrLStrip},
    {"rstrip", StrRStrip},
    {"split", StrSplit},
    {"rsplit", StrRSplit},
    {"splitlines", StrSplitLines},
    {"startswith", StrStartsWith},
    {"endswith", StrEndsWith},
    {"upper", CaseImpl<PyUpper>},
    {"lower", CaseImpl<PyLower>},
    {"casefold", CaseImpl<PyLower>},
    {"title", CaseImpl<PyTitle>},
    {"capitalize", CaseImpl<PyCapitalize>},
    {"swapcase", CaseImpl<PySwapcase>},
    {"replace", StrReplace},
    {"format", StrFormatMethod},
    {"find", StrFind},
    {"rfind", StrRFind},
    {"index", StrIndex},
    {"rindex", StrRIndex},
    {"count", StrCount},
    {"join", StrJoin},
    {"isdigit", IsImpl<IsDigitChar>},
    {"isdecimal", IsImpl<IsDigitChar>},
    {"isnumeric", IsImpl<IsDigitChar>},
    {"isalpha", IsImpl<IsAlphaChar>},
    {"isalnum", IsImpl<IsAlnumChar>},
    {"isspace", IsImpl<IsPySpace>},
    {"isascii", IsImpl<IsAsciiChar>},
    {"isupper", StrIsUpper},
    {"islower", StrIsLower},
    {"center", StrCenter},
    {"ljust", StrLJust},
    {"rjust", StrRJust},
    {"zfill", StrZFill},
    {"removeprefix", StrRemovePrefix},
    {"removesuffix", StrRemoveSuffix},
    {"partition", StrPartition},
    {"rpartition", StrRPartition},
};
// Methods of markupsafe's Markup that HTML-escape their arguments: not implemented
// on safe strings (|safe), so that none renders differently from jinja2.
constexpr std::string_view kMarkupEscaping[] = {"format", "join",  "center",    "ljust",
                                                "rjust",  "zfill", "partition", "rpartition"};
// Methods of Python's str that are not implemented (calling one is Unimplemented).
constexpr std::string_view kStrMissing[] = {"encode",       "expandtabs",  "format_map",
                                            "isidentifier", "isprintable", "istitle",
                                            "maketrans",    "translate"};

// ---------------------------------------------------------------- dict and list

absl::StatusOr<Value> DictGet(Interpreter&, const Value& self, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(
      auto a, BindArgs("dict.get", args, {{"key", std::nullopt}, {"default", Value(nullptr)}}));
  if (!IsHashable(a[0]))
    return absl::InvalidArgumentError(Cat("unhashable type: '", a[0].TypeName(), "'"));
  const Value* v = self.dict().Find(a[0]);
  return v != nullptr ? *v : a[1];
}

absl::StatusOr<Value> DictItems(Interpreter& in, const Value& self, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("dict.items", args, {}).status());
  PS_RETURN_IF_ERROR(in.CountIterations(static_cast<int64_t>(self.dict().size())));
  std::vector<Value> items;
  for (const auto& [k, v] : self.dict().entries()) items.push_back(Value::Tuple({k, v}));
  return Value::Sequence(std::move(items), SeqKind::kDictItems);
}

absl::StatusOr<Value> DictKeys(Interpreter&, const Value& self, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("dict.keys", args, {}).status());
  PS_ASSIGN_OR_RETURN(std::vector<Value> keys, Iterate(self));
  return Value::Sequence(std::move(keys), SeqKind::kDictKeys);
}

absl::StatusOr<Value> DictValues(Interpreter&, const Value& self, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("dict.values", args, {}).status());
  std::vector<Value> values;
  for (const auto& entry : self.dict().entries()) values.push_back(entry.second);
  return Value::Sequence(std::move(values), SeqKind::kDictValues);
}

absl::StatusOr<Value> CopySelf(Interpreter&, const Value& self, const CallArgs& args) {
  PS_RETURN_IF_ERROR(BindArgs("copy", args, {}).status());
  return self;
}

absl::StatusOr<Value> ListCount(Interpreter&, const Value& self, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("list.count", args, {{"value", std::nullopt}}));
  return Value(static_cast<int64_t>(std::count_if(
      self.items().begin(), self.items().end(), [&](const Value& v) { return Equals(v, a[0]); })));
}

absl::StatusOr<Value> ListIndex(Interpreter&, const Value& self, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("list.index", args, {{"value", std::nullopt}}));
  for (size_t i = 0; i < self.items().size(); ++i) {
    if (Equals(self.items()[i], a[0])) return Value(static_cast<int64_t>(i));
  }
  return absl::InvalidArgumentError(Cat(PyRepr(a[0]), " is not in list"));
}

constexpr Method kDictMethods[] = {
    {"get", DictGet},       {"items", DictItems}, {"keys", DictKeys},
    {"values", DictValues}, {"copy", CopySelf},
};
constexpr std::string_view kDictUnsafe[] = {"clear", "pop", "popitem", "setdefault", "update"};
constexpr std::string_view kDictMissing[] = {"fromkeys"};
constexpr Method kListMethods[] = {{"count", ListCount}, {"index", ListIndex}, {"copy", CopySelf}};
constexpr std::string_view kListUnsafe[] = {"append", "clear",  "extend",  "insert",
                                            "pop",    "remove", "reverse", "sort"};
constexpr Method kTupleMethods[] = {{"count", ListCount}, {"index", ListIndex}};

template <size_t N>
const Method* FindMethod(const Method (&table)[N], std::string_view name) {
  for (const Method& m : table) {
    if (m.name == name) return &m;
  }
  return nullptr;
}

template <size_t N>
bool Listed(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

Value Unsafe(const Value& obj, std::string_view name) {
  return Value::Undefined(Cat("access to attribute '", name, "' of '", obj.TypeName(),
                              "' object is unsafe (templates cannot change lists or dicts)."));
}

template <size_t N>
std::optional<Value> Bind(const Value& obj, const Method (&table)[N], std::string_view name) {
  const Method* m = FindMethod(table, name);
  if (m == nullptr) return std::nullopt;
  return Value::Function(std::make_shared<BoundMethod>(obj, m->name, m->fn));
}

std::optional<Value> Missing(std::string_view type, std::string_view name) {
  return Value::Function(std::make_shared<MissingMethod>(type, name));
}

}  // namespace

std::optional<Value> LookupMethod(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::kString:
      if (obj.is_markup() && Listed(kMarkupEscaping, name))
        return Missing("markupsafe.Markup (a |safe string)", name);
      if (obj.is_markup() && name == "replace") {
        return Value::Function(std::make_shared<BoundMethod>(obj, "replace", MarkupReplace));
      }
      if (auto m = Bind(obj, kStrMethods, name)) return m;
      if (Listed(kStrMissing, name)) return Missing("str", name);
      return std::nullopt;
    case Value::Kind::kDict:
      if (auto m = Bind(obj, kDictMethods, name)) return m;
      if (Listed(kDictUnsafe, name)) return Unsafe(obj, name);
      if (Listed(kDictMissing, name)) return Missing("dict", name);
      return std::nullopt;
    case Value::Kind::kList:
      if (!obj.is_list_or_tuple()) return std::nullopt;
      if (obj.is_tuple()) return Bind(obj, kTupleMethods, name);
      if (auto m = Bind(obj, kListMethods, name)) return m;
      if (Listed(kListUnsafe, name)) return Unsafe(obj, name);
      return std::nullopt;
    default: return std::nullopt;
  }
}

}  // namespace pagedserve::chat
