// SPDX-License-Identifier: Apache-2.0
#pragma once
// Small numbers a daemon keeps in its state_dir from one incarnation to the next, one text file
// each ("<state_dir>/<name>", a decimal line), replaced atomically: the OOM killer's count it
// saw (oom_kills.h) and how many times it started after an unclean exit (daemon.cc).

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace ringloader::server {

// nullopt when the file is missing or does not hold a number.
std::optional<uint64_t> LoadStateCounter(const std::string& state_dir, const std::string& name);
absl::Status StoreStateCounter(const std::string& state_dir, const std::string& name,
                               uint64_t value);

}  // namespace ringloader::server
