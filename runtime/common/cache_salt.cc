#include "runtime/common/cache_salt.h"

#include "runtime/common/field_error.h"

namespace pagedserve {

absl::Status ValidateCacheSalt(std::string_view salt) {
  return ValidateVisibleAscii("cache_salt", salt, kMaxCacheSaltBytes);
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
