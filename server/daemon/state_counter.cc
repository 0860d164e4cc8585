// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/state_counter.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "shm/base/atomic_file.h"

namespace ringloader::server {

std::optional<uint64_t> LoadStateCounter(const std::string& state_dir, const std::string& name) {
  std::ifstream in(state_dir + "/" + name);
  if (!in) return std::nullopt;
  std::stringstream text;
  text << in.rdbuf();
  uint64_t n = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(text.str()), &n)) return std::nullopt;
  return n;
}

absl::Status StoreStateCounter(const std::string& state_dir, const std::string& name,
                               uint64_t value) {
  return base::WriteFileAtomically(state_dir + "/" + name, absl::StrCat(value, "\n"));
}

}  // namespace ringloader::server
