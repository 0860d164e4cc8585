#include "server/image/sample_decoder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <array>
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <new>
#include <utility>

// jpeglib.h needs size_t and FILE declared first.
#include <jerror.h>
#include <jpeglib.h>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "server/image/resample.h"

namespace ringloader::image {
namespace {

constexpr char kReasonPayload[] = "ringloader.reason";
constexpr uint32_t kMaxImageSize = 16384;              // output side bound (a caller's mistake)
constexpr uint64_t kMaxFileBytes = uint64_t{1} << 30;  // ReadFileBytes refuses bigger files
constexpr int32_t kBatchRows = 16;  // scanlines per jpeg_read_scanlines call (one iMCU row)

// Error manager: libjpeg calls error_exit on fatal errors and emit_message(-1) on warnings;
// both longjmp back to the guarded call in State::Guarded. jpeg_error_mgr must stay first.
struct JpegError {
  jpeg_error_mgr pub;
  std::jmp_buf jump;
  bool warnings_are_errors;
  const char* reason;
  int msg_code;
  char message[JMSG_LENGTH_MAX];
};

struct JpegProgress {
  jpeg_progress_mgr pub;  // must stay first
  JpegError* err;
  uint32_t max_scans;
  int64_t deadline_ns;  // steady_clock; INT64_MAX = none
};

int64_t SteadyNowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

const char* ReasonForCode(int code) {
  switch (code) {
    case JERR_NO_SOI:
      return "not_jpeg";
    case JERR_INPUT_EMPTY:
      return "empty";
    case JERR_INPUT_EOF:
      return "truncated";
    case JERR_IMAGE_TOO_BIG:
    case JERR_OUT_OF_MEMORY:
      return "too_large";
    case JERR_ARITH_NOTIMPL:
    case JERR_BAD_PRECISION:
    case JERR_CCIR601_NOTIMPL:
    case JERR_CONVERSION_NOTIMPL:
    case JERR_FRACT_SAMPLE_NOTIMPL:
    case JERR_NOT_COMPILED:
    case JERR_SOF_UNSUPPORTED:
    case JERR_BAD_J_COLORSPACE:
      return "unsupported";
    // API misuse or library limits on crop/skip (see IsApiRefusal): not the data's fault.
    case JERR_BAD_STATE:
    case JERR_BAD_CROP_SPEC:
    case JERR_NOTIMPL:
    case JERR_WIDTH_OVERFLOW:
    case JERR_BAD_BUFFER_MODE:
    case JERR_BAD_LIB_VERSION:
    case JERR_BAD_STRUCT_SIZE:
    case JERR_BAD_POOL_ID:
    case JERR_BAD_VIRTUAL_ACCESS:
    case JERR_VIRTUAL_BUG:
      return "other";
    default:
      return "corrupt";
  }
}

// Errors that mean "libjpeg refused this partial-decode request", after which a full decode is
// worth a try.
bool IsApiRefusal(int code) {
  return code == JERR_BAD_STATE || code == JERR_BAD_CROP_SPEC || code == JERR_NOTIMPL ||
         code == JERR_WIDTH_OVERFLOW || code == JERR_BAD_BUFFER_MODE;
}

[[noreturn]] void OnJpegError(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  err->msg_code = err->pub.msg_code;
  err->reason = ReasonForCode(err->pub.msg_code);
  (*err->pub.format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void OnJpegMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  ++err->pub.num_warnings;
  if (!err->warnings_are_errors) return;
  err->msg_code = err->pub.msg_code;
  err->reason = err->pub.msg_code == JWRN_JPEG_EOF ? "truncated" : "corrupt";
  (*err->pub.format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

void OnJpegProgress(j_common_ptr cinfo) {
  if (!cinfo->is_decompressor) return;
  auto* progress = reinterpret_cast<JpegProgress*>(cinfo->progress);
  const auto* dinfo = reinterpret_cast<j_decompress_ptr>(cinfo);
  if (progress->deadline_ns != INT64_MAX && SteadyNowNs() > progress->deadline_ns) {
    JpegError* err = progress->err;
    err->msg_code = 0;
    err->reason = "deadline_exceeded";
    std::snprintf(err->message, sizeof(err->message),
                  "decoding took longer than server.decode_deadline_ms; abandoned");
    std::longjmp(err->jump, 1);
  }
  if (dinfo->input_scan_number > static_cast<int>(progress->max_scans)) {
    JpegError* err = progress->err;
    err->msg_code = 0;
    err->reason = "too_many_scans";
    std::snprintf(err->message, sizeof(err->message),
                  "Progressive JPEG image has more than %u scans", progress->max_scans);
    std::longjmp(err->jump, 1);
  }
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

// True if the bytes [begin, end) contain an EOI marker (FF D9). Searches from the end, where a
// complete file has it. Entropy-coded data never contains FF D9 (FF is stuffed as FF 00).
bool ContainsEoi(const uint8_t* begin, const uint8_t* end) {
  const uint8_t* limit = end;  // search for FF in [begin, limit - 1)
  while (limit - begin >= 2) {
    const void* hit = memrchr(begin, 0xFF, static_cast<size_t>(limit - 1 - begin));
    if (hit == nullptr) return false;
    const auto* ff = static_cast<const uint8_t*>(hit);
    if (ff[1] == 0xD9) return true;
    limit = ff + 1;
  }
  return false;
}

// Debian's abseil is built in its own-types mode: absl::string_view is not std::string_view.
absl::string_view Av(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status DataError(std::string_view path, std::string_view reason, std::string_view detail) {
  return WithReason(absl::DataLossError(absl::StrCat(Av(path), ": ", Av(reason), ": ", Av(detail))),
                    reason);
}

int32_t FloorDiv(double v, int32_t d) { return static_cast<int32_t>(std::floor(v / d)); }
int32_t CeilDiv(double v, int32_t d) { return static_cast<int32_t>(std::ceil(v / d)); }

}  // namespace

std::string_view ErrorReason(const absl::Status& status) {
  static constexpr std::array<std::string_view, 13> kKnown = {
      "read_error",       "empty",          "not_jpeg",     "too_large",
      "truncated",        "corrupt",        "unsupported",  "too_many_scans",
      "quarantined",      "not_regular_file", "deadline_exceeded", "io_error",
      "other"};
  const auto payload = status.GetPayload(kReasonPayload);
  if (!payload.has_value()) return "other";
  const std::string text(*payload);
  for (std::string_view known : kKnown) {
    if (known == text) return known;
  }
  return "other";
}

absl::Status WithReason(absl::Status status, std::string_view reason) {
  if (!status.ok()) status.SetPayload(kReasonPayload, absl::Cord(Av(reason)));
  return status;
}

struct SampleDecoder::State {
  jpeg_decompress_struct cinfo;
  JpegError err;
  JpegProgress progress;

  // Scratch, reused across samples (sizes bounded by max_pixels and image_size).
  std::vector<uint8_t> row;      // one scanline as libjpeg writes it (3 or 4 components)
  std::vector<uint8_t> rgb_row;  // the scanline converted from CMYK
  std::vector<uint8_t> hrows;    // horizontal pass output, one row per needed source row
  std::vector<uint8_t> out_row;
  std::vector<int32_t> acc;
  std::vector<float> float_row;
  AxisTaps htaps, vtaps;
  std::array<std::array<float, 256>, 3> lut{};
  std::array<float, 3> lut_mean{}, lut_std{};
  bool lut_valid = false;

  State(const DecodeLimits& limits) {
    std::memset(&cinfo, 0, sizeof(cinfo));
    std::memset(&err, 0, sizeof(err));
    std::memset(&progress, 0, sizeof(progress));
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = OnJpegError;
    err.pub.emit_message = OnJpegMessage;
    err.warnings_are_errors = limits.warnings_are_errors;
    progress.pub.progress_monitor = OnJpegProgress;
    progress.err = &err;
    progress.max_scans = limits.max_scans;
    progress.deadline_ns = INT64_MAX;
    Recreate();
  }
  ~State() {
    if (created) jpeg_destroy_decompress(&cinfo);
  }

  // A new decompressor for every file. libjpeg keeps quantization and Huffman tables (DQT/DHT)
  // across images in one decompressor (for abbreviated datastreams), so a file that lacks a
  // table would otherwise decode with the previous file's table on a warm decoder but fail (or
  // use the standard Huffman tables) on a fresh one: a sample's bytes would depend on which
  // file the worker thread decoded before (found by tests/fuzz). Costs a few small allocations.
  void Recreate() {
    if (created) jpeg_destroy_decompress(&cinfo);
    created = false;
    // jpeg_create_decompress only fails on out-of-memory or a library mismatch; it calls
    // error_exit, so it is guarded like everything else.
    if (setjmp(err.jump) == 0) {
      jpeg_create_decompress(&cinfo);
      cinfo.progress = &progress.pub;
      created = true;
    }
  }

  // Runs `fn` (libjpeg calls only: no objects with destructors may live in its frames, since
  // an error longjmps out of them). Returns false on a libjpeg error (details in `err`), after
  // which the decompressor has been reset with jpeg_abort_decompress.
  template <typename Fn>
  bool Guarded(Fn&& fn) {
    err.reason = "other";
    err.msg_code = 0;
    err.message[0] = '\0';
    err.pub.num_warnings = 0;
    if (setjmp(err.jump) != 0) {
      jpeg_abort_decompress(&cinfo);
      return false;
    }
    fn();
    return true;
  }

  absl::Status Error(std::string_view path) {
    ReleaseBigScratch();
    return DataError(path, err.reason, err.message);
  }

  // Scratch is reused across samples, but what one huge image grew is given back, so a decode
  // thread keeps at most kKeepScratchBytes between samples (the memory budget counts a sample's
  // scratch only while it decodes).
  static constexpr size_t kKeepScratchBytes = 1 << 20;
  void ReleaseBigScratch() {
    const size_t held = row.capacity() + rgb_row.capacity() + hrows.capacity() +
                        out_row.capacity() + acc.capacity() * sizeof(int32_t) +
                        float_row.capacity() * sizeof(float);
    if (held <= kKeepScratchBytes) return;
    std::vector<uint8_t>().swap(row);
    std::vector<uint8_t>().swap(rgb_row);
    std::vector<uint8_t>().swap(hrows);
    std::vector<uint8_t>().swap(out_row);
    std::vector<int32_t>().swap(acc);
    std::vector<float>().swap(float_row);
  }

  bool created = false;
};

SampleDecoder::SampleDecoder(DecodeLimits limits)
    : state_(std::make_unique<State>(limits)), limits_(limits) {}

void SampleDecoder::set_limits(const DecodeLimits& limits) {
  limits_ = limits;
  state_->err.warnings_are_errors = limits.warnings_are_errors;
  state_->progress.max_scans = limits.max_scans;
}

SampleDecoder::~SampleDecoder() = default;

void SampleDecoder::set_deadline(std::chrono::steady_clock::time_point deadline) {
  state_->progress.deadline_ns =
      deadline == std::chrono::steady_clock::time_point::max()
          ? INT64_MAX
          : std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch())
                .count();
}

namespace {

// Reads the header of `jpeg` into `cinfo` and checks it against the limits. On success the
// decompressor is in the header-read state; on failure it has been reset.
template <typename StateT>
absl::Status ReadHeaderInto(StateT& st, const DecodeLimits& limits, std::span<const uint8_t> jpeg,
                            std::string_view path, ImageInfo& info) {
  if (jpeg.empty()) return DataError(path, "empty", "file is empty (0 bytes)");
  st.Recreate();  // nothing of the previous file may leak into this one
  if (!st.created) return DataError(path, "other", "libjpeg decompressor could not be created");
  jpeg_decompress_struct& cinfo = st.cinfo;
  const bool ok = st.Guarded([&] {
    jpeg_mem_src(&cinfo, jpeg.data(), static_cast<unsigned long>(jpeg.size()));
    jpeg_read_header(&cinfo, TRUE);
  });
  if (!ok) return st.Error(path);
  info.width = static_cast<int32_t>(cinfo.image_width);
  info.height = static_cast<int32_t>(cinfo.image_height);
  info.components = cinfo.num_components;
  info.progressive = cinfo.progressive_mode != 0;
  absl::Status status;
  const uint64_t pixels = uint64_t{cinfo.image_width} * cinfo.image_height;
  if (info.width <= 0 || info.height <= 0) {
    status = DataError(path, "corrupt",
                       absl::StrCat("image has zero size ", info.width, "x", info.height));
  } else if (pixels > limits.max_pixels) {
    status = DataError(path, "too_large",
                       absl::StrCat("image is ", info.width, "x", info.height, " = ", pixels,
                                    " pixels, above max_pixels ", limits.max_pixels));
  } else if (cinfo.data_precision != 8) {
    status = DataError(path, "unsupported",
                       absl::StrCat(cinfo.data_precision, "-bit JPEG data is not supported"));
  } else if (cinfo.num_components != 1 && cinfo.num_components != 3 && cinfo.num_components != 4) {
    status = DataError(path, "unsupported",
                       absl::StrCat(cinfo.num_components, "-component JPEGs are not supported"));
  }
  if (!status.ok()) jpeg_abort_decompress(&cinfo);
  return status;
}

// Output colour space for the file's colour space; 4-component files come out as CMYK and are
// converted by CmykToRgb.
void SetOutColor(jpeg_decompress_struct& cinfo) {
  const bool four = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = four ? JCS_CMYK : JCS_RGB;
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

}  // namespace

absl::StatusOr<DecodePlan> SampleDecoder::PlanFromHeader(std::span<const uint8_t> head,
                                                         std::string_view path,
                                                         const DecodeLimits& limits,
                                                         const TransformSpec& spec) {
  // A header cut off by the end of `head` must say "truncated" (the caller's cue), whatever the
  // dataset's warnings setting.
  DecodeLimits strict = limits;
  strict.warnings_are_errors = true;
  auto state = std::make_unique<State>(strict);
  ImageInfo info;
  absl::Status status = ReadHeaderInto(*state, strict, head, path, info);
  if (!status.ok()) return status;
  jpeg_decompress_struct& cinfo = state->cinfo;
  uint64_t coef_bytes = 0;
  if (cinfo.progressive_mode || jpeg_has_multiple_scans(&cinfo)) {
    // Whole-image coefficient arrays (jdcoefct.c): one 64-coefficient block of 2-byte values per
    // 8x8 block of each component, rounded up to the sampling factors.
    for (int c = 0; c < cinfo.num_components; ++c) {
      const jpeg_component_info& comp = cinfo.comp_info[c];
      const auto round_up = [](uint64_t v, uint64_t m) { return (v + m - 1) / m * m; };
      coef_bytes += round_up(comp.width_in_blocks, comp.h_samp_factor) *
                    round_up(comp.height_in_blocks, comp.v_samp_factor) * sizeof(JBLOCK);
    }
  }
  jpeg_abort_decompress(&cinfo);
  return PlanFor(static_cast<uint64_t>(info.width), static_cast<uint64_t>(info.height),
                 static_cast<uint64_t>(info.components), coef_bytes, spec.image_size);
}

DecodePlan SampleDecoder::WorstCasePlan(const DecodeLimits& limits, const TransformSpec& spec) {
  // 4 components, every one at full resolution, multi-scan; the widest and tallest sides JPEG has.
  return PlanFor(kMaxJpegSide, kMaxJpegSide, 4, limits.max_pixels * 4 * 2, spec.image_size);
}

absl::StatusOr<ImageInfo> SampleDecoder::ReadInfo(std::span<const uint8_t> jpeg,
                                                  std::string_view path) {
  ImageInfo info;
  absl::Status status = ReadHeaderInto(*state_, limits_, jpeg, path, info);
  if (!status.ok()) return status;
  jpeg_abort_decompress(&state_->cinfo);
  return info;
}

absl::StatusOr<std::vector<uint8_t>> SampleDecoder::DecodeRgb(std::span<const uint8_t> jpeg,
                                                              std::string_view path,
                                                              ImageInfo* info_out) try {
  State& st = *state_;
  ImageInfo info;
  absl::Status status = ReadHeaderInto(st, limits_, jpeg, path, info);
  if (!status.ok()) return status;
  if (info_out != nullptr) *info_out = info;
  jpeg_decompress_struct& cinfo = st.cinfo;
  SetOutColor(cinfo);
  const size_t width = cinfo.image_width;
  std::vector<uint8_t> rgb(width * cinfo.image_height * 3);
  st.row.resize(width * 4);
  const bool cmyk = cinfo.out_color_space == JCS_CMYK;
  const bool ok = st.Guarded([&] {
    jpeg_start_decompress(&cinfo);
    while (cinfo.output_scanline < cinfo.output_height) {
      uint8_t* dst = rgb.data() + size_t{cinfo.output_scanline} * width * 3;
      JSAMPROW row = cmyk ? st.row.data() : dst;
      jpeg_read_scanlines(&cinfo, &row, 1);
      if (cmyk) CmykToRgb(st.row.data(), static_cast<int32_t>(width), cinfo.saw_Adobe_marker, dst);
    }
    jpeg_finish_decompress(&cinfo);
  });
  if (!ok) return st.Error(path);
  return rgb;
} catch (const std::bad_alloc&) {
  jpeg_abort_decompress(&state_->cinfo);
  return WithReason(absl::ResourceExhaustedError(absl::StrCat(Av(path), ": out of memory")),
                    "other");
}

absl::Status SampleDecoder::DecodeInto(std::span<const uint8_t> jpeg, std::string_view path,
                                       const TransformSpec& spec, SampleRng& rng,
                                       std::span<uint8_t> out) try {
  if (spec.image_size == 0 || spec.image_size > kMaxImageSize) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(Av(path), ": image_size must be in [1, ",
                                                kMaxImageSize, "], got ", spec.image_size)),
        "other");
  }
  if (out.size() != spec.SampleBytes()) {
    return WithReason(
        absl::InvalidArgumentError(absl::StrCat(Av(path), ": output span has ", out.size(),
                                                " bytes, the sample needs ", spec.SampleBytes())),
        "other");
  }
  State& st = *state_;
  jpeg_decompress_struct& cinfo = st.cinfo;
  ImageInfo info;
  absl::Status status = ReadHeaderInto(st, limits_, jpeg, path, info);
  if (!status.ok()) return status;
  cinfo.mem->max_memory_to_use = static_cast<long>(memory_cap_);

  // The source box (fractional source pixels), the window the filter may read, and the flip.
  CropRect crop;
  int32_t clamp_x0 = 0, clamp_y0 = 0, clamp_x1 = info.width, clamp_y1 = info.height;
  bool flip = false;
  if (spec.augment == Augment::kTrain) {
    const CropBox box = DrawTrainCrop(info.width, info.height, rng);
    crop = CropRect{static_cast<double>(box.x), static_cast<double>(box.y),
                    static_cast<double>(box.width), static_cast<double>(box.height)};
    // torchvision crops, then resizes: the filter sees only the crop.
    clamp_x0 = box.x;
    clamp_y0 = box.y;
    clamp_x1 = box.x + box.width;
    clamp_y1 = box.y + box.height;
    flip = box.flip;
  } else {
    // torchvision resizes the whole image, then crops: the filter may read outside the box.
    crop = EvalCropExact(info.width, info.height, spec.image_size);
  }

  // Largest power-of-two DCT reduction that keeps the scaled crop >= the output in both axes.
  const auto size = static_cast<int32_t>(spec.image_size);
  int32_t denom = 1;
  while (!spec.exact_resize && denom < 8 && crop.width / (denom * 2) >= size &&
         crop.height / (denom * 2) >= size) {
    denom *= 2;
  }

  SetOutColor(cinfo);
  const bool cmyk = cinfo.out_color_space == JCS_CMYK;
  const int comps = cmyk ? 4 : 3;
  bool partial = true;  // crop columns / skip rows / stop early; off after a libjpeg refusal
  DecodeStats stats;
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (attempt == 1) {  // libjpeg refused the partial decode: read the header again, decode all
      status = ReadHeaderInto(st, limits_, jpeg, path, info);
      if (!status.ok()) return status;
      cinfo.mem->max_memory_to_use = static_cast<long>(memory_cap_);
      SetOutColor(cinfo);
      partial = false;
      stats.full_decode_fallback = true;
    }
    cinfo.scale_num = 1;
    cinfo.scale_denom = static_cast<unsigned int>(denom);
    if (!st.Guarded([&] { jpeg_calc_output_dimensions(&cinfo); })) return st.Error(path);
    const auto sw = static_cast<int32_t>(cinfo.output_width);
    const auto sh = static_cast<int32_t>(cinfo.output_height);
    // The crop in scaled coordinates: scaled pixel j covers source pixels [j*d, (j+1)*d).
    const int32_t cx0 = std::clamp(FloorDiv(clamp_x0, denom), 0, sw - 1);
    const int32_t cx1 = std::clamp(CeilDiv(clamp_x1, denom), cx0 + 1, sw);
    const int32_t cy0 = std::clamp(FloorDiv(clamp_y0, denom), 0, sh - 1);
    const int32_t cy1 = std::clamp(CeilDiv(clamp_y1, denom), cy0 + 1, sh);
    BuildTaps(crop.x / denom, crop.width / denom, size, cx0, cx1, flip, st.htaps);
    BuildTaps(crop.y / denom, crop.height / denom, size, cy0, cy1, false, st.vtaps);
    const int32_t need_x0 = partial ? st.htaps.in_begin : 0;
    const int32_t need_x1 = partial ? st.htaps.in_end : sw;
    const int32_t need_y0 = partial ? st.vtaps.in_begin : 0;
    const int32_t need_y1 = partial ? st.vtaps.in_end : sh;
    const int32_t hrow_bytes = size * 3;
    const int32_t vrows = st.vtaps.in_end - st.vtaps.in_begin;
    // Allocate before the guarded region (libjpeg errors longjmp; allocations must not throw
    // inside it).
    const size_t row_stride = static_cast<size_t>(sw) * comps + kRowSlack;
    st.row.resize(row_stride * kBatchRows);
    if (cmyk) st.rgb_row.resize(static_cast<size_t>(sw) * 3 + kRowSlack);
    st.hrows.resize(static_cast<size_t>(vrows) * hrow_bytes + kRowSlack);

    JDIMENSION xoff = static_cast<JDIMENSION>(need_x0);
    JDIMENSION xwidth = static_cast<JDIMENSION>(need_x1 - need_x0);
    bool eoi_missing = false;
    const bool ok = st.Guarded([&] {
      jpeg_start_decompress(&cinfo);
      if (xwidth < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &xwidth);
      if (need_y0 > 0) jpeg_skip_scanlines(&cinfo, static_cast<JDIMENSION>(need_y0));
      const int32_t row_x0 = static_cast<int32_t>(xoff);
      std::array<JSAMPROW, kBatchRows> rows;
      for (int32_t r = 0; r < kBatchRows; ++r) rows[r] = st.row.data() + r * row_stride;
      while (cinfo.output_scanline < static_cast<JDIMENSION>(need_y1)) {
        const auto y0 = static_cast<int32_t>(cinfo.output_scanline);
        const auto want = static_cast<JDIMENSION>(std::min(kBatchRows, need_y1 - y0));
        const auto got = static_cast<int32_t>(jpeg_read_scanlines(&cinfo, rows.data(), want));
        for (int32_t r = 0; r < got; ++r) {
          const int32_t y = y0 + r;
          if (y < st.vtaps.in_begin || y >= st.vtaps.in_end) continue;  // full-decode fallback
          const uint8_t* rgb = rows[r];
          if (cmyk) {
            CmykToRgb(rows[r], static_cast<int32_t>(xwidth), cinfo.saw_Adobe_marker,
                      st.rgb_row.data());
            rgb = st.rgb_row.data();
          }
          ResampleRowH(rgb, row_x0, st.htaps,
                       st.hrows.data() + static_cast<size_t>(y - st.vtaps.in_begin) * hrow_bytes);
        }
      }
      if (cinfo.output_scanline < cinfo.output_height) {
        // Stopped early. A single-scan file's remaining data is unread: a cut file (no EOI
        // marker after the data read so far) is still "truncated", whatever the crop.
        // (The entropy decoder may already have read the EOI marker: unread_marker.)
        if (st.err.warnings_are_errors && !jpeg_input_complete(&cinfo) &&
            cinfo.unread_marker != 0xD9) {
          const size_t left = cinfo.src->bytes_in_buffer;
          eoi_missing = !ContainsEoi(jpeg.data() + (jpeg.size() - left), jpeg.data() + jpeg.size());
        }
        jpeg_abort_decompress(&cinfo);
      } else {
        jpeg_finish_decompress(&cinfo);
      }
    });
    if (!ok) {
      if (attempt == 0 && IsApiRefusal(st.err.msg_code)) continue;
      return st.Error(path);
    }
    if (eoi_missing) {
      return DataError(path, "truncated", "Premature end of JPEG file (no EOI marker)");
    }
    stats.scale_denom = denom;
    stats.scaled_width = sw;
    stats.scaled_height = sh;
    stats.decoded_x = static_cast<int32_t>(xoff);
    stats.decoded_width = static_cast<int32_t>(xwidth);
    stats.decoded_y = need_y0;
    stats.decoded_rows = need_y1 - need_y0;
    break;
  }

  // Vertical pass straight into the output (via one row for layouts other than uint8 HWC).
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
  last_decode_ = stats;
  st.ReleaseBigScratch();
  return absl::OkStatus();
} catch (const std::bad_alloc&) {
  jpeg_abort_decompress(&state_->cinfo);
  return WithReason(absl::ResourceExhaustedError(absl::StrCat(Av(path), ": out of memory")),
                    "other");
}

namespace {

absl::Status ReadError(const std::string& path, int err) {
  const std::string text = absl::StrCat(path, ": read_error: ", std::strerror(err));
  absl::Status s = err == ENOENT   ? absl::NotFoundError(text)
                   : err == EACCES ? absl::PermissionDeniedError(text)
                                   : absl::DataLossError(text);
  return WithReason(std::move(s), "read_error");
}

}  // namespace

absl::StatusOr<SampleFile> SampleFile::Open(const std::string& path, uint64_t max_bytes) {
  const uint64_t limit = std::min(max_bytes, kMaxFileBytes);
  // O_NONBLOCK: opening a FIFO must not wait for a writer. It changes nothing for regular files.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ReadError(path, errno);
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ReadError(path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    const char* kind = S_ISFIFO(st.st_mode)  ? "a FIFO"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISDIR(st.st_mode)  ? "a directory"
                       : S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) ? "a device"
                                                                     : "not a regular file";
    return DataError(path, "not_regular_file",
                     absl::StrCat("is ", kind, ", not a regular file: refused unread"));
  }
  if (static_cast<uint64_t>(st.st_size) > limit) {
    ::close(fd);
    return DataError(path, "too_large",
                     absl::StrCat("file has ", st.st_size, " bytes, above max_file_bytes ", limit));
  }
  if (st.st_size == 0) {
    ::close(fd);
    return DataError(path, "empty", "file is empty (0 bytes)");
  }
  return SampleFile(path, fd, static_cast<uint64_t>(st.st_size), limit);
}

SampleFile::SampleFile(SampleFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(other.size_),
      max_bytes_(other.max_bytes_) {}

SampleFile::~SampleFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<std::vector<uint8_t>> SampleFile::ReadHead(uint64_t max) {
  return ReadRange(std::min(max, size_));
}

absl::StatusOr<std::vector<uint8_t>> SampleFile::ReadAll() { return ReadRange(UINT64_MAX); }

absl::StatusOr<std::vector<uint8_t>> SampleFile::ReadRange(uint64_t max) try {
  const bool whole = max == UINT64_MAX;
  // One byte more than the file had, to see its end in the same read without growing the buffer
  // (growing would double its capacity: memory the accounting did not draw).
  std::vector<uint8_t> bytes(static_cast<size_t>(whole ? size_ + 1 : max));
  size_t got = 0;
  while (true) {
    if (got == bytes.size()) {
      if (!whole) break;
      bytes.resize(got + 65536);  // the file grew since Open (rare)
    }
    const ssize_t n = ::pread(fd_, bytes.data() + got, bytes.size() - got, static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ReadError(path_, errno);
    }
    if (n == 0) break;
    got += static_cast<size_t>(n);
    if (got > max_bytes_) {
      return DataError(path_, "too_large",
                       absl::StrCat("file is above max_file_bytes ", max_bytes_, " bytes"));
    }
  }
  bytes.resize(got);
  if (bytes.empty()) return DataError(path_, "empty", "file is empty (0 bytes)");
  return bytes;
} catch (const std::bad_alloc&) {
  return WithReason(absl::ResourceExhaustedError(absl::StrCat(Av(path_), ": out of memory")),
                    "read_error");
}

absl::StatusOr<std::vector<uint8_t>> ReadFileBytes(const std::string& path, uint64_t max_bytes) {
  absl::StatusOr<SampleFile> file = SampleFile::Open(path, max_bytes);
  if (!file.ok()) return file.status();
  return file->ReadAll();
}

}  // namespace ringloader::image
