#include "runtime/chat/json_value.h"

#include <cstdint>

namespace pagedserve::chat {
namespace {

template <typename Json>
Value Convert(const Json& json) {
  switch (json.type()) {
    case nlohmann::json::value_t::null: return Value(nullptr);
    case nlohmann::json::value_t::boolean: return Value(json.template get<bool>());
    case nlohmann::json::value_t::number_integer: return Value(json.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const auto u = json.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float: return Value(json.template get<double>());
    case nlohmann::json::value_t::string: return Value(json.template get_ref<const std::string&>());
    case nlohmann::json::value_t::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(Convert(item));
      return Value::List(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict dict;
      for (const auto& [key, value] : json.items()) dict.Set(Value(key), Convert(value));
      return Value::FromDict(std::move(dict));
    }
    default: return Value(nullptr);
  }
}

}  // namespace

Value FromJson(const nlohmann::ordered_json& json) { return Convert(json); }
Value FromJson(const nlohmann::json& json) { return Convert(json); }

}  // namespace pagedserve::chat
