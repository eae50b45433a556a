// CPU Linear (kernels/linear.h): validation, instruction-set dispatch, the
// choice of method per shape and the split of output rows over OpenMP threads.
#include "kernels/linear.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
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
// thread, CPU time, docs/benchmarks.md "Linear kernels (CPU)"): for F32 sgemm
// overtakes fp32 dot products between 16 and 32 tokens; for F16/BF16 the two
// are even at 128 tokens (the tile conversion is paid per call) and sgemm is
// ahead at 256; for the quantized formats the 8-bit dot products were faster than
// converting tiles for sgemm at every size measured (4..256 tokens: 1.3-8x), so
// they always use row dots.
constexpr int64_t kSgemmMinTokensF32 = 24;
constexpr int64_t kSgemmMinTokensHalf = 128;
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

// Quantizes token t's activations into `xq` (its blocks start at t * nb blocks).
void QuantizeToken(const LinearParams& p, int64_t nb, int64_t t, uint8_t* xq) {
  const float* x = p.x + t * p.x_stride;
  if (UsesActBlock256(p.w.type)) {
    QuantizeActs256(x, p.w.cols, reinterpret_cast<ActBlock256*>(xq) + t * nb);
  } else {
    QuantizeActs32(x, p.w.cols, reinterpret_cast<ActBlock32*>(xq) + t * nb);
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

}  // namespace

const char* LinearMethodName(LinearMethod m) {
  return m == LinearMethod::kRowDot ? "row_dot" : "tile_sgemm";
}

bool IsQuantized(WeightType t) {
  return t != WeightType::kF32 && t != WeightType::kF16 && t != WeightType::kBF16;
}

LinearMethod ChooseMethod(WeightType type, int64_t num_tokens, int64_t rows, int64_t cols) {
  if (IsQuantized(type)) return LinearMethod::kRowDot;
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

absl::Status LinearWith(const LinearParams& p, CpuIsa isa, LinearMethod method) {
  absl::Status s = ValidateLinear(p);
  if (!s.ok() || p.num_tokens == 0) return s;
  if (!CpuSupportsIsa(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the ", CpuIsaName(isa), " path of Linear is not available on this CPU"));
  }
  const IsaKernels& k = KernelsFor(isa);
  const bool quant_acts = method == LinearMethod::kRowDot && IsQuantized(p.w.type);
  static thread_local std::vector<uint8_t> xq_scratch;
  const int64_t nb = p.w.cols / BlockElems(p.w.type);
  uint8_t* xq = nullptr;
  if (quant_acts) {
    const size_t block = UsesActBlock256(p.w.type) ? sizeof(ActBlock256) : sizeof(ActBlock32);
    xq = Scratch(xq_scratch, static_cast<size_t>(p.num_tokens * nb) * block);
  }
  if (method == LinearMethod::kTileSgemm) UseOpenBlasSingleThreaded();
  const int64_t work = p.w.rows * p.w.cols * p.num_tokens;
  const int threads = (omp_in_parallel() || work < kMinParallelWork) ? 1 : omp_get_max_threads();
  // A few tokens are quantized before the parallel region (microseconds), which
  // saves decode a barrier; more are quantized by the team (omp for + barrier).
  const bool quant_serial = quant_acts && p.num_tokens <= kSerialQuantTokens;
  if (quant_serial) {
    for (int64_t t = 0; t < p.num_tokens; ++t) QuantizeToken(p, nb, t, xq);
  }
#pragma omp parallel num_threads(threads)
  {
    if (quant_acts && !quant_serial) {
#pragma omp for schedule(static)
      for (int64_t t = 0; t < p.num_tokens; ++t) QuantizeToken(p, nb, t, xq);
    }
    int64_t r0, r1;
    ThreadRows(p.w.rows, omp_get_thread_num(), omp_get_num_threads(), &r0, &r1);
    if (r0 < r1) {
      if (method == LinearMethod::kRowDot) {
        RowDotRange(p, k, xq, r0, r1);
      } else {
        TileSgemmRange(p, r0, r1);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace cpu

absl::Status Linear(const LinearParams& p) {
  return cpu::LinearWith(p, ActiveLinearIsa(),
                         cpu::ChooseMethod(p.w.type, p.num_tokens, p.w.rows, p.w.cols));
}

}  // namespace pagedserve::kernels
