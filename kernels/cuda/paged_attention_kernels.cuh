// Internal: PagedAttention v1/v2 decode kernels (one query token per sequence).
//
// Design after vLLM's csrc/attention kernel as described in the seed document
// (Kwon et al., SOSP 2023): one thread block per (head, sequence, partition);
// the query sits in shared memory; keys are read into registers (k_vecs) with
// 16-byte vector loads, one thread group per key token, the q.k dot product
// reduced across the group with warp shuffles; qk_max and exp_sum are reduced
// across warps through shared memory; values are read as 16-byte V vectors
// (V_VEC_SIZE consecutive tokens of one head dimension) into per-thread fp32
// accumulators; the warps' accumulators are summed through shared memory.
//
// Compile-time parameters are only the element types (T: query/output,
// CACHE_T: the KV cache, = T except for an fp8 cache) and HEAD_SIZE (register
// array sizes); block size, ALiBi and v1/v2 (partition size) are runtime
// values, which keeps the number of instantiations at (3 + 3 x 2) x 6 = 54.
// An fp8 cache (CACHE_T = __nv_fp8_e4m3 / __nv_fp8_e5m2) is read with the same
// 16-byte key loads (x = 16) and 8-byte value loads (8 tokens), converted to
// fp32 in registers; the caller folds k_scale into `scale` and the kernel
// multiplies the normalized output by v_scale. To make the
// block size a runtime value, the thread group size is fixed at 4 (a warp
// covers 8 key tokens per step, 1/2/4 steps per block of 8/16/32 tokens), and
// each thread owns whole 16-byte key chunks (x elements) rather than a slice of
// one: thread g of a group reads chunks g, g+4, g+8, ... of its token, so a
// warp load touches 4 runs of 8 consecutive 16-byte token chunks (128 bytes
// each) in the [head_size/x, block_size, x] layout.
#ifndef PAGEDSERVE_KERNELS_CUDA_PAGED_ATTENTION_KERNELS_CUH_
#define PAGEDSERVE_KERNELS_CUDA_PAGED_ATTENTION_KERNELS_CUH_

// The kernel templates live in this header so that paged_attention.cu launches
// them and tests/kernels/cuda_emulation_test.cc can run the very same source
// on the CPU (tests/kernels/simt_emulator.h) where no device is available.
#include <cstdint>

#include "kernels/cuda/dtype_utils.cuh"

namespace pagedserve::kernels::cuda {

constexpr int kThreadGroupSize = 4;
constexpr int kTokensPerStep = kWarpSize / kThreadGroupSize;  // 8

// Grid (num_heads, num_seqs, num_partitions). partition_size == 0 is v1 (one
// partition = the whole context; writes `out`), otherwise v2 (writes
// max_logits, exp_sums and tmp_out for partition blockIdx.z). sliding_window
// > 0 limits the query to the last sliding_window tokens (v2: a partition
// wholly before them writes max -inf, exp-sum 0, zeros). logit_softcap > 0
// replaces each score s (scaled, ALiBi added) by logit_softcap *
// tanh(s / logit_softcap) before the window mask and the softmax (Gemma 2).
// Dynamic shared memory: fp32 logits of round_up(tokens of the partition, 8).
template <typename T, int HEAD_SIZE, int NUM_THREADS, typename CACHE_T = T>
__global__ void __launch_bounds__(NUM_THREADS)
    PagedAttentionKernel(T* __restrict__ out,                  // [S, H, D]          (v1)
                         float* __restrict__ max_logits,       // [S, H, P]          (v2)
                         float* __restrict__ exp_sums,         // [S, H, P]          (v2)
                         float* __restrict__ tmp_out,          // [S, H, P, D]       (v2)
                         const T* __restrict__ q,              // [S, H, D]
                         const CACHE_T* __restrict__ k_cache,  // [B, KVH, D/x, BS, x]
                         const CACHE_T* __restrict__ v_cache,  // [B, KVH, D, BS]
                         int num_kv_heads, int block_size, float scale,
                         const int32_t* __restrict__ block_tables, int max_blocks_per_seq,
                         const int32_t* __restrict__ seq_lens,
                         const float* __restrict__ alibi_slopes, int partition_size,
                         float v_scale,          // fp8 caches only; ignored otherwise
                         int sliding_window,     // > 0: keys (seq_len - 1 - window, seq_len - 1]
                         float logit_softcap) {  // > 0: s -> cap * tanh(s / cap)
  constexpr int NUM_WARPS = NUM_THREADS / kWarpSize;
  constexpr int X = CacheElem<CACHE_T>::kKeyVec;  // elements per 16-byte vector
  constexpr int NUM_CHUNKS = HEAD_SIZE / X;       // 16-byte chunks per key vector
  constexpr int CHUNKS_PER_THREAD = (NUM_CHUNKS + kThreadGroupSize - 1) / kThreadGroupSize;
  constexpr int V_VEC = CacheElem<CACHE_T>::kValueVec;  // tokens per value vector
  using ValueVec = typename CacheElem<CACHE_T>::ValueVec;
  constexpr int ROWS_PER_THREAD = (HEAD_SIZE + kWarpSize - 1) / kWarpSize;
  static_assert(HEAD_SIZE % X == 0 && HEAD_SIZE % 4 == 0, "head size");

  const int head = blockIdx.x, seq = blockIdx.y, partition = blockIdx.z;
  const int num_heads = gridDim.x, num_partitions = gridDim.z;
  const int tid = threadIdx.x, warp = tid / kWarpSize, lane = tid % kWarpSize;

  const int seq_len = seq_lens[seq];
  int start_token = partition_size > 0 ? partition * partition_size : 0;
  if (start_token >= seq_len) return;  // whole block: this partition is empty
  const int end_token = partition_size > 0 ? min(start_token + partition_size, seq_len) : seq_len;
  // Sliding window: keys [win_first, seq_len). A v2 partition wholly before it
  // weighs nothing in the reduce; otherwise the blocks before it are skipped
  // (start_token stays block-aligned, so the logits' float4 reads stay aligned).
  const int win_first = sliding_window > 0 ? max(0, seq_len - sliding_window) : 0;
  if (win_first >= end_token) {  // v2 only: v1's range ends at seq_len > win_first
    const int64_t sh = static_cast<int64_t>(seq) * gridDim.x + head;
    for (int d = tid; d < HEAD_SIZE; d += NUM_THREADS)
      tmp_out[(sh * num_partitions + partition) * HEAD_SIZE + d] = 0.0f;
    if (tid == 0) {
      max_logits[sh * num_partitions + partition] = -INFINITY;
      exp_sums[sh * num_partitions + partition] = 0.0f;
    }
    return;
  }
  start_token = max(start_token, win_first / block_size * block_size);
  const int num_tokens = end_token - start_token;
  // partition_size is a multiple of every block size, so partitions hold whole blocks.
  const int start_block = start_token / block_size;
  const int end_block = (end_token + block_size - 1) / block_size;

  const int kv_head = head / (num_heads / num_kv_heads);
  const float alibi_slope = alibi_slopes != nullptr ? alibi_slopes[head] : 0.0f;
  const int kv_head_stride = HEAD_SIZE * block_size;
  const int64_t kv_block_stride = static_cast<int64_t>(num_kv_heads) * kv_head_stride;
  const int32_t* block_table = block_tables + static_cast<int64_t>(seq) * max_blocks_per_seq;

  // The query in shared memory as fp32 q_vecs (read coalesced, converted once).
  __shared__ float4 q_vecs[HEAD_SIZE / 4];
  __shared__ float red_smem[2 * NUM_WARPS];
  __shared__ float out_smem[NUM_WARPS][HEAD_SIZE];
  PAGEDSERVE_DYNAMIC_SHARED(float, logits);

  {
    const T* q_ptr = q + (static_cast<int64_t>(seq) * num_heads + head) * HEAD_SIZE;
    float* qf = reinterpret_cast<float*>(q_vecs);
    for (int i = tid; i < HEAD_SIZE; i += NUM_THREADS) qf[i] = ToFloat(q_ptr[i]);
  }
  __syncthreads();

  // ---- QK: warp w takes blocks w, w + NUM_WARPS, ...; 8 tokens per step.
  const int group = lane / kThreadGroupSize;       // token within the step
  const int group_lane = lane % kThreadGroupSize;  // which chunks of that token
  float qk_max = -INFINITY;
  const CACHE_T* k_head = k_cache + static_cast<int64_t>(kv_head) * kv_head_stride;
  for (int b = start_block + warp; b < end_block; b += NUM_WARPS) {
    const CACHE_T* k_block = k_head + static_cast<int64_t>(block_table[b]) * kv_block_stride;
    for (int step = 0; step < block_size; step += kTokensPerStep) {
      if (b * block_size + step >= end_token) break;  // warp-uniform
      const int offset = step + group;
      const int token = b * block_size + offset;
      uint4 k_vecs[CHUNKS_PER_THREAD];
#pragma unroll
      for (int j = 0; j < CHUNKS_PER_THREAD; ++j) {
        const int c = group_lane + j * kThreadGroupSize;
        if (NUM_CHUNKS % kThreadGroupSize == 0 || c < NUM_CHUNKS)
          k_vecs[j] = Load16(PAGEDSERVE_GLOBAL_READ(
              k_block + (static_cast<int64_t>(c) * block_size + offset) * X, 16));
      }
      float dot = 0.0f;
#pragma unroll
      for (int j = 0; j < CHUNKS_PER_THREAD; ++j) {
        const int c = group_lane + j * kThreadGroupSize;
        if (NUM_CHUNKS % kThreadGroupSize == 0 || c < NUM_CHUNKS) {
          float kf[X];
          Unpack16(k_vecs[j], static_cast<const CACHE_T*>(nullptr), kf);
          const float4* qc = q_vecs + c * (X / 4);
#pragma unroll
          for (int v = 0; v < X / 4; ++v) {
            const float4 qv = *PAGEDSERVE_SHARED(qc + v);
            dot = fmaf(qv.x, kf[4 * v + 0], dot);
            dot = fmaf(qv.y, kf[4 * v + 1], dot);
            dot = fmaf(qv.z, kf[4 * v + 2], dot);
            dot = fmaf(qv.w, kf[4 * v + 3], dot);
          }
        }
      }
      // Reduce the dot product across the thread group.
#pragma unroll
      for (int m = kThreadGroupSize / 2; m >= 1; m /= 2) dot += __shfl_xor_sync(kFullMask, dot, m);
      if (group_lane == 0) {
        const bool valid = token < end_token;
        float qk = scale * dot + alibi_slope * static_cast<float>(token - seq_len + 1);
        if (logit_softcap > 0.0f) qk = logit_softcap * tanhf(qk / logit_softcap);
        // Slots past the context hold garbage: store 0 so no NaN can leak.
        // Tokens before the window: -inf, weight exp(-inf) = 0.
        *PAGEDSERVE_SHARED(&logits[token - start_token]) =
            !valid ? 0.0f : (token < win_first ? -INFINITY : qk);
        if (valid && token >= win_first) qk_max = fmaxf(qk_max, qk);
      }
    }
  }
  qk_max = BlockMax<NUM_WARPS>(red_smem, qk_max);  // also orders the logits writes

  // ---- Softmax numerators and their sum.
  float exp_sum = 0.0f;
  for (int i = tid; i < num_tokens; i += NUM_THREADS) {
    const float e = __expf(logits[i] - qk_max);
    logits[i] = e;
    exp_sum += e;
  }
  exp_sum = BlockSum<NUM_WARPS>(red_smem + NUM_WARPS, exp_sum);  // orders the writes
  const float inv_sum = 1.0f / exp_sum;  // >= 1: the max term contributes exp(0)

  // ---- LV: one V vector (V_VEC tokens of head dim d) per row per step.
  float accs[ROWS_PER_THREAD];
#pragma unroll
  for (int i = 0; i < ROWS_PER_THREAD; ++i) accs[i] = 0.0f;
  const CACHE_T* v_head = v_cache + static_cast<int64_t>(kv_head) * kv_head_stride;
  for (int b = start_block + warp; b < end_block; b += NUM_WARPS) {
    const CACHE_T* v_block = v_head + static_cast<int64_t>(block_table[b]) * kv_block_stride;
    for (int step = 0; step < block_size; step += V_VEC) {
      const int token0 = b * block_size + step;
      if (token0 >= end_token) break;  // warp-uniform
      ValueVec v_vecs[ROWS_PER_THREAD];
#pragma unroll
      for (int i = 0; i < ROWS_PER_THREAD; ++i) {
        const int d = lane + i * kWarpSize;
        if (HEAD_SIZE % kWarpSize == 0 || d < HEAD_SIZE)
          v_vecs[i] = LoadValueVec(PAGEDSERVE_GLOBAL_READ(
              v_block + static_cast<int64_t>(d) * block_size + step, sizeof(ValueVec)));
      }
      float logits_vec[V_VEC];
      const float4* lg = reinterpret_cast<const float4*>(logits + (token0 - start_token));
#pragma unroll
      for (int v = 0; v < V_VEC / 4; ++v) {
        const float4 t = *PAGEDSERVE_SHARED(lg + v);
        logits_vec[4 * v] = t.x;
        logits_vec[4 * v + 1] = t.y;
        logits_vec[4 * v + 2] = t.z;
        logits_vec[4 * v + 3] = t.w;
      }
      const bool tail = token0 + V_VEC > end_token;
#pragma unroll
      for (int i = 0; i < ROWS_PER_THREAD; ++i) {
        const int d = lane + i * kWarpSize;
        if (HEAD_SIZE % kWarpSize == 0 || d < HEAD_SIZE) {
          float vf[V_VEC];
          UnpackValueVec<CACHE_T>(v_vecs[i], vf);
          if (tail) {  // zero garbage past the context (0 * NaN would be NaN)
#pragma unroll
            for (int e = 0; e < V_VEC; ++e)
              if (token0 + e >= end_token) vf[e] = 0.0f;
          }
          float a = accs[i];
#pragma unroll
          for (int e = 0; e < V_VEC; ++e) a = fmaf(logits_vec[e], vf[e], a);
          accs[i] = a;
        }
      }
    }
  }

  // ---- Cross-warp reduction of the accumulators, then the output.
#pragma unroll
  for (int i = 0; i < ROWS_PER_THREAD; ++i) {
    const int d = lane + i * kWarpSize;
    if (HEAD_SIZE % kWarpSize == 0 || d < HEAD_SIZE) out_smem[warp][d] = accs[i];
  }
  __syncthreads();
  const int64_t sh = static_cast<int64_t>(seq) * num_heads + head;
  for (int d = tid; d < HEAD_SIZE; d += NUM_THREADS) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < NUM_WARPS; ++w) sum += out_smem[w][d];
    sum *= inv_sum;
    if constexpr (kIsFp8<CACHE_T>) sum *= v_scale;
    if (partition_size > 0) {
      tmp_out[(sh * num_partitions + partition) * HEAD_SIZE + d] = sum;
    } else {
      out[sh * HEAD_SIZE + d] = FromFloat<T>(sum);
    }
  }
  if (partition_size > 0 && tid == 0) {
    max_logits[sh * num_partitions + partition] = qk_max;
    exp_sums[sh * num_partitions + partition] = exp_sum;
  }
}

// v2 reduce: grid (num_heads, num_seqs). Combines the partitions of one
// (sequence, head): out = sum_p tmp_out[p] * exp_sums[p] * exp(max_p - max)
// / sum_p exp_sums[p] * exp(max_p - max). Dynamic shared memory: P floats.
template <typename T, int NUM_THREADS>
__global__ void __launch_bounds__(NUM_THREADS)
    PagedAttentionReduceKernel(T* __restrict__ out, const float* __restrict__ max_logits,
                               const float* __restrict__ exp_sums,
                               const float* __restrict__ tmp_out,
                               const int32_t* __restrict__ seq_lens, int head_size,
                               int max_num_partitions, int partition_size) {
  constexpr int NUM_WARPS = NUM_THREADS / kWarpSize;
  const int head = blockIdx.x, seq = blockIdx.y, num_heads = gridDim.x;
  const int tid = threadIdx.x;
  const int64_t sh = static_cast<int64_t>(seq) * num_heads + head;
  const int num_partitions = (seq_lens[seq] + partition_size - 1) / partition_size;
  const float* part_out = tmp_out + sh * max_num_partitions * head_size;
  T* out_ptr = out + sh * head_size;
  if (num_partitions == 1) {
    for (int d = tid; d < head_size; d += NUM_THREADS) out_ptr[d] = FromFloat<T>(part_out[d]);
    return;
  }
  PAGEDSERVE_DYNAMIC_SHARED(float, weights);
  __shared__ float red_smem[2 * NUM_WARPS];
  const float* ml = max_logits + sh * max_num_partitions;
  const float* es = exp_sums + sh * max_num_partitions;
  float m = -INFINITY;
  for (int p = tid; p < num_partitions; p += NUM_THREADS) m = fmaxf(m, ml[p]);
  m = BlockMax<NUM_WARPS>(red_smem, m);
  float sum = 0.0f;
  for (int p = tid; p < num_partitions; p += NUM_THREADS) {
    const float w = es[p] * __expf(ml[p] - m);
    weights[p] = w;
    sum += w;
  }
  sum = BlockSum<NUM_WARPS>(red_smem + NUM_WARPS, sum);  // orders the weights writes
  const float inv_sum = 1.0f / sum;
  for (int d = tid; d < head_size; d += NUM_THREADS) {
    float acc = 0.0f;
    for (int p = 0; p < num_partitions; ++p)
      acc = fmaf(part_out[p * head_size + d], weights[p], acc);
    out_ptr[d] = FromFloat<T>(acc * inv_sum);
  }
}

}  // namespace pagedserve::kernels::cuda

#endif  // PAGEDSERVE_KERNELS_CUDA_PAGED_ATTENTION_KERNELS_CUH_
