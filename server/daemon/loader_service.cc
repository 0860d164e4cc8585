// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/loader_service.h"

#include <string>

namespace ringloader::server {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

grpc::Status LoaderService::ClearQuarantine(grpc::ServerContext*,
                                            const v1::ClearQuarantineRequest*,
                                            v1::ClearQuarantineResponse*) {
  return grpc::Status(
      grpc::StatusCode::PERMISSION_DENIED,
      admin_endpoint_.empty()
          ? "ClearQuarantine is administrative: it is served only on the admin socket "
            "(server.admin_listen), which this daemon does not have"
          : "ClearQuarantine is administrative: it is served only on the admin socket " +
                admin_endpoint_ + " (the daemon's user, or members of server.admin_group)");
}

grpc::Status LoaderService::Attach(grpc::ServerContext* context, const v1::AttachRequest* request,
                                   grpc::ServerWriter<v1::AttachEvent>* writer) {
  absl::StatusOr<std::string> session = streams_.OpenSession(request->client_name());
  if (!session.ok()) return ToGrpc(session.status());
  v1::AttachEvent event;
  event.set_session_id(*session);
  event.set_incarnation(incarnation_);
  if (writer->Write(event)) {
    // gRPC cancels the call when the client's connection drops (exit, kill, crash) or when the
    // client cancels it; a short poll notices within a fraction of a second.
    while (!context->IsCancelled() &&
           streams_.WaitUnlessShutDown(std::chrono::milliseconds(100))) {
    }
  }
  streams_.CloseSession(*session);
  return grpc::Status::OK;
}

}  // namespace ringloader::server
