// Runs the GQA decode kernel source (kernels/cuda/gqa_decode_kernels.cuh, and
// the v2 reduce it shares) on the CPU through tests/kernels/simt_emulator.h and
// compares it with the double-precision reference (reference_attention.h) and
// with the CPU backend's v1 on the same paged cache, under the attention
// standard of attention_check.h. Shapes: 32q/8kv head 128, 14q/2kv and 9q/3kv
// head 64 (SmolLM2-like), group sizes 1, 2, 4, 8 (and 3, 7), all three
// dtypes, contexts across tile (32), block and split edges up to a few
// thousand tokens, a single pass and several split plans. Unused cache slots
// and one never-written "poison" block (the target of every unused block-table
// entry) hold NaN, so any read outside the context shows up.
//
// Negative controls, on each case's own data: the standard rejects a zeroed
// output, the same kernel run with one 32-token tile of the context left out,
// and the kernel run with the wrong GQA group mapping (query head h on KV head
// h % num_kv_heads instead of h / group_size, the repeat-vs-repeat_interleave
// mistake).
#include "tests/kernels/simt_emulator.h"  // must precede the kernel headers

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/half.h"
#include "kernels/cuda/gqa_decode_kernels.cuh"
#include "kernels/cuda/gqa_decode_mma_kernels.cuh"
#include "kernels/cuda/gqa_decode_plan.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/paged_attention_kernels.cuh"
#include "kernels/paged_attention.h"
#include "kernels/reshape_and_cache.h"
#include "kernels/types.h"
#include "tests/kernels/attention_check.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/kernels/reference_attention.h"

namespace pagedserve::kernels {
namespace {

namespace kc = ::pagedserve::kernels::cuda;
using testing::GatheredKV;

using testing::Decode;
using testing::Encode;

std::vector<float> RandomRounded(size_t n, DType t, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  std::vector<uint8_t> e = Encode(v, t);
  return Decode(e.data(), n, t);
}

// One decode problem over a host paged cache written by the CPU backend's
// reshape_and_cache (whose bytes kernels_cuda_emulation_test checks against
// the emulated CUDA reshape_and_cache).
struct Case {
  DType dtype;
  int num_heads, num_kv_heads, head_size, block_size;
  std::vector<int> seq_lens;
  int max_blocks_per_seq = 0;
  int64_t num_blocks = 0;
  int32_t poison_block = 0;                          // never written: all NaN
  std::vector<std::vector<float>> keys{}, values{};  // gathered [len, kv_heads, head_size]
  std::vector<int32_t> block_tables{};               // unused entries -> poison_block
  std::vector<uint8_t> key_cache{}, value_cache{};
  std::vector<float> q{};  // [S, H, D], rounded to dtype
  KVCacheShape shape{};
  int num_seqs() const { return static_cast<int>(seq_lens.size()); }
  int max_len() const { return *std::max_element(seq_lens.begin(), seq_lens.end()); }
  GatheredKV K(int s) const { return {keys[s].data(), num_kv_heads, head_size}; }
  GatheredKV V(int s) const { return {values[s].data(), num_kv_heads, head_size}; }
};

void Build(Case& c, std::mt19937& rng) {
  const int bs = c.block_size;
  c.max_blocks_per_seq = (c.max_len() + bs - 1) / bs + 1;
  int64_t used = 0;
  for (int len : c.seq_lens) used += (len + bs - 1) / bs;
  c.num_blocks = used + 1;
  std::vector<int32_t> perm(c.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  c.poison_block = perm.back();
  c.block_tables.assign(static_cast<size_t>(c.num_seqs()) * c.max_blocks_per_seq, c.poison_block);
  const size_t row = static_cast<size_t>(c.num_kv_heads) * c.head_size;
  std::vector<float> all_k, all_v;
  std::vector<int64_t> slots;
  int64_t next = 0;
  for (int s = 0; s < c.num_seqs(); ++s) {
    const int len = c.seq_lens[s];
    int32_t* table = c.block_tables.data() + static_cast<size_t>(s) * c.max_blocks_per_seq;
    for (int i = 0; i < (len + bs - 1) / bs; ++i) table[i] = perm[next++];
    c.keys.push_back(RandomRounded(len * row, c.dtype, rng));
    c.values.push_back(RandomRounded(len * row, c.dtype, rng));
    all_k.insert(all_k.end(), c.keys.back().begin(), c.keys.back().end());
    all_v.insert(all_v.end(), c.values.back().begin(), c.values.back().end());
    for (int t = 0; t < len; ++t)
      slots.push_back(static_cast<int64_t>(table[t / bs]) * bs + t % bs);
  }
  c.shape = {c.num_blocks, c.num_kv_heads, c.head_size, c.block_size, c.dtype};
  const size_t bytes = c.num_blocks * c.shape.block_bytes();
  c.key_cache.assign(bytes, 0xFF);  // NaN in every dtype
  c.value_cache.assign(bytes, 0xFF);
  std::vector<uint8_t> ek = Encode(all_k, c.dtype), ev = Encode(all_v, c.dtype);
  ReshapeAndCacheParams p;
  p.key = ek.data();
  p.value = ev.data();
  p.slot_mapping = slots.data();
  p.num_tokens = static_cast<int>(slots.size());
  p.cache = {c.key_cache.data(), c.value_cache.data(), c.shape, Device::kCPU};
  ASSERT_TRUE(ReshapeAndCache(p).ok());
  c.q = RandomRounded(static_cast<size_t>(c.num_seqs()) * c.num_heads * c.head_size, c.dtype, rng);
}

// Which GQA kernel EmuGqa runs: the fp32-FMA one or the tensor-core one.
enum class Variant { kFma, kMma };

// The emulated GQA kernel (+ the v2 reduce for several splits) on case c with
// queries q; returns the output as floats. Scratch starts as NaN.
template <typename T, int HS>
std::vector<float> EmuGqa(const Case& c, const std::vector<float>& q, const float* alibi,
                          float scale, const kc::GqaSplitPlan& plan, Variant v = Variant::kFma) {
  const int S = c.num_seqs(), H = c.num_heads, G = H / c.num_kv_heads;
  std::vector<int32_t> lens(c.seq_lens.begin(), c.seq_lens.end());
  const std::vector<uint8_t> eq = Encode(q, c.dtype);
  std::vector<uint8_t> out(static_cast<size_t>(S) * H * HS * DTypeSize(c.dtype), 0xFF);
  const size_t rows = static_cast<size_t>(S) * H * plan.num_splits;
  std::vector<float> ml(rows, NAN), es(rows, NAN), tmp(rows * HS, NAN);
  const bool split = plan.num_splits > 1;
  const dim3 grid(c.num_kv_heads, S, plan.num_splits);
  if constexpr (sizeof(T) == 2) {
    if (v == Variant::kMma) {
      kc::EmuLaunch(grid, dim3(kc::kDecodeThreads), kc::GqaMmaSharedBytes(HS), [&] {
        kc::GqaDecodeMmaKernel<T, HS, kc::kDecodeThreads>(
            reinterpret_cast<T*>(out.data()), split ? ml.data() : nullptr,
            split ? es.data() : nullptr, split ? tmp.data() : nullptr,
            reinterpret_cast<const T*>(eq.data()), reinterpret_cast<const T*>(c.key_cache.data()),
            reinterpret_cast<const T*>(c.value_cache.data()), c.num_kv_heads, G, c.block_size,
            scale, c.block_tables.data(), c.max_blocks_per_seq, lens.data(), alibi,
            plan.split_tokens);
      });
    }
  }
  if (v == Variant::kFma) {
    kc::EmuLaunch(grid, dim3(kc::kDecodeThreads), kc::GqaDecodeSharedBytes(HS, G, sizeof(T)), [&] {
      kc::GqaDecodeKernel<T, T, HS, kc::kDecodeThreads>(
          reinterpret_cast<T*>(out.data()), split ? ml.data() : nullptr,
          split ? es.data() : nullptr, split ? tmp.data() : nullptr,
          reinterpret_cast<const T*>(eq.data()), reinterpret_cast<const T*>(c.key_cache.data()),
          reinterpret_cast<const T*>(c.value_cache.data()), c.num_kv_heads, G, c.block_size, scale,
          c.block_tables.data(), c.max_blocks_per_seq, lens.data(), alibi, plan.split_tokens);
    });
  }
  if (split) {
    kc::EmuLaunch(dim3(H, S), dim3(kc::kDecodeThreads), plan.num_splits * sizeof(float), [&] {
      kc::PagedAttentionReduceKernel<T, kc::kDecodeThreads>(
          reinterpret_cast<T*>(out.data()), ml.data(), es.data(), tmp.data(), lens.data(), HS,
          plan.num_splits, plan.split_tokens);
    });
  }
  return Decode(out.data(), static_cast<size_t>(S) * H * HS, c.dtype);
}

// The CPU backend's v1 on the same cache.
std::vector<float> CpuV1(Case& c, const float* alibi, float scale) {
  const int S = c.num_seqs();
  std::vector<uint8_t> eq = Encode(c.q, c.dtype);
  std::vector<uint8_t> out(static_cast<size_t>(S) * c.num_heads * c.head_size * DTypeSize(c.dtype));
  std::vector<int32_t> lens(c.seq_lens.begin(), c.seq_lens.end());
  PagedAttentionParams p;
  p.out = out.data();
  p.query = eq.data();
  p.num_seqs = S;
  p.num_heads = c.num_heads;
  p.cache = {c.key_cache.data(), c.value_cache.data(), c.shape, Device::kCPU};
  p.block_tables = c.block_tables.data();
  p.max_blocks_per_seq = c.max_blocks_per_seq;
  p.seq_lens = lens.data();
  p.max_seq_len = c.max_len();
  p.scale = scale;
  p.alibi_slopes = alibi;
  const absl::Status st = PagedAttentionV1(p);
  EXPECT_TRUE(st.ok()) << st;
  return Decode(out.data(), static_cast<size_t>(S) * c.num_heads * c.head_size, c.dtype);
}

std::vector<float> AlibiSlopes(int n) {
  std::vector<float> s(n);
  for (int h = 0; h < n; ++h) s[h] = std::pow(2.0f, -8.0f * (h + 1) / n);
  return s;
}

// The plans a case runs: one pass; the plan for an H200 (132 SMs x 4 blocks)
// and for a small 8-SM device (other split edges); and 4-tile splits.
std::vector<kc::GqaSplitPlan> PlansFor(const Case& c) {
  std::vector<kc::GqaSplitPlan> plans = {{1, 0}};
  auto add = [&](kc::GqaSplitPlan p) {
    for (const auto& q : plans)
      if (q.num_splits == p.num_splits && q.split_tokens == p.split_tokens) return;
    plans.push_back(p);
  };
  add(kc::PlanGqaSplits(132, 4, c.num_seqs(), c.num_kv_heads, c.max_len(), kc::kGqaMaxSplits));
  add(kc::PlanGqaSplits(8, 1, c.num_seqs(), c.num_kv_heads, c.max_len(), kc::kGqaMaxSplits));
  const int fine = 4 * kc::kGqaTileTokens;
  const int n = (c.max_len() + fine - 1) / fine;
  if (n > 1 && n <= kc::kGqaMaxSplits) add({n, fine});
  return plans;
}

std::string PlanName(const kc::GqaSplitPlan& p) {
  return p.num_splits == 1
             ? "1 split"
             : std::to_string(p.num_splits) + " splits of " + std::to_string(p.split_tokens);
}

// Query for the wrong-group-mapping control: the kernel maps slot j to KV head
// j / G; put query head h = a * KVH + b (b = h % KVH) at slot b * G + a so that
// it is served by KV head h % KVH. Returns the permuted queries; the outputs
// come back at the same slots (UnpermuteOutput).
std::vector<float> InterleaveHeads(const std::vector<float>& x, int S, int H, int KVH, int D) {
  const int G = H / KVH;
  std::vector<float> y(x.size());
  for (int s = 0; s < S; ++s)
    for (int h = 0; h < H; ++h) {
      const int slot = (h % KVH) * G + h / KVH;
      std::copy_n(x.begin() + (static_cast<size_t>(s) * H + h) * D, D,
                  y.begin() + (static_cast<size_t>(s) * H + slot) * D);
    }
  return y;
}
std::vector<float> DeinterleaveHeads(const std::vector<float>& y, int S, int H, int KVH, int D) {
  const int G = H / KVH;
  std::vector<float> x(y.size());
  for (int s = 0; s < S; ++s)
    for (int h = 0; h < H; ++h) {
      const int slot = (h % KVH) * G + h / KVH;
      std::copy_n(y.begin() + (static_cast<size_t>(s) * H + slot) * D, D,
                  x.begin() + (static_cast<size_t>(s) * H + h) * D);
    }
  return x;
}

template <typename T, int HS>
void CheckGqa(DType dt, int block_size, int heads, int kv_heads, bool use_alibi,
              std::vector<int> lens, std::mt19937& rng, int* multi_split_runs,
              Variant variant = Variant::kFma) {
  Case c{dt, heads, kv_heads, HS, block_size, std::move(lens)};
  Build(c, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const int S = c.num_seqs(), G = heads / kv_heads;
  const std::vector<float> slopes = AlibiSlopes(heads);
  const float* alibi = use_alibi ? slopes.data() : nullptr;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const std::string label = std::string(DTypeName(dt)) + " head " + std::to_string(HS) + " block " +
                            std::to_string(block_size) + " heads " + std::to_string(heads) + "/" +
                            std::to_string(kv_heads) + (use_alibi ? " alibi" : "") +
                            (variant == Variant::kMma ? " (tensor cores)" : "");
  const size_t per_seq = static_cast<size_t>(heads) * HS;
  std::vector<std::vector<double>> refs;
  refs.reserve(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s)
    refs.push_back(testing::ReferenceDecode(c.q.data() + s * per_seq, heads, c.K(s), c.V(s),
                                            c.seq_lens[s], scale, alibi));
  // The CPU backend on the same cache: itself within the standard, and the
  // emulated kernel within the standard of it.
  const std::vector<float> cpu = CpuV1(c, alibi, scale);
  for (int s = 0; s < S; ++s)
    ASSERT_TRUE(
        testing::AttentionOutputMatches(cpu.data() + s * per_seq, refs[s].data(), per_seq, dt))
        << label << " CPU v1 seq " << s;

  // The negative controls' sequence: the longest with at least two tiles.
  int control = -1;
  for (int s = 0; s < S; ++s)
    if (c.seq_lens[s] > 2 * kc::kGqaTileTokens &&
        (control < 0 || c.seq_lens[s] > c.seq_lens[control]))
      control = s;

  const std::vector<kc::GqaSplitPlan> plans = PlansFor(c);
  std::string plan_names;
  for (const kc::GqaSplitPlan& plan : plans)
    plan_names += (plan_names.empty() ? "" : "; ") + PlanName(plan);
  std::printf("%s, max_len %d: %s\n", label.c_str(), c.max_len(), plan_names.c_str());
  for (const kc::GqaSplitPlan& plan : plans) {
    if (plan.num_splits > 1) ++*multi_split_runs;
    const std::vector<float> got = EmuGqa<T, HS>(c, c.q, alibi, scale, plan, variant);
    for (int s = 0; s < S; ++s) {
      const std::string where = label + ", " + PlanName(plan) + ", seq " + std::to_string(s) +
                                " (len " + std::to_string(c.seq_lens[s]) + ")";
      ASSERT_TRUE(
          testing::AttentionOutputMatches(got.data() + s * per_seq, refs[s].data(), per_seq, dt))
          << where << " vs the double reference";
      std::vector<double> cpu_d(cpu.begin() + s * per_seq, cpu.begin() + (s + 1) * per_seq);
      ASSERT_TRUE(
          testing::AttentionOutputMatches(got.data() + s * per_seq, cpu_d.data(), per_seq, dt))
          << where << " vs the CPU backend";
    }
    if (control < 0) continue;
    const size_t off = control * per_seq;
    // Control 1: one 32-token tile (the second) of the control sequence left out.
    Case dropped = c;
    std::vector<int32_t> row(c.block_tables.begin() + control * c.max_blocks_per_seq,
                             c.block_tables.begin() + (control + 1) * c.max_blocks_per_seq);
    for (int i = 0; i < kc::kGqaTileTokens / block_size; ++i)
      testing::DropBlock(&row, &dropped.seq_lens[control], kc::kGqaTileTokens / block_size,
                         block_size);
    std::replace(row.begin(), row.end(), -1, c.poison_block);
    std::copy(row.begin(), row.end(),
              dropped.block_tables.begin() + control * c.max_blocks_per_seq);
    const std::vector<float> dgot = EmuGqa<T, HS>(dropped, c.q, alibi, scale, plan, variant);
    testing::ExpectRejectsBrokenOutputs(
        refs[control], std::vector<float>(dgot.begin() + off, dgot.begin() + off + per_seq), dt);
    // Control 2: the wrong group mapping (only distinguishable with >= 2 KV
    // heads and >= 2 heads per group).
    if (kv_heads >= 2 && G >= 2) {
      const std::vector<float> wq = InterleaveHeads(c.q, S, heads, kv_heads, HS);
      const std::vector<float> wgot = DeinterleaveHeads(
          EmuGqa<T, HS>(c, wq, nullptr, scale, plan, variant), S, heads, kv_heads, HS);
      testing::AttentionControlScope scope;
      std::vector<double> ref_noalibi = testing::ReferenceDecode(
          c.q.data() + off, heads, c.K(control), c.V(control), c.seq_lens[control], scale, nullptr);
      EXPECT_FALSE(
          testing::AttentionOutputMatches(wgot.data() + off, ref_noalibi.data(), per_seq, dt))
          << label << ", " << PlanName(plan) << ": the wrong GQA group mapping passes";
    }
  }
}

TEST(CudaGqaEmulationTest, DecodeMatchesReferenceAndCpuBackend) {
  std::mt19937 rng(31);
  int multi = 0;
  // 32q/8kv head 128 (Llama-3-8B-like), fp16, long contexts: tile, block and
  // split edges, a few thousand tokens.
  CheckGqa<__half, 128>(DType::kFloat16, 16, 32, 8, false, {1, 16, 17, 31, 32, 33, 129, 511, 2100},
                        rng, &multi);
  // SmolLM2-like: 9q/3kv and (TP-style) 14q/2kv, head 64.
  CheckGqa<__nv_bfloat16, 64>(DType::kBFloat16, 16, 9, 3, false, {1, 16, 17, 300, 1000}, rng,
                              &multi);
  CheckGqa<float, 64>(DType::kFloat32, 32, 14, 2, true, {1, 32, 33, 257, 700}, rng, &multi);
  // Group sizes 1 (MHA), 2, 8 and MQA; other head sizes and block sizes.
  CheckGqa<__nv_bfloat16, 128>(DType::kBFloat16, 8, 4, 4, false, {1, 8, 9, 200}, rng, &multi);
  CheckGqa<__half, 80>(DType::kFloat16, 8, 4, 2, true, {1, 8, 9, 150, 400}, rng, &multi);
  CheckGqa<float, 96>(DType::kFloat32, 16, 16, 2, false, {1, 16, 17, 65, 600}, rng, &multi);
  CheckGqa<__half, 256>(DType::kFloat16, 32, 4, 1, false, {1, 32, 33, 160}, rng, &multi);
  EXPECT_GE(multi, 10) << "too few multi-split runs: the cross-split reduce is barely tested";
}

// The tensor-core variant (gqa_decode_mma_kernels.cuh) under the same
// standard, controls and plans: fp16 and bf16, group sizes 1, 2, 4, 8 and 16
// (its limit), head sizes 64, 80, 128 and 256, ALiBi.
TEST(CudaGqaEmulationTest, TensorCoreDecodeMatchesReferenceAndCpuBackend) {
  std::mt19937 rng(41);
  int multi = 0;
  const Variant mma = Variant::kMma;
  CheckGqa<__half, 128>(DType::kFloat16, 16, 32, 8, false, {1, 16, 17, 31, 32, 33, 129, 700}, rng,
                        &multi, mma);
  CheckGqa<__nv_bfloat16, 128>(DType::kBFloat16, 16, 32, 8, false, {1, 33, 300, 1100}, rng, &multi,
                               mma);
  CheckGqa<__nv_bfloat16, 64>(DType::kBFloat16, 16, 32, 2, false, {1, 16, 17, 300, 600}, rng,
                              &multi, mma);
  CheckGqa<__nv_bfloat16, 128>(DType::kBFloat16, 8, 4, 4, false, {1, 8, 9, 200}, rng, &multi, mma);
  CheckGqa<__half, 80>(DType::kFloat16, 8, 4, 2, true, {1, 8, 9, 150, 400}, rng, &multi, mma);
  CheckGqa<__half, 256>(DType::kFloat16, 32, 4, 1, false, {1, 32, 33, 160}, rng, &multi, mma);
  EXPECT_GE(multi, 6) << "too few multi-split runs: the cross-split reduce is barely tested";
}

// The kernel launched with a plan for the device the planner sees must cover
// the context exactly once: with split_tokens smaller than the context of some
// sequences and larger than others, sequences shorter than a split start skip
// those splits (whole blocks return early) and the reduce reads only theirs.
TEST(CudaGqaEmulationTest, SplitsPastShortSequencesAreSkipped) {
  std::mt19937 rng(32);
  Case c{DType::kFloat32, 8, 2, 64, 16, {1, 40, 128, 129, 500}};
  Build(c, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const float scale = 0.125f;
  const kc::GqaSplitPlan plan{4, 128};  // covers 512 tokens
  const std::vector<float> got = EmuGqa<float, 64>(c, c.q, nullptr, scale, plan);
  const size_t per_seq = 8 * 64;
  for (int s = 0; s < c.num_seqs(); ++s) {
    const std::vector<double> ref = testing::ReferenceDecode(c.q.data() + s * per_seq, 8, c.K(s),
                                                             c.V(s), c.seq_lens[s], scale, nullptr);
    EXPECT_TRUE(testing::AttentionOutputMatches(got.data() + s * per_seq, ref.data(), per_seq,
                                                DType::kFloat32))
        << "seq " << s << " len " << c.seq_lens[s];
  }
}

}  // namespace
}  // namespace pagedserve::kernels
