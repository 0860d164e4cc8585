// SPDX-License-Identifier: Apache-2.0
#include "server/image/sample_decoder.h"

#include <algorithm>
#include <cerrno>
#include <array>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "server/image/image_format.h"
#include "server/image/jpeg_decompressor.h"
#include "server/image/raster_codec.h"
#include "server/image/resample.h"
#include "shm/base/text.h"

// One sample goes header -> plan -> decode -> transform:
//   header     ReadHeader: the JPEG header, checked against DecodeLimits before any allocation;
//   plan       PlanSource: the source box (train crop or eval resize), the flip, the DCT scale;
//   decode     DecodeRows: only the rows and columns the filter reads, each resampled
//              horizontally as it arrives (CMYK converted first);
//   transform  WriteSample: the vertical pass, then dtype and layout, into the batch.
// libjpeg's jumps stay inside JpegDecompressor; everything here is ordinary C++.
// The other formats (raster_codec.h) go header -> plan -> DecodeRaster (the whole image as RGB,
// then the same horizontal pass over the rows the filter reads) -> WriteSample. The format is
// told by the file's first bytes, once per call.

namespace ringloader::image {
namespace {

constexpr char kReasonPayload[] = "ringloader.reason";
constexpr uint32_t kMaxImageSize = 16384;  // output side bound (a caller's mistake)
constexpr int32_t kBatchRows = 16;         // scanlines per ReadScanlines (one iMCU row)

using base::Sv;

// The JPEG path's errors read like the other formats' (raster_codec.h).
absl::Status DataError(std::string_view path, std::string_view reason, std::string_view detail) {
  return ImageDataError(path, reason, detail);
}

absl::Status JpegError(std::string_view path, const JpegFailure& failure) {
  return DataError(path, failure.reason, failure.message);
}

absl::Status OutOfMemory(std::string_view path, std::string_view reason) {
  return WithReason(absl::ResourceExhaustedError(absl::StrCat(Sv(path), ": out of memory")),
                    reason);
}

inline uint8_t Div255(uint32_t x) {
  return static_cast<uint8_t>((x + 128 + ((x + 128) >> 8)) >> 8);
}

// CMYK (as libjpeg returns it, YCCK already converted) to RGB. Adobe (Photoshop) files store
// inverted CMYK, where 255 means no ink, so R = C * K / 255; plain CMYK inverts first.
void CmykToRgb(const uint8_t* src, int32_t pixels, bool adobe_inverted, uint8_t* dst) {
  const uint32_t flip = adobe_inverted ? 0 : 255;
  for (int32_t i = 0; i < pixels; ++i) {
    const uint32_t c = src[4 * i + 0] ^ flip, m = src[4 * i + 1] ^ flip;
    const uint32_t y = src[4 * i + 2] ^ flip, k = src[4 * i + 3] ^ flip;
    dst[3 * i + 0] = Div255(c * k);
    dst[3 * i + 1] = Div255(m * k);
    dst[3 * i + 2] = Div255(y * k);
  }
}


int32_t FloorDiv(double v, int32_t d) { return static_cast<int32_t>(std::floor(v / d)); }
int32_t CeilDiv(double v, int32_t d) { return static_cast<int32_t>(std::ceil(v / d)); }

}  // namespace

std::string_view ErrorReason(const absl::Status& status) {
  const auto payload = status.GetPayload(kReasonPayload);
  if (!payload.has_value()) return "other";
  const std::string text(*payload);
  for (std::string_view known : kErrorReasons) {
    if (known == text) return known;
  }
  return "other";
}

absl::Status WithReason(absl::Status status, std::string_view reason) {
  if (!status.ok()) status.SetPayload(kReasonPayload, absl::Cord(Sv(reason)));
  return status;
}

namespace {
constexpr char kTransientPayload[] = "ringloader.transient";
}  // namespace

bool IsTransientErrno(int err) {
  switch (err) {
    case EIO:
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case EAGAIN:
    case ESTALE:
    case ETIMEDOUT:
    case ENOBUFS:
      return true;
    default:
      return false;
  }
}

absl::Status MarkTransient(absl::Status status) {
  if (!status.ok()) status.SetPayload(kTransientPayload, absl::Cord("1"));
  return status;
}

absl::Status MarkTransientErrno(absl::Status status, int err) {
  if (!IsTransientErrno(err) || status.ok()) return status;
  const bool storage = err == EIO || err == ESTALE || err == ETIMEDOUT;
  status.SetPayload(kTransientPayload, absl::Cord(storage ? "storage" : "1"));
  return status;
}

bool IsTransient(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kTransientPayload).has_value();
}

bool IsStorageFailure(const absl::Status& status) {
  if (status.ok()) return false;
  const auto payload = status.GetPayload(kTransientPayload);
  return payload.has_value() && *payload == "storage";
}

namespace {

// The decoder's own buffers, reused across samples (sizes bounded by max_pixels and image_size).
struct Scratch {
  std::vector<uint8_t> row;      // kBatchRows scanlines as libjpeg writes them (3 or 4 components)
  std::vector<uint8_t> rgb_row;  // one scanline converted from CMYK
  std::vector<uint8_t> hrows;    // horizontal pass output, one row per needed source row
  std::vector<uint8_t> out_row;
  std::vector<int32_t> acc;
  std::vector<float> float_row;
  std::vector<uint8_t> raster;   // a non-JPEG image decoded whole, as RGB
  AxisTaps htaps, vtaps;
  std::array<std::array<float, 256>, 3> lut{};
  std::array<float, 3> lut_mean{}, lut_std{};
  bool lut_valid = false;


  // A failed decode: gives back what the image grew, then libjpeg's failure as the sample's error.
  absl::Status Fail(const JpegDecompressor& jpeg, std::string_view path) {
    ReleaseBigScratch();
    return JpegError(path, jpeg.failure());
  }

  // Scratch is reused across samples, but what one huge image grew is given back, so a decode
  // thread keeps at most kKeepScratchBytes between samples (the memory budget counts a sample's
  // scratch only while it decodes).
  static constexpr size_t kKeepScratchBytes = 1 << 20;
  void ReleaseBigScratch() {
    const size_t held = row.capacity() + rgb_row.capacity() + hrows.capacity() +
                        out_row.capacity() + acc.capacity() * sizeof(int32_t) +
                        float_row.capacity() * sizeof(float) + raster.capacity();
    if (held <= kKeepScratchBytes) return;
    std::vector<uint8_t>().swap(row);
    std::vector<uint8_t>().swap(rgb_row);
    std::vector<uint8_t>().swap(hrows);
    std::vector<uint8_t>().swap(out_row);
    std::vector<int32_t>().swap(acc);
    std::vector<float>().swap(float_row);
    std::vector<uint8_t>().swap(raster);
  }

};

}  // namespace

struct SampleDecoder::State {
  explicit State(const DecodeLimits& limits)
      : jpeg(limits.warnings_are_errors, limits.max_scans) {}
  JpegDecompressor jpeg;
  Scratch scratch;
};

namespace {

// ---- header ----

// Reads the header of `jpeg` and checks it against the limits. On success the decompressor is
// ready to decode; on failure it has been reset.
absl::Status ReadHeader(JpegDecompressor& jpeg, const DecodeLimits& limits,
                        std::span<const uint8_t> bytes, std::string_view path, ImageInfo& info) {
  if (bytes.empty()) return DataError(path, "empty", "file is empty (0 bytes)");
  if (!jpeg.ReadHeader(bytes)) return JpegError(path, jpeg.failure());
  const jpeg_decompress_struct& h = jpeg.info();
  info.width = static_cast<int32_t>(h.image_width);
  info.height = static_cast<int32_t>(h.image_height);
  info.components = h.num_components;
  info.progressive = h.progressive_mode != 0;
  absl::Status status;
  const uint64_t pixels = uint64_t{h.image_width} * h.image_height;
  if (info.width <= 0 || info.height <= 0) {
    status = DataError(path, "corrupt",
                       absl::StrCat("image has zero size ", info.width, "x", info.height));
  } else if (pixels > limits.max_pixels) {
    status = DataError(path, "too_large",
                       absl::StrCat("image is ", info.width, "x", info.height, " = ", pixels,
                                    " pixels, above max_pixels ", limits.max_pixels));
  } else if (h.data_precision != 8) {
    status = DataError(path, "unsupported",
                       absl::StrCat(h.data_precision, "-bit JPEG data is not supported"));
  } else if (h.num_components != 1 && h.num_components != 3 && h.num_components != 4) {
    status = DataError(path, "unsupported",
                       absl::StrCat(h.num_components, "-component JPEGs are not supported"));
  }
  if (!status.ok()) jpeg.Abort();
  return status;
}

// 4-component files (CMYK, YCCK) come out of libjpeg as CMYK and are converted by CmykToRgb;
// everything else as RGB. Returns whether the output is CMYK.
bool SetOutColor(JpegDecompressor& jpeg) {
  const J_COLOR_SPACE in = jpeg.info().jpeg_color_space;
  const bool four = in == JCS_CMYK || in == JCS_YCCK;
  jpeg.set_out_color_space(four ? JCS_CMYK : JCS_RGB);
  return four;
}

// libjpeg's allocations besides the coefficient buffers: per-row sample and upsampling buffers
// (generously, 128 bytes per column and component) and a fixed part for tables and state.
constexpr uint64_t kLibjpegFixedBytes = 4 << 20;
constexpr uint64_t kLibjpegBytesPerColumnComponent = 128;
// Largest image side JPEG allows.
constexpr uint64_t kMaxJpegSide = 65535;

DecodePlan PlanFor(uint64_t width, uint64_t height, uint64_t components, uint64_t coef_bytes,
                   uint32_t image_size) {
  DecodePlan plan;
  plan.libjpeg_bytes =
      coef_bytes + width * components * kLibjpegBytesPerColumnComponent + kLibjpegFixedBytes;
  // State::row (kBatchRows rows of up to 4 components), rgb_row, and hrows: one output-width row
  // per source row the vertical filter reads (at most the image's height).
  plan.scratch_bytes = width * 4 * kBatchRows + width * 3 + height * image_size * 3 + (64 << 10);
  return plan;
}

// ---- other formats: header ----

// What a non-JPEG file is, checked against the limits like a JPEG header. Unknown content and
// TIFF fail here, as does anything the format's header reader refuses.
absl::StatusOr<RasterInfo> ReadRasterHeader(ImageFormat format, const DecodeLimits& limits,
                                            std::span<const uint8_t> bytes,
                                            std::string_view path, ImageInfo& info) {
  if (bytes.empty()) return DataError(path, "empty", "file is empty (0 bytes)");
  const RasterCodec* codec = RasterCodecFor(format);
  if (codec == nullptr) {
    if (format == ImageFormat::kTiff) {
      return DataError(path, "unsupported",
                       "TIFF images are not decoded (no TIFF decoder is built in; convert them, "
                       "e.g. to PNG)");
    }
    return DataError(path, "not_image",
                     "not an image: its first bytes match no JPEG, PNG, WebP, BMP or PPM/PGM "
                     "signature");
  }
  absl::StatusOr<RasterInfo> raster = codec->read_header(bytes, path);
  if (!raster.ok()) return raster.status();
  info.width = raster->width;
  info.height = raster->height;
  info.components = raster->channels;
  info.progressive = false;
  const uint64_t pixels = uint64_t(std::max(0, raster->width)) * uint64_t(std::max(0, raster->height));
  if (raster->width <= 0 || raster->height <= 0) {
    return DataError(path, "corrupt",
                     absl::StrCat("image has zero size ", raster->width, "x", raster->height));
  }
  if (pixels > limits.max_pixels) {
    return DataError(path, "too_large",
                     absl::StrCat("image is ", raster->width, "x", raster->height, " = ", pixels,
                                  " pixels, above max_pixels ", limits.max_pixels));
  }
  return raster;
}

// The image as RGB (at most all of it), the library's own work space, and the filter's rows.
DecodePlan RasterPlan(const RasterInfo& raster, uint32_t image_size) {
  DecodePlan plan;
  plan.scratch_bytes = uint64_t(raster.width) * uint64_t(raster.height) * 3 + raster.work_bytes +
                       uint64_t(raster.height) * image_size * 3 + (64 << 10);
  return plan;
}

// ---- plan ----

// Which source pixels make the sample, before any pixel is decoded.
struct SourcePlan {
  CropRect box;                   // the source box the output resamples (fractional pixels)
  int32_t x0 = 0, y0 = 0;         // the window the filter may read: [x0, x1) x [y0, y1)
  int32_t x1 = 0, y1 = 0;
  bool flip = false;
  int32_t denom = 1;              // DCT scaling 1/denom
};

// `dct_scaling`: JPEG only (libjpeg decodes at 1/2, 1/4, 1/8 for free).
SourcePlan PlanSource(const ImageInfo& info, const TransformSpec& spec, SampleRng& rng,
                      bool dct_scaling) {
  SourcePlan plan;
  plan.x1 = info.width;
  plan.y1 = info.height;
  if (spec.augment == Augment::kTrain) {
    // torchvision crops, then resizes: the filter sees only the crop.
    const CropBox box = DrawTrainCrop(info.width, info.height, rng);
    plan.box = CropRect{static_cast<double>(box.x), static_cast<double>(box.y),
                        static_cast<double>(box.width), static_cast<double>(box.height)};
    plan.x0 = box.x;
    plan.y0 = box.y;
    plan.x1 = box.x + box.width;
    plan.y1 = box.y + box.height;
    plan.flip = box.flip;
  } else {
    // torchvision resizes the whole image, then crops: the filter may read outside the box.
    plan.box = EvalCropExact(info.width, info.height, spec.image_size);
  }
  // The largest power-of-two DCT reduction that keeps the scaled box >= the output in both axes.
  const auto size = static_cast<int32_t>(spec.image_size);
  while (dct_scaling && !spec.exact_resize && plan.denom < 8 && plan.box.width / (plan.denom * 2) >= size &&
         plan.box.height / (plan.denom * 2) >= size) {
    plan.denom *= 2;
  }
  return plan;
}

}  // namespace

SampleDecoder::SampleDecoder(DecodeLimits limits)
    : state_(std::make_unique<State>(limits)), limits_(limits) {}

void SampleDecoder::set_limits(const DecodeLimits& limits) {
  limits_ = limits;
  state_->jpeg.set_warnings_are_errors(limits.warnings_are_errors);
  state_->jpeg.set_max_scans(limits.max_scans);
}

SampleDecoder::~SampleDecoder() = default;

void SampleDecoder::set_deadline(std::chrono::steady_clock::time_point deadline) {
  state_->jpeg.set_deadline_ns(
      deadline == std::chrono::steady_clock::time_point::max()
          ? INT64_MAX
          : std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch())
                .count());
}

absl::StatusOr<DecodePlan> SampleDecoder::PlanFromHeader(std::span<const uint8_t> head,
                                                         std::string_view path,
                                                         const DecodeLimits& limits,
                                                         const TransformSpec& spec) try {
  ImageInfo info;
  if (const ImageFormat format = SniffFormat(head);
      format != ImageFormat::kJpeg && !head.empty()) {
    absl::StatusOr<RasterInfo> raster = ReadRasterHeader(format, limits, head, path, info);
    if (!raster.ok()) return raster.status();
    return RasterPlan(*raster, spec.image_size);
  }
  // A header cut off by the end of `head` must say "truncated" (the caller's cue), whatever the
  // dataset's warnings setting.
  JpegDecompressor jpeg(/*warnings_are_errors=*/true, limits.max_scans);
  if (absl::Status s = ReadHeader(jpeg, limits, head, path, info); !s.ok()) return s;
  bool multiple_scans = false;
  if (!jpeg.HasMultipleScans(&multiple_scans)) return JpegError(path, jpeg.failure());
  const jpeg_decompress_struct& h = jpeg.info();
  uint64_t coef_bytes = 0;
  if (h.progressive_mode || multiple_scans) {
    // Whole-image coefficient arrays (jdcoefct.c): one 64-coefficient block of 2-byte values per
    // 8x8 block of each component, rounded up to the sampling factors.
    for (int c = 0; c < h.num_components; ++c) {
      const jpeg_component_info& comp = h.comp_info[c];
      const auto round_up = [](uint64_t v, uint64_t m) { return (v + m - 1) / m * m; };
      coef_bytes += round_up(comp.width_in_blocks, comp.h_samp_factor) *
                    round_up(comp.height_in_blocks, comp.v_samp_factor) * sizeof(JBLOCK);
    }
  }
  jpeg.Abort();
  return PlanFor(static_cast<uint64_t>(info.width), static_cast<uint64_t>(info.height),
                 static_cast<uint64_t>(info.components), coef_bytes, spec.image_size);
} catch (const std::bad_alloc&) {
  return OutOfMemory(path, "other");
}

DecodePlan SampleDecoder::WorstCasePlan(const DecodeLimits& limits, const TransformSpec& spec) {
  // 4 components, every one at full resolution, multi-scan; the widest and tallest sides JPEG has.
  DecodePlan jpeg = PlanFor(kMaxJpegSide, kMaxJpegSide, 4, limits.max_pixels * 4 * 2, spec.image_size);
  // Any other format: the largest image the limits admit, decoded whole through 16-bit RGBA.
  RasterInfo raster;
  raster.width = static_cast<int32_t>(std::min<uint64_t>(limits.max_pixels, INT32_MAX));
  raster.height = 1;
  raster.work_bytes = limits.max_pixels * 8 + (17 << 20);
  DecodePlan other = RasterPlan(raster, spec.image_size);
  other.scratch_bytes += kMaxJpegSide * spec.image_size * 3;  // the filter's rows, at most
  return other.bytes() > jpeg.bytes() ? other : jpeg;
}

absl::StatusOr<ImageInfo> SampleDecoder::ReadInfo(std::span<const uint8_t> jpeg,
                                                  std::string_view path) {
  ImageInfo info;
  if (const ImageFormat format = SniffFormat(jpeg);
      format != ImageFormat::kJpeg && !jpeg.empty()) {
    absl::StatusOr<RasterInfo> raster = ReadRasterHeader(format, limits_, jpeg, path, info);
    if (!raster.ok()) return raster.status();
    return info;
  }
  if (absl::Status s = ReadHeader(state_->jpeg, limits_, jpeg, path, info); !s.ok()) return s;
  state_->jpeg.Abort();
  return info;
}

absl::StatusOr<std::vector<uint8_t>> SampleDecoder::DecodeRgb(std::span<const uint8_t> bytes,
                                                              std::string_view path,
                                                              ImageInfo* info_out) try {
  JpegDecompressor& jpeg = state_->jpeg;
  Scratch& st = state_->scratch;
  ImageInfo info;
  if (const ImageFormat format = SniffFormat(bytes);
      format != ImageFormat::kJpeg && !bytes.empty()) {
    absl::StatusOr<RasterInfo> raster = ReadRasterHeader(format, limits_, bytes, path, info);
    if (!raster.ok()) return raster.status();
    if (info_out != nullptr) *info_out = info;
    std::vector<uint8_t> rgb(size_t(info.width) * size_t(info.height) * 3);
    if (absl::Status s = RasterCodecFor(format)->decode_box(bytes, path, *raster,
                                                             RasterBox::Whole(*raster), rgb);
        !s.ok()) {
      return s;
    }
    return rgb;
  }
  if (absl::Status s = ReadHeader(jpeg, limits_, bytes, path, info); !s.ok()) return s;
  if (info_out != nullptr) *info_out = info;
  const bool cmyk = SetOutColor(jpeg);
  const size_t width = static_cast<size_t>(info.width);
  std::vector<uint8_t> rgb(width * static_cast<size_t>(info.height) * 3);
  st.row.resize(width * 4);
  JDIMENSION xoff = 0, xwidth = static_cast<JDIMENSION>(width);
  if (!jpeg.Start(&xoff, &xwidth, 0)) return st.Fail(jpeg, path);
  while (jpeg.info().output_scanline < jpeg.info().output_height) {
    uint8_t* dst = rgb.data() + size_t{jpeg.info().output_scanline} * width * 3;
    JSAMPROW row = cmyk ? st.row.data() : dst;
    JDIMENSION got = 0;
    if (!jpeg.ReadScanlines(&row, 1, &got)) return st.Fail(jpeg, path);
    if (cmyk && got == 1) {
      CmykToRgb(st.row.data(), static_cast<int32_t>(width), jpeg.info().saw_Adobe_marker, dst);
    }
  }
  if (!jpeg.Finish()) return st.Fail(jpeg, path);
  return rgb;
} catch (const std::bad_alloc&) {
  state_->jpeg.Abort();
  return OutOfMemory(path, "other");
}

namespace {

// ---- decode ----

// The two filters for an image of sw x sh pixels (at 1/plan.denom), and room in st.hrows for
// every source row the vertical one reads.
void BuildFilters(Scratch& st, const SourcePlan& plan, int32_t sw, int32_t sh, int32_t size) {
  // The window in scaled coordinates: scaled pixel j covers source pixels [j*d, (j+1)*d).
  const int32_t d = plan.denom;
  const int32_t cx0 = std::clamp(FloorDiv(plan.x0, d), 0, sw - 1);
  const int32_t cx1 = std::clamp(CeilDiv(plan.x1, d), cx0 + 1, sw);
  const int32_t cy0 = std::clamp(FloorDiv(plan.y0, d), 0, sh - 1);
  const int32_t cy1 = std::clamp(CeilDiv(plan.y1, d), cy0 + 1, sh);
  BuildTaps(plan.box.x / d, plan.box.width / d, size, cx0, cx1, plan.flip, st.htaps);
  BuildTaps(plan.box.y / d, plan.box.height / d, size, cy0, cy1, false, st.vtaps);
  st.hrows.resize(static_cast<size_t>(st.vtaps.in_end - st.vtaps.in_begin) * size * 3 +
                  kRowSlack);
}

// Decodes, at 1/plan.denom, the rows and columns the filters read (all of them when `partial` is
// off), resampling each row horizontally into st.hrows as it arrives. Sets *refused when libjpeg
// refused the partial decode (crop or skip), after which a full decode is worth a try.
absl::Status DecodeRows(JpegDecompressor& jpeg, Scratch& st, const SourcePlan& plan,
                        int32_t size, bool partial, std::string_view path, DecodeStats& stats,
                        bool* refused) {
  const bool cmyk = SetOutColor(jpeg);
  if (!jpeg.CalcOutputDimensions(static_cast<unsigned>(plan.denom))) return st.Fail(jpeg, path);
  const auto sw = static_cast<int32_t>(jpeg.info().output_width);
  const auto sh = static_cast<int32_t>(jpeg.info().output_height);
  const int32_t d = plan.denom;
  BuildFilters(st, plan, sw, sh, size);
  const int32_t need_x0 = partial ? st.htaps.in_begin : 0;
  const int32_t need_x1 = partial ? st.htaps.in_end : sw;
  const int32_t need_y0 = partial ? st.vtaps.in_begin : 0;
  const int32_t need_y1 = partial ? st.vtaps.in_end : sh;
  const int32_t hrow_bytes = size * 3;
  const int comps = cmyk ? 4 : 3;
  const size_t row_stride = static_cast<size_t>(sw) * comps + kRowSlack;
  st.row.resize(row_stride * kBatchRows);
  if (cmyk) st.rgb_row.resize(static_cast<size_t>(sw) * 3 + kRowSlack);

  JDIMENSION xoff = static_cast<JDIMENSION>(need_x0);
  JDIMENSION xwidth = static_cast<JDIMENSION>(need_x1 - need_x0);
  if (!jpeg.Start(&xoff, &xwidth, static_cast<JDIMENSION>(need_y0))) {
    *refused = partial && jpeg.failure().IsApiRefusal();
    return st.Fail(jpeg, path);
  }
  const auto row_x0 = static_cast<int32_t>(xoff);
  std::array<JSAMPROW, kBatchRows> rows;
  for (int32_t r = 0; r < kBatchRows; ++r) rows[r] = st.row.data() + r * row_stride;
  while (jpeg.info().output_scanline < static_cast<JDIMENSION>(need_y1)) {
    const auto y0 = static_cast<int32_t>(jpeg.info().output_scanline);
    JDIMENSION got = 0;
    if (!jpeg.ReadScanlines(rows.data(), static_cast<JDIMENSION>(std::min(kBatchRows, need_y1 - y0)),
                            &got)) {
      *refused = partial && jpeg.failure().IsApiRefusal();
      return st.Fail(jpeg, path);
    }
    for (int32_t r = 0; r < static_cast<int32_t>(got); ++r) {
      const int32_t y = y0 + r;
      if (y < st.vtaps.in_begin || y >= st.vtaps.in_end) continue;  // full-decode fallback
      const uint8_t* rgb = rows[r];
      if (cmyk) {
        CmykToRgb(rows[r], static_cast<int32_t>(xwidth), jpeg.info().saw_Adobe_marker,
                  st.rgb_row.data());
        rgb = st.rgb_row.data();
      }
      ResampleRowH(rgb, row_x0, st.htaps,
                   st.hrows.data() + static_cast<size_t>(y - st.vtaps.in_begin) * hrow_bytes);
    }
  }
  if (jpeg.info().output_scanline < jpeg.info().output_height) {
    // Stopped early. A single-scan file's remaining data is unread: a cut file is still
    // "truncated", whatever the crop.
    bool eoi_missing = false;
    if (jpeg.warnings_are_errors() && !jpeg.FindEoi(&eoi_missing)) return st.Fail(jpeg, path);
    jpeg.Abort();
    if (eoi_missing) {
      return DataError(path, "truncated", "Premature end of JPEG file (no EOI marker)");
    }
  } else if (!jpeg.Finish()) {
    *refused = partial && jpeg.failure().IsApiRefusal();
    return st.Fail(jpeg, path);
  }
  stats.scale_denom = d;
  stats.scaled_width = sw;
  stats.scaled_height = sh;
  stats.decoded_x = static_cast<int32_t>(xoff);
  stats.decoded_width = static_cast<int32_t>(xwidth);
  stats.decoded_y = need_y0;
  stats.decoded_rows = need_y1 - need_y0;
  return absl::OkStatus();
}

// Decodes a non-JPEG image whole with its codec, then resamples the rows and columns the filters
// read horizontally into st.hrows, as DecodeRows does for a JPEG at scale 1.
absl::Status DecodeRaster(ImageFormat format, const DecodeLimits& limits, Scratch& st,
                          std::span<const uint8_t> bytes, std::string_view path,
                          const TransformSpec& spec, SampleRng& rng, DecodeStats& stats) {
  ImageInfo info;
  absl::StatusOr<RasterInfo> raster = ReadRasterHeader(format, limits, bytes, path, info);
  if (!raster.ok()) return raster.status();
  const SourcePlan plan = PlanSource(info, spec, rng, /*dct_scaling=*/false);
  const auto size = static_cast<int32_t>(spec.image_size);
  BuildFilters(st, plan, info.width, info.height, size);
  // Only the pixels the filters read (from even offsets, as WebP crops).
  const RasterBox box{st.htaps.in_begin & ~1, st.vtaps.in_begin & ~1, st.htaps.in_end,
                      st.vtaps.in_end};
  const size_t row_bytes = static_cast<size_t>(box.width()) * 3;
  st.raster.resize(row_bytes * static_cast<size_t>(box.height()) + kRowSlack);
  if (absl::Status s = RasterCodecFor(format)->decode_box(bytes, path, *raster, box, st.raster);
      !s.ok()) {
    st.ReleaseBigScratch();
    return s;
  }
  const size_t hrow_bytes = static_cast<size_t>(size) * 3;
  for (int32_t y = st.vtaps.in_begin; y < st.vtaps.in_end; ++y) {
    ResampleRowH(st.raster.data() + static_cast<size_t>(y - box.y0) * row_bytes, box.x0,
                 st.htaps,
                 st.hrows.data() + static_cast<size_t>(y - st.vtaps.in_begin) * hrow_bytes);
  }
  stats = DecodeStats{};
  stats.scale_denom = 1;
  stats.scaled_width = info.width;
  stats.scaled_height = info.height;
  stats.decoded_x = box.x0;
  stats.decoded_width = box.width();
  stats.decoded_y = box.y0;
  stats.decoded_rows = box.height();
  return absl::OkStatus();
}

// ---- transform ----

// The vertical pass from st.hrows straight into `out` (through one row for any output other than
// uint8 HWC, which StoreRow converts and places).
void WriteSample(Scratch& st, const TransformSpec& spec, std::span<uint8_t> out) {
  const auto size = static_cast<int32_t>(spec.image_size);
  const int32_t hrow_bytes = size * 3;
  st.acc.resize(static_cast<size_t>(hrow_bytes));
  st.out_row.resize(static_cast<size_t>(hrow_bytes));
  const bool direct = spec.dtype == DType::kUint8 && spec.layout == Layout::kNHWC;
  if (spec.dtype == DType::kFloat32) {
    st.float_row.resize(static_cast<size_t>(hrow_bytes));
    if (!st.lut_valid || st.lut_mean != spec.mean || st.lut_std != spec.std) {
      BuildNormalizeLut(spec, st.lut);
      st.lut_mean = spec.mean;
      st.lut_std = spec.std;
      st.lut_valid = true;
    }
  }
  for (int32_t y = 0; y < size; ++y) {
    uint8_t* dst = direct ? out.data() + static_cast<size_t>(y) * hrow_bytes : st.out_row.data();
    ResampleRowV(st.hrows.data(), hrow_bytes, st.vtaps, y, st.acc.data(), dst);
    if (!direct) StoreRow(dst, y, spec, st.lut, st.float_row.data(), out);
  }
}

}  // namespace

absl::Status SampleDecoder::DecodeInto(std::span<const uint8_t> bytes, std::string_view path,
                                       const TransformSpec& spec, SampleRng& rng,
                                       std::span<uint8_t> out) try {
  if (spec.image_size == 0 || spec.image_size > kMaxImageSize) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(Sv(path), ": image_size must be in [1, ",
                                                kMaxImageSize, "], got ", spec.image_size)),
        "other");
  }
  if (out.size() != spec.SampleBytes()) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(Sv(path), ": output span has ", out.size(),
                                                " bytes, the sample needs ", spec.SampleBytes())),
        "other");
  }
  JpegDecompressor& jpeg = state_->jpeg;
  Scratch& st = state_->scratch;
  if (const ImageFormat format = SniffFormat(bytes);
      format != ImageFormat::kJpeg && !bytes.empty()) {
    DecodeStats stats;
    if (absl::Status s = DecodeRaster(format, limits_, st, bytes, path, spec, rng, stats); !s.ok()) {
      return s;
    }
    WriteSample(st, spec, out);
    last_decode_ = stats;
    st.ReleaseBigScratch();
    return absl::OkStatus();
  }
  ImageInfo info;
  if (absl::Status s = ReadHeader(jpeg, limits_, bytes, path, info); !s.ok()) return s;
  jpeg.set_memory_cap(memory_cap_);
  const SourcePlan plan = PlanSource(info, spec, rng, /*dct_scaling=*/true);
  const auto size = static_cast<int32_t>(spec.image_size);
  DecodeStats stats;
  bool refused = false;
  absl::Status status = DecodeRows(jpeg, st, plan, size, /*partial=*/true, path, stats, &refused);
  if (refused) {  // libjpeg refused the partial decode: read the header again, decode it all
    if (absl::Status s = ReadHeader(jpeg, limits_, bytes, path, info); !s.ok()) return s;
    jpeg.set_memory_cap(memory_cap_);
    status = DecodeRows(jpeg, st, plan, size, /*partial=*/false, path, stats, &refused);
    stats.full_decode_fallback = true;
  }
  if (!status.ok()) return status;
  WriteSample(st, spec, out);
  last_decode_ = stats;
  st.ReleaseBigScratch();
  return absl::OkStatus();
} catch (const std::bad_alloc&) {
  state_->jpeg.Abort();
  return OutOfMemory(path, "other");
}

}  // namespace ringloader::image
