// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/resume_position.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ringloader::server {
namespace {

template <typename... Parts>
absl::Status Invalid(const Parts&... parts) {
  return absl::InvalidArgumentError(absl::StrCat(parts...));
}

absl::StatusOr<pipeline::EpochProgress> ProgressOf(const v1::EpochProgress& in,
                                                  uint64_t dataset_size) {
  pipeline::EpochProgress progress;
  progress.prefix = in.prefix();
  if (progress.prefix > dataset_size) {
    return Invalid("start_progress.prefix: must be <= the dataset's ", dataset_size,
                   " samples (got ", progress.prefix, ")");
  }
  if (static_cast<uint64_t>(in.beyond_size()) > dataset_size - progress.prefix) {
    return Invalid("start_progress.beyond: ", in.beyond_size(), " positions, but only ",
                   dataset_size - progress.prefix, " lie past prefix ", progress.prefix);
  }
  if (static_cast<uint64_t>(in.beyond_size()) > wire::kMaxBeyondPositions) {
    return Invalid("start_progress.beyond: at most ", wire::kMaxBeyondPositions,
                   " positions (got ", in.beyond_size(), ")");
  }
  uint64_t previous = progress.prefix;
  for (const uint64_t p : in.beyond()) {
    if (p <= previous || p >= dataset_size) {
      return Invalid("start_progress.beyond: positions must ascend, each in (prefix ",
                     progress.prefix, ", dataset size ", dataset_size, "); got ", p, " after ",
                     previous);
    }
    previous = p;
  }
  progress.beyond.assign(in.beyond().begin(), in.beyond().end());
  return progress;
}

}  // namespace

absl::StatusOr<pipeline::EpochProgress> StartProgressOf(const v1::OpenStreamRequest& request,
                                                        const v1::StreamSpec& spec,
                                                        uint64_t dataset_size) {
  absl::StatusOr<pipeline::EpochProgress> progress =
      ProgressOf(request.start_progress(), dataset_size);
  if (!progress.ok()) return progress.status();
  const v1::SavedWorld& saved = request.saved_world();
  if (saved.world_size() != 0) {
    if (saved.world_size() > kMaxSavedWorldSize) {
      return Invalid("saved_world.world_size: must be in [1, ", kMaxSavedWorldSize, "] (got ",
                     saved.world_size(), ")");
    }
    if (static_cast<uint64_t>(saved.cursors_size()) != saved.world_size()) {
      return Invalid("saved_world.cursors: one per rank of world_size ", saved.world_size(),
                     " (got ", saved.cursors_size(), ")");
    }
    if (request.start().sequence() != 0 || request.start().cursor() != 0) {
      return Invalid("start: must be the epoch's beginning (sequence 0, cursor 0) with a "
                     "saved_world (got sequence ", request.start().sequence(), ", cursor ",
                     request.start().cursor(), ")");
    }
    const uint64_t saved_shard = pipeline::ResumedShardSize(
        dataset_size, *progress, saved.world_size(), saved.drop_last());
    std::vector<uint64_t> cursors(saved.cursors().begin(), saved.cursors().end());
    for (size_t r = 0; r < cursors.size(); ++r) {
      if (cursors[r] == kWholeShard) cursors[r] = saved_shard;
      if (cursors[r] > saved_shard) {
        return Invalid("saved_world.cursors[", r, "]: ", cursors[r], " is past that rank's ",
                       saved_shard, "-sample shard of the saved world of ", saved.world_size(),
                       " (a state of another dataset, or altered?)");
      }
    }
    // Ranks far apart (one at 0, another at its shard's end) leave O(dataset) positions
    // consumed past the slowest rank's: counted first, refused past the bound.
    const uint64_t beyond = progress->BeyondAfterAdvance(dataset_size, saved.drop_last(), cursors);
    if (beyond > wire::kMaxBeyondPositions) {
      const auto [slowest, fastest] = std::minmax_element(cursors.begin(), cursors.end());
      return Invalid("saved_world.cursors: rank ", slowest - cursors.begin(), " at ", *slowest,
                     " and rank ", fastest - cursors.begin(), " at ", *fastest,
                     " leave ", beyond, " consumed positions past the first one not consumed; "
                     "a resume carries at most ", wire::kMaxBeyondPositions,
                     " (the ranks of one checkpoint are within a few batches of each other: "
                     "states of different checkpoints, or altered?)");
    }
    *progress = progress->Advance(dataset_size, saved.drop_last(), cursors);
  }
  const uint64_t shard =
      pipeline::ResumedShardSize(dataset_size, *progress, spec.world_size(), spec.drop_last());
  if (request.start().cursor() > shard) {
    return Invalid("start.cursor: must be <= the shard size ", shard, " (got ",
                   request.start().cursor(), ")");
  }
  return progress;
}

void ToProto(const pipeline::EpochProgress& progress, v1::EpochProgress* out) {
  out->set_prefix(progress.prefix);
  out->mutable_beyond()->Assign(progress.beyond.begin(), progress.beyond.end());
}

}  // namespace ringloader::server
