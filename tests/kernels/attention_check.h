// The tolerance standard of the attention kernel tests (CPU, CUDA device and
// SIMT-emulated CUDA): an output is compared with the double-precision
// reference (reference_attention.h) at a scale set by the REFERENCE OUTPUT,
// never by the inputs. Softmax over a long context averages V, so outputs are
// far smaller than max|V| (uniform V in [-1, 1] over 32K tokens gives
// |out| ~ 3e-3): a bound of eps * max|V| would accept an all-zero output.
//
// Three conditions, each over one compared block (a sequence's heads, or one
// query row of a prefill):
//   1. every element finite;
//   2. per element  |got - ref| <= rtol * |ref| + atol * rms(ref);
//   3. relative RMS ||got - ref||_2 / ||ref||_2 <= rel_rms.
// rtol covers the one rounding of the output to its dtype (unit roundoff u:
// 2^-24 fp32, 2^-11 fp16, 2^-8 bf16); atol covers fp32 accumulation and the
// rounding of elements near zero (where u * |ref| vanishes); rel_rms is the
// tight aggregate bound: a zeroed output has relative RMS 1, an output that
// skipped one 16-token block of a 32K context about 2e-2, the bf16 rounding
// alone ~u / 2.
//
// Measured (PAGEDSERVE_ATTENTION_ERROR_LOG=1, RelWithDebInfo x86-64, the full
// grids of paged_attention_test, prefill_attention_test and
// cuda_emulation_test; worst case over ~3,900 compared blocks):
//               relative RMS     per-element need (|err| - u|ref|) / rms(ref)
//   fp32        1.8e-6           1.0e-5
//   fp16        2.6e-4           2.8e-6
//   bf16        2.0e-3           3.7e-8
// Bounds (AttentionBoundsFor): rtol 2u (one more rounding than the CPU
// kernels need, for a device kernel that rounds its v2 partial outputs);
// atol 5e-5 fp32, 1e-4 fp16 / bf16; relative RMS 1e-5 fp32, 1e-3 fp16,
// 5e-3 bf16 (2.5-6x the measured figures; the device's __expf adds ~2^-21
// relative per weight, far below them). The negative controls measured: one
// block dropped gives a relative RMS of 0.021 at the least (32K tokens) and
// needs atol >= 0.11, so each bound sits 4x or more below the broken outputs.
// Every test that uses them shows in itself that a zeroed output and an
// output with one block dropped fail (ExpectRejectsBrokenOutputs).
#ifndef PAGEDSERVE_TESTS_KERNELS_ATTENTION_CHECK_H_
#define PAGEDSERVE_TESTS_KERNELS_ATTENTION_CHECK_H_

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/types.h"

namespace pagedserve::kernels::testing {

struct AttentionBounds {
  double rtol = 0.0;     // per element, times |ref|
  double atol = 0.0;     // per element, times rms(ref) of the compared block
  double rel_rms = 0.0;  // ||got - ref|| / ||ref||
};

// Unit roundoff of storing a value in dtype t (half an ulp, relative).
inline double UnitRoundoff(DType t) {
  switch (t) {
    case DType::kFloat32: return 0x1p-24;
    case DType::kFloat16: return 0x1p-11;
    case DType::kBFloat16: return 0x1p-8;
    case DType::kFloat8E4M3: return 0x1p-4;  // never an output dtype; for completeness
    case DType::kFloat8E5M2: return 0x1p-3;
  }
  return 0.0;
}

// The bounds for an attention output stored in dtype t (see the file comment).
inline AttentionBounds AttentionBoundsFor(DType t) {
  const double u = UnitRoundoff(t);
  switch (t) {
    case DType::kFloat32: return {2.0 * u, 5e-5, 1e-5};
    case DType::kFloat16: return {2.0 * u, 1e-4, 1e-3};
    case DType::kBFloat16: return {2.0 * u, 1e-4, 5e-3};
    case DType::kFloat8E4M3:
    case DType::kFloat8E5M2: break;  // outputs are never fp8 (io_dtype)
  }
  return {};
}

struct AttentionError {
  bool finite = true;
  double rel_rms = 0.0;       // ||got - ref|| / ||ref||
  double worst_excess = 0.0;  // max over elements of |got - ref| / allowed
  size_t worst = 0;           // index of that element
  double max_abs = 0.0;
  double atol_needed = 0.0;  // max over elements of (|got - ref| - rtol |ref|) / rms(ref)
};

// got and ref hold n elements of one compared block.
inline AttentionError MeasureAttentionError(const float* got, const double* ref, size_t n,
                                            const AttentionBounds& b) {
  AttentionError e;
  double ref2 = 0.0, err2 = 0.0;
  for (size_t i = 0; i < n; ++i) ref2 += ref[i] * ref[i];
  const double rms = std::sqrt(ref2 / std::max<size_t>(n, 1));
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i])) {
      e.finite = false;
      e.worst = i;
      return e;
    }
    const double d = std::abs(static_cast<double>(got[i]) - ref[i]);
    err2 += d * d;
    e.max_abs = std::max(e.max_abs, d);
    const double allowed = b.rtol * std::abs(ref[i]) + b.atol * rms;
    if (rms > 0) e.atol_needed = std::max(e.atol_needed, (d - b.rtol * std::abs(ref[i])) / rms);
    const double excess = allowed > 0 ? d / allowed : (d > 0 ? HUGE_VAL : 0.0);
    if (excess > e.worst_excess) {
      e.worst_excess = excess;
      e.worst = i;
    }
  }
  e.rel_rms = ref2 > 0 ? std::sqrt(err2 / ref2) : std::sqrt(err2);
  return e;
}

// Marks the comparisons of the negative controls in the error log.
struct AttentionControlScope {
  AttentionControlScope() { active = true; }
  ~AttentionControlScope() { active = false; }
  static inline thread_local bool active = false;
};

// gtest predicate: the block passes all three conditions. On failure the
// message names the worst element (index, got, ref) and the relative RMS.
inline ::testing::AssertionResult AttentionOutputMatches(const float* got, const double* ref,
                                                         size_t n, DType t) {
  const AttentionBounds b = AttentionBoundsFor(t);
  const AttentionError e = MeasureAttentionError(got, ref, n, b);
  // PAGEDSERVE_ATTENTION_ERROR_LOG=1 prints every comparison's figures (how
  // the bounds above were measured; rerun it when a kernel changes).
  if (const char* log = std::getenv("PAGEDSERVE_ATTENTION_ERROR_LOG"); log && *log == '1')
    std::fprintf(
        stderr,
        "attention-error %s%s n %zu rel_rms %.3g excess %.3g max_abs %.3g atol_needed %.3g\n",
        DTypeName(t), AttentionControlScope::active ? " (control)" : "", n, e.rel_rms,
        e.worst_excess, e.max_abs, e.atol_needed);
  if (e.finite && e.worst_excess <= 1.0 && e.rel_rms <= b.rel_rms)
    return ::testing::AssertionSuccess();
  std::ostringstream m;
  if (!e.finite) {
    m << "non-finite output at element " << e.worst << ": " << got[e.worst];
  } else {
    m << "element " << e.worst << ": got " << got[e.worst] << " reference " << ref[e.worst]
      << " (error " << e.worst_excess << "x the allowed " << b.rtol << "*|ref| + " << b.atol
      << "*rms(ref)); relative RMS " << e.rel_rms << " (bound " << b.rel_rms << ")";
  }
  return ::testing::AssertionFailure() << m.str();
}

inline ::testing::AssertionResult AttentionOutputMatches(const std::vector<float>& got,
                                                         const std::vector<double>& ref, DType t) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << ref.size();
  return AttentionOutputMatches(got.data(), ref.data(), ref.size(), t);
}

// The negative controls every attention test runs on its own data: the
// standard must reject an all-zero output and `dropped_block` (the same kernel
// run with one block of the context left out). Both are compared with `ref`.
inline void ExpectRejectsBrokenOutputs(const std::vector<double>& ref,
                                       const std::vector<float>& dropped_block, DType t) {
  AttentionControlScope control;
  const std::vector<float> zeros(ref.size(), 0.0f);
  EXPECT_FALSE(AttentionOutputMatches(zeros, ref, t))
      << "an all-zero " << DTypeName(t) << " output passes the attention bounds";
  EXPECT_FALSE(AttentionOutputMatches(dropped_block, ref, t))
      << "a " << DTypeName(t) << " output missing one KV block passes the attention bounds";
}

// Block table / seq_len with the block at `index` removed: entries after it
// move up one, and the context shrinks by block_size tokens (the kernel then
// attends to every token but those of that block). Needs the sequence to span
// more than index + 1 blocks.
inline void DropBlock(std::vector<int32_t>* table_row, int* seq_len, int index, int block_size) {
  table_row->erase(table_row->begin() + index);
  table_row->push_back(-1);
  *seq_len -= block_size;
}

}  // namespace pagedserve::kernels::testing

#endif  // PAGEDSERVE_TESTS_KERNELS_ATTENTION_CHECK_H_
