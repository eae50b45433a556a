// GPU decode-attention benchmark (CUDA-event timed; run by scripts/gpu-check).
//
// Shapes: batch 8/32/64 x context 1K/4K/16K x heads 32q/32kv (MHA), 32q/8kv
// and 64q/8kv (GQA), head size 128, block size 16, KV cache and queries in fp16
// and in bf16 (--quick: batch 8/64 x context 1K/4K). For each shape it times
//   paged      PagedAttention (the kernel ChooseDecodeKernel picks: GQA for
//              the grouped shapes, v1 or v2 for MHA) over a cache whose block
//              tables are a random permutation of the pool,
//   v1, v2     both vLLM variants explicitly on the same cache,
//   gqa        the GQA decode kernel explicitly, with a workspace of
//              PagedAttentionGqaWorkspaceBytes (so it splits as the occupancy
//              planner wants),
//   gqa_mma    its tensor-core variant (PagedAttentionGqaMma, taken by
//              PagedAttention only on request), same workspace; -1 where the
//              shape does not fit it,
//   contiguous the same kernel with identity block tables (each sequence's
//              blocks back to back), the contiguous-KV baseline of the math,
// and reports KV bytes read per second (K and V of every context token once)
// as a percentage of the device's copy bandwidth measured here with
// cudaMemcpy device-to-device (bytes read + bytes written per second, i.e. the
// DRAM traffic a copy sustains).
//
// Prefill attention (compute-bound): 4 prompts of 512 and 2048 new tokens
// (--quick: 2048), 32q/8kv, head 128, fp16 and bf16, the SIMT kernel and the
// tensor-core one (PrefillKernel::kSimt / kMma), reported as causal-attention
// TFLOP/s (4 * head_size * heads * sum over rows of the keys each row sees)
// and the mma/simt speed-up.
//
//   paged_attention_cuda_bench [--json PATH] [--quick] [--exclude V1,V2,...]
//   paged_attention_cuda_bench --probe
//
// Variants (--exclude names): paged, v1, v2, gqa, gqa_mma, contiguous,
// prefill_simt, prefill_mma. Each is isolated: one the library refuses (a
// non-OK status) is recorded in its record's "errors" with time -1 and the
// others run; an excluded one is -1 without an error. Before each variant
// the JSON is rewritten with "running": "VARIANT SHAPE", so a run that dies
// inside one (a device fault) names it, and scripts/gpu-check runs the
// benchmark again with that variant excluded.
//
// --probe (scripts/gpu-check): prints one line naming the device and exits 0,
// or prints "no usable CUDA device: REASON" and exits 3.
//
// The JSON holds the device, the copy bandwidth and one record per shape
// (batch, context, heads, kv_heads, attention "MHA"/"GQA", dtype, the times,
// pct_of_copy_bw of the paged run and gqa_mma_pct_of_copy_bw of the
// tensor-core run), and "prefill": one record per prefill shape (batch,
// prompt, heads, kv_heads, dtype, simt_ms, mma_ms, simt_tflops, mma_tflops,
// mma_speedup). It is rewritten (PATH.tmp, renamed) after every shape, with
// "partial": true until the last one (and "running" while a variant runs): a
// run cut off keeps what it measured.
//
// Without a usable device it prints the reason, writes {"skipped": reason} to
// the JSON path and exits 0.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/half.h"
#include "kernels/cuda_device.h"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"

namespace pk = pagedserve::kernels;

namespace {

#define CHECK_CUDA(expr)                                                                         \
  do {                                                                                           \
    cudaError_t e_ = (expr);                                                                     \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

void* DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, bytes));
  return p;
}

// Fills `bytes` of device memory with fp16 or bf16 values uniform in [-1, 1]
// by replicating one random 32 MiB tile.
void FillRandom16(void* dst, size_t bytes, pk::DType dtype, std::mt19937& rng) {
  const size_t tile = std::min<size_t>(bytes, 32u << 20);
  std::vector<uint16_t> h(tile / 2);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : h)
    x = dtype == pk::DType::kBFloat16 ? pk::FloatToBFloat16Bits(u(rng))
                                      : pk::FloatToHalfBits(u(rng));
  CHECK_CUDA(cudaMemcpy(dst, h.data(), tile, cudaMemcpyHostToDevice));
  for (size_t off = tile; off < bytes; off += tile)
    CHECK_CUDA(cudaMemcpy(static_cast<char*>(dst) + off, dst, std::min(tile, bytes - off),
                          cudaMemcpyDeviceToDevice));
}

// Copy bandwidth in bytes/s (read + write), best of several 1 GiB copies.
double MeasureCopyBandwidth() {
  const size_t bytes = 1ull << 30;
  void* a = DeviceAlloc(bytes);
  void* b = DeviceAlloc(bytes);
  CHECK_CUDA(cudaMemset(a, 1, bytes));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  CHECK_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));  // warm-up
  float best = 1e30f;
  for (int i = 0; i < 10; ++i) {
    CHECK_CUDA(cudaEventRecord(e0));
    CHECK_CUDA(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    best = std::min(best, ms);
  }
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  CHECK_CUDA(cudaFree(a));
  CHECK_CUDA(cudaFree(b));
  return 2.0 * bytes / (best * 1e-3);
}

struct Shape {
  int batch, context, heads, kv_heads;
  pk::DType dtype;
};

enum class Variant { kAuto, kV1, kV2, kGqa, kGqaMma };

// JSON string literal of s.
std::string JsonString(const std::string& s) {
  std::string r = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      r += '\\';
      r += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      r += ' ';
    } else {
      r += c;
    }
  }
  return r + "\"";
}

// The variants a run skips (--exclude), the one running now and the errors
// of the current record; flush() rewrites the JSON (with "running").
struct RunState {
  std::vector<std::string> excluded;
  std::string running;
  std::vector<std::string> errors;
  std::function<void()> flush;
  bool Excluded(const std::string& v) const {
    return std::find(excluded.begin(), excluded.end(), v) != excluded.end();
  }
  // "errors": [...] of the current record, then cleared.
  std::string TakeErrors() {
    std::string r = "[";
    for (size_t i = 0; i < errors.size(); ++i) r += (i ? ", " : "") + JsonString(errors[i]);
    errors.clear();
    return r + "]";
  }
};

// Median time in ms (CUDA events) of `iters` calls of run() after `warmup`.
template <typename Fn>
float MedianMs(Fn run, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) run();
  CHECK_CUDA(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<float> times;
  for (int i = 0; i < iters; ++i) {
    CHECK_CUDA(cudaEventRecord(e0));
    run();
    CHECK_CUDA(cudaEventRecord(e1));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    times.push_back(ms);
  }
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Variant `name` at `where` timed by MedianMs over `call` (returning an
// absl::Status): -1 when excluded, or when the first call is refused (the
// status goes to st.errors). The JSON names the variant while it runs.
template <typename Call>
float TimeVariant(RunState& st, const std::string& name, const std::string& where, Call call,
                  int warmup, int iters) {
  if (st.Excluded(name)) return -1.0f;
  st.running = name + " " + where;
  st.flush();
  float ms = -1.0f;
  const absl::Status first = call();
  if (!first.ok()) {
    std::fprintf(stderr, "%s %s refused: %s\n", name.c_str(), where.c_str(),
                 first.ToString().c_str());
    st.errors.push_back(name + ": " + first.ToString());
  } else {
    ms = MedianMs(
        [&] {
          const absl::Status s = call();
          if (!s.ok()) {  // accepted once, refused now: nothing to isolate
            std::fprintf(stderr, "%s %s failed: %s\n", name.c_str(), where.c_str(),
                         s.ToString().c_str());
            std::exit(1);
          }
        },
        warmup, iters);
  }
  st.running.clear();
  return ms;
}

// Median time in ms of `iters` decode runs of variant v after warm-up.
float TimeDecode(RunState& st, const std::string& name, const std::string& where,
                 const pk::PagedAttentionParams& p, Variant v, int iters) {
  return TimeVariant(
      st, name, where,
      [&] {
        return v == Variant::kAuto  ? pk::PagedAttention(p)
               : v == Variant::kV1  ? pk::PagedAttentionV1(p)
               : v == Variant::kV2  ? pk::PagedAttentionV2(p)
               : v == Variant::kGqa ? pk::PagedAttentionGqa(p)
                                    : pk::PagedAttentionGqaMma(p);
      },
      3, iters);
}

struct Options {
  std::string json_path;
  bool quick = false, probe = false;
  std::vector<std::string> exclude;
};

// False (after printing the usage) on an unknown argument.
bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      o->json_path = argv[++i];
    } else if (std::strcmp(argv[i], "--quick") == 0) {
      o->quick = true;
    } else if (std::strcmp(argv[i], "--probe") == 0) {
      o->probe = true;
    } else if (std::strcmp(argv[i], "--exclude") == 0 && i + 1 < argc) {
      std::string list = argv[++i];
      for (size_t b = 0, e; b <= list.size(); b = e + 1) {
        e = list.find(',', b);
        if (e == std::string::npos) e = list.size();
        if (e > b) o->exclude.push_back(list.substr(b, e - b));
      }
    } else {
      std::fprintf(stderr, "usage: %s [--json PATH] [--quick] [--exclude V,...] | --probe\n",
                   argv[0]);
      return false;
    }
  }
  return true;
}

// --probe: one line naming the device (exit 0), or the reason there is none (exit 3).
int Probe() {
  std::string reason;
  if (!pk::CudaDeviceAvailable(&reason)) {
    std::printf("no usable CUDA device: %s\n", reason.c_str());
    return 3;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  CHECK_CUDA(cudaDriverGetVersion(&driver));
  CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
  std::printf("%s (sm_%d%d, %d SMs, %.1f GiB), driver API %d, runtime %d\n", prop.name, prop.major,
              prop.minor, prop.multiProcessorCount, prop.totalGlobalMem / 1073741824.0, driver,
              runtime);
  return 0;
}

constexpr int kHeadSize = 128, kBlockSize = 16;

// Every dtype x (heads, kv_heads) x batch x context (--quick: fewer batches and contexts).
std::vector<Shape> ListShapes(bool quick) {
  std::vector<Shape> shapes;
  const std::vector<int> batches = quick ? std::vector<int>{8, 64} : std::vector<int>{8, 32, 64};
  const std::vector<int> contexts =
      quick ? std::vector<int>{1024, 4096} : std::vector<int>{1024, 4096, 16384};
  for (pk::DType dtype : {pk::DType::kFloat16, pk::DType::kBFloat16})
    for (auto [heads, kv_heads] : {std::pair{32, 32}, std::pair{32, 8}, std::pair{64, 8}})
      for (int batch : batches)
        for (int ctx : contexts) shapes.push_back({batch, ctx, heads, kv_heads, dtype});
  return shapes;
}

// The device buffers of one shape: a random cache and queries, paged (a random
// permutation of the pool) and contiguous (identity) block tables, the
// context lengths and a workspace for v2 and GQA. Freed by the destructor.
struct ShapeBuffers {
  ShapeBuffers(const Shape& s, std::mt19937& rng) {
    blocks_per_seq = s.context / kBlockSize;
    const int64_t num_blocks = static_cast<int64_t>(s.batch) * blocks_per_seq;
    cache_shape = {num_blocks, s.kv_heads, kHeadSize, kBlockSize, s.dtype};
    const size_t cache_bytes = num_blocks * cache_shape.block_bytes();
    kc = DeviceAlloc(cache_bytes);
    vc = DeviceAlloc(cache_bytes);
    FillRandom16(kc, cache_bytes, s.dtype, rng);
    FillRandom16(vc, cache_bytes, s.dtype, rng);
    const size_t q_bytes = static_cast<size_t>(s.batch) * s.heads * kHeadSize * 2;
    q = DeviceAlloc(q_bytes);
    out = DeviceAlloc(q_bytes);
    FillRandom16(q, q_bytes, s.dtype, rng);
    perm.resize(num_blocks);
    ident.resize(num_blocks);
    std::iota(ident.begin(), ident.end(), 0);
    perm = ident;
    std::shuffle(perm.begin(), perm.end(), rng);
    lens.assign(s.batch, s.context);
    bt_paged = DeviceAlloc(num_blocks * 4);
    bt_contig = DeviceAlloc(num_blocks * 4);
    dlens = DeviceAlloc(lens.size() * sizeof(int32_t));
    CHECK_CUDA(cudaMemcpy(bt_paged, perm.data(), num_blocks * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(bt_contig, ident.data(), num_blocks * 4, cudaMemcpyHostToDevice));
    CHECK_CUDA(
        cudaMemcpy(dlens, lens.data(), lens.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
    ws_bytes =
        std::max(pk::PagedAttentionV2WorkspaceBytes(s.batch, s.heads, kHeadSize, s.context),
                 pk::PagedAttentionGqaWorkspaceBytes(s.batch, s.heads, kHeadSize, s.context));
    ws = DeviceAlloc(ws_bytes);
  }
  ~ShapeBuffers() {
    for (void* ptr : {kc, vc, q, out, bt_paged, bt_contig, dlens, ws}) CHECK_CUDA(cudaFree(ptr));
  }
  ShapeBuffers(const ShapeBuffers&) = delete;
  ShapeBuffers& operator=(const ShapeBuffers&) = delete;

  // Decode parameters over the paged block tables.
  pk::PagedAttentionParams Params(const Shape& s) const {
    pk::PagedAttentionParams p;
    p.out = out;
    p.query = q;
    p.num_seqs = s.batch;
    p.num_heads = s.heads;
    p.cache = {kc, vc, cache_shape, pk::Device::kCUDA};
    p.block_tables = static_cast<const int32_t*>(bt_paged);
    p.max_blocks_per_seq = blocks_per_seq;
    p.seq_lens = static_cast<const int32_t*>(dlens);
    p.max_seq_len = s.context;
    p.scale = 1.0f / std::sqrt(static_cast<float>(kHeadSize));
    p.host_block_tables = perm.data();
    p.host_seq_lens = lens.data();
    p.workspace = ws;
    p.workspace_bytes = ws_bytes;
    return p;
  }

  int blocks_per_seq = 0;
  pk::KVCacheShape cache_shape{};
  void *kc = nullptr, *vc = nullptr, *q = nullptr, *out = nullptr;
  std::vector<int32_t> perm, ident, lens;
  void *bt_paged = nullptr, *bt_contig = nullptr, *dlens = nullptr, *ws = nullptr;
  size_t ws_bytes = 0;
};

// Median times (ms) of one shape and the bandwidth of the paged run.
struct ShapeTimes {
  float paged, v1, v2, gqa, gqa_mma, contig;
  double kv_bytes, kv_bps;
};

std::string ShapeName(const Shape& s) {
  return std::string(pk::DTypeName(s.dtype)) + " batch " + std::to_string(s.batch) + " context " +
         std::to_string(s.context) + " " + std::to_string(s.heads) + "/" +
         std::to_string(s.kv_heads);
}

ShapeTimes TimeShape(const Shape& s, const ShapeBuffers& b, RunState& st) {
  const int iters = 20;
  const std::string where = ShapeName(s);
  pk::PagedAttentionParams p = b.Params(s);
  ShapeTimes t{};
  t.paged = TimeDecode(st, "paged", where, p, Variant::kAuto, iters);
  t.v1 = TimeDecode(st, "v1", where, p, Variant::kV1, iters);
  t.v2 = TimeDecode(st, "v2", where, p, Variant::kV2, iters);
  t.gqa = TimeDecode(st, "gqa", where, p, Variant::kGqa, iters);
  t.gqa_mma = pk::GqaMmaFits(s.dtype, kHeadSize, s.heads / s.kv_heads)
                  ? TimeDecode(st, "gqa_mma", where, p, Variant::kGqaMma, iters)
                  : -1.0f;
  p.block_tables = static_cast<const int32_t*>(b.bt_contig);
  p.host_block_tables = b.ident.data();
  t.contig = TimeDecode(st, "contiguous", where, p, Variant::kAuto, iters);
  t.kv_bytes = 2.0 * static_cast<double>(s.batch) * s.context * s.kv_heads * kHeadSize * 2;
  t.kv_bps = t.paged > 0 ? t.kv_bytes / (t.paged * 1e-3) : 0.0;  // 0: paged did not run
  return t;
}

// One table row on stdout; returns the shape's JSON record.
std::string Report(const Shape& s, const ShapeTimes& t, double copy_bw, RunState& st) {
  const char* variant = pk::DecodeKernelName(
      pk::ChooseDecodeKernel(pk::Device::kCUDA, s.batch, s.heads, s.kv_heads, kHeadSize, s.context)
          .kernel);
  const char* dtype = pk::DTypeName(s.dtype);
  const char* attention = s.heads == s.kv_heads ? "MHA" : "GQA";
  const double bw = t.kv_bps;
  const double pct = t.paged > 0 ? 100.0 * bw / copy_bw : -1;  // -1: paged did not run
  std::printf(
      "%-5s %-6d %-7d %2d/%-4d %-8s | %-9.4f %-9.1f %-7.1f | %-9.4f %-9.4f %-9.4f %-9.4f %-9.4f | "
      "%.3f\n",
      dtype, s.batch, s.context, s.heads, s.kv_heads, variant, t.paged, bw / 1e9, pct, t.v1, t.v2,
      t.gqa, t.gqa_mma, t.contig, t.paged > 0 && t.contig > 0 ? t.paged / t.contig : -1.0f);
  const double mma_pct = t.gqa_mma > 0 ? 100.0 * (t.kv_bytes / (t.gqa_mma * 1e-3)) / copy_bw : -1;
  char buf[768];
  std::snprintf(buf, sizeof(buf),
                "    {\"batch\": %d, \"context\": %d, \"heads\": %d, \"kv_heads\": %d, "
                "\"attention\": \"%s\", \"head_size\": %d, \"block_size\": %d, \"dtype\": \"%s\", "
                "\"variant\": \"%s\", "
                "\"paged_ms\": %.5f, \"v1_ms\": %.5f, \"v2_ms\": %.5f, \"gqa_ms\": %.5f, "
                "\"gqa_mma_ms\": %.5f, \"contiguous_ms\": %.5f, "
                "\"kv_bytes\": %.0f, \"kv_GBps\": %.2f, \"pct_of_copy_bw\": %.2f, "
                "\"gqa_mma_pct_of_copy_bw\": %.2f",
                s.batch, s.context, s.heads, s.kv_heads, attention, kHeadSize, kBlockSize, dtype,
                variant, t.paged, t.v1, t.v2, t.gqa, t.gqa_mma, t.contig, t.kv_bytes, bw / 1e9, pct,
                mma_pct);
  return buf + (", \"errors\": " + st.TakeErrors() + "}");
}

// Median time in ms of `iters` prefill runs after warm-up (-1: see TimeVariant).
float TimePrefill(RunState& st, const std::string& name, const std::string& where,
                  const pk::PrefillAttentionParams& p, int iters) {
  return TimeVariant(
      st, name, where, [&] { return pk::PrefillAttention(p); }, 2, iters);
}

// Prefill of `batch` fresh prompts of `prompt` tokens (32q/8kv, head 128)
// with both kernels; prints a row and returns the JSON record.
std::string PrefillShape(int batch, int prompt, pk::DType dtype, std::mt19937& rng, RunState& st) {
  const Shape s{batch, prompt, 32, 8, dtype};
  const ShapeBuffers b(s, rng);  // cache, block tables and lengths (= prompt)
  const int64_t tokens = static_cast<int64_t>(batch) * prompt;
  const size_t q_bytes = static_cast<size_t>(tokens) * s.heads * kHeadSize * 2;
  void* q = DeviceAlloc(q_bytes);
  void* out = DeviceAlloc(q_bytes);
  FillRandom16(q, q_bytes, dtype, rng);
  std::vector<int32_t> qsl(batch + 1);
  for (int i = 0; i <= batch; ++i) qsl[i] = i * prompt;
  void* dqsl = DeviceAlloc(qsl.size() * sizeof(int32_t));
  CHECK_CUDA(cudaMemcpy(dqsl, qsl.data(), qsl.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
  pk::PrefillAttentionParams p;
  p.out = out;
  p.query = q;
  p.num_seqs = batch;
  p.num_heads = s.heads;
  p.query_start_loc = static_cast<const int32_t*>(dqsl);
  p.seq_lens = static_cast<const int32_t*>(b.dlens);
  p.cache = {b.kc, b.vc, b.cache_shape, pk::Device::kCUDA};
  p.block_tables = static_cast<const int32_t*>(b.bt_paged);
  p.max_blocks_per_seq = b.blocks_per_seq;
  p.max_query_len = prompt;
  p.max_seq_len = prompt;
  p.scale = 1.0f / std::sqrt(static_cast<float>(kHeadSize));
  p.host_query_start_loc = qsl.data();
  p.host_seq_lens = b.lens.data();
  p.host_block_tables = b.perm.data();
  const int iters = 10;
  p.kernel = pk::PrefillKernel::kSimt;
  const std::string where = std::string(pk::DTypeName(dtype)) + " batch " + std::to_string(batch) +
                            " prompt " + std::to_string(prompt) + " 32/8";
  const float simt = TimePrefill(st, "prefill_simt", where, p, iters);
  p.kernel = pk::PrefillKernel::kMma;
  const float mma = TimePrefill(st, "prefill_mma", where, p, iters);
  for (void* ptr : {q, out, dqsl}) CHECK_CUDA(cudaFree(ptr));
  // Row i of a prompt sees i + 1 keys: QK^T and PV, 2 flops per multiply-add.
  const double flops = 4.0 * kHeadSize * s.heads * batch * (prompt * (prompt + 1.0) / 2.0);
  // -1 for a variant that did not run.
  const auto tflops = [&](float ms) { return ms > 0 ? flops / (ms * 1e-3) / 1e12 : -1.0; };
  const double simt_tf = tflops(simt), mma_tf = tflops(mma);
  const double speedup = simt > 0 && mma > 0 ? simt / mma : -1.0;
  std::printf(
      "prefill %-5s batch %d prompt %-5d 32/8 | simt %.4f ms (%.1f TFLOP/s) | mma %.4f ms "
      "(%.1f TFLOP/s) | mma/simt speed-up %.2f\n",
      pk::DTypeName(dtype), batch, prompt, simt, simt_tf, mma, mma_tf, speedup);
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "    {\"batch\": %d, \"prompt\": %d, \"heads\": %d, \"kv_heads\": %d, "
                "\"head_size\": %d, \"dtype\": \"%s\", \"simt_ms\": %.5f, \"mma_ms\": %.5f, "
                "\"simt_tflops\": %.2f, \"mma_tflops\": %.2f, \"mma_speedup\": %.3f",
                batch, prompt, s.heads, s.kv_heads, kHeadSize, pk::DTypeName(dtype), simt, mma,
                simt_tf, mma_tf, speedup);
  return buf + (", \"errors\": " + st.TakeErrors() + "}");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (!ParseArgs(argc, argv, &o)) return 2;
  if (o.probe) return Probe();
  std::string reason;
  if (!pk::CudaDeviceAvailable(&reason)) {
    std::printf("paged_attention_cuda_bench: skipped (%s)\n", reason.c_str());
    if (!o.json_path.empty()) {
      std::ofstream(o.json_path) << "{\"skipped\": " << JsonString(reason) << "}\n";
    }
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const double copy_bw = MeasureCopyBandwidth();
  std::printf("device: %s (sm_%d%d), measured DtoD copy bandwidth %.1f GB/s (read+write)\n",
              prop.name, prop.major, prop.minor, copy_bw / 1e9);

  std::mt19937 rng(42);
  std::string json = "{\n  \"device\": \"" + std::string(prop.name) +
                     "\",\n  \"copy_bandwidth_GBps\": " + std::to_string(copy_bw / 1e9) +
                     ",\n  \"results\": [\n";
  std::printf("%-5s %-6s %-7s %-7s %-8s | %-9s %-9s %-7s | %-9s %-9s %-9s %-9s %-9s | %s\n",
              "dtype", "batch", "context", "heads", "variant", "paged ms", "KV GB/s", "% copy",
              "v1 ms", "v2 ms", "gqa ms", "mma ms", "contig ms", "paged/contig");
  // The JSON so far, closed by `tail` (and "running" while a variant runs),
  // written to PATH.tmp and renamed before every variant and after every
  // shape: a run cut off (scripts/gpu-check's deadline) or dying in a later
  // variant keeps the shapes it finished ("partial": true until the end).
  std::string tail = "\n  ],\n  \"prefill\": [],\n  \"partial\": true\n}\n";
  RunState st;
  st.excluded = o.exclude;
  st.flush = [&] {
    if (o.json_path.empty()) return;
    const std::string tmp = o.json_path + ".tmp";
    {
      std::ofstream f(tmp);
      f << json;
      if (!st.running.empty()) {
        // "running" goes before the closing of the open list: after it.
        const size_t close = tail.find(']');
        f << tail.substr(0, close + 1) << ",\n  \"running\": " << JsonString(st.running)
          << tail.substr(close + 1);
      } else {
        f << tail;
      }
    }
    std::rename(tmp.c_str(), o.json_path.c_str());
  };
  bool first = true;
  for (const Shape& s : ListShapes(o.quick)) {
    const ShapeBuffers buffers(s, rng);
    const ShapeTimes times = TimeShape(s, buffers, st);
    json += (first ? "" : ",\n") + Report(s, times, copy_bw, st);
    first = false;
    st.flush();
  }
  json += "\n  ],\n  \"prefill\": [\n";
  tail = "\n  ],\n  \"partial\": true\n}\n";
  first = true;
  for (pk::DType dtype : {pk::DType::kFloat16, pk::DType::kBFloat16})
    for (int prompt : o.quick ? std::vector<int>{2048} : std::vector<int>{512, 2048}) {
      json += (first ? "" : ",\n") + PrefillShape(4, prompt, dtype, rng, st);
      first = false;
      st.flush();
    }
  json += "\n  ]\n}\n";
  tail.clear();
  st.flush();
  return 0;
}
