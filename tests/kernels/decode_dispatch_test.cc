// The decode-kernel choice (ChooseDecodeKernel, the one place that picks v1,
// v2 or the GQA kernel) and the GQA kernel's split planner
// (kernels/cuda/gqa_decode_plan.h). Both are pure host functions, so this runs
// in every build, CUDA or not; device facts (SM count, resident blocks per SM)
// are given as they would come from cudaOccupancyMaxActiveBlocksPerMultiprocessor.
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/gqa_decode_plan.h"
#include "kernels/cuda/prefill_attention_mma_plan.h"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"
#include "kernels/types.h"

namespace pagedserve::kernels {
namespace {

namespace kc = ::pagedserve::kernels::cuda;

bool Contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

TEST(ChooseDecodeKernelTest, GqaOnCudaForGroupsOfTwoOrMore) {
  // SmolLM2-135M (9q/3kv, head 64), Llama-3-8B (32q/8kv, head 128), 14q/2kv.
  for (auto [h, kvh, hs] : std::vector<std::tuple<int, int, int>>{
           {9, 3, 64}, {32, 8, 128}, {14, 2, 64}, {4, 2, 128}, {32, 4, 128}, {8, 1, 256}}) {
    const DecodeKernelChoice c = ChooseDecodeKernel(Device::kCUDA, 4, h, kvh, hs, 1000);
    EXPECT_EQ(c.kernel, DecodeKernel::kGqa) << h << "/" << kvh << ": " << c.reason;
    EXPECT_TRUE(Contains(c.reason, "group size " + std::to_string(h / kvh))) << c.reason;
  }
}

TEST(ChooseDecodeKernelTest, MhaKeepsV1V2ByTheVllmHeuristic) {
  DecodeKernelChoice c = ChooseDecodeKernel(Device::kCUDA, 4, 32, 32, 128, 300);
  EXPECT_EQ(c.kernel, DecodeKernel::kV1) << c.reason;
  EXPECT_TRUE(Contains(c.reason, "MHA")) << c.reason;
  c = ChooseDecodeKernel(Device::kCUDA, 1, 8, 8, 128, 20000);
  EXPECT_EQ(c.kernel, DecodeKernel::kV2) << c.reason;
  EXPECT_TRUE(Contains(c.reason, "v2")) << c.reason;
}

TEST(ChooseDecodeKernelTest, CpuNeverGetsTheGqaKernel) {
  for (DecodeKernel req : {DecodeKernel::kAuto, DecodeKernel::kGqa}) {
    const DecodeKernelChoice c = ChooseDecodeKernel(Device::kCPU, 4, 9, 3, 64, 1000, req);
    EXPECT_NE(c.kernel, DecodeKernel::kGqa) << c.reason;
    EXPECT_EQ(c.kernel,
              ShouldUsePagedAttentionV1(4, 9, 1000) ? DecodeKernel::kV1 : DecodeKernel::kV2);
    EXPECT_TRUE(Contains(c.reason, "CPU")) << c.reason;
  }
}

TEST(ChooseDecodeKernelTest, Fp8CachesStayOnV1V2) {
  // A grouped CUDA shape the GQA kernel would take with an fp16 cache ...
  PagedAttentionParams p;
  p.num_seqs = 4;
  p.num_heads = 32;
  p.max_seq_len = 1000;
  p.cache.device = Device::kCUDA;
  p.cache.shape = KVCacheShape{64, 8, 128, 16, DType::kFloat16};
  EXPECT_EQ(ChooseDecodeKernel(p, DecodeKernel::kAuto).kernel, DecodeKernel::kGqa);
  // ... stays on v1/v2 with an fp8 cache (fp32 operands), even on request.
  for (DType fp8 : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
    p.cache.shape.dtype = fp8;
    p.io_dtype = DType::kFloat32;
    for (DecodeKernel req : {DecodeKernel::kAuto, DecodeKernel::kGqa}) {
      const DecodeKernelChoice c = ChooseDecodeKernel(p, req);
      EXPECT_NE(c.kernel, DecodeKernel::kGqa) << c.reason;
      EXPECT_TRUE(Contains(c.reason, DTypeName(fp8))) << c.reason;
    }
    EXPECT_EQ(ChooseDecodeKernel(p, DecodeKernel::kV2).kernel, DecodeKernel::kV2);
  }
}

// A soft cap (Gemma 2's attn_logit_softcapping) keeps a grouped CUDA call
// on v1/v2, even on a gqa / gqa_mma request: only they apply the cap. The
// GQA entry points refuse a soft-capped call by name.
TEST(ChooseDecodeKernelTest, SoftCappedCallsStayOnV1V2) {
  PagedAttentionParams p;
  p.num_seqs = 4;
  p.num_heads = 32;
  p.max_seq_len = 1000;
  p.cache.device = Device::kCUDA;
  p.cache.shape = KVCacheShape{64, 8, 128, 16, DType::kBFloat16};
  EXPECT_EQ(ChooseDecodeKernel(p, DecodeKernel::kAuto).kernel, DecodeKernel::kGqa);
  p.logit_softcap = 50.0f;
  for (DecodeKernel req : {DecodeKernel::kAuto, DecodeKernel::kGqa, DecodeKernel::kGqaMma}) {
    const DecodeKernelChoice c = ChooseDecodeKernel(p, req);
    EXPECT_EQ(c.kernel,
              ShouldUsePagedAttentionV1(4, 32, 1000) ? DecodeKernel::kV1 : DecodeKernel::kV2)
        << c.reason;
    EXPECT_TRUE(Contains(c.reason, "soft cap")) << c.reason;
  }
  EXPECT_EQ(ChooseDecodeKernel(p, DecodeKernel::kV2).kernel, DecodeKernel::kV2);
  // The GQA entry points: InvalidArgument naming the soft cap (before any
  // device work; the pointers are only checked for being set).
  int dummy = 0;
  const std::vector<int32_t> table(4, 0), lens(4, 10);
  p.out = &dummy;
  p.query = &dummy;
  p.cache.key_cache = &dummy;
  p.cache.value_cache = &dummy;
  p.block_tables = table.data();
  p.max_blocks_per_seq = 1;
  p.seq_lens = lens.data();
  for (const absl::Status& st : {PagedAttentionGqa(p), PagedAttentionGqaMma(p)}) {
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_TRUE(Contains(std::string(st.message()), "soft cap")) << st;
  }
}

TEST(ChooseDecodeKernelTest, RequestsOverrideTheRule) {
  DecodeKernelChoice c = ChooseDecodeKernel(Device::kCUDA, 4, 32, 8, 128, 1000, DecodeKernel::kV1);
  EXPECT_EQ(c.kernel, DecodeKernel::kV1);
  EXPECT_TRUE(Contains(c.reason, "requested")) << c.reason;
  c = ChooseDecodeKernel(Device::kCUDA, 4, 32, 8, 128, 1000, DecodeKernel::kV2);
  EXPECT_EQ(c.kernel, DecodeKernel::kV2);
  // The GQA kernel on request even for MHA (group size 1 is valid for it).
  c = ChooseDecodeKernel(Device::kCUDA, 4, 8, 8, 128, 1000, DecodeKernel::kGqa);
  EXPECT_EQ(c.kernel, DecodeKernel::kGqa) << c.reason;
}

TEST(ChooseDecodeKernelTest, GroupsTooLargeForSharedMemoryFallBack) {
  // 64 query heads on one KV head of 256: (32 * 516 + 64 * (512 + 35)) * 4 > 96 KiB.
  EXPECT_FALSE(GqaDecodeFits(256, 64));
  EXPECT_TRUE(GqaDecodeFits(128, 8));
  const DecodeKernelChoice c = ChooseDecodeKernel(Device::kCUDA, 4, 64, 1, 256, 1000);
  EXPECT_NE(c.kernel, DecodeKernel::kGqa) << c.reason;
  EXPECT_TRUE(Contains(c.reason, "shared memory")) << c.reason;
  const DecodeKernelChoice r =
      ChooseDecodeKernel(Device::kCUDA, 4, 64, 1, 256, 1000, DecodeKernel::kGqa);
  EXPECT_NE(r.kernel, DecodeKernel::kGqa) << r.reason;
}

// The tensor-core GQA kernel: only on request, only where it fits (fp16/bf16
// cache with same-type operands, head size a multiple of 16, group <= 16, on
// CUDA); otherwise the request falls back to the rule and says why.
TEST(ChooseDecodeKernelTest, TensorCoreGqaOnlyWhenRequestedAndFitting) {
  PagedAttentionParams p;
  p.num_seqs = 64;
  p.num_heads = 32;
  p.max_seq_len = 4096;
  p.cache.device = Device::kCUDA;
  p.cache.shape = KVCacheShape{64, 8, 128, 16, DType::kBFloat16};
  EXPECT_EQ(ChooseDecodeKernel(p, DecodeKernel::kAuto).kernel, DecodeKernel::kGqa);
  DecodeKernelChoice c = ChooseDecodeKernel(p, DecodeKernel::kGqaMma);
  EXPECT_EQ(c.kernel, DecodeKernel::kGqaMma) << c.reason;
  EXPECT_TRUE(Contains(c.reason, "tensor cores")) << c.reason;
  p.cache.shape.dtype = DType::kFloat16;
  EXPECT_EQ(ChooseDecodeKernel(p, DecodeKernel::kGqaMma).kernel, DecodeKernel::kGqaMma);
  EXPECT_TRUE(GqaMmaFits(DType::kFloat16, 128, 16));
  EXPECT_FALSE(GqaMmaFits(DType::kFloat16, 128, 17));  // more heads than MMA rows
  EXPECT_FALSE(GqaMmaFits(DType::kFloat16, 120, 4));   // not a multiple of 16
  EXPECT_TRUE(GqaMmaFits(DType::kBFloat16, 64, 3));
  EXPECT_FALSE(GqaMmaFits(DType::kFloat16, 256, 4));  // not instantiated for the device
  EXPECT_FALSE(GqaMmaFits(DType::kFloat32, 128, 4));  // 16-bit operands only
  EXPECT_FALSE(GqaMmaFits(DType::kFloat8E4M3, 128, 4));
  // Misfits fall back to the rule: fp32 cache -> gqa; group 32 -> gqa; CPU -> v1/v2.
  p.cache.shape.dtype = DType::kFloat32;
  c = ChooseDecodeKernel(p, DecodeKernel::kGqaMma);
  EXPECT_EQ(c.kernel, DecodeKernel::kGqa) << c.reason;
  EXPECT_TRUE(Contains(c.reason, "gqa_mma request does not fit")) << c.reason;
  p.cache.shape = KVCacheShape{64, 1, 64, 16, DType::kFloat16};
  c = ChooseDecodeKernel(p, DecodeKernel::kGqaMma);
  EXPECT_EQ(c.kernel, DecodeKernel::kGqa) << c.reason;
  p.cache.shape = KVCacheShape{64, 8, 128, 16, DType::kFloat16};
  p.cache.device = Device::kCPU;
  c = ChooseDecodeKernel(p, DecodeKernel::kGqaMma);
  EXPECT_TRUE(c.kernel == DecodeKernel::kV1 || c.kernel == DecodeKernel::kV2) << c.reason;
  // The device-level overload has no dtype: a gqa_mma request is answered as gqa.
  EXPECT_EQ(ChooseDecodeKernel(Device::kCUDA, 4, 32, 8, 128, 1000, DecodeKernel::kGqaMma).kernel,
            DecodeKernel::kGqa);
}

TEST(ChooseDecodeKernelTest, KernelNamesRoundTrip) {
  for (DecodeKernel k : {DecodeKernel::kAuto, DecodeKernel::kV1, DecodeKernel::kV2,
                         DecodeKernel::kGqa, DecodeKernel::kGqaMma}) {
    DecodeKernel parsed = DecodeKernel::kV1;
    EXPECT_TRUE(ParseDecodeKernel(DecodeKernelName(k), &parsed)) << DecodeKernelName(k);
    EXPECT_EQ(parsed, k);
  }
  DecodeKernel k = DecodeKernel::kV2;
  EXPECT_FALSE(ParseDecodeKernel("V1", &k));
  EXPECT_FALSE(ParseDecodeKernel("", &k));
  EXPECT_FALSE(ParseDecodeKernel(nullptr, &k));
  EXPECT_EQ(k, DecodeKernel::kV2);
}

// The tensor-core prefill kernel: names, and which caches it takes (16-bit
// with operands of the same type, the head sizes it is built for), and its
// shared memory within what sm_80 / sm_90 allow a block (227 KiB).
TEST(PrefillKernelTest, NamesAndFit) {
  for (PrefillKernel k : {PrefillKernel::kAuto, PrefillKernel::kSimt, PrefillKernel::kMma}) {
    PrefillKernel parsed = PrefillKernel::kAuto;
    EXPECT_TRUE(ParsePrefillKernel(PrefillKernelName(k), &parsed));
    EXPECT_EQ(parsed, k);
  }
  PrefillKernel k = PrefillKernel::kMma;
  EXPECT_FALSE(ParsePrefillKernel("wmma", &k));
  EXPECT_FALSE(ParsePrefillKernel(nullptr, &k));
  EXPECT_EQ(k, PrefillKernel::kMma);
  EXPECT_TRUE(PrefillMmaFits(DType::kFloat16, DType::kFloat16, 128));
  EXPECT_TRUE(PrefillMmaFits(DType::kBFloat16, DType::kBFloat16, 64));
  EXPECT_FALSE(PrefillMmaFits(DType::kFloat32, DType::kFloat32, 128));
  EXPECT_FALSE(PrefillMmaFits(DType::kFloat8E4M3, DType::kFloat16, 128));
  EXPECT_FALSE(PrefillMmaFits(DType::kFloat16, DType::kFloat32, 128));
  EXPECT_FALSE(PrefillMmaFits(DType::kBFloat16, DType::kBFloat16, 80));
  EXPECT_EQ(kc::PrefillMmaSharedBytes(128), 87808u);
  EXPECT_EQ(kc::PrefillMmaSharedBytes(64), 55040u);
  EXPECT_LE(kc::PrefillMmaSharedBytes(128), 227u * 1024);
}

TEST(GqaDecodeCpuTest, GqaEntryPointIsCudaOnlyAndAutoRunsOnCpu) {
  // A valid CPU problem: the GQA entry point refuses, PagedAttention with a
  // gqa request runs the CPU kernel and writes the output.
  const KVCacheShape shape{2, 1, 64, 16, DType::kFloat32};
  std::vector<float> kc(shape.num_blocks * shape.block_elems(), 0.5f), vc(kc.size(), 0.25f);
  std::vector<float> q(2 * 64, 0.1f), out(q.size(), -7.0f);
  const std::vector<int32_t> table = {1, 0}, lens = {5};
  PagedAttentionParams p;
  p.out = out.data();
  p.query = q.data();
  p.num_seqs = 1;
  p.num_heads = 2;
  p.cache = {kc.data(), vc.data(), shape, Device::kCPU};
  p.block_tables = table.data();
  p.max_blocks_per_seq = 2;
  p.seq_lens = lens.data();
  p.max_seq_len = 5;
  p.scale = 0.125f;
  const absl::Status gqa = PagedAttentionGqa(p);
  EXPECT_EQ(gqa.code(), absl::StatusCode::kFailedPrecondition) << gqa;
  EXPECT_EQ(out[0], -7.0f) << "nothing written on error";
  // The tensor-core entry point refuses an fp32 cache (InvalidArgument) before
  // the device check.
  const absl::Status mma = PagedAttentionGqaMma(p);
  EXPECT_EQ(mma.code(), absl::StatusCode::kInvalidArgument) << mma;
  EXPECT_EQ(out[0], -7.0f) << "nothing written on error";
  p.kernel = DecodeKernel::kGqa;
  ASSERT_TRUE(PagedAttention(p).ok());
  for (float v : out) EXPECT_FLOAT_EQ(v, 0.25f);  // softmax-weighted mean of a constant V
}

// ---- Split planner ----------------------------------------------------------

// H200: 132 SMs; 4 resident blocks per SM as a typical occupancy figure.
constexpr int kSms = 132, kPerSm = 4;

TEST(PlanGqaSplitsTest, FillsTheDeviceWhenSequencesTimesHeadsAreFew) {
  // 1 sequence x 8 KV heads = 8 blocks without splitting; 528 slots -> 66
  // wanted, capped by kGqaMaxSplits = 64; 32K tokens = 1024 tiles -> 16 tiles
  // (512 tokens) per split.
  kc::GqaSplitPlan p = kc::PlanGqaSplits(kSms, kPerSm, 1, 8, 32768, kc::kGqaMaxSplits);
  EXPECT_EQ(p.num_splits, 64);
  EXPECT_EQ(p.split_tokens, 512);
  // 8 sequences x 8 KV heads = 64 -> ceil(528 / 64) = 9 splits of a 4K context
  // (128 tiles): 15 tiles each -> ceil(128 / 15) = 9 splits of 480 tokens.
  p = kc::PlanGqaSplits(kSms, kPerSm, 8, 8, 4096, kc::kGqaMaxSplits);
  EXPECT_EQ(p.num_splits, 9);
  EXPECT_EQ(p.split_tokens, 480);
  EXPECT_GE(p.num_splits * p.split_tokens, 4096);
  EXPECT_LT((p.num_splits - 1) * p.split_tokens, 4096) << "no empty trailing split";
}

TEST(PlanGqaSplitsTest, EnoughBlocksMeansOnePass) {
  // 64 sequences x 8 KV heads = 512 blocks, 528 slots: ceil = 2 splits...
  EXPECT_EQ(kc::PlanGqaSplits(kSms, kPerSm, 64, 8, 4096, kc::kGqaMaxSplits).num_splits, 2);
  // ... 128 x 8 = 1024 >= 528: one pass, no scratch.
  const kc::GqaSplitPlan p = kc::PlanGqaSplits(kSms, kPerSm, 128, 8, 4096, kc::kGqaMaxSplits);
  EXPECT_EQ(p.num_splits, 1);
  EXPECT_EQ(p.split_tokens, 0);
}

TEST(PlanGqaSplitsTest, EverySplitHoldsAtLeastTheMinimumTiles) {
  // 1 x 1 wants 528 splits; 300 tokens = 10 tiles -> at most 10 / 4 = 2 splits.
  kc::GqaSplitPlan p = kc::PlanGqaSplits(kSms, kPerSm, 1, 1, 300, kc::kGqaMaxSplits);
  EXPECT_EQ(p.num_splits, 2);
  EXPECT_EQ(p.split_tokens, 5 * kc::kGqaTileTokens);
  // Fewer than 2 * kGqaMinTilesPerSplit tiles: never split.
  for (int len : {1, 31, 32, 33, 128, 224})
    EXPECT_EQ(kc::PlanGqaSplits(kSms, kPerSm, 1, 1, len, kc::kGqaMaxSplits).num_splits, 1) << len;
  EXPECT_EQ(kc::PlanGqaSplits(kSms, kPerSm, 1, 1, 256, kc::kGqaMaxSplits).num_splits, 2);
  // Property over many shapes: splits hold >= min tiles (except that the last
  // may be shorter), cover the context, and none is empty.
  for (int seqs : {1, 3, 17})
    for (int kvh : {1, 2, 8})
      for (int len : {1, 100, 257, 1000, 4097, 70000}) {
        p = kc::PlanGqaSplits(kSms, kPerSm, seqs, kvh, len, kc::kGqaMaxSplits);
        ASSERT_GE(p.num_splits, 1);
        ASSERT_LE(p.num_splits, kc::kGqaMaxSplits);
        if (p.num_splits == 1) {
          EXPECT_EQ(p.split_tokens, 0);
          continue;
        }
        EXPECT_EQ(p.split_tokens % kc::kGqaTileTokens, 0);
        EXPECT_GE(p.split_tokens, kc::kGqaMinTilesPerSplit * kc::kGqaTileTokens);
        EXPECT_GE(static_cast<int64_t>(p.num_splits) * p.split_tokens, len);
        EXPECT_LT(static_cast<int64_t>(p.num_splits - 1) * p.split_tokens, len);
      }
}

TEST(PlanGqaSplitsTest, WorkspaceBoundsTheSplits) {
  // The v2 workspace of a 4K context holds 8 partitions' worth of rows.
  kc::GqaSplitPlan p = kc::PlanGqaSplits(kSms, kPerSm, 1, 8, 4096, 8);
  EXPECT_EQ(p.num_splits, 8);
  EXPECT_EQ(p.split_tokens, 512);
  EXPECT_EQ(kc::PlanGqaSplits(kSms, kPerSm, 1, 8, 4096, 1).num_splits, 1);
  EXPECT_EQ(kc::PlanGqaSplits(kSms, kPerSm, 1, 8, 4096, 0).num_splits, 1);
  // GqaSplitsThatFit inverts GqaWorkspaceBytes.
  const size_t v2 = PagedAttentionV2WorkspaceBytes(3, 32, 128, 4096);
  EXPECT_EQ(kc::GqaSplitsThatFit(v2, 3, 32, 128), NumPartitions(4096));
  EXPECT_EQ(kc::GqaSplitsThatFit(kc::GqaWorkspaceBytes(3, 32, 128, 5) - 1, 3, 32, 128), 4);
  // PagedAttentionGqaWorkspaceBytes holds the planner's largest plan.
  for (int len : {100, 300, 4096, 100000}) {
    const size_t bytes = PagedAttentionGqaWorkspaceBytes(2, 32, 128, len);
    const kc::GqaSplitPlan most = kc::PlanGqaSplits(100000, 64, 2, 8, len, kc::kGqaMaxSplits);
    if (most.num_splits == 1) {
      EXPECT_EQ(bytes, 0u) << len;
    } else {
      EXPECT_GE(kc::GqaSplitsThatFit(bytes, 2, 32, 128), most.num_splits) << len;
    }
  }
}

TEST(PlanGqaSplitsTest, DegenerateDeviceFactsCountAsOne) {
  // No occupancy information: one slot -> one pass.
  EXPECT_EQ(kc::PlanGqaSplits(0, 0, 1, 1, 4096, kc::kGqaMaxSplits).num_splits, 1);
  // Small device: 8 SMs x 1 block, 1 x 2 blocks -> 4 splits.
  const kc::GqaSplitPlan p = kc::PlanGqaSplits(8, 1, 1, 2, 4096, kc::kGqaMaxSplits);
  EXPECT_EQ(p.num_splits, 4);
  EXPECT_EQ(p.split_tokens, 1024);
}

TEST(GqaSharedBytesTest, MatchesTheKernelLayout) {
  // An fp32 cache (the default): K tile 32 x (128 + 4), V tile 128 x 32, group
  // 4: q and acc 4 x 128 each, logits 4 x 32, m / l / alpha 4 each; fp32.
  EXPECT_EQ(kc::GqaDecodeSharedBytes(128, 4),
            4u * (32 * 132 + 32 * 128 + 2 * 4 * 128 + 4 * 32 + 3 * 4));
  // A 16-bit cache: K tile 32 x (128 + 8) and V tile 128 x 32 as stored; the
  // rest fp32 as above.
  EXPECT_EQ(kc::GqaDecodeSharedBytes(128, 4, 2),
            2u * (32 * 136 + 128 * 32) + 4u * (2 * 4 * 128 + 4 * 32 + 3 * 4));
}

}  // namespace
}  // namespace pagedserve::kernels
