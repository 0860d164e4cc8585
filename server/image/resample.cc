#include "server/image/resample.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace ringloader::image {
namespace {

constexpr int32_t kHalf = 1 << (kTapBits - 1);

inline uint8_t Clip8(int32_t v) {
  v >>= kTapBits;
  return static_cast<uint8_t>(v < 0 ? 0 : (v > 255 ? 255 : v));
}

// The horizontal pass with the tap count known at compile time (the common cases), so the tap
// loop unrolls and the three channel accumulators stay in registers.
template <int K>
void RowH(const uint8_t* row, int32_t row_x0, const AxisTaps& taps, uint8_t* dst) {
  const int32_t* start = taps.start.data();
  const int16_t* weights = taps.weights.data();
  for (int32_t i = 0; i < taps.out_size; ++i) {
    const uint8_t* s = row + (start[i] - row_x0) * 3;
    const int16_t* w = weights + i * K;
    int32_t r = kHalf, g = kHalf, b = kHalf;
    for (int k = 0; k < K; ++k) {
      r += s[3 * k + 0] * w[k];
      g += s[3 * k + 1] * w[k];
      b += s[3 * k + 2] * w[k];
    }
    dst[3 * i + 0] = Clip8(r);
    dst[3 * i + 1] = Clip8(g);
    dst[3 * i + 2] = Clip8(b);
  }
}

void RowHGeneric(const uint8_t* row, int32_t row_x0, const AxisTaps& taps, uint8_t* dst) {
  const int32_t n = taps.taps;
  for (int32_t i = 0; i < taps.out_size; ++i) {
    const uint8_t* s = row + (taps.start[i] - row_x0) * 3;
    const int16_t* w = taps.weights.data() + static_cast<size_t>(i) * n;
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
}

void ResampleRowH(const uint8_t* row, int32_t row_x0, const AxisTaps& taps, uint8_t* dst) {
  switch (taps.taps) {
    case 1: return RowH<1>(row, row_x0, taps, dst);
    case 2: return RowH<2>(row, row_x0, taps, dst);
    case 3: return RowH<3>(row, row_x0, taps, dst);
    case 4: return RowH<4>(row, row_x0, taps, dst);
    case 5: return RowH<5>(row, row_x0, taps, dst);
    case 6: return RowH<6>(row, row_x0, taps, dst);
    case 7: return RowH<7>(row, row_x0, taps, dst);
    case 8: return RowH<8>(row, row_x0, taps, dst);
    default: return RowHGeneric(row, row_x0, taps, dst);
  }
}

void ResampleRowV(const uint8_t* rows, int32_t row_bytes, const AxisTaps& taps, int32_t y,
                  int32_t* acc, uint8_t* dst) {
  const int32_t n = taps.taps;
  const int16_t* w = taps.weights.data() + static_cast<size_t>(y) * n;
  const uint8_t* src = rows + static_cast<size_t>(taps.start[y] - taps.in_begin) * row_bytes;
  {
    const int32_t w0 = w[0];
    for (int32_t i = 0; i < row_bytes; ++i) acc[i] = kHalf + src[i] * w0;
  }
  for (int32_t k = 1; k < n; ++k) {
    const int32_t wk = w[k];
    if (wk == 0) continue;
    const uint8_t* s = src + static_cast<size_t>(k) * row_bytes;
    for (int32_t i = 0; i < row_bytes; ++i) acc[i] += s[i] * wk;
  }
  for (int32_t i = 0; i < row_bytes; ++i) dst[i] = Clip8(acc[i]);
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
