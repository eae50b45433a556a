#include "runtime/coordinator/block_hash.h"

#include <openssl/evp.h>

#include <cstring>
#include <memory>
#include <vector>

namespace pagedserve {
namespace {

// Little-endian, fixed width, whatever the host order (one store on x86).
unsigned char* PutU64(unsigned char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) *p++ = static_cast<unsigned char>(v >> (8 * i));
  return p;
}
unsigned char* PutU32(unsigned char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) *p++ = static_cast<unsigned char>(v >> (8 * i));
  return p;
}

// SHA-256 fetched once: EVP_Digest(..., EVP_sha256(), ...) fetches the
// algorithm from the provider and allocates a context on every call, which
// cost more than hashing a 16-token block (OpenSSL 3 "performance" notes
// recommend explicit fetching for repeated use).
const EVP_MD* Sha256() {
  static const EVP_MD* md = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  return md;
}

struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

}  // namespace

std::array<uint8_t, 32> Sha256Digest(absl::Span<const uint8_t> data) {
  thread_local std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  std::array<uint8_t, 32> out{};
  // These fail only on allocation failure inside OpenSSL; a zero digest would
  // then merely make every hit go through verification and miss.
  if (ctx == nullptr || Sha256() == nullptr ||
      EVP_DigestInit_ex2(ctx.get(), Sha256(), nullptr) != 1 ||
      EVP_DigestUpdate(ctx.get(), data.data(), data.size()) != 1 ||
      EVP_DigestFinal_ex(ctx.get(), digest, &len) != 1 || len != out.size()) {
    return out;
  }
  std::memcpy(out.data(), digest, out.size());
  return out;
}

BlockHash Sha256BlockHash(const BlockHash& parent, absl::Span<const int32_t> token_ids,
                          absl::Span<const int64_t> extra_keys) {
  thread_local std::vector<unsigned char> buf;
  buf.resize(32 + 4 * token_ids.size() + 8 * extra_keys.size());
  unsigned char* p = buf.data();
  p = PutU64(p, parent.hi);
  p = PutU64(p, parent.lo);
  p = PutU64(p, token_ids.size());
  for (int32_t t : token_ids) p = PutU32(p, static_cast<uint32_t>(t));
  p = PutU64(p, extra_keys.size());
  for (int64_t k : extra_keys) p = PutU64(p, static_cast<uint64_t>(k));
  const std::array<uint8_t, 32> digest = Sha256Digest(buf);
  BlockHash h;
  for (int i = 0; i < 8; ++i) {
    h.hi = (h.hi << 8) | digest[i];
    h.lo = (h.lo << 8) | digest[8 + i];
  }
  return h;
}

}  // namespace pagedserve
