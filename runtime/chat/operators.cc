#include "runtime/chat/operators.h"

#include <cmath>
#include <limits>
#include <optional>

#include "absl/status/status.h"
#include "runtime/chat/interpreter.h"
#include "runtime/chat/methods.h"
#include "runtime/chat/py_format.h"
#include "runtime/chat/py_text.h"
#include "runtime/chat/str_cat.h"
#include "runtime/common/status_macros.h"

namespace pagedserve::chat {
namespace {

absl::Status TypeError(const std::string& message) { return absl::InvalidArgumentError(message); }

absl::Status Unsupported(std::string_view op, const Value& a, const Value& b) {
  return TypeError(Cat("unsupported operand type(s) for ", op, ": '", a.TypeName(), "' and '",
                       b.TypeName(), "'"));
}

absl::Status Overflow() { return TypeError("integer overflow (integers are limited to 64 bits)"); }

absl::Status ZeroDivision() { return TypeError("division by zero"); }

// jinja2's object_type_repr: "dict object", "None", ...
std::string ObjectTypeRepr(const Value& obj) {
  if (obj.is_none()) return "None";
  if (obj.is_namespace()) return "jinja2.utils.Namespace object";
  return Cat(obj.TypeName(), " object");
}

Value MissingAttribute(const Value& obj, std::string_view name) {
  return Value::Undefined(Cat("'", ObjectTypeRepr(obj), "' has no attribute '", name, "'"));
}

Value MissingElement(const Value& obj, const Value& key) {
  return Value::Undefined(Cat(ObjectTypeRepr(obj), " has no element ", PyRepr(key)));
}

absl::StatusOr<Value> AddValues(const Value& a, const Value& b, Interpreter& interpreter) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.as_double() + b.as_double());
    int64_t r;
    if (__builtin_add_overflow(a.as_int(), b.as_int(), &r)) return Overflow();
    return Value(r);
  }
  if (a.is_string() && b.is_string()) {
    PS_RETURN_IF_ERROR(interpreter.ChargeBytes(a.str().size() + b.str().size()));
    if (!a.is_markup() && !b.is_markup()) return Value(a.str() + b.str());
    // markupsafe: Markup + str escapes the plain side
    return Value::Markup((a.is_markup() ? a.str() : HtmlEscape(a.str())) +
                         (b.is_markup() ? b.str() : HtmlEscape(b.str())));
  }
  if (a.is_list_or_tuple() && b.is_list_or_tuple() && a.is_tuple() == b.is_tuple()) {
    PS_RETURN_IF_ERROR(
        interpreter.CountIterations(static_cast<int64_t>(a.items().size() + b.items().size())));
    std::vector<Value> items = a.items();
    items.insert(items.end(), b.items().begin(), b.items().end());
    return a.is_tuple() ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
  }
  if (a.is_string()) {
    return TypeError(Cat("can only concatenate str (not \"", b.TypeName(), "\") to str"));
  }
  if (a.is_list_or_tuple()) {
    return TypeError(Cat("can only concatenate ", a.TypeName(), " (not \"", b.TypeName(), "\") to ",
                         a.TypeName()));
  }
  return Unsupported("+", a, b);
}

absl::StatusOr<Value> Repeat(const Value& seq, int64_t n, Interpreter& interpreter) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    if (n > 0 &&
        seq.str().size() > interpreter.limits().max_output_bytes / static_cast<uint64_t>(n)) {
      return interpreter.ChargeBytes(interpreter.limits().max_output_bytes + 1);
    }
    PS_RETURN_IF_ERROR(interpreter.ChargeBytes(seq.str().size() * n));
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  const uint64_t total = static_cast<uint64_t>(n) * seq.items().size();
  if (n > 0 && total / static_cast<uint64_t>(n) != seq.items().size()) return Overflow();
  PS_RETURN_IF_ERROR(
      interpreter.CountIterations(static_cast<int64_t>(std::min<uint64_t>(total, INT64_MAX))));
  std::vector<Value> items;
  for (int64_t i = 0; i < n; ++i) items.insert(items.end(), seq.items().begin(), seq.items().end());
  return seq.is_tuple() ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
}

absl::StatusOr<Value> Multiply(const Value& a, const Value& b, Interpreter& interpreter) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return Value(a.as_double() * b.as_double());
    int64_t r;
    if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r)) return Overflow();
    return Value(r);
  }
  if ((a.is_string() || a.is_list_or_tuple()) && b.is_integral())
    return Repeat(a, b.as_int(), interpreter);
  if ((b.is_string() || b.is_list_or_tuple()) && a.is_integral())
    return Repeat(b, a.as_int(), interpreter);
  return Unsupported("*", a, b);
}

int64_t FloorDivInt(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t ModInt(int64_t a, int64_t b) {
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// CPython's float_divmod.
void FloatDivMod(double a, double b, double* floordiv, double* mod) {
  double m = std::fmod(a, b);
  double div = (a - m) / b;
  if (m != 0) {
    if ((b < 0) != (m < 0)) {
      m += b;
      div -= 1.0;
    }
  } else {
    m = std::copysign(0.0, b);
  }
  double fd;
  if (div != 0) {
    fd = std::floor(div);
    if (div - fd > 0.5) fd += 1.0;
  } else {
    fd = std::copysign(0.0, a / b);
  }
  *floordiv = fd;
  *mod = m;
}

absl::StatusOr<Value> Divide(BinaryOp op, const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) {
    return Unsupported(op == BinaryOp::kDiv ? "/" : op == BinaryOp::kFloorDiv ? "//" : "%", a, b);
  }
  if (b.as_double() == 0) return ZeroDivision();
  if (op == BinaryOp::kDiv) return Value(a.as_double() / b.as_double());
  if (!a.is_float() && !b.is_float()) {
    if (a.as_int() == INT64_MIN && b.as_int() == -1) {
      if (op == BinaryOp::kMod) return Value(int64_t{0});
      return Overflow();
    }
    return Value(op == BinaryOp::kFloorDiv ? FloorDivInt(a.as_int(), b.as_int())
                                           : ModInt(a.as_int(), b.as_int()));
  }
  double fd, mod;
  FloatDivMod(a.as_double(), b.as_double(), &fd, &mod);
  return Value(op == BinaryOp::kFloorDiv ? fd : mod);
}

absl::StatusOr<Value> Power(const Value& a, const Value& b) {
  if (!a.is_number() || !b.is_number()) return Unsupported("** or pow()", a, b);
  if (a.is_float() || b.is_float() || b.as_int() < 0) {
    if (a.as_double() == 0 && b.as_double() < 0)
      return TypeError("0.0 cannot be raised to a negative power");
    return Value(std::pow(a.as_double(), b.as_double()));
  }
  int64_t base = a.as_int(), exp = b.as_int(), result = 1;
  while (exp > 0) {
    if ((exp & 1) && __builtin_mul_overflow(result, base, &result)) return Overflow();
    exp >>= 1;
    if (exp > 0 && __builtin_mul_overflow(base, base, &base)) return Overflow();
  }
  return Value(result);
}

absl::StatusOr<bool> SequenceLess(const std::vector<Value>& a, const std::vector<Value>& b) {
  const size_t n = std::min(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    if (Equals(a[i], b[i])) continue;
    return LessThan(a[i], b[i]);
  }
  return a.size() < b.size();
}

absl::StatusOr<bool> Ordered(CompareOp op, const Value& a, const Value& b) {
  switch (op) {
    case CompareOp::kLt: return LessThan(a, b);
    case CompareOp::kGt: return LessThan(b, a);
    case CompareOp::kLe: {
      PS_ASSIGN_OR_RETURN(bool gt, LessThan(b, a));
      return !gt;
    }
    default: {
      PS_ASSIGN_OR_RETURN(bool lt, LessThan(a, b));
      return !lt;
    }
  }
}

// An index into a sequence of `size`, Python-style (negative from the end); -1 when out of range.
int64_t NormalizeIndex(int64_t index, size_t size) {
  if (index < 0) index += static_cast<int64_t>(size);
  return index >= 0 && index < static_cast<int64_t>(size) ? index : -1;
}

absl::StatusOr<Value> SequenceItem(const Value& obj, const Value& key) {
  if (obj.is_string()) {
    const std::u32string cps = DecodeUtf8(obj.str());
    const int64_t i = NormalizeIndex(key.as_int(), cps.size());
    if (i < 0) return MissingElement(obj, key);
    std::string out;
    AppendUtf8(cps[i], &out);
    return Value(std::move(out));
  }
  const int64_t i = NormalizeIndex(key.as_int(), obj.items().size());
  if (i < 0) return MissingElement(obj, key);
  return obj.items()[i];
}

// Python's slice.indices: the positions a slice visits.
std::vector<int64_t> SliceIndices(int64_t size, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, int64_t step) {
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) -> int64_t {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) {
      x += size;
      if (x < 0) x = step < 0 ? -1 : 0;
    } else if (x >= size) {
      x = step < 0 ? size - 1 : size;
    }
    return x;
  };
  const int64_t lo = clamp(start, step < 0 ? size - 1 : 0);
  const int64_t hi = clamp(stop, step < 0 ? -1 : size);
  std::vector<int64_t> out;
  if (step > 0) {
    for (int64_t i = lo; i < hi; i += step) out.push_back(i);
  } else {
    for (int64_t i = lo; i > hi; i += step) out.push_back(i);
  }
  return out;
}

}  // namespace

absl::Status UndefinedError(const Value& undefined) {
  const std::string& hint = undefined.undefined_hint();
  return absl::InvalidArgumentError(hint.empty() ? "undefined value" : hint);
}

absl::StatusOr<Value> BinaryOperation(BinaryOp op, const Value& a, const Value& b,
                                      Interpreter& interpreter) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  switch (op) {
    case BinaryOp::kAdd: return AddValues(a, b, interpreter);
    case BinaryOp::kSub:
      if (!a.is_number() || !b.is_number()) return Unsupported("-", a, b);
      if (a.is_float() || b.is_float()) return Value(a.as_double() - b.as_double());
      {
        int64_t r;
        if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return Overflow();
        return Value(r);
      }
    case BinaryOp::kMul: return Multiply(a, b, interpreter);
    case BinaryOp::kMod:
      if (a.is_string()) {
        PS_ASSIGN_OR_RETURN(std::string text, a.is_markup() ? MarkupPercentFormat(a.str(), b)
                                                            : PercentFormat(a.str(), b));
        PS_RETURN_IF_ERROR(interpreter.ChargeBytes(text.size()));
        return a.is_markup() ? Value::Markup(std::move(text)) : Value(std::move(text));
      }
      return Divide(op, a, b);
    case BinaryOp::kDiv:
    case BinaryOp::kFloorDiv: return Divide(op, a, b);
    case BinaryOp::kPow: return Power(a, b);
    default: return absl::InternalError("and/or are evaluated by the interpreter");
  }
}

absl::StatusOr<Value> UnarySign(const Value& v, bool negate) {
  if (v.is_undefined()) return UndefinedError(v);
  if (!v.is_number()) {
    return TypeError(
        Cat("bad operand type for unary ", negate ? "-" : "+", ": '", v.TypeName(), "'"));
  }
  if (v.is_float()) return Value(negate ? -v.as_double() : v.as_double());
  if (!negate) return Value(v.as_int());
  if (v.as_int() == INT64_MIN) return Overflow();
  return Value(-v.as_int());
}

absl::StatusOr<bool> LessThan(const Value& a, const Value& b) {
  if (a.is_undefined()) return UndefinedError(a);
  if (b.is_undefined()) return UndefinedError(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return DecodeUtf8(a.str()) < DecodeUtf8(b.str());
  if (a.is_list_or_tuple() && b.is_list_or_tuple() && a.is_tuple() == b.is_tuple()) {
    return SequenceLess(a.items(), b.items());
  }
  return TypeError(
      Cat("'<' not supported between instances of '", a.TypeName(), "' and '", b.TypeName(), "'"));
}

absl::StatusOr<bool> CompareValues(CompareOp op, const Value& a, const Value& b) {
  switch (op) {
    case CompareOp::kEq: return Equals(a, b);
    case CompareOp::kNe: return !Equals(a, b);
    case CompareOp::kIn: return Contains(b, a);
    case CompareOp::kNotIn: {
      PS_ASSIGN_OR_RETURN(bool in, Contains(b, a));
      return !in;
    }
    default: return Ordered(op, a, b);
  }
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return TypeError(
            Cat("'in <string>' requires string as left operand, not ", item.TypeName()));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      if (container.is_generator() && container.ConsumeGenerator()) return false;
      for (const Value& v : container.items()) {
        if (Equals(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      if (!IsHashable(item)) return TypeError(Cat("unhashable type: '", item.TypeName(), "'"));
      return container.dict().Find(item) != nullptr;
    default: return TypeError(Cat("argument of type '", container.TypeName(), "' is not iterable"));
  }
}

absl::StatusOr<std::vector<Value>> Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return std::vector<Value>();
    case Value::Kind::kList:
      if (v.is_generator() && v.ConsumeGenerator()) return std::vector<Value>();
      return v.items();
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      keys.reserve(v.dict().size());
      for (const auto& entry : v.dict().entries()) keys.push_back(entry.first);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (char32_t c : DecodeUtf8(v.str())) {
        std::string s;
        AppendUtf8(c, &s);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    default: return TypeError(Cat("'", v.TypeName(), "' object is not iterable"));
  }
}

absl::StatusOr<int64_t> Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(CodePointCount(v.str()));
    case Value::Kind::kList:
      if (v.is_generator()) break;
      return static_cast<int64_t>(v.items().size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.dict().size());
    default: break;
  }
  return TypeError(Cat("object of type '", v.TypeName(), "' has no len()"));
}

// real / imag / numerator / denominator of a number.
static std::optional<Value> NumberAttribute(const Value& obj, std::string_view name) {
  if (!obj.is_number()) return std::nullopt;
  if (name == "real") return obj.is_float() ? Value(obj.as_double()) : Value(obj.as_int());
  if (name == "imag") return obj.is_float() ? Value(0.0) : Value(0);
  if (obj.is_float()) return std::nullopt;
  if (name == "numerator") return Value(obj.as_int());
  if (name == "denominator") return Value(1);
  return std::nullopt;
}

absl::StatusOr<Value> GetAttribute(const Value& obj, std::string_view name) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if (name.size() >= 2 && name.substr(0, 2) == "__") {
    return Value::Undefined(
        Cat("access to attribute '", name, "' of '", obj.TypeName(), "' object is unsafe."));
  }
  if (std::optional<Value> method = LookupMethod(obj, name)) return *method;
  if (std::optional<Value> attribute = NumberAttribute(obj, name)) return *attribute;
  if (obj.is_dict()) {
    if (const Value* v = obj.dict().Find(name)) return *v;
  } else if (obj.is_namespace()) {
    if (const Value* v = obj.namespace_attrs().Find(name)) return *v;
  }
  return MissingAttribute(obj, name);
}

absl::StatusOr<Value> GetItem(const Value& obj, const Value& key) {
  if (obj.is_undefined()) return UndefinedError(obj);
  if ((obj.is_list_or_tuple() || obj.is_string()) && key.is_integral())
    return SequenceItem(obj, key);
  if (obj.is_dict() && IsHashable(key)) {
    if (const Value* v = obj.dict().Find(key)) return *v;
  }
  if (key.is_string()) {  // jinja2 falls back to the attribute of that name
    if (obj.is_namespace()) return GetAttribute(obj, key.str());
    if (std::optional<Value> method = LookupMethod(obj, key.str())) return *method;
    return MissingAttribute(obj, key.str());
  }
  return MissingElement(obj, key);
}

absl::StatusOr<Value> SliceValue(const Value& obj, const Value& start, const Value& stop,
                                 const Value& step) {
  if (obj.is_undefined()) return UndefinedError(obj);
  auto bound = [](const Value& v) -> std::optional<int64_t> {
    if (v.is_integral()) return v.as_int();
    return std::nullopt;
  };
  for (const Value* v : {&start, &stop, &step}) {
    if (!v->is_integral() && !v->is_none() && !v->is_undefined())
      return Value::Undefined("slice indices must be integers or None");
  }
  const int64_t step_value = bound(step).value_or(1);
  if (step_value == 0) return TypeError("slice step cannot be zero");
  if (obj.is_string()) {
    const std::u32string cps = DecodeUtf8(obj.str());
    std::u32string out;
    for (int64_t i :
         SliceIndices(static_cast<int64_t>(cps.size()), bound(start), bound(stop), step_value)) {
      out.push_back(cps[i]);
    }
    return Value(EncodeUtf8(out));
  }
  if (!obj.is_list_or_tuple())
    return Value::Undefined(Cat(ObjectTypeRepr(obj), " has no element slice"));
  std::vector<Value> out;
  for (int64_t i : SliceIndices(static_cast<int64_t>(obj.items().size()), bound(start), bound(stop),
                                step_value)) {
    out.push_back(obj.items()[i]);
  }
  return obj.is_tuple() ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
}

}  // namespace pagedserve::chat
