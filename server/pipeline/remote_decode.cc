// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/remote_decode.h"

#include <algorithm>
#include <set>

namespace ringloader::pipeline {

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
    } else if (!ages || ++h.passed < 2) {
      kept.push_back(std::move(h));  // for a round to come
    }
  }
  held_ = std::move(kept);
  return claimed;
}

}  // namespace ringloader::pipeline
