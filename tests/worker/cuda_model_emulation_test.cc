// Runs the CUDA backend's small model kernels (runtime/worker/cuda/
// model_kernels.cuh: embedding gather from fp32 and 16-bit tables, fused
// residual add + RMSNorm (also as the per-head q/k norm of Qwen3) and
// SiLU-and-mul with fp32 and 16-bit outputs, Gemma's operations (the
// residual add of a normed output, the embedding scale, GeGLU with fp32 and
// 16-bit outputs, RoPE with the local layers' tables, the final logit soft
// cap),
// RoPE, bias add, the fp32 <-> fp16 /
// bf16 conversions of GEMM and attention operands, SiLU-and-mul over a
// stacked gate/up GEMM output, the greedy argmax of logits rows, RoPE fused
// with the query conversion and with reshape_and_cache, the mixture-of-experts
// row gather and combine) on the CPU through
// tests/kernels/simt_emulator.h and compares them with the CPU backend's operations (cpu_ops in
// runtime/worker/cpu_backend.h, the arithmetic the transformers and llama.cpp fixtures check), on
// odd shapes (rows not a multiple of the block, a grid smaller than the work for the grid-stride
// loops). Needs the CUDA headers only, no device. Each op has a negative control: a deliberately
// broken variant of its body, run the same way, must fail the same check.
//
// Tolerances: gather, bias add, the conversions (against the CPU's
// kernels/cpu/half.h converters; NaN inputs only need a NaN out, the
// payloads differ), the argmax (against GreedyArgmax, the host rule the
// sampler is checked with in greedy_rows_test.cc) and the residual sums are
// exact; RoPE, the scale, GeGLU and
// SiLU-and-mul use the same fp32 operations as the CPU loop (tolerance
// 2e-6 relative + 1e-7 for a contraction into FMA by either compiler);
// RMSNorm (and the post-norm add) sums squares in double in a different
// order (a block tree vs a sequential loop), so its outputs agree within a
// few float ulps (2e-6 relative + 1e-7).
//
// Every body runs in its scalar (VEC = 1) and its packed (VEC = kPack,
// vectorized loads and stores) variant against the same references, on
// shapes that allow packs; the emulator aborts on a misaligned packed access
// as the device would fault (also the attention kernels' Load16 / Load8).
// PackWidth, the launchers' choice between the two, has its own test.
#include "tests/kernels/simt_emulator.h"  // must precede the kernel header

// The kernel bodies use threadIdx, __syncthreads, ... unqualified; in this
// host build they come from the emulator's namespace.
namespace pagedserve::cuda_model {
using namespace ::pagedserve::kernels::cuda;  // NOLINT
}  // namespace pagedserve::cuda_model

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <tuple>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/half.h"
#include "kernels/reshape_and_cache.h"
#include "runtime/model/weights.h"
#include "runtime/worker/cpu_backend.h"
#include "runtime/worker/cuda/model_kernels.cuh"
#include "runtime/worker/model_backend.h"
#include "runtime/worker/moe_routing.h"
#include "tests/worker/mismatches.h"

namespace pagedserve::cuda_model {
namespace {

namespace kc = ::pagedserve::kernels::cuda;

std::vector<float> Random(size_t n, std::mt19937& rng, float lo = -2.0f, float hi = 2.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

using ::pagedserve::testing::Mismatches;

constexpr double kRel = 2e-6;
constexpr double kAbs = 1e-7;

// Runs fn(std::integral_constant<int, VEC>{}) for the scalar (VEC = 1) and
// the packed (VEC = kPack) variant of a body.
template <typename Fn>
void ForEachPack(Fn&& fn) {
  {
    SCOPED_TRACE("scalar (VEC = 1)");
    fn(std::integral_constant<int, 1>{});
  }
  {
    SCOPED_TRACE("packed (VEC = kPack)");
    fn(std::integral_constant<int, kPack>{});
  }
}

// ---- Packed access ------------------------------------------------------------

TEST(CudaModelEmulationTest, PackWidthNeedsMultiplesOfThePackAndAlignedOperands) {
  alignas(64) float f[64] = {};
  alignas(64) __nv_bfloat16 h[64] = {};
  alignas(64) __nv_fp8_e4m3 b[64] = {};
  EXPECT_EQ(PackWidth({8, 64}, {Packable(f), Packable(h), Packable(b)}), kPack);
  EXPECT_EQ(PackWidth({8, 6}, {Packable(f)}), 1) << "an extent not a multiple of the pack";
  EXPECT_EQ(PackWidth({8}, {Packable(f + 4), Packable(h + 4), Packable(b + 4)}), kPack);
  EXPECT_EQ(PackWidth({8}, {Packable(f + 2)}), 1) << "fp32 at 8 bytes, not 16";
  EXPECT_EQ(PackWidth({8}, {Packable(h + 2)}), 1) << "bf16 at 4 bytes, not 8";
  EXPECT_EQ(PackWidth({8}, {Packable(b + 2)}), 1) << "fp8 at 2 bytes, not 4";
  EXPECT_EQ(PackWidth({8}, {Packable(f), Packable(static_cast<const float*>(nullptr))}), kPack)
      << "an absent (null) operand does not count";
}

TEST(CudaModelEmulationTest, APackedAccessAtAMisalignedAddressAborts) {
  alignas(16) float f[8] = {};
  EXPECT_EQ(LoadPacked<kPack>(f + 4).v[0], 0.0f);
  EXPECT_DEATH(LoadPacked<kPack>(f + 1), "misaligned");
  EXPECT_DEATH(StorePacked<kPack>(f + 2, Packed<float, kPack>{}), "misaligned");
  // The attention kernels' 16- and 8-byte vector loads are checked the same way.
  EXPECT_DEATH(Load16(f + 2), "misaligned");
  EXPECT_DEATH(Load8(f + 1), "misaligned");
  EXPECT_EQ(Load8(f + 2).x, 0u);
}

// ---- Embedding gather -------------------------------------------------------

// Broken: reads the next row of the table.
void BrokenEmbeddingGatherBody(const float* table, const int32_t* ids, int hidden, int vocab,
                               float* out) {
  const int t = blockIdx.x;
  const float* src = table + static_cast<int64_t>((ids[t] + 1) % vocab) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    out[static_cast<int64_t>(t) * hidden + i] = src[i];
}

TEST(CudaModelEmulationTest, EmbeddingGatherMatchesCpu) {
  std::mt19937 rng(1);
  const int vocab = 37, hidden = 300, n = 6;
  Matrix table;
  table.rows = vocab;
  table.cols = hidden;
  table.data = Random(static_cast<size_t>(vocab) * hidden, rng);
  const std::vector<int32_t> ids = {5, 0, 36, 5, 17, 2};
  std::vector<float> want(static_cast<size_t>(n) * hidden);
  ASSERT_TRUE(cpu_ops::EmbeddingGather(table, ids.data(), n, want.data()).ok());

  ForEachPack([&](auto vec) {
    std::vector<float> got(want.size(), NAN);
    kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
      EmbeddingGatherBody<float, decltype(vec)::value>(table.data.data(), ids.data(), hidden,
                                                       got.data());
    });
    EXPECT_EQ(Mismatches(got, want, 0, 0), 0);
  });
  std::vector<float> broken(want.size(), NAN);
  kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
    BrokenEmbeddingGatherBody(table.data.data(), ids.data(), hidden, vocab, broken.data());
  });
  EXPECT_GT(Mismatches(broken, want, 0, 0), 0) << "negative control passed the check";
}

// A 16-bit table (F16 or BF16 stored rows) of the fp32 values `v`, as
// LoadLlamaWeights holds it for --dtype float16 / bfloat16.
Matrix Table16(const std::vector<float>& v, int rows, int cols, bool bf16) {
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.type = bf16 ? GgmlType::kBF16 : GgmlType::kF16;
  m.row_bytes = static_cast<uint64_t>(cols) * 2;
  m.owned.resize(v.size() * 2);
  for (size_t i = 0; i < v.size(); ++i) {
    const uint16_t b = bf16 ? kernels::FloatToBFloat16Bits(v[i]) : kernels::FloatToHalfBits(v[i]);
    std::memcpy(m.owned.data() + 2 * i, &b, 2);
  }
  return m;
}

template <typename T, int VEC>
void Gather16Case(bool bf16) {
  SCOPED_TRACE(bf16 ? "bf16 table" : "fp16 table");
  std::mt19937 rng(11);
  const int vocab = 29, hidden = 268, n = 5;
  const Matrix table =
      Table16(Random(static_cast<size_t>(vocab) * hidden, rng), vocab, hidden, bf16);
  const std::vector<int32_t> ids = {28, 0, 7, 7, 13};
  std::vector<float> want(static_cast<size_t>(n) * hidden);
  ASSERT_TRUE(cpu_ops::EmbeddingGather(table, ids.data(), n, want.data()).ok());
  const T* t = reinterpret_cast<const T*>(table.owned.data());
  std::vector<float> got(want.size(), NAN), broken(want.size(), NAN);
  kc::EmuLaunch(dim3(n), dim3(kThreads), 0,
                [&] { EmbeddingGatherBody<T, VEC>(t, ids.data(), hidden, got.data()); });
  EXPECT_EQ(Mismatches(got, want, 0, 0), 0);
  // Broken: the table read with the other 16-bit interpretation.
  kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
    if constexpr (std::is_same_v<T, __half>) {
      EmbeddingGatherBody<__nv_bfloat16>(reinterpret_cast<const __nv_bfloat16*>(t), ids.data(),
                                         hidden, broken.data());
    } else {
      EmbeddingGatherBody<__half>(reinterpret_cast<const __half*>(t), ids.data(), hidden,
                                  broken.data());
    }
  });
  EXPECT_GT(Mismatches(broken, want, 0, 0), 0) << "negative control passed the check";
}

TEST(CudaModelEmulationTest, EmbeddingGatherFrom16BitTablesMatchesCpu) {
  ForEachPack([](auto vec) {
    Gather16Case<__half, decltype(vec)::value>(false);
    Gather16Case<__nv_bfloat16, decltype(vec)::value>(true);
  });
}

// ---- fp32 <-> fp16 / bf16 conversions ----------------------------------------------

// fp32 inputs: every 4099th bit pattern (both signs, every exponent: zeros,
// subnormals, normals, inf, NaN), plus the rounding edges of both 16-bit
// formats (values halfway between two representable neighbours, one ulp
// either side, the overflow and underflow thresholds).
std::vector<float> ConversionInputs() {
  std::vector<float> v;
  for (uint64_t u = 0; u <= 0xffffffffull; u += 4099)
    v.push_back(kernels::BitsToFloat(static_cast<uint32_t>(u)));
  std::mt19937 rng(12);
  for (int i = 0; i < 4096; ++i) {
    const uint32_t hi = rng() & 0xffffu;
    // bf16: the low 16 bits at 0x8000 (a tie) and its neighbours; fp16:
    // the 13 dropped bits at 0x1000 and its neighbours.
    for (uint32_t low : {0x7fffu, 0x8000u, 0x8001u})
      v.push_back(kernels::BitsToFloat((hi << 16) | low));
    const uint32_t h = (rng() & 0x3ffffu) << 13;
    for (uint32_t low : {0x0fffu, 0x1000u, 0x1001u})
      v.push_back(kernels::BitsToFloat(0x38000000u + (h & 0x0fffe000u) + low));
  }
  for (float f : {65504.0f, 65519.99f, 65520.0f, 0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x1p-14f,
                  3.3895314e38f, 3.4028235e38f})
    for (float s : {1.0f, -1.0f}) v.push_back(s * f);
  return v;
}

// Broken: truncation instead of round-to-nearest-even.
template <typename To>
void BrokenConvertBody(const float* in, int64_t count, To* out) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<To, __half>) {
      out[k] = __float2half_rz(in[k]);
    } else {
      out[k] = __float2bfloat16_rz(in[k]);
    }
  }
}

// Mismatches of 16-bit outputs against the CPU converter (NaN in, any NaN out).
int Mismatches16(const std::vector<float>& in, const std::vector<uint16_t>& got, bool bf16) {
  int bad = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const uint16_t g = got[i];
    if (std::isnan(in[i])) {
      const bool nan = bf16 ? std::isnan(kernels::BFloat16BitsToFloat(g))
                            : std::isnan(kernels::HalfBitsToFloat(g));
      bad += nan ? 0 : 1;
      continue;
    }
    const uint16_t want =
        bf16 ? kernels::FloatToBFloat16Bits(in[i]) : kernels::FloatToHalfBits(in[i]);
    bad += g == want ? 0 : 1;
  }
  return bad;
}

template <typename To, int VEC>
void ConvertCase(bool bf16) {
  SCOPED_TRACE(bf16 ? "bf16" : "fp16");
  std::vector<float> in = ConversionInputs();
  in.resize(in.size() - in.size() % VEC);
  const int64_t count = static_cast<int64_t>(in.size());
  // 16-bit results as their bit patterns.
  std::vector<uint16_t> got(in.size()), broken(in.size());
  kc::EmuLaunch(dim3(7), dim3(kThreads), 0, [&] {
    ConvertBody<float, To, VEC>(in.data(), count, reinterpret_cast<To*>(got.data()));
  });
  EXPECT_EQ(Mismatches16(in, got, bf16), 0);
  kc::EmuLaunch(dim3(7), dim3(kThreads), 0, [&] {
    BrokenConvertBody<To>(in.data(), count, reinterpret_cast<To*>(broken.data()));
  });
  EXPECT_GT(Mismatches16(in, broken, bf16), 0) << "negative control passed the check";

  // Back to fp32: every 16-bit pattern, exact (NaN stays NaN).
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b] = static_cast<uint16_t>(b);
  std::vector<float> back(65536, 0.0f);
  kc::EmuLaunch(dim3(3), dim3(kThreads), 0, [&] {
    ConvertBody<To, float, VEC>(reinterpret_cast<const To*>(all.data()), 65536, back.data());
  });
  int bad = 0;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float want = bf16 ? kernels::BFloat16BitsToFloat(static_cast<uint16_t>(b))
                            : kernels::HalfBitsToFloat(static_cast<uint16_t>(b));
    if (std::isnan(want) ? !std::isnan(back[b])
                         : kernels::FloatBits(want) != kernels::FloatBits(back[b]))
      ++bad;
  }
  EXPECT_EQ(bad, 0);
}

TEST(CudaModelEmulationTest, ConversionsMatchCpuConverters) {
  ForEachPack([](auto vec) {
    ConvertCase<__half, decltype(vec)::value>(false);
    ConvertCase<__nv_bfloat16, decltype(vec)::value>(true);
  });
}

// ---- RoPE fused with the query conversion and with reshape_and_cache ----------------

// Rotary tables [n, half] of random angles.
void RopeTables(int n, int half, std::mt19937& rng, std::vector<float>* cos_t,
                std::vector<float>* sin_t) {
  cos_t->resize(static_cast<size_t>(n) * half);
  sin_t->resize(cos_t->size());
  for (size_t i = 0; i < cos_t->size(); ++i) {
    const double angle = std::uniform_real_distribution<double>(-10, 10)(rng);
    (*cos_t)[i] = static_cast<float>(std::cos(angle));
    (*sin_t)[i] = static_cast<float>(std::sin(angle));
  }
}

// The 16-bit patterns of x in `dt` (fp16 or bf16) by the CPU converters.
std::vector<uint16_t> To16(const std::vector<float>& x, kernels::DType dt) {
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    out[i] = dt == kernels::DType::kBFloat16 ? kernels::FloatToBFloat16Bits(x[i])
                                             : kernels::FloatToHalfBits(x[i]);
  return out;
}

// The stacked layout of a fused q/k/v GEMM's output: rows of `total`
// columns, a projection at column `col0`, its bias added by the kernel.
struct Stacked {
  std::vector<float> y;     // [n, total]
  std::vector<float> bias;  // [width]
  int64_t total = 0;
};
// A random stacked layout y [n, total] and bias [width] for a projection at
// columns [col0, col0 + width), with *split [n, width] set to what the fused
// GEMM's split gives for it: y[t, col0 + j] + bias[j] (an fp32 add).
Stacked MakeStacked(std::vector<float>* split, int n, int64_t width, int64_t col0, int64_t total,
                    std::mt19937& rng) {
  Stacked st;
  st.total = total;
  st.y = Random(static_cast<size_t>(n) * total, rng, -3.0f, 3.0f);
  st.bias = Random(width, rng, -1.0f, 1.0f);
  for (int t = 0; t < n; ++t)
    for (int64_t j = 0; j < width; ++j)
      (*split)[t * width + j] = st.y[t * total + col0 + j] + st.bias[j];
  return st;
}

// rot_half: D / 2, or less for partial rotary (the tail converted unrotated).
template <typename T, int VEC>
void RopeConvertCase(kernels::DType dt, bool stacked, int rot_half) {
  SCOPED_TRACE(::testing::Message() << kernels::DTypeName(dt) << (stacked ? ", stacked" : "")
                                    << ", rot_half " << rot_half);
  std::mt19937 rng(15);
  const int n = 5, heads = 6, D = 64, half = rot_half;
  const int64_t stride = heads * D;
  std::vector<float> q = Random(static_cast<size_t>(n) * stride, rng);
  // Stacked: q first in rows of q + 2 KV heads x 2 (k and v), as the fused GEMM writes them.
  const Stacked st = stacked ? MakeStacked(&q, n, stride, 0, stride + 4 * D, rng) : Stacked{};
  std::vector<float> cos_t, sin_t, neg_sin;
  RopeTables(n, half, rng, &cos_t, &sin_t);
  for (float v : sin_t) neg_sin.push_back(-v);
  std::vector<float> rotated = q;  // the reference: (bias,) ApplyRope, then the CPU conversion
  cpu_ops::ApplyRope(rotated.data(), n, heads, D, half, stride, cos_t.data(), sin_t.data());
  auto run = [&](const std::vector<float>& sin_used, bool with_bias) {
    std::vector<T> out(q.size());
    std::vector<float> in = stacked ? st.y : q;  // in place for fp32 unless stacked
    T* dst = std::is_same_v<T, float> && !stacked ? reinterpret_cast<T*>(in.data()) : out.data();
    kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
      RopeConvertBody<T, VEC>(in.data(), heads, D, half, stacked ? st.total : stride,
                              with_bias ? st.bias.data() : nullptr, cos_t.data(), sin_used.data(),
                              dst);
    });
    int bad = 0;
    for (size_t i = 0; i < q.size(); ++i) {
      if constexpr (std::is_same_v<T, float>) {
        bad += kernels::FloatBits(dst[i]) == kernels::FloatBits(rotated[i]) ? 0 : 1;
      } else {
        uint16_t g;
        std::memcpy(&g, reinterpret_cast<const char*>(dst) + 2 * i, 2);
        bad += g == To16({rotated[i]}, dt)[0] ? 0 : 1;
      }
    }
    return bad;
  };
  EXPECT_EQ(run(sin_t, stacked), 0);
  EXPECT_GT(run(neg_sin, stacked), 0) << "negative control (rotation by -angle) passed the check";
  if (stacked) {
    EXPECT_GT(run(sin_t, false), 0) << "negative control (bias left out) passed the check";
  }
}

TEST(CudaModelEmulationTest, RopeConvertMatchesCpuRopeAndConversion) {
  ForEachPack([](auto vec) {
    constexpr int V = decltype(vec)::value;
    for (bool stacked : {false, true}) {
      for (int rot_half : {32, 12}) {  // full, and 24 of 64 dimensions rotated
        RopeConvertCase<float, V>(kernels::DType::kFloat32, stacked, rot_half);
        RopeConvertCase<__half, V>(kernels::DType::kFloat16, stacked, rot_half);
        RopeConvertCase<__nv_bfloat16, V>(kernels::DType::kBFloat16, stacked, rot_half);
      }
    }
  });
}

template <typename C, int VEC>
void RopeCacheCase(kernels::DType dt, bool stacked, int rot_half) {
  SCOPED_TRACE(::testing::Message() << kernels::DTypeName(dt) << (stacked ? ", stacked" : "")
                                    << ", rot_half " << rot_half);
  std::mt19937 rng(16);
  const int n = 6, kv_heads = 2, D = 64, half = rot_half, block_size = 16, num_blocks = 5;
  const int64_t kv_dim = kv_heads * D;
  std::vector<float> k = Random(static_cast<size_t>(n) * kv_dim, rng, -3.0f, 3.0f);
  std::vector<float> v = Random(k.size(), rng, -3.0f, 3.0f);
  // Stacked: rows of 3 query heads, then k, then v (one y for both: k's
  // split is taken from columns [q_dim, q_dim + kv_dim), v's after it).
  const int64_t q_dim = 3 * D, total = q_dim + 2 * kv_dim;
  Stacked sk, sv;
  if (stacked) {
    sk = MakeStacked(&k, n, kv_dim, q_dim, total, rng);
    sv = sk;
    sv.bias = Random(kv_dim, rng, -1.0f, 1.0f);
    for (int t = 0; t < n; ++t)
      for (int64_t j = 0; j < kv_dim; ++j)
        v[t * kv_dim + j] = sk.y[t * total + q_dim + kv_dim + j] + sv.bias[j];
  }
  std::vector<float> cos_t, sin_t, neg_sin;
  RopeTables(n, half, rng, &cos_t, &sin_t);
  for (float x : sin_t) neg_sin.push_back(-x);
  // Slots in several blocks, one padding (-1) and one outside the pool (both skipped).
  const std::vector<int64_t> slots = {17, 3, -1, 79, int64_t{num_blocks} * block_size, 40};
  std::vector<int64_t> ref_slots = slots;
  ref_slots[4] = -1;  // the CPU reshape_and_cache refuses it; skipping is the same
  kernels::KVCacheShape shape{num_blocks, kv_heads, D, block_size, dt};
  const size_t bytes = shape.block_bytes() * num_blocks;
  const float scale = kernels::IsFp8(dt) ? 0.75f : 1.0f;

  // The reference: (the split's bias add,) ApplyRope on the keys, the CPU
  // conversion for 16-bit caches, then the CPU reshape_and_cache (fp32
  // operands for fp32 / fp8).
  std::vector<uint8_t> want_k(bytes, 0x5a), want_v(bytes, 0x5a);
  std::vector<float> k_rot = k;
  cpu_ops::ApplyRope(k_rot.data(), n, kv_heads, D, half, kv_dim, cos_t.data(), sin_t.data());
  const bool is16 = dt == kernels::DType::kFloat16 || dt == kernels::DType::kBFloat16;
  const std::vector<uint16_t> k16 = is16 ? To16(k_rot, dt) : std::vector<uint16_t>();
  const std::vector<uint16_t> v16 = is16 ? To16(v, dt) : std::vector<uint16_t>();
  kernels::ReshapeAndCacheParams rc;
  rc.key = is16 ? static_cast<const void*>(k16.data()) : k_rot.data();
  rc.value = is16 ? static_cast<const void*>(v16.data()) : v.data();
  rc.slot_mapping = ref_slots.data();
  rc.num_tokens = n;
  rc.cache = kernels::KVCacheView{want_k.data(),         want_v.data(), shape,
                                  kernels::Device::kCPU, scale,         scale};
  if (kernels::IsFp8(dt)) rc.io_dtype = kernels::DType::kFloat32;
  ASSERT_TRUE(kernels::ReshapeAndCache(rc).ok());

  auto run = [&](const std::vector<float>& sin_used, bool swap_caches, bool with_bias) {
    std::vector<uint8_t> got_k(bytes, 0x5a), got_v(bytes, 0x5a);
    C* kc_ptr = reinterpret_cast<C*>(swap_caches ? got_v.data() : got_k.data());
    C* vc_ptr = reinterpret_cast<C*>(swap_caches ? got_k.data() : got_v.data());
    const float* key = stacked ? sk.y.data() + q_dim : k.data();
    const float* value = stacked ? sk.y.data() + q_dim + kv_dim : v.data();
    const float* k_bias = with_bias ? sk.bias.data() : nullptr;
    const float* v_bias = with_bias ? sv.bias.data() : nullptr;
    kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
      RopeReshapeAndCacheBody<C, VEC>(
          key, value, stacked ? total : kv_dim, k_bias, v_bias, kv_heads, D, half, cos_t.data(),
          sin_used.data(), slots.data(), num_blocks, block_size, kc_ptr, vc_ptr, scale, scale);
    });
    int bad = 0;
    for (size_t i = 0; i < bytes; ++i) bad += (got_k[i] != want_k[i]) + (got_v[i] != want_v[i]);
    return bad;
  };
  EXPECT_EQ(run(sin_t, false, stacked), 0);
  EXPECT_GT(run(neg_sin, false, stacked), 0)
      << "negative control (rotation by -angle) passed the check";
  EXPECT_GT(run(sin_t, true, stacked), 0)
      << "negative control (keys and values swapped) passed the check";
  if (stacked) {
    EXPECT_GT(run(sin_t, false, false), 0) << "negative control (biases left out) passed the check";
  }
}

TEST(CudaModelEmulationTest, RopeReshapeAndCacheMatchesCpuRopeAndReshapeAndCache) {
  ForEachPack([](auto vec) {
    constexpr int V = decltype(vec)::value;
    for (bool stacked : {false, true}) {
      for (int rot_half : {32, 12}) {  // full, and 24 of 64 dimensions rotated
        RopeCacheCase<float, V>(kernels::DType::kFloat32, stacked, rot_half);
        RopeCacheCase<__half, V>(kernels::DType::kFloat16, stacked, rot_half);
        RopeCacheCase<__nv_bfloat16, V>(kernels::DType::kBFloat16, stacked, rot_half);
        RopeCacheCase<__nv_fp8_e4m3, V>(kernels::DType::kFloat8E4M3, stacked, rot_half);
        RopeCacheCase<__nv_fp8_e5m2, V>(kernels::DType::kFloat8E5M2, stacked, rot_half);
      }
    }
  });
}

// ---- Greedy argmax of logits rows -------------------------------------------------

// Broken: ties go to the highest index.
template <int NUM_THREADS>
void BrokenGreedyArgmaxBody(const float* logits, int64_t vocab, int32_t* out) {
  __shared__ float best_v[NUM_THREADS];
  __shared__ int32_t best_i[NUM_THREADS];
  const float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;
  float bv = -INFINITY;
  int32_t bi = -1;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    if (row[i] >= bv && row[i] > -INFINITY) {
      bv = row[i];
      bi = static_cast<int32_t>(i);
    }
  best_v[threadIdx.x] = bv;
  best_i[threadIdx.x] = bi;
  __syncthreads();
  for (int stride = NUM_THREADS / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride) {
      const float ov = best_v[threadIdx.x + stride];
      const int32_t oi = best_i[threadIdx.x + stride];
      if (oi >= 0 && (best_i[threadIdx.x] < 0 || ov > best_v[threadIdx.x] ||
                      (ov == best_v[threadIdx.x] && oi > best_i[threadIdx.x]))) {
        best_v[threadIdx.x] = ov;
        best_i[threadIdx.x] = oi;
      }
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = best_i[0];
}

TEST(CudaModelEmulationTest, GreedyArgmaxMatchesHostRule) {
  std::mt19937 rng(13);
  for (int64_t vocab : {int64_t{1}, int64_t{5}, int64_t{255}, int64_t{1000}, int64_t{49157}}) {
    SCOPED_TRACE(::testing::Message() << "vocab " << vocab);
    std::uniform_int_distribution<int64_t> at(0, vocab - 1);
    std::vector<float> logits;
    int rows = 0;
    auto add = [&](std::vector<float> row) {
      logits.insert(logits.end(), row.begin(), row.end());
      ++rows;
    };
    for (int r = 0; r < 12; ++r) {
      std::vector<float> row = Random(vocab, rng, -30.0f, 30.0f);
      if (r % 2 == 1)  // the maximum tied at several places, across threads
        for (int k = 0; k < 3; ++k) row[at(rng)] = 40.0f;
      if (r % 3 == 2)
        for (int64_t k = 0; k < vocab / 2; ++k) row[at(rng)] = -INFINITY;
      if (r % 4 == 3)
        for (float& v : row) v = std::round(v / 16.0f);  // ties everywhere
      add(row);
    }
    add(std::vector<float>(vocab, -INFINITY));  // refused: only -inf
    add(std::vector<float>(vocab, -3.4028235e38f));
    std::vector<float> nan_row(vocab, 0.0f), inf_row(vocab, 0.0f);
    nan_row[at(rng)] = NAN;
    inf_row[at(rng)] = INFINITY;
    add(nan_row);
    add(inf_row);
    std::vector<int32_t> want(rows), got(rows, -7), broken(rows, -7);
    for (int r = 0; r < rows; ++r) want[r] = GreedyArgmax(logits.data() + r * vocab, vocab);
    kc::EmuLaunch(dim3(rows), dim3(kThreads), 0,
                  [&] { GreedyArgmaxBody<kThreads>(logits.data(), vocab, got.data()); });
    EXPECT_EQ(got, want);
    kc::EmuLaunch(dim3(rows), dim3(64), 0,  // another block width
                  [&] { GreedyArgmaxBody<64>(logits.data(), vocab, got.data()); });
    EXPECT_EQ(got, want);
    if (vocab >= 255) {
      kc::EmuLaunch(dim3(rows), dim3(kThreads), 0,
                    [&] { BrokenGreedyArgmaxBody<kThreads>(logits.data(), vocab, broken.data()); });
      EXPECT_NE(broken, want) << "negative control passed the check";
    }
  }
}

// ---- Fused residual add + RMSNorm ----------------------------------------------

// Broken: the block tree stops one level early (half the partial sums lost
// for dims wider than half the block).
template <int NUM_THREADS>
void BrokenAddRmsNormBody(float* residual, const float* add, const int32_t* rows,
                          const float* weight, int dim, double eps, float* out) {
  __shared__ double partial[NUM_THREADS];
  const int t = blockIdx.x;
  const int64_t r = rows != nullptr ? rows[t] : t;
  float* o = out + static_cast<int64_t>(t) * dim;
  const float* xr = residual + r * dim;
  if (add != nullptr) {
    float* dst = rows == nullptr ? residual + r * dim : o;
    for (int i = threadIdx.x; i < dim; i += blockDim.x) dst[i] = xr[i] + add[r * dim + i];
    xr = dst;
  }
  double ss = 0.0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int stride = NUM_THREADS / 4; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride)
      partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / sqrt(partial[0] / dim + eps));
  for (int i = threadIdx.x; i < dim; i += blockDim.x) o[i] = xr[i] * inv * weight[i];
}

struct NormCase {
  const char* what;
  bool with_add;
  std::vector<int32_t> rows;  // empty: all rows, written back
};

template <int NUM_THREADS, bool kBroken, int VEC = 1>
void RunAddRmsNorm(const NormCase& c, int n, int dim, std::mt19937& rng, int* out_bad,
                   int* residual_bad) {
  const double eps = 1e-5;
  const std::vector<float> x0 = Random(static_cast<size_t>(n) * dim, rng);
  const std::vector<float> add = Random(x0.size(), rng);
  const std::vector<float> weight = Random(dim, rng, 0.5f, 1.5f);
  const int32_t* rows = c.rows.empty() ? nullptr : c.rows.data();
  const int out_rows = c.rows.empty() ? n : static_cast<int>(c.rows.size());
  const float* a = c.with_add ? add.data() : nullptr;

  std::vector<float> want_x = x0, want(static_cast<size_t>(out_rows) * dim);
  cpu_ops::AddRmsNorm(want_x.data(), a, rows, out_rows, dim, weight.data(), eps, want.data());
  std::vector<float> got_x = x0, got(want.size(), NAN);
  kc::EmuLaunch(dim3(out_rows), dim3(NUM_THREADS), 0, [&] {
    if constexpr (kBroken) {
      BrokenAddRmsNormBody<NUM_THREADS>(got_x.data(), a, rows, weight.data(), dim, eps, got.data());
    } else {
      AddRmsNormBody<NUM_THREADS, float, float, VEC>(got_x.data(), a, rows, weight.data(), dim, eps,
                                                     got.data());
    }
  });
  *out_bad = Mismatches(got, want, kRel, kAbs);
  *residual_bad = Mismatches(got_x, want_x, 0, 0);  // the write-back is a plain fp32 add
}

TEST(CudaModelEmulationTest, AddRmsNormMatchesCpu) {
  std::mt19937 rng(2);
  const std::vector<NormCase> cases = {
      {"norm only", false, {}},
      {"residual add + norm, written back", true, {}},
      {"residual add + norm of gathered rows (one twice)", true, {4, 0, 4, 2}},
  };
  for (const NormCase& c : cases) {
    // Below, at a multiple of and above the block width (in elements; with
    // packs, 2056 takes a thread two rounds).
    for (int dim : {96, 576, 1000, 2056}) {
      SCOPED_TRACE(::testing::Message() << c.what << ", dim " << dim);
      int out_bad = -1, res_bad = -1;
      ForEachPack([&](auto vec) {
        constexpr int V = decltype(vec)::value;
        RunAddRmsNorm<kThreads, false, V>(c, 5, dim, rng, &out_bad, &res_bad);
        EXPECT_EQ(out_bad, 0);
        EXPECT_EQ(res_bad, 0);
        RunAddRmsNorm<64, false, V>(c, 5, dim, rng, &out_bad, &res_bad);  // another block width
        EXPECT_EQ(out_bad, 0);
        EXPECT_EQ(res_bad, 0);
      });
      if (dim > kThreads / 2) {
        RunAddRmsNorm<kThreads, true>(c, 5, dim, rng, &out_bad, &res_bad);
        EXPECT_GT(out_bad, 0) << "negative control passed the check";
      }
    }
  }
}

// ---- Per-head q/k RMSNorm (Qwen3) --------------------------------------------

// The CUDA backend's HeadRmsNorm runs the add + norm body over the n * heads
// rows of head_size (no add, no write-back) into fp32 scratch and copies it
// back: the same values as cpu_ops::HeadRmsNorm in place. Broken: the body over
// whole token rows (one norm across all heads, as a plain RMSNorm would).
TEST(CudaModelEmulationTest, HeadRmsNormMatchesCpu) {
  std::mt19937 rng(12);
  const double eps = 1e-6;
  for (const auto& shape :
       {std::tuple{3, 4, 128}, std::tuple{5, 2, 64}, std::tuple{1, 7, 96}, std::tuple{2, 3, 256}}) {
    // Plain variables, not structured bindings: the lambdas below capture them
    // (clang 14, which scripts/lint runs, cannot capture a binding).
    const int n = std::get<0>(shape), heads = std::get<1>(shape), head_size = std::get<2>(shape);
    SCOPED_TRACE(::testing::Message() << n << " tokens, " << heads << " heads of " << head_size);
    // Heads of different scales, so that one norm over the row differs from per-head ones.
    std::vector<float> x0 = Random(static_cast<size_t>(n) * heads * head_size, rng);
    for (size_t i = 0; i < x0.size(); ++i) x0[i] *= 1.0f + static_cast<float>((i / head_size) % 3);
    const std::vector<float> weight = Random(head_size, rng, 0.5f, 1.5f);
    std::vector<float> want = x0;
    cpu_ops::HeadRmsNorm(want.data(), static_cast<int64_t>(n) * heads, head_size, weight.data(),
                         eps);
    ForEachPack([&](auto vec) {
      constexpr int V = decltype(vec)::value;
      std::vector<float> x = x0, got(x0.size(), NAN);
      kc::EmuLaunch(dim3(n * heads), dim3(kThreads), 0, [&] {
        AddRmsNormBody<kThreads, float, float, V>(x.data(), static_cast<const float*>(nullptr),
                                                  nullptr, weight.data(), head_size, eps,
                                                  got.data());
      });
      EXPECT_EQ(Mismatches(got, want, kRel, kAbs), 0);
      EXPECT_EQ(Mismatches(x, x0, 0, 0), 0) << "the input was written";
    });
    if (heads > 1) {
      std::vector<float> row_weight(static_cast<size_t>(heads) * head_size);
      for (size_t i = 0; i < row_weight.size(); ++i) row_weight[i] = weight[i % head_size];
      std::vector<float> x = x0, broken(x0.size(), NAN);
      kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
        AddRmsNormBody<kThreads, float, float, 1>(x.data(), static_cast<const float*>(nullptr),
                                                  nullptr, row_weight.data(), heads * head_size,
                                                  eps, broken.data());
      });
      EXPECT_GT(Mismatches(broken, want, kRel, kAbs), 0) << "negative control passed the check";
    }
  }
}

// ---- RoPE ------------------------------------------------------------------

// Broken: rotates by -angle (sin sign flipped).
void BrokenApplyRopeBody(float* x, int heads, int head_size, int rot_half, int64_t token_stride,
                         const float* cos_t, const float* sin_t) {
  const int t = blockIdx.x;
  const int half = rot_half;
  float* row = x + static_cast<int64_t>(t) * token_stride;
  for (int k = threadIdx.x; k < heads * half; k += blockDim.x) {
    const int h = k / half, i = k % half;
    float* v = row + static_cast<int64_t>(h) * head_size;
    const float c = cos_t[t * half + i], s = -sin_t[t * half + i];
    const float a = v[i], b = v[i + half];
    v[i] = a * c - b * s;
    v[i + half] = b * c + a * s;
  }
}

TEST(CudaModelEmulationTest, ApplyRopeMatchesCpu) {
  std::mt19937 rng(3);
  // 7 query heads of 64 in a row of 7 * 64 (q), 3 KV heads of 128 in a
  // wider row (a stride larger than heads * head_size), and partial rotary
  // (96 of 128 dimensions, Phi-4-mini's split).
  struct Shape {
    int heads, head_size;
    int64_t stride;
    int rot_half;
  };
  for (const Shape& s :
       {Shape{7, 64, 7 * 64, 32}, Shape{3, 128, 3 * 128 + 32, 64}, Shape{3, 128, 3 * 128, 48}}) {
    SCOPED_TRACE(::testing::Message()
                 << s.heads << " heads of " << s.head_size << ", rot_half " << s.rot_half);
    const int n = 5, half = s.rot_half;
    const std::vector<float> x0 = Random(static_cast<size_t>(n) * s.stride, rng);
    std::vector<float> cos_t(static_cast<size_t>(n) * half), sin_t(cos_t.size());
    for (size_t i = 0; i < cos_t.size(); ++i) {
      const double angle = std::uniform_real_distribution<double>(-10, 10)(rng);
      cos_t[i] = static_cast<float>(std::cos(angle));
      sin_t[i] = static_cast<float>(std::sin(angle));
    }
    std::vector<float> want = x0, broken = x0;
    cpu_ops::ApplyRope(want.data(), n, s.heads, s.head_size, half, s.stride, cos_t.data(),
                       sin_t.data());
    ForEachPack([&](auto vec) {
      std::vector<float> got = x0;
      kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
        ApplyRopeBody<decltype(vec)::value>(got.data(), s.heads, s.head_size, half, s.stride,
                                            cos_t.data(), sin_t.data());
      });
      EXPECT_EQ(Mismatches(got, want, kRel, kAbs), 0);
    });
    kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
      BrokenApplyRopeBody(broken.data(), s.heads, s.head_size, half, s.stride, cos_t.data(),
                          sin_t.data());
    });
    EXPECT_GT(Mismatches(broken, want, kRel, kAbs), 0) << "negative control passed the check";
  }
}

// ---- SiLU-and-mul, bias add (grid-stride loops) ---------------------------------

// Broken: silu(g) computed as g / (1 + exp(g)).
void BrokenSiluMulBody(float* gate, const float* up, int64_t count) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[k];
    gate[k] = g / (1.0f + expf(g)) * up[k];
  }
}

// Broken packing: the pack count rounded down once too often (the last pack
// is never written).
template <int VEC>
void BrokenPackedSiluMulBody(float* gate, const float* up, int64_t count) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
       k < (count - 1) / VEC; k += static_cast<int64_t>(gridDim.x) * blockDim.x)
    SiluMulPack<float, VEC>(gate + k * VEC, up + k * VEC, gate + k * VEC);
}

TEST(CudaModelEmulationTest, SiluMulMatchesCpu) {
  ForEachPack([](auto vec) {
    constexpr int V = decltype(vec)::value;
    std::mt19937 rng(4);
    // Several grid-stride rounds of 3 blocks; with packs, a multiple of the pack.
    const int64_t count = V == 1 ? 3 * 1536 + 7 : 4 * 1536 + 8;
    const std::vector<float> gate0 = Random(count, rng, -8.0f, 8.0f);
    const std::vector<float> up = Random(count, rng);
    std::vector<float> want = gate0, got = gate0, broken = gate0;
    cpu_ops::SiluMul(want.data(), up.data(), count, want.data());
    kc::EmuLaunch(dim3(3), dim3(kThreads), 0,
                  [&] { SiluMulBody<float, V>(got.data(), up.data(), count, got.data()); });
    EXPECT_EQ(Mismatches(got, want, kRel, kAbs), 0);
    kc::EmuLaunch(dim3(3), dim3(kThreads), 0, [&] {
      if constexpr (V == 1) {
        BrokenSiluMulBody(broken.data(), up.data(), count);
      } else {
        BrokenPackedSiluMulBody<V>(broken.data(), up.data(), count);
      }
    });
    EXPECT_GT(Mismatches(broken, want, kRel, kAbs), 0) << "negative control passed the check";
  });
}

// ---- GEMM inputs in 16 bits -------------------------------------------------

// The norm and SiLU-and-mul bodies with a 16-bit output (the GEMM-input
// type of a 16-bit model) give exactly the fp32 variant's result rounded to
// nearest even once (the CPU's converter), with the same residual
// write-back; truncating instead must fail that check.
template <typename T, int VEC>
void GemmInput16Case(kernels::DType dt) {
  SCOPED_TRACE(kernels::DTypeName(dt));
  std::mt19937 rng(21);
  const int n = 5, dim = 1000;
  const double eps = 1e-5;
  const std::vector<float> x0 = Random(static_cast<size_t>(n) * dim, rng);
  const std::vector<float> add = Random(x0.size(), rng);
  const std::vector<float> weight = Random(dim, rng, 0.5f, 1.5f);
  const std::vector<int32_t> gather = {4, 0, 4};
  auto truncated = [&](const std::vector<float>& f) {
    std::vector<uint16_t> t = To16(f, dt);
    if (dt == kernels::DType::kBFloat16)
      for (size_t i = 0; i < f.size(); ++i) {
        uint32_t bits = 0;
        std::memcpy(&bits, &f[i], 4);
        t[i] = static_cast<uint16_t>(bits >> 16);
      }
    return t;
  };
  int rounding_mattered = 0;
  for (int mode = 0; mode < 3; ++mode) {  // norm only, add + write-back, gather with add
    SCOPED_TRACE(::testing::Message() << "norm mode " << mode);
    const float* a = mode == 0 ? nullptr : add.data();
    const int32_t* rows = mode == 2 ? gather.data() : nullptr;
    const int out_rows = mode == 2 ? static_cast<int>(gather.size()) : n;
    std::vector<float> x32 = x0, x16 = x0, out32(static_cast<size_t>(out_rows) * dim);
    std::vector<T> out16(out32.size());
    kc::EmuLaunch(dim3(out_rows), dim3(kThreads), 0, [&] {
      AddRmsNormBody<kThreads, float, float, VEC>(x32.data(), a, rows, weight.data(), dim, eps,
                                                  out32.data());
    });
    kc::EmuLaunch(dim3(out_rows), dim3(kThreads), 0, [&] {
      AddRmsNormBody<kThreads, T, float, VEC>(x16.data(), a, rows, weight.data(), dim, eps,
                                              out16.data());
    });
    std::vector<uint16_t> got(out16.size());
    std::memcpy(got.data(), out16.data(), got.size() * 2);
    EXPECT_EQ(got, To16(out32, dt));
    EXPECT_EQ(x16, x32);
    rounding_mattered += got != truncated(out32);
  }
  const int64_t count = VEC == 1 ? 3 * 1536 + 7 : 4 * 1536 + 8;
  const std::vector<float> gate = Random(count, rng, -8.0f, 8.0f), up = Random(count, rng);
  std::vector<float> out32(count);
  std::vector<T> out16(count);
  kc::EmuLaunch(dim3(3), dim3(kThreads), 0,
                [&] { SiluMulBody<float, VEC>(gate.data(), up.data(), count, out32.data()); });
  kc::EmuLaunch(dim3(3), dim3(kThreads), 0,
                [&] { SiluMulBody<T, VEC>(gate.data(), up.data(), count, out16.data()); });
  std::vector<uint16_t> got(count);
  std::memcpy(got.data(), out16.data(), got.size() * 2);
  EXPECT_EQ(got, To16(out32, dt));
  rounding_mattered += got != truncated(out32);
  if (dt == kernels::DType::kBFloat16) {
    EXPECT_EQ(rounding_mattered, 4) << "negative control (truncation) passed the check";
  }
}

// The add + norm reading 16-bit partial sums (the all-reduce payload under
// tensor parallelism) equals the fp32 body fed the same sums widened
// exactly, residual write-back included; fed the unrounded fp32 sums
// instead, the check fails (the 16-bit values are really read).
template <typename T, int VEC>
void PartialSums16Case(kernels::DType dt) {
  SCOPED_TRACE(kernels::DTypeName(dt));
  std::mt19937 rng(23);
  const int n = 4, dim = 1000;
  const std::vector<float> x0 = Random(static_cast<size_t>(n) * dim, rng);
  const std::vector<float> add = Random(x0.size(), rng);
  const std::vector<float> weight = Random(dim, rng, 0.5f, 1.5f);
  const std::vector<uint16_t> bits = To16(add, dt);
  std::vector<T> add16(bits.size());
  std::memcpy(static_cast<void*>(add16.data()), bits.data(), bits.size() * 2);
  std::vector<float> widened(add.size());
  for (size_t i = 0; i < add.size(); ++i)
    widened[i] = dt == kernels::DType::kBFloat16 ? kernels::BFloat16BitsToFloat(bits[i])
                                                 : kernels::HalfBitsToFloat(bits[i]);
  auto run = [&](const auto* a, std::vector<float>* x, std::vector<float>* out) {
    using AddT = std::remove_cv_t<std::remove_pointer_t<decltype(a)>>;
    *x = x0;
    out->assign(x0.size(), NAN);
    kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
      AddRmsNormBody<kThreads, float, AddT, VEC>(x->data(), a, nullptr, weight.data(), dim, 1e-5,
                                                 out->data());
    });
  };
  std::vector<float> got_x, got, want_x, want, raw_x, raw;
  run(add16.data(), &got_x, &got);
  run(widened.data(), &want_x, &want);
  run(add.data(), &raw_x, &raw);
  EXPECT_EQ(Mismatches(got, want, 0, 0), 0);
  EXPECT_EQ(Mismatches(got_x, want_x, 0, 0), 0);
  EXPECT_GT(Mismatches(got_x, raw_x, 0, 0), 0) << "negative control passed the check";
}

TEST(CudaModelEmulationTest, AddRmsNormReads16BitPartialSums) {
  ForEachPack([](auto vec) {
    PartialSums16Case<__half, decltype(vec)::value>(kernels::DType::kFloat16);
    PartialSums16Case<__nv_bfloat16, decltype(vec)::value>(kernels::DType::kBFloat16);
  });
}

TEST(CudaModelEmulationTest, GemmInputsIn16BitsAreTheFp32ResultsRoundedOnce) {
  ForEachPack([](auto vec) {
    GemmInput16Case<__half, decltype(vec)::value>(kernels::DType::kFloat16);
    GemmInput16Case<__nv_bfloat16, decltype(vec)::value>(kernels::DType::kBFloat16);
  });
}

// The SiLU-and-mul over a stacked gate/up GEMM output (no split) against
// the split halves through SiluMulBody: the same bits, in fp32 and bf16.
template <int VEC>
void SiluMulStackedCase() {
  std::mt19937 rng(22);
  const int64_t n = 7;
  // Rows not a multiple of the block; 3 blocks stride the rest. Packs need
  // a multiple of the pack.
  const int inter = VEC == 1 ? 333 : 332;
  const std::vector<float> y = Random(static_cast<size_t>(n) * 2 * inter, rng, -8.0f, 8.0f);
  std::vector<float> gate(static_cast<size_t>(n) * inter), up(gate.size()), want(gate.size());
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < inter; ++i) {
      gate[t * inter + i] = y[t * 2 * inter + i];
      up[t * inter + i] = y[t * 2 * inter + inter + i];
    }
  const int64_t count = n * inter;
  kc::EmuLaunch(dim3(3), dim3(kThreads), 0,
                [&] { SiluMulBody<float>(gate.data(), up.data(), count, want.data()); });
  std::vector<float> got(want.size(), NAN);
  kc::EmuLaunch(dim3(3), dim3(kThreads), 0,
                [&] { SiluMulStackedBody<float, VEC>(y.data(), n, inter, got.data()); });
  EXPECT_EQ(Mismatches(got, want, 0, 0), 0);
  std::vector<__nv_bfloat16> got16(want.size());
  kc::EmuLaunch(dim3(3), dim3(kThreads), 0,
                [&] { SiluMulStackedBody<__nv_bfloat16, VEC>(y.data(), n, inter, got16.data()); });
  std::vector<uint16_t> bits(got16.size());
  std::memcpy(bits.data(), got16.data(), bits.size() * 2);
  EXPECT_EQ(bits, To16(want, kernels::DType::kBFloat16));
  // Negative control: the halves swapped (silu(up) * gate).
  std::vector<float> swapped(want.size());
  kc::EmuLaunch(dim3(3), dim3(kThreads), 0,
                [&] { SiluMulBody<float>(up.data(), gate.data(), count, swapped.data()); });
  EXPECT_GT(Mismatches(swapped, want, 0, 0), 0) << "negative control passed the check";
}

TEST(CudaModelEmulationTest, SiluMulStackedMatchesSplitSiluMul) {
  ForEachPack([](auto vec) { SiluMulStackedCase<decltype(vec)::value>(); });
}

TEST(CudaModelEmulationTest, AddBiasMatchesReference) {
  std::mt19937 rng(5);
  const int n = 9, cols = 333;
  const std::vector<float> y0 = Random(static_cast<size_t>(n) * cols, rng);
  const std::vector<float> bias = Random(cols, rng);
  std::vector<float> want = y0, got = y0, broken = y0;
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < cols; ++j) want[static_cast<size_t>(t) * cols + j] += bias[j];
  kc::EmuLaunch(dim3(2), dim3(kThreads), 0,
                [&] { AddBiasBody(got.data(), bias.data(), int64_t{n} * cols, cols); });
  EXPECT_EQ(Mismatches(got, want, 0, 0), 0);
  // Broken: the bias indexed modulo cols - 1 (a wrong row length).
  kc::EmuLaunch(dim3(2), dim3(kThreads), 0,
                [&] { AddBiasBody(broken.data(), bias.data(), int64_t{n} * cols, cols - 1); });
  EXPECT_GT(Mismatches(broken, want, 0, 0), 0) << "negative control passed the check";
}

// ---- Gemma: post-norm residual add, embedding scale, GeGLU, local RoPE ------------

// Broken: the norm taken over the residual instead of the added output
// (the pre-norm of a plain block, not Gemma's post-norm).
template <int NUM_THREADS>
void BrokenAddPostRmsNormBody(float* residual, const float* add, const float* weight, int dim,
                              double eps) {
  __shared__ double partial[NUM_THREADS];
  const int64_t t = blockIdx.x;
  float* xr = residual + t * dim;
  const float* ar = add + t * dim;
  double ss = 0.0;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) ss += static_cast<double>(xr[i]) * xr[i];
  partial[threadIdx.x] = ss;
  __syncthreads();
  for (int stride = NUM_THREADS / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride)
      partial[threadIdx.x] += partial[threadIdx.x + stride];
    __syncthreads();
  }
  const float inv = static_cast<float>(1.0 / sqrt(partial[0] / dim + eps));
  for (int i = threadIdx.x; i < dim; i += blockDim.x) xr[i] += ar[i] * inv * weight[i];
}

TEST(CudaModelEmulationTest, AddPostRmsNormMatchesCpu) {
  std::mt19937 rng(31);
  const double eps = 1e-6;
  const int n = 5;
  // Below, at a multiple of and above the block width (with packs, 2056
  // takes a thread two rounds).
  for (int dim : {96, 576, 1000, 2056}) {
    SCOPED_TRACE(::testing::Message() << "dim " << dim);
    const std::vector<float> x0 = Random(static_cast<size_t>(n) * dim, rng);
    // The added rows at another scale than the residual, so that a norm of
    // the wrong one shows.
    const std::vector<float> add = Random(x0.size(), rng, -9.0f, 9.0f);
    const std::vector<float> weight = Random(dim, rng, 0.5f, 1.5f);
    std::vector<float> want = x0;
    cpu_ops::AddPostRmsNorm(want.data(), add.data(), n, dim, weight.data(), eps);
    ForEachPack([&](auto vec) {
      constexpr int V = decltype(vec)::value;
      std::vector<float> got = x0;
      kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
        AddPostRmsNormBody<kThreads, float, V>(got.data(), add.data(), weight.data(), dim, eps);
      });
      EXPECT_EQ(Mismatches(got, want, kRel, kAbs), 0);
      got = x0;
      kc::EmuLaunch(dim3(n), dim3(64), 0, [&] {  // another block width
        AddPostRmsNormBody<64, float, V>(got.data(), add.data(), weight.data(), dim, eps);
      });
      EXPECT_EQ(Mismatches(got, want, kRel, kAbs), 0);
    });
    std::vector<float> broken = x0;
    kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
      BrokenAddPostRmsNormBody<kThreads>(broken.data(), add.data(), weight.data(), dim, eps);
    });
    EXPECT_GT(Mismatches(broken, want, kRel, kAbs), 0) << "negative control passed the check";
  }
}

// 16-bit partial sums (tensor parallelism): the same as the fp32 body fed
// the sums widened exactly; fed the unrounded fp32 sums, the check fails.
template <typename T, int VEC>
void PostNorm16Case(kernels::DType dt) {
  SCOPED_TRACE(kernels::DTypeName(dt));
  std::mt19937 rng(32);
  const int n = 4, dim = 1000;
  const std::vector<float> x0 = Random(static_cast<size_t>(n) * dim, rng);
  const std::vector<float> add = Random(x0.size(), rng);
  const std::vector<float> weight = Random(dim, rng, 0.5f, 1.5f);
  const std::vector<uint16_t> bits = To16(add, dt);
  std::vector<T> add16(bits.size());
  std::memcpy(static_cast<void*>(add16.data()), bits.data(), bits.size() * 2);
  std::vector<float> widened(add.size());
  for (size_t i = 0; i < add.size(); ++i)
    widened[i] = dt == kernels::DType::kBFloat16 ? kernels::BFloat16BitsToFloat(bits[i])
                                                 : kernels::HalfBitsToFloat(bits[i]);
  auto run = [&](const auto* a) {
    using AddT = std::remove_cv_t<std::remove_pointer_t<decltype(a)>>;
    std::vector<float> x = x0;
    kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
      AddPostRmsNormBody<kThreads, AddT, VEC>(x.data(), a, weight.data(), dim, 1e-6);
    });
    return x;
  };
  const std::vector<float> got = run(add16.data()), want = run(widened.data());
  EXPECT_EQ(Mismatches(got, want, 0, 0), 0);
  EXPECT_GT(Mismatches(run(add.data()), want, 0, 0), 0) << "negative control passed the check";
}

TEST(CudaModelEmulationTest, AddPostRmsNormReads16BitPartialSums) {
  ForEachPack([](auto vec) {
    PostNorm16Case<__half, decltype(vec)::value>(kernels::DType::kFloat16);
    PostNorm16Case<__nv_bfloat16, decltype(vec)::value>(kernels::DType::kBFloat16);
  });
}

TEST(CudaModelEmulationTest, ScaleMatchesCpu) {
  ForEachPack([](auto vec) {
    constexpr int V = decltype(vec)::value;
    std::mt19937 rng(33);
    // Several grid-stride rounds of 3 blocks; with packs, a multiple of the pack.
    const int64_t count = V == 1 ? 3 * 1536 + 7 : 4 * 1536 + 8;
    const float factor = std::sqrt(256.0f);  // Gemma: sqrt(hidden)
    const std::vector<float> x0 = Random(count, rng);
    std::vector<float> want = x0, got = x0, broken = x0;
    for (float& v : want) v *= factor;  // the CPU backend's Scale loop
    kc::EmuLaunch(dim3(3), dim3(kThreads), 0, [&] { ScaleBody<V>(got.data(), count, factor); });
    EXPECT_EQ(Mismatches(got, want, 0, 0), 0);
    // Broken: the grid-stride loop run over count - 1 elements (the last
    // one, or the last pack, left unscaled).
    kc::EmuLaunch(dim3(3), dim3(kThreads), 0,
                  [&] { ScaleBody<V>(broken.data(), count - V, factor); });
    EXPECT_GT(Mismatches(broken, want, 0, 0), 0) << "negative control passed the check";
  });
}

// Broken: the exact erf GELU in place of the tanh approximation.
void BrokenGeluTanhMulBody(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < count;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[k];
    out[k] = 0.5f * g * (1.0f + std::erf(g * 0.70710678f)) * up[k];
  }
}

TEST(CudaModelEmulationTest, GeluTanhMulMatchesCpu) {
  ForEachPack([](auto vec) {
    constexpr int V = decltype(vec)::value;
    std::mt19937 rng(34);
    const int64_t count = V == 1 ? 3 * 1536 + 7 : 4 * 1536 + 8;
    const std::vector<float> gate = Random(count, rng, -8.0f, 8.0f);
    const std::vector<float> up = Random(count, rng);
    std::vector<float> want(count), got(count, NAN), broken(count, NAN);
    cpu_ops::GeluTanhMul(gate.data(), up.data(), count, want.data());
    kc::EmuLaunch(dim3(3), dim3(kThreads), 0,
                  [&] { GeluTanhMulBody<float, V>(gate.data(), up.data(), count, got.data()); });
    EXPECT_EQ(Mismatches(got, want, kRel, kAbs), 0);
    // In place (out = gate), as the fp32 path may run it.
    std::vector<float> in_place = gate;
    kc::EmuLaunch(dim3(3), dim3(kThreads), 0, [&] {
      GeluTanhMulBody<float, V>(in_place.data(), up.data(), count, in_place.data());
    });
    EXPECT_EQ(Mismatches(in_place, want, kRel, kAbs), 0);
    // A 16-bit GEMM input: the fp32 result rounded to nearest even once.
    std::vector<__nv_bfloat16> got16(count);
    kc::EmuLaunch(dim3(3), dim3(kThreads), 0, [&] {
      GeluTanhMulBody<__nv_bfloat16, V>(gate.data(), up.data(), count, got16.data());
    });
    std::vector<uint16_t> bits(count);
    std::memcpy(bits.data(), got16.data(), bits.size() * 2);
    EXPECT_EQ(bits, To16(got, kernels::DType::kBFloat16));
    std::vector<__half> got_h(count);
    kc::EmuLaunch(dim3(3), dim3(kThreads), 0,
                  [&] { GeluTanhMulBody<__half, V>(gate.data(), up.data(), count, got_h.data()); });
    std::memcpy(bits.data(), got_h.data(), bits.size() * 2);
    EXPECT_EQ(bits, To16(got, kernels::DType::kFloat16));
    kc::EmuLaunch(dim3(3), dim3(kThreads), 0,
                  [&] { BrokenGeluTanhMulBody(gate.data(), up.data(), count, broken.data()); });
    EXPECT_GT(Mismatches(broken, want, kRel, kAbs), 0) << "negative control passed the check";
  });
}

// The final logit soft cap on the device (Gemma 2; what LmHead and
// LmHeadSample run before the download, the argmax and the sampling kernel)
// against SoftcapLogit, the host rule every backend follows: the same bits
// (both in double), NaN kept, +-inf to +-cap. Broken: tanh(z) * cap without
// the division.
TEST(CudaModelEmulationTest, FinalSoftcapMatchesHostRule) {
  std::mt19937 rng(36);
  std::vector<float> x0 = Random(3 * 1536 + 7, rng, -200.0f, 200.0f);
  x0.insert(x0.end(), {0.0f, -0.0f, 1e-30f, 3.0f, -3.0f, 1e30f, INFINITY, -INFINITY, NAN});
  const int64_t count = static_cast<int64_t>(x0.size());
  for (double cap : {30.0, 3.0}) {
    SCOPED_TRACE(::testing::Message() << "cap " << cap);
    std::vector<float> got = x0, want(x0.size()), broken(x0.size());
    for (size_t i = 0; i < x0.size(); ++i) {
      want[i] = SoftcapLogit(x0[i], cap);
      broken[i] = static_cast<float>(std::tanh(static_cast<double>(x0[i])) * cap);
    }
    kc::EmuLaunch(dim3(3), dim3(kThreads), 0, [&] { SoftcapBody(got.data(), count, cap); });
    int bad = 0, control_bad = 0;
    for (size_t i = 0; i < x0.size(); ++i) {
      auto same = [&](float a, float b) {
        return std::isnan(b) ? std::isnan(a) : kernels::FloatBits(a) == kernels::FloatBits(b);
      };
      bad += same(got[i], want[i]) ? 0 : 1;
      control_bad += same(broken[i], want[i]) ? 0 : 1;
    }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(got[x0.size() - 3], static_cast<float>(cap));
    EXPECT_EQ(got[x0.size() - 2], -static_cast<float>(cap));
    EXPECT_GT(control_bad, 0) << "negative control passed the check";
  }
}

// Gemma 3's local layers rotate by their own tables (rope_local_base_freq,
// unscaled; RopeLocalInverseFrequencies) while the global ones use
// rope_theta with linear scaling: the RoPE bodies the backend runs on the
// local tables (ApplyRopeBody, RopeConvertBody for the queries,
// RopeReshapeAndCacheBody for the keys) against cpu_ops::ApplyRope on the
// same tables, as the forward pass builds them (angles in double). Negative
// control: the global tables miss the local reference.
TEST(CudaModelEmulationTest, LocalRopeTablesMatchCpu) {
  ModelConfig cfg;
  cfg.head_size = 64;
  cfg.rope_theta = 1e6;
  cfg.rope_local_theta = 1e4;
  cfg.rope_scaling.type = RopeScaling::Type::kLinear;
  cfg.rope_scaling.factor = 8.0;
  const std::vector<double> local_inv = RopeLocalInverseFrequencies(cfg);
  const std::vector<double> global_inv = RopeInverseFrequencies(cfg);
  const int half = cfg.head_size / 2;
  ASSERT_EQ(local_inv.size(), static_cast<size_t>(half));
  ASSERT_EQ(global_inv.size(), static_cast<size_t>(half));
  const std::vector<int32_t> positions = {0, 1, 17, 300, 4095, 9};
  const int n = static_cast<int>(positions.size()), heads = 3, D = cfg.head_size;
  auto tables = [&](const std::vector<double>& inv, std::vector<float>* c, std::vector<float>* s) {
    for (int32_t p : positions)
      for (int i = 0; i < half; ++i) {
        c->push_back(static_cast<float>(std::cos(p * inv[i])));
        s->push_back(static_cast<float>(std::sin(p * inv[i])));
      }
  };
  std::vector<float> lc, ls, gc, gs;
  tables(local_inv, &lc, &ls);
  tables(global_inv, &gc, &gs);
  std::mt19937 rng(35);
  const int64_t stride = static_cast<int64_t>(heads) * D;
  const std::vector<float> x0 = Random(static_cast<size_t>(n) * stride, rng);
  std::vector<float> want = x0;
  cpu_ops::ApplyRope(want.data(), n, heads, D, half, stride, lc.data(), ls.data());
  ForEachPack([&](auto vec) {
    constexpr int V = decltype(vec)::value;
    auto apply = [&](const std::vector<float>& c, const std::vector<float>& s) {
      std::vector<float> x = x0;
      kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
        ApplyRopeBody<V>(x.data(), heads, D, half, stride, c.data(), s.data());
      });
      return x;
    };
    EXPECT_EQ(Mismatches(apply(lc, ls), want, kRel, kAbs), 0);
    EXPECT_GT(Mismatches(apply(gc, gs), want, kRel, kAbs), 0)
        << "negative control (global tables) passed the check";
    std::vector<float> q(x0.size(), NAN);
    kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
      RopeConvertBody<float, V>(x0.data(), heads, D, half, stride, nullptr, lc.data(), ls.data(),
                                q.data());
    });
    EXPECT_EQ(Mismatches(q, want, kRel, kAbs), 0);
    // Keys: heads KV heads written by the fused kernel into an fp32 cache
    // (block size 8, token t at slot t), read back in vLLM's layout.
    const int block_size = 8, X = 4;  // x = 16 bytes of fp32
    const int64_t num_blocks = 1;
    std::vector<int64_t> slots(n);
    for (int t = 0; t < n; ++t) slots[t] = t;
    std::vector<float> kcache(static_cast<size_t>(num_blocks) * block_size * stride, NAN);
    std::vector<float> vcache(kcache.size(), NAN);
    kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
      RopeReshapeAndCacheBody<float, V>(x0.data(), x0.data(), stride, nullptr, nullptr, heads, D,
                                        half, lc.data(), ls.data(), slots.data(), num_blocks,
                                        block_size, kcache.data(), vcache.data(), 1.0f, 1.0f);
    });
    std::vector<float> k(x0.size());
    for (int t = 0; t < n; ++t)
      for (int h = 0; h < heads; ++h)
        for (int d = 0; d < D; ++d)
          k[t * stride + h * D + d] =
              kcache[kc::KeyCacheOffset(0, t, h, d, heads, D, block_size, X)];
    EXPECT_EQ(Mismatches(k, want, kRel, kAbs), 0);
  });
}

// ---- Mixture of experts ------------------------------------------------------

// Broken combine: every token sums its first pair top_k times (the wrong
// experts' rows).
void BrokenMoeCombineBody(const float* pair_out, const int32_t* token_pairs,
                          const float* pair_weights, int top_k, int hidden, const float* shared_out,
                          const float* shared_logit, float* y) {
  const int64_t t = blockIdx.x;
  for (int c = threadIdx.x; c < hidden; c += blockDim.x) {
    float acc = 0.0f;
    const int64_t i = token_pairs[t * top_k];
    for (int j = 0; j < top_k; ++j) acc += pair_weights[i] * pair_out[i * hidden + c];
    if (shared_out != nullptr)
      acc += 1.0f / (1.0f + expf(-shared_logit[t])) * shared_out[t * hidden + c];
    y[t * hidden + c] = acc;
  }
}

// MoeMlp's device side around the expert GEMMs: the rows gathered by expert
// (RouteTokens' grouping) are x's rows exactly, in fp32 and fp16, and the
// combine equals cpu_ops::MoeCombine (the CPU backend's sum, checked against
// transformers by the MoE model tests) with and without a shared expert, in
// fp32 and rounded once to fp16 / bf16 partial sums; each with a broken
// variant that must fail.
TEST(CudaModelEmulationTest, MoeGatherRowsAndCombineMatchCpu) {
  std::mt19937 rng(31);
  MoeConfig moe;
  moe.num_experts = 6;
  moe.top_k = 3;
  moe.norm_topk_prob = true;
  const int n = 7, hidden = 20;
  const std::vector<float> logits = Random(static_cast<size_t>(n) * moe.num_experts, rng);
  MoeRouting r;
  ASSERT_TRUE(RouteTokens(logits.data(), n, moe, &r).ok());
  const int64_t pairs = static_cast<int64_t>(r.tokens.size());
  ASSERT_EQ(pairs, n * moe.top_k);
  std::vector<int32_t> token_pairs(static_cast<size_t>(pairs));
  TokenPairPositions(r, token_pairs.data());
  for (int t = 0; t < n; ++t) {
    for (int j = 0; j < moe.top_k; ++j) {  // token t's pairs, ascending experts
      const int32_t i = token_pairs[t * moe.top_k + j];
      EXPECT_EQ(r.tokens[i], t);
      if (j > 0) {
        EXPECT_LT(token_pairs[t * moe.top_k + j - 1], i);
      }
    }
  }

  const std::vector<float> x = Random(static_cast<size_t>(n) * hidden, rng);
  ForEachPack([&](auto vec) {
    constexpr int V = decltype(vec)::value;
    std::vector<float> got(static_cast<size_t>(pairs) * hidden, NAN), want(got.size());
    for (int64_t i = 0; i < pairs; ++i)
      std::copy_n(x.data() + r.tokens[i] * hidden, hidden, want.data() + i * hidden);
    kc::EmuLaunch(dim3(pairs), dim3(kThreads), 0, [&] {
      MoeGatherRowsBody<float, V>(x.data(), r.tokens.data(), hidden, got.data());
    });
    EXPECT_EQ(Mismatches(got, want, 0, 0), 0);
    std::vector<__half> x16(x.size()), got16(got.size());
    for (size_t i = 0; i < x.size(); ++i) x16[i] = __float2half(x[i]);
    kc::EmuLaunch(dim3(pairs), dim3(kThreads), 0, [&] {
      MoeGatherRowsBody<__half, V>(x16.data(), r.tokens.data(), hidden, got16.data());
    });
    int bad16 = 0;
    for (int64_t i = 0; i < pairs; ++i)
      for (int c = 0; c < hidden; ++c)
        bad16 += __half2float(got16[i * hidden + c]) !=
                 __half2float(x16[static_cast<size_t>(r.tokens[i]) * hidden + c]);
    EXPECT_EQ(bad16, 0);
  });

  const std::vector<float> pair_out = Random(static_cast<size_t>(pairs) * hidden, rng);
  const std::vector<float> shared_out = Random(static_cast<size_t>(n) * hidden, rng);
  const std::vector<float> shared_logit = Random(static_cast<size_t>(n), rng, -4.0f, 4.0f);
  for (const bool shared : {false, true}) {
    SCOPED_TRACE(shared ? "with a shared expert" : "without a shared expert");
    const float* so = shared ? shared_out.data() : nullptr;
    const float* sl = shared ? shared_logit.data() : nullptr;
    std::vector<float> want(static_cast<size_t>(n) * hidden, NAN);
    cpu_ops::MoeCombine(pair_out.data(), token_pairs.data(), r.token_weights.data(), n, moe.top_k,
                        hidden, so, sl, want.data());
    ForEachPack([&](auto vec) {
      constexpr int V = decltype(vec)::value;
      std::vector<float> got(want.size(), NAN);
      kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
        MoeCombineBody<float, V>(pair_out.data(), token_pairs.data(), r.token_weights.data(),
                                 moe.top_k, hidden, so, sl, got.data());
      });
      EXPECT_EQ(Mismatches(got, want, kRel, kAbs), 0);
      // 16-bit partial sums (tensor parallelism): the fp32 sum rounded once.
      std::vector<__nv_bfloat16> got_bf16(want.size());
      kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
        MoeCombineBody<__nv_bfloat16, V>(pair_out.data(), token_pairs.data(),
                                         r.token_weights.data(), moe.top_k, hidden, so, sl,
                                         got_bf16.data());
      });
      std::vector<float> wide(want.size()), rounded(want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        wide[i] = __bfloat162float(got_bf16[i]);
        rounded[i] = kernels::BFloat16BitsToFloat(kernels::FloatToBFloat16Bits(want[i]));
      }
      // Equal unless an fp32 sum differing in its last bits rounds the other way.
      EXPECT_EQ(Mismatches(wide, rounded, 1.0 / 128, 0), 0);
    });
    std::vector<float> broken(want.size(), NAN);
    kc::EmuLaunch(dim3(n), dim3(kThreads), 0, [&] {
      BrokenMoeCombineBody(pair_out.data(), token_pairs.data(), r.token_weights.data(), moe.top_k,
                           hidden, so, sl, broken.data());
    });
    EXPECT_GT(Mismatches(broken, want, kRel, kAbs), 0) << "negative control passed the check";
  }
}

}  // namespace
}  // namespace pagedserve::cuda_model
