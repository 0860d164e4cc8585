// SPDX-License-Identifier: Apache-2.0
#pragma once
// Where a daemon serves its administrative calls (ClearQuarantine): a Unix socket of its own
// beside the main one, created 0600 (the daemon's user) or 0660 for server.admin_group, so the
// kernel's permissions, not anything a client says, decide who may call them. The daemon and
// ringloaderctl derive it from the main endpoint the same way.

#include <string>
#include <string_view>

namespace ringloader::wire {

// "unix:/run/ringloader/ringloader.sock" -> "unix:/run/ringloader/ringloader-admin.sock";
// "unix:/x/s" -> "unix:/x/s-admin"; "" for a TCP endpoint (admin calls are local only).
inline std::string AdminEndpointOf(std::string_view endpoint) {
  if (endpoint.substr(0, 5) != "unix:") return "";
  std::string path(endpoint.substr(5));
  constexpr std::string_view kSock = ".sock";
  if (path.size() > kSock.size() && path.compare(path.size() - kSock.size(), kSock.size(),
                                                 kSock) == 0) {
    path.resize(path.size() - kSock.size());
    return "unix:" + path + "-admin.sock";
  }
  return "unix:" + path + "-admin";
}

}  // namespace ringloader::wire
