// SPDX-License-Identifier: Apache-2.0
#pragma once
// The gRPC face of the daemon: each handler is one line that calls StreamManager and converts its
// status. All logic lives in StreamManager, which has its own tests.

#include <string>
#include <utility>

#include "absl/status/status.h"
#include "grpcpp/grpcpp.h"
#include "proto/ringloader.grpc.pb.h"
#include "server/daemon/stream_manager.h"

namespace ringloader::server {

// The only place absl::Status becomes grpc::Status.
grpc::Status ToGrpc(const absl::Status& status);

class LoaderService final : public v1::Loader::Service {
 public:
  // `admin_endpoint`: where ClearQuarantine is served instead ("" = nowhere).
  LoaderService(StreamManager& streams, uint64_t incarnation, std::string admin_endpoint)
      : streams_(streams), incarnation_(incarnation), admin_endpoint_(std::move(admin_endpoint)) {}

  // Holds the call open while the client lives; closes its streams when it ends.
  grpc::Status Attach(grpc::ServerContext* context, const v1::AttachRequest* request,
                      grpc::ServerWriter<v1::AttachEvent>* writer) override;
  grpc::Status OpenStream(grpc::ServerContext* context, const v1::OpenStreamRequest* request,
                          v1::OpenStreamResponse* response) override {
    return ToGrpc(streams_.Open(*request, response, context->peer(),
                                [context] { return context->IsCancelled(); }));
  }
  grpc::Status NextBatch(grpc::ServerContext* context, const v1::NextBatchRequest* request,
                         v1::NextBatchResponse* response) override {
    return ToGrpc(streams_.Next(*request, response, [context] { return context->IsCancelled(); }));
  }
  grpc::Status ReleaseBatches(grpc::ServerContext*, const v1::ReleaseBatchesRequest* request,
                              v1::ReleaseBatchesResponse*) override {
    return ToGrpc(streams_.Release(*request));
  }
  grpc::Status CloseStream(grpc::ServerContext*, const v1::CloseStreamRequest* request,
                           v1::CloseStreamResponse*) override {
    return ToGrpc(streams_.Close(*request));
  }
  grpc::Status GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                        v1::GetStatsResponse* response) override {
    streams_.Stats(response);
    return grpc::Status::OK;
  }
  grpc::Status ListQuarantine(grpc::ServerContext*, const v1::ListQuarantineRequest*,
                              v1::ListQuarantineResponse* response) override {
    streams_.ListQuarantine(response);
    return grpc::Status::OK;
  }
  // Administrative: refused here, for any local client may reach this socket.
  grpc::Status ClearQuarantine(grpc::ServerContext*, const v1::ClearQuarantineRequest*,
                               v1::ClearQuarantineResponse*) override;

 private:
  StreamManager& streams_;
  const uint64_t incarnation_;
  const std::string admin_endpoint_;
};

// The administrative calls, on the admin socket only (ServerConfig::admin_listen), whose mode
// lets in the daemon's user and server.admin_group alone.
class AdminService final : public v1::Loader::Service {
 public:
  explicit AdminService(StreamManager& streams) : streams_(streams) {}
  grpc::Status ClearQuarantine(grpc::ServerContext*, const v1::ClearQuarantineRequest* request,
                               v1::ClearQuarantineResponse* response) override {
    return ToGrpc(streams_.ClearQuarantine(*request, response));
  }
  grpc::Status ListQuarantine(grpc::ServerContext*, const v1::ListQuarantineRequest*,
                              v1::ListQuarantineResponse* response) override {
    streams_.ListQuarantine(response);
    return grpc::Status::OK;
  }

 private:
  StreamManager& streams_;
};

}  // namespace ringloader::server
