// The SIMT emulator as a memory profiler (tests/kernels/simt_emulator.h,
// emu::ProfileBegin / ProfileEnd) over the CUDA attention kernels, and
// regression limits on what it measures.
//
// 1. The profiler itself, on small kernels whose counts follow by hand from
//    the rules of the CUDA C++ Programming Guide (global: 32-byte sectors per
//    warp request; shared: 32 banks of 4-byte words, one 128-byte wavefront
//    per phase of 32 / 16 / 8 threads for 4 / 8 / 16-byte accesses,
//    broadcast of one word): coalesced and strided loads, 16-byte loads,
//    broadcast, stride-2 / stride-32 / stride-33 shared accesses, 16-byte
//    shared accesses, a divergent branch. The conflicted cases are the
//    negative controls: the profiler does see conflicts and waste.
// 2. Each attention kernel on one shape (bf16, head 128, block 16, group 4:
//    8 query heads on 2 KV heads, Llama-3-8B's 32q/8kv ratio with fewer
//    heads, since the ratios below do not depend on the number of KV heads),
//    a random block table: decode v1, v2 (512-token partitions), GQA (one
//    split, and split-KV as planned for an H200), GQA tensor-core; prefill
//    SIMT and tensor-core. It prints one markdown table row per kernel (the
//    table in docs/attention_kernels.md is this output) and per-site rows,
//    and fails when
//      - global sectors per useful sector (coalescing of the paged-KV loads),
//      - global bytes per useful KV byte (K and V of every context token of
//        every KV head read once = 1.0),
//      - shared wavefronts per ideal wavefront (bank conflicts), or
//      - the busiest bank (ways)
//    exceed the limits in kLimits: today's measurement (2026-12-05), rounded
//    up in the third decimal. A kernel that improves should lower its limit.
//    Every kernel must also read at least the useful KV bytes once: a KV load
//    that loses its PAGEDSERVE_GLOBAL_READ mark shows up as less than 1.0.
#include "tests/kernels/simt_emulator.h"  // must precede the kernel headers

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/gqa_decode_kernels.cuh"
#include "kernels/cuda/gqa_decode_mma_kernels.cuh"
#include "kernels/cuda/gqa_decode_plan.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/paged_attention_kernels.cuh"
#include "kernels/cuda/prefill_attention_kernels.cuh"
#include "kernels/cuda/prefill_attention_mma_kernels.cuh"
#include "kernels/paged_attention.h"

namespace pagedserve::kernels {
namespace {

namespace kc = ::pagedserve::kernels::cuda;
namespace emu = ::pagedserve::kernels::cuda::emu;

// ---------------------------------------------------------------------------
// 1. The profiler on hand-counted accesses.

// One warp (32 threads) running `body(lane)`, profiled.
template <typename F>
emu::Profile ProfileWarp(F body, size_t smem_bytes = 0) {
  emu::ProfileBegin();
  kc::EmuLaunch(dim3(1), dim3(32), smem_bytes, [&] { body(static_cast<int>(kc::threadIdx.x)); });
  return emu::ProfileEnd();
}

TEST(SimtProfilerTest, GlobalSectorsFollowTheCoalescingRules) {
  alignas(128) static float data[32 * 64];
  alignas(128) static uint4 vec[64];
  float sink = 0;
  // 32 consecutive floats, 128-byte aligned: 4 sectors, all useful.
  emu::Profile p = ProfileWarp([&](int lane) { sink += *PAGEDSERVE_GLOBAL_READ(&data[lane], 4); });
  EXPECT_EQ(p.global.instructions, 1u);
  EXPECT_EQ(p.global.sectors, 4u);
  EXPECT_EQ(p.global.useful_sectors, 4u);
  // Stride 8 floats (32 bytes): 32 sectors for 4 sectors' worth of bytes.
  p = ProfileWarp([&](int lane) { sink += *PAGEDSERVE_GLOBAL_READ(&data[8 * lane], 4); });
  EXPECT_EQ(p.global.sectors, 32u);
  EXPECT_EQ(p.global.useful_sectors, 4u);
  EXPECT_DOUBLE_EQ(p.global.SectorRatio(), 8.0);
  // Misaligned by one float: 5 sectors for 4 useful.
  p = ProfileWarp([&](int lane) { sink += *PAGEDSERVE_GLOBAL_READ(&data[1 + lane], 4); });
  EXPECT_EQ(p.global.sectors, 5u);
  EXPECT_EQ(p.global.useful_sectors, 4u);
  // 16-byte loads, consecutive: 512 bytes = 16 sectors; every lane the same
  // float: 1 sector.
  p = ProfileWarp([&](int lane) { sink += PAGEDSERVE_GLOBAL_READ(&vec[lane], 16)->x; });
  EXPECT_EQ(p.global.sectors, 16u);
  EXPECT_EQ(p.global.useful_sectors, 16u);
  p = ProfileWarp([&](int) { sink += *PAGEDSERVE_GLOBAL_READ(&data[3], 4); });
  EXPECT_EQ(p.global.sectors, 1u);
  EXPECT_EQ(p.global.bytes, 4u);
  // A loop: one instruction per iteration (occurrence), 4 here.
  p = ProfileWarp([&](int lane) {
    for (int i = 0; i < 4; ++i) sink += *PAGEDSERVE_GLOBAL_READ(&data[i * 32 + lane], 4);
  });
  EXPECT_EQ(p.global.instructions, 4u);
  EXPECT_EQ(p.global.sectors, 16u);
  EXPECT_EQ(p.global.accesses, 128u);
  ASSERT_EQ(p.sites.size(), 1u);
  EXPECT_NE(p.sites[0].first.Name().find("cuda_profile_test.cc:"), std::string::npos);
  // Nothing is counted outside ProfileBegin / ProfileEnd.
  kc::EmuLaunch(dim3(1), dim3(32), 0,
                [&] { sink += *PAGEDSERVE_GLOBAL_READ(&data[8 * kc::threadIdx.x], 4); });
  p = ProfileWarp([](int) {});
  EXPECT_EQ(p.global.instructions, 0u);
  EXPECT_TRUE(p.sites.empty());
  static_cast<void>(sink);
}

TEST(SimtProfilerTest, SharedBankConflictsFollowTheBankRules) {
  constexpr size_t kSmem = 32 * 33 * sizeof(float) * 2;
  float sink = 0;
  // ways of one warp access of a float at smem[index(lane)].
  const auto ways = [&](auto index) {
    const emu::Profile p = ProfileWarp(
        [&](int lane) {
          PAGEDSERVE_DYNAMIC_SHARED(float, s);
          sink += *PAGEDSERVE_SHARED(&s[index(lane)]);
        },
        kSmem);
    EXPECT_EQ(p.shared.instructions, 1u);
    EXPECT_EQ(p.shared.ideal_wavefronts, 1u);
    EXPECT_EQ(p.shared.wavefronts, static_cast<uint64_t>(p.shared.max_ways));
    return p.shared.max_ways;
  };
  EXPECT_EQ(ways([](int l) { return l; }), 1);        // consecutive words
  EXPECT_EQ(ways([](int l) { return 2 * l; }), 2);    // stride 2: 2-way
  EXPECT_EQ(ways([](int l) { return 32 * l; }), 32);  // one column of [32][32]: 32-way
  EXPECT_EQ(ways([](int l) { return 33 * l; }), 1);   // of [32][33] (padded): none
  EXPECT_EQ(ways([](int) { return 5; }), 1);          // one word: broadcast
  EXPECT_EQ(ways([](int l) { return l / 2; }), 1);    // pairs on one word: multicast
  // 16-byte accesses: 4 phases of 8 threads (128 bytes each).
  emu::Profile p = ProfileWarp(
      [&](int lane) {
        PAGEDSERVE_DYNAMIC_SHARED(float4, s);
        sink += PAGEDSERVE_SHARED(&s[lane])->x;  // consecutive: conflict-free
      },
      kSmem);
  EXPECT_EQ(p.shared.ideal_wavefronts, 4u);
  EXPECT_EQ(p.shared.wavefronts, 4u);
  EXPECT_EQ(p.shared.max_ways, 1);
  p = ProfileWarp(
      [&](int lane) {
        PAGEDSERVE_DYNAMIC_SHARED(float4, s);
        sink += PAGEDSERVE_SHARED(&s[8 * lane])->x;  // rows of 32 floats: 8-way per phase
      },
      32 * 8 * sizeof(float4));
  EXPECT_EQ(p.shared.wavefronts, 32u);
  EXPECT_EQ(p.shared.max_ways, 8);
  EXPECT_DOUBLE_EQ(p.shared.WavefrontRatio(), 8.0);
  // Divergence: the 16 even lanes store, stride 2 -> 2-way with 16 accesses.
  p = ProfileWarp(
      [&](int lane) {
        PAGEDSERVE_DYNAMIC_SHARED(float, s);
        if (lane % 2 == 0) *PAGEDSERVE_SHARED(&s[2 * lane]) = 1.0f;
      },
      kSmem);
  EXPECT_EQ(p.shared.instructions, 1u);
  EXPECT_EQ(p.shared.accesses, 16u);
  EXPECT_EQ(p.shared.max_ways, 2);
  static_cast<void>(sink);
}

// ---------------------------------------------------------------------------
// 2. The attention kernels.

using T = __nv_bfloat16;
constexpr int kHead = 128, kBlock = 16, kHeads = 8, kKvHeads = 2, kGroup = kHeads / kKvHeads;

// n values of E (all `value`) 256-byte aligned, as cudaMalloc aligns: the
// sector counts depend on the alignment (malloc's 16 bytes would split every
// 128-byte run into 5 sectors).
template <typename E>
class DeviceLikeBuffer {
 public:
  DeviceLikeBuffer(size_t n, E value)
      : p_(static_cast<E*>(std::aligned_alloc(256, (n * sizeof(E) + 255) / 256 * 256))) {
    std::fill_n(p_.get(), n, value);
  }
  const E* get() const { return p_.get(); }

 private:
  struct Free {
    void operator()(E* p) const { std::free(p); }
  };
  std::unique_ptr<E, Free> p_;
};

// A paged cache of element type E (zeros: the counts do not depend on the
// values) with random block tables for the given context lengths; queries 1.
template <typename E = T>
struct PagedCase {
  std::vector<int32_t> lens;
  int max_blocks = 0;
  std::vector<int32_t> tables;
  DeviceLikeBuffer<E> k, v;  // [blocks, kv_heads, ...]
  DeviceLikeBuffer<E> q;     // [tokens, heads, head]
  PagedCase(std::vector<int32_t> l, int q_tokens)
      : lens(std::move(l)),
        max_blocks((*std::max_element(lens.begin(), lens.end()) + kBlock - 1) / kBlock),
        tables(static_cast<size_t>(max_blocks) * lens.size()),
        k(tables.size() * kKvHeads * kHead * kBlock, E(0.0f)),
        v(tables.size() * kKvHeads * kHead * kBlock, E(0.0f)),
        q(static_cast<size_t>(q_tokens) * kHeads * kHead, E(1.0f)) {
    std::iota(tables.begin(), tables.end(), 0);
    std::mt19937 rng(7);
    std::shuffle(tables.begin(), tables.end(), rng);
  }
  int num_seqs() const { return static_cast<int>(lens.size()); }
  int max_len() const { return *std::max_element(lens.begin(), lens.end()); }
  const E* K() const { return k.get(); }
  const E* V() const { return v.get(); }
  const E* Q() const { return q.get(); }
  // K and V of every context token of every KV head, once.
  double UsefulKvBytes() const {
    double tokens = 0;
    for (int l : lens) tokens += l;
    return tokens * kKvHeads * kHead * 2 /*K, V*/ * sizeof(E);
  }
};

// The measured figures of one kernel run, and their limits.
struct Figures {
  double sector_ratio, kv_bytes_ratio, wavefront_ratio;
  int max_ways;
};
struct Limit {
  const char* kernel;
  Figures max;
};
// Today's measurement (see the file comment), per kernel.
constexpr Limit kLimits[] = {
    {"decode v1", {1.500, 4.032, 1.000, 1}},
    {"decode v2", {1.500, 4.032, 1.000, 1}},
    {"decode GQA (1 split)", {1.005, 1.007, 1.000, 1}},
    {"decode GQA (H200 splits)", {1.005, 1.007, 1.000, 1}},
    {"decode GQA fp32 cache", {1.005, 1.007, 1.000, 1}},
    {"decode GQA tensor-core", {1.005, 1.007, 3.000, 4}},
    {"prefill SIMT", {1.046, 23.000, 1.385, 2}},
    {"prefill tensor-core", {1.000, 7.200, 3.000, 4}},
};

std::string Fixed(double x) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.3f", x);
  return b;
}

// Prints the kernel's table rows and checks it against its limit.
void Report(const char* kernel, const char* shape, const emu::Profile& p, double useful_kv) {
  const Figures f{p.global.SectorRatio(),
                  static_cast<double>(p.global.block_sectors) * 32 / useful_kv,
                  p.shared.WavefrontRatio(), p.shared.max_ways};
  std::printf("| %s | %s | %s | %s | %s | %d |\n", kernel, shape, Fixed(f.sector_ratio).c_str(),
              Fixed(f.kv_bytes_ratio).c_str(), Fixed(f.wavefront_ratio).c_str(), f.max_ways);
  for (const auto& [site, c] : p.sites) {
    const bool global = site.space == emu::Space::kGlobal;
    std::printf("|   %s %s | %llu instr | %s | | %s | %d |\n", global ? "global" : "shared",
                site.Name().c_str(), static_cast<unsigned long long>(c.instructions),
                global ? Fixed(c.SectorRatio()).c_str() : "",
                global ? "" : Fixed(c.WavefrontRatio()).c_str(), global ? 0 : c.max_ways);
  }
  EXPECT_GT(p.global.instructions, 0u) << kernel << ": no marked global read";
  EXPECT_GT(p.shared.instructions, 0u) << kernel << ": no marked shared access";
  // Every KV byte must be read at least once: less means a KV load lost its mark.
  EXPECT_GE(f.kv_bytes_ratio, 1.0) << kernel;
  const Limit* lim = nullptr;
  for (const Limit& l : kLimits)
    if (std::string(l.kernel) == kernel) lim = &l;
  ASSERT_NE(lim, nullptr) << kernel;
  constexpr double kSlack = 1e-9;
  EXPECT_LE(f.sector_ratio, lim->max.sector_ratio + kSlack) << kernel << ": coalescing regressed";
  EXPECT_LE(f.kv_bytes_ratio, lim->max.kv_bytes_ratio + kSlack)
      << kernel << ": global bytes per useful KV byte regressed";
  EXPECT_LE(f.wavefront_ratio, lim->max.wavefront_ratio + kSlack)
      << kernel << ": shared-memory bank conflicts regressed";
  EXPECT_LE(f.max_ways, lim->max.max_ways) << kernel << ": worst bank conflict regressed";
}

void PrintHeader() {
  std::printf(
      "| kernel | shape | global sectors / useful | global bytes / useful KV byte | "
      "shared wavefronts / ideal | worst bank (ways) |\n|---|---|---|---|---|---|\n");
}

// Decode: two sequences, one ending mid-tile and mid-block.
const std::vector<int32_t> kDecodeLens = {512, 389};
constexpr const char* kDecodeShape = "8q/2kv, head 128, bf16, block 16, ctx 512 + 389";

void ProfileDecodeV1V2(bool v2) {
  const PagedCase<> c(kDecodeLens, static_cast<int>(kDecodeLens.size()));
  const int S = c.num_seqs(), P = v2 ? NumPartitions(c.max_len()) : 1;
  const int psize = v2 ? kPartitionSize : 0;
  std::vector<float> ml(static_cast<size_t>(S) * kHeads * P), es(ml.size()), tmp(ml.size() * kHead);
  std::vector<uint16_t> out(static_cast<size_t>(S) * kHeads * kHead);
  const size_t smem = static_cast<size_t>((v2 ? psize : c.max_len()) + 7) / 8 * 8 * sizeof(float);
  emu::ProfileBegin();
  kc::EmuLaunch(dim3(kHeads, S, P), dim3(kc::kDecodeThreads), smem, [&] {
    kc::PagedAttentionKernel<T, kHead, kc::kDecodeThreads, T>(
        reinterpret_cast<T*>(out.data()), ml.data(), es.data(), tmp.data(), c.Q(), c.K(), c.V(),
        kKvHeads, kBlock, 0.1f, c.tables.data(), c.max_blocks, c.lens.data(), nullptr, psize, 1.0f,
        0, 0.0f);
  });
  if (v2) {
    kc::EmuLaunch(dim3(kHeads, S), dim3(kc::kDecodeThreads), P * sizeof(float), [&] {
      kc::PagedAttentionReduceKernel<T, kc::kDecodeThreads>(reinterpret_cast<T*>(out.data()),
                                                            ml.data(), es.data(), tmp.data(),
                                                            c.lens.data(), kHead, P, psize);
    });
  }
  Report(v2 ? "decode v2" : "decode v1", kDecodeShape, emu::ProfileEnd(), c.UsefulKvBytes());
}

// E: the cache and query element type (the tensor-core kernel: 16-bit only).
template <typename E = T>
void ProfileDecodeGqa(const char* name, const char* shape, kc::GqaSplitPlan plan, bool mma) {
  const PagedCase<E> c(kDecodeLens, static_cast<int>(kDecodeLens.size()));
  const int S = c.num_seqs();
  const bool split = plan.num_splits > 1;
  const size_t rows = static_cast<size_t>(S) * kHeads * plan.num_splits;
  std::vector<float> ml(rows), es(rows), tmp(rows * kHead);
  std::vector<E> out(static_cast<size_t>(S) * kHeads * kHead);
  const dim3 grid(kKvHeads, S, plan.num_splits);
  emu::ProfileBegin();
  if constexpr (sizeof(E) == 2) {
    if (mma) {
      kc::EmuLaunch(grid, dim3(kc::kDecodeThreads), kc::GqaMmaSharedBytes(kHead), [&] {
        kc::GqaDecodeMmaKernel<E, kHead, kc::kDecodeThreads>(
            out.data(), split ? ml.data() : nullptr, split ? es.data() : nullptr,
            split ? tmp.data() : nullptr, c.Q(), c.K(), c.V(), kKvHeads, kGroup, kBlock, 0.1f,
            c.tables.data(), c.max_blocks, c.lens.data(), nullptr, plan.split_tokens);
      });
    }
  }
  if (!mma) {
    kc::EmuLaunch(
        grid, dim3(kc::kDecodeThreads), kc::GqaDecodeSharedBytes(kHead, kGroup, sizeof(E)), [&] {
          kc::GqaDecodeKernel<E, E, kHead, kc::kDecodeThreads>(
              out.data(), split ? ml.data() : nullptr, split ? es.data() : nullptr,
              split ? tmp.data() : nullptr, c.Q(), c.K(), c.V(), kKvHeads, kGroup, kBlock, 0.1f,
              c.tables.data(), c.max_blocks, c.lens.data(), nullptr, plan.split_tokens);
        });
  }
  if (split) {
    kc::EmuLaunch(dim3(kHeads, S), dim3(kc::kDecodeThreads), plan.num_splits * sizeof(float), [&] {
      kc::PagedAttentionReduceKernel<E, kc::kDecodeThreads>(out.data(), ml.data(), es.data(),
                                                            tmp.data(), c.lens.data(), kHead,
                                                            plan.num_splits, plan.split_tokens);
    });
  }
  Report(name, shape, emu::ProfileEnd(), c.UsefulKvBytes());
}

// Prefill: one fresh prompt of 80 tokens (the last query tile and key tile partial).
constexpr int kPrompt = 80;
constexpr const char* kPrefillShape = "8q/2kv, head 128, bf16, block 16, prompt 80";

void ProfilePrefill(bool mma) {
  const PagedCase<> c({kPrompt}, kPrompt);
  const std::vector<int32_t> qsl = {0, kPrompt};
  std::vector<uint16_t> out(static_cast<size_t>(kPrompt) * kHeads * kHead);
  const int64_t qstride = static_cast<int64_t>(kHeads) * kHead;
  emu::ProfileBegin();
  if (mma) {
    kc::EmuLaunch(dim3(kHeads, 1, (kPrompt + kc::kPrefillMmaRows - 1) / kc::kPrefillMmaRows),
                  dim3(kc::kPrefillMmaThreads), kc::PrefillMmaSharedBytes(kHead), [&] {
                    kc::PrefillAttentionMmaKernel<T, kHead>(
                        reinterpret_cast<T*>(out.data()), c.Q(), qstride, qsl.data(), c.lens.data(),
                        c.K(), c.V(), kKvHeads, kBlock, c.tables.data(), c.max_blocks, 0.1f,
                        nullptr);
                  });
  } else {
    kc::EmuLaunch(dim3(kHeads, 1, (kPrompt + 7) / 8), dim3(kc::kPrefillThreads), 0, [&] {
      kc::PrefillAttentionKernel<T, kHead>(
          reinterpret_cast<T*>(out.data()), c.Q(), qstride, qsl.data(), c.lens.data(), c.K(), c.V(),
          kKvHeads, kBlock, c.tables.data(), c.max_blocks, 0.1f, nullptr, 1.0f, 0, 0.0f);
    });
  }
  Report(mma ? "prefill tensor-core" : "prefill SIMT", kPrefillShape, emu::ProfileEnd(),
         c.UsefulKvBytes());
}

TEST(AttentionKernelProfileTest, DecodeV1) {
  PrintHeader();
  ProfileDecodeV1V2(false);
}
TEST(AttentionKernelProfileTest, DecodeV2) {
  PrintHeader();
  ProfileDecodeV1V2(true);
}
TEST(AttentionKernelProfileTest, DecodeGqa) {
  PrintHeader();
  ProfileDecodeGqa("decode GQA (1 split)", kDecodeShape, {1, 0}, false);
  const kc::GqaSplitPlan h200 = kc::PlanGqaSplits(132, 4, static_cast<int>(kDecodeLens.size()),
                                                  kKvHeads, 512, kc::kGqaMaxSplits);
  ASSERT_GT(h200.num_splits, 1);
  ProfileDecodeGqa("decode GQA (H200 splits)", kDecodeShape, h200, false);
  // The fp32 reference mode: 8 value slots per row instead of 4.
  ProfileDecodeGqa<float>("decode GQA fp32 cache",
                          "8q/2kv, head 128, fp32, block 16, ctx 512 + 389", {1, 0}, false);
}
TEST(AttentionKernelProfileTest, DecodeGqaTensorCore) {
  PrintHeader();
  ProfileDecodeGqa("decode GQA tensor-core", kDecodeShape, {1, 0}, true);
}
TEST(AttentionKernelProfileTest, PrefillSimt) {
  PrintHeader();
  ProfilePrefill(false);
}
TEST(AttentionKernelProfileTest, PrefillTensorCore) {
  PrintHeader();
  ProfilePrefill(true);
}

}  // namespace
}  // namespace pagedserve::kernels
