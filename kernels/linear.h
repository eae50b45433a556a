// Linear layer over a weight in its stored format: y = x W^T (+ bias), fp32 in and out.
//
//   y[t, r] = sum_c x[t, c] * W[r, c] (+ bias[r])   for t < num_tokens, r < w.rows
//
// CPU implementation (kernels/cpu/linear.cc). How each format is computed:
//  - F32: fewer than 24 tokens: fp32 dot products; more: OpenBLAS sgemm on each
//    thread's slice of rows.
//  - F16 / BF16: fewer than 128 tokens: converted to fp32 in registers (F16C; BF16
//    by a 16-bit shift, which is exact) and fp32 FMA dot products; more: tiles of
//    rows converted to fp32 and multiplied with sgemm.
//  - Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS:
//    the activations are quantized
//    on the fly to 8 bits per element with one fp32 scale per block of the weight's
//    format (32 elements, like ggml's Q8_0/Q8_1, for the legacy formats; 256 with
//    per-16 sums, like ggml's Q8_K, for the K-quants), the weight's integer codes
//    are multiplied with them in integer arithmetic and block and sub-block scales
//    are applied in fp32 (the method of llama.cpp's ggml-quants.c vec_dot_*;
//    this is an independent implementation), in register-blocked tiles: from
//    4 tokens, 2 weight rows x 4 tokens whose 8 fp32 accumulators stay in
//    registers for the whole row (each weight block unpacked once per 4
//    tokens, each activation block's scale and sums used for 2 rows; the
//    offset/min terms in vectors); below 4 tokens, 4 rows x 1 token per token
//    on weights up to 4 MiB. Tokens and rows left over, and the shapes where
//    they measured faster (kernels/cpu/linear.cc RowDotsFaster: below 4 tokens
//    on larger weights, which stream faster one row at a time, and for Q8_0 on
//    the x86 paths at any size), use row dots
//    (each weight row unpacked once for up to 4 tokens). On the AVX2 path,
//    Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 from 8 tokens use row-interleaved tiles of 8 rows x
//    8 tokens instead (kernels/cpu/linear_cpu.h kRowBlock8; the idea of
//    llama.cpp's repacked 8-row AVX2 GEMMs, written independently and done on
//    the fly, without changing the stored weight layout): per weight block the
//    8 rows' codes are transposed in registers so that each vector lane is one
//    output row, each token's activation codes are broadcast, and the 8 rows'
//    integer block sums come out in the 8 lanes without horizontal sums; the
//    same activation blocks and exact integer block sums as the other
//    methods, only the order of the fp32 sums differs (the bound below holds
//    unchanged). Rows and tokens left over use the 2 x 4 tiles. Q4_K/Q5_K/Q6_K
//    below 8 tokens use the row dots on both x86 paths (measured as fast as or
//    faster than both tiles there, with the weight read from memory as in a
//    model's decode; the K-quant row dots unpack the sub-block scales and
//    mins in vectors, apply the mins and Q6_K's -32 offset with one pmaddwd
//    over the activation sub-block sums and convert the integer sums to fp32
//    once per super-block and token). From 8 tokens, on both x86 paths, the
//    K-quants use a GEMM over 16-row panels (kernels/cpu/linear_cpu.h
//    kPanel16, PanelBlock; the idea of llama.cpp's repacked x86 GEMMs,
//    written independently): each thread repacks 16 weight rows at a time,
//    on the fly, into per-thread scratch with the rows in the vector lanes
//    and the codes one byte each, then multiplies the panel with every token
//    (AVX-512: one vpdpbusd per 4 codes x 16 rows with a broadcast of the
//    token's 4 codes, sub-block scales by vpmulld and the mins by vpdpwssd
//    in registers; AVX2: pmaddubsw/pmaddwd on 8 rows at a time). The stored
//    weight is not copied: one copy of the weights stays in memory.
//    Q2_K and Q3_K take the K-quant paths above (row dots, tiles and
//    kPanel16, their 16-element scale groups handled as Q6_K's); IQ4_NL
//    and IQ4_XS (ggml's 16-entry non-linear codebook, looked up with one
//    pshufb per 32 codes, |w| times x with w's sign in pmaddubsw) use the
//    row dots (1 row x up to 4 tokens) at every token count. Q4_0, Q4_1
//    and Q8_0 use 16-row panels too (PanelBlock32: one vpdpbusd per 4 codes
//    x 16 rows on AVX-512, pmaddubsw on AVX2; issues 34 and 33) from 2 tokens
//    (Q8_0: 3), the sizes of speculative verification; on AVX2 only below
//    8 tokens, where the 8-row tiles take over (measured faster there).
//    The activation quantizer is vectorized on the x86
//    paths and writes blocks bit-identical to the portable one.
//  - Q4_0x8 / Q4_1x8 (Q4_0 / Q4_1 with 8 rows interleaved at load,
//    InterleaveRows8 below): groups of 8 rows x up to 8 tokens with the rows
//    in the vector lanes, on AVX-512 from 3 tokens 16 rows (two groups in one
//    zmm) x up to 16 tokens, at every token count (x86 paths only; the
//    portable path refuses them). On a CPU with Intel AMX (AMX-TILE,
//    AMX-BF16, AVX512-BF16; detected at run time, the tile state requested
//    from Linux once), the AVX-512 path multiplies Q4_0x8 / Q4_1x8 weights
//    with 32 or more tokens, and every other quantized format but Q2_K and
//    Q3_K with 16 or more, on the AMX tiles instead (issue 34; kernels/cpu/
//    linear_cpu.h "AMX"): 32 weight rows at a time dequantized to bf16 in
//    per-thread scratch, the activations rounded to bf16 once per call,
//    TDPBF16PS with fp32 accumulation. PAGEDSERVE_CPU_AMX=0 (false, off,
//    no) turns the tiles off.
//    kernels/cpu/linear.cc chooses the method per shape in one place.
// Accuracy: F32/F16/BF16 weights are exact up to fp32 rounding of the sums. For
// the quantized formats (whose activations are quantized by every method that
// ChooseMethod picks; LinearWith can force the fp32 sgemm method, kTileSgemm),
// each activation x is replaced by d * round(x / d) with d =
// max|x over its block| / 127, so |x - x'| <= d / 2 and
//   |y - y_exact| <= sum_blocks (d_b / 2) * sum_{c in b} |W[r, c]| + fp32 rounding,
// where y_exact uses the dequantized weights (tests/kernels/linear_test.cc checks
// exactly this bound). The AMX method rounds each activation and each
// dequantized weight to bf16 instead: |y - y_exact| <= (2^-8 + 2^-9 + cols
// 2^-24) sum_c |W[r, c] x_c| (checked too); a token's outputs do not depend
// on the other tokens of the call on any method, but a call on AMX (16 or 32
// tokens and more, per format) and one of fewer tokens on the integer kernels
// round differently.
//
// Instruction sets: a portable C++ path, an AVX2 path (AVX2+FMA+F16C:
// pmaddubsw/pmaddwd integer dots, 256-bit FMA) and an AVX-512 path
// (AVX512F/BW/VL + VNNI: vpdpbusd on 256-bit vectors for the quantized formats,
// 512-bit FMA for F32/F16/BF16), chosen at run time from CPUID; -march is never
// raised. AVX512-BF16 (vdpbf16ps) is not used for F16/BF16 weights: it would
// also round the activations to bf16, the shift conversion is exact, and
// decode is bound by memory bandwidth; its conversions serve the AMX method. The environment
// variable PAGEDSERVE_CPU_ISA (portable | avx2 | avx512), read once at the first call, or
// SetLinearIsa forces a path; an unknown value, or one this CPU cannot run, is ignored. The integer
// dot products use x86 intrinsics in files compiled with
// `#pragma GCC target` (kernels/cpu/linear_avx2.cc, linear_avx512.cc) rather than
// Highway: Debian's Highway 1.0.3 has no u8 x i8 multiply-add
// (SatWidenMulPairwiseAdd came in 1.1, SumOfMulQuadAccumulate in 1.2), which is
// the inner loop of every quantized format.
//
// Threads: Linear splits the output rows over the OpenMP thread pool (the one
// pool of the forward pass; omp_get_max_threads() threads) by a variant of
// guided self-scheduling (Polychronopoulos & Kuck 1987, which claims
// remaining / threads): the threads claim runs of 16-row units from a shared
// atomic counter, each claim max(1, remaining / (2 * threads)) units, so that a thread slowed by
// the machine (a stolen vCPU) does not hold the others at the barrier; the fp32/fp16/bf16 sgemm
// method keeps one contiguous slice per thread (sgemm wants many rows). Each row is computed the
// same way on any thread: results do not depend on the split. Called from inside an active OpenMP
// parallel region, or for tiny calls (rows * cols * tokens < 32768), it runs on the calling thread
// only. The first call that uses OpenBLAS sets OpenBLAS to one thread (openblas_set_num_threads),
// so that its own workers never compete with OpenMP's: all parallelism comes
// from OpenMP. Linear is safe to call concurrently from several threads as long
// as their outputs y are distinct (scratch memory is per thread); the weight,
// x and bias are only read.
#ifndef PAGEDSERVE_KERNELS_LINEAR_H_
#define PAGEDSERVE_KERNELS_LINEAR_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "kernels/weight_format.h"

namespace pagedserve::kernels {

struct LinearParams {
  const float* x = nullptr;     // [num_tokens, x_stride], the first w.cols of each row used
  int64_t num_tokens = 0;       // >= 0; 0 is a no-op
  int64_t x_stride = 0;         // elements between tokens of x, >= w.cols
  WeightView w;                 // [rows = out_features, cols = in_features]
  const float* bias = nullptr;  // nullable; [w.rows]
  float* y = nullptr;           // [num_tokens, y_stride], the first w.rows of each row written
  int64_t y_stride = 0;         // elements between tokens of y, >= w.rows
};

// Computes y = x W^T (+ bias) as described above. InvalidArgument naming the
// field when: the weight view is invalid (ValidateWeightView), num_tokens < 0,
// x or y is null (with num_tokens > 0), x_stride < w.cols, y_stride < w.rows, or
// y overlaps x or bias. Writes nothing on error.
absl::Status Linear(const LinearParams& p);

// Several Linear calls over one input, in one parallel region: ps[i] as
// Linear(ps[i]) for every i, with bit-identical results (each member uses the
// method, kernels and activation blocks Linear would choose for it alone), but
// one fork/join of the thread pool instead of ps.size(), and the input's
// 8-bit activation blocks quantized once per block size (32 or 256) instead
// of once per quantized member. Meant for the projections that read the same
// normalized hidden states (q/k/v, gate/up) in decode, where the per-call
// fork/join costs as much as a small GEMV. The members' rows are claimed as
// in Linear, member after member, with no barrier between members.
// Requirements: every member valid for Linear, and all members with the same
// x, num_tokens, x_stride and w.cols (a shared input); no member's y may
// overlap another member's y, x or bias. InvalidArgument naming the member
// otherwise; writes nothing on error. An empty span is a no-op.
absl::Status LinearGroup(std::span<const LinearParams> ps);

// Load-time repack of Q4_0 and Q4_1 weights into the interleaved layouts
// Q4_0x8 / Q4_1x8 (kernels/weight_format.h), which the x86 paths run with one
// 256-bit load per 4 codes of 8 rows, one sequential stream per 8 rows and no
// per-call transposition (issue 34: batch-1 decode of these formats was bound
// by the row dots' per-block work, not by memory). The repacked bytes replace
// the stored ones: same size, one copy of the weight in memory.
//
// True when Linear on the active path runs the interleaved layout of w.type
// (Q4_0 and Q4_1 on the x86 paths) and `w` is a valid view with rows % 8 == 0,
// i.e. when a caller that owns the weight for good should repack it; always
// false when the environment variable PAGEDSERVE_CPU_REPACK is 0, false, off
// or no (any case; read once: keeps the weights as the file stores them, in
// the shared page cache; llama.cpp's --no-repack; any other value leaves the
// repack on). Reads no weight bytes.
bool PrefersInterleavedRows8(const WeightView& w);
// Writes `w` (a valid Q4_0 or Q4_1 view, rows % 8 == 0) in its interleaved
// layout into dst[0, rows * RowBytes(w.type, cols)); the result's view is
// {InterleavedRows8Of(w.type), rows, cols, dst, RowBytes}. Values and
// Linear's results are unchanged (the same integer block sums; only the order
// of fp32 sums differs). InvalidArgument naming the field for another type,
// rows % 8 != 0, an invalid view or a null dst; dst must not overlap w. Runs on
// the OpenMP team (a parallel region of its own).
absl::Status InterleaveRows8(const WeightView& w, uint8_t* dst);

// CPU instruction-set paths of Linear.
enum class CpuIsa : uint8_t { kPortable, kAvx2, kAvx512 };
const char* CpuIsaName(CpuIsa isa);  // "portable", "avx2", "avx512"
// True when this CPU (CPUID) and OS can run `isa`'s path.
bool CpuSupportsIsa(CpuIsa isa);
// The path Linear uses now.
CpuIsa ActiveLinearIsa();
// True when Linear runs the many-token products of Q4_0x8 / Q4_1x8 weights on
// the AMX tiles: the active path is avx512, the CPU and OS offer AMX-BF16
// tiles, and neither PAGEDSERVE_CPU_AMX nor SetLinearAmx turned them off.
// Thread-safe.
bool LinearUsesAmx();
// Turns the AMX tiles on or off for Linear from now on (tests, benchmarks);
// FailedPrecondition when asked to turn them on and the CPU or OS lacks them.
// Thread-safe; calls already running keep their method.
absl::Status SetLinearAmx(bool on);
// Makes Linear use `isa` from now on (tests, benchmarks). FailedPrecondition,
// naming the missing features, when the CPU cannot run it. Thread-safe, but
// calls of Linear already running keep the path they started with.
absl::Status SetLinearIsa(CpuIsa isa);

}  // namespace pagedserve::kernels

#endif  // PAGEDSERVE_KERNELS_LINEAR_H_
