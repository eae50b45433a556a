#include "runtime/common/cache_salt.h"

#include <cstdio>

#include "absl/strings/str_cat.h"
#include "runtime/common/field_error.h"

namespace pagedserve {

absl::Status ValidateCacheSalt(std::string_view salt) {
  if (salt.empty()) return FieldError("cache_salt", "cache_salt must be a non-empty string");
  if (salt.size() > kMaxCacheSaltBytes) {
    return FieldError("cache_salt", absl::StrCat("cache_salt is ", salt.size(), " bytes; at most ",
                                                 kMaxCacheSaltBytes, " are allowed"));
  }
  for (size_t i = 0; i < salt.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(salt[i]);
    if (c < 0x21 || c > 0x7E) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", c);
      return FieldError(
          "cache_salt",
          absl::StrCat("cache_salt byte ", i, " is ", hex,
                       "; only visible ASCII characters (0x21..0x7E, e.g. base64url) are allowed"));
    }
  }
  return absl::OkStatus();
}

std::vector<int64_t> CacheSaltKeys(std::string_view salt) {
  if (salt.empty()) return {};
  std::vector<int64_t> keys{kCacheSaltTag, static_cast<int64_t>(salt.size())};
  for (size_t i = 0; i < salt.size(); i += 8) {
    uint64_t w = 0;
    for (size_t b = 0; b < 8 && i + b < salt.size(); ++b) {
      w |= static_cast<uint64_t>(static_cast<unsigned char>(salt[i + b])) << (8 * b);
    }
    keys.push_back(static_cast<int64_t>(w));
  }
  return keys;
}

}  // namespace pagedserve
