// SPDX-License-Identifier: Apache-2.0
#include "server/image/resample.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#include <tmmintrin.h>  // SSSE3, used only from target("ssse3") functions after a CPU check
#endif

namespace ringloader::image {
namespace {

constexpr int32_t kHalf = 1 << (kTapBits - 1);

inline uint8_t Clip8(int32_t v) {
  v >>= kTapBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

#if defined(__SSE2__)
// SSE2 horizontal pass. Two taps per pmaddwd: the 4 bytes at pixel k (R G B + the next pixel's R)
// and at pixel k+1 are widened to 16 bits and interleaved as [R_k R_k+1 G_k G_k+1 B_k B_k+1 ..],
// then multiplied by [w_k w_k+1] pairs and summed into 32-bit lanes R, G, B, (junk). The result's
// 4 bytes are stored at the output pixel; the junk byte is overwritten by the next pixel (the
// destination has one byte of slack, see kRowSlack). Reads up to 4 bytes past the last tap
// pixel (the odd tap's zero-weighted partner).
inline __m128i Load4(const uint8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm_unpacklo_epi8(_mm_cvtsi32_si128(v), _mm_setzero_si128());
}

template <int K>  // K = 0: runtime tap count
void RowHSse2(const uint8_t* row, int32_t row_x0, const AxisTaps& taps, uint8_t* dst) {
  const int32_t n = K > 0 ? K : taps.taps;
  const int32_t pairs = (n + 1) / 2;
  const int32_t* start = taps.start.data();
  const int32_t* pw = taps.weight_pairs.data();
  const __m128i half = _mm_set1_epi32(kHalf);
  for (int32_t i = 0; i < taps.out_size; ++i) {
    const uint8_t* s = row + (start[i] - row_x0) * 3;
    const int32_t* w = pw + static_cast<size_t>(i) * pairs;
    __m128i acc = half;
    for (int32_t j = 0; j < pairs; ++j) {
      const int32_t k = 2 * j;
      // For an odd tap count the last pair's second weight is 0 (its pixel is still readable).
      const __m128i px = _mm_unpacklo_epi16(Load4(s + 3 * k), Load4(s + 3 * k + 3));
      acc = _mm_add_epi32(acc, _mm_madd_epi16(px, _mm_set1_epi32(w[j])));
    }
    acc = _mm_srai_epi32(acc, kTapBits);
    const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc);
    const int32_t out = _mm_cvtsi128_si32(packed);
    std::memcpy(dst + 3 * i, &out, 4);
  }
}

// SSSE3 horizontal pass: per tap pair, one 8-byte load at pixel k (bytes R G B R G B . .),
// one pshufb to [R_k R_k+1 G_k G_k+1 B_k B_k+1 0 0] as 16-bit lanes, one pmaddwd with the
// pre-packed weight pair. Reads up to 5 bytes past the last tap pixel (kRowSlack).
template <int K>  // K = 0: runtime tap count
__attribute__((target("ssse3"))) void RowHSsse3(const uint8_t* row, int32_t row_x0,
                                                const AxisTaps& taps, uint8_t* dst) {
  const int32_t n = K > 0 ? K : taps.taps;
  const int32_t pairs = (n + 1) / 2;
  const int32_t* start = taps.start.data();
  const int32_t* pw = taps.weight_pairs.data();
  const __m128i shuffle = _mm_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
  const __m128i half = _mm_set1_epi32(kHalf);
  for (int32_t i = 0; i < taps.out_size; ++i) {
    const uint8_t* s = row + (start[i] - row_x0) * 3;
    const int32_t* w = pw + static_cast<size_t>(i) * pairs;
    __m128i acc = half;
    for (int32_t j = 0; j < pairs; ++j) {
      const __m128i px =
          _mm_shuffle_epi8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(s + 6 * j)), shuffle);
      acc = _mm_add_epi32(acc, _mm_madd_epi16(px, _mm_set1_epi32(w[j])));
    }
    acc = _mm_srai_epi32(acc, kTapBits);
    const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(acc, acc), acc);
    const int32_t out = _mm_cvtsi128_si32(packed);
    std::memcpy(dst + 3 * i, &out, 4);
  }
}

#endif

int CpuIsaLevel() {
#if defined(__SSE2__)
  return __builtin_cpu_supports("ssse3") ? 2 : 1;
#else
  return 0;
#endif
}

std::atomic<int> g_isa_level{CpuIsaLevel()};

[[maybe_unused]] bool UseSsse3() { return g_isa_level.load(std::memory_order_relaxed) >= 2; }
[[maybe_unused]] bool UseSse2() { return g_isa_level.load(std::memory_order_relaxed) >= 1; }

// The horizontal pass with the tap count known at compile time (the common cases), so the tap
// loop unrolls and the three channel accumulators stay in registers.
// Scalar horizontal pass (also the reference the SIMD versions are tested against). With K > 0
// the tap loop unrolls and the three channel accumulators stay in registers.
template <int K>  // K = 0: runtime tap count
void RowHScalar(const uint8_t* row, int32_t row_x0, const AxisTaps& taps, uint8_t* dst) {
  const int32_t n = K > 0 ? K : taps.taps;
  const int32_t* start = taps.start.data();
  const int16_t* weights = taps.weights.data();
  for (int32_t i = 0; i < taps.out_size; ++i) {
    const uint8_t* s = row + (start[i] - row_x0) * 3;
    const int16_t* w = weights + static_cast<size_t>(i) * n;
    int32_t r = kHalf, g = kHalf, b = kHalf;
    for (int32_t k = 0; k < n; ++k) {
      r += s[3 * k + 0] * w[k];
      g += s[3 * k + 1] * w[k];
      b += s[3 * k + 2] * w[k];
    }
    dst[3 * i + 0] = Clip8(r);
    dst[3 * i + 1] = Clip8(g);
    dst[3 * i + 2] = Clip8(b);
  }
}

template <int K>
void RowH(const uint8_t* row, int32_t row_x0, const AxisTaps& taps, uint8_t* dst) {
#if defined(__SSE2__)
  if (UseSsse3()) return RowHSsse3<K>(row, row_x0, taps, dst);
  if (UseSse2()) return RowHSse2<K>(row, row_x0, taps, dst);
#endif
  RowHScalar<K>(row, row_x0, taps, dst);
}

}  // namespace

void BuildTaps(double in0, double in_len, int32_t out_size, int32_t clamp_begin, int32_t clamp_end,
               bool reverse, AxisTaps& taps) {
  const double scale = in_len / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = filter_scale;  // the triangle filter's support is 1
  const double inv = 1.0 / filter_scale;
  const int32_t range = clamp_end - clamp_begin;
  const int32_t max_taps = std::min(static_cast<int32_t>(std::ceil(support)) * 2 + 1, range);

  // Pass 1: exact taps per output (PIL's precompute_coeffs), quantised to fixed point.
  std::vector<double> w(static_cast<size_t>(max_taps) + 2);
  std::vector<int32_t> first(out_size), count(out_size);
  std::vector<int16_t> q(static_cast<size_t>(out_size) * max_taps, 0);
  int32_t taps_needed = 1;
  for (int32_t i = 0; i < out_size; ++i) {
    const double center = in0 + (i + 0.5) * scale;
    int32_t lo = std::max(static_cast<int32_t>(std::floor(center - support + 0.5)), clamp_begin);
    int32_t hi = std::min(static_cast<int32_t>(std::floor(center + support + 0.5)), clamp_end);
    hi = std::min(hi, lo + max_taps);
    double total = 0;
    for (int32_t x = lo; x < hi; ++x) {
      const double t = std::abs((x - center + 0.5) * inv);
      w[x - lo] = t < 1.0 ? 1.0 - t : 0.0;
      total += w[x - lo];
    }
    if (hi <= lo || total <= 0) {  // degenerate: nearest valid input
      lo = std::clamp(static_cast<int32_t>(std::floor(center)), clamp_begin, clamp_end - 1);
      hi = lo + 1;
      w[0] = total = 1.0;
    }
    int16_t* qi = q.data() + static_cast<size_t>(i) * max_taps;
    int32_t sum = 0, biggest = 0;
    for (int32_t k = 0; k < hi - lo; ++k) {
      qi[k] = static_cast<int16_t>(std::lround(w[k] / total * (1 << kTapBits)));
      sum += qi[k];
      if (qi[k] > qi[biggest]) biggest = k;
    }
    qi[biggest] = static_cast<int16_t>(qi[biggest] + ((1 << kTapBits) - sum));  // exact unity
    // Trim zero weights at both ends (keeps the padded tap count small).
    int32_t a = 0, b = hi - lo;
    while (b - a > 1 && qi[a] == 0) ++a;
    while (b - a > 1 && qi[b - 1] == 0) --b;
    if (a > 0) std::memmove(qi, qi + a, sizeof(int16_t) * (b - a));
    std::fill(qi + (b - a), qi + max_taps, int16_t{0});
    first[i] = lo + a;
    count[i] = b - a;
    taps_needed = std::max(taps_needed, b - a);
  }

  // Pass 2: pad every output to taps_needed taps, shifting windows left at the right edge so
  // that no padded tap reads outside [clamp_begin, clamp_end).
  taps.out_size = out_size;
  taps.taps = taps_needed;
  taps.start.assign(out_size, 0);
  taps.weights.assign(static_cast<size_t>(out_size) * taps_needed, 0);
  taps.in_begin = clamp_end;
  taps.in_end = clamp_begin;
  for (int32_t i = 0; i < out_size; ++i) {
    const int32_t s = std::max(clamp_begin, std::min(first[i], clamp_end - taps_needed));
    const int32_t shift = first[i] - s;
    const int32_t o = reverse ? out_size - 1 - i : i;
    taps.start[o] = s;
    int16_t* dst = taps.weights.data() + static_cast<size_t>(o) * taps_needed;
    const int16_t* src = q.data() + static_cast<size_t>(i) * max_taps;
    for (int32_t k = 0; k < count[i]; ++k) dst[shift + k] = src[k];
    taps.in_begin = std::min(taps.in_begin, s);
    taps.in_end = std::max(taps.in_end, s + taps_needed);
  }
  const int32_t pairs = (taps_needed + 1) / 2;
  taps.weight_pairs.assign(static_cast<size_t>(out_size) * pairs, 0);
  for (int32_t o = 0; o < out_size; ++o) {
    const int16_t* wo = taps.weights.data() + static_cast<size_t>(o) * taps_needed;
    for (int32_t j = 0; j < pairs; ++j) {
      const auto lo = static_cast<uint16_t>(wo[2 * j]);
      const auto hi = 2 * j + 1 < taps_needed ? static_cast<uint16_t>(wo[2 * j + 1]) : uint16_t{0};
      taps.weight_pairs[static_cast<size_t>(o) * pairs + j] =
          static_cast<int32_t>((static_cast<uint32_t>(hi) << 16) | lo);
    }
  }
}

void ResampleRowH(const uint8_t* row, int32_t row_x0, const AxisTaps& taps, uint8_t* dst) {
  switch (taps.taps) {
    case 1:
      return RowH<1>(row, row_x0, taps, dst);
    case 2:
      return RowH<2>(row, row_x0, taps, dst);
    case 3:
      return RowH<3>(row, row_x0, taps, dst);
    case 4:
      return RowH<4>(row, row_x0, taps, dst);
    case 5:
      return RowH<5>(row, row_x0, taps, dst);
    case 6:
      return RowH<6>(row, row_x0, taps, dst);
    case 7:
      return RowH<7>(row, row_x0, taps, dst);
    case 8:
      return RowH<8>(row, row_x0, taps, dst);
    default:
      return RowH<0>(row, row_x0, taps, dst);
  }
}

void ResampleRowV(const uint8_t* rows, int32_t row_bytes, const AxisTaps& taps, int32_t y,
                  int32_t* acc, uint8_t* dst) {
  const int32_t n = taps.taps;
  const int16_t* w = taps.weights.data() + static_cast<size_t>(y) * n;
  const uint8_t* src = rows + static_cast<size_t>(taps.start[y] - taps.in_begin) * row_bytes;
  int32_t i = 0;
#if defined(__SSE2__)
  // 16 bytes at a time, two source rows per pmaddwd (bytes of rows k and k+1 interleaved).
  if (!UseSse2()) i = row_bytes;  // testing: the scalar loop below does everything
  const __m128i zero = _mm_setzero_si128();
  const __m128i half = _mm_set1_epi32(kHalf);
  for (; i + 16 <= row_bytes; i += 16) {
    __m128i a0 = half, a1 = half, a2 = half, a3 = half;
    for (int32_t k = 0; k < n; k += 2) {
      const __m128i r0 = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(src + static_cast<size_t>(k) * row_bytes + i));
      const bool pair = k + 1 < n;
      const __m128i r1 = pair ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(
                                    src + static_cast<size_t>(k + 1) * row_bytes + i))
                              : zero;
      const uint16_t w1 = pair ? static_cast<uint16_t>(w[k + 1]) : 0;
      const __m128i wp = _mm_set1_epi32(
          static_cast<int32_t>((static_cast<uint32_t>(w1) << 16) | static_cast<uint16_t>(w[k])));
      const __m128i lo = _mm_unpacklo_epi8(r0, r1);
      const __m128i hi = _mm_unpackhi_epi8(r0, r1);
      a0 = _mm_add_epi32(a0, _mm_madd_epi16(_mm_unpacklo_epi8(lo, zero), wp));
      a1 = _mm_add_epi32(a1, _mm_madd_epi16(_mm_unpackhi_epi8(lo, zero), wp));
      a2 = _mm_add_epi32(a2, _mm_madd_epi16(_mm_unpacklo_epi8(hi, zero), wp));
      a3 = _mm_add_epi32(a3, _mm_madd_epi16(_mm_unpackhi_epi8(hi, zero), wp));
    }
    a0 = _mm_srai_epi32(a0, kTapBits);
    a1 = _mm_srai_epi32(a1, kTapBits);
    a2 = _mm_srai_epi32(a2, kTapBits);
    a3 = _mm_srai_epi32(a3, kTapBits);
    const __m128i packed = _mm_packus_epi16(_mm_packs_epi32(a0, a1), _mm_packs_epi32(a2, a3));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), packed);
  }
#endif
  if (!UseSse2()) i = 0;
  if (i == row_bytes) return;
  {  // the tail (or everything, without SSE2)
    const int32_t w0 = w[0];
    for (int32_t j = i; j < row_bytes; ++j) acc[j] = kHalf + src[j] * w0;
  }
  for (int32_t k = 1; k < n; ++k) {
    const int32_t wk = w[k];
    if (wk == 0) continue;
    const uint8_t* s = src + static_cast<size_t>(k) * row_bytes;
    for (int32_t j = i; j < row_bytes; ++j) acc[j] += s[j] * wk;
  }
  for (int32_t j = i; j < row_bytes; ++j) dst[j] = Clip8(acc[j]);
}

int SetResampleIsaForTesting(int level) {
  const int used = std::clamp(level, 0, CpuIsaLevel());
  g_isa_level.store(used, std::memory_order_relaxed);
  return used;
}

void BuildNormalizeLut(const TransformSpec& spec, std::array<std::array<float, 256>, 3>& lut) {
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      lut[c][v] = (static_cast<float>(v) / 255.0f - spec.mean[c]) / spec.std[c];
    }
  }
}

void StoreRow(const uint8_t* rgb, int32_t y, const TransformSpec& spec,
              const std::array<std::array<float, 256>, 3>& lut, float* float_row,
              std::span<uint8_t> out) {
  const size_t n = spec.image_size;
  const size_t plane = n * n;
  uint8_t* base = out.data();
  if (spec.dtype == DType::kUint8) {
    if (spec.layout == Layout::kNHWC) {
      std::memcpy(base + y * n * 3, rgb, n * 3);
    } else {
      for (size_t c = 0; c < 3; ++c) {
        uint8_t* d = base + c * plane + y * n;
        for (size_t x = 0; x < n; ++x) d[x] = rgb[x * 3 + c];
      }
    }
    return;
  }
  // float32: the output may not be 4-byte aligned, so build the row and memcpy it in.
  if (spec.layout == Layout::kNHWC) {
    for (size_t x = 0; x < n; ++x) {
      for (size_t c = 0; c < 3; ++c) float_row[x * 3 + c] = lut[c][rgb[x * 3 + c]];
    }
    std::memcpy(base + y * n * 3 * sizeof(float), float_row, n * 3 * sizeof(float));
  } else {
    for (size_t c = 0; c < 3; ++c) {
      float* f = float_row + c * n;
      for (size_t x = 0; x < n; ++x) f[x] = lut[c][rgb[x * 3 + c]];
      std::memcpy(base + (c * plane + y * n) * sizeof(float), f, n * sizeof(float));
    }
  }
}

}  // namespace ringloader::image
