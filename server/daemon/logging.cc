// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/logging.h"

#include <memory>

#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace ringloader::server {

void InitLogging(const ServerConfig* server, const std::string& prefix) {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_logger_mt("ringloaderd");
    l->flush_on(spdlog::level::info);
    spdlog::set_default_logger(l);
    return l;
  }();
  // journald stamps each line itself; `timestamped` is for plain files and terminals.
  const bool timestamped = server != nullptr && server->log_format == LogFormat::kTimestamped;
  logger->set_pattern(std::string(timestamped ? "%Y-%m-%dT%H:%M:%S.%e " : "") + "[%l] " + prefix +
                      "%v");
  if (server != nullptr) logger->set_level(spdlog::level::from_str(server->log_level));
}

}  // namespace ringloader::server
