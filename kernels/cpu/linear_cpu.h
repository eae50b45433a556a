// Internals of the CPU Linear (kernels/linear.h): the per-ISA kernel tables, the
// activation quantizers, the weight-row dequantizer and the method choice.
// Exposed for tests and benchmarks; the forward pass uses kernels/linear.h.
#ifndef PAGEDSERVE_KERNELS_CPU_LINEAR_CPU_H_
#define PAGEDSERVE_KERNELS_CPU_LINEAR_CPU_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/quant_blocks.h"
#include "kernels/linear.h"
#include "kernels/weight_format.h"

namespace pagedserve::kernels::cpu {

// How Linear computes one call (chosen by ChooseMethod, the one dispatch place).
enum class LinearMethod : uint8_t {
  kRowDot,        // per weight row, a dot product with every token (GEMV and small GEMM)
  kTileSgemm,     // tiles of rows converted to fp32 (F32: used in place), OpenBLAS sgemm
  kRowBlock,      // quantized formats: register-blocked kBlockRows x kBlockTokens tiles
                  // (IsaKernels::QTileFn); remainders use the row dots
  kRowBlock8,     // Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: kRow8Rows rows x kRow8Tokens tokens with the rows
                  // in the vector lanes (IsaKernels::t8r*); rows left over use kRowBlock,
                  // tokens left over the row dots; other formats use kRowBlock
  kPanel16,       // Q2_K .. Q6_K on the x86 paths: panels of kPanelRows weight rows repacked
                  // into a PanelBlock layout (rows in the vector lanes), then a register-tiled
                  // GEMM over all tokens (IsaKernels::p*); other formats and the portable path
                  // use kRowBlock
  kInterleaved8,  // Q4_0x8 / Q4_1x8 (kernels/weight_format.h), the only method of
                  // those layouts: each group of 8 interleaved rows against kRow8Tokens
                  // tokens at a time (IsaKernels::i8q4_*; on AVX-512 16 rows x 16
                  // tokens, i16q4_*); x86 paths only
  kAmxBf16,       // AMX tiles over bf16 panels (AmxBf16Usable, AmxHasPanel; "AMX" below):
                  // the AVX-512 path's many-token GEMM where the CPU has AMX
};
const char* LinearMethodName(LinearMethod m);

// The method Linear uses for `num_tokens` tokens over a weight of this format
// on the `isa` path (the crossovers differ between paths). Safe on any
// arguments (called before validation).
LinearMethod ChooseMethod(WeightType type, int64_t num_tokens, int64_t rows, int64_t cols,
                          CpuIsa isa);

// Linear with a given ISA path and method (validates like Linear; FailedPrecondition
// when the CPU lacks `isa`).
absl::Status LinearWith(const LinearParams& p, CpuIsa isa, LinearMethod method);
// LinearGroup (kernels/linear.h) on a given ISA path (methods from ChooseMethod).
absl::Status LinearGroupWith(std::span<const LinearParams> ps, CpuIsa isa);

// True for the formats whose activations are quantized (every one but F32, F16, BF16).
bool IsQuantized(WeightType type);
// Activation block used with `type`: 32 (ActBlock32) or 256 (ActBlock256).
inline bool UsesActBlock256(WeightType t) {
  return t == WeightType::kQ2_K || t == WeightType::kQ3_K || t == WeightType::kQ4_K ||
         t == WeightType::kQ5_K || t == WeightType::kQ6_K || t == WeightType::kIQ4_XS;
}
// True for the formats with register-blocked tiles (IsaKernels::t*, d*): every
// quantized format except IQ4_NL and IQ4_XS, which use the row dots (1 row x up
// to kMaxTokens tokens) wherever kRowBlock would be used.
inline bool HasRowBlockTiles(WeightType t) {
  return t != WeightType::kIQ4_NL && t != WeightType::kIQ4_XS;
}

// Quantizes n activations (n a multiple of 32 / 256) into n/32 or n/256 blocks.
// The portable reference: d = max|x| / 127, q = lrintf(x * (127 / max|x|))
// clamped to [-127, 127] (round to nearest, ties to even, in the default
// rounding mode). Every ISA's IsaKernels::quant32/quant256 produces blocks
// bit-identical to these for finite input (tests/kernels/linear_test.cc); for
// non-finite input the codes are unspecified in both.
void QuantizeActs32(const float* x, int64_t n, ActBlock32* out);
void QuantizeActs256(const float* x, int64_t n, ActBlock256* out);

// Converts one weight row of `cols` elements (RowBytes(type, cols) bytes at
// `row`) to fp32. Portable; the reference for every kernel.
void DequantizeWeightRow(WeightType type, const uint8_t* row, int64_t cols, float* dst);

// Tokens one kernel call multiplies with a weight row (the row is loaded and
// unpacked once for all of them).
inline constexpr int kMaxTokens = 4;
// Tile of the register-blocked method (kRowBlock): weight rows x tokens whose
// kBlockRows * kBlockTokens fp32 accumulators stay in registers for a whole row;
// each weight block is unpacked once per kBlockTokens tokens and each token's
// per-block terms (scale, sums) computed once per kBlockRows rows.
inline constexpr int kBlockRows = 2;
inline constexpr int kBlockTokens = 4;
// Tile of kRowBlock for fewer than kBlockTokens tokens (decode): kDecodeRows
// weight rows x 1 token, one call per token.
inline constexpr int kDecodeRows = 4;
// Tile of kRowBlock8: kRow8Rows weight rows x kRow8Tokens tokens. Per weight
// block the 8 rows' codes are unpacked and transposed so that 32-bit lane i of
// vector j holds row i's elements [4j, 4j + 4); each token's 4 activation codes
// [4j, 4j + 4) are broadcast and multiplied with vector j, so the integer sums
// of the 8 rows come out in the 8 lanes (no horizontal sums), and the 8 rows'
// scales are gathered once per block for all kRow8Tokens tokens.
inline constexpr int kRow8Rows = 8;
inline constexpr int kRow8Tokens = 8;
// True for the formats with kRowBlock8 kernels (IsaKernels::t8r*).
inline bool HasRowBlock8(WeightType t) {
  return t == WeightType::kQ4_0 || t == WeightType::kQ4_1 || t == WeightType::kQ5_0 ||
         t == WeightType::kQ5_1 || t == WeightType::kQ8_0;
}

// kPanel16 (the many-token GEMM of the K-quants Q2_K .. Q6_K). A thread repacks kPanelRows
// consecutive weight rows at a time, on the fly, into per-thread scratch (the
// stored weight is never copied as a whole: one copy of the weights stays in
// memory, the mmap'd file), then multiplies the repacked panel with every
// token. The layout puts the panel's rows in the vector lanes, so one
// broadcast of 4 activation codes feeds 16 rows (AVX-512: one vpdpbusd; AVX2:
// pmaddubsw on 8 rows, twice), no horizontal sums are needed and each
// token's 16 outputs are one contiguous store; the sub-block scales and the
// mins / -32 offsets are applied in registers with integer multiplies, and the
// super-block scales in fp32 once per super-block and token. The idea of
// llama.cpp's repacked x86 GEMMs (block_q4_Kx8 and friends, ggml-cpu/repack.cpp),
// written independently, with the codes unpacked to one byte each and the
// rows 16 wide; repacked per call instead of at load.
inline constexpr int kPanelRows = 16;
// One 256-element super-block of a panel of kPanelRows rows (rows past the
// weight's last row are zero). For Q2_K .. Q6_K row i, super-block b:
//   codes[c][i][0..4): codes of elements 4c..4c+3, unsigned (Q2_K 0..3, Q3_K
//                      0..7, Q4_K 0..15, Q5_K 0..31, Q6_K 0..63, i.e. before
//                      Q3_K's -4 and Q6_K's -32 offset);
//   scales[g][i]: the scale s of elements 16g..16g+15 as the int16 pair (s, s)
//                 (Q4_K/Q5_K: the 6-bit scale of sub-block g / 2; Q6_K: the int8
//                 scale g; Q2_K: the 4-bit scale g; Q3_K: the 6-bit scale g - 32);
//   mins[k][i]: int16 pair (lo, hi) multiplied with the activation sums of
//               elements 32k..32k+15 (lo) and 32k+16..32k+31 (hi): Q4_K/Q5_K
//               (m_k, m_k) with m_k the 6-bit min of sub-block k; Q2_K (m_2k,
//               m_2k+1), the 4-bit mins; Q6_K (32 s_2k, 32 s_2k+1) and Q3_K
//               (4 s_2k, 4 s_2k+1), the offsets;
//   d[i], dmin[i]: fp32 super-block scales (Q3_K, Q6_K: dmin = d), so that
//     row . x = sum_b dx_b * (d * sum_g s_g * (codes_g . xq_g) - dmin * sum_k mins_k . bsums_k)
//   with xq, dx, bsums the token's ActBlock256 blocks.
struct alignas(64) PanelBlock {
  uint8_t codes[64][kPanelRows][4];
  uint32_t scales[16][kPanelRows];
  uint32_t mins[8][kPanelRows];
  float d[kPanelRows];
  float dmin[kPanelRows];
};
static_assert(sizeof(PanelBlock) == 5760);
// One 32-element block of a panel of Q4_0, Q4_1 or Q8_0 rows (issue 34; Q4_1
// issue 33; rows past the weight's last row are zero). codes[c][i][0..4):
// elements 4c..4c+3 of row i as bytes: Q4_0 and Q4_1 the codes 0..15 (value
// d (q - 8), resp. d q + m); Q8_0 on the AVX-512 path the int8 code + 128
// (vpdpbusd's unsigned operand), on the AVX2 path the int8 code itself
// (pmaddubsw takes |w| and x with w's sign); d[i]: fp32 block scale; m[i]:
// Q4_1's fp32 block minimum (unused by the others).
// row . x = sum_b dx_b (d_b (codes_b . xq_b - off sum_b) + m_b sum_b) with
// off = 8 (Q4_0), 128 (Q8_0 on AVX-512) or 0 (Q4_1, Q8_0 on AVX2) and m_b = 0
// except for Q4_1. The PanelFn of these formats uses its PanelBlock scratch
// as PanelBlock32 storage (PanelScratchBlocks).
struct alignas(64) PanelBlock32 {
  uint8_t codes[8][kPanelRows][4];
  float d[kPanelRows];
  float m[kPanelRows];
};
static_assert(sizeof(PanelBlock32) == 640);
// True for the formats with kPanel16 kernels (the K-quants Q2_K .. Q6_K, and
// Q4_0, Q4_1 and Q8_0 over PanelBlock32).
inline bool HasPanel16(WeightType t) {
  return (UsesActBlock256(t) && t != WeightType::kIQ4_XS) || t == WeightType::kQ4_0 ||
         t == WeightType::kQ4_1 || t == WeightType::kQ8_0;
}
// PanelBlock elements of scratch that a panel of `nb` blocks of `t` needs.
inline size_t PanelScratchBlocks(WeightType t, int64_t nb) {
  if (t == WeightType::kQ4_0 || t == WeightType::kQ4_1 || t == WeightType::kQ8_0)
    return (static_cast<size_t>(nb) * sizeof(PanelBlock32) + sizeof(PanelBlock) - 1) /
           sizeof(PanelBlock);
  return static_cast<size_t>(nb);
}

// The kernels of one instruction-set path.
//  QDotFn: dot products of one quantized weight row (nb blocks at w) with
//          ntok (1..kMaxTokens) tokens of activation blocks (ActBlock32 or
//          ActBlock256 per UsesActBlock256); token j's blocks start at
//          x + j * x_token_bytes; out[j] = its dot product.
//  FDotFn: the same for an F32/F16/BF16 row of n elements and fp32 tokens
//          x + j * x_stride.
//  QTileFn: t*: kBlockRows weight rows (row i at w + i * w_row_bytes) times
//          kBlockTokens tokens (as QDotFn); out[i * kBlockTokens + j] = dot of
//          row i with token j. d*: the same for kDecodeRows rows x 1 token
//          (out[i]). Same arithmetic contract as QDotFn (integer block sums,
//          fp32 scaling; the order of the fp32 sums differs).
//  t8r*: the kRowBlock8 tile (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0): kRow8Rows weight rows (row i
//          at w + i * w_row_bytes) times kRow8Tokens tokens (as QDotFn);
//          out[j * kRow8Rows + i] = dot of row i with token j (token-major).
//          Same arithmetic contract as QDotFn: the same integer block sums
//          (exact), fp32 scaling per block; only the order of the fp32 sums
//          differs. The AVX-512 table uses the AVX2 kernels.
//  PanelFn: p*: kPanel16 (Q2_K .. Q6_K; Q4_0, Q4_1 and Q8_0 over PanelBlock32,
//          nb 32-element blocks): repacks weight rows [0, nrows)
//          (nrows <= kPanelRows; row i at w + i * w_row_bytes, nb super-blocks)
//          into scratch[0, nb) and multiplies them with ntok tokens (as QDotFn):
//          y[j * y_stride + i] = dot of row i with token j (+ bias[i] when bias
//          is non-null), for i < nrows and j < ntok; nothing else of y is
//          written. Same arithmetic contract as QDotFn (exact integer sums per
//          super-block, fp32 scaling). nullptr in the portable table.
//  QuantFn: the activation quantizers (QuantizeActs32 / QuantizeActs256 above),
//          vectorized on the x86 paths, bit-identical to the portable ones.
struct IsaKernels {
  using QDotFn = void (*)(const uint8_t* w, const uint8_t* x, size_t x_token_bytes, int64_t nb,
                          int ntok, float* out);
  using FDotFn = void (*)(const uint8_t* w, const float* x, int64_t x_stride, int64_t n, int ntok,
                          float* out);
  using QTileFn = void (*)(const uint8_t* w, size_t w_row_bytes, const uint8_t* x,
                           size_t x_token_bytes, int64_t nb, float* out);
  using Quant32Fn = void (*)(const float* x, int64_t n, ActBlock32* out);
  using Quant256Fn = void (*)(const float* x, int64_t n, ActBlock256* out);
  using PanelFn = void (*)(const uint8_t* w, size_t w_row_bytes, int nrows, int64_t nb,
                           const uint8_t* x, size_t x_token_bytes, int64_t ntok,
                           PanelBlock* scratch, float* y, int64_t y_stride, const float* bias);
  QDotFn q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k;
  FDotFn f32, f16, bf16;
  QTileFn t4_0, t4_1, t5_0, t5_1, t8_0, t4_k, t5_k, t6_k;
  QTileFn d4_0, d4_1, d5_0, d5_1, d8_0, d4_k, d5_k, d6_k;
  Quant32Fn quant32;
  Quant256Fn quant256;
  QTileFn t8r4_0, t8r4_1, t8r5_0, t8r5_1, t8r8_0;
  PanelFn p4_k, p5_k, p6_k;
  // Q2_K, Q3_K (row dots, tiles, panels; portable: no panels) and IQ4_NL,
  // IQ4_XS (row dots only: HasRowBlockTiles, HasPanel16).
  QDotFn q2_k, q3_k, iq4_nl, iq4_xs;
  QTileFn t2_k, t3_k, d2_k, d3_k;
  PanelFn p2_k, p3_k;
  PanelFn p4_0, p8_0;  // issue 34; nullptr in the portable table
  PanelFn p4_1;        // issue 33; nullptr in the portable table
  // Q4_0x8 (issue 34): the QDotFn contract with w one group of kRow8Rows
  // interleaved rows (nb blocks of 8 * 18 bytes) and ntok 1..kRow8Tokens tokens;
  // out[j * kRow8Rows + i] = dot of row i with token j. nullptr in the
  // portable table (Linear refuses Q4_0x8 there).
  QDotFn i8q4_0;
  // Q4_0x8 on the AVX-512 path, 16 rows at a time (two groups in one zmm):
  // the PanelFn contract with w the first group's start, wb the row bytes,
  // nrows = kPanelRows (both groups valid) and the scratch unused. nullptr
  // in the AVX2 and portable tables.
  PanelFn i16q4_0;
  // The same two for Q4_1x8 (issue 34).
  QDotFn i8q4_1;
  PanelFn i16q4_1;
};
// Per-caller scratch: v grown to hold n elements after a 64-byte boundary (AMX
// tile loads and stores of one cache line per row); returns that boundary.
// Pointers from earlier calls are invalid once v grows.
template <typename T>
T* Scratch64(std::vector<T>& v, size_t n) {
  const size_t slack = 64 / sizeof(T);
  if (v.size() < n + slack) v.resize(n + slack);
  const uintptr_t a = reinterpret_cast<uintptr_t>(v.data());
  return v.data() + ((64 - a % 64) % 64) / sizeof(T);
}

// ---- AMX (issue 34): kAmxBf16 ----
// On CPUs with Intel AMX (AMX-TILE, AMX-BF16) and AVX512-BF16, the many-token
// GEMM of the formats with an AMX panel (AmxHasPanel) runs on the tile unit: a
// thread dequantizes kAmxPanelRows weight rows at a time to bf16 in its own
// scratch (the stored weight is never copied as a whole), in the order TDPBF16PS
// takes them, and multiplies the panel with every token's bf16 activations,
// accumulating in fp32 tiles. Arithmetic contract: each weight element and each
// activation is rounded once to bf16 (round to nearest even; relative error
// <= 2^-9 each), the products are summed in fp32 in 32-element steps; so
// |y - exact| <= (2^-8 + 2^-9 + cols 2^-24) sum_k |x_k w_k|, and a token's outputs do
// not depend on the tokens beside it (each output is the same function of its
// token's activations at every token count). The weight tiles follow Intel's
// AMX programming model (Intel 64 and IA-32 Architectures Optimization
// Reference Manual, "Intel AMX"); the bf16 weight-only dequantization is what
// Intel's IPEX/xFasterTransformer do for int4 weights.
inline constexpr int kAmxPanelRows = 32;
// True when this CPU and OS can run the AMX kernels: CPUID says AMX-TILE,
// AMX-BF16 and AVX512-BF16, XCR0 enables the tile state, and Linux granted
// the process the tile data (arch_prctl ARCH_REQ_XCOMP_PERM, asked once here).
// Thread-safe; computed once.
bool AmxBf16Supported();
// AmxBf16Supported() unless the environment variable PAGEDSERVE_CPU_AMX is 0,
// false, off or no (any case; read once) or SetAmxBf16Enabled(false) was
// called last: whether ChooseMethod picks kAmxBf16. Thread-safe.
bool AmxBf16Usable();
void SetAmxBf16Enabled(bool on);
// True for the formats with an AMX panel: Q4_0x8 and Q4_1x8 (kernels/weight_format.h),
// and the row-major Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q4_K, Q5_K, Q6_K and
// IQ4_XS (every quantized format but Q2_K and Q3_K).
bool AmxHasPanel(WeightType type);
// Which operand of TDPBF16PS holds the tokens (AmxActsOf):
//  kTokenRows (Q4_0x8, Q4_1x8): the tokens are the rows of the A tiles, the
//    weights the B tiles, dequantized from the 8-row interleaved blocks
//    straight into the pair (VNNI) order;
//  kTokenColumns (the row-major formats): each weight row's dequantized step is
//    one row of an A tile (no transposition of the weights); the tokens are
//    the columns of the B tiles, and the output tiles are transposed when
//    stored.
enum class AmxActs : uint8_t { kTokenRows, kTokenColumns };
AmxActs AmxActsOf(WeightType type);
// The 16 tokens [16 tile, 16 tile + 16) of x (fp32, token t at x + t * x_stride,
// cols % 32 == 0) to AMX activation tiles in xa (bf16, round to nearest even;
// tokens t >= T written as zeros), per `layout`:
//  kTokenRows: token t's elements 32 s .. 32 s + 31 at xa + (t / 16) * cols * 16
//    + s * 512 + (t % 16) * 32 (per 16 tokens one 16 x 32 tile per step s);
//    xa holds RoundUp(T, 16) * cols elements;
//  kTokenColumns: token t's elements 32 s + 2 kk and 32 s + 2 kk + 1 at xa +
//    (t / 32) * cols * 32 + s * 1024 + ((t / 16) % 2) * 512 + kk * 32 + (t % 16) * 2
//    (per 32 tokens and step two B tiles of 16 pairs x 16 tokens); xa holds
//    RoundUp(T, 32) * cols elements.
// Threads may convert different tiles at once. Needs AmxBf16Supported().
void AmxActsToBf16(AmxActs layout, const float* x, int64_t x_stride, int64_t T, int64_t tile,
                   int64_t cols, uint16_t* xa);
// Panels of kAmxPanelRows rows dequantized together (one group), whose
// accumulators persist across the k-chunks of AmxLinearRows.
inline constexpr int kAmxGroupPanels = 4;
// y[t * y_stride + i] = row i of w . token t (+ bias[i] when bias is non-null)
// for t < T and i < nrows (nothing else of y is written), with `w` an
// AmxHasPanel format (row i at w + i * w_row_bytes; Q4_0x8 / Q4_1x8 nrows % 8
// == 0; cols % 32 == 0) and xa the tokens as AmxActsToBf16 writes them in the
// layout AmxActsOf(type) for every tile of [0, RoundUp(T, 16)) (tokens past T
// are read and do not affect the result). Blocking: per group of
// kAmxGroupPanels x kAmxPanelRows rows, per chunk of `chunk_k` elements (a
// multiple of 32; the weights' and tokens' chunks stay in L2), each panel's chunk is dequantized
// once into per-thread scratch (two tiles of 512 bf16 per 32-element step, rows 0..15 and 16..31:
// kTokenRows B tiles, row kk holding the pairs (2 kk, 2 kk + 1) of its 16 rows; kTokenColumns A
// tiles, row r holding the step's 32 elements of weight row r) and multiplied with every 32 tokens,
// fp32 accumulators kept per thread between chunks (T x 128 floats). Configures the calling
// thread's tiles and releases them before returning. Needs AmxBf16Supported().
void AmxLinearRows(WeightType type, const uint8_t* w, size_t w_row_bytes, int64_t nrows,
                   int64_t cols, const uint16_t* xa, int64_t T, float* y, int64_t y_stride,
                   const float* bias, int64_t chunk_k);

const IsaKernels& PortableKernels();
#if defined(__x86_64__)
const IsaKernels& Avx2Kernels();    // kernels/cpu/linear_avx2.cc
const IsaKernels& Avx512Kernels();  // kernels/cpu/linear_avx512.cc
#endif
// The table of `isa` (the portable one on non-x86 builds).
const IsaKernels& KernelsFor(CpuIsa isa);
IsaKernels::QDotFn QDotFor(const IsaKernels& k, WeightType type);
IsaKernels::FDotFn FDotFor(const IsaKernels& k, WeightType type);
// The kBlockRows x kBlockTokens tile (decode = false) or the kDecodeRows x 1 tile.
IsaKernels::QTileFn QTileFor(const IsaKernels& k, WeightType type, bool decode = false);
// The kRowBlock8 tile of `type`; nullptr for formats without one (HasRowBlock8).
IsaKernels::QTileFn Row8TileFor(const IsaKernels& k, WeightType type);
// The kPanel16 kernel of `type`; nullptr for formats or paths without one.
IsaKernels::PanelFn PanelFor(const IsaKernels& k, WeightType type);

}  // namespace pagedserve::kernels::cpu

#endif  // PAGEDSERVE_KERNELS_CPU_LINEAR_CPU_H_
