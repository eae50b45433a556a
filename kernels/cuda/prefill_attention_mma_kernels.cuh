// Internal: causal prefill attention over the paged KV cache on tensor cores
// (FlashAttention-2's tiling, Dao 2023, over a paged cache as vLLM's and
// FlashInfer's prefill kernels do), through the CUDA WMMA API (nvcuda::wmma,
// m16n16k16, fp16/bf16 operands, fp32 accumulation). Same problem and
// arguments as PrefillAttentionKernel (prefill_attention_kernels.cuh) for
// caches of the query type (fp16 or bf16).
//
// Per block (num_heads, num_seqs, ceil(max_query_len / 64)), 4 warps; warp w
// owns query rows [16 w, 16 w + 16) of the block's 64. For each 32-token
// tile of the keys the block's rows may see:
//   1. K tile -> k_s[32][D + 8], V tile -> v_s[32][D + 8] (token-major),
//      16-bit as stored; slots past the visible keys hold 0.
//   2. warp w: S_w[16][32] = Q_w[16][D] . K_tile^T (two 16x16 blocks, D / 16
//      MMAs each), stored to its rows of s_s.
//   3. warp w, row by row (lane = token): scale, ALiBi, the causal mask, the
//      online softmax (GqaOnlineSoftmax), P as P_hi + P_lo in 16 bits (the
//      split that lets the tensor-core GQA decode kernel meet the attention
//      standard; gqa_decode_mma_kernels.cuh says why), then its
//      accumulator rows rescaled.
//   4. warp w: O_w[16][D] += P_w[16][32] . V_tile[32][D], one 16-column block
//      of its accumulator rows at a time (fp32, in shared memory: a WMMA
//      accumulator's element layout is opaque, so the per-row rescale of step
//      3 cannot run on fragments).
// A warp skips the tiles none of its rows may see (the causal triangle);
// every warp joins the block's two barriers per tile. Steps 2-4 touch only
// the warp's own rows, so they are ordered by __syncwarp.
//
// Status: its source runs through tests/kernels/simt_emulator.h (WMMA
// modelled as for the GQA decode kernel) against the double reference in
// tests/kernels/cuda_emulation_test.cc, and compiles for sm_80 / sm_90; no
// device has run it. The dispatcher takes it only when asked
// (PrefillKernel::kMma or PAGEDSERVE_PREFILL_KERNEL=mma), never under kAuto.
#ifndef PAGEDSERVE_KERNELS_CUDA_PREFILL_ATTENTION_MMA_KERNELS_CUH_
#define PAGEDSERVE_KERNELS_CUDA_PREFILL_ATTENTION_MMA_KERNELS_CUH_

#include <cstdint>

#ifdef __CUDACC__
#include <mma.h>
#endif

#include "kernels/cuda/dtype_utils.cuh"
#include "kernels/cuda/gqa_decode_kernels.cuh"      // GqaOnlineSoftmax
#include "kernels/cuda/gqa_decode_mma_kernels.cuh"  // LoadKvTile16, MmaAttentionSmem
#include "kernels/cuda/prefill_attention_mma_plan.h"

namespace pagedserve::kernels::cuda {

// Grid (num_heads, num_seqs, ceil(max_query_len / kPrefillMmaRows)),
// kPrefillMmaThreads threads, PrefillMmaSharedBytes(HEAD_SIZE) bytes of
// dynamic shared memory. T is __half or __nv_bfloat16 for the queries, the
// cache and the output alike; HEAD_SIZE % 16 == 0. Arguments as
// PrefillAttentionKernel's.
template <typename T, int HEAD_SIZE>
__global__ void __launch_bounds__(kPrefillMmaThreads)
    PrefillAttentionMmaKernel(T* __restrict__ out, const T* __restrict__ q, int64_t q_token_stride,
                              const int32_t* __restrict__ query_start_loc,
                              const int32_t* __restrict__ seq_lens, const T* __restrict__ k_cache,
                              const T* __restrict__ v_cache, int num_kv_heads, int block_size,
                              const int32_t* __restrict__ block_tables, int max_blocks_per_seq,
                              float scale, const float* __restrict__ alibi_slopes) {
  constexpr int NUM_WARPS = kPrefillMmaThreads / kWarpSize;
  constexpr int ROWS = kPrefillMmaRows;
  constexpr int TILE = kPrefillMmaKeyTile;
  constexpr int X = kVec16<T>;  // 8 elements per 16-byte vector
  constexpr int KVS = GqaMmaKvStride(HEAD_SIZE);
  constexpr int PS = kGqaMmaPStride;
  constexpr int AS = GqaMmaAccStride(HEAD_SIZE);
  static_assert(TILE == kWarpSize, "the softmax step maps one lane to one token");
  static_assert(ROWS == 16 * NUM_WARPS, "16 query rows per warp");
  static_assert(HEAD_SIZE % 16 == 0 && X == 8, "16-bit operands, 16x16 tiles");

  const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;
  const int q_begin = query_start_loc[seq];
  const int q_len = query_start_loc[seq + 1] - q_begin;
  const int row0 = blockIdx.z * ROWS;
  if (row0 >= q_len) return;  // whole block
  const int seq_len = seq_lens[seq];
  const int ctx0 = seq_len - q_len;  // position of query row 0
  const int rows_here = min(ROWS, q_len - row0);
  const int kv_end = ctx0 + row0 + rows_here;  // keys [0, kv_end) are visible to the block
  // The last key position warp `warp`'s rows see (-1: the warp has no rows).
  const int warp_rows = min(16, rows_here - 16 * warp);
  const int warp_last_key = warp_rows > 0 ? ctx0 + row0 + 16 * warp + warp_rows - 1 : -1;

  const int kv_head = head / (num_heads / num_kv_heads);
  const float slope = alibi_slopes != nullptr ? alibi_slopes[head] : 0.0f;
  const int kv_head_stride = HEAD_SIZE * block_size;
  const int64_t kv_block_stride = static_cast<int64_t>(num_kv_heads) * kv_head_stride;
  const int32_t* block_table = block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq;
  const T* k_head = k_cache + static_cast<int64_t>(kv_head) * kv_head_stride;
  const T* v_head = v_cache + static_cast<int64_t>(kv_head) * kv_head_stride;

  // Dynamic shared memory, in the order of PrefillMmaSharedBytes.
  PAGEDSERVE_DYNAMIC_SHARED(T, smem);
  const MmaAttentionSmem<T, HEAD_SIZE, ROWS> sm(smem);
  T *k_s = sm.k, *v_s = sm.v, *q_s = sm.q, *p_s = sm.p_hi, *plo_s = sm.p_lo;
  float *s_s = sm.s, *acc_s = sm.acc, *m_s = sm.m, *l_s = sm.l, *alpha_s = sm.alpha;

  // Query rows of the block (16-bit, unscaled: the scale applies to S);
  // rows past q_len are 0.
  for (int i = tid; i < ROWS * HEAD_SIZE; i += kPrefillMmaThreads) {
    const int r = i / HEAD_SIZE, d = i % HEAD_SIZE;
    q_s[r * KVS + d] = r < rows_here ? q[static_cast<int64_t>(q_begin + row0 + r) * q_token_stride +
                                         static_cast<int64_t>(head) * HEAD_SIZE + d]
                                     : FromFloat<T>(0.0f);
    acc_s[r * AS + d] = 0.0f;
  }
  for (int r = tid; r < ROWS; r += kPrefillMmaThreads) {
    m_s[r] = -INFINITY;
    l_s[r] = 0.0f;
  }

  const int wr0 = 16 * warp;  // the warp's first row
  for (int tile_start = 0; tile_start < kv_end; tile_start += TILE) {
    __syncthreads();  // the previous tile is consumed (first pass: q_s is written)
    // ---- 1. K and V of this tile, 16-bit, into shared memory (0 past kv_end).
    LoadKvTile16<T, HEAD_SIZE, kPrefillMmaThreads, TILE, KVS>(
        k_s, v_s, k_head, v_head, block_table, block_size, kv_block_stride, tile_start, kv_end);
    __syncthreads();
    if (tile_start > warp_last_key) continue;  // warp-uniform: no row of the warp sees the tile

      // ---- 2. S_w = Q_w K^T, two 16-token blocks.
#pragma unroll
    for (int nb = 0; nb < TILE / 16; ++nb)
      MmaScoreBlock<T, HEAD_SIZE, KVS>(q_s + wr0 * KVS, k_s + nb * 16 * KVS,
                                       s_s + wr0 * TILE + nb * 16, TILE);
    __syncwarp();

    // ---- 3. Online softmax, row by row (lane = token); P as T.
    const int token = tile_start + lane;
    for (int r = wr0; r < wr0 + 16; ++r) {
      const int q_pos = ctx0 + row0 + r;
      if (r >= rows_here) {  // warp-uniform
        p_s[r * PS + lane] = FromFloat<T>(0.0f);
        plo_s[r * PS + lane] = FromFloat<T>(0.0f);
        if (lane == 0) alpha_s[r] = 1.0f;
        continue;
      }
      // Causal: keys up to the row's own position (< kv_end). Key 0 is in
      // the first tile, so every row's first step has a finite logit.
      float s = -INFINITY;
      if (token <= q_pos)
        s = scale * s_s[r * TILE + lane] + slope * static_cast<float>(token - q_pos);
      const float p = GqaOnlineSoftmax(s, lane, &m_s[r], &l_s[r], &alpha_s[r]);
      const T hi = FromFloat<T>(p);
      p_s[r * PS + lane] = hi;
      plo_s[r * PS + lane] = FromFloat<T>(p - ToFloat(hi));
    }
    __syncwarp();
    for (int i = lane; i < 16 * HEAD_SIZE; i += kWarpSize) {
      const int r = wr0 + i / HEAD_SIZE, d = i % HEAD_SIZE;
      acc_s[r * AS + d] *= alpha_s[r];
    }
    __syncwarp();

    // ---- 4. O_w += P_w V, one 16-column block at a time.
    for (int n0 = 0; n0 < HEAD_SIZE; n0 += 16)
      MmaAccumulatePv<T, TILE, PS, KVS>(acc_s + wr0 * AS + n0, AS, p_s + wr0 * PS, plo_s + wr0 * PS,
                                        v_s + n0);
    __syncwarp();
  }
  __syncthreads();

  // ---- Output: acc / l for the block's rows (l >= 1: the max term is exp(0)).
  for (int i = tid; i < rows_here * HEAD_SIZE; i += kPrefillMmaThreads) {
    const int r = i / HEAD_SIZE, d = i % HEAD_SIZE;
    out[(static_cast<int64_t>(q_begin + row0 + r) * num_heads + head) * HEAD_SIZE + d] =
        FromFloat<T>(acc_s[r * AS + d] / l_s[r]);
  }
}

}  // namespace pagedserve::kernels::cuda

#endif  // PAGEDSERVE_KERNELS_CUDA_PREFILL_ATTENTION_MMA_KERNELS_CUH_
