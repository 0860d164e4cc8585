// SPDX-License-Identifier: Apache-2.0
#pragma once
// Small helpers shared by ringloaderctl's RPC subcommands.

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/status.h"

namespace ringloader::ctl {

// A channel to `endpoint` (see client::GrpcTarget for the accepted forms).
absl::StatusOr<std::shared_ptr<grpc::Channel>> ChannelFor(const std::string& endpoint);

// Sets a deadline `timeout` from now on `context`.
void SetTimeout(grpc::ClientContext& context, std::chrono::milliseconds timeout);

// Exit code for a failed RPC: kExitUnavailable when the daemon could not be reached (UNAVAILABLE,
// DEADLINE_EXCEEDED), kExitFailure otherwise.
int ExitCodeFor(const grpc::Status& status);

// "UNAVAILABLE: connect failed ..." for messages.
std::string Describe(const grpc::Status& status);

// Deadline for one-shot RPCs (stats, quarantine).
inline constexpr std::chrono::milliseconds kRpcTimeout{10'000};

}  // namespace ringloader::ctl
