// SPDX-License-Identifier: Apache-2.0
#pragma once
// Bounds on a resume position: a state's world size, its cursors and its beyond list. A state is
// checked with an unkeyed checksum, so anyone can write one that loads; every count in it is
// bounded where it is parsed (the client's ParseState, the daemon's StartProgressOf) before
// anything is allocated for it, and both sides use these same numbers, so a state one side
// accepts the other does not refuse for its size.

#include <cstdint>

namespace ringloader::wire {

// Ranks in one job: a StreamSpec's world_size, a SavedWorld's world_size and cursors, a state's
// world_size and cursors. 65,536 ranks is far past any data-parallel job we know of (the daemon
// has refused more since its first version); each saved rank costs a cursor (8 bytes) in the
// trainer and the daemon, and up to 10 bytes in an OpenStream request.
inline constexpr uint32_t kMaxWorldSize = 1 << 16;

// Consumed positions an epoch's progress carries above its prefix (EpochProgress::beyond): the
// ranks' lead over the slowest one (bad samples skipped), a few per rank in a real job. 65,536 of
// them take at most 320 KiB in an OpenStream request (5 bytes each for a dataset below 2^32
// samples), so with a saved world's cursors at their widest (65,536 x 10 bytes) the request
// stays under the daemon's 1 MiB request limit; and at most 1.3 MiB of state text.
inline constexpr uint64_t kMaxBeyondPositions = 1 << 16;

// A state's text (client::FormatState), whole: room for kMaxWorldSize cursors and
// kMaxBeyondPositions positions at their widest (21 bytes each: 2.6 MiB) and the fixed fields.
// A reader refuses a longer text before reading further.
inline constexpr uint64_t kMaxStateBytes = 4 << 20;

}  // namespace ringloader::wire
