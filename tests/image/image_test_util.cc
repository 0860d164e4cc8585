// SPDX-License-Identifier: Apache-2.0
#include "tests/image/image_test_util.h"

#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace ringloader::image::testing {

std::vector<uint8_t> SmoothPattern(int width, int height) {
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3);
  for (int y = 0; y < height; ++y) {
    for (int x = 0; x < width; ++x) {
      const double u = static_cast<double>(x) / std::max(width, 1);
      const double v = static_cast<double>(y) / std::max(height, 1);
      uint8_t* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
      p[0] =
          static_cast<uint8_t>(std::lround(128 + 90 * std::sin(6.0 * u + 1.0) * std::cos(4.0 * v)));
      p[1] = static_cast<uint8_t>(std::lround(40 + 170 * v));
      p[2] = static_cast<uint8_t>(std::lround(128 + 100 * std::cos(5.0 * (u + v))));
    }
  }
  return rgb;
}

namespace {

struct Taps {
  int first = 0;
  std::vector<double> w;
};

std::vector<Taps> AxisTaps(double in0, double len, int out, int lo, int hi) {
  const double scale = len / out;
  const double fs = std::max(scale, 1.0);
  std::vector<Taps> taps(out);
  for (int i = 0; i < out; ++i) {
    const double center = in0 + (i + 0.5) * scale;
    const int a = std::max(lo, static_cast<int>(std::floor(center - fs)));
    const int b = std::min(hi, static_cast<int>(std::ceil(center + fs)) + 1);
    double total = 0;
    for (int x = a; x < b; ++x) {
      const double t = std::abs((x + 0.5 - center) / fs);
      const double w = t < 1 ? 1 - t : 0;
      taps[i].w.push_back(w);
      total += w;
    }
    taps[i].first = a;
    if (total <= 0) {  // nearest
      taps[i].first = std::clamp(static_cast<int>(std::floor(center)), lo, hi - 1);
      taps[i].w.assign(1, 1.0);
      total = 1;
    }
    for (double& w : taps[i].w) w /= total;
  }
  return taps;
}

}  // namespace

std::vector<double> ReferenceResample(const std::vector<uint8_t>& rgb, int width, int height,
                                      const CropRect& crop, int clamp_x0, int clamp_y0,
                                      int clamp_x1, int clamp_y1, int size, bool flip) {
  (void)height;
  const std::vector<Taps> tx = AxisTaps(crop.x, crop.width, size, clamp_x0, clamp_x1);
  const std::vector<Taps> ty = AxisTaps(crop.y, crop.height, size, clamp_y0, clamp_y1);
  std::vector<double> out(static_cast<size_t>(size) * size * 3, 0.0);
  for (int oy = 0; oy < size; ++oy) {
    for (int ox = 0; ox < size; ++ox) {
      const Taps& hx = tx[flip ? size - 1 - ox : ox];
      const Taps& vy = ty[oy];
      for (int c = 0; c < 3; ++c) {
        double acc = 0;
        for (size_t j = 0; j < vy.w.size(); ++j) {
          const size_t row = static_cast<size_t>(vy.first + static_cast<int>(j)) * width;
          for (size_t i = 0; i < hx.w.size(); ++i) {
            acc += vy.w[j] * hx.w[i] *
                   rgb[(row + static_cast<size_t>(hx.first + static_cast<int>(i))) * 3 + c];
          }
        }
        out[(static_cast<size_t>(oy) * size + ox) * 3 + c] = acc;
      }
    }
  }
  return out;
}

double Psnr(const std::vector<uint8_t>& got, const std::vector<double>& want) {
  double se = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = got[i] - want[i];
    se += d * d;
  }
  const double mse = se / static_cast<double>(got.size());
  if (mse <= 1e-12) return 100.0;
  return 10.0 * std::log10(255.0 * 255.0 / mse);
}

std::vector<uint8_t> EncodeJpeg(const std::vector<uint8_t>& rgb, int width, int height, int quality,
                                int subsamp, bool progressive) {
  tjhandle h = tjInitCompress();
  if (h == nullptr) std::abort();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  if (tjCompress2(h, rgb.data(), width, 0, height, TJPF_RGB, &buf, &size, subsamp, quality,
                  progressive ? TJFLAG_PROGRESSIVE : 0) != 0) {
    std::abort();
  }
  std::vector<uint8_t> out(buf, buf + size);
  tjFree(buf);
  tjDestroy(h);
  return out;
}

long FindMarker(const std::vector<uint8_t>& jpeg, uint8_t marker) {
  for (size_t i = 0; i + 1 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] == marker) return static_cast<long>(i);
  }
  return -1;
}

}  // namespace ringloader::image::testing
