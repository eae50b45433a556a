// Internal to the CPU backend: the inner attention loop shared by decode (v1,
// v2), prefill and the contiguous-KV baseline of the benchmark.
//
// One call processes the token range [t_begin, t_end) of one sequence and one
// KV head for M queries (the query heads of that KV head's GQA group, times
// the query rows of a prefill tile). Per query it returns the max logit m, the
// exp-sum l = sum exp(logit - m) and the unnormalized output
// acc = sum exp(logit - m) * v, so that ranges can be combined with the usual
// log-sum-exp rescaling (Milakov & Gimelshein 2018, "Online normalizer
// calculation for softmax"; vLLM paged_attention_v2's reduce).
//
// Variants, chosen at run time from the CPU's features (no -march=native):
// - Generic template (every dtype; the x86-64 baseline variant, and the AVX2
//   variant for fp32 and fp8 caches): loops written for auto-vectorization
//   (no reductions in inner loops), compiled once for the baseline and once
//   with target("avx2,fma,f16c"). K blocks are converted to fp32 in kbuf; V
//   blocks are converted and transposed to [block_size, head_size] in vbuf.
//   fp16 is converted with integer bit operations (exact); fp8 blocks are
//   decoded through the 256-entry tables of kernels/cpu/fp8.h (exact).
// - AVX2+FMA+F16C intrinsics path for 16-bit caches (fp16, bf16; x = 8),
//   block sizes 8/16/32. fp16 -> fp32 with vcvtph2ps, bf16 -> fp32 by a
//   16-bit left shift; both exact.
//   Pass 1, per query and block, tokens in groups of 8: 8 accumulators (one
//   per token, lanes = the 8 elements of a key chunk); per chunk one q vector
//   and 8 FMAs with K[c][t][0:8] converted in registers straight from the
//   cache block; a hadd/permute tree then reduces the 8 accumulators to one
//   vector of 8 logits (scale and ALiBi applied in-vector).
//   Softmax: vectorized max, and exp by the Cephes expf polynomial (relative
//   error at most 1.2e-7 over [-87.3, 0], checked against double exp on every 7th
//   float; arguments below -87.3 give exactly 0, NaN stays NaN).
//   Pass 2 reads V in its cache layout [head_size, block_size]: acc[d] +=
//   sum_t p[t] * V[d][t] is a dot product along t; 8 rows at a time,
//   block_size / 8 FMAs per row, one reduction tree and one add into acc per
//   8 rows and block. In a partial block (fewer visible tokens than
//   block_size) p and V are masked so unused slots (NaN, inf) never reach
//   the output; logits are stored with masked stores.
//   The next block is prefetched (block tables scatter blocks over the pool).
//   With 16 or more queries per call (prefill tiles) each block is converted
//   to fp32 once (kbuf for K, vbuf for V, same layout) and read by every
//   query; below that (decode: the GQA group) each query converts in
//   registers, which measured faster (docs/benchmarks-history.md, "Kernels (CPU)").
// The per-layer fp8 scales are not applied here: callers fold k_scale into
// `scale` and v_scale into the output normalization.
#ifndef PAGEDSERVE_KERNELS_CPU_ATTENTION_CORE_H_
#define PAGEDSERVE_KERNELS_CPU_ATTENTION_CORE_H_

#include <cstdint>

#include "kernels/types.h"

namespace pagedserve::kernels::cpu {

// Floats per query-vector chunk replicated for the key loop (see BuildQrep).
inline constexpr int kQrepWidth = 16;

struct AttendArgs {
  int head_size = 0;
  int num_queries = 0;  // M
  // Query m, replicated for the key layout: qrep[(m * (head_size / x) + c) *
  // kQrepWidth + i] = q_m[c * x + i % x]. Built by BuildQrep.
  const float* qrep = nullptr;  // [M, head_size / x, kQrepWidth]
  const int* limit = nullptr;   // [M] query m sees tokens [0, limit[m]) (causal / seq_len)
  // [M] or null: query m sees no token before first[m] (sliding window), so
  // it sees [first[m], limit[m]). Its logits there count as -inf (weight 0);
  // the callers start t_begin at the block holding first[m], so the masked
  // tokens are real cached ones of that block.
  const int* first = nullptr;
  const int* qpos = nullptr;      // [M] query position; used only with slopes
  const float* slopes = nullptr;  // [M] ALiBi slope per query or null
  float scale = 1.0f;
  // > 0: each scaled logit s becomes softcap * tanh(s / softcap) (Gemma 2's
  // attention soft-capping) before the window mask; 0 = none.
  float softcap = 0.0f;
  // Block i covers tokens [t_begin + i * block_size, ...): pointers to this KV
  // head's part of the block, key [head_size/x, block_size, x] and value
  // [head_size, block_size], elements of the cache dtype (fp8: raw codes).
  const void* const* k_blocks = nullptr;
  const void* const* v_blocks = nullptr;
  int t_begin = 0;  // multiple of block_size
  int t_end = 0;
  // Scratch: logits [M, t_end - t_begin]; kbuf, vbuf [block_size * head_size]
  // (whatever the variant needs of them; contents undefined on return).
  float* logits = nullptr;
  float* kbuf = nullptr;
  float* vbuf = nullptr;
  // Results: [M], [M], [M, head_size]. A query that sees no token of the
  // range gets m = -inf, l = 0, acc = 0.
  float* out_max = nullptr;
  float* out_sum = nullptr;
  float* out_acc = nullptr;
};

using AttendFn = void (*)(const AttendArgs&);

// The variant for this dtype and block size (8, 16, 32), vectorized for the
// widest instruction set this CPU supports among those compiled in.
AttendFn SelectAttend(DType dtype, int block_size);

// One variant regardless of what SelectAttend would pick: the x86-64
// baseline (avx2 = false) or the AVX2+FMA+F16C one (avx2 = true; null where
// this build has no AVX2 variant or this CPU lacks AVX2, FMA or F16C). Null
// for an unsupported dtype / block size. For tests that check every variant.
AttendFn SelectAttendVariant(DType dtype, int block_size, bool avx2);

// "avx2+fma+f16c" or "baseline": the variant SelectAttend picks on this CPU.
const char* AttendIsaName();

// Fills qrep for one query vector q (fp32, head_size elements), x = 16 bytes /
// element size of the cache dtype.
void BuildQrep(const float* q, int head_size, int x, float* qrep);

}  // namespace pagedserve::kernels::cpu

#endif  // PAGEDSERVE_KERNELS_CPU_ATTENTION_CORE_H_
