// SPDX-License-Identifier: Apache-2.0
// Feed answers' frames read and written raw (feed_frames.h): the same bytes as FeedFrame's
// protobuf encoding both ways, however gRPC splits a frame into slices, and a frame that is no
// FeedFrame, or longer than the answer, is refused.

#include "server/daemon/feed_frames.h"

#include <catch2/catch.hpp>
#include <memory>
#include <string>
#include <vector>

namespace ringloader::server {
namespace {

std::string Flat(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  REQUIRE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as gRPC may hand them over: in slices cut at `cuts`.
grpc::ByteBuffer Sliced(const std::string& bytes, std::vector<size_t> cuts) {
  std::vector<grpc::Slice> slices;
  size_t from = 0;
  cuts.push_back(bytes.size());
  for (size_t to : cuts) {
    slices.emplace_back(bytes.data() + from, to - from);
    from = to;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST_CASE("Feed frames: written raw they are FeedFrame's encoding, and read back whole however "
          "they are sliced",
          "[feeder]") {
  std::vector<uint8_t> payload(300'000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7 + 3);
  v1::FeedFrame expected;
  expected.set_payload(payload.data(), payload.size());
  const std::string wire = Flat(PayloadFrame(payload, nullptr));
  CHECK(wire == expected.SerializeAsString());

  // The tag and the length's 3 bytes split across slices, and the payload across more.
  for (const std::vector<size_t>& cuts :
       {std::vector<size_t>{}, {1}, {2}, {1, 2, 3}, {3, 4, 1000, 200'000}}) {
    const grpc::ByteBuffer frame = Sliced(wire, cuts);
    std::vector<grpc::Slice> frame_slices;
    REQUIRE(frame.Dump(&frame_slices).ok());
    std::vector<grpc::Slice> pieces(1, grpc::Slice("earlier", 7));  // appended to
    PayloadHash xxh64(PayloadHash::Kind::kXxh64);
    absl::StatusOr<ReadFrame> read = ParseFrame(frame, payload.size(), &xxh64, &pieces);
    REQUIRE(read.ok());
    CHECK_FALSE(read->header);
    CHECK(read->payload_bytes == payload.size());
    std::string got;
    for (const grpc::Slice& piece : pieces) got.append(reinterpret_cast<const char*>(piece.begin()), piece.size());
    CHECK(got == "earlier" + std::string(payload.begin(), payload.end()));
    // Read in place: the last piece is the frame's own last slice, not a copy.
    CHECK(pieces.back().end() == frame_slices.back().end());
    CHECK(xxh64.Digest() == XXH64(payload.data(), payload.size(), 0));
    PayloadHash xxh3(PayloadHash::Kind::kXxh3);
    REQUIRE(ParseFrame(frame, payload.size(), &xxh3, nullptr).ok());
    CHECK(xxh3.Digest() == XXH3_64bits(payload.data(), payload.size()));
    CHECK(xxh3.Digest() == PayloadHash::Of(PayloadHash::Kind::kXxh3, payload));
  }
  // One byte more than the room left is refused.
  CHECK_FALSE(ParseFrame(Sliced(wire, {}), payload.size() - 1, nullptr, nullptr).ok());

  v1::FeedHeader header;
  header.set_count(3);
  header.set_payload_bytes(payload.size());
  header.set_payload_xxh64(0x0123456789abcdefULL);
  header.add_failed()->set_path("a/b.jpg");
  v1::FeedFrame framed;
  *framed.mutable_header() = header;
  CHECK(Flat(HeaderFrame(header)) == framed.SerializeAsString());
  absl::StatusOr<ReadFrame> read =
      ParseFrame(Sliced(framed.SerializeAsString(), {1}), 0, nullptr, nullptr);
  REQUIRE(read.ok());
  REQUIRE(read->header);
  CHECK(read->header->SerializeAsString() == header.SerializeAsString());
}

TEST_CASE("Feed frames: a payload frame is the answer's own bytes, kept alive until gRPC lets go "
          "of the frame's last slice",
          "[feeder]") {
  auto answer = std::make_shared<std::vector<uint8_t>>(70'000, uint8_t{9});
  std::weak_ptr<std::vector<uint8_t>> watch = answer;
  const std::span<const uint8_t> bytes(answer->data() + 1000, 60'000);
  grpc::ByteBuffer frame = PayloadFrame(bytes, std::move(answer));
  std::vector<grpc::Slice> slices;
  REQUIRE(frame.Dump(&slices).ok());
  // Not copied: the payload's slice is the answer's memory.
  REQUIRE(slices.size() == 2);
  CHECK(slices[1].begin() == bytes.data());
  CHECK(slices[1].size() == bytes.size());
  frame.Clear();
  CHECK_FALSE(watch.expired());  // a slice is still held (here, as gRPC would while sending)
  slices.erase(slices.begin());
  CHECK_FALSE(watch.expired());
  slices.clear();
  CHECK(watch.expired());  // the last one let go: so is the answer
}

TEST_CASE("Feed frames: a frame that is no FeedFrame, empty, or longer than the answer is refused",
          "[feeder]") {
  const auto refusal = [&](const std::string& wire) {
    absl::StatusOr<ReadFrame> read = ParseFrame(Sliced(wire, {}), 100, nullptr, nullptr);
    return read.ok() ? std::string("accepted") : std::string(read.status().message());
  };
  const std::vector<uint8_t> big(101, 1);
  CHECK(refusal(Flat(PayloadFrame(big, nullptr))) ==
        "its answer's payload is longer than its header said");
  CHECK(refusal("") == "its answer held an empty frame");
  // A length past the frame's end, and a truncated length.
  CHECK(refusal(std::string("\x12\x05" "abc", 5)).find("no FeedFrame") != std::string::npos);
  CHECK(refusal(std::string("\x12\xff", 2)).find("no FeedFrame") != std::string::npos);
  CHECK(refusal("\xff\xff\xff").find("no FeedFrame") != std::string::npos);
  // Another encoder's payload (a field of its own after it) is still read, through protobuf.
  v1::FeedFrame padded;
  padded.set_payload("xyz");
  std::string wire = padded.SerializeAsString() + std::string("\x12\x02" "uv", 4);  // last wins
  std::vector<grpc::Slice> pieces;
  absl::StatusOr<ReadFrame> read = ParseFrame(Sliced(wire, {2}), 100, nullptr, &pieces);
  REQUIRE(read.ok());
  CHECK(read->payload_bytes == 2);
  REQUIRE(pieces.size() == 1);
  CHECK(std::string(reinterpret_cast<const char*>(pieces[0].begin()), 2) == "uv");
}

}  // namespace
}  // namespace ringloader::server
