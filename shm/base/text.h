// SPDX-License-Identifier: Apache-2.0
// Small text helpers shared by the daemon, the client and the CLI.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace ringloader::base {

// Bytes for people: "512 B", "256 MiB", "1.5 GiB". Whole multiples print without a fraction.
std::string FormatBytes(uint64_t bytes);

// Debian's abseil predates absl::string_view being std::string_view.
inline absl::string_view Sv(std::string_view s) { return absl::string_view(s.data(), s.size()); }

}  // namespace ringloader::base
