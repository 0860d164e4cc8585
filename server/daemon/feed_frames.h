// SPDX-License-Identifier: Apache-2.0
#pragma once
// Service Feeder's answer frames as raw gRPC byte buffers, on both ends (feeder_service,
// feeder_pool). The feeder's payload frames are slices of the answer's own buffer, never copied
// (gRPC's TLS encrypts straight from it); the host keeps the slices it received, hashed as they
// come while in cache, and copies each sample once, from them into its slot. Through the
// generated code a payload went through a protobuf string as well, and into one buffer: copies
// on each end that cost a feeder 8% of its core in feeder_bench, a host more. What goes on the
// wire is still FeedFrame's protobuf encoding, so either end may use the generated code.

#include <xxhash.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include <grpcpp/support/byte_buffer.h>

#include "absl/status/statusor.h"
#include "proto/ringloader.pb.h"

namespace ringloader::server {

// The method, registered raw by FeederService and called raw by FeederPool.
inline constexpr char kFeedSamplesMethod[] = "/ringloader.v1.Feeder/FeedSamples";

// A FeedFrame holding `header`.
grpc::ByteBuffer HeaderFrame(const v1::FeedHeader& header);
// A FeedFrame holding `bytes` as its payload, not copied: the frame's slice points at `bytes`,
// and holds `owner` (whatever keeps them alive and unchanged) until gRPC lets go of the slice's
// last reference, which may be after the call's last Write has returned, or its handler.
grpc::ByteBuffer PayloadFrame(std::span<const uint8_t> bytes, std::shared_ptr<const void> owner);

// The checksum of an answer's payload: XXH3-64 when the host asks for it
// (FeedRequest.payload_xxh3), else XXH64 (what hosts before it check). Both seed 0. XXH3 takes
// about half XXH64's time, on each end.
class PayloadHash {
 public:
  enum class Kind { kXxh64, kXxh3 };
  explicit PayloadHash(Kind kind);
  ~PayloadHash();
  PayloadHash(const PayloadHash&) = delete;
  PayloadHash& operator=(const PayloadHash&) = delete;

  void Update(std::span<const uint8_t> bytes);
  uint64_t Digest() const;
  Kind kind() const { return kind_; }
  // XXH64 or XXH3 of `bytes` at once.
  static uint64_t Of(Kind kind, std::span<const uint8_t> bytes);

 private:
  const Kind kind_;
  XXH64_state_t* xxh64_ = nullptr;
  XXH3_state_t* xxh3_ = nullptr;
};

// One frame as read: its header, or the payload bytes it held.
struct ReadFrame {
  std::optional<v1::FeedHeader> header;
  size_t payload_bytes = 0;  // appended to `pieces` (see ParseFrame)
};
// Reads `frame`, a FeedFrame: a payload's bytes are appended to `pieces` as slices of the frame
// (not copied; a payload another encoder wrote, through protobuf, is) and added to `hash` (if
// any); a header is returned whole. DataLoss when it is no FeedFrame, holds neither, or its
// payload is longer than `room`.
absl::StatusOr<ReadFrame> ParseFrame(const grpc::ByteBuffer& frame, uint64_t room,
                                     PayloadHash* hash, std::vector<grpc::Slice>* pieces);

}  // namespace ringloader::server
