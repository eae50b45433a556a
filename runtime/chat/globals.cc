#include "runtime/chat/globals.h"

#include <ctime>
#include <memory>

#include "absl/status/status.h"
#include "runtime/chat/call_args.h"
#include "runtime/chat/interpreter.h"
#include "runtime/chat/operators.h"
#include "runtime/chat/str_cat.h"
#include "runtime/common/status_macros.h"

namespace pagedserve::chat {
namespace {

using GlobalFn = absl::StatusOr<Value> (*)(Interpreter&, const CallArgs&);

class BuiltinFunction final : public Callable {
 public:
  BuiltinFunction(std::string_view name, GlobalFn fn) : name_(name), fn_(fn) {}
  std::string Describe() const override { return Cat("function ", name_); }
  absl::StatusOr<Value> Call(Interpreter& interpreter, CallArgs args) const override {
    return fn_(interpreter, args);
  }

 private:
  std::string_view name_;
  GlobalFn fn_;
};

absl::StatusOr<Value> Range(Interpreter& in, const CallArgs& args) {
  if (!args.keywords.empty())
    return absl::InvalidArgumentError("range() takes no keyword arguments");
  const size_t n = args.positional.size();
  if (n < 1 || n > 3)
    return absl::InvalidArgumentError(Cat("range expected 1 to 3 arguments, got ", n));
  int64_t bounds[3] = {0, 0, 1};
  for (size_t i = 0; i < n; ++i) {
    PS_ASSIGN_OR_RETURN(bounds[n == 1 ? 1 : i], IntArg("range", "bound", args.positional[i]));
  }
  const int64_t start = bounds[0], stop = bounds[1], step = bounds[2];
  if (step == 0) return absl::InvalidArgumentError("range() arg 3 must not be zero");
  const __int128 span =
      step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
  const __int128 abs_step = step > 0 ? step : -static_cast<__int128>(step);
  const __int128 length = span <= 0 ? 0 : (span + abs_step - 1) / abs_step;
  if (length > kMaxRange) {
    return absl::InvalidArgumentError(
        Cat("Range too big. The sandbox blocks ranges larger than MAX_RANGE (", kMaxRange, ")."));
  }
  PS_RETURN_IF_ERROR(in.CountIterations(static_cast<int64_t>(length)));
  std::vector<Value> items;
  for (int64_t i = 0; i < static_cast<int64_t>(length); ++i) items.emplace_back(start + i * step);
  return Value::List(std::move(items));
}

// dict(*args, **kwargs): a mapping or an iterable of pairs, then the keywords.
absl::StatusOr<Dict> BuildDict(std::string_view function, const CallArgs& args) {
  if (args.positional.size() > 1) {
    return absl::InvalidArgumentError(
        Cat(function, " expected at most 1 argument, got ", args.positional.size()));
  }
  Dict out;
  if (!args.positional.empty()) {
    const Value& source = args.positional[0];
    if (source.is_dict()) {
      out = source.dict();
    } else {
      PS_ASSIGN_OR_RETURN(std::vector<Value> pairs, Iterate(source));
      for (const Value& pair : pairs) {
        PS_ASSIGN_OR_RETURN(std::vector<Value> kv, Iterate(pair));
        if (kv.size() != 2) {
          return absl::InvalidArgumentError(
              Cat(function, ": sequence elements must have length 2"));
        }
        if (!IsHashable(kv[0]))
          return absl::InvalidArgumentError(Cat("unhashable type: '", kv[0].TypeName(), "'"));
        out.Set(kv[0], kv[1]);
      }
    }
  }
  for (const auto& [key, value] : args.keywords) out.Set(Value(key), value);
  return out;
}

absl::StatusOr<Value> DictGlobal(Interpreter&, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(Dict d, BuildDict("dict", args));
  return Value::FromDict(std::move(d));
}

absl::StatusOr<Value> NamespaceGlobal(Interpreter&, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(Dict d, BuildDict("namespace", args));
  for (const auto& [key, value] : d.entries()) {
    if (key.is_string() && !key.str().empty() && key.str()[0] == '_') {
      return absl::InvalidArgumentError(
          Cat("cannot store underscore-prefixed attribute '", key.str(), "' on a namespace"));
    }
    if (value.has_namespace())
      return absl::UnimplementedError("a namespace holding another namespace is not supported");
  }
  return Value::Namespace(std::move(d));
}

absl::StatusOr<Value> RaiseException(Interpreter&, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("raise_exception", args, {{"message", std::nullopt}}));
  const std::string message = a[0].is_string() ? a[0].str() : "";
  return absl::InvalidArgumentError(message.empty() ? "raise_exception() called by the template"
                                                    : message);
}

// Python's datetime.strftime on a naive datetime: %f is the microseconds (0
// here), %z and %Z are empty, the rest is C's strftime.
std::string PythonFormat(std::string_view format) {
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out.push_back(format[i]);
      continue;
    }
    const char c = format[++i];
    if (c == 'f') {
      out += "000000";
    } else if (c != 'z' && c != 'Z') {
      out.push_back('%');
      out.push_back(c);
    }
  }
  return out;
}

absl::StatusOr<Value> StrftimeNow(Interpreter& in, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("strftime_now", args, {{"format", std::nullopt}}));
  PS_ASSIGN_OR_RETURN(std::string format, StringArg("strftime_now", "format", a[0]));
  const std::string c_format = PythonFormat(format);
  if (c_format.empty()) return Value("");
  const std::tm now = in.Now();
  for (size_t size = 256; size <= 65536; size *= 4) {
    std::string buf(size, '\0');
    // A leading byte tells an empty result apart from a buffer too small.
    const size_t n = std::strftime(buf.data(), buf.size(), ("x" + c_format).c_str(), &now);
    if (n > 0) {
      buf.resize(n);
      PS_RETURN_IF_ERROR(in.ChargeBytes(n));
      return Value(buf.substr(1));
    }
  }
  return absl::ResourceExhaustedError("strftime_now: the formatted date is longer than 64 KiB");
}

class Joiner final : public Callable {
 public:
  explicit Joiner(std::string separator) : separator_(std::move(separator)) {}
  std::string Describe() const override { return "joiner"; }
  absl::StatusOr<Value> Call(Interpreter&, CallArgs) const override {
    if (!used_) {
      used_ = true;
      return Value("");
    }
    return Value(separator_);
  }

 private:
  std::string separator_;
  mutable bool used_ = false;
};

absl::StatusOr<Value> JoinerGlobal(Interpreter&, const CallArgs& args) {
  PS_ASSIGN_OR_RETURN(auto a, BindArgs("joiner", args, {{"sep", Value(", ")}}));
  PS_ASSIGN_OR_RETURN(std::string sep, StringArg("joiner", "sep", a[0]));
  return Value::Function(std::make_shared<Joiner>(std::move(sep)));
}

absl::StatusOr<Value> NotImplementedGlobal(Interpreter&, const CallArgs&) {
  return absl::UnimplementedError("lipsum() and cycler() are not supported");
}

}  // namespace

void AddGlobals(absl::flat_hash_map<std::string, Value>* vars) {
  static constexpr std::pair<std::string_view, GlobalFn> kGlobals[] = {
      {"range", Range},
      {"dict", DictGlobal},
      {"namespace", NamespaceGlobal},
      {"raise_exception", RaiseException},
      {"strftime_now", StrftimeNow},
      {"joiner", JoinerGlobal},
      {"cycler", NotImplementedGlobal},
      {"lipsum", NotImplementedGlobal},
  };
  for (const auto& [name, fn] : kGlobals) {
    (*vars)[std::string(name)] = Value::Function(std::make_shared<BuiltinFunction>(name, fn));
  }
}

}  // namespace pagedserve::chat
