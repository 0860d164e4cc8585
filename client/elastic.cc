// SPDX-License-Identifier: Apache-2.0
// Elastic restarts: continuing a state at another world size, rank or batch size
// (ContinueState) and one state for a whole job (CombineStates). See client.h.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/client.h"
#include "proto/resume_limits.h"

namespace ringloader::client {
namespace {

[[noreturn]] void Refuse(const std::string& why) {
  throw Error(ErrorCode::kInvalidArgument, why);
}

std::string Floats(const std::vector<float>& values) {
  return values.empty() ? "default" : absl::StrJoin(values, ",");
}

// The options a sample's place in the epoch's order, or its bytes, depend on: no resume across
// a change of any of them can be exact. As (name, value) for messages.
std::vector<std::pair<const char*, std::string>> RunKeys(const StreamOptions& o) {
  return {{"dataset", o.dataset},
          {"seed", absl::StrCat(o.seed)},
          {"shuffle", o.shuffle ? "1" : "0"},
          {"image_size", absl::StrCat(o.image_size)},
          {"augment", o.augment == Augment::kEval ? "eval" : "train"},
          {"dtype", DTypeName(o.dtype)},
          {"layout", o.layout == Layout::kNCHW ? "nchw" : "nhwc"},
          {"resize", o.resize == Resize::kExact ? "exact" : "fast"},
          {"mean", Floats(o.mean)},
          {"std", Floats(o.std)}};
}

// The first of `keys` whose values differ, as "name=a ... name=b", or "" when all agree.
std::string FirstDifference(const std::vector<std::pair<const char*, std::string>>& a,
                            const std::vector<std::pair<const char*, std::string>>& b,
                            const char* a_is, const char* b_is) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].second != b[i].second) {
      return absl::StrCat(a_is, " ", a[i].first, "=", a[i].second, ", ", b_is, " ", b[i].first,
                          "=", b[i].second);
    }
  }
  return "";
}

// Everything one job's ranks share (all but rank and position).
std::vector<std::pair<const char*, std::string>> JobKeys(const StreamOptions& o) {
  auto keys = RunKeys(o);
  keys.insert(keys.end(), {{"batch_size", absl::StrCat(o.batch_size)},
                           {"world_size", absl::StrCat(o.world_size)},
                           {"drop_last", o.drop_last ? "1" : "0"},
                           {"fingerprint", absl::StrCat(absl::Hex(o.dataset_fingerprint))},
                           {"end_epoch", absl::StrCat(o.end_epoch)}});
  return keys;
}

std::string ProgressText(const EpochProgress& p) {
  return p.empty() ? "none"
                   : absl::StrCat(p.prefix, p.beyond.empty() ? "" : " + ", p.beyond.size());
}

}  // namespace

Continuation ContinueState(const ResumeState& state, const StreamOptions& options) {
  const StreamOptions& saved = state.options;
  // ParseState bounds these; a ResumeState built by hand is held to the same bounds before a
  // cursor is assigned per saved rank below.
  if (saved.world_size == 0 || saved.world_size > wire::kMaxWorldSize) {
    Refuse(absl::StrCat("the state's world_size must be in [1, ", wire::kMaxWorldSize, "] (got ",
                        saved.world_size, ")"));
  }
  if (!state.world_cursors.empty() && state.world_cursors.size() != saved.world_size) {
    Refuse(absl::StrCat("the state's cursors: one per rank of world_size ", saved.world_size,
                        " (got ", state.world_cursors.size(), ")"));
  }
  const std::string difference =
      FirstDifference(RunKeys(saved), RunKeys(options), "the state was saved with", "these options have");
  if (!difference.empty()) {
    Refuse(absl::StrCat(difference,
                        ": a resume across it cannot be exact (it changes the samples' order or "
                        "bytes); start a new run, or use the state's value"));
  }
  Continuation c;
  c.options = options;
  c.options.dataset_fingerprint = saved.dataset_fingerprint;
  c.options.start_progress = saved.start_progress;
  c.options.saved_world = SavedWorld{};
  const bool same_stream = state.world_cursors.empty() && saved.world_size == options.world_size &&
                           saved.rank == options.rank && saved.batch_size == options.batch_size &&
                           saved.drop_last == options.drop_last;
  if (same_stream) {
    c.options.start = saved.start;
    return c;
  }
  // The saved world's consumption, sharded anew by the daemon (which knows the dataset's size).
  c.options.start = Position{saved.start.epoch, 0, 0};
  SavedWorld& world = c.options.saved_world;
  world.world_size = saved.world_size;
  world.drop_last = saved.drop_last;
  world.cursors = state.world_cursors;
  if (world.cursors.empty()) {
    // One rank's state of a lockstep job: every rank took `sequence` batches, so each consumed
    // at least sequence * batch_size positions of its shard. Counting exactly that for every
    // rank, this one included, makes the job's progress the same whichever rank's state each new
    // rank loads (the new ranks' shares then fit together); a rank that skipped bad samples
    // consumed a few more positions, which are read again: repeats, never a miss.
    const uint64_t taken = saved.start.sequence * saved.batch_size;
    world.cursors.assign(saved.world_size, taken);
    const uint64_t skipped = saved.start.cursor - std::min(saved.start.cursor, taken);
    if (skipped > 0) {
      c.warning = absl::StrCat(
          "resuming from rank ", saved.rank, "'s state alone with another world size, rank or "
          "batch size: that rank skipped ", skipped, " bad sample(s) so far in epoch ",
          saved.start.epoch, ", and its state cannot say what the other ", saved.world_size - 1,
          " rank(s) skipped. Each skipped sample makes one sample be read twice (none is "
          "missed): ", skipped, " here, about ", skipped * saved.world_size,
          " if every rank skipped as many. Combine every rank's state (CombineStates, "
          "ringloader.combine_states) for an exact resume");
    }
  }
  return c;
}

std::string CombineStates(const std::vector<std::string>& texts) {
  if (texts.empty()) Refuse("CombineStates: no states given");
  std::vector<ResumeState> states;
  states.reserve(texts.size());
  for (const std::string& text : texts) states.push_back(ParseState(text));
  const StreamOptions& first = states.front().options;
  const uint32_t world = first.world_size;
  if (states.size() != world) {
    Refuse(absl::StrCat("CombineStates: a world of ", world, " ranks needs ", world,
                        " states, got ", states.size()));
  }
  std::vector<const ResumeState*> by_rank(world, nullptr);
  uint64_t epoch = first.start.epoch;
  uint32_t earliest = first.rank;  // a rank at `epoch`
  for (const ResumeState& s : states) {
    if (!s.world_cursors.empty()) Refuse("CombineStates: a state is already a job's state");
    const std::string difference = FirstDifference(JobKeys(first), JobKeys(s.options),
                                                   absl::StrCat("rank ", first.rank, " has").c_str(),
                                                   absl::StrCat("rank ", s.options.rank, " has").c_str());
    if (!difference.empty()) {
      Refuse(absl::StrCat("CombineStates: the states are not of one job: ", difference));
    }
    if (by_rank[s.options.rank] != nullptr) {
      Refuse(absl::StrCat("CombineStates: rank ", s.options.rank, " is given twice"));
    }
    by_rank[s.options.rank] = &s;
    if (s.options.start.epoch < epoch) {
      epoch = s.options.start.epoch;
      earliest = s.options.rank;
    }
  }
  // A rank at the very start of the next epoch finished this one (its whole shard); any other
  // difference of epochs, or of the progress the epoch continues after, is not one checkpoint.
  std::vector<uint64_t> cursors(world);
  const ResumeState* in_epoch = nullptr;
  for (uint32_t r = 0; r < world; ++r) {
    const StreamOptions& o = by_rank[r]->options;
    if (o.start.epoch == epoch) {
      if (in_epoch != nullptr && !(o.start_progress == in_epoch->options.start_progress)) {
        Refuse(absl::StrCat("CombineStates: ranks ", in_epoch->options.rank, " and ", r,
                            " continue epoch ", epoch, " after different progress (",
                            ProgressText(in_epoch->options.start_progress), " and ",
                            ProgressText(o.start_progress), " positions): not one checkpoint"));
      }
      in_epoch = by_rank[r];
      cursors[r] = o.start.cursor;
    } else if (o.start.epoch == epoch + 1 && o.start.cursor == 0 && o.start_progress.empty()) {
      cursors[r] = SavedWorld::kWholeShard;
    } else {
      Refuse(absl::StrCat("CombineStates: rank ", r, " is at epoch ", o.start.epoch, " cursor ",
                          o.start.cursor, " while rank ", earliest, " is at epoch ", epoch,
                          ": not one checkpoint (a rank may only be at the very start of the "
                          "next epoch)"));
    }
  }
  StreamOptions job = in_epoch->options;
  job.rank = 0;
  job.start = Position{epoch, 0, 0};
  return FormatState(job, job.start, cursors);
}

}  // namespace ringloader::client
