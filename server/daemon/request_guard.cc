// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/request_guard.h"

#include <string>

namespace ringloader::server {
namespace {

using grpc::experimental::InterceptionHookPoints;

class MalformedRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit MalformedRequestInterceptor(const char* method) : method_(method ? method : "") {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    // Sync handlers deserialise before this hook and pass nullptr when the bytes did not parse.
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_MESSAGE) &&
        methods->GetRecvMessage() == nullptr) {
      malformed_ = true;
    }
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      // The default health service parses its own (raw) requests and says so in this message.
      const bool health_parse_error = status.error_code() == grpc::StatusCode::INTERNAL &&
                                      status.error_message() == "could not parse request";
      if ((malformed_ && status.error_code() == grpc::StatusCode::INTERNAL) || health_parse_error) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            method_ + ": the request is not a valid protobuf message of this method"));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  bool malformed_ = false;
};

}  // namespace

grpc::experimental::Interceptor* MalformedRequestInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  return new MalformedRequestInterceptor(info->method());
}

}  // namespace ringloader::server
