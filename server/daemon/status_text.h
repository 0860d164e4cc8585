// SPDX-License-Identifier: Apache-2.0
#pragma once
// Debian's abseil keeps its own string_view type, which fmt/spdlog cannot format: log messages
// go through this.

#include <string>

#include "absl/status/status.h"

namespace ringloader::server {

inline std::string Text(const absl::Status& status) { return std::string(status.message()); }

}  // namespace ringloader::server
