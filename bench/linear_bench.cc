// Linear over stored weight formats (kernels/linear.h) at SmolLM2-135M shapes
// (576x576 q/o proj, 1536x576 gate/up, 576x1536 down, 49152x576 LM head) and a
// 4096x4096 7B-class shape, for 1/8/32/128 tokens, against today's path: the
// weight dequantized to fp32 and one OpenBLAS sgemm with OpenBLAS's own threads.
//
// BM_Linear/<format>/<rows>/<cols>/<tokens>: Linear as the forward pass calls it
//   (method from ChooseMethod, ISA from ActiveLinearIsa / PAGEDSERVE_CPU_ISA).
// BM_LinearKQuant1B/<format>/<rows>/<cols>/<tokens>: BM_Linear on the K-quant
//   matrices of Llama-3.2-1B in Q4_K_M (issue 10).
// BM_LinearMethod/<format>/<rows>/<cols>/<tokens>/<method 0 row_dot, 1 tile_sgemm,
//   2 row_block, 3 row_block8, 4 panel16, 5 interleaved8, 6 amx_bf16>: one method forced,
//   to place the crossovers in ChooseMethod (amx_bf16 needs a CPU with AMX).
// BM_LinearPanel1B/<format>/<rows>/<cols>/<tokens>/<method>: BM_LinearMethod
//   on Llama-3.2-1B's K-quant shapes, kPanel16 against the other methods (issue 34).
// BM_LinearVerify135M/<format>/<rows>/<cols>/<tokens>/<method>: BM_LinearMethod on
//   SmolLM2-135M's shapes at speculative verification's 2..9 tokens (issue 33).
// BM_LinearMethodCold/<format>/<rows>/<cols>/<tokens>/<method>: BM_LinearMethod with
//   the weight evicted from the caches before each call (a model's decode).
// BM_QuantizeActs/<isa 0 portable, 1 avx2, 2 avx512>/<block 32 or 256>/<n>: the
//   activation quantizer of one ISA path on n activations.
// BM_OpenBlasF32/<rows>/<cols>/<tokens>: cblas_sgemm on fp32 weights,
//   openblas_set_num_threads(omp_get_max_threads()) during the run.
// Counter weight_GBps = bytes of the stored weight / time (decode is bound by it).
// Format ids: the WeightType values (0 F32, 1 F16, 2 Q4_0, 3 Q4_1, 6 Q5_0, 7 Q5_1,
// 8 Q8_0, 10 Q2_K, 11 Q3_K, 12 Q4_K, 13 Q5_K, 14 Q6_K, 20 IQ4_NL, 23 IQ4_XS, 30 BF16,
// 200 Q4_0x8 and 201 Q4_1x8: random Q4_0 / Q4_1 interleaved by InterleaveRows8;
// their method ids are 5 and, on a CPU with AMX, 6).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/linear_cpu.h"
#include "kernels/linear.h"

namespace pagedserve::kernels {
namespace {

// Random weight bytes with sane fp16 scales (every block's scale fields set).
std::vector<uint8_t> RandomWeightBytes(WeightType type, int64_t rows, int64_t cols) {
  const size_t row_bytes = *RowBytes(type, cols);
  std::vector<uint8_t> w(row_bytes * rows);
  std::mt19937 rng(1);
  for (auto& b : w) b = static_cast<uint8_t>(rng());
  auto put = [](uint8_t* p, float v) {
    const uint16_t h = FloatToHalfBits(v);
    std::memcpy(p, &h, 2);
  };
  if (type == WeightType::kF32) {
    for (size_t i = 0; i < w.size(); i += 4) {
      const float v = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
      std::memcpy(&w[i], &v, 4);
    }
    return w;
  }
  if (type == WeightType::kF16 || type == WeightType::kBF16) {
    for (size_t i = 0; i < w.size(); i += 2) {
      const float v = static_cast<float>(rng() % 2001) / 1000.0f - 1.0f;
      const uint16_t h = type == WeightType::kF16 ? FloatToHalfBits(v) : FloatToBFloat16Bits(v);
      std::memcpy(&w[i], &h, 2);
    }
    return w;
  }
  const size_t bb = BlockBytes(type);
  for (size_t off = 0; off < w.size(); off += bb) {
    if (type == WeightType::kQ6_K) {
      put(&w[off + 208], 0.001f);
    } else if (type == WeightType::kQ3_K) {
      put(&w[off + 108], 0.001f);
    } else if (type == WeightType::kQ2_K) {
      put(&w[off + 80], 0.01f);
      put(&w[off + 82], 0.001f);
    } else {
      put(&w[off], 0.01f);
      put(&w[off + 2], 0.001f);
    }
  }
  return w;
}

// Q4_0x8 / Q4_1x8 (issue 34): random Q4_0 / Q4_1 rows interleaved as the CPU
// backend does at load.
std::vector<uint8_t> WeightBytes(WeightType type, int64_t rows, int64_t cols) {
  if (!IsInterleavedRows8(type)) return RandomWeightBytes(type, rows, cols);
  const WeightType src = type == WeightType::kQ4_0x8 ? WeightType::kQ4_0 : WeightType::kQ4_1;
  const std::vector<uint8_t> q = RandomWeightBytes(src, rows, cols);
  std::vector<uint8_t> w(q.size());
  const WeightView v{src, rows, cols, q.data(), *RowBytes(src, cols)};
  if (!InterleaveRows8(v, w.data()).ok()) w.clear();
  return w;
}

struct Setup {
  WeightType type;
  int64_t rows, cols, tokens;
  std::vector<uint8_t> w;
  std::vector<float> x, y;
  LinearParams p;
  Setup(WeightType t, int64_t r, int64_t c, int64_t n)
      : type(t), rows(r), cols(c), tokens(n), w(WeightBytes(t, r, c)), x(n * c), y(n * r) {
    std::mt19937 rng(2);
    std::normal_distribution<float> g;
    for (float& v : x) v = g(rng);
    p = LinearParams{x.data(), n,        c, WeightView{t, r, c, w.data(), *RowBytes(t, c)},
                     nullptr,  y.data(), r};
  }
  void Count(benchmark::State& state, const char* method) {
    state.counters["weight_GBps"] = benchmark::Counter(
        static_cast<double>(w.size()) * state.iterations() / 1e9, benchmark::Counter::kIsRate);
    state.counters["tokens_per_s"] = benchmark::Counter(
        static_cast<double>(tokens) * state.iterations(), benchmark::Counter::kIsRate);
    state.SetLabel(std::string(WeightTypeName(type)) + " " + CpuIsaName(ActiveLinearIsa()) + " " +
                   method);
  }
};

void BM_Linear(benchmark::State& state) {
  Setup s(static_cast<WeightType>(state.range(0)), state.range(1), state.range(2), state.range(3));
  for (auto _ : state) {
    if (!Linear(s.p).ok()) state.SkipWithError("Linear failed");
    benchmark::DoNotOptimize(s.y.data());
  }
  s.Count(state, cpu::LinearMethodName(
                     cpu::ChooseMethod(s.type, s.tokens, s.rows, s.cols, ActiveLinearIsa())));
}

void BM_LinearMethod(benchmark::State& state) {
  Setup s(static_cast<WeightType>(state.range(0)), state.range(1), state.range(2), state.range(3));
  const auto m = state.range(4) == 0   ? cpu::LinearMethod::kRowDot
                 : state.range(4) == 1 ? cpu::LinearMethod::kTileSgemm
                 : state.range(4) == 2 ? cpu::LinearMethod::kRowBlock
                 : state.range(4) == 3 ? cpu::LinearMethod::kRowBlock8
                 : state.range(4) == 4 ? cpu::LinearMethod::kPanel16
                 : state.range(4) == 5 ? cpu::LinearMethod::kInterleaved8
                                       : cpu::LinearMethod::kAmxBf16;
  for (auto _ : state) {
    if (!cpu::LinearWith(s.p, ActiveLinearIsa(), m).ok()) state.SkipWithError("Linear failed");
    benchmark::DoNotOptimize(s.y.data());
  }
  s.Count(state, cpu::LinearMethodName(m));
}

// BM_LinearMethod with the weight read from memory, as in a model's decode
// (every weight read once per token, the model far larger than the last-level
// cache): the call cycles over copies of the weight that together take
// kColdBytes, so each call finds its copy evicted.
constexpr size_t kColdBytes = size_t{512} << 20;
void BM_LinearMethodCold(benchmark::State& state) {
  Setup s(static_cast<WeightType>(state.range(0)), state.range(1), state.range(2), state.range(3));
  const auto m = static_cast<cpu::LinearMethod>(state.range(4));
  const size_t copies = std::max<size_t>(2, kColdBytes / s.w.size());
  std::vector<uint8_t> cold(copies * s.w.size());
  for (size_t c = 0; c < copies; ++c)
    std::memcpy(cold.data() + c * s.w.size(), s.w.data(), s.w.size());
  size_t next = 0;
  for (auto _ : state) {
    LinearParams p = s.p;
    p.w.data = cold.data() + next * s.w.size();
    next = (next + 1) % copies;
    if (!cpu::LinearWith(p, ActiveLinearIsa(), m).ok()) state.SkipWithError("Linear failed");
    benchmark::DoNotOptimize(s.y.data());
  }
  s.Count(state, cpu::LinearMethodName(m));
}

void BM_QuantizeActs(benchmark::State& state) {
  const auto isa = static_cast<CpuIsa>(state.range(0));
  if (!CpuSupportsIsa(isa)) {
    state.SkipWithError("this CPU lacks the path");
    return;
  }
  const cpu::IsaKernels& k = cpu::KernelsFor(isa);
  const int64_t n = state.range(2);
  std::vector<float> x(n);
  std::mt19937 rng(3);
  std::normal_distribution<float> g;
  for (float& v : x) v = g(rng);
  std::vector<cpu::ActBlock32> b32(n / 32);
  std::vector<cpu::ActBlock256> b256(n / 256);
  for (auto _ : state) {
    if (state.range(1) == 32) {
      k.quant32(x.data(), n, b32.data());
      benchmark::DoNotOptimize(b32.data());
    } else {
      k.quant256(x.data(), n, b256.data());
      benchmark::DoNotOptimize(b256.data());
    }
  }
  state.SetItemsProcessed(state.iterations() * n);
  state.SetLabel(CpuIsaName(isa));
}

// Today's path: fp32 weights, one sgemm, OpenBLAS's own thread pool.
void BM_OpenBlasF32(benchmark::State& state) {
  Setup s(WeightType::kF32, state.range(0), state.range(1), state.range(2));
  const float* w = reinterpret_cast<const float*>(s.w.data());
  openblas_set_num_threads(omp_get_max_threads());
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(s.tokens),
                static_cast<int>(s.rows), static_cast<int>(s.cols), 1.0f, s.x.data(),
                static_cast<int>(s.cols), w, static_cast<int>(s.cols), 0.0f, s.y.data(),
                static_cast<int>(s.rows));
    benchmark::DoNotOptimize(s.y.data());
  }
  openblas_set_num_threads(1);  // what Linear's tile method expects (kernels/linear.h)
  s.Count(state, "openblas threads");
}

constexpr int64_t kShapes[][2] = {{576, 576}, {1536, 576}, {576, 1536}, {49152, 576}, {4096, 4096}};
constexpr int64_t kTokens[] = {1, 8, 32, 128};
constexpr int64_t kFormats[] = {0, 1, 30, 2, 3, 6, 7, 8, 12, 13, 14};

void LinearArgs(benchmark::internal::Benchmark* b) {
  for (int64_t f : kFormats)
    for (const auto& s : kShapes)
      for (int64_t t : kTokens) {
        // K-quants need cols % 256 == 0 (llama.cpp falls back to other formats for
        // SmolLM2's 576-column tensors).
        if (s[1] % BlockElems(static_cast<WeightType>(f)) == 0) b->Args({f, s[0], s[1], t});
      }
}
void MethodArgs(benchmark::internal::Benchmark* b) {
  for (int64_t f : {0, 1, 2, 3, 8, 12, 14})
    for (int64_t t : {1, 2, 3, 4, 8, 16, 32, 64, 128, 256})
      for (int64_t m : {0, 1, 2}) b->Args({f, 1536, 1536, t, m});
  // decode on a weight that does not fit in cache: row dots vs row-block tiles
  for (int64_t f : {2, 3, 8, 12, 14})
    for (int64_t t : {1, 2})
      for (int64_t m : {0, 2}) b->Args({f, 4096, 4096, t, m});
  // decode on a large weight of short rows (SmolLM2's 49152x576 LM head, 30 MB
  // in Q8_0): the same choice where 4 rows are one contiguous stream
  for (int64_t f : {3, 8})
    for (int64_t t : {1, 2})
      for (int64_t m : {0, 2}) b->Args({f, 49152, 576, t, m});
  // the K-quant row dots on a weight that stays in L2 (295-430 KB): their compute
  // rate with no memory traffic (the bound of decode once the prefetch keeps up)
  for (int64_t f : {12, 14}) {
    b->Args({f, 256, 2048, 1, 0});
    b->Args({f, 64, 8192, 1, 0});
  }
  // decode on Llama-3.2-1B's K-quant shapes (2.4-14 MB; issue 10)
  for (int64_t f : {12, 14})
    for (int64_t rows : {2048, 8192})
      for (int64_t t : {1, 2})
        for (int64_t m : {0, 2}) b->Args({f, rows, 2048, t, m});
  // kRowBlock8 vs kRowBlock at SmolLM2-135M's shapes (batched decode)
  for (int64_t f : {2, 3, 6, 7, 8})
    for (const auto& s :
         {std::pair{1536, 576}, std::pair{576, 1536}, std::pair{576, 576}, std::pair{49152, 576}})
      for (int64_t t : {4, 8, 16, 32, 64})
        for (int64_t m : {2, 3}) b->Args({f, s.first, s.second, t, m});
  // kRowBlock8 against the sgemm crossover of Q4_0/Q4_1 (and Q8_0's tiles)
  for (int64_t f : {2, 3, 8})
    for (int64_t t : {128, 256})
      for (int64_t m : {1, 2, 3}) b->Args({f, 1536, 1536, t, m});
}
// Llama-3.2-1B's shapes in its Q4_K_M file (issue 10): q/o 2048x2048 and
// gate/up 8192x2048 in Q4_K, down 2048x8192 in Q4_K or Q6_K.
// kPanel16 vs the row dots / row-block tiles on Llama-3.2-1B's K-quant shapes
// (issue 34: the crossover per format, ISA and token count).
void PanelArgs(benchmark::internal::Benchmark* b) {
  for (const auto& [f, rows, cols] : {std::tuple<int64_t, int64_t, int64_t>{12, 2048, 2048},
                                      {12, 2048, 8192},
                                      {14, 2048, 8192},
                                      {13, 2048, 2048}})
    for (int64_t t : {2, 4, 8, 16, 32})
      for (int64_t m : {0, 2, 4}) b->Args({f, rows, cols, t, m});
  // Q4_0 and Q8_0 panels (PanelBlock32) against the 2x4 tiles and the 8-row
  // interleaved tiles; Q3_K against its row dots and tiles.
  for (const auto& [f, rows, cols] : {std::tuple<int64_t, int64_t, int64_t>{2, 2048, 8192},
                                      {8, 2048, 8192},
                                      {2, 2048, 2048},
                                      {8, 2048, 2048}})
    for (int64_t t : {4, 8, 16, 32, 128})
      for (int64_t m : {2, 3, 4}) b->Args({f, rows, cols, t, m});
  for (int64_t t : {4, 8, 16, 32})
    for (int64_t m : {0, 2, 4}) b->Args({11, 2048, 8192, t, m});
  // One token (decode at batch 1) on Q4_0 / Q8_0 at the 1B shapes: the row
  // dots against the row-block tiles (docs/benchmarks.md, "Llama-3.2-1B
  // shape, idle, three formats").
  for (int64_t f : {2, 8})
    for (int64_t m : {0, 2, 3}) b->Args({f, 8192, 2048, 1, m}), b->Args({f, 2048, 8192, 1, m});
  // Q4_0x8 / Q4_1x8 (rows interleaved at load) against the Q4_0 methods above,
  // 1..128 tokens
  for (int64_t f : {200, 201})
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{2048, 8192}, {2048, 2048}})
      for (int64_t t : {1, 2, 4, 8, 16, 32, 128}) b->Args({f, rows, cols, t, 5});
  // The AMX tiles (issue 34) against the interleaved kernels where the CPU has AMX.
  if (cpu::AmxBf16Supported())
    for (int64_t f : {200, 201})
      for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{2048, 8192}, {2048, 2048}})
        for (int64_t t : {8, 16, 32, 128, 512}) b->Args({f, rows, cols, t, 6});
  // The row-major formats' AMX tiles against their panels (Q8_0, Q4_K, Q5_K, Q6_K);
  // at one token the tiles' time is mostly the weights' dequantization.
  if (cpu::AmxBf16Supported())
    for (int64_t f : {8, 12, 13, 14})
      for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{2048, 8192}, {8192, 2048}})
        for (int64_t t : {1, 8, 16, 24, 32, 128})
          for (int64_t m : {4, 6})
            if (t > 1 || m == 6) b->Args({f, rows, cols, t, m});
}
// One to three tokens (decode at batch 1..3) with the weight read from memory:
// the row dots against the row-block tiles (and the 8-row tiles of the
// 32-element formats), at Llama-3.2-1B's shapes (q/o, k/v, gate/up, down) and
// SmolLM2-135M's (q/o, gate/up, down) for its Q4_1 / Q8_0 file; the K-quants
// also at 4 and 6 tokens.
void ColdArgs(benchmark::internal::Benchmark* b) {
  for (int64_t f : {12, 14, 2, 3, 8, 200, 201})
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{2048, 2048}, {512, 2048}, {8192, 2048}, {2048, 8192}})
      for (int64_t t : {1, 2, 3})
        for (int64_t m : {0, 2, 3, 5})
          if ((f >= 200) == (m == 5) && (m != 3 || f == 2 || f == 3 || f == 8))
            b->Args({f, rows, cols, t, m});
  // the K-quants up to their panels' kPanelMinTokens (8): row dots vs 2x4 tiles
  for (int64_t f : {12, 14})
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{2048, 2048}, {8192, 2048}})
      for (int64_t t : {4, 6})
        for (int64_t m : {0, 2}) b->Args({f, rows, cols, t, m});
  for (int64_t f : {3, 8})
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{576, 576}, {1536, 576}, {576, 1536}})
      for (int64_t t : {1, 2, 3})
        for (int64_t m : {0, 2, 3}) b->Args({f, rows, cols, t, m});
}
// Speculative verification (issue 33) at SmolLM2-135M's shapes: 2..9 tokens
// (k + 1 for k = 1..8), kPanel16 against the row dots and the 2x4 tiles, for
// the formats of its files (Q4_0, Q4_1, Q8_0: the Q8_0 49152x576 LM head).
void VerifyArgs(benchmark::internal::Benchmark* b) {
  for (int64_t f : {2, 3, 8})
    for (const auto& s :
         {std::pair{576, 576}, std::pair{1536, 576}, std::pair{576, 1536}, std::pair{49152, 576}})
      for (int64_t t : {1, 2, 3, 4, 5, 6, 9})
        for (int64_t m : {0, 2, 4}) b->Args({f, s.first, s.second, t, m});
}
void KQuant1BArgs(benchmark::internal::Benchmark* b) {
  for (const auto& [f, rows, cols] : {std::tuple<int64_t, int64_t, int64_t>{12, 2048, 2048},
                                      {12, 8192, 2048},
                                      {12, 2048, 8192},
                                      {14, 2048, 8192}})
    for (int64_t t : {1, 2, 8, 128}) b->Args({f, rows, cols, t});
}
void BlasArgs(benchmark::internal::Benchmark* b) {
  for (const auto& s : kShapes)
    for (int64_t t : kTokens) b->Args({s[0], s[1], t});
}

BENCHMARK(BM_OpenBlasF32)->Apply(BlasArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Linear)->Apply(LinearArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Linear)
    ->Name("BM_LinearKQuant1B")
    ->Apply(KQuant1BArgs)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LinearMethod)->Apply(MethodArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LinearMethod)
    ->Name("BM_LinearPanel1B")
    ->Apply(PanelArgs)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LinearMethod)
    ->Name("BM_LinearVerify135M")
    ->Apply(VerifyArgs)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_LinearMethodCold)->Apply(ColdArgs)->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_QuantizeActs)
    ->ArgsProduct({{0, 1, 2}, {32, 256}, {1536}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace pagedserve::kernels

BENCHMARK_MAIN();
