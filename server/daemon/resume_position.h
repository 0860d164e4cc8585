// SPDX-License-Identifier: Apache-2.0
#pragma once
// Where a stream opened at a saved position starts its first epoch (issue 30: resume at another
// world size, exactly once). The request's start_progress and saved_world come from a client's
// state, so they are untrusted: every value is checked against the dataset before any is used.

#include <cstdint>

#include "absl/status/statusor.h"
#include "proto/resume_limits.h"
#include "proto/ringloader.pb.h"
#include "server/pipeline/epoch_progress.h"

namespace ringloader::server {

// kWholeShard in SavedWorld.cursors: the rank finished the epoch.
inline constexpr uint64_t kWholeShard = ~uint64_t{0};
// Bounds a request's saved world (each rank costs the daemon work and memory): the client's
// bound too (see proto/resume_limits.h). The beyond lists, the request's and the one a saved
// world leaves, are held to wire::kMaxBeyondPositions.
inline constexpr uint32_t kMaxSavedWorldSize = wire::kMaxWorldSize;

// The progress `request`'s first epoch (start.epoch) continues after: start_progress, advanced
// by saved_world's cursors when it is set. `spec` is the validated spec (world_size >= 1).
// InvalidArgument naming the field and the rule for a progress outside the dataset, beyond not
// ascending or longer than wire::kMaxBeyondPositions, a saved world whose cursors do not fit its
// shards or leave more than wire::kMaxBeyondPositions consumed positions past the first one not
// consumed (counted before any is built: memory stays O(world + kMaxBeyondPositions), whatever
// the dataset's size), or a saved world with a start other than the epoch's beginning. Also
// checks start.cursor against the resumed shard.
absl::StatusOr<pipeline::EpochProgress> StartProgressOf(const v1::OpenStreamRequest& request,
                                                        const v1::StreamSpec& spec,
                                                        uint64_t dataset_size);

void ToProto(const pipeline::EpochProgress& progress, v1::EpochProgress* out);

}  // namespace ringloader::server
