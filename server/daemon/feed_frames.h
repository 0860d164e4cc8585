// SPDX-License-Identifier: Apache-2.0
#pragma once
// Service Feeder's answer frames as raw gRPC byte buffers, on both ends (feeder_service,
// feeder_pool). A payload frame's bytes are copied once, between the answer's buffer and gRPC's
// slices; through the generated code they went through a protobuf string as well, a second copy
// on each end (a feeder's core spent 5% of its time copying). What goes on the wire is still
// FeedFrame's protobuf encoding, so either end may use the generated code.

#include <xxhash.h>

#include <cstdint>
#include <optional>
#include <span>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/statusor.h"
#include "proto/ringloader.pb.h"

namespace ringloader::server {

// The method, registered raw by FeederService and called raw by FeederPool.
inline constexpr char kFeedSamplesMethod[] = "/ringloader.v1.Feeder/FeedSamples";

// A FeedFrame holding `header`.
grpc::ByteBuffer HeaderFrame(const v1::FeedHeader& header);
// A FeedFrame holding `bytes` as its payload.
grpc::ByteBuffer PayloadFrame(std::span<const uint8_t> bytes);

// One frame as read: its header, or the payload bytes it held.
struct ReadFrame {
  std::optional<v1::FeedHeader> header;
  size_t payload_bytes = 0;  // copied to the front of `dest` (see ParseFrame)
};
// Reads `frame`, a FeedFrame: a payload is copied to the front of `dest` and added to `hash`; a
// header is returned whole. DataLoss when it is no FeedFrame, holds neither, or its payload is
// longer than `dest`.
absl::StatusOr<ReadFrame> ParseFrame(const grpc::ByteBuffer& frame, std::span<uint8_t> dest,
                                     XXH64_state_t* hash);

}  // namespace ringloader::server
