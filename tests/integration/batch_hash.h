// SPDX-License-Identifier: Apache-2.0
#pragma once
// What a batch holds, hashed (images, labels and indices), for tests that compare runs batch by
// batch through the C++ client.

#include <cstddef>
#include <functional>
#include <string_view>

#include "client/client.h"

namespace ringloader::testing {

inline size_t HashOf(const client::Batch& b) {
  auto bytes = [](const client::TensorView& t) {
    return std::string_view(static_cast<const char*>(t.raw()), t.bytes());
  };
  std::hash<std::string_view> h;
  return h(bytes(b.images())) ^ (h(bytes(b.labels())) * 31) ^ (h(bytes(b.indices())) * 131);
}

}  // namespace ringloader::testing
