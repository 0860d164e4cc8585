// SPDX-License-Identifier: Apache-2.0
#include "shm/base/text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ringloader::base {

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  uint64_t scale = 1;
  while (unit < 4 && bytes >= scale * 1024) {
    scale *= 1024;
    ++unit;
  }
  if (bytes % scale == 0) return absl::StrCat(bytes / scale, " ", kUnits[unit]);
  return absl::StrFormat("%.1f %s", static_cast<double>(bytes) / static_cast<double>(scale),
                         kUnits[unit]);
}

}  // namespace ringloader::base
