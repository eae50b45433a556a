// Internal: the tensor-core variant of the GQA decode attention kernel
// (gqa_decode_kernels.cuh): the same grid, split plan, workspace layout and
// online softmax, with the two dot-product steps on tensor cores through the
// CUDA WMMA API (nvcuda::wmma, m16n16k16, fp16/bf16 operands, fp32
// accumulation) instead of fp32 FMAs:
//
//   S[16][32]  = Q[16][D] . K_tile^T       (the group's query heads are the
//                                           rows, zero-padded to 16)
//   O[16][D]  += P[16][32] . V_tile[32][D] (P: the tile's fp32
//                                           probabilities as a sum of two
//                                           16-bit tiles, P_hi + P_lo)
//
// This is how FlashInfer's decode kernels use tensor cores for large GQA
// groups (Ye et al., FlashInfer, 2025: "use_tensor_cores" decode, which runs
// the prefill-style MMA path over the group's heads) and how
// FlashAttention-2 (Dao, 2023) rounds P to the operand type before P.V.
// Rounding P alone (relative error 2^-11 for fp16, 2^-8 for bf16 per
// probability) fails the attention standard of the FMA kernel
// (tests/kernels/attention_check.h) on outputs that cancel, so P is split
// into P_hi = round(P) and P_lo = round(P - P_hi), two MMAs each: the pair
// carries about 22 (fp16) or 16 (bf16) bits of each probability, and the
// extra MMAs cost nothing a memory-bound decode notices. Q and K are 16-bit
// already (the only case taken), so S is exact up to fp32 accumulation.
//
// Per block (num_kv_heads, num_seqs, num_splits), 4 warps, for each 32-token
// tile of its split:
//   1. K tile -> k_s[32][D + 8], V tile -> v_s[32][D + 8] (token-major), both
//      16-bit, copied without conversion; slots past the context hold 0.
//   2. warps 0-1: one 16x16 block of S each (D / 16 MMAs), stored to s_s.
//   3. every warp: online softmax for heads g = warp, warp + 4, ... < group
//      (lane = token), P -> p_s as P_hi and P_lo (16-bit; rows >= group are
//      0), rescale factors; then acc_s rows rescaled.
//   4. warp w: the 16-column blocks w, w + 4, ... of O: load the fp32
//      accumulator block from acc_s, four MMAs over the tile's 32 tokens
//      (P_hi and P_lo), store it back.
// Output as the FMA kernel's: out = acc / l (one split) or the split's
// (max, sum, acc / l) for the v2 reduce.
//
// Status: its source runs through tests/kernels/simt_emulator.h (whose WMMA
// model gives each lane the whole tile and computes a lane's share of the
// outputs; the device layout is opaque to code that, like this kernel, uses
// only load / mma / store / fill) against the double reference in
// tests/kernels/cuda_gqa_emulation_test.cc, and compiles for sm_80 / sm_90;
// no device has run it. The dispatcher takes it only when asked
// (DecodeKernel::kGqaMma), never under kAuto, until a device shows it is
// correct and faster there.
#ifndef PAGEDSERVE_KERNELS_CUDA_GQA_DECODE_MMA_KERNELS_CUH_
#define PAGEDSERVE_KERNELS_CUDA_GQA_DECODE_MMA_KERNELS_CUH_

#include <cstdint>

#ifdef __CUDACC__
#include <mma.h>
#endif

#include "kernels/cuda/dtype_utils.cuh"
#include "kernels/cuda/gqa_decode_kernels.cuh"  // GqaSplitRange, GqaOnlineSoftmax, GqaWriteOutput
#include "kernels/cuda/gqa_decode_plan.h"

namespace pagedserve::kernels::cuda {

// The eight 16-bit elements of a 16-byte vector, as they are.
template <typename T>
__device__ __forceinline__ void Unpack16Raw(const uint4& r, T* out) {
  static_assert(sizeof(T) == 2, "16-bit elements");
  memcpy(static_cast<void*>(out), &r, sizeof(r));
}

// The dynamic shared memory of a tensor-core attention block with ROWS query
// rows, placed in the order of MmaAttentionSharedBytes (gqa_decode_plan.h)
// from the block's 128-byte aligned base. Shared by the decode and prefill
// kernels.
template <typename T, int HEAD_SIZE, int ROWS>
struct MmaAttentionSmem {
  static constexpr int TILE = kGqaTileTokens;
  static constexpr int KVS = GqaMmaKvStride(HEAD_SIZE);
  static constexpr int PS = kGqaMmaPStride;
  static constexpr int AS = GqaMmaAccStride(HEAD_SIZE);
  T* k;          // [TILE][KVS] keys of the tile
  T* v;          // [TILE][KVS] values of the tile
  T* q;          // [ROWS][KVS] queries
  T* p_hi;       // [ROWS][PS] probabilities, 16-bit high part
  T* p_lo;       // [ROWS][PS] and low part
  float* s;      // [ROWS][TILE] logits
  float* acc;    // [ROWS][AS] output accumulators
  float* m;      // [ROWS] running max
  float* l;      // [ROWS] running sum
  float* alpha;  // [ROWS] this tile's rescale factor
  __device__ explicit MmaAttentionSmem(T* base)
      : k(base),
        v(k + TILE * KVS),
        q(v + TILE * KVS),
        p_hi(q + ROWS * KVS),
        p_lo(p_hi + ROWS * PS),
        s(reinterpret_cast<float*>(p_lo + ROWS * PS)),
        acc(s + ROWS * TILE),
        m(acc + ROWS * AS),
        l(m + ROWS),
        alpha(l + ROWS) {}
};

// Block-wide: the keys and values of tokens [tile_start, tile_start + TILE)
// of one KV head, 16-bit as stored, into k_s / v_s ([TILE][KVS],
// token-major); tokens at or past `end` read nothing and hold 0 (0 * NaN of
// an unwritten slot would be NaN in P V). k_head / v_head: the head's
// elements in block 0 of the paged cache; kv_block_stride: elements per
// cache block. Shared by the tensor-core decode and prefill kernels.
template <typename T, int HEAD_SIZE, int NUM_THREADS, int TILE, int KVS>
__device__ __forceinline__ void LoadKvTile16(T* k_s, T* v_s, const T* k_head, const T* v_head,
                                             const int32_t* block_table, int block_size,
                                             int64_t kv_block_stride, int tile_start, int end) {
  constexpr int X = kVec16<T>;  // 8 elements per 16-byte vector
  constexpr int NUM_CHUNKS = HEAD_SIZE / X;
  constexpr int V_GROUPS = TILE / X;
  const int tid = threadIdx.x;
  for (int i = tid; i < NUM_CHUNKS * TILE; i += NUM_THREADS) {
    const int c = i / TILE, t = i % TILE, token = tile_start + t;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (token < end) {
      const int64_t block = block_table[token / block_size];
      raw = Load16(PAGEDSERVE_GLOBAL_READ(
          k_head + block * kv_block_stride +
              (static_cast<int64_t>(c) * block_size + token % block_size) * X,
          16));
    }
    Store16(PAGEDSERVE_SHARED(reinterpret_cast<uint4*>(k_s + t * KVS + c * X)), raw);
  }
  for (int i = tid; i < HEAD_SIZE * V_GROUPS; i += NUM_THREADS) {
    const int d = i / V_GROUPS, t0 = (i % V_GROUPS) * X, token0 = tile_start + t0;
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (token0 < end) {
      const int64_t block = block_table[token0 / block_size];
      raw = Load16(PAGEDSERVE_GLOBAL_READ(v_head + block * kv_block_stride +
                                              static_cast<int64_t>(d) * block_size +
                                              token0 % block_size,
                                          16));
    }
    T v[X];
    Unpack16Raw(raw, v);
#pragma unroll
    for (int e = 0; e < X; ++e)
      *PAGEDSERVE_SHARED(&v_s[(t0 + e) * KVS + d]) = token0 + e < end ? v[e] : FromFloat<T>(0.0f);
  }
}

// Warp-wide: one 16x16 block of S = Q K^T in fp32 (tensor cores): s[16][16]
// (row stride lds) = q[16][HEAD_SIZE] . k[16][HEAD_SIZE]^T, q and k 16-bit,
// row stride KVS (k token-major, read as a col-major B).
template <typename T, int HEAD_SIZE, int KVS>
__device__ __forceinline__ void MmaScoreBlock(const T* q, const T* k, float* s, int lds) {
  namespace wmma = ::nvcuda::wmma;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, 0.0f);
#pragma unroll
  for (int kk = 0; kk < HEAD_SIZE; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> b;
    wmma::load_matrix_sync(a, q + kk, KVS);
    wmma::load_matrix_sync(b, k + kk, KVS);  // K^T: K row-major
    wmma::mma_sync(acc, a, b, acc);
  }
  wmma::store_matrix_sync(s, acc, lds, wmma::mem_row_major);
}

// Warp-wide: acc[16][16] (fp32, row stride las) += (p_hi + p_lo)[16][TILE]
// (16-bit, row stride PS) . v[TILE][16] (16-bit, row stride KVS), the small
// part first (see the P split above).
template <typename T, int TILE, int PS, int KVS>
__device__ __forceinline__ void MmaAccumulatePv(float* acc, int las, const T* p_hi, const T* p_lo,
                                                const T* v) {
  namespace wmma = ::nvcuda::wmma;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> o;
  wmma::load_matrix_sync(o, acc, las, wmma::mem_row_major);
#pragma unroll
  for (int kk = 0; kk < TILE; kk += 16) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> a_hi, a_lo;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major> b;
    wmma::load_matrix_sync(a_hi, p_hi + kk, PS);
    wmma::load_matrix_sync(a_lo, p_lo + kk, PS);
    wmma::load_matrix_sync(b, v + kk * KVS, KVS);
    wmma::mma_sync(o, a_lo, b, o);
    wmma::mma_sync(o, a_hi, b, o);
  }
  wmma::store_matrix_sync(acc, o, las, wmma::mem_row_major);
}

// Grid (num_kv_heads, num_seqs, num_splits), NUM_THREADS threads (whole
// warps, at least 2), dynamic shared memory GqaMmaSharedBytes(HEAD_SIZE). T is
// __half or __nv_bfloat16, for the queries, the cache and the output alike.
// Arguments and outputs as GqaDecodeKernel's (split_tokens == 0: one split,
// `out` written; > 0: the split partials), with group_size <=
// kGqaMmaMaxGroup and HEAD_SIZE % 16 == 0 (GqaMmaSupports).
template <typename T, int HEAD_SIZE, int NUM_THREADS>
__global__ void __launch_bounds__(NUM_THREADS)
    GqaDecodeMmaKernel(T* __restrict__ out, float* __restrict__ max_logits,
                       float* __restrict__ exp_sums, float* __restrict__ tmp_out,
                       const T* __restrict__ q, const T* __restrict__ k_cache,
                       const T* __restrict__ v_cache, int num_kv_heads, int group_size,
                       int block_size, float scale, const int32_t* __restrict__ block_tables,
                       int max_blocks_per_seq, const int32_t* __restrict__ seq_lens,
                       const float* __restrict__ alibi_slopes, int split_tokens) {
  constexpr int NUM_WARPS = NUM_THREADS / kWarpSize;
  constexpr int TILE = kGqaTileTokens;
  constexpr int M = kGqaMmaRows;
  constexpr int X = kVec16<T>;  // 8 elements per 16-byte vector
  constexpr int KVS = GqaMmaKvStride(HEAD_SIZE);
  constexpr int PS = kGqaMmaPStride;
  constexpr int AS = GqaMmaAccStride(HEAD_SIZE);
  static_assert(TILE == kWarpSize, "the softmax step maps one lane to one token");
  static_assert(HEAD_SIZE % 16 == 0 && TILE % 16 == 0 && X == 8, "16-bit operands, 16x16 tiles");
  static_assert(NUM_WARPS >= TILE / 16, "one warp per 16-token block of S");

  const int kv_head = blockIdx.x, seq = blockIdx.y, split = blockIdx.z;
  const int num_splits = gridDim.z;
  const int num_heads = num_kv_heads * group_size;
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;

  const int seq_len = seq_lens[seq];
  int start_token = 0, end_token = 0;
  if (!GqaSplitRange(seq_len, split, split_tokens, &start_token, &end_token))
    return;  // whole block: this split is empty

  const int kv_head_stride = HEAD_SIZE * block_size;
  const int64_t kv_block_stride = static_cast<int64_t>(num_kv_heads) * kv_head_stride;
  const int32_t* block_table = block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq;
  const T* k_head = k_cache + static_cast<int64_t>(kv_head) * kv_head_stride;
  const T* v_head = v_cache + static_cast<int64_t>(kv_head) * kv_head_stride;

  // Dynamic shared memory, in the order of GqaMmaSharedBytes.
  PAGEDSERVE_DYNAMIC_SHARED(T, smem);
  const MmaAttentionSmem<T, HEAD_SIZE, M> sm(smem);
  T *k_s = sm.k, *v_s = sm.v, *q_s = sm.q, *p_s = sm.p_hi, *plo_s = sm.p_lo;
  float *s_s = sm.s, *acc_s = sm.acc, *m_s = sm.m, *l_s = sm.l, *alpha_s = sm.alpha;

  {
    const T* q_ptr =
        q + (static_cast<int64_t>(seq) * num_heads + static_cast<int64_t>(kv_head) * group_size) *
                HEAD_SIZE;
    for (int i = tid; i < M * HEAD_SIZE; i += NUM_THREADS) {
      const int g = i / HEAD_SIZE, d = i % HEAD_SIZE;
      q_s[g * KVS + d] = g < group_size ? q_ptr[g * HEAD_SIZE + d] : FromFloat<T>(0.0f);
      acc_s[g * AS + d] = 0.0f;
    }
    for (int g = tid; g < M; g += NUM_THREADS) {
      m_s[g] = -INFINITY;
      l_s[g] = 0.0f;
    }
  }
  __syncthreads();

  for (int tile_start = start_token; tile_start < end_token; tile_start += TILE) {
    // ---- 1. K and V of this tile, 16-bit, into shared memory.
    LoadKvTile16<T, HEAD_SIZE, NUM_THREADS, TILE, KVS>(
        k_s, v_s, k_head, v_head, block_table, block_size, kv_block_stride, tile_start, end_token);
    __syncthreads();

    // ---- 2. S = Q K^T, one 16-token block per warp.
    if (warp < TILE / 16)
      MmaScoreBlock<T, HEAD_SIZE, KVS>(q_s, k_s + warp * 16 * KVS, s_s + warp * 16, TILE);
    __syncthreads();

    // ---- 3. Online softmax, one warp per head, one lane per token; P as T.
    for (int g = warp; g < M; g += NUM_WARPS) {  // warp-uniform
      if (g >= group_size) {
        p_s[g * PS + lane] = FromFloat<T>(0.0f);
        plo_s[g * PS + lane] = FromFloat<T>(0.0f);
        continue;
      }
      const int token = tile_start + lane;
      float s = -INFINITY;
      if (token < end_token) {
        const int head = kv_head * group_size + g;
        const float slope = alibi_slopes != nullptr ? alibi_slopes[head] : 0.0f;
        s = scale * s_s[g * TILE + lane] + slope * static_cast<float>(token - seq_len + 1);
      }
      // The tile's first token is in the context: one s is finite.
      const float p = GqaOnlineSoftmax(s, lane, &m_s[g], &l_s[g], &alpha_s[g]);
      const T hi = FromFloat<T>(p);
      p_s[g * PS + lane] = hi;
      plo_s[g * PS + lane] = FromFloat<T>(p - ToFloat(hi));
    }
    __syncthreads();
    for (int i = tid; i < group_size * HEAD_SIZE; i += NUM_THREADS) {
      const int g = i / HEAD_SIZE, d = i % HEAD_SIZE;
      acc_s[g * AS + d] *= alpha_s[g];
    }
    __syncthreads();

    // ---- 4. O += P V, one 16-column block of O per warp at a time.
    for (int n0 = warp * 16; n0 < HEAD_SIZE; n0 += NUM_WARPS * 16)
      MmaAccumulatePv<T, TILE, PS, KVS>(acc_s + n0, AS, p_s, plo_s, v_s + n0);
    __syncthreads();  // before the next tile overwrites k_s, v_s, p_s, s_s
  }

  // ---- Output (one split) or this split's partial state.
  GqaWriteOutput<T, HEAD_SIZE, NUM_THREADS>(
      acc_s, AS, m_s, l_s,
      static_cast<int64_t>(seq) * num_heads + static_cast<int64_t>(kv_head) * group_size,
      group_size, split, num_splits, split_tokens, out, max_logits, exp_sums, tmp_out);
}

}  // namespace pagedserve::kernels::cuda

#endif  // PAGEDSERVE_KERNELS_CUDA_GQA_DECODE_MMA_KERNELS_CUH_
