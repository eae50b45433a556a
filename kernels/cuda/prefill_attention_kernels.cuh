// Internal: causal prefill attention over the paged KV cache (prompts, chunked prefill,
// prompts with a cached prefix), var-len batch flattened by query_start_loc.
//
// A straightforward tiled kernel with online softmax (Milakov & Gimelshein,
// "Online normalizer calculation for softmax", 2018; the FlashAttention
// recurrence, Dao et al. 2022): one thread block of 128 threads per (head,
// sequence, tile of 8 query rows); 16 threads per query row. For each tile of
// 16 keys, K and V are gathered from the paged cache into shared memory (K with
// 16-byte loads along the [head_size/x, block_size, x] layout), thread (row r,
// lane k) scores key k for row r, the row's running max and sum are updated
// with 16-lane shuffles, and thread (r, k) accumulates head dims k, k+16, ...
// in fp32 registers. Templated on the element types (T: query/output, CACHE_T:
// the cache, = T except for an fp8 cache) and HEAD_SIZE. An fp8 cache is
// gathered with 16-byte key loads (x = 16) and 8-byte value loads (8 tokens),
// converted in registers; the caller folds k_scale into `scale` and the kernel
// multiplies the output by v_scale. sliding_window > 0 limits each row to
// the keys (pos - window, pos]; logit_softcap > 0 replaces each score s
// (scaled, ALiBi added) by logit_softcap * tanh(s / logit_softcap) before the
// mask and the softmax (Gemma 2's attention soft-capping).
#ifndef PAGEDSERVE_KERNELS_CUDA_PREFILL_ATTENTION_KERNELS_CUH_
#define PAGEDSERVE_KERNELS_CUDA_PREFILL_ATTENTION_KERNELS_CUH_

// Kernel source shared by prefill_attention.cu and the CPU emulation test
// (see paged_attention_kernels.cuh).
#include <cstdint>

#include "kernels/cuda/dtype_utils.cuh"

namespace pagedserve::kernels::cuda {

constexpr int kPrefillThreads = 128;
constexpr int kLanesPerRow = 16;
constexpr int kRowsPerTile = kPrefillThreads / kLanesPerRow;  // 8
constexpr int kKeyTile = 16;                                  // == kLanesPerRow

template <typename T, int HEAD_SIZE, typename CACHE_T = T>
__global__ void __launch_bounds__(kPrefillThreads)
    PrefillAttentionKernel(T* __restrict__ out, const T* __restrict__ q, int64_t q_token_stride,
                           const int32_t* __restrict__ query_start_loc,
                           const int32_t* __restrict__ seq_lens,
                           const CACHE_T* __restrict__ k_cache, const CACHE_T* __restrict__ v_cache,
                           int num_kv_heads, int block_size,
                           const int32_t* __restrict__ block_tables, int max_blocks_per_seq,
                           float scale, const float* __restrict__ alibi_slopes,
                           float v_scale,          // fp8 caches only; ignored otherwise
                           int sliding_window,     // > 0: row at pos sees (pos - window, pos]
                           float logit_softcap) {  // > 0: s -> cap * tanh(s / cap)
  constexpr int X = CacheElem<CACHE_T>::kKeyVec;
  constexpr int VX = CacheElem<CACHE_T>::kValueVec;  // tokens per V vector
  constexpr int NUM_CHUNKS = HEAD_SIZE / X;          // 16-byte key chunks per token
  constexpr int V_PER_ROW = kKeyTile / VX;           // V vectors per head dim per tile
  constexpr int DIMS_PER_LANE = HEAD_SIZE / kLanesPerRow;
  constexpr int K_STRIDE = HEAD_SIZE + 1;  // odd stride: conflict-free column reads
  static_assert(HEAD_SIZE % kLanesPerRow == 0, "head size");

  const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
  const int tid = threadIdx.x, lane = tid % kWarpSize;
  const int q_begin = query_start_loc[seq];
  const int q_len = query_start_loc[seq + 1] - q_begin;
  const int row0 = blockIdx.z * kRowsPerTile;
  if (row0 >= q_len) return;  // whole block
  const int seq_len = seq_lens[seq];
  const int ctx0 = seq_len - q_len;  // position of query row 0
  const int rows_here = min(kRowsPerTile, q_len - row0);
  const int kv_end = ctx0 + row0 + rows_here;  // keys [0, kv_end) are visible to this tile

  const int kv_head = head / (num_heads / num_kv_heads);
  const float alibi_slope = alibi_slopes != nullptr ? alibi_slopes[head] : 0.0f;
  const int kv_head_stride = HEAD_SIZE * block_size;
  const int64_t kv_block_stride = static_cast<int64_t>(num_kv_heads) * kv_head_stride;
  const int32_t* block_table = block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq;
  const CACHE_T* k_head = k_cache + static_cast<int64_t>(kv_head) * kv_head_stride;
  const CACHE_T* v_head = v_cache + static_cast<int64_t>(kv_head) * kv_head_stride;

  __shared__ float q_smem[kRowsPerTile][HEAD_SIZE];
  __shared__ float k_smem[kKeyTile * K_STRIDE];
  __shared__ float v_smem[kKeyTile][HEAD_SIZE];

  // Query rows of this tile, pre-scaled; rows past q_len are zero.
  for (int i = tid; i < kRowsPerTile * HEAD_SIZE; i += kPrefillThreads) {
    const int r = i / HEAD_SIZE, d = i % HEAD_SIZE;
    float v = 0.0f;
    if (r < rows_here) {
      const int64_t row = q_begin + row0 + r;
      v = ToFloat(q[row * q_token_stride + static_cast<int64_t>(head) * HEAD_SIZE + d]) * scale;
    }
    q_smem[r][d] = v;
  }

  const int r = tid / kLanesPerRow;   // query row within the tile
  const int kl = tid % kLanesPerRow;  // key within the key tile / head-dim lane
  const int half_base = lane & ~(kLanesPerRow - 1);
  const int q_pos = ctx0 + row0 + r;
  const bool row_valid = r < rows_here;
  float m = -INFINITY, l = 0.0f;
  float o[DIMS_PER_LANE];
#pragma unroll
  for (int j = 0; j < DIMS_PER_LANE; ++j) o[j] = 0.0f;

  // Sliding window: the tile's first row sees keys from kv_first on; key tiles
  // wholly before it are skipped.
  const int kv_first = sliding_window > 0 ? max(0, ctx0 + row0 + 1 - sliding_window) : 0;
  for (int kt0 = kv_first / kKeyTile * kKeyTile; kt0 < kv_end; kt0 += kKeyTile) {
    __syncthreads();  // the previous tile is consumed (first pass: q_smem is written)
    // Gather K: consecutive threads read consecutive tokens of one 16-byte chunk.
    for (int i = tid; i < kKeyTile * NUM_CHUNKS; i += kPrefillThreads) {
      const int tok = i % kKeyTile, c = i / kKeyTile;
      const int pos = kt0 + tok;
      float f[X];
      if (pos < kv_end) {
        const int64_t pb = block_table[pos / block_size];
        const int off = pos % block_size;
        Unpack16(Load16(PAGEDSERVE_GLOBAL_READ(k_head + pb * kv_block_stride +
                                                   (static_cast<int64_t>(c) * block_size + off) * X,
                                               16)),
                 static_cast<const CACHE_T*>(nullptr), f);
      } else {
#pragma unroll
        for (int e = 0; e < X; ++e) f[e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < X; ++e) *PAGEDSERVE_SHARED(&k_smem[tok * K_STRIDE + c * X + e]) = f[e];
    }
    // Gather V: one vector = VX consecutive tokens of head dim d (VX divides
    // 8 and every block size, so a vector never straddles blocks).
    for (int i = tid; i < HEAD_SIZE * V_PER_ROW; i += kPrefillThreads) {
      const int d = i / V_PER_ROW, vv = i % V_PER_ROW;
      const int pos0 = kt0 + vv * VX;
      float f[VX];
      if (pos0 < kv_end) {
        const int64_t pb = block_table[pos0 / block_size];
        const int off = pos0 % block_size;
        UnpackValueVec<CACHE_T>(
            LoadValueVec(PAGEDSERVE_GLOBAL_READ(
                v_head + pb * kv_block_stride + static_cast<int64_t>(d) * block_size + off,
                sizeof(typename CacheElem<CACHE_T>::ValueVec))),
            f);
#pragma unroll
        for (int e = 0; e < VX; ++e)
          if (pos0 + e >= kv_end) f[e] = 0.0f;  // garbage past the visible keys
      } else {
#pragma unroll
        for (int e = 0; e < VX; ++e) f[e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < VX; ++e) *PAGEDSERVE_SHARED(&v_smem[vv * VX + e][d]) = f[e];
    }
    __syncthreads();

    // Score of (row r, key kt0 + kl).
    float s = 0.0f;
#pragma unroll 16
    for (int d = 0; d < HEAD_SIZE; ++d)
      s = fmaf(*PAGEDSERVE_SHARED(&q_smem[r][d]), *PAGEDSERVE_SHARED(&k_smem[kl * K_STRIDE + d]),
               s);
    const int k_pos = kt0 + kl;
    const bool valid = row_valid && k_pos <= q_pos &&  // causal; q_pos < seq_len
                       (sliding_window <= 0 || k_pos > q_pos - sliding_window);
    s += alibi_slope * static_cast<float>(k_pos - q_pos);
    if (logit_softcap > 0.0f) s = logit_softcap * tanhf(s / logit_softcap);  // Gemma 2
    float tile_max = valid ? s : -INFINITY;
#pragma unroll
    for (int msk = kLanesPerRow / 2; msk >= 1; msk /= 2)
      tile_max = fmaxf(tile_max, __shfl_xor_sync(kFullMask, tile_max, msk));
    const float m_new = fmaxf(m, tile_max);
    const float p = valid ? __expf(s - m_new) : 0.0f;
    float p_sum = p;
#pragma unroll
    for (int msk = kLanesPerRow / 2; msk >= 1; msk /= 2)
      p_sum += __shfl_xor_sync(kFullMask, p_sum, msk);
    const float alpha = m == -INFINITY ? 0.0f : __expf(m - m_new);
    l = l * alpha + p_sum;
    m = m_new;
#pragma unroll
    for (int j = 0; j < DIMS_PER_LANE; ++j) o[j] *= alpha;
#pragma unroll
    for (int k = 0; k < kKeyTile; ++k) {
      const float pk = __shfl_sync(kFullMask, p, half_base + k);
#pragma unroll
      for (int j = 0; j < DIMS_PER_LANE; ++j)
        o[j] = fmaf(pk, *PAGEDSERVE_SHARED(&v_smem[k][kl + j * kLanesPerRow]), o[j]);
    }
  }

  if (row_valid) {
    float inv_l = 1.0f / l;  // l >= 1: the row's own key is always visible
    if constexpr (kIsFp8<CACHE_T>) inv_l *= v_scale;
    T* out_row = out + (static_cast<int64_t>(q_begin + row0 + r) * num_heads + head) * HEAD_SIZE;
#pragma unroll
    for (int j = 0; j < DIMS_PER_LANE; ++j)
      out_row[kl + j * kLanesPerRow] = FromFloat<T>(o[j] * inv_l);
  }
}

}  // namespace pagedserve::kernels::cuda

#endif  // PAGEDSERVE_KERNELS_CUDA_PREFILL_ATTENTION_KERNELS_CUH_
