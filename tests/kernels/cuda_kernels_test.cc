// CUDA backend tests: the kernels of kernels/cuda/ through the public API
// (kernels/*.h), compared to the naive double-precision reference of
// tests/kernels/reference_attention.h on gathered K/V, and byte-exact round
// trips of reshape_and_cache (against the CPU backend), copy_blocks and
// swap_blocks. Always compiled when CUDA is enabled; without a usable device
// every test is reported as skipped with the runtime's reason.
//
// Tolerances: the attention standard of tests/kernels/attention_check.h (per
// element scaled to the reference output plus a relative-RMS bound), with its
// negative controls (zeroed output, one block dropped) run on the device.
// fp8 caches (Fp8CacheMatchesReference): see that test.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cache_ops.h"
#include "kernels/cpu/fp8.h"
#include "kernels/cpu/half.h"
#include "kernels/cuda_device.h"
#include "kernels/paged_attention.h"
#include "kernels/prefill_attention.h"
#include "kernels/reshape_and_cache.h"
#include "kernels/types.h"
#include "tests/kernels/attention_check.h"
#include "tests/kernels/reference_attention.h"

namespace pagedserve::kernels {
namespace {

using testing::GatheredKV;

#define CUDA_OK(expr)                                                      \
  do {                                                                     \
    cudaError_t e_ = (expr);                                               \
    ASSERT_EQ(e_, cudaSuccess) << #expr << ": " << cudaGetErrorString(e_); \
  } while (0)

class CudaKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string reason;
    if (!CudaDeviceAvailable(&reason)) GTEST_SKIP() << "no usable CUDA device: " << reason;
  }
};

// Owning device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (cudaMalloc(&ptr_, std::max<size_t>(bytes, 16)) != cudaSuccess) ptr_ = nullptr;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      if (ptr_ != nullptr) cudaFree(ptr_);
      ptr_ = o.ptr_;
      bytes_ = o.bytes_;
      o.ptr_ = nullptr;
    }
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

template <typename T>
DeviceBuffer Upload(const std::vector<T>& v) {
  DeviceBuffer b(v.size() * sizeof(T));
  if (b.get() != nullptr && !v.empty())
    cudaMemcpy(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  return b;
}

std::vector<uint8_t> Download(const void* p, size_t bytes) {
  std::vector<uint8_t> h(bytes);
  cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost);
  return h;
}

// Host elements of a dtype, stored as raw bytes.
std::vector<uint8_t> Encode(const std::vector<float>& f, DType t) {
  std::vector<uint8_t> out(f.size() * DTypeSize(t));
  for (size_t i = 0; i < f.size(); ++i) {
    if (t == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &f[i], 4);
    } else {
      const uint16_t b = t == DType::kFloat16 ? FloatToHalfBits(f[i]) : FloatToBFloat16Bits(f[i]);
      std::memcpy(out.data() + 2 * i, &b, 2);
    }
  }
  return out;
}

std::vector<float> Decode(const std::vector<uint8_t>& raw, DType t) {
  const size_t n = raw.size() / DTypeSize(t);
  std::vector<float> f(n);
  for (size_t i = 0; i < n; ++i) {
    if (t == DType::kFloat32) {
      std::memcpy(&f[i], raw.data() + 4 * i, 4);
    } else {
      uint16_t b;
      std::memcpy(&b, raw.data() + 2 * i, 2);
      f[i] = t == DType::kFloat16 ? HalfBitsToFloat(b) : BFloat16BitsToFloat(b);
    }
  }
  return f;
}

// Rounds through the dtype so the reference sees exactly the kernel's inputs.
std::vector<float> Quantize(const std::vector<float>& f, DType t) {
  return Decode(Encode(f, t), t);
}

std::vector<float> RandomVector(size_t n, std::mt19937& rng, float lo = -1.0f, float hi = 1.0f) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// A paged KV cache on the device filled through ReshapeAndCache from
// contiguous per-sequence K/V, with shuffled (non-contiguous) block tables and
// NaN bytes (0xFF) in every slot no token was written to.
struct PagedCase {
  DType dtype = DType::kFloat32;
  int num_heads = 0, num_kv_heads = 0, head_size = 0, block_size = 0;
  std::vector<int> seq_lens;
  int max_blocks_per_seq = 0;
  int64_t num_blocks = 0;
  // Gathered, quantized K/V per sequence: [seq_len, num_kv_heads, head_size].
  std::vector<std::vector<float>> keys, values;
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq]
  DeviceBuffer key_cache, value_cache;
  KVCacheView view;

  int num_seqs() const { return static_cast<int>(seq_lens.size()); }
  GatheredKV K(int s) const { return {keys[s].data(), num_kv_heads, head_size}; }
  GatheredKV V(int s) const { return {values[s].data(), num_kv_heads, head_size}; }
};

// Builds the case; value_scale multiplies V (large-magnitude test).
void BuildPagedCase(PagedCase& c, std::mt19937& rng, float value_scale = 1.0f) {
  const int bs = c.block_size;
  int max_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  c.max_blocks_per_seq = (max_len + bs - 1) / bs + 1;  // one spare entry
  int64_t used = 0;
  for (int len : c.seq_lens) used += (len + bs - 1) / bs;
  c.num_blocks = used + 3;  // a few blocks nobody uses
  std::vector<int32_t> perm(c.num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  c.block_tables.assign(static_cast<size_t>(c.num_seqs()) * c.max_blocks_per_seq, -1);
  int64_t next = 0;
  std::vector<int64_t> slots;
  std::vector<float> all_k, all_v;
  const size_t row = static_cast<size_t>(c.num_kv_heads) * c.head_size;
  for (int s = 0; s < c.num_seqs(); ++s) {
    const int len = c.seq_lens[s];
    const int nb = (len + bs - 1) / bs;
    for (int i = 0; i < nb; ++i)
      c.block_tables[static_cast<size_t>(s) * c.max_blocks_per_seq + i] = perm[next++];
    // Unused trailing entries point at a valid block too (never read).
    for (int i = nb; i < c.max_blocks_per_seq; ++i)
      c.block_tables[static_cast<size_t>(s) * c.max_blocks_per_seq + i] = perm[0];
    std::vector<float> k = Quantize(RandomVector(len * row, rng), c.dtype);
    std::vector<float> v = RandomVector(len * row, rng);
    for (float& x : v) x *= value_scale;
    v = Quantize(v, c.dtype);
    for (int t = 0; t < len; ++t) {
      const int32_t b = c.block_tables[static_cast<size_t>(s) * c.max_blocks_per_seq + t / bs];
      slots.push_back(static_cast<int64_t>(b) * bs + t % bs);
    }
    all_k.insert(all_k.end(), k.begin(), k.end());
    all_v.insert(all_v.end(), v.begin(), v.end());
    c.keys.push_back(std::move(k));
    c.values.push_back(std::move(v));
  }
  c.view.shape = {c.num_blocks, c.num_kv_heads, c.head_size, c.block_size, c.dtype};
  const size_t cache_bytes = c.num_blocks * c.view.shape.block_bytes();
  c.key_cache = DeviceBuffer(cache_bytes);
  c.value_cache = DeviceBuffer(cache_bytes);
  ASSERT_NE(c.key_cache.get(), nullptr);
  ASSERT_NE(c.value_cache.get(), nullptr);
  CUDA_OK(cudaMemset(c.key_cache.get(), 0xFF, cache_bytes));  // NaN garbage
  CUDA_OK(cudaMemset(c.value_cache.get(), 0xFF, cache_bytes));
  c.view.key_cache = c.key_cache.get();
  c.view.value_cache = c.value_cache.get();
  c.view.device = Device::kCUDA;

  DeviceBuffer dk = Upload(Encode(all_k, c.dtype));
  DeviceBuffer dv = Upload(Encode(all_v, c.dtype));
  DeviceBuffer ds = Upload(slots);
  ReshapeAndCacheParams rp;
  rp.key = dk.get();
  rp.value = dv.get();
  rp.slot_mapping = static_cast<const int64_t*>(ds.get());
  rp.num_tokens = static_cast<int>(slots.size());
  rp.cache = c.view;
  ASSERT_TRUE(ReshapeAndCache(rp).ok());
  CUDA_OK(cudaDeviceSynchronize());
}

struct DecodeResult {
  std::vector<float> v1, v2;
  // The GQA decode kernel with the v2-sized workspace (splits bounded by it)
  // and with PagedAttentionGqaWorkspaceBytes (splits as the planner wants).
  std::vector<float> gqa, gqa_wide;
  // The tensor-core GQA kernel (wide workspace), where it fits the case
  // (GqaMmaFits); empty otherwise.
  std::vector<float> gqa_mma;
};

// Runs v1, v2 and the GQA kernel over the case with query q [num_seqs, num_heads, head_size].
// `drop` (sequence, block index) runs them with that block left out of the
// sequence's context instead (testing::DropBlock): the negative control.
void RunDecode(const PagedCase& c, const std::vector<float>& q, float scale,
               const std::vector<float>* alibi, DecodeResult* r,
               std::pair<int, int> drop = {-1, -1}) {
  const int S = c.num_seqs(), H = c.num_heads, D = c.head_size;
  const int max_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  std::vector<int32_t> lens(c.seq_lens.begin(), c.seq_lens.end());
  std::vector<int32_t> tables = c.block_tables;
  if (drop.first >= 0) {
    const size_t w = c.max_blocks_per_seq;
    std::vector<int32_t> row(tables.begin() + drop.first * w,
                             tables.begin() + (drop.first + 1) * w);
    testing::DropBlock(&row, &lens[drop.first], drop.second, c.block_size);
    row.back() = row.front();  // trailing entries point at a valid block, as in BuildPagedCase
    std::copy(row.begin(), row.end(), tables.begin() + drop.first * w);
  }
  DeviceBuffer dq = Upload(Encode(q, c.dtype));
  DeviceBuffer dbt = Upload(tables);
  DeviceBuffer dlens = Upload(lens);
  DeviceBuffer dalibi = alibi ? Upload(*alibi) : DeviceBuffer();
  const size_t out_bytes = static_cast<size_t>(S) * H * D * DTypeSize(c.dtype);
  DeviceBuffer out1(out_bytes), out2(out_bytes), out3(out_bytes), out4(out_bytes), out5(out_bytes);
  DeviceBuffer ws(PagedAttentionV2WorkspaceBytes(S, H, D, max_len));
  const size_t wide_bytes = PagedAttentionGqaWorkspaceBytes(S, H, D, max_len);
  DeviceBuffer wide(wide_bytes > 0 ? wide_bytes : 16);
  for (DeviceBuffer* o : {&out1, &out2, &out3, &out4, &out5})
    CUDA_OK(cudaMemset(o->get(), 0xFF, out_bytes));

  PagedAttentionParams p;
  p.query = dq.get();
  p.num_seqs = S;
  p.num_heads = H;
  p.cache = c.view;
  p.block_tables = static_cast<const int32_t*>(dbt.get());
  p.max_blocks_per_seq = c.max_blocks_per_seq;
  p.seq_lens = static_cast<const int32_t*>(dlens.get());
  p.max_seq_len = max_len;
  p.scale = scale;
  p.alibi_slopes = alibi ? static_cast<const float*>(dalibi.get()) : nullptr;
  p.host_block_tables = tables.data();
  p.host_seq_lens = lens.data();
  p.out = out1.get();
  absl::Status s1 = PagedAttentionV1(p);
  ASSERT_TRUE(s1.ok()) << s1;
  p.out = out2.get();
  p.workspace = ws.get();
  absl::Status s2 = PagedAttentionV2(p);
  ASSERT_TRUE(s2.ok()) << s2;
  p.out = out3.get();
  absl::Status s3 = PagedAttentionGqa(p);
  ASSERT_TRUE(s3.ok()) << s3;
  p.out = out4.get();
  p.workspace = wide.get();
  p.workspace_bytes = wide_bytes > 0 ? wide_bytes : 16;
  absl::Status s4 = PagedAttentionGqa(p);
  ASSERT_TRUE(s4.ok()) << s4;
  const bool mma = GqaMmaFits(c.dtype, D, H / c.view.shape.num_kv_heads);
  if (mma) {
    p.out = out5.get();
    absl::Status s5 = PagedAttentionGqaMma(p);
    ASSERT_TRUE(s5.ok()) << s5;
  }
  CUDA_OK(cudaDeviceSynchronize());
  r->v1 = Decode(Download(out1.get(), out_bytes), c.dtype);
  r->v2 = Decode(Download(out2.get(), out_bytes), c.dtype);
  r->gqa = Decode(Download(out3.get(), out_bytes), c.dtype);
  r->gqa_wide = Decode(Download(out4.get(), out_bytes), c.dtype);
  r->gqa_mma = mma ? Decode(Download(out5.get(), out_bytes), c.dtype) : std::vector<float>();
}

std::vector<float> AlibiSlopes(int num_heads) {
  // Press et al. (ALiBi): geometric slopes 2^(-8 i / n).
  std::vector<float> s(num_heads);
  for (int h = 0; h < num_heads; ++h) s[h] = std::pow(2.0f, -8.0f * (h + 1) / num_heads);
  return s;
}

// v1 and v2 of every sequence against the reference under the attention
// standard (attention_check.h); then its negative controls on the longest
// sequence with at least three blocks: a zeroed output and v1 / v2 rerun with
// that sequence's last full block dropped (the one ALiBi weighs most) must fail.
void CheckAgainstReference(const PagedCase& c, const std::vector<float>& q, float scale,
                           const std::vector<float>* alibi, const DecodeResult& r,
                           const std::string& label) {
  const int S = c.num_seqs();
  const size_t n = static_cast<size_t>(c.num_heads) * c.head_size;
  int control = -1;
  std::vector<double> control_ref;
  for (int s = 0; s < S; ++s) {
    std::vector<double> ref =
        testing::ReferenceDecode(q.data() + s * n, c.num_heads, c.K(s), c.V(s), c.seq_lens[s],
                                 scale, alibi ? alibi->data() : nullptr);
    ASSERT_TRUE(testing::AttentionOutputMatches(r.v1.data() + s * n, ref.data(), n, c.dtype))
        << label << " v1 seq " << s << " (len " << c.seq_lens[s] << ")";
    ASSERT_TRUE(testing::AttentionOutputMatches(r.v2.data() + s * n, ref.data(), n, c.dtype))
        << label << " v2 seq " << s << " (len " << c.seq_lens[s] << ")";
    ASSERT_TRUE(testing::AttentionOutputMatches(r.gqa.data() + s * n, ref.data(), n, c.dtype))
        << label << " gqa seq " << s << " (len " << c.seq_lens[s] << ")";
    ASSERT_TRUE(testing::AttentionOutputMatches(r.gqa_wide.data() + s * n, ref.data(), n, c.dtype))
        << label << " gqa (wide workspace) seq " << s << " (len " << c.seq_lens[s] << ")";
    if (!r.gqa_mma.empty()) {
      ASSERT_TRUE(testing::AttentionOutputMatches(r.gqa_mma.data() + s * n, ref.data(), n, c.dtype))
          << label << " gqa_mma seq " << s << " (len " << c.seq_lens[s] << ")";
    }
    if (c.seq_lens[s] >= 3 * c.block_size && (control < 0 || c.seq_lens[s] > c.seq_lens[control])) {
      control = s;
      control_ref = std::move(ref);
    }
  }
  if (control < 0) return;
  DecodeResult dropped;
  RunDecode(c, q, scale, alibi, &dropped, {control, (c.seq_lens[control] - 1) / c.block_size - 1});
  if (::testing::Test::HasFatalFailure()) return;
  for (const std::vector<float>* out :
       {&dropped.v1, &dropped.v2, &dropped.gqa, &dropped.gqa_wide, &dropped.gqa_mma}) {
    if (out->empty()) continue;  // no tensor-core run for this case
    SCOPED_TRACE(label + (out == &dropped.v1        ? " negative controls v1"
                          : out == &dropped.v2      ? " negative controls v2"
                          : out == &dropped.gqa_mma ? " negative controls gqa_mma"
                                                    : " negative controls gqa"));
    testing::ExpectRejectsBrokenOutputs(
        control_ref,
        std::vector<float>(out->begin() + control * n, out->begin() + (control + 1) * n), c.dtype);
  }
}

// Checks v1, v2 and the GQA kernel against the reference (CheckAgainstReference).
void CheckDecodeCase(PagedCase& c, bool use_alibi, std::mt19937& rng, const std::string& label) {
  const int S = c.num_seqs(), H = c.num_heads, D = c.head_size;
  std::vector<float> q = Quantize(RandomVector(static_cast<size_t>(S) * H * D, rng), c.dtype);
  std::vector<float> slopes = AlibiSlopes(H);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  DecodeResult r;
  RunDecode(c, q, scale, use_alibi ? &slopes : nullptr, &r);
  if (::testing::Test::HasFatalFailure()) return;
  CheckAgainstReference(c, q, scale, use_alibi ? &slopes : nullptr, r, label);
}

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const int kHeadSizes[] = {64, 80, 96, 112, 128, 256};
const int kBlockSizes[] = {8, 16, 32};
struct Heads {
  int q, kv;
};
const Heads kHeads[] = {{40, 40}, {64, 8}, {9, 3}, {8, 1}};

// Every dtype x head size x block size; heads and ALiBi rotate over the grid;
// lengths cover 1, block_size +- 1, the partition edges 511/512/513 and (for
// block size 16) 1025 and 4097.
TEST_F(CudaKernelsTest, DecodeMatchesReferenceOverTheGrid) {
  std::mt19937 rng(1234);
  int idx = 0;
  for (DType dt : kDTypes) {
    for (int hs : kHeadSizes) {
      for (int bs : kBlockSizes) {
        const Heads h = kHeads[idx % 4];
        const bool alibi = (idx / 4) % 2 == 1;
        ++idx;
        PagedCase c;
        c.dtype = dt;
        c.num_heads = h.q;
        c.num_kv_heads = h.kv;
        c.head_size = hs;
        c.block_size = bs;
        c.seq_lens = {1, bs - 1, bs, bs + 1, 511, 512, 513};
        if (bs == 16) {
          c.seq_lens.push_back(1025);
          c.seq_lens.push_back(4097);
        }
        BuildPagedCase(c, rng);
        ASSERT_FALSE(HasFatalFailure());
        const std::string label = std::string(DTypeName(dt)) + " head_size " + std::to_string(hs) +
                                  " block " + std::to_string(bs) + " heads " + std::to_string(h.q) +
                                  "/" + std::to_string(h.kv) + (alibi ? " alibi" : "");
        CheckDecodeCase(c, alibi, rng, label);
        ASSERT_FALSE(HasFatalFailure()) << label;
      }
    }
  }
}

// With a zero query every logit is equal, so the output is exactly the mean of
// V over the seq_len tokens; unused slots of the last block hold NaN bytes and
// must not leak into it.
TEST_F(CudaKernelsTest, ZeroQueryGivesMeanOfValuesAndPaddingDoesNotLeak) {
  std::mt19937 rng(7);
  for (DType dt : kDTypes) {
    PagedCase c;
    c.dtype = dt;
    c.num_heads = 8;
    c.num_kv_heads = 2;
    c.head_size = 128;
    c.block_size = 16;
    c.seq_lens = {1, 7, 21, 600};
    BuildPagedCase(c, rng);
    ASSERT_FALSE(HasFatalFailure());
    const int S = c.num_seqs(), H = c.num_heads, D = c.head_size;
    std::vector<float> q(static_cast<size_t>(S) * H * D, 0.0f);
    DecodeResult r;
    RunDecode(c, q, 0.125f, nullptr, &r);
    ASSERT_FALSE(HasFatalFailure());
    for (int s = 0; s < S; ++s) {
      std::vector<double> mean(static_cast<size_t>(H) * D, 0.0);
      for (int h = 0; h < H; ++h) {
        const int kvh = h / (H / c.num_kv_heads);
        for (int d = 0; d < D; ++d) {
          double& m = mean[static_cast<size_t>(h) * D + d];
          for (int t = 0; t < c.seq_lens[s]; ++t) m += c.V(s).at(t, kvh)[d];
          m /= c.seq_lens[s];
        }
      }
      const size_t o = static_cast<size_t>(s) * H * D;
      ASSERT_TRUE(testing::AttentionOutputMatches(r.v1.data() + o, mean.data(), mean.size(), dt))
          << DTypeName(dt) << " v1 seq " << s;
      ASSERT_TRUE(testing::AttentionOutputMatches(r.v2.data() + o, mean.data(), mean.size(), dt))
          << DTypeName(dt) << " v2 seq " << s;
      ASSERT_TRUE(testing::AttentionOutputMatches(r.gqa.data() + o, mean.data(), mean.size(), dt))
          << DTypeName(dt) << " gqa seq " << s;
      ASSERT_TRUE(
          testing::AttentionOutputMatches(r.gqa_wide.data() + o, mean.data(), mean.size(), dt))
          << DTypeName(dt) << " gqa (wide workspace) seq " << s;
      if (!r.gqa_mma.empty()) {
        ASSERT_TRUE(
            testing::AttentionOutputMatches(r.gqa_mma.data() + o, mean.data(), mean.size(), dt))
            << DTypeName(dt) << " gqa_mma seq " << s;
      }
    }
  }
}

// 32K tokens, V of magnitude near 1e4 in fp16/bf16: finite and within the
// attention standard (scaled to the output, whose magnitude is ~1e4 / sqrt of
// the effective context, not 1e4), with the zeroed / dropped-block controls. At 32K, v1 needs 128
// KiB of opt-in shared memory for its logits; at 70001 tokens (274 KiB) it exceeds every current
// device and takes the partitioned path.
TEST_F(CudaKernelsTest, LongContextWithLargeValues) {
  std::mt19937 rng(99);
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    PagedCase c;
    c.dtype = dt;
    c.num_heads = 8;
    c.num_kv_heads = 1;
    c.head_size = 128;
    c.block_size = 16;
    c.seq_lens = {32768, 70001, 3000};
    BuildPagedCase(c, rng, 1e4f);
    ASSERT_FALSE(HasFatalFailure());
    const int S = c.num_seqs(), H = c.num_heads, D = c.head_size;
    std::vector<float> q = Quantize(RandomVector(static_cast<size_t>(S) * H * D, rng, -4, 4), dt);
    const float scale = 1.0f / std::sqrt(static_cast<float>(D));
    DecodeResult r;
    RunDecode(c, q, scale, nullptr, &r);
    ASSERT_FALSE(HasFatalFailure());
    CheckAgainstReference(c, q, scale, nullptr, r, DTypeName(dt));
    ASSERT_FALSE(HasFatalFailure());
  }
}

// ReshapeAndCache on the device writes the same bytes as the CPU backend,
// including strided (fused QKV) inputs and padding slots.
TEST_F(CudaKernelsTest, ReshapeAndCacheMatchesCpuBytes) {
  std::mt19937 rng(5);
  for (DType dt : kDTypes) {
    for (int bs : kBlockSizes) {
      const int kvh = 3, hs = 80, T = 45;
      const KVCacheShape shape{8, kvh, hs, bs, dt};
      const int64_t stride = 3 * kvh * hs;  // K and V are slices of a [T, 3, kvh, hs] buffer
      std::vector<uint8_t> qkv = Encode(RandomVector(static_cast<size_t>(T) * stride, rng), dt);
      std::vector<int64_t> slots(T);
      std::vector<int64_t> perm(shape.num_blocks * bs);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      for (int t = 0; t < T; ++t) slots[t] = t % 7 == 3 ? -1 : perm[t];
      const size_t cache_bytes = shape.num_blocks * shape.block_bytes();
      std::vector<uint8_t> hk(cache_bytes, 0xAB), hv(cache_bytes, 0xCD);
      const size_t es = DTypeSize(dt);
      ReshapeAndCacheParams p;
      p.key = qkv.data() + kvh * hs * es;
      p.value = qkv.data() + 2 * kvh * hs * es;
      p.key_token_stride = stride;
      p.value_token_stride = stride;
      p.slot_mapping = slots.data();
      p.num_tokens = T;
      p.cache = {hk.data(), hv.data(), shape, Device::kCPU};
      ASSERT_TRUE(ReshapeAndCache(p).ok());

      DeviceBuffer dqkv = Upload(qkv), dslots = Upload(slots);
      DeviceBuffer dk = Upload(std::vector<uint8_t>(cache_bytes, 0xAB));
      DeviceBuffer dv = Upload(std::vector<uint8_t>(cache_bytes, 0xCD));
      p.key = static_cast<const uint8_t*>(dqkv.get()) + kvh * hs * es;
      p.value = static_cast<const uint8_t*>(dqkv.get()) + 2 * kvh * hs * es;
      p.slot_mapping = static_cast<const int64_t*>(dslots.get());
      p.cache = {dk.get(), dv.get(), shape, Device::kCUDA};
      absl::Status st = ReshapeAndCache(p);
      ASSERT_TRUE(st.ok()) << st;
      CUDA_OK(cudaDeviceSynchronize());
      EXPECT_EQ(Download(dk.get(), cache_bytes), hk) << DTypeName(dt) << " block " << bs;
      EXPECT_EQ(Download(dv.get(), cache_bytes), hv) << DTypeName(dt) << " block " << bs;
    }
  }
}

// One PrefillMatchesReference case: the sequences `seqs` (cached prefix,
// new tokens) in a `dt` cache of head size `hs`, both kernels where they fit.
struct PrefillSeq {
  int cached, q_len;
};
void CheckPrefillCase(DType dt, bool alibi, int hs, const std::vector<PrefillSeq>& seqs,
                      std::mt19937& rng) {
  using Seq = PrefillSeq;
  PagedCase c;
  c.dtype = dt;
  c.num_heads = 14;
  c.num_kv_heads = 2;
  c.head_size = hs;
  c.block_size = 16;
  for (const Seq& s : seqs) c.seq_lens.push_back(s.cached + s.q_len);
  BuildPagedCase(c, rng);
  ASSERT_FALSE(::testing::Test::HasFatalFailure());
  const int H = c.num_heads, D = c.head_size, S = c.num_seqs();
  std::vector<int32_t> qsl = {0};
  int max_q = 0;
  for (const Seq& s : seqs) {
    qsl.push_back(qsl.back() + s.q_len);
    max_q = std::max(max_q, s.q_len);
  }
  const int T = qsl.back();
  // Query rows strided as in a fused QKV buffer: stride (H + 2*kvh) * D.
  const int64_t qstride = static_cast<int64_t>(H + 2 * c.num_kv_heads) * D;
  std::vector<float> q = Quantize(RandomVector(static_cast<size_t>(T) * qstride, rng), dt);
  std::vector<float> slopes = AlibiSlopes(H);
  std::vector<int32_t> lens(c.seq_lens.begin(), c.seq_lens.end());
  DeviceBuffer dq = Upload(Encode(q, dt)), dqsl = Upload(qsl), dlens = Upload(lens);
  DeviceBuffer dbt = Upload(c.block_tables), dslopes = Upload(slopes);
  const size_t out_bytes = static_cast<size_t>(T) * H * D * DTypeSize(dt);
  DeviceBuffer dout(out_bytes);
  for (PrefillKernel kernel : {PrefillKernel::kSimt, PrefillKernel::kMma}) {
    if (kernel == PrefillKernel::kMma && !PrefillMmaFits(dt, dt, hs)) continue;
    CUDA_OK(cudaMemset(dout.get(), 0xFF, out_bytes));
    PrefillAttentionParams p;
    p.kernel = kernel;
    p.out = dout.get();
    p.query = dq.get();
    p.query_token_stride = qstride;
    p.num_seqs = S;
    p.num_heads = H;
    p.query_start_loc = static_cast<const int32_t*>(dqsl.get());
    p.seq_lens = static_cast<const int32_t*>(dlens.get());
    p.cache = c.view;
    p.block_tables = static_cast<const int32_t*>(dbt.get());
    p.max_blocks_per_seq = c.max_blocks_per_seq;
    p.max_query_len = max_q;
    p.max_seq_len = *std::max_element(lens.begin(), lens.end());
    p.scale = 1.0f / std::sqrt(static_cast<float>(D));
    p.alibi_slopes = alibi ? static_cast<const float*>(dslopes.get()) : nullptr;
    p.host_query_start_loc = qsl.data();
    p.host_seq_lens = lens.data();
    p.host_block_tables = c.block_tables.data();
    absl::Status st = PrefillAttention(p);
    ASSERT_TRUE(st.ok()) << st;
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<float> out = Decode(Download(dout.get(), out_bytes), dt);
    // Each query row (all heads) under the attention standard.
    std::vector<double> ref(static_cast<size_t>(H) * D);
    for (int s = 0; s < S; ++s) {
      for (int i = 0; i < seqs[s].q_len; ++i) {
        const int row = qsl[s] + i;
        const int qpos = seqs[s].cached + i;
        for (int h = 0; h < H; ++h)
          testing::ReferenceAttendOne(q.data() + row * qstride + static_cast<int64_t>(h) * D, h, H,
                                      c.K(s), c.V(s), qpos + 1, qpos, p.scale,
                                      alibi ? slopes[h] : 0.0, ref.data() + h * D);
        ASSERT_TRUE(testing::AttentionOutputMatches(
            out.data() + static_cast<size_t>(row) * ref.size(), ref.data(), ref.size(), dt))
            << DTypeName(dt) << (alibi ? " alibi" : "") << " head_size " << hs << " "
            << PrefillKernelName(kernel) << " seq " << s << " row " << i;
      }
    }
    EXPECT_FALSE(testing::AttentionOutputMatches(std::vector<float>(ref.size(), 0.0f), ref, dt));
  }
}

// Prefill: 14 query / 2 KV heads, head size 64, block 16; sequences with a
// cached prefix (1 cached + 8 new), a fresh one-token prompt, a chunk in the
// middle of a context, and a long prompt; every dtype, ALiBi on and off; the
// SIMT kernel and, for fp16/bf16, the tensor-core one (PrefillKernel::kMma).
TEST_F(CudaKernelsTest, PrefillMatchesReference) {
  std::mt19937 rng(11);
  const std::vector<PrefillSeq> seqs = {{1, 8}, {0, 1}, {37, 20}, {0, 600}, {100, 1}, {513, 77}};
  for (DType dt : kDTypes)
    for (bool alibi : {false, true})
      for (int hs : {64, 128}) ASSERT_NO_FATAL_FAILURE(CheckPrefillCase(dt, alibi, hs, seqs, rng));
}

// Gemma 2's attention soft-capping through the dispatchers on the device: a
// grouped bf16 case (32 query / 8 KV heads of 128, which would run the GQA
// kernels without the cap) with a cap of 1 on scores of several units.
// Decode under every request (auto, gqa, gqa_mma: all run v1/v2) and
// prefill under a tensor-core request (runs SIMT), against the capped
// reference; the uncapped call is the negative control.
TEST_F(CudaKernelsTest, SoftCappedAttentionMatchesReference) {
  std::mt19937 rng(17);
  const DType dt = DType::kBFloat16;
  PagedCase c;
  c.dtype = dt;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_size = 128;
  c.block_size = 16;
  c.seq_lens = {2, 17, 600, 1100};
  BuildPagedCase(c, rng);
  ASSERT_FALSE(HasFatalFailure());
  const int S = c.num_seqs(), H = c.num_heads, D = c.head_size;
  const float cap = 1.0f, scale = 8.0f / std::sqrt(static_cast<float>(D));
  const int max_len = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
  std::vector<float> q = Quantize(RandomVector(static_cast<size_t>(S) * H * D, rng), dt);
  std::vector<int32_t> lens(c.seq_lens.begin(), c.seq_lens.end());
  DeviceBuffer dq = Upload(Encode(q, dt)), dbt = Upload(c.block_tables), dlens = Upload(lens);
  DeviceBuffer ws(PagedAttentionV2WorkspaceBytes(S, H, D, max_len));
  const size_t n = static_cast<size_t>(H) * D, out_bytes = S * n * DTypeSize(dt);
  DeviceBuffer dout(out_bytes);
  auto decode = [&](DecodeKernel kernel, float softcap, std::vector<float>* out) {
    CUDA_OK(cudaMemset(dout.get(), 0xFF, out_bytes));
    PagedAttentionParams p;
    p.kernel = kernel;
    p.out = dout.get();
    p.query = dq.get();
    p.num_seqs = S;
    p.num_heads = H;
    p.cache = c.view;
    p.block_tables = static_cast<const int32_t*>(dbt.get());
    p.max_blocks_per_seq = c.max_blocks_per_seq;
    p.seq_lens = static_cast<const int32_t*>(dlens.get());
    p.max_seq_len = max_len;
    p.scale = scale;
    p.logit_softcap = softcap;
    p.host_block_tables = c.block_tables.data();
    p.host_seq_lens = lens.data();
    p.workspace = ws.get();
    p.workspace_bytes = ws.bytes();
    const absl::Status st = PagedAttention(p);
    ASSERT_TRUE(st.ok()) << st;
    CUDA_OK(cudaDeviceSynchronize());
    *out = Decode(Download(dout.get(), out_bytes), dt);
  };
  std::vector<float> uncapped;
  ASSERT_NO_FATAL_FAILURE(decode(DecodeKernel::kAuto, 0.0f, &uncapped));
  for (DecodeKernel kernel : {DecodeKernel::kAuto, DecodeKernel::kGqa, DecodeKernel::kGqaMma}) {
    std::vector<float> got;
    ASSERT_NO_FATAL_FAILURE(decode(kernel, cap, &got));
    for (int s = 0; s < S; ++s) {
      const std::vector<double> ref = testing::ReferenceDecode(
          q.data() + s * n, H, c.K(s), c.V(s), c.seq_lens[s], scale, nullptr, 0, cap);
      EXPECT_TRUE(testing::AttentionOutputMatches(got.data() + s * n, ref.data(), n, dt))
          << DecodeKernelName(kernel) << " request, seq " << s;
      testing::AttentionControlScope control;
      EXPECT_FALSE(testing::AttentionOutputMatches(uncapped.data() + s * n, ref.data(), n, dt))
          << "the uncapped decode passes, seq " << s;
    }
  }

  // Prefill: the last 40 tokens of each sequence as this step's queries.
  std::vector<int32_t> qsl = {0};
  for (int len : c.seq_lens) qsl.push_back(qsl.back() + std::min(len, 40));
  const int T = qsl.back(), max_q = 40;
  std::vector<float> pq = Quantize(RandomVector(static_cast<size_t>(T) * n, rng), dt);
  DeviceBuffer dpq = Upload(Encode(pq, dt)), dqsl = Upload(qsl);
  const size_t pout_bytes = T * n * DTypeSize(dt);
  DeviceBuffer dpout(pout_bytes);
  auto prefill = [&](float softcap, std::vector<float>* out) {
    CUDA_OK(cudaMemset(dpout.get(), 0xFF, pout_bytes));
    PrefillAttentionParams p;
    p.kernel = PrefillKernel::kMma;
    p.out = dpout.get();
    p.query = dpq.get();
    p.num_seqs = S;
    p.num_heads = H;
    p.query_start_loc = static_cast<const int32_t*>(dqsl.get());
    p.seq_lens = static_cast<const int32_t*>(dlens.get());
    p.cache = c.view;
    p.block_tables = static_cast<const int32_t*>(dbt.get());
    p.max_blocks_per_seq = c.max_blocks_per_seq;
    p.max_query_len = max_q;
    p.max_seq_len = max_len;
    p.scale = scale;
    p.logit_softcap = softcap;
    p.host_query_start_loc = qsl.data();
    p.host_seq_lens = lens.data();
    p.host_block_tables = c.block_tables.data();
    const absl::Status st = PrefillAttention(p);
    ASSERT_TRUE(st.ok()) << st;
    CUDA_OK(cudaDeviceSynchronize());
    *out = Decode(Download(dpout.get(), pout_bytes), dt);
  };
  std::vector<float> got, plain;
  ASSERT_NO_FATAL_FAILURE(prefill(cap, &got));
  ASSERT_NO_FATAL_FAILURE(prefill(0.0f, &plain));
  std::vector<double> ref(n);
  int uncapped_passes = 0;
  for (int s = 0; s < S; ++s) {
    const int q_len = qsl[s + 1] - qsl[s];
    for (int i = 0; i < q_len; ++i) {
      const int row = qsl[s] + i, qpos = c.seq_lens[s] - q_len + i;
      for (int h = 0; h < H; ++h)
        testing::ReferenceAttendRange(pq.data() + row * n + static_cast<size_t>(h) * D, h, H,
                                      c.K(s), c.V(s), 0, qpos + 1, qpos, scale, 0.0,
                                      ref.data() + static_cast<size_t>(h) * D, cap);
      ASSERT_TRUE(testing::AttentionOutputMatches(got.data() + row * n, ref.data(), n, dt))
          << "prefill seq " << s << " row " << i;
      if (qpos == 0) continue;  // one key: the cap changes nothing
      testing::AttentionControlScope control;
      uncapped_passes +=
          testing::AttentionOutputMatches(plain.data() + row * n, ref.data(), n, dt) ? 1 : 0;
    }
  }
  EXPECT_EQ(uncapped_passes, 0) << "the uncapped prefill passes";
}

// copy_blocks over 3 layers: destination blocks become byte copies of their
// sources in K and V; every other block is untouched.
TEST_F(CudaKernelsTest, CopyBlocksIsByteExact) {
  std::mt19937 rng(3);
  const KVCacheShape shape{12, 2, 96, 16, DType::kFloat16};
  const size_t bytes = shape.num_blocks * shape.block_bytes();
  const std::vector<BlockCopy> pairs = {{0, 5}, {3, 7}, {3, 11}, {10, 1}};
  std::vector<DeviceBuffer> bufs;
  std::vector<std::vector<uint8_t>> host;
  std::vector<KVCacheView> layers;
  std::uniform_int_distribution<int> byte(0, 255);
  for (int l = 0; l < 3; ++l) {
    for (int kv = 0; kv < 2; ++kv) {
      std::vector<uint8_t> h(bytes);
      for (auto& b : h) b = static_cast<uint8_t>(byte(rng));
      bufs.push_back(Upload(h));
      host.push_back(std::move(h));
    }
    layers.push_back({bufs[2 * l].get(), bufs[2 * l + 1].get(), shape, Device::kCUDA});
  }
  absl::Status st = CopyBlocks(layers, pairs);
  ASSERT_TRUE(st.ok()) << st;
  CUDA_OK(cudaDeviceSynchronize());
  const size_t bb = shape.block_bytes();
  for (size_t i = 0; i < host.size(); ++i) {
    std::vector<uint8_t> expect = host[i];
    for (const BlockCopy& pc : pairs)
      std::memcpy(expect.data() + pc.dst * bb, host[i].data() + pc.src * bb, bb);
    EXPECT_EQ(Download(bufs[i].get(), bytes), expect) << "buffer " << i;
  }
}

// swap out (device -> pinned and pageable host), swap back in to other device
// blocks, and device -> device: byte-identical round trips.
TEST_F(CudaKernelsTest, SwapBlocksRoundTripIsByteExact) {
  std::mt19937 rng(4);
  const KVCacheShape dev_shape{10, 2, 64, 32, DType::kBFloat16};
  KVCacheShape host_shape = dev_shape;
  host_shape.num_blocks = 6;
  const size_t bb = dev_shape.block_bytes();
  const size_t dev_bytes = dev_shape.num_blocks * bb, host_bytes = host_shape.num_blocks * bb;
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> hk(dev_bytes), hv(dev_bytes);
  for (auto& b : hk) b = static_cast<uint8_t>(byte(rng));
  for (auto& b : hv) b = static_cast<uint8_t>(byte(rng));
  DeviceBuffer dk = Upload(hk), dv = Upload(hv);
  KVCacheView dev{dk.get(), dv.get(), dev_shape, Device::kCUDA};

  for (bool pinned : {true, false}) {
    void* pk = nullptr;
    void* pv = nullptr;
    std::vector<uint8_t> pageable_k, pageable_v;
    if (pinned) {
      CUDA_OK(cudaMallocHost(&pk, host_bytes));
      CUDA_OK(cudaMallocHost(&pv, host_bytes));
    } else {
      pageable_k.resize(host_bytes);
      pageable_v.resize(host_bytes);
      pk = pageable_k.data();
      pv = pageable_v.data();
    }
    KVCacheView cpu{pk, pv, host_shape, Device::kCPU};
    const std::vector<BlockCopy> out_pairs = {{2, 0}, {9, 4}, {5, 5}};
    ASSERT_TRUE(SwapBlocks(std::span(&dev, 1), std::span(&cpu, 1), out_pairs).ok());
    CUDA_OK(cudaDeviceSynchronize());
    for (const BlockCopy& pc : out_pairs) {
      EXPECT_EQ(0,
                std::memcmp(static_cast<uint8_t*>(pk) + pc.dst * bb, hk.data() + pc.src * bb, bb));
      EXPECT_EQ(0,
                std::memcmp(static_cast<uint8_t*>(pv) + pc.dst * bb, hv.data() + pc.src * bb, bb));
    }
    // Swap back in to different device blocks.
    const std::vector<BlockCopy> in_pairs = {{0, 7}, {4, 1}, {5, 8}};
    ASSERT_TRUE(SwapBlocks(std::span(&cpu, 1), std::span(&dev, 1), in_pairs).ok());
    CUDA_OK(cudaDeviceSynchronize());
    std::vector<uint8_t> ek = hk, ev = hv;
    for (size_t i = 0; i < in_pairs.size(); ++i) {
      std::memcpy(ek.data() + in_pairs[i].dst * bb, hk.data() + out_pairs[i].src * bb, bb);
      std::memcpy(ev.data() + in_pairs[i].dst * bb, hv.data() + out_pairs[i].src * bb, bb);
    }
    EXPECT_EQ(Download(dk.get(), dev_bytes), ek) << (pinned ? "pinned" : "pageable");
    EXPECT_EQ(Download(dv.get(), dev_bytes), ev) << (pinned ? "pinned" : "pageable");
    hk = ek;
    hv = ev;
    if (pinned) {
      cudaFreeHost(pk);
      cudaFreeHost(pv);
    }
  }

  // Device -> device (another pool).
  DeviceBuffer ok(dev_bytes), ov(dev_bytes);
  CUDA_OK(cudaMemset(ok.get(), 0, dev_bytes));
  CUDA_OK(cudaMemset(ov.get(), 0, dev_bytes));
  KVCacheView other{ok.get(), ov.get(), dev_shape, Device::kCUDA};
  const std::vector<BlockCopy> pairs = {{1, 3}, {8, 0}};
  ASSERT_TRUE(SwapBlocks(std::span(&dev, 1), std::span(&other, 1), pairs).ok());
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> gk = Download(ok.get(), dev_bytes), gv = Download(ov.get(), dev_bytes);
  for (const BlockCopy& pc : pairs) {
    EXPECT_EQ(0, std::memcmp(gk.data() + pc.dst * bb, hk.data() + pc.src * bb, bb));
    EXPECT_EQ(0, std::memcmp(gv.data() + pc.dst * bb, hv.data() + pc.src * bb, bb));
  }
}

// The CUDA backend's own precondition (16-byte aligned cache buffers, for the
// vector loads) is reported as InvalidArgument before any kernel runs.
TEST_F(CudaKernelsTest, MisalignedCacheIsInvalidArgument) {
  DeviceBuffer k(4096), v(4096), q(1024), out(1024), bt(64), lens(64);
  PagedAttentionParams p;
  p.out = out.get();
  p.query = q.get();
  p.num_seqs = 1;
  p.num_heads = 1;
  p.cache = {
      static_cast<char*>(k.get()) + 2, v.get(), {1, 1, 64, 16, DType::kFloat16}, Device::kCUDA};
  p.block_tables = static_cast<const int32_t*>(bt.get());
  p.max_blocks_per_seq = 1;
  p.seq_lens = static_cast<const int32_t*>(lens.get());
  p.max_seq_len = 1;
  EXPECT_EQ(PagedAttentionV1(p).code(), absl::StatusCode::kInvalidArgument);
}

// One case of Fp8CacheMatchesReference, a (cache dtype, io dtype) pair: three
// sequences of 1, 17 and 600 tokens, K/V rounded to the io dtype, and as the
// reference's K/V their round trip decode(fp8(x / scale)) * scale. The phases
// run in order: WriteCache (the device cache, byte-compared with the CPU
// backend's), CheckDecode (v1, v2), CheckPrefill.
struct Fp8CacheCase {
  Fp8CacheCase(DType cache_dtype, DType io_dtype, std::mt19937& rng)
      : cache(cache_dtype),
        io(io_dtype),
        shape{static_cast<int64_t>(S) * max_blocks, kvh, hs, bs, cache_dtype} {
    for (int l : lens) total += l;
    k = Quantize(RandomVector(total * row, rng), io);
    v = Quantize(RandomVector(total * row, rng), io);
    tables.resize(static_cast<size_t>(S) * max_blocks);
    for (int s = 0; s < S; ++s) {
      for (int b = 0; b < max_blocks; ++b) tables[s * max_blocks + b] = s * max_blocks + b;
      for (int t = 0; t < lens[s]; ++t)
        slots.push_back(static_cast<int64_t>(s) * max_blocks * bs + t);
    }
    kr.resize(k.size());
    vr.resize(v.size());
    for (size_t i = 0; i < k.size(); ++i) {
      kr[i] = Round8(k[i], ks);
      vr[i] = Round8(v[i], vs);
    }
    dtables = Upload(tables);
    dlens = Upload(lens);
  }

  float Round8(float x, float scale) const {
    return cache == DType::kFloat8E4M3 ? Fp8E4M3BitsToFloat(FloatToFp8E4M3Bits(x / scale)) * scale
                                       : Fp8E5M2BitsToFloat(FloatToFp8E5M2Bits(x / scale)) * scale;
  }

  // reshape_and_cache on the device writes the CPU backend's bytes
  // (fp8(x / scale), saturating) into dk / dv.
  void WriteCache() {
    const size_t cache_bytes = shape.num_blocks * shape.block_bytes();
    std::vector<uint8_t> ek = Encode(k, io), ev = Encode(v, io);
    std::vector<uint8_t> hk(cache_bytes, 0x7F), hv(cache_bytes, 0x7F);
    ReshapeAndCacheParams rc;
    rc.key = ek.data();
    rc.value = ev.data();
    rc.slot_mapping = slots.data();
    rc.num_tokens = total;
    rc.io_dtype = io;
    rc.cache = {hk.data(), hv.data(), shape, Device::kCPU, ks, vs};
    ASSERT_TRUE(ReshapeAndCache(rc).ok());
    DeviceBuffer dk_in = Upload(ek), dv_in = Upload(ev), dslots = Upload(slots);
    dk = Upload(std::vector<uint8_t>(cache_bytes, 0x7F));
    dv = Upload(std::vector<uint8_t>(cache_bytes, 0x7F));
    rc.key = dk_in.get();
    rc.value = dv_in.get();
    rc.slot_mapping = static_cast<const int64_t*>(dslots.get());
    rc.cache = {dk.get(), dv.get(), shape, Device::kCUDA, ks, vs};
    absl::Status st = ReshapeAndCache(rc);
    ASSERT_TRUE(st.ok()) << st;
    CUDA_OK(cudaDeviceSynchronize());
    ASSERT_EQ(Download(dk.get(), cache_bytes), hk) << "fp8 key bytes differ from the CPU backend";
    ASSERT_EQ(Download(dv.get(), cache_bytes), hv) << "fp8 value bytes differ from the CPU backend";
  }

  // Decode, one query per sequence, v1 and v2 against the reference; negative
  // controls: k_scale / v_scale left at 1 and a zeroed output fail it.
  void CheckDecode(std::mt19937& rng) {
    const std::vector<float> q = Quantize(RandomVector(S * per_seq, rng), io);
    DeviceBuffer dq = Upload(Encode(q, io)), dout(S * per_seq * DTypeSize(io));
    DeviceBuffer dws(PagedAttentionV2WorkspaceBytes(S, heads, hs, 600));
    auto decode = [&](bool v2, float k_s, float v_s) {
      PagedAttentionParams p;
      p.out = dout.get();
      p.query = dq.get();
      p.num_seqs = S;
      p.num_heads = heads;
      p.cache = {dk.get(), dv.get(), shape, Device::kCUDA, k_s, v_s};
      p.io_dtype = io;
      p.block_tables = static_cast<const int32_t*>(dtables.get());
      p.max_blocks_per_seq = max_blocks;
      p.seq_lens = static_cast<const int32_t*>(dlens.get());
      p.max_seq_len = 600;
      p.scale = scale;
      p.host_block_tables = tables.data();
      p.host_seq_lens = lens.data();
      p.workspace = dws.get();
      const absl::Status r = v2 ? PagedAttentionV2(p) : PagedAttentionV1(p);
      EXPECT_TRUE(r.ok()) << r;
      EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      return Decode(Download(dout.get(), S * per_seq * DTypeSize(io)), io);
    };
    size_t off = 0;
    std::vector<std::vector<double>> refs;
    for (int s = 0; s < S; ++s) {
      const GatheredKV K{kr.data() + off, kvh, hs}, V{vr.data() + off, kvh, hs};
      refs.push_back(
          testing::ReferenceDecode(q.data() + s * per_seq, heads, K, V, lens[s], scale, nullptr));
      off += lens[s] * row;
    }
    for (bool v2 : {false, true}) {
      const std::vector<float> got = decode(v2, ks, vs);
      for (int s = 0; s < S; ++s)
        EXPECT_TRUE(
            testing::AttentionOutputMatches(got.data() + s * per_seq, refs[s].data(), per_seq, io))
            << (v2 ? "v2" : "v1") << " seq " << s;
      testing::AttentionControlScope control;
      const std::vector<float> no_k = decode(v2, 1.0f, vs), no_v = decode(v2, ks, 1.0f);
      EXPECT_FALSE(
          testing::AttentionOutputMatches(no_k.data() + 2 * per_seq, refs[2].data(), per_seq, io))
          << "ignoring k_scale passes";
      EXPECT_FALSE(
          testing::AttentionOutputMatches(no_v.data() + 2 * per_seq, refs[2].data(), per_seq, io))
          << "ignoring v_scale passes";
      EXPECT_FALSE(testing::AttentionOutputMatches(std::vector<float>(per_seq, 0.0f), refs[2], io));
    }
  }

  // Prefill, every sequence's whole context its prompt: a sample of rows
  // against the reference.
  void CheckPrefill(std::mt19937& rng) {
    std::vector<int32_t> qsl = {0};
    for (int l : lens) qsl.push_back(qsl.back() + l);
    const std::vector<float> pq =
        Quantize(RandomVector(static_cast<size_t>(total) * per_seq, rng), io);
    DeviceBuffer dpq = Upload(Encode(pq, io)),
                 dpout(static_cast<size_t>(total) * per_seq * DTypeSize(io));
    DeviceBuffer dqsl = Upload(qsl);
    PrefillAttentionParams pf;
    pf.out = dpout.get();
    pf.query = dpq.get();
    pf.num_seqs = S;
    pf.num_heads = heads;
    pf.query_start_loc = static_cast<const int32_t*>(dqsl.get());
    pf.seq_lens = static_cast<const int32_t*>(dlens.get());
    pf.cache = {dk.get(), dv.get(), shape, Device::kCUDA, ks, vs};
    pf.io_dtype = io;
    pf.block_tables = static_cast<const int32_t*>(dtables.get());
    pf.max_blocks_per_seq = max_blocks;
    pf.max_query_len = 600;
    pf.max_seq_len = 600;
    pf.scale = scale;
    pf.host_query_start_loc = qsl.data();
    pf.host_seq_lens = lens.data();
    pf.host_block_tables = tables.data();
    const absl::Status st = PrefillAttention(pf);
    ASSERT_TRUE(st.ok()) << st;
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> pgot =
        Decode(Download(dpout.get(), static_cast<size_t>(total) * per_seq * DTypeSize(io)), io);
    std::vector<double> ref(per_seq);
    size_t off = 0;
    for (int s = 0; s < S; ++s) {
      const GatheredKV K{kr.data() + off, kvh, hs}, V{vr.data() + off, kvh, hs};
      for (int i = 0; i < lens[s]; i += std::max(1, lens[s] / 7)) {  // a sample of rows
        const size_t r = static_cast<size_t>(qsl[s]) + i;
        for (int h = 0; h < heads; ++h)
          testing::ReferenceAttendOne(pq.data() + r * per_seq + static_cast<size_t>(h) * hs, h,
                                      heads, K, V, i + 1, i, scale, 0.0, ref.data() + h * hs);
        EXPECT_TRUE(
            testing::AttentionOutputMatches(pgot.data() + r * per_seq, ref.data(), per_seq, io))
            << "prefill seq " << s << " row " << i;
      }
      off += lens[s] * row;
    }
  }

  const DType cache, io;
  static constexpr int heads = 4, kvh = 2, hs = 128, bs = 16;
  static constexpr float ks = 0.043f, vs = 0.021f;
  const std::vector<int32_t> lens = {1, 17, 600};
  const int S = static_cast<int>(lens.size());
  const int max_blocks = (600 + bs - 1) / bs + 1;
  const KVCacheShape shape;
  const size_t row = static_cast<size_t>(kvh) * hs;
  const size_t per_seq = static_cast<size_t>(heads) * hs;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hs));
  int total = 0;
  std::vector<float> k, v, kr, vr;
  std::vector<int64_t> slots;
  std::vector<int32_t> tables;
  DeviceBuffer dk, dv, dtables, dlens;
};

// fp8 caches through the public API on the device: reshape_and_cache writes
// the CPU backend's bytes (fp8(x / scale), saturating), decode v1 / v2 and
// prefill (the launchers fold k_scale into the softmax scale) match the
// double reference on decode(fp8(x / scale)) * scale under the io dtype's
// attention standard; negative controls: zeroed output and k_scale / v_scale
// left at 1 on the device fail it.
TEST_F(CudaKernelsTest, Fp8CacheMatchesReference) {
  std::mt19937 rng(11);
  struct Case {
    DType cache, io;
  };
  for (const Case& cs :
       {Case{DType::kFloat8E4M3, DType::kFloat32}, Case{DType::kFloat8E4M3, DType::kBFloat16},
        Case{DType::kFloat8E5M2, DType::kFloat16}}) {
    SCOPED_TRACE(std::string(DTypeName(cs.cache)) + " io " + DTypeName(cs.io));
    Fp8CacheCase c(cs.cache, cs.io, rng);
    ASSERT_NO_FATAL_FAILURE(c.WriteCache());
    ASSERT_NO_FATAL_FAILURE(c.CheckDecode(rng));
    ASSERT_NO_FATAL_FAILURE(c.CheckPrefill(rng));
  }
}

}  // namespace
}  // namespace pagedserve::kernels
