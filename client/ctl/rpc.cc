// SPDX-License-Identifier: Apache-2.0
#include "client/ctl/rpc.h"

#include "client/channel.h"
#include "client/ctl/ctl.h"
#include "client/retry.h"

namespace ringloader::ctl {

absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelFor(const std::string& endpoint) {
  absl::StatusOr<std::string> target = client::GrpcTarget(endpoint);
  if (!target.ok()) return target.status();
  return client::MakeChannel(*target);
}

void SetTimeout(grpc::ClientContext& context, std::chrono::milliseconds timeout) {
  context.set_deadline(std::chrono::system_clock::now() + timeout);
}

int ExitCodeFor(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
      return kExitUnavailable;
    default:
      return kExitFailure;
  }
}

std::string Describe(const grpc::Status& status) { return client::DescribeStatus(status); }

}  // namespace ringloader::ctl
