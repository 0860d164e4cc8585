// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/remote_decode.h"

#include <algorithm>
#include <cstring>
#include <set>

namespace ringloader::pipeline {

AnswerView::AnswerView(std::span<const uint8_t> whole)
    : AnswerView(std::vector<std::span<const uint8_t>>{whole}) {}

AnswerView::AnswerView(std::vector<std::span<const uint8_t>> pieces) : pieces_(std::move(pieces)) {
  starts_.reserve(pieces_.size());
  for (const std::span<const uint8_t>& piece : pieces_) {
    starts_.push_back(size_);
    size_ += piece.size();
  }
}

void AnswerView::Copy(uint64_t offset, std::span<uint8_t> dest) const {
  // The piece holding `offset`: the last that starts at or before it.
  size_t p = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) -
                                 starts_.begin());
  uint8_t* out = dest.data();
  uint64_t left = dest.size();
  for (p = p == 0 ? 0 : p - 1; left > 0 && p < pieces_.size(); ++p) {
    const uint64_t skip = offset > starts_[p] ? offset - starts_[p] : 0;
    if (skip >= pieces_[p].size()) continue;  // an empty piece
    const uint64_t n = std::min<uint64_t>(pieces_[p].size() - skip, left);
    std::memcpy(out, pieces_[p].data() + skip, n);
    out += n;
    left -= n;
  }
}

int64_t AnswerView::Int64At(uint64_t offset) const {
  int64_t value = 0;
  Copy(offset, {reinterpret_cast<uint8_t*>(&value), sizeof(value)});
  return value;
}

std::vector<uint64_t> AheadCalls::Fresh(uint64_t epoch, std::span<const uint64_t> indices,
                                        size_t least) const {
  std::set<uint64_t> held;
  for (const Held& h : held_) {
    if (h.epoch == epoch) held.insert(h.call->indices().begin(), h.call->indices().end());
  }
  std::vector<uint64_t> fresh;
  for (uint64_t index : indices) {
    if (held.count(index) == 0) fresh.push_back(index);
  }
  if (fresh.size() < indices.size() && fresh.size() < least) fresh.clear();
  return fresh;
}

size_t AheadCalls::HeldHere() const {
  size_t n = 0;
  for (const Held& h : held_) {
    if (h.call->DecodedHere()) n += h.call->count();
  }
  return n;
}

void AheadCalls::Add(uint64_t epoch, std::unique_ptr<RemoteCall> call) {
  held_.push_back(Held{epoch, std::move(call), 0});
}

std::vector<std::unique_ptr<RemoteCall>> AheadCalls::Claim(uint64_t epoch,
                                                           std::span<const uint64_t> indices,
                                                           bool ages) {
  const std::set<uint64_t> wanted(indices.begin(), indices.end());
  std::vector<std::unique_ptr<RemoteCall>> claimed;
  std::vector<Held> kept;
  for (Held& h : held_) {
    const std::vector<uint64_t>& asks = h.call->indices();
    if (h.epoch == epoch &&
        std::any_of(asks.begin(), asks.end(), [&](uint64_t i) { return wanted.count(i) > 0; })) {
      claimed.push_back(std::move(h.call));
    } else if (!ages ||
               ++h.passed < (h.call->DecodedHere() ? kDecodeAheadRounds : kLeaseAheadRounds)) {
      kept.push_back(std::move(h));  // for a round to come
    }
  }
  held_ = std::move(kept);
  return claimed;
}

}  // namespace ringloader::pipeline
