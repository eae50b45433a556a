// The `cache_salt` request field: per-tenant isolation of the prefix cache.
//
// A request may carry a salt (vLLM's `cache_salt`, its fix for CVE-2025-46570:
// prefix-cache hits leaked, through time to first token, which prompts other
// users had sent). The salt is mixed into the identity of the request's KV
// blocks, so requests with different salts never share a cached block and the
// hit/miss timing says nothing across salts; requests with the same salt (one
// tenant) share as before, and requests without a salt share among themselves.
//
// Mixing: the salt becomes CacheSaltKeys(salt), prefix-cache extra keys of the
// request (Request::cache_extra_keys, Sequence::extra_keys), which the block
// hash covers (block_hash.h) and the block manager compares on every hit. They
// enter the hash of the request's first block (and, as every extra key does,
// of each later block, though the parent chain alone would carry them on); the
// block manager's check of each hit against the stored extra keys makes the
// separation exact rather than probabilistic.
#ifndef PAGEDSERVE_RUNTIME_COMMON_CACHE_SALT_H_
#define PAGEDSERVE_RUNTIME_COMMON_CACHE_SALT_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace pagedserve {

inline constexpr size_t kMaxCacheSaltBytes = 256;

// A salt is 1..kMaxCacheSaltBytes bytes, each a visible ASCII character
// 0x21..0x7E (ValidateVisibleAscii, field_error.h: base64, hex, UUIDs and
// tenant names fit; safe to show in an error). Absent (empty) means "no salt"
// and is not checked here: callers treat an explicitly empty string in a
// request as an error before calling this. Returns InvalidArgument naming
// `cache_salt`, the length or the first bad byte (by offset and hex value,
// never echoing the salt).
absl::Status ValidateCacheSalt(std::string_view salt);

// Prefix-cache extra keys of a salt: {} for an empty salt; otherwise
// {kCacheSaltTag, size, w0, w1, ...}: the tag (keeps salts apart from other kinds
// of extra keys), the salt's length in bytes, then its bytes packed
// little-endian into 64-bit words (the last one zero-padded). The encoding is
// injective: two different salts never give the same keys, so the separation
// does not rest on a hash. At most 2 + 32 keys (256 bytes). Thread-safe.
inline constexpr int64_t kCacheSaltTag = 0x73616c74;  // "salt"
std::vector<int64_t> CacheSaltKeys(std::string_view salt);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COMMON_CACHE_SALT_H_
