#include "runtime/chat/value.h"

#include <algorithm>
#include <cmath>

namespace pagedserve::chat {
namespace {

const std::string& EmptyString() {
  static const std::string* empty = new std::string();
  return *empty;
}

bool NumbersEqual(const Value& a, const Value& b) {
  if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
  return a.as_int() == b.as_int();
}

// Python: lists and tuples compare item by item, dict_keys and dict_items as
// sets, generators and dict_values by identity.
bool ListsEqual(const Value& a, const Value& b) {
  if (a.seq_kind() != b.seq_kind()) return false;
  const SeqKind kind = a.seq_kind();
  if (kind == SeqKind::kGenerator || kind == SeqKind::kDictValues)
    return a.identity() == b.identity();
  const auto& x = a.items();
  const auto& y = b.items();
  if (x.size() != y.size()) return false;
  const bool as_set = kind == SeqKind::kDictKeys || kind == SeqKind::kDictItems;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!as_set) {
      if (!Equals(x[i], y[i])) return false;
    } else if (std::none_of(y.begin(), y.end(), [&](const Value& v) { return Equals(x[i], v); })) {
      return false;
    }
  }
  return true;
}

bool DictsEqual(const Dict& a, const Dict& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [key, value] : a.entries()) {
    const Value* other = b.Find(key);
    if (other == nullptr || !Equals(value, *other)) return false;
  }
  return true;
}

}  // namespace

Value Value::Undefined(std::string hint) {
  Value v;
  v.rep_ = UndefinedRep{std::make_shared<const std::string>(std::move(hint))};
  return v;
}

Value Value::Markup(std::string s) {
  Value v;
  v.rep_ = StringRep{std::make_shared<const std::string>(std::move(s)), true};
  return v;
}

Value Value::List(std::vector<Value> items) { return Sequence(std::move(items), SeqKind::kList); }

Value Value::Tuple(std::vector<Value> items) { return Sequence(std::move(items), SeqKind::kTuple); }

Value Value::Sequence(std::vector<Value> items, SeqKind kind) {
  auto data = std::make_shared<ListData>();
  data->kind = kind;
  for (const Value& item : items) {
    data->depth = std::max(data->depth, item.depth() + 1);
    data->has_namespace = data->has_namespace || item.has_namespace();
  }
  data->items = std::move(items);
  Value v;
  v.rep_ = std::shared_ptr<const ListData>(std::move(data));
  return v;
}

bool Value::ConsumeGenerator() const {
  const bool was = list_data().consumed;
  list_data().consumed = true;
  return was;
}

Value Value::FromDict(Dict dict) {
  Value v;
  v.rep_ = std::shared_ptr<const Dict>(new Dict(std::move(dict)));
  return v;
}

Value Value::Namespace(Dict attrs) {
  Value v;
  v.rep_ = std::make_shared<NamespaceData>(NamespaceData{std::move(attrs)});
  return v;
}

Value Value::Function(std::shared_ptr<const Callable> callable) {
  Value v;
  v.rep_ = std::move(callable);
  return v;
}

int64_t Value::as_int() const {
  if (is_bool()) return as_bool() ? 1 : 0;
  return std::get<int64_t>(rep_);
}

double Value::as_double() const {
  if (is_float()) return std::get<double>(rep_);
  return static_cast<double>(as_int());
}

Dict& Value::namespace_attrs() const {
  return std::get<std::shared_ptr<NamespaceData>>(rep_)->attrs;
}

const std::string& Value::undefined_hint() const {
  const auto& hint = std::get<UndefinedRep>(rep_).hint;
  return hint ? *hint : EmptyString();
}

bool Value::Truthy() const {
  switch (kind()) {
    case Kind::kUndefined:
    case Kind::kNone: return false;
    case Kind::kBool: return as_bool();
    case Kind::kInt: return as_int() != 0;
    case Kind::kFloat: return as_double() != 0.0;
    case Kind::kString: return !str().empty();
    case Kind::kList: return seq_kind() == SeqKind::kGenerator || !items().empty();
    case Kind::kDict: return !dict().empty();
    case Kind::kNamespace:
    case Kind::kCallable: return true;
  }
  return false;
}

std::string_view Value::TypeName() const {
  switch (kind()) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList:
      switch (seq_kind()) {
        case SeqKind::kList: return "list";
        case SeqKind::kTuple: return "tuple";
        case SeqKind::kGenerator: return "generator";
        case SeqKind::kDictKeys: return "dict_keys";
        case SeqKind::kDictValues: return "dict_values";
        case SeqKind::kDictItems: return "dict_items";
      }
      return "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "object";
}

uint32_t Value::depth() const {
  switch (kind()) {
    case Kind::kList: return list_data().depth;
    case Kind::kDict: return dict().child_depth() + 1;
    case Kind::kNamespace: return namespace_attrs().child_depth() + 1;
    default: return 0;
  }
}

bool Value::has_namespace() const {
  switch (kind()) {
    case Kind::kList: return list_data().has_namespace;
    case Kind::kDict: return dict().has_namespace();
    case Kind::kNamespace: return true;
    default: return false;
  }
}

const void* Value::identity() const {
  switch (kind()) {
    case Kind::kList: return &list_data();
    case Kind::kDict: return &dict();
    case Kind::kNamespace: return std::get<std::shared_ptr<NamespaceData>>(rep_).get();
    case Kind::kCallable: return &callable();
    default: return nullptr;
  }
}

bool Equals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return NumbersEqual(a, b);
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.str() == b.str();
    case Value::Kind::kList: return ListsEqual(a, b);
    case Value::Kind::kDict: return DictsEqual(a.dict(), b.dict());
    default: return a.identity() == b.identity();
  }
}

bool IsHashable(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kNone:
    case Value::Kind::kBool:
    case Value::Kind::kInt:
    case Value::Kind::kFloat:
    case Value::Kind::kString:
    case Value::Kind::kUndefined: return true;
    case Value::Kind::kList:
      if (!v.is_tuple()) return false;
      for (const Value& item : v.items()) {
        if (!IsHashable(item)) return false;
      }
      return true;
    default: return false;
  }
}

std::optional<size_t> Dict::FindIndex(const Value& key) const {
  if (key.is_string() && !string_index_.empty()) {
    const auto it = string_index_.find(absl::string_view(key.str()));
    if (it == string_index_.end()) return std::nullopt;
    return it->second;
  }
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (Equals(entries_[i].first, key)) return i;
  }
  return std::nullopt;
}

const Value* Dict::Find(const Value& key) const {
  const std::optional<size_t> i = FindIndex(key);
  return i ? &entries_[*i].second : nullptr;
}

const Value* Dict::Find(std::string_view key) const {
  if (!string_index_.empty()) {
    const auto it = string_index_.find(absl::string_view(key.data(), key.size()));
    return it == string_index_.end() ? nullptr : &entries_[it->second].second;
  }
  for (const auto& entry : entries_) {
    if (entry.first.is_string() && entry.first.str() == key) return &entry.second;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  child_depth_ = std::max({child_depth_, key.depth(), value.depth()});
  has_namespace_ = has_namespace_ || key.has_namespace() || value.has_namespace();
  if (const std::optional<size_t> i = FindIndex(key)) {
    entries_[*i].second = std::move(value);
    return;
  }
  entries_.emplace_back(std::move(key), std::move(value));
  if (entries_.size() == kIndexFrom) {
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].first.is_string()) string_index_.emplace(entries_[i].first.str(), i);
    }
  } else if (entries_.size() > kIndexFrom && entries_.back().first.is_string()) {
    string_index_.emplace(entries_.back().first.str(), entries_.size() - 1);
  }
}

}  // namespace pagedserve::chat
