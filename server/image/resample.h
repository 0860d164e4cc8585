// SPDX-License-Identifier: Apache-2.0
#pragma once
// Separable antialiased resampling (PIL's "bilinear": a triangle filter whose support is widened
// by the scale factor when downscaling), in fixed point, with the crop and the horizontal flip
// folded into the coefficient tables. Internal to server/image (SampleDecoder uses it; tests may).
//
// Use: build one AxisTaps per axis with BuildTaps(), run ResampleRowH() on each needed source
// row (rows in_begin..in_end of the vertical taps), then ResampleRowV() per output row.

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "server/image/transform.h"

namespace ringloader::image {

inline constexpr int kTapBits = 14;  // fixed-point weights: 1.0 == 1 << kTapBits
// Bytes of slack the horizontal pass needs after its source row and after its destination
// buffer (it loads 8 and stores 4 bytes per RGB pixel).
inline constexpr int kRowSlack = 8;

// Filter taps for one axis: output i reads inputs start[i] .. start[i] + taps - 1 with weights
// weights[i * taps + k] (int16, summing to exactly 1 << kTapBits). Every output has the same tap
// count (padded with zero weights) so the inner loops have a fixed trip count.
struct AxisTaps {
  int32_t out_size = 0;
  int32_t taps = 0;
  int32_t in_begin = 0;  // smallest input index any output reads
  int32_t in_end = 0;    // one past the largest
  std::vector<int32_t> start;
  std::vector<int16_t> weights;
  // The same weights as packed pairs (w[2j] | w[2j+1] << 16), (taps + 1) / 2 per output, for
  // the SIMD horizontal pass.
  std::vector<int32_t> weight_pairs;
};

// Taps for resampling the interval [in0, in0 + in_len) of the input axis to `out_size` samples
// (sample i is centred at in0 + (i + 0.5) * in_len / out_size), reading only inputs in
// [clamp_begin, clamp_end) the way PIL clips at the image edge. `reverse` mirrors the output
// (a horizontal flip). REQUIRES: out_size > 0, in_len > 0, clamp_begin < clamp_end.
void BuildTaps(double in0, double in_len, int32_t out_size, int32_t clamp_begin, int32_t clamp_end,
               bool reverse, AxisTaps& taps);

// Horizontal pass over one interleaved RGB row whose first pixel is input column `row_x0`:
// writes taps.out_size RGB pixels to `dst`. REQUIRES: the row covers [taps.in_begin, in_end),
// and both the row and `dst` have kRowSlack readable/writable bytes after their pixels (the
// byte after dst's last pixel may be overwritten).
void ResampleRowH(const uint8_t* row, int32_t row_x0, const AxisTaps& taps, uint8_t* dst);

// Vertical pass for output row `y`: `rows` holds consecutive rows of `row_bytes` bytes, the first
// being input row taps.in_begin. `acc` is scratch of at least row_bytes. Writes row_bytes to dst.
void ResampleRowV(const uint8_t* rows, int32_t row_bytes, const AxisTaps& taps, int32_t y,
                  int32_t* acc, uint8_t* dst);

// Writes one finished RGB output row (spec.image_size pixels) at row `y` of `out` in the spec's
// layout and dtype. `float_row` is scratch of at least 3 * image_size floats; `lut` holds
// (v / 255 - mean[c]) / std[c] for each channel c and byte value v (float output only).
void StoreRow(const uint8_t* rgb, int32_t y, const TransformSpec& spec,
              const std::array<std::array<float, 256>, 3>& lut, float* float_row,
              std::span<uint8_t> out);

// Tests only: selects the resampling kernels, 0 scalar, 1 SSE2, 2 SSSE3 (clamped to what the
// CPU has; the default is the best). Returns the level now in use. Not for concurrent use.
int SetResampleIsaForTesting(int level);

// Fills `lut` for StoreRow from spec.mean / spec.std.
void BuildNormalizeLut(const TransformSpec& spec, std::array<std::array<float, 256>, 3>& lut);

}  // namespace ringloader::image
