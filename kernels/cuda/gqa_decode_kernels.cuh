// Internal: the GQA-aware decode attention kernel (one query token per
// sequence) over the paged KV cache of kernels/types.h (vLLM layout).
//
// What it does differently from PagedAttention v1/v2
// (paged_attention_kernels.cuh): v1/v2 run one thread block per QUERY head,
// so with grouped-query attention (num_heads = group_size * num_kv_heads) the
// same K/V bytes are streamed group_size times. Here one thread block serves a
// whole group: grid (num_kv_heads, num_seqs, num_splits), and every K/V tile of
// kGqaTileTokens (32) context tokens is read from the paged cache once,
// kept in shared memory as stored, and used by all group_size query heads of
// that KV head. This is FlashInfer's decode approach (Ye et al., FlashInfer,
// 2025; flashinfer/include/flashinfer/attention/decode.cuh,
// BatchDecodeWithPagedKVCacheKernel: the query heads of one KV head share a
// thread block and its shared-memory K/V tiles), written here for vLLM's
// [head_size/x, block_size, x] key and [head_size, block_size] value blocks.
//
// Per block, for each tile of its context split:
//   1. K tile -> smem k_s[32][head_size + 16 bytes], V tile -> smem
//      v_s[head_size][32] (the cache's value layout, its 16-byte slots
//      permuted per row by GqaVSlot), both as stored (16-bit for fp16/bf16
//      caches: half the shared memory and stores of fp32, no conversion on
//      the way in), one 16-byte load and store per item, conflict-free;
//      slots past the context are never read and hold 0 (garbage or NaN
//      there cannot leak).
//   2. logits s[g][t] = scale * q_g . k_t (+ ALiBi slope_h * (t - seq_len + 1)),
//      one (head, token) pair per thread; tokens past the context get -inf.
//   3. online softmax (Milakov & Gimelshein 2018; FlashAttention): warp w
//      takes heads w, w + 4, ...; lane = token; m_new = max(m, max_t s),
//      p = exp(s - m_new), l = l * exp(m - m_new) + sum p.
//   4. acc[g][d] = acc[g][d] * exp(m - m_new) + sum_t p[g][t] v_s[t][d] in
//      fp32 (accumulators in shared memory, one (head, dim) per thread, so the
//      group size is a runtime value).
// One split (split_tokens == 0) writes out = acc / l directly. Several splits
// write, per query head, max_logits = m, exp_sums = l and tmp_out = acc / l in
// the v2 workspace layout ([S, H, P] and [S, H, P, D] with P = num_splits),
// and the v2 reduce kernel (PagedAttentionReduceKernel, partition_size =
// split_tokens) merges them by log-sum-exp rescaling.
//
// fp32 softmax and accumulation throughout; K and V elements are converted to
// fp32 when read from shared memory, by the single helper KVChunkToFloat (the
// place a quantized cache type would add its conversion and scale). Compile-time parameters:
// element types and HEAD_SIZE; group size, block size, ALiBi and the split size are runtime.
//
// Status: verified on the CPU only, by running this very source through
// tests/kernels/simt_emulator.h (tests/kernels/cuda_gqa_emulation_test.cc)
// against a double-precision reference and the CPU backend. It compiles with
// nvcc for sm_80/sm_90, but no device has run it yet: neither its results on
// a GPU nor its speed have been measured. Not yet done: cp.async double
// buffering of the tiles and tensor-core (mma) dot products for large groups.
#ifndef PAGEDSERVE_KERNELS_CUDA_GQA_DECODE_KERNELS_CUH_
#define PAGEDSERVE_KERNELS_CUDA_GQA_DECODE_KERNELS_CUH_

#include <cstdint>

#include "kernels/cuda/dtype_utils.cuh"
#include "kernels/cuda/gqa_decode_plan.h"

namespace pagedserve::kernels::cuda {

// The one K/V conversion of the GQA kernel: 16 bytes of the cache as stored
// (kept so in shared memory) to kVec16<CacheT> fp32 values. A quantized cache
// element type adds its overload (and scale) here.
template <typename CacheT>
__device__ __forceinline__ void KVChunkToFloat(const uint4& raw, float* f) {
  Unpack16(raw, static_cast<const CacheT*>(nullptr), f);
}

// raw (kVec16<CacheT> elements) with the elements from `valid` on set to +0.
template <typename CacheT>
__device__ __forceinline__ uint4 ZeroElementsFrom(uint4 raw, int valid) {
  constexpr int kBits = 8 * static_cast<int>(sizeof(CacheT));  // 16 or 32
  constexpr uint32_t kMask = kBits == 32 ? 0xffffffffu : (1u << kBits) - 1u;
  uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int e = 0; e < kVec16<CacheT>; ++e)
    if (e >= valid) w[e * kBits / 32] &= ~(kMask << (e * kBits % 32));  // little-endian
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The V tile v_s[head_size][kGqaTileTokens] keeps the cache's value layout
// (each dimension's tokens contiguous, R = 32 tokens / 16-byte vector slots
// per row: 4 for 16-bit, 8 for fp32), with the slots of row d permuted: vector
// j sits in slot j ^ ((d / (8 / R)) % R). The load's 16-byte stores (threads:
// d = i / R, j = i % R) and the P V loop's 16-byte reads (threads: consecutive
// d, one j) then both hit 8 different 16-byte bank groups in every 8-thread
// phase: no bank conflict either way, no padding.
template <int R>
__device__ __forceinline__ int GqaVSlot(int d, int j) {
  static_assert(R == 4 || R == 8, "16-byte slots per 32-token row");
  return j ^ ((d / (8 / R)) % R);
}

// The context tokens [*start, *end) of context split `split` (the whole
// context when split_tokens == 0); false when the split holds none.
__device__ __forceinline__ bool GqaSplitRange(int seq_len, int split, int split_tokens, int* start,
                                              int* end) {
  *start = split_tokens > 0 ? split * split_tokens : 0;
  *end = split_tokens > 0 ? min(*start + split_tokens, seq_len) : seq_len;
  return *start < seq_len;
}

// One head's online-softmax step over a tile of kWarpSize logits, one lane
// per token (the whole warp calls it; s = -inf past the context, and at
// least one s is finite): returns p = exp(s - m_new); lane 0 sets *alpha =
// exp(m_old - m_new) (0 on the first tile, m_old = -inf), *l = *l * alpha +
// sum p and *m = m_new.
__device__ __forceinline__ float GqaOnlineSoftmax(float s, int lane, float* m, float* l,
                                                  float* alpha) {
  const float m_old = *m;
  const float m_new = fmaxf(m_old, WarpMax(s));
  const float p = __expf(s - m_new);  // exp(-inf) = 0 past the context
  const float p_sum = WarpSum(p);
  if (lane == 0) {
    const float a = __expf(m_old - m_new);
    *alpha = a;
    *l = *l * a + p_sum;
    *m = m_new;
  }
  return p;
}

// Block-wide, at the end of a GQA block: the group's outputs acc[g][d] / l[g]
// (acc rows acc_stride floats apart) into out (one split, split_tokens == 0)
// or this split's partial state into tmp_out / max_logits / exp_sums (the v2
// workspace layout). row0 = seq * num_heads + the group's first head.
template <typename T, int HEAD_SIZE, int NUM_THREADS>
__device__ void GqaWriteOutput(const float* acc, int acc_stride, const float* m, const float* l,
                               int64_t row0, int group_size, int split, int num_splits,
                               int split_tokens, T* out, float* max_logits, float* exp_sums,
                               float* tmp_out) {
  for (int i = threadIdx.x; i < group_size * HEAD_SIZE; i += NUM_THREADS) {
    const int g = i / HEAD_SIZE, d = i % HEAD_SIZE;
    const float v = acc[g * acc_stride + d] / l[g];  // l >= 1: the max term contributes exp(0)
    if (split_tokens > 0) {
      tmp_out[((row0 + g) * num_splits + split) * HEAD_SIZE + d] = v;
    } else {
      out[(row0 + g) * HEAD_SIZE + d] = FromFloat<T>(v);
    }
  }
  if (split_tokens > 0) {
    for (int g = threadIdx.x; g < group_size; g += NUM_THREADS) {
      max_logits[(row0 + g) * num_splits + split] = m[g];
      exp_sums[(row0 + g) * num_splits + split] = l[g];
    }
  }
}

// Grid (num_kv_heads, num_seqs, num_splits), NUM_THREADS threads (a multiple of
// 32), dynamic shared memory GqaDecodeSharedBytes(HEAD_SIZE, group_size).
// num_heads = num_kv_heads * group_size; query head h = kv_head * group_size + g
// (the kv(h) = h / group_size mapping of kernels/paged_attention.h).
// split_tokens == 0: one split covers the whole context and `out` is written.
// split_tokens > 0 (a multiple of kGqaTileTokens): split z covers tokens
// [z * split_tokens, min((z + 1) * split_tokens, seq_len)) and writes
// max_logits / exp_sums [S, H, num_splits] and tmp_out [S, H, num_splits, D]
// for the splits that hold tokens; splits past a sequence's context write
// nothing (the reduce reads only ceil(seq_len / split_tokens) of them).
template <typename T, typename CacheT, int HEAD_SIZE, int NUM_THREADS>
__global__ void __launch_bounds__(NUM_THREADS)
    GqaDecodeKernel(T* __restrict__ out,                 // [S, H, D]         (one split)
                    float* __restrict__ max_logits,      // [S, H, P]         (splits)
                    float* __restrict__ exp_sums,        // [S, H, P]         (splits)
                    float* __restrict__ tmp_out,         // [S, H, P, D]      (splits)
                    const T* __restrict__ q,             // [S, H, D]
                    const CacheT* __restrict__ k_cache,  // [B, KVH, D/x, BS, x]
                    const CacheT* __restrict__ v_cache,  // [B, KVH, D, BS]
                    int num_kv_heads, int group_size, int block_size, float scale,
                    const int32_t* __restrict__ block_tables, int max_blocks_per_seq,
                    const int32_t* __restrict__ seq_lens, const float* __restrict__ alibi_slopes,
                    int split_tokens) {
  constexpr int NUM_WARPS = NUM_THREADS / kWarpSize;
  constexpr int TILE = kGqaTileTokens;
  constexpr int X = kVec16<CacheT>;          // elements per 16-byte vector
  constexpr int NUM_CHUNKS = HEAD_SIZE / X;  // 16-byte chunks per key vector
  constexpr int V_VEC = X;                   // tokens per 16-byte value vector
  constexpr int V_GROUPS = TILE / V_VEC;     // value vectors per dim per tile
  constexpr int KS = GqaKRowStride(HEAD_SIZE, static_cast<int>(sizeof(CacheT)));
  static_assert(TILE == kWarpSize, "the softmax step maps one lane to one token");
  static_assert(HEAD_SIZE % X == 0 && HEAD_SIZE % 4 == 0 && TILE % V_VEC == 0, "shapes");
  static_assert(NUM_THREADS % kWarpSize == 0, "whole warps");

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
  const CacheT* k_head = k_cache + static_cast<int64_t>(kv_head) * kv_head_stride;
  const CacheT* v_head = v_cache + static_cast<int64_t>(kv_head) * kv_head_stride;
  const int group_elems = group_size * HEAD_SIZE;

  // Dynamic shared memory, in the order of GqaDecodeSharedBytes (every piece a
  // multiple of 16 bytes except the last three). K and V as stored (CacheT).
  PAGEDSERVE_DYNAMIC_SHARED(CacheT, k_s);  // [TILE][KS]
  CacheT* v_s = k_s + TILE * KS;           // [HEAD_SIZE][TILE], slots by GqaVSlot
  float* q_s = reinterpret_cast<float*>(v_s + HEAD_SIZE * TILE);  // [group][HEAD_SIZE]
  float* acc_s = q_s + group_elems;                               // [group][HEAD_SIZE]
  float* p_s = acc_s + group_elems;      // [group][TILE] logits, then probabilities
  float* m_s = p_s + group_size * TILE;  // [group] running max
  float* l_s = m_s + group_size;         // [group] running exp-sum
  float* alpha_s = l_s + group_size;     // [group] rescale factor of this tile

  {
    // The group's query heads are consecutive: G * D contiguous elements.
    const T* q_ptr =
        q + (static_cast<int64_t>(seq) * num_heads + static_cast<int64_t>(kv_head) * group_size) *
                HEAD_SIZE;
    for (int i = tid; i < group_elems; i += NUM_THREADS) {
      q_s[i] = ToFloat(q_ptr[i]);
      acc_s[i] = 0.0f;
    }
    for (int g = tid; g < group_size; g += NUM_THREADS) {
      m_s[g] = -INFINITY;
      l_s[g] = 0.0f;
    }
  }
  __syncthreads();

  for (int tile_start = start_token; tile_start < end_token; tile_start += TILE) {
    // ---- 1. K and V of this tile into shared memory as stored, once for the
    // group, one 16-byte load and store per item. K: item (chunk c, token t),
    // t fastest, so consecutive threads read consecutive 16-byte token chunks
    // of [D/x, BS, x] and store them to rows KS elements (16 bytes more than
    // a key) apart: conflict-free. Tokens past the context hold 0.
    for (int i = tid; i < NUM_CHUNKS * TILE; i += NUM_THREADS) {
      const int c = i / TILE, t = i % TILE, token = tile_start + t;
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (token < end_token) {
        const int64_t block = block_table[token / block_size];
        raw = Load16(PAGEDSERVE_GLOBAL_READ(
            k_head + block * kv_block_stride +
                (static_cast<int64_t>(c) * block_size + token % block_size) * X,
            16));
      }
      Store16(PAGEDSERVE_SHARED(reinterpret_cast<uint4*>(k_s + t * KS + c * X)), raw);
    }
    // V: item (dim d, vector j of V_VEC tokens). V_VEC divides the block size
    // and tile_start, so one vector lies in one block.
    for (int i = tid; i < HEAD_SIZE * V_GROUPS; i += NUM_THREADS) {
      const int d = i / V_GROUPS, j = i % V_GROUPS, token0 = tile_start + j * V_VEC;
      uint4 raw = make_uint4(0, 0, 0, 0);
      if (token0 < end_token) {
        const int64_t block = block_table[token0 / block_size];
        raw = Load16(PAGEDSERVE_GLOBAL_READ(v_head + block * kv_block_stride +
                                                static_cast<int64_t>(d) * block_size +
                                                token0 % block_size,
                                            16));
        if (token0 + V_VEC > end_token)  // 0 * NaN would be NaN
          raw = ZeroElementsFrom<CacheT>(raw, end_token - token0);
      }
      Store16(PAGEDSERVE_SHARED(
                  reinterpret_cast<uint4*>(v_s + d * TILE + GqaVSlot<V_GROUPS>(d, j) * V_VEC)),
              raw);
    }
    __syncthreads();

    // ---- 2. Logits of every (head, token) pair of the tile: key row t read
    // as 16-byte chunks (rows 16 bytes apart in bank terms: conflict-free),
    // the query as float4 (one head per warp: broadcast).
    for (int i = tid; i < group_size * TILE; i += NUM_THREADS) {
      const int g = i / TILE, t = i % TILE, token = tile_start + t;
      const float4* qv = reinterpret_cast<const float4*>(q_s + g * HEAD_SIZE);
      const CacheT* krow = k_s + t * KS;
      float dot = 0.0f;
#pragma unroll 4
      for (int c = 0; c < NUM_CHUNKS; ++c) {
        float kf[X];
        KVChunkToFloat<CacheT>(
            Load16(PAGEDSERVE_SHARED(reinterpret_cast<const uint4*>(krow + c * X))), kf);
#pragma unroll
        for (int v = 0; v < X / 4; ++v) {
          const float4 a = *PAGEDSERVE_SHARED(qv + c * (X / 4) + v);
          dot = fmaf(a.x, kf[4 * v + 0], dot);
          dot = fmaf(a.y, kf[4 * v + 1], dot);
          dot = fmaf(a.z, kf[4 * v + 2], dot);
          dot = fmaf(a.w, kf[4 * v + 3], dot);
        }
      }
      float s = -INFINITY;
      if (token < end_token) {
        const int head = kv_head * group_size + g;
        const float slope = alibi_slopes != nullptr ? alibi_slopes[head] : 0.0f;
        s = scale * dot + slope * static_cast<float>(token - seq_len + 1);
      }
      p_s[i] = s;
    }
    __syncthreads();

    // ---- 3. Online softmax, one warp per head, one lane per token. The
    // tile's first token is in the context, so tile_max is finite.
    for (int g = warp; g < group_size; g += NUM_WARPS)  // warp-uniform
      p_s[g * TILE + lane] =
          GqaOnlineSoftmax(p_s[g * TILE + lane], lane, &m_s[g], &l_s[g], &alpha_s[g]);
    __syncthreads();

    // ---- 4. Rescale and accumulate P V, one (head, dim) per thread: value
    // row d as 16-byte vectors (conflict-free by GqaVSlot), P as float4
    // (broadcast), tokens in order.
    for (int i = tid; i < group_elems; i += NUM_THREADS) {
      const int g = i / HEAD_SIZE, d = i % HEAD_SIZE;
      const float4* p4 = reinterpret_cast<const float4*>(p_s + g * TILE);
      const CacheT* vrow = v_s + d * TILE;
      float a = acc_s[i] * alpha_s[g];
#pragma unroll
      for (int j = 0; j < V_GROUPS; ++j) {
        float vf[V_VEC];
        KVChunkToFloat<CacheT>(Load16(PAGEDSERVE_SHARED(reinterpret_cast<const uint4*>(
                                   vrow + GqaVSlot<V_GROUPS>(d, j) * V_VEC))),
                               vf);
#pragma unroll
        for (int e = 0; e < V_VEC / 4; ++e) {
          const float4 pv = *PAGEDSERVE_SHARED(p4 + j * (V_VEC / 4) + e);
          a = fmaf(pv.x, vf[4 * e + 0], a);
          a = fmaf(pv.y, vf[4 * e + 1], a);
          a = fmaf(pv.z, vf[4 * e + 2], a);
          a = fmaf(pv.w, vf[4 * e + 3], a);
        }
      }
      acc_s[i] = a;
    }
    __syncthreads();  // before the next tile overwrites k_s, v_s, p_s
  }

  // ---- Output (one split) or this split's partial state.
  GqaWriteOutput<T, HEAD_SIZE, NUM_THREADS>(
      acc_s, HEAD_SIZE, m_s, l_s,
      static_cast<int64_t>(seq) * num_heads + static_cast<int64_t>(kv_head) * group_size,
      group_size, split, num_splits, split_tokens, out, max_logits, exp_sums, tmp_out);
}

}  // namespace pagedserve::kernels::cuda

#endif  // PAGEDSERVE_KERNELS_CUDA_GQA_DECODE_KERNELS_CUH_
