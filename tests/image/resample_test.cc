// SPDX-License-Identifier: Apache-2.0
// Fixed-point filter tables: unity gain, identity at scale 1, flip, bounds.

#include "server/image/resample.h"

#include <catch2/catch.hpp>
#include <numeric>

namespace ringloader::image {
namespace {

void CheckTaps(const AxisTaps& t, int32_t lo, int32_t hi) {
  for (int32_t i = 0; i < t.out_size; ++i) {
    int32_t sum = 0;
    for (int32_t k = 0; k < t.taps; ++k) {
      const int16_t w = t.weights[static_cast<size_t>(i) * t.taps + k];
      CHECK(w >= 0);
      sum += w;
    }
    CHECK(sum == (1 << kTapBits));
    CHECK(t.start[i] >= lo);
    CHECK(t.start[i] + t.taps <= hi);
  }
  CHECK(t.in_begin >= lo);
  CHECK(t.in_end <= hi);
}

TEST_CASE("BuildTaps: every output has unity gain and reads inside the clamp window",
          "[image][resample]") {
  AxisTaps t;
  BuildTaps(10.0, 300.0, 224, 10, 310, false, t);  // downscale
  CheckTaps(t, 10, 310);
  CHECK(t.taps <= 2 * 2 + 1);
  BuildTaps(0.0, 17.0, 64, 0, 17, false, t);  // upscale
  CheckTaps(t, 0, 17);
  BuildTaps(0.5, 1000.0, 7, 0, 1001, false, t);  // strong downscale
  CheckTaps(t, 0, 1001);
  BuildTaps(0.0, 1.0, 5, 0, 1, false, t);  // a single input pixel
  CheckTaps(t, 0, 1);
  CHECK(t.taps == 1);
}

TEST_CASE("BuildTaps: scale 1 at integer offsets is the identity", "[image][resample]") {
  AxisTaps t;
  BuildTaps(5.0, 20.0, 20, 5, 25, false, t);
  for (int32_t i = 0; i < 20; ++i) {
    // The single non-zero weight is on input 5 + i.
    for (int32_t k = 0; k < t.taps; ++k) {
      const int16_t w = t.weights[static_cast<size_t>(i) * t.taps + k];
      if (w != 0) {
        CHECK(t.start[i] + k == 5 + i);
        CHECK(w == (1 << kTapBits));
      }
    }
  }
  std::vector<uint8_t> row(30 * 3);
  std::iota(row.begin(), row.end(), uint8_t{0});
  std::vector<uint8_t> out(20 * 3 + kRowSlack);
  ResampleRowH(row.data() + 3 * 3, 3, t, out.data());  // the row starts at input column 3
  for (int32_t i = 0; i < 20 * 3; ++i) CHECK(out[i] == row[(3 + 5 - 3) * 3 + i]);
}

TEST_CASE("BuildTaps: reverse mirrors the outputs", "[image][resample]") {
  AxisTaps fwd, rev;
  BuildTaps(3.0, 50.0, 16, 0, 60, false, fwd);
  BuildTaps(3.0, 50.0, 16, 0, 60, true, rev);
  REQUIRE(fwd.taps == rev.taps);
  for (int32_t i = 0; i < 16; ++i) {
    CHECK(rev.start[i] == fwd.start[15 - i]);
    for (int32_t k = 0; k < fwd.taps; ++k) {
      CHECK(rev.weights[i * rev.taps + k] == fwd.weights[(15 - i) * fwd.taps + k]);
    }
  }
}

TEST_CASE("ResampleRowV: a flat image stays flat", "[image][resample]") {
  AxisTaps t;
  BuildTaps(0.0, 40.0, 9, 0, 40, false, t);
  const int32_t row_bytes = 12;
  std::vector<uint8_t> rows(static_cast<size_t>(t.in_end - t.in_begin) * row_bytes, 77);
  std::vector<int32_t> acc(row_bytes);
  std::vector<uint8_t> out(row_bytes);
  for (int32_t y = 0; y < 9; ++y) {
    ResampleRowV(rows.data(), row_bytes, t, y, acc.data(), out.data());
    for (uint8_t v : out) CHECK(v == 77);
  }
}

TEST_CASE("ResampleRowH/V: scalar, SSE2 and SSSE3 kernels give identical bytes",
          "[image][resample]") {
  uint64_t x = 99;
  std::vector<uint8_t> rows(64 * 700 * 3 + kRowSlack);
  for (uint8_t& b : rows) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    b = static_cast<uint8_t>(x >> 56);
  }
  struct Case {
    double in0, len;
    int32_t out, lo, hi;
    bool flip;
  };
  for (const Case c : {Case{0, 700, 224, 0, 700, false}, Case{13.5, 300, 224, 10, 320, true},
                       Case{2, 40, 224, 0, 64, false}, Case{0, 700, 31, 0, 700, true},
                       Case{5, 1, 9, 5, 6, false}}) {
    AxisTaps h, v;
    BuildTaps(c.in0, c.len, c.out, c.lo, c.hi, c.flip, h);
    BuildTaps(c.in0 * 0.05, std::min(c.len, 60.0), 17, 0, 64, false, v);
    std::vector<std::vector<uint8_t>> outs;
    for (int level = 0; level <= 2; ++level) {
      const int used = SetResampleIsaForTesting(level);
      std::vector<uint8_t> hout(static_cast<size_t>(64) * c.out * 3 + kRowSlack);
      for (int32_t y = 0; y < 64; ++y) {
        ResampleRowH(rows.data() + static_cast<size_t>(y) * 700 * 3, 0, h,
                     hout.data() + static_cast<size_t>(y) * c.out * 3);
      }
      std::vector<uint8_t> vout(static_cast<size_t>(17) * c.out * 3);
      std::vector<int32_t> acc(static_cast<size_t>(c.out) * 3);
      for (int32_t y = 0; y < 17; ++y) {
        ResampleRowV(hout.data() + static_cast<size_t>(v.in_begin) * c.out * 3, c.out * 3, v, y,
                     acc.data(), vout.data() + static_cast<size_t>(y) * c.out * 3);
      }
      if (used == level) outs.push_back(vout);
    }
    SetResampleIsaForTesting(2);
    // Scalar and SSE2 exist on every x86-64: at least two kernels are really compared.
    REQUIRE(outs.size() >= 2);
    for (size_t i = 1; i < outs.size(); ++i) CHECK(outs[i] == outs[0]);
  }
}

}  // namespace
}  // namespace ringloader::image
