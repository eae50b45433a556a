// The values a chat template computes with, modelled on the Python objects
// jinja2 sees: undefined (jinja2's default Undefined), None, bool, int, float,
// str, list, tuple, dict (insertion order, as Python's), namespace and
// callables (macros, globals, bound methods, loop.cycle).
//
// Strings are UTF-8 bytes, shared between copies; the operations that Python defines on code points
// (len, indexing, slicing, iteration) decode them (runtime/chat/py_text.h).
// Lists, tuples and dicts are immutable once built (the sandbox forbids
// append/update/pop), so copies share them; a namespace is the one mutable
// object ({% set ns.attr = ... %}) and is shared by reference like Python's.
// Integers are int64: arithmetic that overflows is an error, not a big int.
#ifndef PAGEDSERVE_RUNTIME_CHAT_VALUE_H_
#define PAGEDSERVE_RUNTIME_CHAT_VALUE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace pagedserve::chat {

class Value;
class Dict;
class Callable;
class Interpreter;

// What kind of Python sequence a list value stands for: a list or a tuple, or
// what filters and dict methods return in Python: a generator (select, map,
// unique, items ...: always true, no len(), no indexing, one pass only, not
// printable or JSON-serializable) or a dict view (keys(), values(), items():
// no indexing, not JSON-serializable).
enum class SeqKind : uint8_t { kList, kTuple, kGenerator, kDictKeys, kDictValues, kDictItems };

struct ListData {
  std::vector<Value> items;
  SeqKind kind = SeqKind::kList;
  uint32_t depth = 1;             // nesting of lists/dicts, this one included
  bool has_namespace = false;     // a namespace somewhere inside
  mutable bool consumed = false;  // a generator that was iterated
};

struct NamespaceData;

class Value {
 public:
  // The order matches the alternatives of Rep.
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,  // also markupsafe's Markup (|safe, |escape): see is_markup()
    kList,    // lists, tuples, generators, dict views: see seq_kind()
    kDict,
    kNamespace,
    kCallable,
  };

  Value() = default;  // undefined, no hint
  Value(std::nullptr_t) : rep_(nullptr) {}
  Value(bool b) : rep_(b) {}
  Value(int i) : rep_(int64_t{i}) {}
  Value(int64_t i) : rep_(i) {}
  Value(double d) : rep_(d) {}
  Value(std::string s)
      : rep_(StringRep{std::make_shared<const std::string>(std::move(s)), false}) {}
  Value(std::string_view s) : Value(std::string(s)) {}
  Value(const char* s) : Value(std::string(s)) {}

  // `hint` is the message of the error raised when the value is used in a way
  // jinja2's Undefined refuses (arithmetic, attribute access, calls ...).
  static Value Undefined(std::string hint);
  // A string marked safe (markupsafe.Markup): `+` with a plain string
  // HTML-escapes the plain one.
  static Value Markup(std::string s);
  static Value List(std::vector<Value> items);
  static Value Tuple(std::vector<Value> items);
  static Value Sequence(std::vector<Value> items, SeqKind kind);
  static Value FromDict(Dict dict);
  static Value Namespace(Dict attrs);
  static Value Function(std::shared_ptr<const Callable> callable);

  Kind kind() const { return static_cast<Kind>(rep_.index()); }
  bool is_undefined() const { return kind() == Kind::kUndefined; }
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_bool() const { return kind() == Kind::kBool; }
  bool is_int() const { return kind() == Kind::kInt; }
  bool is_float() const { return kind() == Kind::kFloat; }
  bool is_string() const { return kind() == Kind::kString; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }
  bool is_namespace() const { return kind() == Kind::kNamespace; }
  bool is_callable() const { return kind() == Kind::kCallable; }
  // Python numbers: bool, int and float (bool is an int in Python).
  bool is_number() const { return is_bool() || is_int() || is_float(); }
  // int or bool: usable where Python wants an integer.
  bool is_integral() const { return is_bool() || is_int(); }
  bool is_tuple() const { return is_list() && list_data().kind == SeqKind::kTuple; }
  bool is_markup() const { return is_string() && std::get<StringRep>(rep_).markup; }
  SeqKind seq_kind() const { return list_data().kind; }
  // A Python list or tuple (indexable, has len(), JSON-serializable).
  bool is_list_or_tuple() const {
    return is_list() && (list_data().kind == SeqKind::kList || list_data().kind == SeqKind::kTuple);
  }
  bool is_generator() const { return is_list() && list_data().kind == SeqKind::kGenerator; }
  // Marks a generator as iterated; returns whether it already was.
  bool ConsumeGenerator() const;

  bool as_bool() const { return std::get<bool>(rep_); }
  // The integer value of an int or a bool.
  int64_t as_int() const;
  // The value of any number as a double.
  double as_double() const;
  const std::string& str() const { return *std::get<StringRep>(rep_).text; }
  const std::vector<Value>& items() const { return list_data().items; }
  const Dict& dict() const { return *std::get<std::shared_ptr<const Dict>>(rep_); }
  // A namespace's attributes; mutable through any copy of the value.
  Dict& namespace_attrs() const;
  const Callable& callable() const { return *std::get<std::shared_ptr<const Callable>>(rep_); }
  const std::string& undefined_hint() const;

  // Python truthiness (an undefined is false).
  bool Truthy() const;
  // Python's type name ("str", "dict", "NoneType" ...) for messages.
  std::string_view TypeName() const;
  // Identity of shared objects (namespaces, callables, lists) for `is sameas`.
  const void* identity() const;
  // Containers nested inside one another, this one included (0 for scalars).
  // The interpreter bounds it, so that every walk over a value is shallow.
  uint32_t depth() const;
  // Whether a namespace is this value or inside it: a namespace never holds
  // one, so that namespaces cannot form cycles.
  bool has_namespace() const;

 private:
  struct UndefinedRep {
    std::shared_ptr<const std::string> hint;
  };
  // Shared: copying a value (every variable read) never copies its text.
  struct StringRep {
    std::shared_ptr<const std::string> text;
    bool markup;
  };
  using Rep = std::variant<UndefinedRep, std::nullptr_t, bool, int64_t, double, StringRep,
                           std::shared_ptr<const ListData>, std::shared_ptr<const Dict>,
                           std::shared_ptr<NamespaceData>, std::shared_ptr<const Callable>>;
  const ListData& list_data() const { return *std::get<std::shared_ptr<const ListData>>(rep_); }

  Rep rep_;
};

// An insertion-ordered map with Python key semantics (1, 1.0 and True are one
// key). String keys are hashed once a dict holds more than a few; other keys
// are looked up linearly (templates rarely use them).
class Dict {
 public:
  using Entry = std::pair<Value, Value>;

  const Value* Find(const Value& key) const;
  const Value* Find(std::string_view key) const;
  const Value* Find(const std::string& key) const { return Find(std::string_view(key)); }
  const Value* Find(const char* key) const { return Find(std::string_view(key)); }
  // Inserts at the end, or replaces the value of an existing key in place.
  void Set(Value key, Value value);
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  const std::vector<Entry>& entries() const { return entries_; }
  // Of the values (and keys), as Value::depth / has_namespace; a replaced
  // value's depth still counts (an upper bound).
  uint32_t child_depth() const { return child_depth_; }
  bool has_namespace() const { return has_namespace_; }

 private:
  static constexpr size_t kIndexFrom = 16;  // entries before string keys get hashed
  std::optional<size_t> FindIndex(const Value& key) const;

  std::vector<Entry> entries_;
  absl::flat_hash_map<std::string, size_t> string_index_;  // built at kIndexFrom entries
  uint32_t child_depth_ = 0;
  bool has_namespace_ = false;
};

struct NamespaceData {
  Dict attrs;
};

// Arguments of a call: positional, then keyword, as Python passes them.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};

// A function the template can call.
class Callable {
 public:
  virtual ~Callable() = default;
  // For messages: "macro 'm'", "method str.split" ...
  virtual std::string Describe() const = 0;
  virtual absl::StatusOr<Value> Call(Interpreter& interpreter, CallArgs args) const = 0;
};

// Python ==.
bool Equals(const Value& a, const Value& b);
// Python's hashability, for dict keys and `unique`: None, bool, numbers, str, tuples of those.
bool IsHashable(const Value& v);

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_VALUE_H_
