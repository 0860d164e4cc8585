// SPDX-License-Identifier: Apache-2.0
// Replacing a file so that readers, and a crash at any moment, see the old contents or the new,
// never a mixture: write a private temporary beside it, fsync, rename over it, fsync the directory.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace ringloader::base {

// Writes the concatenation of `parts` as `path`. Creates no directories. On failure the old
// file is untouched, no temporary is left, and the error (kUnavailable) names `path` and errno.
absl::Status WriteFileAtomically(const std::string& path,
                                 std::initializer_list<std::string_view> parts);

inline absl::Status WriteFileAtomically(const std::string& path, std::string_view contents) {
  return WriteFileAtomically(path, {contents});
}

}  // namespace ringloader::base
