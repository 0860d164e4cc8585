// SPDX-License-Identifier: Apache-2.0
// ringloaderctl health: the standard grpc.health.v1 Check.
#include <cmath>
#include <ostream>

#include "client/channel.h"
#include "client/ctl/ctl.h"
#include "client/ctl/rpc.h"
#include "proto/health.grpc.pb.h"

namespace ringloader::ctl {

int RunHealth(const HealthOptions& options, std::ostream& out) {
  auto channel = ChannelFor(options.endpoint);
  if (!channel.ok()) {
    out << "unreachable: " << channel.status().message() << "\n";
    return kExitUnavailable;
  }
  auto stub = grpc::health::v1::Health::NewStub(*channel);
  grpc::ClientContext context;
  const double timeout_s =
      std::isfinite(options.timeout_s) && options.timeout_s > 0 ? options.timeout_s : 2.0;
  SetTimeout(context, std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
  grpc::health::v1::HealthCheckRequest request;  // service "" = the server as a whole
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status = stub->Check(&context, request, &response);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::NOT_FOUND) {  // the health service's "unknown"
      out << "SERVICE_UNKNOWN " << options.endpoint << "\n";
      return kExitFailure;
    }
    if (ExitCodeFor(status) == kExitUnavailable) {
      out << "unreachable: " << options.endpoint << ": " << Describe(status) << "; "
          << client::DiagnoseNoConnection(options.endpoint) << "\n";
      return kExitUnavailable;
    }
    out << "error: " << options.endpoint << ": " << Describe(status) << "\n";
    return kExitFailure;
  }
  out << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(response.status()) << " "
      << options.endpoint << "\n";
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk
                                                                             : kExitFailure;
}

}  // namespace ringloader::ctl
