#include "runtime/coordinator/block_hash.h"

#include <openssl/evp.h>

#include <cstring>
#include <vector>

namespace pagedserve {
namespace {

void PutU64(std::vector<unsigned char>& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void PutU32(std::vector<unsigned char>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

}  // namespace

BlockHash Sha256BlockHash(const BlockHash& parent, absl::Span<const int32_t> token_ids,
                          absl::Span<const int64_t> extra_keys) {
  thread_local std::vector<unsigned char> buf;
  buf.clear();
  buf.reserve(32 + 4 * token_ids.size() + 8 * extra_keys.size());
  PutU64(buf, parent.hi);
  PutU64(buf, parent.lo);
  PutU64(buf, token_ids.size());
  for (int32_t t : token_ids) PutU32(buf, static_cast<uint32_t>(t));
  PutU64(buf, extra_keys.size());
  for (int64_t k : extra_keys) PutU64(buf, static_cast<uint64_t>(k));
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  // EVP_Digest only fails on allocation failure inside OpenSSL; a zero digest
  // would then merely make every hit go through verification and miss.
  if (EVP_Digest(buf.data(), buf.size(), digest, &len, EVP_sha256(), nullptr) != 1 || len < 16) {
    std::memset(digest, 0, sizeof(digest));
  }
  BlockHash h;
  for (int i = 0; i < 8; ++i) {
    h.hi = (h.hi << 8) | digest[i];
    h.lo = (h.lo << 8) | digest[8 + i];
  }
  return h;
}

}  // namespace pagedserve
