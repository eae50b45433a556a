// Portable path of the CPU Linear: activation quantization, weight-row
// dequantization (the reference of every kernel) and scalar dot products.
#include <cmath>
#include <cstdlib>

#include "kernels/cpu/linear_cpu.h"

namespace pagedserve::kernels::cpu {
namespace {

// Scale and codes of one block of n activations: d = max|x| / 127 and
// q = round(x / d), so |x - d q| <= d / 2. lrintf, not a cast, keeps non-finite
// input free of undefined behaviour (its result is then unspecified).
float QuantizeBlock(const float* x, int n, int8_t* q) {
  float amax = 0.0f;
  // A NaN anywhere in the block makes amax (and so d and the dot) NaN, where
  // std::fmax would drop it: a row of NaN activations (what a NaN before a
  // norm gives) then reaches the logits as NaN and the sampler refuses the
  // request, as on the x86 paths (whose max_ps of an all-NaN block is NaN; a
  // lone NaN there may be dropped). Same result as fmax for finite input.
  for (int i = 0; i < n; ++i) {
    const float a = std::fabs(x[i]);
    if (a > amax || std::isnan(a)) amax = a;
  }
  const float d = amax / 127.0f;
  const float id = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int i = 0; i < n; ++i) {
    long v = std::lrintf(x[i] * id);
    q[i] = static_cast<int8_t>(v > 127 ? 127 : (v < -127 ? -127 : v));
  }
  return d;
}

void DequantBlock(WeightType type, const uint8_t* b, float* y) {
  switch (type) {
    case WeightType::kQ4_0: {
      const float d = LoadF16(b);
      for (int j = 0; j < 16; ++j) {
        y[j] = d * static_cast<float>((b[2 + j] & 15) - 8);
        y[j + 16] = d * static_cast<float>((b[2 + j] >> 4) - 8);
      }
      return;
    }
    case WeightType::kQ4_1: {
      const float d = LoadF16(b), m = LoadF16(b + 2);
      for (int j = 0; j < 16; ++j) {
        y[j] = d * static_cast<float>(b[4 + j] & 15) + m;
        y[j + 16] = d * static_cast<float>(b[4 + j] >> 4) + m;
      }
      return;
    }
    case WeightType::kQ5_0:
    case WeightType::kQ5_1: {
      const bool has_min = type == WeightType::kQ5_1;
      const float d = LoadF16(b), m = has_min ? LoadF16(b + 2) : 0.0f;
      const uint32_t qh = LoadU32(b + (has_min ? 4 : 2));
      const uint8_t* qs = b + (has_min ? 8 : 6);
      const int off = has_min ? 0 : 16;
      for (int j = 0; j < 16; ++j) {
        const int x0 = (qs[j] & 15) | (((qh >> j) & 1) << 4);
        const int x1 = (qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
        y[j] = d * static_cast<float>(x0 - off) + m;
        y[j + 16] = d * static_cast<float>(x1 - off) + m;
      }
      return;
    }
    case WeightType::kQ8_0: {
      const float d = LoadF16(b);
      for (int j = 0; j < 32; ++j) y[j] = d * static_cast<float>(static_cast<int8_t>(b[2 + j]));
      return;
    }
    case WeightType::kQ4_K:
    case WeightType::kQ5_K: {
      const bool five = type == WeightType::kQ5_K;
      const float d = LoadF16(b), dmin = LoadF16(b + 2);
      const uint8_t* qh = b + 16;
      const uint8_t* qs = b + (five ? 48 : 16);
      for (int j = 0; j < 8; ++j) {
        int sc, mn;
        ScaleMinK4(j, b + 4, &sc, &mn);
        const float dl = d * static_cast<float>(sc), ml = dmin * static_cast<float>(mn);
        for (int l = 0; l < 32; ++l) {
          const uint8_t byte = qs[32 * (j / 2) + l];
          int q = (j & 1) ? (byte >> 4) : (byte & 15);
          if (five) q |= ((qh[l] >> j) & 1) << 4;
          y[32 * j + l] = dl * static_cast<float>(q) - ml;
        }
      }
      return;
    }
    case WeightType::kQ2_K: {
      const float d = LoadF16(b + 80), dmin = LoadF16(b + 82);
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32, g = e / 16;
        const float dl = d * static_cast<float>(b[g] & 15);
        const float ml = dmin * static_cast<float>(b[g] >> 4);
        y[e] = dl * static_cast<float>((b[16 + 32 * h + l] >> (2 * k)) & 3) - ml;
      }
      return;
    }
    case WeightType::kQ3_K: {
      int8_t sc[16];
      ScalesQ3K(b + 96, sc);
      const float d = LoadF16(b + 108);
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        const int q = ((b[32 + 32 * h + l] >> (2 * k)) & 3) | (((b[l] >> (4 * h + k)) & 1) << 2);
        const int g = e / 16;
        y[e] = (d * static_cast<float>(sc[g])) * static_cast<float>(q - 4);
      }
      return;
    }
    case WeightType::kIQ4_NL: {
      const float d = LoadF16(b);
      for (int j = 0; j < 16; ++j) {
        y[j] = d * static_cast<float>(kIq4nlValues[b[2 + j] & 15]);
        y[j + 16] = d * static_cast<float>(kIq4nlValues[b[2 + j] >> 4]);
      }
      return;
    }
    case WeightType::kIQ4_XS: {
      const float d = LoadF16(b);
      for (int j = 0; j < 8; ++j) {
        const float dl = d * static_cast<float>(ScaleIq4Xs(b, j));
        const uint8_t* qs = b + 8 + 16 * j;
        for (int l = 0; l < 16; ++l) {
          y[32 * j + l] = dl * static_cast<float>(kIq4nlValues[qs[l] & 15]);
          y[32 * j + l + 16] = dl * static_cast<float>(kIq4nlValues[qs[l] >> 4]);
        }
      }
      return;
    }
    case WeightType::kQ6_K: {
      const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
      const float d = LoadF16(b + 208);
      for (int e = 0; e < 256; ++e) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32, j = e / 16;
        const uint8_t lo = b[64 * h + l + 32 * (k & 1)];
        const int q = ((k < 2 ? lo & 15 : lo >> 4) | (((b[128 + 32 * h + l] >> (2 * k)) & 3) << 4));
        y[e] = d * static_cast<float>(sc[j]) * static_cast<float>(q - 32);
      }
      return;
    }
    default: return;
  }
}

// ---- dot products of one weight row with one token ----

float DotQ4_0(const uint8_t* w, const void* xv, int64_t nb) {
  const ActBlock32* x = static_cast<const ActBlock32*>(xv);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i, w += 18) {
    const int8_t* q = x[i].qs;
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) s += (w[2 + j] & 15) * q[j] + (w[2 + j] >> 4) * q[j + 16];
    acc += LoadF16(w) * x[i].d * static_cast<float>(s - 8 * x[i].sum);
  }
  return acc;
}

float DotQ4_1(const uint8_t* w, const void* xv, int64_t nb) {
  const ActBlock32* x = static_cast<const ActBlock32*>(xv);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i, w += 20) {
    const int8_t* q = x[i].qs;
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) s += (w[4 + j] & 15) * q[j] + (w[4 + j] >> 4) * q[j + 16];
    acc += x[i].d *
           (LoadF16(w) * static_cast<float>(s) + LoadF16(w + 2) * static_cast<float>(x[i].sum));
  }
  return acc;
}

template <bool kHasMin>
float DotQ5(const uint8_t* w, const void* xv, int64_t nb) {
  const ActBlock32* x = static_cast<const ActBlock32*>(xv);
  constexpr int kBytes = kHasMin ? 24 : 22, kQh = kHasMin ? 4 : 2, kQs = kHasMin ? 8 : 6;
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i, w += kBytes) {
    const int8_t* q = x[i].qs;
    const uint32_t qh = LoadU32(w + kQh);
    int32_t s = 0;
    for (int j = 0; j < 16; ++j) {
      const int x0 = (w[kQs + j] & 15) | (((qh >> j) & 1) << 4);
      const int x1 = (w[kQs + j] >> 4) | (((qh >> (j + 16)) & 1) << 4);
      s += x0 * q[j] + x1 * q[j + 16];
    }
    if constexpr (kHasMin) {
      acc += x[i].d *
             (LoadF16(w) * static_cast<float>(s) + LoadF16(w + 2) * static_cast<float>(x[i].sum));
    } else {
      acc += LoadF16(w) * x[i].d * static_cast<float>(s - 16 * x[i].sum);
    }
  }
  return acc;
}

float DotQ8_0(const uint8_t* w, const void* xv, int64_t nb) {
  const ActBlock32* x = static_cast<const ActBlock32*>(xv);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i, w += 34) {
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) s += static_cast<int8_t>(w[2 + j]) * x[i].qs[j];
    acc += LoadF16(w) * x[i].d * static_cast<float>(s);
  }
  return acc;
}

template <bool kFive>
float DotQ45K(const uint8_t* w, const void* xv, int64_t nb) {
  const ActBlock256* x = static_cast<const ActBlock256*>(xv);
  constexpr int kBytes = kFive ? 176 : 144, kQs = kFive ? 48 : 16;
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i, w += kBytes) {
    const int8_t* q = x[i].qs;
    const int16_t* bs = x[i].bsums;
    const uint8_t* qh = w + 16;
    int32_t sumi = 0, summ = 0;
    for (int j = 0; j < 8; ++j) {
      int sc, mn;
      ScaleMinK4(j, w + 4, &sc, &mn);
      const uint8_t* qs = w + kQs + 32 * (j / 2);
      const int shift = (j & 1) * 4;
      int32_t dot = 0;
      for (int l = 0; l < 32; ++l) {
        int v = (qs[l] >> shift) & 15;
        if constexpr (kFive) v |= ((qh[l] >> j) & 1) << 4;
        dot += v * q[32 * j + l];
      }
      sumi += sc * dot;
      summ += mn * (bs[2 * j] + bs[2 * j + 1]);
    }
    acc += x[i].d *
           (LoadF16(w) * static_cast<float>(sumi) - LoadF16(w + 2) * static_cast<float>(summ));
  }
  return acc;
}

float DotQ6K(const uint8_t* w, const void* xv, int64_t nb) {
  const ActBlock256* x = static_cast<const ActBlock256*>(xv);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i, w += 210) {
    const int8_t* q = x[i].qs;
    const int8_t* sc = reinterpret_cast<const int8_t*>(w + 192);
    int32_t sumi = 0;
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 4; ++k) {
        const uint8_t* ql = w + 64 * h + 32 * (k & 1);
        const uint8_t* qh = w + 128 + 32 * h;
        const int lshift = k < 2 ? 0 : 4;
        for (int half = 0; half < 2; ++half) {
          const int sub = 8 * h + 2 * k + half;
          int32_t dot = 0;
          for (int l = 16 * half; l < 16 * half + 16; ++l) {
            const int v = ((ql[l] >> lshift) & 15) | (((qh[l] >> (2 * k)) & 3) << 4);
            dot += v * q[16 * sub + (l - 16 * half)];
          }
          sumi += sc[sub] * (dot - 32 * x[i].bsums[sub]);
        }
      }
    }
    acc += LoadF16(w + 208) * x[i].d * static_cast<float>(sumi);
  }
  return acc;
}

// Q2_K and Q3_K (layouts in quant_blocks.h): per 16-element group g the
// integer dot of the unsigned codes with the activation codes, times the
// group's scale; Q2_K's mins and Q3_K's -4 offset through the activation sums.
template <bool kThree>
float DotQ23K(const uint8_t* w, const void* xv, int64_t nb) {
  const ActBlock256* x = static_cast<const ActBlock256*>(xv);
  constexpr int kBytes = kThree ? 110 : 84, kQs = kThree ? 32 : 16;
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i, w += kBytes) {
    const int8_t* q = x[i].qs;
    const int16_t* bs = x[i].bsums;
    int8_t sc3[16];
    if constexpr (kThree) ScalesQ3K(w + 96, sc3);
    int32_t sumi = 0, summ = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t dot = 0;
      for (int e = 16 * g; e < 16 * g + 16; ++e) {
        const int h = e / 128, k = (e % 128) / 32, l = e % 32;
        int v = (w[kQs + 32 * h + l] >> (2 * k)) & 3;
        if constexpr (kThree) v |= ((w[l] >> (4 * h + k)) & 1) << 2;
        dot += v * q[e];
      }
      if constexpr (kThree) {
        sumi += sc3[g] * (dot - 4 * bs[g]);
      } else {
        sumi += (w[g] & 15) * dot;
        summ += (w[g] >> 4) * bs[g];
      }
    }
    const float d = LoadF16(w + (kThree ? 108 : 80)), dmin = kThree ? 0.0f : LoadF16(w + 82);
    acc += x[i].d * (d * static_cast<float>(sumi) - dmin * static_cast<float>(summ));
  }
  return acc;
}

float DotIq4Nl(const uint8_t* w, const void* xv, int64_t nb) {
  const ActBlock32* x = static_cast<const ActBlock32*>(xv);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i, w += 18) {
    const int8_t* q = x[i].qs;
    int32_t s = 0;
    for (int j = 0; j < 16; ++j)
      s += kIq4nlValues[w[2 + j] & 15] * q[j] + kIq4nlValues[w[2 + j] >> 4] * q[j + 16];
    acc += LoadF16(w) * x[i].d * static_cast<float>(s);
  }
  return acc;
}

float DotIq4Xs(const uint8_t* w, const void* xv, int64_t nb) {
  const ActBlock256* x = static_cast<const ActBlock256*>(xv);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i, w += 136) {
    const int8_t* q = x[i].qs;
    int32_t sumi = 0;
    for (int j = 0; j < 8; ++j) {
      const uint8_t* qs = w + 8 + 16 * j;
      int32_t dot = 0;
      for (int l = 0; l < 16; ++l)
        dot += kIq4nlValues[qs[l] & 15] * q[32 * j + l] +
               kIq4nlValues[qs[l] >> 4] * q[32 * j + l + 16];
      sumi += ScaleIq4Xs(w, j) * dot;
    }
    acc += LoadF16(w) * x[i].d * static_cast<float>(sumi);
  }
  return acc;
}

// fp dots with 8 independent partial sums (lets the compiler vectorize).
template <typename Load>
float FDot(const uint8_t* w, const float* x, int64_t n, Load load) {
  float part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) part[k] += load(w, i + k) * x[i + k];
  for (; i < n; ++i) part[0] += load(w, i) * x[i];
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

float DotF32(const uint8_t* w, const float* x, int64_t n) {
  return FDot(w, x, n, [](const uint8_t* p, int64_t i) {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  });
}
float DotF16(const uint8_t* w, const float* x, int64_t n) {
  return FDot(w, x, n, [](const uint8_t* p, int64_t i) { return LoadF16(p + 2 * i); });
}
float DotBF16(const uint8_t* w, const float* x, int64_t n) {
  return FDot(w, x, n,
              [](const uint8_t* p, int64_t i) { return BFloat16BitsToFloat(LoadU16(p + 2 * i)); });
}

// Adapters to the multi-token signatures of IsaKernels: one token at a time.
template <float (*kDot)(const uint8_t*, const void*, int64_t)>
void QMulti(const uint8_t* w, const uint8_t* x, size_t xb, int64_t nb, int ntok, float* out) {
  for (int j = 0; j < ntok; ++j) out[j] = kDot(w, x + j * xb, nb);
}
// The register-blocked tile (QTileFn) as row dots: the portable reference.
template <float (*kDot)(const uint8_t*, const void*, int64_t), int kRows = kBlockRows,
          int kTokens = kBlockTokens>
void QTile(const uint8_t* w, size_t wb, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  for (int i = 0; i < kRows; ++i)
    for (int j = 0; j < kTokens; ++j) out[i * kTokens + j] = kDot(w + i * wb, x + j * xb, nb);
}
template <float (*kDot)(const uint8_t*, const void*, int64_t)>
void QTileDecode(const uint8_t* w, size_t wb, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  QTile<kDot, kDecodeRows, 1>(w, wb, x, xb, nb, out);
}
// The kRowBlock8 tile (linear_cpu.h), scalar: the arithmetic of the AVX2
// kernels (the same exact integer block sums; per block and token,
// acc += float(sum) * (d * d_x), then for Q4_1/Q5_1 acc += m * (d_x * sum_x)),
// one row at a time. The block layout as in DequantBlock.
template <WeightType kType>
void Row8Tile(const uint8_t* w, size_t wb, const uint8_t* x, size_t xb, int64_t nb, float* out) {
  constexpr bool kMin = kType == WeightType::kQ4_1 || kType == WeightType::kQ5_1;
  constexpr bool kFive = kType == WeightType::kQ5_0 || kType == WeightType::kQ5_1;
  constexpr int kOffset = kType == WeightType::kQ4_0 ? 8 : (kType == WeightType::kQ5_0 ? 16 : 0);
  constexpr int kBytes = kType == WeightType::kQ8_0 ? 34 : 18 + (kMin ? 2 : 0) + (kFive ? 4 : 0);
  constexpr int kQh = kMin ? 4 : 2, kQs = (kMin ? 4 : 2) + (kFive ? 4 : 0);
  for (int t = 0; t < kRow8Tokens; ++t) {
    const ActBlock32* a = reinterpret_cast<const ActBlock32*>(x + t * xb);
    for (int r = 0; r < kRow8Rows; ++r) {
      float acc = 0.0f;
      for (int64_t i = 0; i < nb; ++i) {
        const uint8_t* b = w + r * wb + i * kBytes;
        const int8_t* q = a[i].qs;
        int32_t s = 0;
        if constexpr (kType == WeightType::kQ8_0) {
          for (int j = 0; j < 32; ++j) s += static_cast<int8_t>(b[2 + j]) * q[j];
        } else {
          const uint8_t* qs = b + kQs;
          const uint32_t qh = kFive ? LoadU32(b + kQh) : 0;
          for (int j = 0; j < 16; ++j) {
            const int x0 = (qs[j] & 15) | static_cast<int>(((qh >> j) & 1) << 4);
            const int x1 = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1) << 4);
            s += x0 * q[j] + x1 * q[j + 16];
          }
          s -= kOffset * a[i].sum;
        }
        acc += static_cast<float>(s) * (LoadF16(b) * a[i].d);
        if constexpr (kMin) acc += LoadF16(b + 2) * (a[i].d * static_cast<float>(a[i].sum));
      }
      out[t * kRow8Rows + r] = acc;
    }
  }
}
template <float (*kDot)(const uint8_t*, const float*, int64_t)>
void FMulti(const uint8_t* w, const float* x, int64_t xs, int64_t n, int ntok, float* out) {
  for (int j = 0; j < ntok; ++j) out[j] = kDot(w, x + j * xs, n);
}

}  // namespace

void QuantizeActs32(const float* x, int64_t n, ActBlock32* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    ActBlock32& o = out[b];
    o.d = QuantizeBlock(x + 32 * b, 32, o.qs);
    int32_t s = 0;
    for (int i = 0; i < 32; ++i) s += o.qs[i];
    o.sum = s;
  }
}

void QuantizeActs256(const float* x, int64_t n, ActBlock256* out) {
  for (int64_t b = 0; b < n / 256; ++b) {
    ActBlock256& o = out[b];
    o.d = QuantizeBlock(x + 256 * b, 256, o.qs);
    for (int k = 0; k < 16; ++k) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += o.qs[16 * k + i];
      o.bsums[k] = static_cast<int16_t>(s);
    }
  }
}

void DequantizeWeightRow(WeightType type, const uint8_t* row, int64_t cols, float* dst) {
  switch (type) {
    case WeightType::kF32: std::memcpy(dst, row, static_cast<size_t>(cols) * 4); return;
    case WeightType::kF16:
      for (int64_t i = 0; i < cols; ++i) dst[i] = LoadF16(row + 2 * i);
      return;
    case WeightType::kBF16:
      for (int64_t i = 0; i < cols; ++i) dst[i] = BFloat16BitsToFloat(LoadU16(row + 2 * i));
      return;
    default: break;
  }
  const int64_t be = BlockElems(type);
  const size_t bb = BlockBytes(type);
  for (int64_t b = 0; b < cols / be; ++b) DequantBlock(type, row + b * bb, dst + b * be);
}

const IsaKernels& PortableKernels() {
  static const IsaKernels k = {QMulti<DotQ4_0>,
                               QMulti<DotQ4_1>,
                               QMulti<DotQ5<false>>,
                               QMulti<DotQ5<true>>,
                               QMulti<DotQ8_0>,
                               QMulti<DotQ45K<false>>,
                               QMulti<DotQ45K<true>>,
                               QMulti<DotQ6K>,
                               FMulti<DotF32>,
                               FMulti<DotF16>,
                               FMulti<DotBF16>,
                               QTile<DotQ4_0>,
                               QTile<DotQ4_1>,
                               QTile<DotQ5<false>>,
                               QTile<DotQ5<true>>,
                               QTile<DotQ8_0>,
                               QTile<DotQ45K<false>>,
                               QTile<DotQ45K<true>>,
                               QTile<DotQ6K>,
                               QTileDecode<DotQ4_0>,
                               QTileDecode<DotQ4_1>,
                               QTileDecode<DotQ5<false>>,
                               QTileDecode<DotQ5<true>>,
                               QTileDecode<DotQ8_0>,
                               QTileDecode<DotQ45K<false>>,
                               QTileDecode<DotQ45K<true>>,
                               QTileDecode<DotQ6K>,
                               QuantizeActs32,
                               QuantizeActs256,
                               Row8Tile<WeightType::kQ4_0>,
                               Row8Tile<WeightType::kQ4_1>,
                               Row8Tile<WeightType::kQ5_0>,
                               Row8Tile<WeightType::kQ5_1>,
                               Row8Tile<WeightType::kQ8_0>,
                               nullptr,
                               nullptr,
                               nullptr,
                               QMulti<DotQ23K<false>>,
                               QMulti<DotQ23K<true>>,
                               QMulti<DotIq4Nl>,
                               QMulti<DotIq4Xs>,
                               QTile<DotQ23K<false>>,
                               QTile<DotQ23K<true>>,
                               QTileDecode<DotQ23K<false>>,
                               QTileDecode<DotQ23K<true>>,
                               nullptr,
                               nullptr,
                               nullptr,
                               nullptr,
                               nullptr,
                               nullptr,
                               nullptr,
                               nullptr,
                               nullptr};
  return k;
}

}  // namespace pagedserve::kernels::cpu
