// Internal: the body of the CUDA backend's sampling kernel (steps 1-7 of the
// sampler, runtime/sampling/sampler.h: penalties, greedy, temperature,
// top-k, top-p, min-p and the inverse-CDF draw), as a device function so
// that model_kernels.cu wraps it in a __global__ kernel and
// tests/worker/cuda_sampling_emulation_test.cc runs the same source on the
// CPU through tests/kernels/simt_emulator.h against the Sampler itself.
// Rows that ask for logprobs also get the sampler's raw logprobs here (of
// the drawn tokens and the row's top N), so that only ids and those values
// come back to the host.
//
// One thread block per logits row. The sampler's filters are all prefixes of
// one strict order of the tokens: processed logit s_i = (w_i - max) / T
// descending, then token id ascending. That order is the order of the 64-bit
// key (OrderedBits(s_i) << 32) | (0xFFFFFFFF - i), so every filter and the
// draw is "the first key, in descending key order, at which a running sum of
// per-token weights reaches a bound", found without sorting by a radix select
// over the keys: eight passes over the row, each building a 256-bucket
// histogram of weights in shared memory for the keys that share the digits
// chosen so far (the approach of radix-select top-k in GPU samplers, e.g.
// FlashInfer's and PyTorch's). Weights are 1 (top-k counts) or the token's
// probability mass exp(s_i) in fixed point (kSampleMassOne units per 1.0), so
// the sums are integers: exact, independent of the atomics' order, hence
// deterministic, and the same at every level of the select.
//
// Agreement with the host sampler: the same float operations give the
// penalized logits, s_i and e_i = expf(s_i) (the device's expf is within 2
// ulp of the host's); the host sums e_i in double where this sums them in
// units of 2^-40 (each token's mass rounded by at most half a unit, so a
// running sum is off by at most vocab * 2^-41 of the maximum's mass: about
// 6e-8 at a 128K vocabulary), and a token with e_i < 2^-41 weighs nothing
// here. The two can therefore disagree only when a uniform (or top_p's
// bound) lies within that distance of a boundary of the cumulative
// distribution. Logprobs are computed as the sampler does (fp32 exp, fp64
// sum and log, the sum in another order): with the host's expf (the
// emulator) they agree to a float ulp; on a device, whose expf may differ by
// 2 ulp, the normalizer and so every logprob may differ by about 2.4e-7
// absolute. The top-N list is a select over the raw logits' keys, the
// host's order exactly.
#ifndef PAGEDSERVE_RUNTIME_WORKER_CUDA_SAMPLING_KERNELS_CUH_
#define PAGEDSERVE_RUNTIME_WORKER_CUDA_SAMPLING_KERNELS_CUH_

#include <cfloat>
#include <cstdint>

#include "runtime/worker/cuda/model_kernels.h"

namespace pagedserve::cuda_model {

// Fixed-point units of probability mass per 1.0 (2^40). A row's mass is at
// most vocab units of 1.0, so vocab <= kMaxSampleVocab keeps sums < 2^63.
constexpr double kSampleMassOne = 1099511627776.0;

// A float's bits mapped so that unsigned comparison orders as the floats do
// (for non-NaN values; -0 orders just below +0).
__device__ __forceinline__ unsigned int OrderedBits(float f) {
  const unsigned int u = __float_as_uint(f);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}
// The inverse of OrderedBits.
__device__ __forceinline__ float FromOrderedBits(unsigned int b) {
  return __uint_as_float((b & 0x80000000u) != 0 ? (b & 0x7FFFFFFFu) : ~b);
}

// The sampler's order as one key: larger s first, then the lower token id.
// Never 0 (OrderedBits of a finite float is >= 0x00800000).
__device__ __forceinline__ uint64_t SampleKey(float s, int64_t id) {
  return (static_cast<uint64_t>(OrderedBits(s)) << 32) |
         (0xFFFFFFFFull - static_cast<uint64_t>(id));
}

// The token id of a SampleKey.
__device__ __forceinline__ int32_t SampleKeyId(uint64_t key) {
  return static_cast<int32_t>(0xFFFFFFFFull - (key & 0xFFFFFFFFull));
}

// Shared state of one block's selects.
struct SampleShared {
  unsigned long long hist[256];
  unsigned long long total;
  int chosen;
  unsigned int max_bits;  // OrderedBits of the row's largest finite logit
  int bad;
  int32_t draws[kMaxSampleDraws];       // the row's drawn tokens
  float draw_raw[kMaxSampleDraws];      // their raw logits (rows with logprobs)
  uint64_t top[kMaxSampleTopLogprobs];  // the top-N keys of the raw row
  int top_count;
  double log_z;  // the raw row's log-softmax normalizer
};

// Block-wide: the first key k, in descending key order over the tokens i <
// vocab with weight(i, &key) > 0, at which the sum of the weights of the keys
// >= k reaches `need` (>= 1); 0 when the total weight is below `need`. Every
// thread of the block must call it with the same arguments; returns the same
// value in every thread. `weight` returns 0 for a token that does not take
// part and sets *key otherwise.
template <int NUM_THREADS, typename Weight>
__device__ uint64_t SelectByWeight(int64_t vocab, const Weight& weight, unsigned long long need,
                                   SampleShared& sh) {
  uint64_t prefix = 0;
  unsigned long long above = 0;  // weight of the keys ahead of the current prefix (thread 0)
  for (int level = 7; level >= 0; --level) {
    for (int d = threadIdx.x; d < 256; d += NUM_THREADS) sh.hist[d] = 0;
    __syncthreads();
    const int shift = 8 * level;
    for (int64_t i = threadIdx.x; i < vocab; i += NUM_THREADS) {
      uint64_t key = 0;
      const unsigned long long w = weight(i, &key);
      if (w == 0) continue;
      if (level < 7 && (key >> (shift + 8)) != prefix) continue;
      atomicAdd(&sh.hist[(key >> shift) & 0xFF], w);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = -1;
      for (int d = 255; d >= 0; --d) {
        if (above + sh.hist[d] >= need) {
          chosen = d;
          break;
        }
        above += sh.hist[d];
      }
      sh.chosen = chosen;
    }
    __syncthreads();
    const int chosen = sh.chosen;
    __syncthreads();  // everyone has read it before the next level overwrites it
    if (chosen < 0) return 0;
    prefix = (prefix << 8) | static_cast<uint64_t>(chosen);
  }
  return prefix;
}

// Block-wide sum of the weights (same calling rules as SelectByWeight).
template <int NUM_THREADS, typename Weight>
__device__ unsigned long long SumWeights(int64_t vocab, const Weight& weight, SampleShared& sh) {
  if (threadIdx.x == 0) sh.total = 0;
  __syncthreads();
  unsigned long long sum = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += NUM_THREADS) {
    uint64_t key = 0;
    sum += weight(i, &key);
  }
  atomicAdd(&sh.total, sum);
  __syncthreads();
  const unsigned long long total = sh.total;
  __syncthreads();
  return total;
}

// Block-wide: the largest of row[0, vocab) that is not NaN or +inf (-inf
// when there is none), and in *bad whether the row holds a NaN or +inf.
template <int NUM_THREADS>
__device__ float RowMax(const float* row, int64_t vocab, SampleShared& sh, bool* bad) {
  if (threadIdx.x == 0) {
    sh.max_bits = 0;  // below OrderedBits(-inf)
    sh.bad = 0;
  }
  __syncthreads();
  float mx = -INFINITY;
  int b = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += NUM_THREADS) {
    const float v = row[i];
    if (v != v || v == INFINITY) {
      b = 1;
    } else if (v > mx) {
      mx = v;
    }
  }
  atomicMax(&sh.max_bits, OrderedBits(mx));
  if (b != 0) atomicOr(&sh.bad, 1);
  __syncthreads();
  mx = FromOrderedBits(sh.max_bits);
  *bad = sh.bad != 0;
  __syncthreads();
  return mx;
}

// Block-wide, in place: the sampler's step 1 on `row` for the entries
// penalties[0, count) (distinct ids): the repetition penalty (divide a
// positive logit, multiply a negative one), then frequency * count +
// presence subtracted for ids of the output, each result clamped to
// +-FLT_MAX; -inf logits stay. Rounding as the host's float operations
// (no contraction into FMA). raw (when not null) gets each entry's logit
// before the penalties, at the entry's index.
template <int NUM_THREADS>
__device__ void ApplyPenalties(float* row, const SampleRowArgs& a,
                               const SamplePenalty* __restrict__ penalties, float* raw) {
  const bool additive = a.frequency_penalty != 0.0f || a.presence_penalty != 0.0f;
  for (int k = threadIdx.x; k < a.penalty_count; k += NUM_THREADS) {
    const SamplePenalty pen = penalties[a.penalty_begin + k];
    float v = row[pen.token_id];
    if (raw != nullptr) raw[a.penalty_begin + k] = v;
    if (v == -INFINITY) continue;
    if (a.repetition_penalty != 1.0f) {
      v = v > 0.0f ? v / a.repetition_penalty : __fmul_rn(v, a.repetition_penalty);
      v = fminf(fmaxf(v, -FLT_MAX), FLT_MAX);
    }
    if (additive && pen.output_count > 0) {
      v = __fsub_rn(v,
                    __fadd_rn(__fmul_rn(a.frequency_penalty, static_cast<float>(pen.output_count)),
                              a.presence_penalty));
      v = fminf(fmaxf(v, -FLT_MAX), FLT_MAX);
    }
    row[pen.token_id] = v;
  }
  __syncthreads();  // the writes are visible to the whole block
}

// The raw key of token i: its logit (-0 as +0, which ties with it on the
// host) descending, then id ascending. Weight 1 for every token.
__device__ __forceinline__ unsigned long long RawKey(const float* row, int64_t i, uint64_t* key) {
  float v = row[i];
  if (v == 0.0f) v = 0.0f;
  *key = SampleKey(v, i);
  return 1ull;
}

// Block-wide, on the raw row (no NaN or +inf; mx its largest value): returns
// the sampler's log-softmax normalizer log_z = mx + log(sum_i expf(row_i -
// mx)), the sum in double, and when a.logprobs >= 1 writes the row's top
// min(a.logprobs, vocab) tokens (logprob descending, ties to the lower id)
// and their logprobs from b.top_ids / b.top_logprobs + a.top_begin.
template <int NUM_THREADS>
__device__ double RawLogprobs(const float* row, int64_t vocab, float mx, const SampleRowArgs& a,
                              const SampleBuffers& b, SampleShared& sh) {
  __shared__ double partial[NUM_THREADS];
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < vocab; i += NUM_THREADS)
    sum += static_cast<double>(expf(row[i] - mx));
  partial[threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double z = 0.0;
    for (int t = 0; t < NUM_THREADS; ++t) z += partial[t];
    sh.log_z = static_cast<double>(mx) + log(z);
    sh.top_count = 0;
  }
  __syncthreads();
  const double log_z = sh.log_z;
  const int top = a.logprobs < vocab ? a.logprobs : static_cast<int>(vocab);
  if (top >= 1) {
    auto raw_key = [&](int64_t i, uint64_t* key) { return RawKey(row, i, key); };
    const uint64_t cut =
        SelectByWeight<NUM_THREADS>(vocab, raw_key, static_cast<unsigned long long>(top), sh);
    for (int64_t i = threadIdx.x; i < vocab; i += NUM_THREADS) {
      uint64_t key = 0;
      RawKey(row, i, &key);
      if (key >= cut) sh.top[atomicAdd(&sh.top_count, 1)] = key;  // exactly `top` keys
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 1; k < top; ++k)  // insertion sort, descending
        for (int m = k; m > 0 && sh.top[m] > sh.top[m - 1]; --m) {
          const uint64_t x = sh.top[m];
          sh.top[m] = sh.top[m - 1];
          sh.top[m - 1] = x;
        }
      for (int k = 0; k < top; ++k) {
        const int32_t id = SampleKeyId(sh.top[k]);
        const float v = row[id];  // the raw value itself (-0 stays -0, as on the host)
        b.top_ids[a.top_begin + k] = id;
        b.top_logprobs[a.top_begin + k] = static_cast<float>(static_cast<double>(v) - log_z);
      }
    }
    __syncthreads();
  }
  return log_z;
}

// Block-wide: sh.draws[0, a.num_draws) for the penalized row (mx its
// largest finite value): the argmax for every draw of a greedy row, else
// the sampler's steps 3-7 with b.uniforms.
template <int NUM_THREADS>
__device__ void DrawTokens(const float* row, int64_t vocab, float mx, const SampleRowArgs& a,
                           const double* __restrict__ uniforms, SampleShared& sh) {
  const float inv_t = a.inv_temperature;
  // The processed logit and mass of token i: false for a masked (-inf) token.
  auto eval = [&](int64_t i, uint64_t* key, float* e) {
    const float w = row[i];
    if (w == -INFINITY) return false;
    float s = (w - mx) * inv_t;
    if (s == 0.0f) s = 0.0f;  // -0 (e.g. w = -0 at a maximum of +0) ties with +0, as on the host
    *key = SampleKey(s, i);
    *e = expf(s);
    return true;
  };
  auto mass = [](float e) {
    return static_cast<unsigned long long>(static_cast<double>(e) * kSampleMassOne + 0.5);
  };
  auto finite = [&](int64_t i, uint64_t* key) -> unsigned long long {
    float e;
    return eval(i, key, &e) ? 1ull : 0ull;
  };

  // Step 2, greedy: the first key with inv_t = 1 (s = 0 exactly at the
  // maximum, < 0 elsewhere), i.e. the lowest id of the maximum.
  if (a.greedy != 0) {
    const uint64_t key = SelectByWeight<NUM_THREADS>(vocab, finite, 1ull, sh);
    for (int j = threadIdx.x; j < a.num_draws; j += NUM_THREADS)
      sh.draws[j] = key != 0 ? SampleKeyId(key) : -1;
    __syncthreads();
    return;
  }
  // Step 4, top-k: the k-th key among the finite tokens (0: every one kept).
  uint64_t cut = 0;
  const bool top_k = a.top_k > 0 && a.top_k < vocab;
  if (top_k)
    cut = SelectByWeight<NUM_THREADS>(vocab, finite, static_cast<unsigned long long>(a.top_k), sh);
  // Step 5, top-p over the top-k survivors: keep the tokens whose preceding
  // mass is below top_p times the survivors' mass, i.e. up to the first key
  // at which the running mass reaches that bound (always the first token).
  if (a.top_p < 1.0f) {
    auto in_k = [&](int64_t i, uint64_t* key) -> unsigned long long {
      float e;
      return eval(i, key, &e) && *key >= cut ? mass(e) : 0ull;
    };
    const unsigned long long z = SumWeights<NUM_THREADS>(vocab, in_k, sh);
    const double bound = ceil(static_cast<double>(a.top_p) * static_cast<double>(z));
    unsigned long long need = bound < 1.0 ? 1ull : static_cast<unsigned long long>(bound);
    if (need > z) need = z;
    const uint64_t p_cut = SelectByWeight<NUM_THREADS>(vocab, in_k, need, sh);
    if (p_cut > cut) cut = p_cut;
  }
  // Step 6, min-p (p_i >= min_p * p_max, and p_max's e is 1), and the
  // sampler's rule that tokens whose e underflowed to 0 never survive.
  const float min_p = a.min_p;
  // Step 7 walks the survivors in the sampler's order, which is the key order
  // after top-k or top-p and token-id order otherwise (the host sorts only
  // when a filter needs it).
  const bool sorted = top_k || a.top_p < 1.0f;
  auto survivor = [&](int64_t i, uint64_t* key) -> unsigned long long {
    float e;
    if (!eval(i, key, &e) || *key < cut || !(e > 0.0f) || !(e >= min_p)) return 0ull;
    if (!sorted) *key = (1ull << 32) | (0xFFFFFFFFull - static_cast<uint64_t>(i));
    return mass(e);
  };
  const unsigned long long total = SumWeights<NUM_THREADS>(vocab, survivor, sh);
  // Step 7, inverse CDF: the first token whose running mass exceeds u * total.
  for (int j = 0; j < a.num_draws; ++j) {
    const double target = floor(uniforms[a.first_draw + j] * static_cast<double>(total));
    unsigned long long need = static_cast<unsigned long long>(target) + 1;
    if (need > total) need = total;
    const uint64_t key = SelectByWeight<NUM_THREADS>(vocab, survivor, need, sh);
    if (threadIdx.x == 0) sh.draws[j] = key != 0 ? SampleKeyId(key) : -1;
  }
  __syncthreads();
}

// Block-wide: b.logprobs[a.first_draw + j] = the raw logprob of sh.draws[j]:
// its logit before the penalties (b.penalty_raw for a penalized token, the
// row otherwise) minus log_z, the sampler's formula.
template <int NUM_THREADS>
__device__ void DrawnLogprobs(const float* row, const SampleRowArgs& a, const SampleBuffers& b,
                              double log_z, SampleShared& sh) {
  for (int j = threadIdx.x; j < a.num_draws; j += NUM_THREADS)
    sh.draw_raw[j] = sh.draws[j] >= 0 ? row[sh.draws[j]] : -INFINITY;
  __syncthreads();
  // Penalty entries hold distinct ids: at most one entry matches a draw.
  for (int k = threadIdx.x; k < a.penalty_count; k += NUM_THREADS) {
    const int32_t id = b.penalties[a.penalty_begin + k].token_id;
    for (int j = 0; j < a.num_draws; ++j)
      if (sh.draws[j] == id) sh.draw_raw[j] = b.penalty_raw[a.penalty_begin + k];
  }
  __syncthreads();
  for (int j = threadIdx.x; j < a.num_draws; j += NUM_THREADS)
    b.logprobs[a.first_draw + j] = static_cast<float>(static_cast<double>(sh.draw_raw[j]) - log_z);
}

// Grid (n), block (NUM_THREADS): samples row blockIdx.x of logits [n, vocab]
// (fp32) as the host sampler does (steps 1-7 of runtime/sampling/sampler.h)
// with a = b.args[blockIdx.x]: the raw logprobs when a.logprobs >= 0
// (RawLogprobs), the row's penalties applied in place, then
// b.tokens[a.first_draw + j] = the token drawn with b.uniforms[a.first_draw
// + j] (in [0, 1)) for j < a.num_draws (<= kMaxSampleDraws), or the
// penalized argmax for every draw of a greedy row, and their logprobs when
// asked. A row with num_draws == 0 is skipped; a row the host sampler
// refuses (a NaN or +inf logit, or only -inf ones, checked before the
// penalties) gets -1 in each of its draws and is not modified. 1 <= vocab
// <= kMaxSampleVocab.
template <int NUM_THREADS>
__device__ void SampleRowsBody(float* __restrict__ logits, int64_t vocab, const SampleBuffers& b) {
  __shared__ SampleShared sh;
  const SampleRowArgs a = b.args[blockIdx.x];
  if (a.num_draws <= 0) return;
  float* row = logits + static_cast<int64_t>(blockIdx.x) * vocab;

  // The raw row's maximum, and whether the sampler would refuse it.
  bool bad = false;
  float mx = RowMax<NUM_THREADS>(row, vocab, sh, &bad);
  if (bad || mx == -INFINITY) {
    for (int j = threadIdx.x; j < a.num_draws; j += NUM_THREADS) b.tokens[a.first_draw + j] = -1;
    return;
  }
  const bool logprobs = a.logprobs >= 0;
  const double log_z = logprobs ? RawLogprobs<NUM_THREADS>(row, vocab, mx, a, b, sh) : 0.0;
  // Step 1 (penalties keep finite values finite and -inf as -inf).
  if (a.penalty_count > 0) {
    ApplyPenalties<NUM_THREADS>(row, a, b.penalties, logprobs ? b.penalty_raw : nullptr);
    mx = RowMax<NUM_THREADS>(row, vocab, sh, &bad);
  }
  DrawTokens<NUM_THREADS>(row, vocab, mx, a, b.uniforms, sh);
  for (int j = threadIdx.x; j < a.num_draws; j += NUM_THREADS)
    b.tokens[a.first_draw + j] = sh.draws[j];
  if (logprobs) DrawnLogprobs<NUM_THREADS>(row, a, b, log_z, sh);
}

}  // namespace pagedserve::cuda_model

#endif  // PAGEDSERVE_RUNTIME_WORKER_CUDA_SAMPLING_KERNELS_CUH_
