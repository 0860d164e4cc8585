// SPDX-License-Identifier: Apache-2.0
// Elastic restarts on the client's side (issue 30): the v3 state's progress and a job's cursors,
// ContinueState's two paths and its refusals, CombineStates' checks. The daemon's half is in
// tests/integration/elastic_resume_test.cc.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "client/client.h"

namespace ringloader::client {
namespace {

StreamOptions JobOptions(uint32_t rank, uint32_t world, uint32_t batch_size = 8) {
  StreamOptions o;
  o.dataset = "train";
  o.batch_size = batch_size;
  o.seed = 7;
  o.rank = rank;
  o.world_size = world;
  o.dataset_fingerprint = 0xabcdef;
  return o;
}

std::string RankState(uint32_t rank, uint32_t world, Position at, EpochProgress progress = {}) {
  StreamOptions o = JobOptions(rank, world);
  o.start_progress = std::move(progress);
  return FormatState(o, at);
}

std::string Refusal(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInvalidArgument);
    return e.what();
  }
  FAIL("accepted");
  return "";
}

TEST_CASE("Elastic state: a v2 state an earlier release wrote still loads", "[client][elastic]") {
  // Written by ringloader 0.13's format_state (state format v2), literally.
  const std::string v2 =
      "ringloader-state v2 dataset=imagenet batch_size=64 seed=5 rank=1 world_size=2 "
      "image_size=224 augment=train dtype=uint8 layout=nhwc shuffle=1 drop_last=0 end_epoch=0 "
      "ring_slots=0 epoch=1 sequence=7 cursor=450 fingerprint=0000000000001234 "
      "check=d9c58a39b5026b4c end";
  const ResumeState s = ParseState(v2);
  CHECK(s.options.rank == 1);
  CHECK(s.options.start == Position{1, 7, 450});
  CHECK(s.options.start_progress.empty());
  CHECK(s.world_cursors.empty());
  // Loaded into its own world it continues exactly; into another it reshards.
  const Continuation same = ContinueState(s, s.options);
  CHECK(same.options.start == Position{1, 7, 450});
  CHECK(same.options.saved_world.world_size == 0);
  StreamOptions three = s.options;
  three.world_size = 3;
  const Continuation other = ContinueState(s, three);
  CHECK(other.options.saved_world.world_size == 2);
  // Every rank counted at sequence * batch_size: the same whichever rank's state is loaded.
  CHECK(other.options.saved_world.cursors == std::vector<uint64_t>{448, 448});
  CHECK(other.options.start == Position{1, 0, 0});
}

TEST_CASE("Elastic state: progress, beyond and a job's cursors survive the text",
          "[client][elastic]") {
  StreamOptions o = JobOptions(0, 3);
  o.start_progress = EpochProgress{120, {121, 125, 400}};
  const std::string text = FormatState(o, Position{4, 0, 0}, {16, SavedWorld::kWholeShard, 17});
  CHECK(text.rfind("ringloader-state v3 ", 0) == 0);
  CHECK(text.find(" progress=120 beyond=121,125,400 cursors=16,end,17 ") != std::string::npos);
  const ResumeState s = ParseState(text);
  CHECK(s.options.start_progress == o.start_progress);
  CHECK(s.world_cursors == std::vector<uint64_t>{16, SavedWorld::kWholeShard, 17});

  // Each field's rule, against a state whose check is right (FormatState writes what it is given).
  StreamOptions bad = o;
  bad.start_progress = EpochProgress{120, {121, 121}};
  CHECK_THAT(Refusal([&] { ParseState(FormatState(bad, Position{4, 0, 0})); }),
             Catch::Contains("'beyond'") && Catch::Contains("ascend"));
  CHECK_THAT(Refusal([&] { ParseState(FormatState(o, Position{4, 0, 0}, {1, 2})); }),
             Catch::Contains("'cursors'") && Catch::Contains("one per rank of world_size 3"));
  CHECK_THAT(Refusal([&] { ParseState(FormatState(o, Position{4, 1, 8}, {1, 2, 3})); }),
             Catch::Contains("'cursors'"));
  // A v2 line cannot carry the new fields.
  std::string v2 = FormatState(o, Position{4, 0, 0});
  v2.replace(v2.find(" v3 "), 4, " v2 ");
  CHECK_THAT(Refusal([&] { ParseState(v2); }), Catch::Contains("'check'"));
}

TEST_CASE("Elastic state: a forged world size, cursor list, beyond list or text is refused "
          "naming the field and the limit, before anything is sized by it",
          "[client][elastic]") {
  // The check is unkeyed, so an edited state loads: FormatState writes one whose check is right.
  StreamOptions forged = JobOptions(1, 2);
  forged.world_size = uint32_t{1} << 31;  // ContinueState assigned a cursor per saved rank: 16 GiB
  CHECK_THAT(Refusal([&] { ParseState(FormatState(forged, Position{1, 2, 16})); }),
             Catch::Contains("field 'world_size': must be in [1, 65536] (got 2147483648)"));
  // A ResumeState built by hand is held to the same bound.
  ResumeState by_hand;
  by_hand.options = forged;
  CHECK_THAT(Refusal([&] { ContinueState(by_hand, JobOptions(0, 4)); }),
             Catch::Contains("world_size must be in [1, 65536] (got 2147483648)"));
  // The largest world parses.
  StreamOptions widest = JobOptions(0, 65536);
  CHECK(ParseState(FormatState(widest, Position{1, 0, 0},
                               std::vector<uint64_t>(65536, 3))).world_cursors.size() == 65536);

  // More cursors than ranks: refused at the first one too many, not after storing them all.
  CHECK_THAT(Refusal([&] { ParseState(FormatState(JobOptions(0, 3), Position{1, 0, 0},
                                                  {1, 2, 3, 4})); }),
             Catch::Contains("field 'cursors': more than 3 values (one per rank of world_size 3)"));

  // beyond: at most 65,536 positions.
  StreamOptions progress = JobOptions(0, 2);
  progress.start_progress.prefix = 10;
  for (uint64_t p = 11; p < 11 + 65536; ++p) progress.start_progress.beyond.push_back(p);
  CHECK(ParseState(FormatState(progress, Position{1, 0, 0})).options.start_progress ==
        progress.start_progress);
  progress.start_progress.beyond.push_back(11 + 65536);
  CHECK_THAT(Refusal([&] { ParseState(FormatState(progress, Position{1, 0, 0})); }),
             Catch::Contains("field 'beyond': more than 65536 values"));
  CHECK_THAT(Refusal([&] { ValidateOptions(progress); }),
             Catch::Contains("StreamOptions.start_progress.beyond: at most 65536 positions (got "
                             "65537)"));

  // A text longer than any state: refused before it is split.
  CHECK_THAT(Refusal([&] { ParseState(std::string(5 << 20, ' ')); }),
             Catch::Contains("5242880 bytes, more than the 4194304 a state can be"));

  // The options a stream is opened with, likewise.
  StreamOptions wide = JobOptions(0, 2);
  wide.world_size = 65537;
  CHECK_THAT(Refusal([&] { ValidateOptions(wide); }),
             Catch::Contains("StreamOptions.world_size: must be in [1, 65536] (got 65537)"));
  wide = JobOptions(0, 2);
  wide.saved_world.world_size = 65537;
  CHECK_THAT(Refusal([&] { ValidateOptions(wide); }),
             Catch::Contains("StreamOptions.saved_world.world_size: must be in [1, 65536] (got "
                             "65537)"));
}

TEST_CASE("Elastic state: the same world, rank and batch size continue the saved stream itself",
          "[client][elastic]") {
  const EpochProgress progress{30, {33}};
  const ResumeState s = ParseState(RankState(1, 2, Position{2, 3, 26}, progress));
  StreamOptions mine = JobOptions(1, 2);
  mine.client_name = "trainer";
  mine.end_epoch = 9;  // not part of the run: the caller's wins
  const Continuation c = ContinueState(s, mine);
  CHECK(c.options.start == Position{2, 3, 26});
  CHECK(c.options.start_progress == progress);
  CHECK(c.options.saved_world.world_size == 0);
  CHECK(c.options.dataset_fingerprint == 0xabcdef);
  CHECK(c.options.client_name == "trainer");
  CHECK(c.options.end_epoch == 9);
  CHECK(c.warning.empty());
}

TEST_CASE("Elastic state: another world, rank or batch size sends the saved world's cursors",
          "[client][elastic]") {
  // Rank 2 of 4 took 5 batches of 8 with no skip: every rank is at cursor 40.
  const ResumeState lockstep = ParseState(RankState(2, 4, Position{0, 5, 40}));
  for (const StreamOptions& mine : {JobOptions(0, 2), JobOptions(2, 4, 16), JobOptions(3, 4)}) {
    const Continuation c = ContinueState(lockstep, mine);
    CHECK(c.options.start == Position{0, 0, 0});
    CHECK(c.options.saved_world.world_size == 4);
    CHECK(c.options.saved_world.cursors == std::vector<uint64_t>(4, 40));
    CHECK(c.options.batch_size == mine.batch_size);
    CHECK(c.warning.empty());
  }
  // Rank 1 of 3 skipped 2 bad samples: every rank counts at the lower bound (the same progress
  // whichever rank's state each new rank loads), and the caller is told what that may cost.
  const ResumeState skipped = ParseState(RankState(1, 3, Position{0, 5, 42}));
  const Continuation c = ContinueState(skipped, JobOptions(0, 2));
  CHECK(c.options.saved_world.cursors == std::vector<uint64_t>{40, 40, 40});
  CHECK_THAT(c.warning, Catch::Contains("skipped 2 bad sample(s)") &&
                            Catch::Contains("about 6") && Catch::Contains("CombineStates"));
  // Also at world 1 with another batch size: the skipped positions are read again.
  const ResumeState alone = ParseState(RankState(0, 1, Position{0, 5, 41}));
  CHECK_THAT(ContinueState(alone, JobOptions(0, 1, 16)).warning,
             Catch::Contains("skipped 1 bad sample(s)"));
}

TEST_CASE("Elastic state: options that change the samples' order or bytes are refused by name",
          "[client][elastic]") {
  const ResumeState s = ParseState(RankState(0, 2, Position{0, 1, 8}));
  StreamOptions mine = JobOptions(0, 3);
  mine.seed = 8;
  CHECK_THAT(Refusal([&] { ContinueState(s, mine); }),
             Catch::Contains("the state was saved with seed=7, these options have seed=8"));
  mine = JobOptions(0, 3);
  mine.shuffle = false;
  CHECK_THAT(Refusal([&] { ContinueState(s, mine); }), Catch::Contains("shuffle=1"));
  mine = JobOptions(0, 3);
  mine.augment = Augment::kEval;
  CHECK_THAT(Refusal([&] { ContinueState(s, mine); }), Catch::Contains("augment=train"));
  mine = JobOptions(0, 3);
  mine.dataset = "val";
  CHECK_THAT(Refusal([&] { ContinueState(s, mine); }), Catch::Contains("dataset=train"));
}

TEST_CASE("Elastic state: CombineStates makes one job state from every rank's",
          "[client][elastic]") {
  // Rank 1 finished the epoch (it is at the next one's start); ranks 0 and 2 skipped differently.
  const std::vector<std::string> states = {
      RankState(2, 3, Position{1, 4, 35}, EpochProgress{9, {}}),
      RankState(0, 3, Position{1, 4, 33}, EpochProgress{9, {}}),
      RankState(1, 3, Position{2, 0, 0})};
  const ResumeState job = ParseState(CombineStates(states));
  CHECK(job.world_cursors == std::vector<uint64_t>{33, SavedWorld::kWholeShard, 35});
  CHECK(job.options.start == Position{1, 0, 0});
  CHECK(job.options.start_progress == EpochProgress{9, {}});
  // Loaded anywhere, even into the same world, it sends every rank's cursor.
  for (const StreamOptions& mine : {JobOptions(0, 3), JobOptions(1, 5)}) {
    const Continuation c = ContinueState(job, mine);
    CHECK(c.options.saved_world.cursors == job.world_cursors);
    CHECK(c.options.start_progress == EpochProgress{9, {}});
    CHECK(c.warning.empty());
  }
}

TEST_CASE("Elastic state: CombineStates refuses states that are not one checkpoint, naming why",
          "[client][elastic]") {
  const std::string r0 = RankState(0, 2, Position{1, 2, 16});
  const std::string r1 = RankState(1, 2, Position{1, 2, 17});
  CHECK_NOTHROW(CombineStates({r0, r1}));
  CHECK_THAT(Refusal([&] { CombineStates({r0}); }), Catch::Contains("needs 2 states, got 1"));
  CHECK_THAT(Refusal([&] { CombineStates({r0, r0}); }), Catch::Contains("rank 0 is given twice"));
  StreamOptions other = JobOptions(1, 2);
  other.batch_size = 16;
  CHECK_THAT(Refusal([&] { CombineStates({r0, FormatState(other, Position{1, 1, 16})}); }),
             Catch::Contains("rank 0 has batch_size=8, rank 1 has batch_size=16"));
  CHECK_THAT(Refusal([&] { CombineStates({r0, RankState(1, 2, Position{3, 0, 0})}); }),
             Catch::Contains("rank 1 is at epoch 3") && Catch::Contains("rank 0 is at epoch 1"));
  CHECK_THAT(Refusal([&] { CombineStates({r0, RankState(1, 2, Position{2, 1, 8})}); }),
             Catch::Contains("rank 1 is at epoch 2 cursor 8"));
  CHECK_THAT(
      Refusal([&] { CombineStates({r0, RankState(1, 2, Position{1, 2, 16}, EpochProgress{4, {}})}); }),
      Catch::Contains("after different progress"));
  const std::string job = CombineStates({r0, r1});
  CHECK_THAT(Refusal([&] { CombineStates({job, r1}); }), Catch::Contains("already a job's"));
}

}  // namespace
}  // namespace ringloader::client
