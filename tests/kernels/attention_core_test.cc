// The CPU attention inner loop (kernels/cpu/attention_core.h) called directly,
// every compiled-in variant (x86-64 baseline and, where the CPU has it,
// AVX2+FMA+F16C) against a double-precision naive computation of its contract:
// per query the max logit m, the exp-sum l and the unnormalized output acc over
// the visible tokens of [t_begin, t_end). The public decode / prefill tests only
// reach the variant SelectAttend picks on the test machine; this one also runs
// the baseline, and checks the partial-range contract (t_begin > 0, queries
// that see none, part or all of the range, ALiBi, NaN in unused block slots,
// few queries per call and many, which take different paths in the AVX2
// variant for 16-bit caches).
//
// Tolerances: m within 1e-5 * (1 + |m|) (fp32 dot products of 64-256 terms);
// l within 1e-5 relative; acc within 1e-5 of the largest |acc| of the query.
// The elements are decoded exactly in both computations, so only fp32
// rounding separates them. Negative control: the reference with one visible
// token dropped fails the same check.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention_core.h"
#include "tests/kernels/kernel_test_util.h"

namespace pagedserve::kernels::testing {
namespace {

#ifdef PAGEDSERVE_KERNEL_TESTS_LIGHT
constexpr bool kLight = true;
#else
constexpr bool kLight = false;
#endif

// Encodes v as dtype t into raw storage at element index i; returns the
// decoded (exactly representable) value.
float Store(DType t, std::vector<uint8_t>& buf, size_t i, float v) {
  StoreElem(t, buf.data(), static_cast<int64_t>(i), v);
  return LoadElem(t, buf.data(), static_cast<int64_t>(i));
}

struct CoreCase {
  DType dtype;
  int block_size, head_size, num_queries;
  bool alibi;
  uint32_t seed;
  std::string Name() const {
    return absl::StrCat(DTypeName(dtype), " block ", block_size, " head_size ", head_size, " M ",
                        num_queries, " alibi ", alibi);
  }
};

struct Result {
  std::vector<double> m, l, acc;  // [M], [M], [M, hs]
};

// Whether `got` matches `ref` under the tolerances of the header comment.
bool Matches(const Result& got, const Result& ref, int hs, std::string* why) {
  const size_t M = ref.m.size();
  for (size_t q = 0; q < M; ++q) {
    if (std::isinf(ref.m[q])) {  // no visible token: exactly -inf, 0, 0
      bool ok = std::isinf(got.m[q]) && got.m[q] < 0 && got.l[q] == 0.0;
      for (int d = 0; d < hs; ++d) ok = ok && got.acc[q * hs + d] == 0.0;
      if (!ok) *why = absl::StrCat("query ", q, " sees no token but m/l/acc are not -inf/0/0");
      if (!ok) return false;
      continue;
    }
    if (!(std::abs(got.m[q] - ref.m[q]) <= 1e-5 * (1.0 + std::abs(ref.m[q])))) {
      *why = absl::StrCat("query ", q, " m ", got.m[q], " want ", ref.m[q]);
      return false;
    }
    if (!(std::abs(got.l[q] - ref.l[q]) <= 1e-5 * ref.l[q])) {
      *why = absl::StrCat("query ", q, " l ", got.l[q], " want ", ref.l[q]);
      return false;
    }
    double amax = 0.0;
    for (int d = 0; d < hs; ++d) amax = std::max(amax, std::abs(ref.acc[q * hs + d]));
    for (int d = 0; d < hs; ++d)
      if (!(std::abs(got.acc[q * hs + d] - ref.acc[q * hs + d]) <= 1e-5 * amax)) {
        *why = absl::StrCat("query ", q, " acc[", d, "] ", got.acc[q * hs + d], " want ",
                            ref.acc[q * hs + d]);
        return false;
      }
  }
  return true;
}

// One call's inputs: blocks in cache layout (keys [hs/x, bs, x], values
// [hs, bs]) over [t_begin, t_end) = [2 bs, 7 bs + 3), unused slots of the last
// block NaN (0 for fp8); kf / vf the decoded values by token [token - t_begin,
// hs]; M queries whose limits cycle through all, part, one or none of the range.
struct CoreData {
  CoreCase c;
  int x = 0, t_begin = 0, t_end = 0, nblk = 0;
  size_t blk = 0;  // elements per block
  std::vector<std::vector<uint8_t>> kb, vb;
  std::vector<const void*> kp, vp;
  std::vector<float> kf, vf, q, qrep, slopes;
  std::vector<int> limit, qpos;
  float scale = 1.0f;
};

CoreData MakeCoreData(const CoreCase& c) {
  CoreData z;
  z.c = c;
  std::mt19937 rng(c.seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const int bs = c.block_size, hs = c.head_size, M = c.num_queries;
  z.x = static_cast<int>(16 / DTypeSize(c.dtype));
  z.t_begin = 2 * bs;
  z.t_end = z.t_begin + 5 * bs + 3;
  z.nblk = (z.t_end - z.t_begin + bs - 1) / bs;
  z.blk = static_cast<size_t>(bs) * hs;
  const size_t esize = DTypeSize(c.dtype);
  z.kb.assign(z.nblk, std::vector<uint8_t>(z.blk * esize));
  z.vb.assign(z.nblk, std::vector<uint8_t>(z.blk * esize));
  z.kf.resize(static_cast<size_t>(z.nblk) * z.blk);
  z.vf.resize(z.kf.size());
  const float garbage = IsFp8(c.dtype) ? 0.0f : std::numeric_limits<float>::quiet_NaN();
  for (int b = 0; b < z.nblk; ++b)
    for (int t = 0; t < bs; ++t) {
      const int tok = b * bs + t;
      const bool used = z.t_begin + tok < z.t_end;
      for (int d = 0; d < hs; ++d) {
        const size_t ki = (static_cast<size_t>(d / z.x) * bs + t) * z.x + d % z.x;
        const size_t vi = static_cast<size_t>(d) * bs + t;
        z.kf[static_cast<size_t>(tok) * hs + d] =
            Store(c.dtype, z.kb[b], ki, used ? u(rng) : garbage);
        z.vf[static_cast<size_t>(tok) * hs + d] =
            Store(c.dtype, z.vb[b], vi, used ? 2.0f * u(rng) : garbage);
      }
    }
  for (int b = 0; b < z.nblk; ++b) {
    z.kp.push_back(z.kb[b].data());
    z.vp.push_back(z.vb[b].data());
  }
  // Limits: inside a later block, past t_end, inside the second block, on a
  // block boundary, none visible, inside the first block, ...
  const int limits[] = {z.t_begin + 3 * bs + 5, z.t_end + 7, z.t_begin + 2 * bs - 1,
                        z.t_begin + bs,         z.t_begin,   z.t_begin + 1,
                        z.t_begin - 1};
  z.q.resize(static_cast<size_t>(M) * hs);
  z.qrep.resize(static_cast<size_t>(M) * hs * cpu::kQrepWidth);
  z.limit.resize(M);
  z.qpos.resize(M);
  z.slopes.resize(M);
  for (int i = 0; i < M; ++i) {
    for (int d = 0; d < hs; ++d) z.q[static_cast<size_t>(i) * hs + d] = 2.0f * u(rng);
    cpu::BuildQrep(z.q.data() + static_cast<size_t>(i) * hs, hs, z.x,
                   z.qrep.data() + static_cast<size_t>(i) * (hs / z.x) * cpu::kQrepWidth);
    z.limit[i] = limits[i % 7];
    z.qpos[i] = z.limit[i] - 1;
    z.slopes[i] = 0.05f * static_cast<float>(i % 5 + 1);
  }
  z.scale = 1.0f / std::sqrt(static_cast<float>(hs));
  return z;
}

// The contract in double precision; query drop_query (if >= 0) without its
// last visible token (the negative control).
Result Reference(const CoreData& z, int drop_query) {
  const int M = z.c.num_queries, hs = z.c.head_size;
  Result r{std::vector<double>(M), std::vector<double>(M),
           std::vector<double>(static_cast<size_t>(M) * hs, 0.0)};
  for (int i = 0; i < M; ++i) {
    int e = std::min(z.limit[i], z.t_end);
    if (i == drop_query) --e;
    std::vector<double> lg;
    for (int t = z.t_begin; t < e; ++t) {
      double s = 0.0;
      for (int d = 0; d < hs; ++d)
        s += static_cast<double>(z.q[static_cast<size_t>(i) * hs + d]) *
             z.kf[static_cast<size_t>(t - z.t_begin) * hs + d];
      s *= z.scale;
      if (z.c.alibi) s += static_cast<double>(z.slopes[i]) * (t - z.qpos[i]);
      lg.push_back(s);
    }
    if (lg.empty()) {
      r.m[i] = -std::numeric_limits<double>::infinity();
      continue;
    }
    r.m[i] = *std::max_element(lg.begin(), lg.end());
    for (size_t j = 0; j < lg.size(); ++j) {
      const double p = std::exp(lg[j] - r.m[i]);
      r.l[i] += p;
      for (int d = 0; d < hs; ++d) r.acc[static_cast<size_t>(i) * hs + d] += p * z.vf[j * hs + d];
    }
  }
  return r;
}

// One call of `fn` on z (outputs pre-filled with junk).
Result RunVariant(const CoreData& z, cpu::AttendFn fn) {
  const int M = z.c.num_queries, hs = z.c.head_size;
  std::vector<float> logits(static_cast<size_t>(M) * (z.t_end - z.t_begin)), kbuf(z.blk),
      vbuf(z.blk);
  std::vector<float> om(M, 5.0f), ol(M, 5.0f), oacc(static_cast<size_t>(M) * hs, 123.0f);
  cpu::AttendArgs a;
  a.head_size = hs;
  a.num_queries = M;
  a.qrep = z.qrep.data();
  a.limit = z.limit.data();
  a.qpos = z.qpos.data();
  a.slopes = z.c.alibi ? z.slopes.data() : nullptr;
  a.scale = z.scale;
  a.k_blocks = z.kp.data();
  a.v_blocks = z.vp.data();
  a.t_begin = z.t_begin;
  a.t_end = z.t_end;
  a.logits = logits.data();
  a.kbuf = kbuf.data();
  a.vbuf = vbuf.data();
  a.out_max = om.data();
  a.out_sum = ol.data();
  a.out_acc = oacc.data();
  fn(a);
  return Result{std::vector<double>(om.begin(), om.end()),
                std::vector<double>(ol.begin(), ol.end()),
                std::vector<double>(oacc.begin(), oacc.end())};
}

void RunCoreCase(const CoreCase& c) {
  SCOPED_TRACE(c.Name());
  const CoreData z = MakeCoreData(c);
  const Result ref = Reference(z, -1);
  const Result broken = Reference(z, 0);  // query 0 sees 3 bs + 5 tokens
  for (bool avx2 : {false, true}) {
    const cpu::AttendFn fn = cpu::SelectAttendVariant(c.dtype, c.block_size, avx2);
    if (avx2 && fn == nullptr) continue;  // no AVX2 variant in this build / on this CPU
    SCOPED_TRACE(avx2 ? "avx2 variant" : "baseline variant");
    ASSERT_NE(fn, nullptr);
    const Result got = RunVariant(z, fn);
    std::string why;
    EXPECT_TRUE(Matches(got, ref, c.head_size, &why)) << why;
    EXPECT_FALSE(Matches(got, broken, c.head_size, &why)) << "a dropped token went unnoticed";
  }
}

TEST(AttentionCoreTest, EveryVariantDTypeBlockSize) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat8E4M3};
  uint32_t seed = 1;
  for (DType dt : dtypes)
    for (int bs : {8, 16, 32})
      for (int hs : {64, 80, 256})
        for (int M : {1, 3, 7, 21}) {  // decode groups; 16+ = prefill tiles
          ++seed;
          if (kLight && seed % 5 != 0) continue;
          RunCoreCase({dt, bs, hs, M, seed % 2 == 0, seed});
        }
}

}  // namespace
}  // namespace pagedserve::kernels::testing
