// SPDX-License-Identifier: Apache-2.0
#include "server/image/synthetic.h"

#include <turbojpeg.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/image/transform.h"

namespace ringloader::image {
namespace {

struct TjCloser {
  void operator()(void* handle) const { tjDestroy(handle); }
};
using TjHandle = std::unique_ptr<void, TjCloser>;

struct TjBufferFree {
  void operator()(unsigned char* buffer) const { tjFree(buffer); }
};

absl::StatusOr<std::vector<uint8_t>> Compress(tjhandle handle, const uint8_t* pixels, int width,
                                              int height, int pixel_format, int subsamp,
                                              int quality, int flags) {
  unsigned char* jpeg = nullptr;
  unsigned long jpeg_size = 0;
  const int rc = tjCompress2(handle, pixels, width, 0, height, pixel_format, &jpeg, &jpeg_size,
                             subsamp, quality, flags);
  std::unique_ptr<unsigned char, TjBufferFree> owned(jpeg);
  if (rc != 0) {
    return absl::InternalError(absl::StrCat("tjCompress2: ", tjGetErrorStr2(handle)));
  }
  return std::vector<uint8_t>(jpeg, jpeg + jpeg_size);
}

// Photo-like content: a smooth two-axis colour gradient, separable textures at a coarse and a
// fine scale, a few soft-edged ellipses ("objects") and per-pixel noise, so JPEG sizes and decode
// times are in the range of real photos. Cheap per pixel (tables per row and column, inner loops
// over contiguous floats), so thousands of images take seconds.
std::vector<uint8_t> MakePixels(const SyntheticImageOptions& o) {
  SampleRng rng(o.seed, 0x5359'4E54ull /* "SYNT" */, 0);
  auto uni = [&](float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(rng.NextUniform());
  };
  const int w = o.width, h = o.height;
  const float fw = static_cast<float>(w), fh = static_cast<float>(h);
  std::array<float, 3> base{}, gx{}, gy{}, tex{}, fine{};
  for (int c = 0; c < 3; ++c) {
    base[c] = uni(40, 200);
    gx[c] = uni(-90, 90) / fw;
    gy[c] = uni(-90, 90) / fh;
    tex[c] = uni(5, 35);
    fine[c] = uni(4, 14);
  }
  constexpr float kTwoPi = 6.2831853f;
  const float fx1 = uni(2, 12) * kTwoPi / fw, px1 = uni(0, kTwoPi);
  const float fy1 = uni(2, 12) * kTwoPi / fh, py1 = uni(0, kTwoPi);
  const float fx2 = uni(40, 120) * kTwoPi / fw, fy2 = uni(40, 120) * kTwoPi / fh;
  // Per-column tables in pixel-interleaved layout (index x * 3 + c), so each row is a few
  // contiguous multiply-adds that vectorise.
  const size_t row_len = static_cast<size_t>(w) * 3;
  std::vector<float> col(row_len), col_gy(row_len), col_tex(row_len), col_fine(row_len);
  for (int x = 0; x < w; ++x) {
    const float fx = static_cast<float>(x);
    const float sx = std::sin(fx1 * fx + px1), sx2 = std::sin(fx2 * fx);
    for (int c = 0; c < 3; ++c) {
      const size_t i = static_cast<size_t>(x) * 3 + c;
      col[i] = base[c] + gx[c] * fx;
      col_gy[i] = gy[c];
      col_tex[i] = tex[c] * sx;
      col_fine[i] = fine[c] * sx2;
    }
  }
  struct Blob {
    float cx, cy, rx, ry;
    std::array<float, 3> color;
  };
  std::array<Blob, 5> blobs{};
  for (Blob& b : blobs) {
    b.cx = uni(0, fw);
    b.cy = uni(0, fh);
    b.rx = uni(0.05f, 0.3f) * fw;
    b.ry = uni(0.05f, 0.3f) * fh;
    for (float& c : b.color) c = uni(-80, 80);
  }
  // Noise: a table of 8192 values in [-9.6, 9) read from a random offset on each row.
  constexpr size_t kNoise = 8192;
  std::vector<float> noise(kNoise + row_len);
  uint64_t state = rng.NextU64() | 1;
  for (float& n : noise) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    n = static_cast<float>(static_cast<int>(state & 31) - 16) * 0.6f;
  }
  std::vector<float> v(row_len);
  std::vector<uint8_t> rgb(row_len * h);
  for (int y = 0; y < h; ++y) {
    const float fy = static_cast<float>(y);
    const float sy = std::sin(fy1 * fy + py1), sy2 = std::sin(fy2 * fy);
    const float* __restrict nz = noise.data() + (rng.NextU64() % kNoise);
    const float* __restrict c0 = col.data();
    const float* __restrict c1 = col_gy.data();
    const float* __restrict c2 = col_tex.data();
    const float* __restrict c3 = col_fine.data();
    float* __restrict vr = v.data();
    for (size_t i = 0; i < row_len; ++i) {
      vr[i] = c0[i] + c1[i] * fy + c2[i] * sy + c3[i] * sy2 + nz[i];
    }
    for (const Blob& b : blobs) {  // only the ellipse's span on this row
      const float dy = (fy - b.cy) / b.ry;
      if (dy * dy >= 1.0f) continue;
      const float half = b.rx * std::sqrt(1.0f - dy * dy);
      const int x0 = std::max(0, static_cast<int>(b.cx - half));
      const int x1 = std::min(w, static_cast<int>(b.cx + half) + 1);
      for (int x = x0; x < x1; ++x) {
        const float dx = (static_cast<float>(x) - b.cx) / b.rx;
        const float a = std::min(1.0f, (1.0f - dx * dx - dy * dy) * 8.0f);  // soft edge
        if (a <= 0) continue;
        for (int c = 0; c < 3; ++c) v[static_cast<size_t>(x) * 3 + c] += a * b.color[c];
      }
    }
    uint8_t* __restrict row = rgb.data() + static_cast<size_t>(y) * row_len;
    for (size_t i = 0; i < row_len; ++i) {
      const float c = vr[i] < 0.0f ? 0.0f : (vr[i] > 255.0f ? 255.0f : vr[i]);
      row[i] = static_cast<uint8_t>(static_cast<int32_t>(c));
    }
  }
  return rgb;
}

absl::StatusOr<std::vector<uint8_t>> MakeWithHandle(tjhandle handle,
                                                    const SyntheticImageOptions& o) {
  if (o.width <= 0 || o.height <= 0 || o.quality < 1 || o.quality > 100) {
    return absl::InvalidArgumentError(absl::StrCat("synthetic image: bad options ", o.width, "x",
                                                   o.height, " quality ", o.quality));
  }
  std::vector<uint8_t> rgb = MakePixels(o);
  const int flags = o.progressive ? TJFLAG_PROGRESSIVE : 0;
  const size_t pixels = static_cast<size_t>(o.width) * o.height;
  if (o.grayscale) {
    std::vector<uint8_t> gray(pixels);
    for (size_t i = 0; i < pixels; ++i) {
      gray[i] = static_cast<uint8_t>(
          (77 * rgb[3 * i] + 150 * rgb[3 * i + 1] + 29 * rgb[3 * i + 2] + 128) >> 8);
    }
    return Compress(handle, gray.data(), o.width, o.height, TJPF_GRAY, TJSAMP_GRAY, o.quality,
                    flags);
  }
  if (o.cmyk) {
    // Adobe-inverted CMYK (what TurboJPEG writes, with an Adobe marker): 255 = no ink, so
    // stored C = R / K' etc. with K' = max(R, G, B).
    std::vector<uint8_t> cmyk(pixels * 4);
    for (size_t i = 0; i < pixels; ++i) {
      const int r = rgb[3 * i], g = rgb[3 * i + 1], b = rgb[3 * i + 2];
      const int k = std::max({r, g, b, 1});
      cmyk[4 * i + 0] = static_cast<uint8_t>((r * 255 + k / 2) / k);
      cmyk[4 * i + 1] = static_cast<uint8_t>((g * 255 + k / 2) / k);
      cmyk[4 * i + 2] = static_cast<uint8_t>((b * 255 + k / 2) / k);
      cmyk[4 * i + 3] = static_cast<uint8_t>(k);
    }
    return Compress(handle, cmyk.data(), o.width, o.height, TJPF_CMYK, TJSAMP_444, o.quality,
                    flags);
  }
  return Compress(handle, rgb.data(), o.width, o.height, TJPF_RGB, TJSAMP_420, o.quality, flags);
}

}  // namespace

absl::StatusOr<std::vector<uint8_t>> MakeSyntheticJpeg(const SyntheticImageOptions& options) {
  TjHandle handle(tjInitCompress());
  if (!handle) return absl::InternalError("tjInitCompress failed");
  return MakeWithHandle(handle.get(), options);
}

absl::StatusOr<std::vector<uint8_t>> EncodeRgbJpeg(const std::vector<uint8_t>& rgb, int width,
                                                   int height, int quality) {
  if (width <= 0 || height <= 0 || rgb.size() != static_cast<size_t>(width) * height * 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EncodeRgbJpeg: ", rgb.size(), " bytes do not hold ", width, "x", height, " RGB pixels"));
  }
  TjHandle handle(tjInitCompress());
  if (!handle) return absl::InternalError("tjInitCompress failed");
  return Compress(handle.get(), rgb.data(), width, height, TJPF_RGB, TJSAMP_444, quality, 0);
}

absl::StatusOr<uint32_t> WriteSyntheticDataset(const SyntheticDatasetOptions& options) {
  if (options.out_dir.empty() || options.classes == 0) {
    return absl::InvalidArgumentError("synthetic dataset: out_dir and classes must be set");
  }
  TjHandle handle(tjInitCompress());
  if (!handle) return absl::InternalError("tjInitCompress failed");
  namespace fs = std::filesystem;
  const int digits = std::max(2, static_cast<int>(std::to_string(options.classes - 1).size()));
  std::vector<std::string> class_dirs;
  for (uint32_t c = 0; c < options.classes; ++c) {
    class_dirs.push_back(absl::StrFormat("%s/class_%0*u", options.out_dir, digits, c));
    std::error_code ec;
    fs::create_directories(class_dirs.back(), ec);
    if (ec) {
      return absl::InternalError(absl::StrCat(class_dirs.back(), ": ", ec.message()));
    }
  }
  for (uint32_t i = 0; i < options.count; ++i) {
    SampleRng rng(options.seed, 0x4441'5441ull /* "DATA" */, i);
    SyntheticImageOptions o;
    o.seed = rng.NextU64();
    const double kind = rng.NextUniform();
    if (kind < options.large_fraction) {  // large, above 2 MP
      o.width = 1800 + static_cast<int32_t>(rng.NextUniform() * 800);
      o.height = 1200 + static_cast<int32_t>(rng.NextUniform() * 600);
    } else {
      o.width = 400 + static_cast<int32_t>(rng.NextUniform() * 240);
      o.height = static_cast<int32_t>(o.width * (0.62 + 0.2 * rng.NextUniform()));
    }
    if (rng.NextUniform() < 0.2) std::swap(o.width, o.height);  // portrait
    o.quality = 75 + static_cast<int>(rng.NextUniform() * 21);
    o.grayscale = rng.NextUniform() < 0.03;
    o.progressive = rng.NextUniform() < options.progressive_fraction;
    // A fresh compressor after a progressive image: libjpeg-turbo 2.1.5's TurboJPEG writes
    // corrupt baseline files ("bad Huffman code") from a handle that last compressed a
    // progressive one.
    if (o.progressive) handle.reset(tjInitCompress());
    if (!handle) return absl::InternalError("tjInitCompress failed");
    absl::StatusOr<std::vector<uint8_t>> jpeg = MakeWithHandle(handle.get(), o);
    if (o.progressive) handle.reset(tjInitCompress());
    if (!jpeg.ok()) return jpeg.status();
    const std::string path = absl::StrFormat("%s/img_%06u.jpg", class_dirs[i % options.classes], i);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return absl::InternalError(absl::StrCat(path, ": cannot create"));
    const size_t written = std::fwrite(jpeg->data(), 1, jpeg->size(), f);
    const bool closed = std::fclose(f) == 0;
    if (written != jpeg->size() || !closed) {
      return absl::InternalError(absl::StrCat(path, ": short write"));
    }
  }
  return options.count;
}

}  // namespace ringloader::image
