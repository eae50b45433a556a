// CPU Linear (kernels/linear.h): validation, instruction-set dispatch, the
// choice of method per shape and the split of output rows over OpenMP threads.
#include "kernels/linear.h"

#include <cblas.h>
#include <omp.h>

#include <strings.h>
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/linear_cpu.h"

namespace pagedserve::kernels {
namespace {

// ---- instruction sets ----

bool Detect(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable: return true;
#if defined(__x86_64__) && defined(PAGEDSERVE_LINEAR_X86_PATHS)
    case CpuIsa::kAvx2: return cpu::CpuHasAvx2FmaF16c();
    case CpuIsa::kAvx512:
      __builtin_cpu_init();
      return Detect(CpuIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512vnni");
#endif
    default: return false;
  }
}

const char* IsaRequirement(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable: return "nothing";
    case CpuIsa::kAvx2: return "AVX2, FMA and F16C";
    case CpuIsa::kAvx512: return "AVX2, FMA, F16C, AVX512F/BW/VL and AVX512-VNNI";
  }
  return "?";
}

CpuIsa BestIsa() {
  if (Detect(CpuIsa::kAvx512)) return CpuIsa::kAvx512;
  if (Detect(CpuIsa::kAvx2)) return CpuIsa::kAvx2;
  return CpuIsa::kPortable;
}

// The initial path: the best one, or PAGEDSERVE_CPU_ISA when it names one the CPU has.
CpuIsa InitialIsa() {
  const char* env = std::getenv("PAGEDSERVE_CPU_ISA");
  if (env != nullptr) {
    for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
      if (std::strcmp(env, CpuIsaName(isa)) == 0 && Detect(isa)) return isa;
    }
  }
  return BestIsa();
}

std::atomic<int>& ActiveIsaSlot() {
  static std::atomic<int> slot{static_cast<int>(InitialIsa())};
  return slot;
}

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kPortable: return "portable";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "?";
}

bool CpuSupportsIsa(CpuIsa isa) {
  static const bool has[3] = {Detect(CpuIsa::kPortable), Detect(CpuIsa::kAvx2),
                              Detect(CpuIsa::kAvx512)};
  const int i = static_cast<int>(isa);
  return i >= 0 && i < 3 && has[i];
}

CpuIsa ActiveLinearIsa() { return static_cast<CpuIsa>(ActiveIsaSlot().load()); }

bool LinearUsesAmx() { return ActiveLinearIsa() == CpuIsa::kAvx512 && cpu::AmxBf16Usable(); }

absl::Status SetLinearAmx(bool on) {
  if (on && !cpu::AmxBf16Supported())
    return absl::FailedPreconditionError(
        "the AMX tiles of Linear need AMX-TILE, AMX-BF16 and AVX512-BF16 and the OS's leave to "
        "use them, which this CPU or process lacks");
  cpu::SetAmxBf16Enabled(on);
  return absl::OkStatus();
}

absl::Status SetLinearIsa(CpuIsa isa) {
  if (!CpuSupportsIsa(isa)) {
    return absl::FailedPreconditionError(absl::StrCat("the ", CpuIsaName(isa),
                                                      " path of Linear needs ", IsaRequirement(isa),
                                                      ", which this CPU or build lacks"));
  }
  ActiveIsaSlot().store(static_cast<int>(isa));
  return absl::OkStatus();
}

namespace {

// ---- validation ----

bool Overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

absl::Status ValidateLinear(const LinearParams& p) {
  absl::Status s = ValidateWeightView(p.w);
  if (!s.ok()) return s;
  if (p.num_tokens < 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_tokens must be >= 0, got ", p.num_tokens));
  }
  if (p.num_tokens == 0) return absl::OkStatus();
  if (p.x == nullptr) return absl::InvalidArgumentError("x is null");
  if (p.y == nullptr) return absl::InvalidArgumentError("y is null");
  if (p.x_stride < p.w.cols) {
    return absl::InvalidArgumentError(
        absl::StrCat("x_stride ", p.x_stride, " is less than w.cols ", p.w.cols));
  }
  if (p.y_stride < p.w.rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("y_stride ", p.y_stride, " is less than w.rows ", p.w.rows));
  }
  const size_t y_bytes = 4 * static_cast<size_t>((p.num_tokens - 1) * p.y_stride + p.w.rows);
  const size_t x_bytes = 4 * static_cast<size_t>((p.num_tokens - 1) * p.x_stride + p.w.cols);
  if (Overlaps(p.y, y_bytes, p.x, x_bytes)) return absl::InvalidArgumentError("y overlaps x");
  if (p.bias != nullptr && Overlaps(p.y, y_bytes, p.bias, 4 * static_cast<size_t>(p.w.rows))) {
    return absl::InvalidArgumentError("y overlaps bias");
  }
  return absl::OkStatus();
}

}  // namespace

namespace cpu {
namespace {

// Tokens from which the tile-sgemm method is used; the one place a method is
// chosen. Measured with bench/linear_bench.cc BM_LinearMethod (1536x1536, one
// thread, CPU time, docs/benchmarks-history.md "Linear kernels (CPU)"): for F32 sgemm
// overtakes fp32 dot products between 16 and 32 tokens; for F16/BF16 the two
// are even at 128 tokens (the tile conversion is paid per call) and sgemm is
// ahead at 256; for the quantized formats the 8-bit dot products were faster than
// converting tiles for sgemm at every size measured (4..256 tokens: 1.3-8x), so
// they never use sgemm: register-blocked tiles (RowDotsFaster below names the
// few shapes where the row dots are kept).
constexpr int64_t kSgemmMinTokensF32 = 24;
constexpr int64_t kSgemmMinTokensHalf = 128;
// The quantized formats use the register-blocked tiles (kRowBlock: 2 rows x 4
// tokens from 4 tokens, 4 rows x 1 token below) except where the row dots
// measured faster (BM_LinearMethod, one thread; docs/benchmarks-history.md
// "Register-blocked quantized kernels (CPU, issue 10)"):
//  - below 4 tokens on a weight larger than kDecodeTileMaxBytes: at 4096x4096
//    (9-14 MB) the 4-row tiles were 1.3-1.6x slower for Q4_1 and Q6_K than
//    streaming one row at a time (Q8_0 even, Q4_0/Q4_K faster), at 1536x1536
//    and smaller (<= 1.6 MB) 0.95-1.7x as fast (Q4_1 even, the others
//    faster); the limit is placed between the two measured sizes, for every
//    format but Q4_0 (next rules), not tuned further;
//  - Q4_1 at 3 tokens and Q8_0 at 2, on every path (1536x1536: 10-20%);
//  - Q8_0 on the x86 paths below 4 tokens at every size (there the panels
//    take 3 tokens, so this is 1-2): with the weight read from memory, as a
//    model's decode reads it (BM_LinearMethodCold, two threads, AMD EPYC Zen
//    4; docs/benchmarks.md "Decode methods with the weight read from memory"),
//    the row dots were 1.9-2.4x faster than the 4x1 tiles at 1-2 tokens on
//    both x86 paths, at 576x576 .. 8192x2048. The portable path keeps the
//    tiles (not measured).
//  - Q4_0 at one token on the x86 paths on a weight larger than
//    kDecodeTileMaxBytes, since the one-token row dots prefetch
//    (kPrefetchLegacyBytes): whole-model batch-1 decode on a
//    Llama-3.1-8B-shaped Q4_0 file, AMD EPYC Zen 4, two interleaved rounds,
//    6.69, 6.24 tokens/s against 5.55, 5.62 with the 4x1 tiles (both with the
//    6144-byte prefetch; row dots without a prefetch 6.03, 6.05). Earlier an
//    Intel Xeon had measured the tiles 1.13x faster than the row dots, which
//    then had no prefetch (docs/benchmarks.md "Llama-3.2-1B shape, idle, three
//    formats"): not measured there since. (From 2 tokens the x86 paths give
//    Q4_0 the panels, PanelMinTokens; the portable path keeps the tiles.)
// Everywhere else the tiles measured 1.0-3x faster.
constexpr int64_t kDecodeTileMaxBytes = int64_t{4} << 20;
// kRowBlock8 (8 rows in the vector lanes) on the AVX2 path, for the formats
// with its tile (HasRowBlock8: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), from one tile of
// tokens up (docs/benchmarks-history.md "Row-interleaved 8-row tiles (CPU, issue
// 10)"): one thread, against the 2x4 tiles 1.6-2.4x faster for Q4_0/Q4_1,
// 1.5-2.3x for Q5_0/Q5_1 and 1.1-1.5x for Q8_0 at 8-64 tokens (SmolLM2 shapes; the 49152x576 Q8_0
// LM head even at 8-16 tokens, 1.2x at 32-64), and at 1536x1536 with 128 and 256 tokens 1.6-2x
// faster than tiles converted to fp32 + OpenBLAS sgemm, which Q4_0/Q4_1 used from 128 tokens before
// (that sgemm had measured 1.0-1.4x faster than the 2x4 tiles there; it is no longer chosen for any
// quantized format; 256 tokens is the most measured). Not on the AVX-512 path: there vpdpbusd
// already fuses the multiply and the widening of the 2x4 tiles (whose int8
// row dots were 1.4x faster than sgemm at 128-256 tokens), and the 8-row
// tiles were not measured on such a CPU.
constexpr int64_t kRow8MinTokensAvx2 = kRow8Tokens;
// The K-quants (Q2_K .. Q6_K, and IQ4_XS, which has no tiles) on both x86
// paths use the row dots below kPanelMinTokens (1 row x up to 4 tokens per
// call). On AVX2, since the row dots unpack scales and mins in vectors, they
// measured as fast as or faster than both tiles with the weight in cache
// (BM_LinearMethod, one thread; docs/benchmarks-history.md "K-quant row dots
// (CPU, issue 10)"): 1536x1536 1-3 tokens 0.95-2.3x vs the 4x1 tiles, 4-128
// tokens 1.0-1.5x vs the 2x4 tiles (whose 8 integer and 8 fp32 accumulators
// spill from AVX2's 16 vector registers; the row dot's memory operands fold
// into pmaddubsw). On AVX-512 the tiles were up to 1.15x faster with the
// weight in cache, but a model's decode reads every weight from memory, and
// there (BM_LinearMethodCold, two threads, AMD EPYC Zen 4, Llama-3.2-1B's
// Q4_K / Q6_K shapes 512x2048 .. 8192x2048; docs/benchmarks.md "Decode
// methods with the weight read from memory") the row dots were 1.8-4.3x
// faster than the 4x1 tiles at 1-3 tokens and 1.2-3.7x faster than the 2x4
// tiles at 4-6, on AVX-512 as on AVX2 (the tiles' four rows are read as four
// streams; the row dot streams one). Not measured on an Intel CPU that way.
bool KQuantRowDots(WeightType type, CpuIsa isa) {
  return isa != CpuIsa::kPortable && UsesActBlock256(type);
}
// Called before Linear validates the shape: any type, rows or cols is safe here.
bool RowDotsFaster(WeightType type, int64_t num_tokens, int64_t rows, int64_t cols, CpuIsa isa) {
  const int64_t be = BlockElems(type);
  if (be <= 0) return false;
  const int64_t blocks_per_row = cols / be;
  const double bytes = static_cast<double>(rows) * static_cast<double>(blocks_per_row) *
                       static_cast<double>(BlockBytes(type));
  if (num_tokens < kBlockTokens && bytes > static_cast<double>(kDecodeTileMaxBytes) &&
      (type != WeightType::kQ4_0 || (num_tokens == 1 && isa != CpuIsa::kPortable)))
    return true;
  return (type == WeightType::kQ4_1 && num_tokens == 3) ||
         (type == WeightType::kQ8_0 && num_tokens < kBlockTokens && isa != CpuIsa::kPortable) ||
         (type == WeightType::kQ8_0 && num_tokens == 2);
}
// kPanel16 (the K-quants' many-token GEMM) from this many tokens on, on both
// x86 paths and for Q4_K, Q5_K and Q6_K alike. Measured with
// bench/linear_bench.cc BM_LinearPanel1B (one thread, Llama-3.2-1B shapes
// 2048x2048 and 2048x8192; docs/benchmarks.md "K-quant GEMM at the 1B shape (CPU, issue 34)"):
// the per-call repack costs about as much as 2-4 tokens of the row dots, so
// at 4 tokens the panels were even to 1.14x slower, at 8 tokens 1.4-1.6x
// faster than the row dots on AVX-512 and 1.04-1.2x on AVX2, at 16-32
// tokens 2-2.2x (AVX-512) and 1.2-1.5x (AVX2).
// Q4_0 and Q8_0 (PanelBlock32, issue 34) measured the same way at 2048x8192
// (docs/benchmarks.md "Q8_0 / Q4_0 / Q3_K at the 1B shape"): on AVX-512 the
// panels were 1.3-2.3x faster than the 2x4 tiles at 4 tokens and 1.8-5x at
// 8-128 (the AVX-512 path had no 8-row tiles), so they take the same
// crossover; on AVX2 the 8-row interleaved tiles (kRowBlock8) stayed 1.0-2.4x
// faster than the panels at 8-128 tokens (the panel's gather repack and
// Q8_0's per-chunk widening cost more than they save there), so Q4_0/Q8_0 keep
// kRowBlock8 on AVX2.
constexpr int64_t kPanelMinTokens = 8;
// The 32-element-block panels (Q4_0, Q4_1, Q8_0) from 2 tokens (Q4_0, Q4_1)
// or 3 (Q8_0) on, on both x86 paths (on AVX2 up to the 8-row tiles'
// kRow8MinTokensAvx2): the sizes of speculative verification (k + 1 tokens,
// issue 33). Measured with BM_LinearVerify135M (SmolLM2-135M's shapes
// 576x576, 1536x576, 576x1536 and the 49152x576 LM head, one thread, real
// time, after the repack's prefetch; docs/benchmarks.md "Speculative
// decoding"): on AVX-512 Q4_0/Q4_1 panels 1.2-1.9x faster than the 2x4
// tiles at 2 tokens and 2.3-5.7x at 3-9 tokens (AVX2 kernels 1.5-2.5x from 2);
// Q8_0 panels 0.7-1.2x the best other method at 2 tokens, 1.7-2.5x faster
// from 3 on AVX-512 and 1.1-1.2x on AVX2; at 1 token the 4x1 decode tiles
// (Q4_0 over kDecodeTileMaxBytes: the row dots, above) and the Q8_0 row dots
// stay (Q4_0/Q4_1 panels even there, Q8_0's 1.2-2x slower).
// The AVX2 figures are the AVX2 kernels on the AVX-512 machine
// (PAGEDSERVE_CPU_ISA=avx2), not an AVX2-only CPU.
bool IsPanel32(WeightType t) {
  return t == WeightType::kQ4_0 || t == WeightType::kQ4_1 || t == WeightType::kQ8_0;
}
int64_t PanelMinTokens(WeightType t) {
  if (!IsPanel32(t)) return kPanelMinTokens;
  return t == WeightType::kQ8_0 ? 3 : 2;
}
// Rows converted to fp32 per sgemm call of the tile method (F16/BF16).
constexpr int64_t kTileRows = 64;
// Tokens quantized by the calling thread before the parallel region.
constexpr int64_t kSerialQuantTokens = 4;
// Work (rows * cols * tokens) below which one thread does the whole call.
constexpr int64_t kMinParallelWork = 1 << 15;

void UseOpenBlasSingleThreaded() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// Per-thread scratch that keeps its capacity across calls.
template <typename T>
T* Scratch(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
  return v.data();
}

const uint8_t* Row(const WeightView& w, int64_t r) {
  return static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_stride_bytes;
}

// Quantizes token t's activations into `xq` (its blocks start at t * nb blocks)
// with the ISA's quantizer (bit-identical to QuantizeActs32/256).
void QuantizeToken(const LinearParams& p, const IsaKernels& k, int64_t nb, int64_t t, uint8_t* xq) {
  const float* x = p.x + t * p.x_stride;
  if (UsesActBlock256(p.w.type)) {
    k.quant256(x, p.w.cols, reinterpret_cast<ActBlock256*>(xq) + t * nb);
  } else {
    k.quant32(x, p.w.cols, reinterpret_cast<ActBlock32*>(xq) + t * nb);
  }
}

void RowDotRange(const LinearParams& p, const IsaKernels& k, const uint8_t* xq, int64_t r0,
                 int64_t r1) {
  const WeightType type = p.w.type;
  const int64_t T = p.num_tokens;
  const bool quant = IsQuantized(type);
  const IsaKernels::QDotFn qdot = quant ? QDotFor(k, type) : nullptr;
  const IsaKernels::FDotFn fdot = quant ? nullptr : FDotFor(k, type);
  const int64_t nb = p.w.cols / BlockElems(type);
  const size_t tok_bytes =
      static_cast<size_t>(nb) * (UsesActBlock256(type) ? sizeof(ActBlock256) : sizeof(ActBlock32));
  float out[kMaxTokens];
  for (int64_t r = r0; r < r1; ++r) {
    const uint8_t* w = Row(p.w, r);
    const float b = p.bias ? p.bias[r] : 0.0f;
    for (int64_t t = 0; t < T; t += kMaxTokens) {
      const int n = static_cast<int>(std::min<int64_t>(kMaxTokens, T - t));
      if (quant) {
        qdot(w, xq + t * tok_bytes, tok_bytes, nb, n, out);
      } else {
        fdot(w, p.x + t * p.x_stride, p.x_stride, p.w.cols, n, out);
      }
      for (int j = 0; j < n; ++j) p.y[(t + j) * p.y_stride + r] = out[j] + b;
    }
  }
}

// kRowBlock: tiles of kBlockRows rows x kBlockTokens tokens; the tokens left
// over (< kBlockTokens) and the rows left over (< kBlockRows) use the row dots.
// Fewer than kBlockTokens tokens: tiles of kDecodeRows rows x 1 token, one per
// token (the rows stay in L1 between the tokens), left-over rows by row dots.
void RowBlockRange(const LinearParams& p, const IsaKernels& k, const uint8_t* xq, int64_t r0,
                   int64_t r1) {
  const WeightType type = p.w.type;
  const int64_t T = p.num_tokens;
  const IsaKernels::QDotFn qdot = QDotFor(k, type);
  const int64_t nb = p.w.cols / BlockElems(type);
  const size_t tok_bytes =
      static_cast<size_t>(nb) * (UsesActBlock256(type) ? sizeof(ActBlock256) : sizeof(ActBlock32));
  int64_t r = r0;
  if (T < kBlockTokens) {
    const IsaKernels::QTileFn tile = QTileFor(k, type, /*decode=*/true);
    float out[kDecodeRows];
    for (; r + kDecodeRows <= r1; r += kDecodeRows) {
      for (int64_t t = 0; t < T; ++t) {
        tile(Row(p.w, r), p.w.row_stride_bytes, xq + t * tok_bytes, tok_bytes, nb, out);
        for (int i = 0; i < kDecodeRows; ++i)
          p.y[t * p.y_stride + r + i] = out[i] + (p.bias ? p.bias[r + i] : 0.0f);
      }
    }
    if (r < r1) RowDotRange(p, k, xq, r, r1);
    return;
  }
  const IsaKernels::QTileFn tile = QTileFor(k, type);
  const int64_t t_full = T - T % kBlockTokens;
  float out[kBlockRows * kBlockTokens];
  for (; r + kBlockRows <= r1; r += kBlockRows) {
    for (int64_t t = 0; t < t_full; t += kBlockTokens) {
      tile(Row(p.w, r), p.w.row_stride_bytes, xq + t * tok_bytes, tok_bytes, nb, out);
      for (int i = 0; i < kBlockRows; ++i) {
        const float b = p.bias ? p.bias[r + i] : 0.0f;
        for (int j = 0; j < kBlockTokens; ++j)
          p.y[(t + j) * p.y_stride + r + i] = out[i * kBlockTokens + j] + b;
      }
    }
    for (int64_t t = t_full; t < T; t += kMaxTokens) {
      const int n = static_cast<int>(std::min<int64_t>(kMaxTokens, T - t));
      for (int i = 0; i < kBlockRows; ++i) {
        qdot(Row(p.w, r + i), xq + t * tok_bytes, tok_bytes, nb, n, out);
        const float b = p.bias ? p.bias[r + i] : 0.0f;
        for (int j = 0; j < n; ++j) p.y[(t + j) * p.y_stride + r + i] = out[j] + b;
      }
    }
  }
  if (r < r1) RowDotRange(p, k, xq, r, r1);
}

// kRowBlock8: tiles of kRow8Rows rows x kRow8Tokens tokens; the tokens left
// over (< kRow8Tokens) use kRowBlock on the same 8 rows right after their tiles
// (while the rows are in L1), the rows left over (< kRow8Rows) kRowBlock.
// Formats without the tile, or fewer than kRow8Tokens tokens, use kRowBlock.
void RowBlock8Range(const LinearParams& p, const IsaKernels& k, const uint8_t* xq, int64_t r0,
                    int64_t r1) {
  const WeightType type = p.w.type;
  const int64_t T = p.num_tokens;
  const IsaKernels::QTileFn tile = Row8TileFor(k, type);
  if (tile == nullptr || T < kRow8Tokens) {
    RowBlockRange(p, k, xq, r0, r1);
    return;
  }
  const int64_t nb = p.w.cols / BlockElems(type);
  const size_t tok_bytes = static_cast<size_t>(nb) * sizeof(ActBlock32);
  const int64_t t_full = T - T % kRow8Tokens;
  // The left-over tokens as a call of their own (x is not read: the
  // activation blocks are already quantized).
  LinearParams rest = p;
  rest.x = p.x + t_full * p.x_stride;
  rest.num_tokens = T - t_full;
  rest.y = p.y + t_full * p.y_stride;
  float out[kRow8Rows * kRow8Tokens];
  int64_t r = r0;
  for (; r + kRow8Rows <= r1; r += kRow8Rows) {
    for (int64_t t = 0; t < t_full; t += kRow8Tokens) {
      tile(Row(p.w, r), p.w.row_stride_bytes, xq + t * tok_bytes, tok_bytes, nb, out);
      for (int j = 0; j < kRow8Tokens; ++j) {
        float* y = p.y + (t + j) * p.y_stride + r;
        for (int i = 0; i < kRow8Rows; ++i)
          y[i] = out[j * kRow8Rows + i] + (p.bias ? p.bias[r + i] : 0.0f);
      }
    }
    if (rest.num_tokens > 0) RowBlockRange(rest, k, xq + t_full * tok_bytes, r, r + kRow8Rows);
  }
  if (r < r1) RowBlockRange(p, k, xq, r, r1);
}

// Q4_0x8 / Q4_1x8 on the AVX-512 path: 16 rows per zmm (IsaKernels::i16q4_*)
// from this many tokens on, 8 rows per ymm below. Measured on Q4_0x8
// (bench/linear_bench.cc, one thread, AMD EPYC Zen 4; docs/benchmarks.md "Q4_0
// interleaved at load"): with the weight in cache (2048x2048) the zmm kernel
// gave 35.3k / 37.2k / 37.9k tokens/s at 4 / 8 / 32 tokens against the ymm
// kernel's 25.0k / 26.6k / 26.8k; with the weight read from memory at one
// token the zmm kernel (two streams) read 13.2 GB/s and the ymm kernel 24.6.
constexpr int64_t kInterleaved16MinTokens = 3;
// kInterleaved8 (Q4_0x8, Q4_1x8): per group of 8 rows (r0 and r1 are multiples of 8:
// the row units of ClaimRows are 16 rows and the weight's rows a multiple of
// 8), the tokens kRow8Tokens at a time while the group (8 rows' bytes) stays
// in L1.
void Interleaved8Range(const LinearParams& p, const IsaKernels& k, const uint8_t* xq, int64_t r0,
                       int64_t r1) {
  const int64_t T = p.num_tokens;
  const int64_t nb = p.w.cols / BlockElems(p.w.type);
  const size_t tok_bytes = static_cast<size_t>(nb) * sizeof(ActBlock32);
  const bool q4_1 = p.w.type == WeightType::kQ4_1x8;
  const IsaKernels::QDotFn dot8 = q4_1 ? k.i8q4_1 : k.i8q4_0;
  const IsaKernels::PanelFn gemm16 = q4_1 ? k.i16q4_1 : k.i16q4_0;
  int64_t r = r0;
  if (gemm16 != nullptr && T >= kInterleaved16MinTokens) {
    for (; r + kPanelRows <= r1; r += kPanelRows)
      gemm16(Row(p.w, r), p.w.row_stride_bytes, kPanelRows, nb, xq, tok_bytes, T, nullptr, p.y + r,
             p.y_stride, p.bias != nullptr ? p.bias + r : nullptr);
  }
  float out[kRow8Rows * kRow8Tokens];
  for (; r < r1; r += kRow8Rows) {
    for (int64_t t = 0; t < T; t += kRow8Tokens) {
      const int n = static_cast<int>(std::min<int64_t>(kRow8Tokens, T - t));
      dot8(Row(p.w, r), xq + t * tok_bytes, tok_bytes, nb, n, out);
      for (int j = 0; j < n; ++j) {
        float* y = p.y + (t + j) * p.y_stride + r;
        for (int i = 0; i < kRow8Rows; ++i)
          y[i] = out[j * kRow8Rows + i] + (p.bias ? p.bias[r + i] : 0.0f);
      }
    }
  }
}

// kAmxBf16 from this many tokens on (AVX-512 path, AmxBf16Usable, AmxHasPanel):
// Q4_0x8 / Q4_1x8 against the interleaved integer kernels, the row-major
// formats against their kPanel16 panels; measured in docs/benchmarks.md, "AMX".
int64_t AmxMinTokens(WeightType type) { return IsInterleavedRows8(type) ? 32 : 16; }

// kAmxBf16's k-chunk (AmxLinearRows); measured in docs/benchmarks.md, "AMX".
constexpr int64_t kAmxChunkK = 1024;

// kAmxBf16 over rows [r0, r1) (Q4_0x8 / Q4_1x8: multiples of 8) with the tokens' bf16
// tiles xa in the layout of the format.
void AmxRange(const LinearParams& p, const uint16_t* xa, int64_t r0, int64_t r1) {
  AmxLinearRows(p.w.type, Row(p.w, r0), p.w.row_stride_bytes, r1 - r0, p.w.cols, xa, p.num_tokens,
                p.y + r0, p.y_stride, p.bias != nullptr ? p.bias + r0 : nullptr, kAmxChunkK);
}

// kPanel16: panels of kPanelRows rows (r0 is a multiple of kPanelRows: the
// row units of ClaimRows are), each repacked into this thread's scratch and
// multiplied with every token; formats or paths without the kernel use kRowBlock.
void PanelRange(const LinearParams& p, const IsaKernels& k, const uint8_t* xq, int64_t r0,
                int64_t r1) {
  const IsaKernels::PanelFn fn = PanelFor(k, p.w.type);
  if (fn == nullptr) {
    RowBlockRange(p, k, xq, r0, r1);
    return;
  }
  static thread_local std::vector<PanelBlock> scratch;
  const int64_t nb = p.w.cols / BlockElems(p.w.type);
  PanelBlock* pb = Scratch(scratch, PanelScratchBlocks(p.w.type, nb));
  const size_t tok_bytes = static_cast<size_t>(nb) *
                           (UsesActBlock256(p.w.type) ? sizeof(ActBlock256) : sizeof(ActBlock32));
  for (int64_t r = r0; r < r1; r += kPanelRows) {
    const int n = static_cast<int>(std::min<int64_t>(kPanelRows, r1 - r));
    fn(Row(p.w, r), p.w.row_stride_bytes, n, nb, xq, tok_bytes, p.num_tokens, pb, p.y + r,
       p.y_stride, p.bias != nullptr ? p.bias + r : nullptr);
  }
}

void TileSgemmRange(const LinearParams& p, int64_t r0, int64_t r1) {
  static thread_local std::vector<float> tile;
  const int64_t cols = p.w.cols;
  // F32 rows are used in place: one sgemm over the thread's whole slice.
  const int64_t tile_rows = p.w.type == WeightType::kF32 ? r1 - r0 : kTileRows;
  for (int64_t rt = r0; rt < r1; rt += tile_rows) {
    const int64_t n = std::min(tile_rows, r1 - rt);
    const float* wt;
    int64_t ldw;
    if (p.w.type == WeightType::kF32) {
      wt = reinterpret_cast<const float*>(Row(p.w, rt));
      ldw = static_cast<int64_t>(p.w.row_stride_bytes / 4);
    } else {
      float* buf = Scratch(tile, static_cast<size_t>(kTileRows * cols));
      for (int64_t i = 0; i < n; ++i)
        DequantizeWeightRow(p.w.type, Row(p.w, rt + i), cols, buf + i * cols);
      wt = buf;
      ldw = cols;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(p.num_tokens),
                static_cast<int>(n), static_cast<int>(cols), 1.0f, p.x,
                static_cast<int>(p.x_stride), wt, static_cast<int>(ldw), 0.0f, p.y + rt,
                static_cast<int>(p.y_stride));
    if (p.bias != nullptr) {
      for (int64_t t = 0; t < p.num_tokens; ++t)
        for (int64_t i = 0; i < n; ++i) p.y[t * p.y_stride + rt + i] += p.bias[rt + i];
    }
  }
}

// Rows [begin, end) of thread `tid` of `nt`: contiguous, multiples of 16 rows.
void ThreadRows(int64_t rows, int tid, int nt, int64_t* begin, int64_t* end) {
  const int64_t units = (rows + 15) / 16;
  *begin = std::min(rows, units * tid / nt * 16);
  *end = std::min(rows, units * (tid + 1) / nt * 16);
}

// Rows are handed out in units of kRowUnit (a 64-byte line of fp32 outputs, so
// that no two threads write one cache line of y).
constexpr int64_t kRowUnit = 16;
static_assert(kRowUnit % kPanelRows == 0, "kPanel16 needs claims that start at panel boundaries");

// Guided self-scheduling of one member's row units: each claim takes
// max(1, remaining / (2 * nt)) units from a shared counter, so that a thread
// slowed by the machine (a stolen vCPU, a busy sibling) leaves its share to the
// others instead of holding the team at the barrier. Every row is computed the
// same way on any thread: the results do not depend on the split.
bool ClaimRows(std::atomic<int64_t>& next, int64_t rows, int nt, int64_t* begin, int64_t* end) {
  const int64_t units = (rows + kRowUnit - 1) / kRowUnit;
  int64_t cur = next.load(std::memory_order_relaxed);
  int64_t take;
  do {
    if (cur >= units) return false;
    take = std::max<int64_t>(1, (units - cur) / (2 * nt));
  } while (!next.compare_exchange_weak(cur, cur + take, std::memory_order_relaxed));
  *begin = cur * kRowUnit;
  *end = std::min(rows, (cur + take) * kRowUnit);
  return true;
}

}  // namespace

const char* LinearMethodName(LinearMethod m) {
  switch (m) {
    case LinearMethod::kRowDot: return "row_dot";
    case LinearMethod::kTileSgemm: return "tile_sgemm";
    case LinearMethod::kRowBlock: return "row_block";
    case LinearMethod::kRowBlock8: return "row_block8";
    case LinearMethod::kPanel16: return "panel16";
    case LinearMethod::kInterleaved8: return "interleaved8";
    case LinearMethod::kAmxBf16: return "amx_bf16";
  }
  return "?";
}

bool IsQuantized(WeightType t) {
  return t != WeightType::kF32 && t != WeightType::kF16 && t != WeightType::kBF16;
}

LinearMethod ChooseMethod(WeightType type, int64_t num_tokens, int64_t rows, int64_t cols,
                          CpuIsa isa) {
  if (isa == CpuIsa::kAvx512 && AmxHasPanel(type) && num_tokens >= AmxMinTokens(type) &&
      cols % 32 == 0 && AmxBf16Usable())
    return LinearMethod::kAmxBf16;
  if (IsInterleavedRows8(type)) return LinearMethod::kInterleaved8;
  if (IsQuantized(type)) {
    if (isa == CpuIsa::kAvx2 && HasRowBlock8(type) && num_tokens >= kRow8MinTokensAvx2 &&
        rows >= kRow8Rows) {
      return LinearMethod::kRowBlock8;
    }
    if (isa != CpuIsa::kPortable && HasPanel16(type) && num_tokens >= PanelMinTokens(type))
      return LinearMethod::kPanel16;
    if (KQuantRowDots(type, isa) || !HasRowBlockTiles(type)) return LinearMethod::kRowDot;
    return RowDotsFaster(type, num_tokens, rows, cols, isa) ? LinearMethod::kRowDot
                                                            : LinearMethod::kRowBlock;
  }
  const int64_t min_tokens = type == WeightType::kF32 ? kSgemmMinTokensF32 : kSgemmMinTokensHalf;
  return num_tokens >= min_tokens ? LinearMethod::kTileSgemm : LinearMethod::kRowDot;
}

const IsaKernels& KernelsFor(CpuIsa isa) {
#if defined(__x86_64__) && defined(PAGEDSERVE_LINEAR_X86_PATHS)
  if (isa == CpuIsa::kAvx2) return Avx2Kernels();
  if (isa == CpuIsa::kAvx512) return Avx512Kernels();
#endif
  return PortableKernels();
}

IsaKernels::QDotFn QDotFor(const IsaKernels& k, WeightType type) {
  switch (type) {
    case WeightType::kQ4_0: return k.q4_0;
    case WeightType::kQ4_1: return k.q4_1;
    case WeightType::kQ5_0: return k.q5_0;
    case WeightType::kQ5_1: return k.q5_1;
    case WeightType::kQ8_0: return k.q8_0;
    case WeightType::kQ4_K: return k.q4_k;
    case WeightType::kQ5_K: return k.q5_k;
    case WeightType::kQ6_K: return k.q6_k;
    case WeightType::kQ2_K: return k.q2_k;
    case WeightType::kQ3_K: return k.q3_k;
    case WeightType::kIQ4_NL: return k.iq4_nl;
    case WeightType::kIQ4_XS: return k.iq4_xs;
    default: return nullptr;
  }
}

IsaKernels::QTileFn QTileFor(const IsaKernels& k, WeightType type, bool decode) {
  switch (type) {
    case WeightType::kQ4_0: return decode ? k.d4_0 : k.t4_0;
    case WeightType::kQ4_1: return decode ? k.d4_1 : k.t4_1;
    case WeightType::kQ5_0: return decode ? k.d5_0 : k.t5_0;
    case WeightType::kQ5_1: return decode ? k.d5_1 : k.t5_1;
    case WeightType::kQ8_0: return decode ? k.d8_0 : k.t8_0;
    case WeightType::kQ4_K: return decode ? k.d4_k : k.t4_k;
    case WeightType::kQ5_K: return decode ? k.d5_k : k.t5_k;
    case WeightType::kQ6_K: return decode ? k.d6_k : k.t6_k;
    case WeightType::kQ2_K: return decode ? k.d2_k : k.t2_k;
    case WeightType::kQ3_K: return decode ? k.d3_k : k.t3_k;
    default: return nullptr;
  }
}

IsaKernels::QTileFn Row8TileFor(const IsaKernels& k, WeightType type) {
  switch (type) {
    case WeightType::kQ4_0: return k.t8r4_0;
    case WeightType::kQ4_1: return k.t8r4_1;
    case WeightType::kQ5_0: return k.t8r5_0;
    case WeightType::kQ5_1: return k.t8r5_1;
    case WeightType::kQ8_0: return k.t8r8_0;
    default: return nullptr;
  }
}

IsaKernels::PanelFn PanelFor(const IsaKernels& k, WeightType type) {
  switch (type) {
    case WeightType::kQ4_K: return k.p4_k;
    case WeightType::kQ5_K: return k.p5_k;
    case WeightType::kQ6_K: return k.p6_k;
    case WeightType::kQ2_K: return k.p2_k;
    case WeightType::kQ3_K: return k.p3_k;
    case WeightType::kQ4_0: return k.p4_0;
    case WeightType::kQ4_1: return k.p4_1;
    case WeightType::kQ8_0: return k.p8_0;
    default: return nullptr;
  }
}

IsaKernels::FDotFn FDotFor(const IsaKernels& k, WeightType type) {
  switch (type) {
    case WeightType::kF32: return k.f32;
    case WeightType::kF16: return k.f16;
    case WeightType::kBF16: return k.bf16;
    default: return nullptr;
  }
}

namespace {

// One member of a group run: its parameters, method and activation blocks.
struct Member {
  const LinearParams* p;
  LinearMethod method;
  bool quant_acts;
  bool act256;       // ActBlock256 blocks (else ActBlock32)
  AmxActs amx_acts;  // kAmxBf16: the layout of the tokens' bf16 tiles (AmxActsOf)
};

// Runs every member in one parallel region (validated by the caller). The
// activation blocks of the shared input are quantized once per block size.
void RunGroup(std::span<const Member> ms, const IsaKernels& k) {
  static thread_local std::vector<uint8_t> xq_scratch[2];
  const LinearParams& p0 = *ms[0].p;
  const int64_t T = p0.num_tokens;
  // The member whose weight type defines each activation block size (any
  // member of that size: the blocks depend only on x, cols and the size).
  const LinearParams* rep[2] = {nullptr, nullptr};
  uint8_t* xq[2] = {nullptr, nullptr};
  int64_t nb[2] = {0, 0};
  bool uses_sgemm = false, bf16[2] = {false, false};  // per AmxActs layout
  int64_t work = 0;
  for (const Member& m : ms) {
    work += m.p->w.rows * m.p->w.cols * T;
    uses_sgemm |= m.method == LinearMethod::kTileSgemm;
    if (m.method == LinearMethod::kAmxBf16) bf16[static_cast<int>(m.amx_acts)] = true;
    if (!m.quant_acts) continue;
    const int kind = m.act256 ? 1 : 0;
    if (rep[kind] != nullptr) continue;
    rep[kind] = m.p;
    nb[kind] = m.p->w.cols / BlockElems(m.p->w.type);
    const size_t block = m.act256 ? sizeof(ActBlock256) : sizeof(ActBlock32);
    xq[kind] = Scratch(xq_scratch[kind], static_cast<size_t>(T * nb[kind]) * block);
  }
  // The bf16 tiles of the tokens per layout, tokens padded to a multiple of 32
  // (one shape: every member has p0's cols).
  static thread_local std::vector<uint16_t> xa_scratch[2];
  const int64_t t_tiles = (T + 15) / 16;
  uint16_t* xa[2] = {nullptr, nullptr};
  for (int l = 0; l < 2; ++l)
    if (bf16[l])
      xa[l] = Scratch64(xa_scratch[l], static_cast<size_t>((T + 31) / 32 * 32 * p0.w.cols));
  if (uses_sgemm) UseOpenBlasSingleThreaded();
  const int threads = (omp_in_parallel() || work < kMinParallelWork) ? 1 : omp_get_max_threads();
  // A few tokens are quantized before the parallel region (microseconds), which
  // saves decode a barrier; more are quantized by the team (omp for + barrier).
  const bool any_quant = rep[0] != nullptr || rep[1] != nullptr;
  const bool quant_serial = any_quant && T <= kSerialQuantTokens;
  if (quant_serial) {
    for (int kind = 0; kind < 2; ++kind)
      if (rep[kind] != nullptr)
        for (int64_t t = 0; t < T; ++t) QuantizeToken(*rep[kind], k, nb[kind], t, xq[kind]);
  }
  // The next row unit of each member (ClaimRows); no barrier between members.
  std::unique_ptr<std::atomic<int64_t>[]> next_unit(new std::atomic<int64_t>[ms.size()]);
  for (size_t i = 0; i < ms.size(); ++i) next_unit[i].store(0, std::memory_order_relaxed);
#pragma omp parallel num_threads(threads)
  {
    if (any_quant && !quant_serial) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < 2 * T; ++i) {
        const int kind = static_cast<int>(i / T);
        if (rep[kind] != nullptr) QuantizeToken(*rep[kind], k, nb[kind], i % T, xq[kind]);
      }
    }
    if (bf16[0] || bf16[1]) {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < 2 * t_tiles; ++i) {
        const int l = static_cast<int>(i / t_tiles);
        if (bf16[l])
          AmxActsToBf16(static_cast<AmxActs>(l), p0.x, p0.x_stride, T, i % t_tiles, p0.w.cols,
                        xa[l]);
      }
    }
    const int tid = omp_get_thread_num(), nt = omp_get_num_threads();
    for (size_t i = 0; i < ms.size(); ++i) {
      const Member& m = ms[i];
      const uint8_t* acts = m.quant_acts ? xq[m.act256 ? 1 : 0] : nullptr;
      int64_t r0, r1;
      if (m.method == LinearMethod::kTileSgemm) {
        // One sgemm per thread over a static share (sgemm wants many rows).
        ThreadRows(m.p->w.rows, tid, nt, &r0, &r1);
        if (r0 < r1) TileSgemmRange(*m.p, r0, r1);
        continue;
      }
      while (ClaimRows(next_unit[i], m.p->w.rows, nt, &r0, &r1)) {
        if (m.method == LinearMethod::kRowDot) {
          RowDotRange(*m.p, k, acts, r0, r1);
        } else if (m.method == LinearMethod::kRowBlock) {
          RowBlockRange(*m.p, k, acts, r0, r1);
        } else if (m.method == LinearMethod::kPanel16) {
          PanelRange(*m.p, k, acts, r0, r1);
        } else if (m.method == LinearMethod::kInterleaved8) {
          Interleaved8Range(*m.p, k, acts, r0, r1);
        } else if (m.method == LinearMethod::kAmxBf16) {
          AmxRange(*m.p, xa[static_cast<int>(m.amx_acts)], r0, r1);
        } else {
          RowBlock8Range(*m.p, k, acts, r0, r1);
        }
      }
    }
  }
}

Member MakeMember(const LinearParams& p, LinearMethod method) {
  // Q4_0x8 / Q4_1x8 have one method, and no other format has it; kRowBlock8 on a
  // format without its tile is kRowBlock; kRowBlock on a format without
  // activation quantization is the row dots.
  if (method == LinearMethod::kAmxBf16) {  // checked by CheckMethod
    return Member{&p, method, false, false, AmxActsOf(p.w.type)};
  }
  if (IsInterleavedRows8(p.w.type)) {
    return Member{&p, LinearMethod::kInterleaved8, true, false, AmxActs::kTokenRows};
  }
  if (method == LinearMethod::kInterleaved8) method = LinearMethod::kRowBlock;
  if (method == LinearMethod::kRowBlock8 && !HasRowBlock8(p.w.type))
    method = LinearMethod::kRowBlock;
  if (method == LinearMethod::kPanel16 && !HasPanel16(p.w.type)) method = LinearMethod::kRowBlock;
  if (method == LinearMethod::kRowBlock && (!IsQuantized(p.w.type) || !HasRowBlockTiles(p.w.type)))
    method = LinearMethod::kRowDot;
  return Member{&p, method, method != LinearMethod::kTileSgemm && IsQuantized(p.w.type),
                UsesActBlock256(p.w.type), AmxActs::kTokenRows};
}

absl::Status CheckIsa(CpuIsa isa) {
  if (!CpuSupportsIsa(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", CpuIsaName(isa), " path of Linear is not available on this CPU"));
  }
  return absl::OkStatus();
}

// A Q4_0x8 / Q4_1x8 weight needs a path with its kernel (the x86 paths).
absl::Status CheckLayout(const LinearParams& p, CpuIsa isa) {
  const IsaKernels& k = KernelsFor(isa);
  if ((p.w.type == WeightType::kQ4_0x8 && k.i8q4_0 == nullptr) ||
      (p.w.type == WeightType::kQ4_1x8 && k.i8q4_1 == nullptr)) {
    return absl::FailedPreconditionError(absl::StrCat(
        WeightTypeName(p.w.type), " weights (rows interleaved at load) have no kernel on the ",
        CpuIsaName(isa), " path of Linear"));
  }
  return absl::OkStatus();
}

// kAmxBf16 asked of LinearWith: the AVX-512 path on a CPU with AMX, a format
// with an AMX panel (every other method falls back to one the format has).
absl::Status CheckMethod(const LinearParams& p, CpuIsa isa, LinearMethod method) {
  if (method != LinearMethod::kAmxBf16) return absl::OkStatus();
  if (isa != CpuIsa::kAvx512 || !AmxBf16Supported())
    return absl::FailedPreconditionError(absl::StrCat(
        "the amx_bf16 method of Linear needs the avx512 path on a CPU with AMX-TILE, AMX-BF16 and "
        "AVX512-BF16 that the OS lets this process use; asked on the ",
        CpuIsaName(isa), " path, AMX ", AmxBf16Supported() ? "present" : "absent"));
  if (!AmxHasPanel(p.w.type) || p.w.cols % 32 != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("the amx_bf16 method of Linear takes quantized weights other than Q2_K "
                     "and Q3_K with cols % 32 == 0, got ",
                     WeightTypeName(p.w.type), " cols ", p.w.cols));
  return absl::OkStatus();
}

}  // namespace

absl::Status LinearWith(const LinearParams& p, CpuIsa isa, LinearMethod method) {
  absl::Status s = ValidateLinear(p);
  if (!s.ok() || p.num_tokens == 0) return s;
  if (s = CheckIsa(isa); !s.ok()) return s;
  if (s = CheckLayout(p, isa); !s.ok()) return s;
  if (s = CheckMethod(p, isa, method); !s.ok()) return s;
  const Member m = MakeMember(p, method);
  RunGroup(std::span<const Member>(&m, 1), KernelsFor(isa));
  return absl::OkStatus();
}

absl::Status LinearGroupWith(std::span<const LinearParams> ps, CpuIsa isa) {
  if (ps.empty()) return absl::OkStatus();
  const LinearParams& p0 = ps[0];
  for (size_t i = 0; i < ps.size(); ++i) {
    const LinearParams& p = ps[i];
    absl::Status s = ValidateLinear(p);
    if (!s.ok()) return absl::Status(s.code(), absl::StrCat("group member ", i, ": ", s.message()));
    if (p.x != p0.x || p.num_tokens != p0.num_tokens || p.x_stride != p0.x_stride ||
        p.w.cols != p0.w.cols) {
      return absl::InvalidArgumentError(absl::StrCat(
          "group member ", i, ": x, num_tokens, x_stride and w.cols must equal member 0's"));
    }
  }
  if (p0.num_tokens == 0) return absl::OkStatus();
  auto y_bytes = [](const LinearParams& p) {
    return 4 * static_cast<size_t>((p.num_tokens - 1) * p.y_stride + p.w.rows);
  };
  for (size_t i = 0; i < ps.size(); ++i)
    for (size_t j = 0; j < ps.size(); ++j) {
      if (i == j) continue;
      if (i < j && Overlaps(ps[i].y, y_bytes(ps[i]), ps[j].y, y_bytes(ps[j])))
        return absl::InvalidArgumentError(
            absl::StrCat("group members ", i, " and ", j, ": y overlaps"));
      if (ps[j].bias != nullptr &&
          Overlaps(ps[i].y, y_bytes(ps[i]), ps[j].bias, 4 * static_cast<size_t>(ps[j].w.rows)))
        return absl::InvalidArgumentError(
            absl::StrCat("group member ", i, ": y overlaps member ", j, "'s bias"));
    }
  if (absl::Status s = CheckIsa(isa); !s.ok()) return s;
  for (size_t i = 0; i < ps.size(); ++i) {
    if (absl::Status s = CheckLayout(ps[i], isa); !s.ok())
      return absl::Status(s.code(), absl::StrCat("group member ", i, ": ", s.message()));
  }
  std::vector<Member> ms;
  ms.reserve(ps.size());
  for (const LinearParams& p : ps)
    ms.push_back(MakeMember(p, ChooseMethod(p.w.type, p.num_tokens, p.w.rows, p.w.cols, isa)));
  RunGroup(ms, KernelsFor(isa));
  return absl::OkStatus();
}

}  // namespace cpu

absl::Status LinearGroup(std::span<const LinearParams> ps) {
  return cpu::LinearGroupWith(ps, ActiveLinearIsa());
}

bool PrefersInterleavedRows8(const WeightView& w) {
  static const bool enabled = [] {
    const char* e = std::getenv("PAGEDSERVE_CPU_REPACK");
    if (e == nullptr) return true;
    for (const char* off : {"0", "false", "off", "no"})
      if (strcasecmp(e, off) == 0) return false;
    return true;
  }();
  if (!enabled || w.rows % cpu::kRow8Rows != 0) return false;
  const cpu::IsaKernels& k = cpu::KernelsFor(ActiveLinearIsa());
  return ((w.type == WeightType::kQ4_0 && k.i8q4_0 != nullptr) ||
          (w.type == WeightType::kQ4_1 && k.i8q4_1 != nullptr)) &&
         ValidateWeightView(w).ok();
}

absl::Status InterleaveRows8(const WeightView& w, uint8_t* dst) {
  if (w.type != WeightType::kQ4_0 && w.type != WeightType::kQ4_1)
    return absl::InvalidArgumentError(
        absl::StrCat("w.type: InterleaveRows8 takes Q4_0 or Q4_1, got ", WeightTypeName(w.type)));
  if (absl::Status s = ValidateWeightView(w); !s.ok()) return s;
  if (w.rows % cpu::kRow8Rows != 0)
    return absl::InvalidArgumentError(
        absl::StrCat("w.rows must be a multiple of 8 to interleave, got ", w.rows));
  if (dst == nullptr) return absl::InvalidArgumentError("dst is null");
  // Q4_1: d and m (4 bytes) before the 16 code bytes; the group block puts
  // the 8 rows' d, then their m, then the codes (kernels/weight_format.h).
  const bool q4_1 = w.type == WeightType::kQ4_1;
  const int64_t kBlock = q4_1 ? 20 : 18, kGroupBlock = 8 * kBlock, kHead = kBlock - 16;
  const int64_t nb = w.cols / 32;
  const size_t row_bytes = static_cast<size_t>(nb * kBlock);
  const int64_t groups = w.rows / 8;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    uint8_t* out = dst + static_cast<size_t>(g) * 8 * row_bytes;
    for (int64_t b = 0; b < nb; ++b, out += kGroupBlock) {
      for (int i = 0; i < 8; ++i) {
        const uint8_t* src = static_cast<const uint8_t*>(w.data) +
                             static_cast<size_t>(8 * g + i) * w.row_stride_bytes + b * kBlock;
        std::memcpy(out + 2 * i, src, 2);                     // fp16 d
        if (q4_1) std::memcpy(out + 16 + 2 * i, src + 2, 2);  // fp16 m
        for (int c = 0; c < 4; ++c)
          std::memcpy(out + 8 * kHead + 32 * c + 4 * i, src + kHead + 4 * c, 4);
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Linear(const LinearParams& p) {
  const CpuIsa isa = ActiveLinearIsa();
  return cpu::LinearWith(p, isa,
                         cpu::ChooseMethod(p.w.type, p.num_tokens, p.w.rows, p.w.cols, isa));
}

}  // namespace pagedserve::kernels
