#include "client/ctl/samples_out.h"

#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/wire_text.h"

namespace ringloader::ctl {

uint64_t SampleDigest(std::span<const uint8_t> bytes) {
  return XXH64(bytes.data(), bytes.size(), /*seed=*/0);
}

std::string FormatDigest(uint64_t digest) { return absl::StrFormat("%016x", digest); }

std::string FormatSampleLine(const SampleRecord& r) {
  const std::string path =
      r.relative_path.empty() ? std::string("-") : wire::EscapeBytes(r.relative_path);
  return absl::StrCat(r.epoch, "\t", r.sequence, "\t", r.sample_index, "\t", r.label, "\t", path,
                      "\t", FormatDigest(r.digest), "\n");
}

}  // namespace ringloader::ctl
