// absl::StrCat / StrAppend that also take std::string_view (Debian's abseil
// has its own absl::string_view, which std::string_view does not convert to).
#ifndef PAGEDSERVE_RUNTIME_CHAT_STR_CAT_H_
#define PAGEDSERVE_RUNTIME_CHAT_STR_CAT_H_

#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace pagedserve::chat {

template <typename T>
decltype(auto) CatArg(const T& v) {
  if constexpr (std::is_same_v<T, std::string_view>) {
    return absl::string_view(v.data(), v.size());
  } else {
    return (v);
  }
}

template <typename... Args>
std::string Cat(const Args&... args) {
  return absl::StrCat(CatArg(args)...);
}

template <typename... Args>
void CatAppend(std::string* out, const Args&... args) {
  absl::StrAppend(out, CatArg(args)...);
}

}  // namespace pagedserve::chat

#endif  // PAGEDSERVE_RUNTIME_CHAT_STR_CAT_H_
