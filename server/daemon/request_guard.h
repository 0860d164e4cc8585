// SPDX-License-Identifier: Apache-2.0
#pragma once
// A gRPC server interceptor for requests whose bytes are not a valid protobuf message.
//
// gRPC's generated sync handlers answer such a request INTERNAL with an empty message (and the
// default health service's Watch answers INTERNAL "could not parse request"), which reads like a
// daemon bug. The protocol promises INVALID_ARGUMENT with a message for every bad request, so
// this interceptor rewrites exactly those answers:
//   INVALID_ARGUMENT "<method>: the request is not a valid protobuf message of this method"
// Everything else passes through untouched.
//
// Thread-safety: the factory is thread-safe; one interceptor per call (gRPC's contract).

#include <grpcpp/support/server_interceptor.h>

namespace ringloader::server {

class MalformedRequestInterceptorFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;
};

}  // namespace ringloader::server
