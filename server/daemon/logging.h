// SPDX-License-Identifier: Apache-2.0
#pragma once
// Logging of the ringloaderd executable (libraries never log): spdlog to stderr.

#include <string>

#include "server/daemon/config.h"

namespace ringloader::server {

// Without a config: "[level] <prefix>message" lines on stderr. With one: its level and format.
// Safe to call again to apply a config.
void InitLogging(const ServerConfig* server, const std::string& prefix = "");

}  // namespace ringloader::server
