// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/feed_frames.h"

#include <grpc/slice.h>

#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ringloader::server {
namespace {

// FeedFrame's payload: field 2, length-delimited.
constexpr uint8_t kPayloadTag = (2 << 3) | 2;
constexpr size_t kMostVarintBytes = 10;

size_t PutVarint(uint64_t v, uint8_t* out) {
  size_t n = 0;
  while (v >= 0x80) {
    out[n++] = static_cast<uint8_t>(v | 0x80);
    v >>= 7;
  }
  out[n++] = static_cast<uint8_t>(v);
  return n;
}

// Copies `bytes` of `slices` from `skip` on into `dest`.
void CopyOut(const std::vector<grpc::Slice>& slices, size_t skip, size_t bytes, uint8_t* dest) {
  for (const grpc::Slice& slice : slices) {
    if (bytes == 0) break;
    if (skip >= slice.size()) {
      skip -= slice.size();
      continue;
    }
    const size_t n = std::min(slice.size() - skip, bytes);
    std::memcpy(dest, slice.begin() + skip, n);
    dest += n;
    bytes -= n;
    skip = 0;
  }
}

// A payload slice's reference to what keeps its bytes (PayloadFrame), let go with the slice.
void LetGo(void* owner) { delete static_cast<std::shared_ptr<const void>*>(owner); }

}  // namespace

PayloadHash::PayloadHash(Kind kind) : kind_(kind) {
  if (kind_ == Kind::kXxh3) {
    xxh3_ = XXH3_createState();
    if (xxh3_ == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(xxh3_);
  } else {
    xxh64_ = XXH64_createState();
    if (xxh64_ == nullptr) throw std::bad_alloc();
    XXH64_reset(xxh64_, 0);
  }
}

PayloadHash::~PayloadHash() {
  if (xxh3_ != nullptr) XXH3_freeState(xxh3_);
  if (xxh64_ != nullptr) XXH64_freeState(xxh64_);
}

void PayloadHash::Update(std::span<const uint8_t> bytes) {
  if (xxh3_ != nullptr) {
    XXH3_64bits_update(xxh3_, bytes.data(), bytes.size());
  } else {
    XXH64_update(xxh64_, bytes.data(), bytes.size());
  }
}

uint64_t PayloadHash::Digest() const {
  return xxh3_ != nullptr ? XXH3_64bits_digest(xxh3_) : XXH64_digest(xxh64_);
}

uint64_t PayloadHash::Of(Kind kind, std::span<const uint8_t> bytes) {
  return kind == Kind::kXxh3 ? XXH3_64bits(bytes.data(), bytes.size())
                             : XXH64(bytes.data(), bytes.size(), 0);
}

grpc::ByteBuffer HeaderFrame(const v1::FeedHeader& header) {
  v1::FeedFrame frame;
  *frame.mutable_header() = header;
  grpc::Slice slice(frame.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer PayloadFrame(std::span<const uint8_t> bytes, std::shared_ptr<const void> owner) {
  uint8_t prefix[1 + kMostVarintBytes];
  prefix[0] = kPayloadTag;
  const size_t prefix_bytes = 1 + PutVarint(bytes.size(), prefix + 1);
  grpc::Slice slices[2] = {
      grpc::Slice(prefix, prefix_bytes),
      grpc::Slice(grpc_slice_new_with_user_data(
                      const_cast<uint8_t*>(bytes.data()), bytes.size(), &LetGo,
                      new std::shared_ptr<const void>(std::move(owner))),
                  grpc::Slice::STEAL_REF)};
  return grpc::ByteBuffer(slices, 2);
}

absl::StatusOr<ReadFrame> ParseFrame(const grpc::ByteBuffer& frame, uint64_t room,
                                     PayloadHash* hash, std::vector<grpc::Slice>* pieces) {
  std::vector<grpc::Slice> slices;
  if (!frame.Dump(&slices).ok()) return absl::DataLossError("an answer's frame was unreadable");
  size_t total = 0;
  for (const grpc::Slice& slice : slices) total += slice.size();
  // Its first bytes: the field's tag and length, whichever slices they are in.
  uint8_t prefix[1 + kMostVarintBytes];
  const size_t have = std::min(total, sizeof(prefix));
  CopyOut(slices, 0, have, prefix);
  uint64_t length = 0;
  size_t prefix_bytes = 0;
  if (have > 1 && prefix[0] == kPayloadTag) {
    for (size_t i = 1, shift = 0; i < have && shift < 64; ++i, shift += 7) {
      length |= static_cast<uint64_t>(prefix[i] & 0x7f) << shift;
      if ((prefix[i] & 0x80) == 0) {
        prefix_bytes = i + 1;
        break;
      }
    }
  }
  ReadFrame read;
  const auto keep = [&](grpc::Slice piece) {
    if (piece.size() == 0) return;
    if (hash != nullptr) hash->Update({piece.begin(), piece.size()});
    if (pieces != nullptr) pieces->push_back(std::move(piece));
  };
  if (prefix_bytes > 0 && length == total - prefix_bytes) {  // a payload, and nothing else
    if (length > room) {
      return absl::DataLossError("its answer's payload is longer than its header said");
    }
    size_t skip = prefix_bytes;
    for (const grpc::Slice& slice : slices) {
      if (skip >= slice.size()) {
        skip -= slice.size();
        continue;
      }
      keep(skip == 0 ? slice : slice.sub(skip, slice.size()));  // a reference, not a copy
      skip = 0;
    }
    read.payload_bytes = length;
    return read;
  }
  // Anything else (a header, or an encoding this end does not write) is parsed whole.
  std::string bytes(total, '\0');
  CopyOut(slices, 0, total, reinterpret_cast<uint8_t*>(bytes.data()));
  v1::FeedFrame parsed;
  if (!parsed.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("its answer held a frame of ", total,
                                            " bytes that is no FeedFrame"));
  }
  if (parsed.has_header()) {
    read.header = std::move(*parsed.mutable_header());
    return read;
  }
  if (!parsed.has_payload()) return absl::DataLossError("its answer held an empty frame");
  if (parsed.payload().size() > room) {
    return absl::DataLossError("its answer's payload is longer than its header said");
  }
  keep(grpc::Slice(parsed.payload()));
  read.payload_bytes = parsed.payload().size();
  return read;
}

}  // namespace ringloader::server
