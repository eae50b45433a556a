// Decode attention on the CPU: paged_attention_v1 over a paged cache with a
// shuffled block table, the same code over contiguous K/V per (sequence, KV
// head) (kernels/cpu/contiguous_attention.h), and a memcpy of a large buffer as
// the machine's copy-bandwidth baseline.
//
// Arguments: batch, context length, query heads, dtype (0 = f32, 1 = f16,
// 2 = fp8 e4m3 cache with f16 queries/outputs, paged only); 8 KV heads, head
// size 128, block size 16. Counter kv_bytes_per_second = K
// and V bytes of all context tokens (each read once per step) / time.
//
// BM_GqaDecode / BM_GqaPrefill: the attention shape of SmolLM2-135M (9 query
// heads over 3 KV heads, head size 64, block 16), f16 or bf16 cache.
// GqaDecode arguments: batch, context, dtype (1 = f16, 3 = bf16); one decode
// query per sequence (paged_attention_v1). GqaPrefill arguments: context
// (seq_len), new tokens (q_len), dtype; one sequence, causal. Meant for one
// thread (OMP_NUM_THREADS=1) and CPU time.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include <omp.h>

#include "benchmark/benchmark.h"
#include "kernels/cpu/attention_core.h"
#include "kernels/cpu/contiguous_attention.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/half.h"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"

namespace pagedserve::kernels {
namespace {

constexpr int kKVHeads = 8;
constexpr int kHeadSize = 128;
constexpr int kBlockSize = 16;

DType ArgDType(int64_t a) {
  return a == 0 ? DType::kFloat32 : a == 1 ? DType::kFloat16 : DType::kFloat8E4M3;
}
// Element type of queries and outputs for a cache dtype.
DType IoDType(DType t) { return IsFp8(t) ? DType::kFloat16 : t; }

// Random fill: fp32 values or their fp16 / fp8 encodings.
void FillRandom(std::vector<uint8_t>& buf, DType t, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  const size_t n = buf.size() / DTypeSize(t);
  if (IsFp8(t)) {
    for (size_t i = 0; i < n; ++i) buf[i] = FloatToFp8E4M3Bits(u(rng));
  } else if (t == DType::kFloat32) {
    float* p = reinterpret_cast<float*>(buf.data());
    for (size_t i = 0; i < n; ++i) p[i] = u(rng);
  } else {
    uint16_t* p = reinterpret_cast<uint16_t*>(buf.data());
    for (size_t i = 0; i < n; ++i) p[i] = FloatToHalfBits(u(rng));
  }
}

void SetCounters(benchmark::State& state, int batch, int ctx, DType t) {
  const double kv_bytes = 2.0 * batch * ctx * kKVHeads * kHeadSize * DTypeSize(t);
  state.counters["kv_bytes_per_second"] =
      benchmark::Counter(kv_bytes * state.iterations(), benchmark::Counter::kIsRate);
  state.counters["kv_MiB"] = kv_bytes / (1 << 20);
  state.SetLabel(cpu::AttendIsaName());
}

void BM_PagedDecode(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const int ctx = static_cast<int>(state.range(1));
  const int heads = static_cast<int>(state.range(2));
  const DType t = ArgDType(state.range(3));
  std::mt19937 rng(1);
  const int blocks_per_seq = ctx / kBlockSize;
  KVCacheShape shape;
  shape.num_blocks = static_cast<int64_t>(batch) * blocks_per_seq;
  shape.num_kv_heads = kKVHeads;
  shape.head_size = kHeadSize;
  shape.block_size = kBlockSize;
  shape.dtype = t;
  std::vector<uint8_t> key(shape.num_blocks * shape.block_bytes()), value(key.size());
  FillRandom(key, t, rng);
  FillRandom(value, t, rng);
  std::vector<int32_t> tables(shape.num_blocks);
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), rng);  // blocks scattered over the pool
  std::vector<int32_t> lens(batch, ctx);
  const DType io = IoDType(t);
  std::vector<uint8_t> q(static_cast<size_t>(batch) * heads * kHeadSize * DTypeSize(io)),
      out(q.size());
  FillRandom(q, io, rng);
  PagedAttentionParams p;
  p.out = out.data();
  p.query = q.data();
  p.num_seqs = batch;
  p.num_heads = heads;
  p.cache = {key.data(), value.data(), shape, Device::kCPU};
  if (IsFp8(t)) p.io_dtype = io;
  p.block_tables = tables.data();
  p.max_blocks_per_seq = blocks_per_seq;
  p.seq_lens = lens.data();
  p.max_seq_len = ctx;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kHeadSize));
  for (auto _ : state) {
    if (!PagedAttentionV1(p).ok()) state.SkipWithError("paged_attention_v1 failed");
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, batch, ctx, t);
}

void BM_ContiguousDecode(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const int ctx = static_cast<int>(state.range(1));
  const int heads = static_cast<int>(state.range(2));
  const DType t = ArgDType(state.range(3));
  std::mt19937 rng(1);
  const size_t elems = static_cast<size_t>(batch) * kKVHeads * ctx * kHeadSize;
  std::vector<uint8_t> key(elems * DTypeSize(t)), value(key.size());
  FillRandom(key, t, rng);
  FillRandom(value, t, rng);
  std::vector<int32_t> lens(batch, ctx);
  std::vector<uint8_t> q(static_cast<size_t>(batch) * heads * kHeadSize * DTypeSize(t)),
      out(q.size());
  FillRandom(q, t, rng);
  cpu::ContiguousDecodeParams p;
  p.out = out.data();
  p.query = q.data();
  p.num_seqs = batch;
  p.num_heads = heads;
  p.num_kv_heads = kKVHeads;
  p.head_size = kHeadSize;
  p.block_size = kBlockSize;
  p.dtype = t;
  p.key = key.data();
  p.value = value.data();
  p.capacity = ctx;
  p.seq_lens = lens.data();
  p.scale = 1.0f / std::sqrt(static_cast<float>(kHeadSize));
  for (auto _ : state) {
    if (!cpu::ContiguousDecodeAttention(p).ok()) state.SkipWithError("contiguous attention failed");
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  SetCounters(state, batch, ctx, t);
}

// memcpy of a 512 MiB buffer: bytes_per_second = bytes copied (each read once
// and written once) / time, on one thread and on all threads (OpenMP).
void BM_MemcpyBandwidth(benchmark::State& state) {
  const size_t bytes = size_t{512} << 20;
  const bool parallel = state.range(0) != 0;
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 2);
  for (auto _ : state) {
    if (parallel) {
#pragma omp parallel
      {
        // Static split of the buffer over the threads.
        const int n = omp_get_num_threads(), i = omp_get_thread_num();
        const size_t chunk = (bytes + n - 1) / n;
        const size_t begin = std::min(bytes, chunk * i), end = std::min(bytes, begin + chunk);
        std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
      }
    } else {
      std::memcpy(dst.data(), src.data(), bytes);
    }
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}

// Batch 8/32/64 x context 1K/4K/16K x 32 or 64 query heads, f32 and f16,
// without the combinations whose K/V would exceed 2 GiB.
void DecodeArgs(benchmark::internal::Benchmark* b) {
  for (int dtype : {0, 1})
    for (int heads : {32, 64})
      for (int batch : {8, 32, 64})
        for (int ctx : {1024, 4096, 16384}) {
          const double bytes = 2.0 * batch * ctx * kKVHeads * kHeadSize * (dtype == 0 ? 4 : 2);
          if (bytes > 2.0 * (1 << 30)) continue;
          b->Args({batch, ctx, heads, dtype});
        }
  b->ArgNames({"batch", "ctx", "heads", "f16"});
  b->Unit(benchmark::kMillisecond);
  b->UseRealTime();
}

BENCHMARK(BM_MemcpyBandwidth)
    ->Arg(0)
    ->Arg(1)
    ->ArgName("parallel")
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_PagedDecode)->Apply(DecodeArgs);
// fp8 e4m3 cache vs fp16 (same f16 queries): batch 8/32 x context 4K/16K, 32 heads.
void Fp8DecodeArgs(benchmark::internal::Benchmark* b) {
  for (int dtype : {1, 2})
    for (int batch : {8, 32})
      for (int ctx : {4096, 16384}) b->Args({batch, ctx, 32, dtype});
  b->ArgNames({"batch", "ctx", "heads", "dtype"});
  b->Unit(benchmark::kMillisecond);
  b->UseRealTime();
}
BENCHMARK(BM_PagedDecode)->Name("BM_PagedDecodeFp8VsF16")->Apply(Fp8DecodeArgs);

// SmolLM2-135M attention shape (see the header comment).
constexpr int kGqaHeads = 9;
constexpr int kGqaKVHeads = 3;
constexpr int kGqaHeadSize = 64;

DType GqaDType(int64_t a) { return a == 3 ? DType::kBFloat16 : DType::kFloat16; }

// Random 16-bit cache or query contents (fp16 or bf16 encodings of U(-1, 1)).
void Fill16(std::vector<uint16_t>& buf, DType t, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (uint16_t& v : buf)
    v = t == DType::kBFloat16 ? FloatToBFloat16Bits(u(rng)) : FloatToHalfBits(u(rng));
}

// A paged cache of `seqs` sequences of `ctx` tokens each, block table shuffled.
struct GqaCache {
  KVCacheShape shape;
  std::vector<uint16_t> key, value;
  std::vector<int32_t> tables;
  int blocks_per_seq = 0;

  GqaCache(int seqs, int ctx, DType t, std::mt19937& rng) {
    blocks_per_seq = (ctx + kBlockSize - 1) / kBlockSize;
    shape.num_blocks = static_cast<int64_t>(seqs) * blocks_per_seq;
    shape.num_kv_heads = kGqaKVHeads;
    shape.head_size = kGqaHeadSize;
    shape.block_size = kBlockSize;
    shape.dtype = t;
    key.resize(shape.num_blocks * shape.block_elems());
    value.resize(key.size());
    Fill16(key, t, rng);
    Fill16(value, t, rng);
    tables.resize(shape.num_blocks);
    std::iota(tables.begin(), tables.end(), 0);
    std::shuffle(tables.begin(), tables.end(), rng);
  }
  KVCacheView view() { return {key.data(), value.data(), shape, Device::kCPU}; }
};

void BM_GqaDecode(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const int ctx = static_cast<int>(state.range(1));
  const DType t = GqaDType(state.range(2));
  std::mt19937 rng(1);
  GqaCache c(batch, ctx, t, rng);
  std::vector<int32_t> lens(batch, ctx);
  std::vector<uint16_t> q(static_cast<size_t>(batch) * kGqaHeads * kGqaHeadSize), out(q.size());
  Fill16(q, t, rng);
  PagedAttentionParams p;
  p.out = out.data();
  p.query = q.data();
  p.num_seqs = batch;
  p.num_heads = kGqaHeads;
  p.cache = c.view();
  p.block_tables = c.tables.data();
  p.max_blocks_per_seq = c.blocks_per_seq;
  p.seq_lens = lens.data();
  p.max_seq_len = ctx;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kGqaHeadSize));
  for (auto _ : state) {
    if (!PagedAttentionV1(p).ok()) state.SkipWithError("paged_attention_v1 failed");
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["tokens"] = static_cast<double>(batch) * ctx;
  state.SetLabel(cpu::AttendIsaName());
}
BENCHMARK(BM_GqaDecode)
    ->ArgsProduct({{32}, {128, 512, 2048}, {1, 3}})
    ->ArgNames({"batch", "ctx", "dtype"})
    ->Unit(benchmark::kMicrosecond);

void BM_GqaPrefill(benchmark::State& state) {
  const int ctx = static_cast<int>(state.range(0));
  const int q_len = static_cast<int>(state.range(1));
  const DType t = GqaDType(state.range(2));
  std::mt19937 rng(1);
  GqaCache c(1, ctx, t, rng);
  const int32_t qsl[2] = {0, q_len};
  const int32_t len = ctx;
  std::vector<uint16_t> q(static_cast<size_t>(q_len) * kGqaHeads * kGqaHeadSize), out(q.size());
  Fill16(q, t, rng);
  PrefillAttentionParams p;
  p.out = out.data();
  p.query = q.data();
  p.num_seqs = 1;
  p.num_heads = kGqaHeads;
  p.query_start_loc = qsl;
  p.seq_lens = &len;
  p.cache = c.view();
  p.block_tables = c.tables.data();
  p.max_blocks_per_seq = c.blocks_per_seq;
  p.max_query_len = q_len;
  p.max_seq_len = ctx;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kGqaHeadSize));
  for (auto _ : state) {
    if (!PrefillAttention(p).ok()) state.SkipWithError("prefill attention failed");
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(cpu::AttendIsaName());
}
BENCHMARK(BM_GqaPrefill)
    ->Args({512, 512, 1})
    ->Args({1024, 256, 1})
    ->Args({512, 512, 3})
    ->ArgNames({"ctx", "q_len", "dtype"})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_ContiguousDecode)->Apply(DecodeArgs);

}  // namespace
}  // namespace pagedserve::kernels

BENCHMARK_MAIN();
