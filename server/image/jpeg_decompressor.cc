// SPDX-License-Identifier: Apache-2.0
#include "server/image/jpeg_decompressor.h"

#include <cstring>

#include <jerror.h>

#include "shm/base/clock.h"

namespace ringloader::image {
namespace {

using ErrorManager = JpegDecompressor::ErrorManager;
using ProgressMonitor = JpegDecompressor::ProgressMonitor;

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

[[noreturn]] void Jump(ErrorManager* err, const char* reason, int msg_code) {
  err->failure.reason = reason;
  err->failure.msg_code = msg_code;
  std::longjmp(err->jump, 1);
}

[[noreturn]] void OnError(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  (*err->pub.format_message)(cinfo, err->failure.message);
  Jump(err, ReasonForCode(err->pub.msg_code), err->pub.msg_code);
}

void OnMessage(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* err = reinterpret_cast<ErrorManager*>(cinfo->err);
  ++err->pub.num_warnings;
  if (!err->warnings_are_errors) return;
  (*err->pub.format_message)(cinfo, err->failure.message);
  Jump(err, err->pub.msg_code == JWRN_JPEG_EOF ? "truncated" : "corrupt", err->pub.msg_code);
}

void OnProgress(j_common_ptr cinfo) {
  if (!cinfo->is_decompressor) return;
  auto* progress = reinterpret_cast<ProgressMonitor*>(cinfo->progress);
  ErrorManager* err = progress->err;
  if (progress->deadline_ns != INT64_MAX && base::SteadyNowNs() > progress->deadline_ns) {
    std::snprintf(err->failure.message, sizeof(err->failure.message),
                  "decoding took longer than server.decode_deadline_ms; abandoned");
    Jump(err, "deadline_exceeded", 0);
  }
  if (reinterpret_cast<j_decompress_ptr>(cinfo)->input_scan_number >
      static_cast<int>(progress->max_scans)) {
    std::snprintf(err->failure.message, sizeof(err->failure.message),
                  "Progressive JPEG image has more than %u scans", progress->max_scans);
    Jump(err, "too_many_scans", 0);
  }
}

// True if [begin, end) holds an EOI marker (FF D9). Searches from the end, where a complete file
// has it. Entropy-coded data never contains FF D9 (FF is stuffed as FF 00).
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

}  // namespace

bool JpegFailure::IsApiRefusal() const {
  return msg_code == JERR_BAD_STATE || msg_code == JERR_BAD_CROP_SPEC || msg_code == JERR_NOTIMPL ||
         msg_code == JERR_WIDTH_OVERFLOW || msg_code == JERR_BAD_BUFFER_MODE;
}

JpegDecompressor::JpegDecompressor(bool warnings_are_errors, uint32_t max_scans) {
  cinfo_.err = jpeg_std_error(&err_.pub);
  err_.pub.error_exit = OnError;
  err_.pub.emit_message = OnMessage;
  err_.warnings_are_errors = warnings_are_errors;
  progress_.pub.progress_monitor = OnProgress;
  progress_.err = &err_;
  progress_.max_scans = max_scans;
  progress_.deadline_ns = INT64_MAX;
}

JpegDecompressor::~JpegDecompressor() {
  if (created_) jpeg_destroy_decompress(&cinfo_);
}

void JpegDecompressor::Arm() {
  err_.failure = JpegFailure{};
  err_.pub.num_warnings = 0;
}

bool JpegDecompressor::Fail() {
  if (created_) jpeg_abort_decompress(&cinfo_);
  return false;
}

void JpegDecompressor::Recreate() {
  if (created_) jpeg_destroy_decompress(&cinfo_);
  created_ = false;
  Arm();
  // Fails only when out of memory or on a library mismatch, through error_exit.
  if (setjmp(err_.jump) != 0) return;
  jpeg_create_decompress(&cinfo_);
  cinfo_.progress = &progress_.pub;
  created_ = true;
}

bool JpegDecompressor::ReadHeader(std::span<const uint8_t> jpeg) {
  jpeg_ = jpeg;
  Recreate();
  if (!created_) {
    std::snprintf(err_.failure.message, sizeof(err_.failure.message),
                  "libjpeg decompressor could not be created");
    return false;
  }
  Arm();
  if (setjmp(err_.jump) != 0) return Fail();
  jpeg_mem_src(&cinfo_, jpeg.data(), static_cast<unsigned long>(jpeg.size()));
  jpeg_read_header(&cinfo_, TRUE);
  return true;
}

void JpegDecompressor::set_memory_cap(uint64_t bytes) {
  if (created_) cinfo_.mem->max_memory_to_use = static_cast<long>(bytes);
}

bool JpegDecompressor::CalcOutputDimensions(unsigned scale_denom) {
  Arm();
  if (setjmp(err_.jump) != 0) return Fail();
  cinfo_.scale_num = 1;
  cinfo_.scale_denom = scale_denom;
  jpeg_calc_output_dimensions(&cinfo_);
  return true;
}

bool JpegDecompressor::HasMultipleScans(bool* multiple) {
  Arm();
  if (setjmp(err_.jump) != 0) return Fail();
  *multiple = jpeg_has_multiple_scans(&cinfo_) != 0;
  return true;
}

bool JpegDecompressor::Start(JDIMENSION* xoff, JDIMENSION* xwidth, JDIMENSION skip_rows) {
  Arm();
  if (setjmp(err_.jump) != 0) return Fail();
  jpeg_start_decompress(&cinfo_);
  if (*xwidth < cinfo_.output_width) jpeg_crop_scanline(&cinfo_, xoff, xwidth);
  if (skip_rows > 0) jpeg_skip_scanlines(&cinfo_, skip_rows);
  return true;
}

bool JpegDecompressor::ReadScanlines(JSAMPROW* rows, JDIMENSION max_rows, JDIMENSION* got) {
  Arm();
  if (setjmp(err_.jump) != 0) return Fail();
  *got = jpeg_read_scanlines(&cinfo_, rows, max_rows);
  return true;
}

bool JpegDecompressor::Finish() {
  Arm();
  if (setjmp(err_.jump) != 0) return Fail();
  jpeg_finish_decompress(&cinfo_);
  return true;
}

void JpegDecompressor::Abort() {
  if (created_) jpeg_abort_decompress(&cinfo_);
}

bool JpegDecompressor::FindEoi(bool* missing) {
  Arm();
  if (setjmp(err_.jump) != 0) return Fail();
  // The entropy decoder may already have read the EOI marker (unread_marker).
  *missing = !jpeg_input_complete(&cinfo_) && cinfo_.unread_marker != 0xD9 &&
             !ContainsEoi(jpeg_.data() + (jpeg_.size() - cinfo_.src->bytes_in_buffer),
                          jpeg_.data() + jpeg_.size());
  return true;
}

}  // namespace ringloader::image
