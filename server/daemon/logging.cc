// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/logging.h"

#include <cstring>
#include <memory>

#include "grpc/support/log.h"
#include "spdlog/sinks/stdout_sinks.h"
#include "spdlog/spdlog.h"

namespace ringloader::server {
namespace {

// gRPC's own lines (it logs errors only, unless GRPC_VERBOSITY says otherwise) in our format. A
// failed TLS handshake is said with what usually causes it: gRPC's words are OpenSSL's.
void LogGrpcLine(gpr_log_func_args* args) {
  const char* message = args->message != nullptr ? args->message : "";
  std::string hint;
  if (std::strstr(message, "Handshake failed") != nullptr) {
    if (std::strstr(message, "WRONG_VERSION_NUMBER") != nullptr ||
        std::strstr(message, "wrong version number") != nullptr ||
        std::strstr(message, "HTTP_REQUEST") != nullptr ||
        std::strstr(message, "http request") != nullptr) {
      hint = " (a client spoke plaintext to this TLS endpoint: give it [tls]'s CA and a "
             "certificate, e.g. RINGLOADER_TLS_CA, RINGLOADER_TLS_CERT, RINGLOADER_TLS_KEY)";
    } else if (std::strstr(message, "PEER_DID_NOT_RETURN_A_CERTIFICATE") != nullptr ||
               std::strstr(message, "peer did not return a certificate") != nullptr) {
      hint = " (a TLS client without a certificate: this endpoint requires one signed by [tls] ca)";
    } else {
      hint = " (a TLS client the handshake refused)";
    }
  }
  const spdlog::level::level_enum level = args->severity == GPR_LOG_SEVERITY_ERROR
                                              ? spdlog::level::warn
                                              : spdlog::level::debug;
  spdlog::log(level, "gRPC: {}{}", message, hint);
}

}  // namespace

void InitLogging(const ServerConfig* server, const std::string& prefix) {
  static std::shared_ptr<spdlog::logger> logger = [] {
    auto l = spdlog::stderr_logger_mt("ringloaderd");
    l->flush_on(spdlog::level::info);
    spdlog::set_default_logger(l);
    gpr_set_log_function(LogGrpcLine);
    return l;
  }();
  // journald stamps each line itself; `timestamped` is for plain files and terminals.
  const bool timestamped = server != nullptr && server->log_format == LogFormat::kTimestamped;
  logger->set_pattern(std::string(timestamped ? "%Y-%m-%dT%H:%M:%S.%e " : "") + "[%l] " + prefix +
                      "%v");
  if (server != nullptr) logger->set_level(spdlog::level::from_str(server->log_level));
}

}  // namespace ringloader::server
