// Identity of a full KV block for prefix caching.
//
// A full block's hash covers its parent block's hash, its token ids and the
// request's extra keys (e.g. a cache salt or an adapter id), so that equal token
// ids after different prefixes, or under different extra keys, never share a
// block. This is the chained scheme of vLLM's automatic prefix caching.
//
// The default hash is SHA-256 (OpenSSL) of
//   parent.hi | parent.lo | num_tokens | token ids | num_extra_keys | extra keys
// (every integer little-endian, fixed width), truncated to its first 128 bits.
// The block manager still verifies every hit against the stored token ids and
// parent, so a collision (possible only with a weak, injected hash) can cost a
// cache miss but never serves another prefix's K/V.
#ifndef PAGEDSERVE_RUNTIME_COORDINATOR_BLOCK_HASH_H_
#define PAGEDSERVE_RUNTIME_COORDINATOR_BLOCK_HASH_H_

#include <array>
#include <cstdint>
#include <functional>
#include <utility>

#include "absl/types/span.h"

namespace pagedserve {

struct BlockHash {
  uint64_t hi = 0;
  uint64_t lo = 0;
  bool operator==(const BlockHash&) const = default;

  template <typename H>
  friend H AbslHashValue(H h, const BlockHash& b) {
    return H::combine(std::move(h), b.hi, b.lo);
  }
};

// Parent hash of a sequence's first block.
inline constexpr BlockHash kRootBlockHash{};

// Hash of one full block given its parent's hash. Must be deterministic.
using BlockHashFn =
    std::function<BlockHash(const BlockHash& parent, absl::Span<const int32_t> token_ids,
                            absl::Span<const int64_t> extra_keys)>;

// SHA-256 (FIPS 180-4) of `data`: the primitive under Sha256BlockHash (OpenSSL
// EVP). All zero only if OpenSSL fails to allocate.
std::array<uint8_t, 32> Sha256Digest(absl::Span<const uint8_t> data);

// SHA-256 based default (see the file comment).
BlockHash Sha256BlockHash(const BlockHash& parent, absl::Span<const int32_t> token_ids,
                          absl::Span<const int64_t> extra_keys);

}  // namespace pagedserve

#endif  // PAGEDSERVE_RUNTIME_COORDINATOR_BLOCK_HASH_H_
