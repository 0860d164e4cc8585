// SPDX-License-Identifier: Apache-2.0
#include "client/held_batches.h"

#include <utility>

namespace ringloader::client {

void ReleaseQueue::Push(const PendingRelease& release) {
  if (release.copied_out) copied_out_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back(release);
}

std::vector<PendingRelease> ReleaseQueue::Drain() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::exchange(pending_, {});
}

uint32_t MaxHeldInRing(uint32_t slot_count) {
  return slot_count >= 3 ? slot_count - 2 : (slot_count == 2 ? 1 : 0);
}

SlotViews::SlotViews(std::shared_ptr<const shm::ConsumerRing> ring, shm::SlotAccess access)
    : ring_(std::move(ring)), access_(access), idle_(ring_->slot_count()) {}

absl::StatusOr<shm::SlotMapping> SlotViews::Take(uint32_t slot) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (slot < idle_.size() && idle_[slot].has_value()) {
      shm::SlotMapping view = *std::move(idle_[slot]);
      idle_[slot].reset();
      return view;
    }
  }
  return ring_->MapSlot(slot, access_);
}

void SlotViews::Give(uint32_t slot, shm::SlotMapping view) {
  // A private page left from the trainer's writes must not show through in the next batch: if it
  // cannot be dropped, the mapping is not reused.
  if (!view.DropPrivatePages().ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (slot < idle_.size() && !idle_[slot].has_value()) idle_[slot] = std::move(view);
}

HeldBatch::HeldBatch(shm::SlotMapping view, std::shared_ptr<SlotViews> views,
                     std::shared_ptr<ReleaseQueue> releases, PendingRelease lease,
                     uint64_t used_bytes)
    : views_(std::move(views)),
      releases_(std::move(releases)),
      lease_(lease),
      used_bytes_(used_bytes),
      view_(std::move(view)) {}

bool HeldBatch::in_ring() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kInRing;
}

void HeldBatch::BatchDestroyed() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ == State::kInRing) {
    releases_->Push(lease_);
    views_->Give(lease_.slot, std::move(view_));
  }
  view_ = shm::SlotMapping();  // a copied-out batch's private memory
  state_ = State::kGone;
}

absl::StatusOr<bool> HeldBatch::CopyOut() {
  std::lock_guard<std::mutex> lock(mu_);
  if (state_ != State::kInRing) return false;
  if (absl::Status s = view_.CopyOut(used_bytes_); !s.ok()) return s;
  PendingRelease release = lease_;
  release.copied_out = true;
  releases_->Push(release);
  state_ = State::kCopiedOut;
  return true;
}

}  // namespace ringloader::client
