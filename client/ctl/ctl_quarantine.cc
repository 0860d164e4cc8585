// SPDX-License-Identifier: Apache-2.0
// ringloaderctl quarantine list|clear.
#include <ostream>

#include "client/channel.h"
#include "client/ctl/ctl.h"
#include "proto/admin_endpoint.h"
#include "client/ctl/rpc.h"
#include "proto/ringloader.grpc.pb.h"

namespace ringloader::ctl {
namespace {

std::unique_ptr<v1::Loader::Stub> Stub(const std::string& endpoint, std::ostream& err,
                                       const char* what) {
  auto channel = ChannelFor(endpoint);
  if (!channel.ok()) {
    err << "ringloaderctl quarantine " << what << ": " << channel.status().message() << "\n";
    return nullptr;
  }
  return v1::Loader::NewStub(*channel);
}

}  // namespace

int RunQuarantineList(const QuarantineOptions& options, std::ostream& out, std::ostream& err) {
  auto stub = Stub(options.endpoint, err, "list");
  if (!stub) return kExitUsage;
  grpc::ClientContext context;
  SetTimeout(context, kRpcTimeout);
  v1::ListQuarantineResponse response;
  grpc::Status status = stub->ListQuarantine(&context, v1::ListQuarantineRequest(), &response);
  if (!status.ok()) {
    err << "ringloaderctl quarantine list: " << options.endpoint << ": " << Describe(status)
        << "\n";
    return ExitCodeFor(status);
  }
  if (response.samples_size() == 0) {
    out << "no quarantined samples\n";
    return kExitOk;
  }
  // dataset <TAB> sample_index <TAB> strikes <TAB> path (escaped as wire::EscapeBytes does)
  for (const v1::QuarantinedSample& q : response.samples()) {
    out << q.dataset() << "\t" << q.sample_index() << "\t" << q.strikes() << "\t"
        << q.path() << "\n";
  }
  return kExitOk;
}

// Administrative: on the daemon's admin socket, which only its user (and server.admin_group)
// may connect to.
int RunQuarantineClear(const QuarantineOptions& options, std::ostream& out, std::ostream& err) {
  const std::string admin = options.admin_endpoint.empty()
                                ? wire::AdminEndpointOf(options.endpoint)
                                : options.admin_endpoint;
  if (admin.empty()) {
    err << "ringloaderctl quarantine clear: " << options.endpoint
        << " is not a Unix socket: administrative calls are served only on the daemon's admin "
           "socket (give it with --admin-endpoint unix:PATH)\n";
    return kExitUsage;
  }
  // Permissions do not change by waiting: a socket that keeps us out is said at once.
  if (grpc::Status refused = client::NoConnectionStatus(admin);
      refused.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    err << "ringloaderctl quarantine clear: " << refused.error_message()
        << " (the daemon's user, or members of server.admin_group)\n";
    return ExitCodeFor(refused);
  }
  auto stub = Stub(admin, err, "clear");
  if (!stub) return kExitUsage;
  grpc::ClientContext context;
  SetTimeout(context, kRpcTimeout);
  v1::ClearQuarantineRequest request;
  request.set_dataset(options.dataset);
  v1::ClearQuarantineResponse response;
  grpc::Status status = stub->ClearQuarantine(&context, request, &response);
  if (!status.ok()) {
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
      status = client::NoConnectionStatus(admin);
    }
    err << "ringloaderctl quarantine clear: " << admin << ": " << Describe(status) << "\n";
    return ExitCodeFor(status);
  }
  out << "cleared " << response.cleared() << " quarantined samples"
      << (options.dataset.empty() ? "" : " of " + options.dataset) << "\n";
  return kExitOk;
}

}  // namespace ringloader::ctl
