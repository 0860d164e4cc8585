// SPDX-License-Identifier: Apache-2.0
// Issue 30: a state resumes at another world size, rank or batch size, exactly once, through
// the real daemon and the C++ client. In every case the union of all ranks' samples per epoch is
// the dataset's good samples exactly once (DistributedSampler's padding excepted), each with the
// bytes an undisturbed world-1 run gave it.
#include <signal.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "client/client.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

constexpr uint32_t kImages = 62;  // a multiple of no world below: padding and drop_last matter
constexpr uint64_t kEpochs = 2;

client::StreamOptions Options(uint32_t rank, uint32_t world, uint32_t batch, bool drop_last) {
  client::StreamOptions o;
  o.dataset = "synth";
  o.batch_size = batch;
  o.seed = 3;
  o.rank = rank;
  o.world_size = world;
  o.image_size = 16;
  o.drop_last = drop_last;
  o.end_epoch = kEpochs;
  return o;
}

size_t Digest(const client::Batch& b, uint32_t i) {
  return std::hash<std::string_view>{}(std::string_view(
      reinterpret_cast<const char*>(b.sample_image(i)), b.sample_image_bytes()));
}

// What a run served: epoch -> sample index -> times, and each sample's bytes.
struct Served {
  std::map<uint64_t, std::map<uint64_t, int>> times;
  std::map<uint64_t, std::map<uint64_t, size_t>> digest;
  std::map<uint64_t, std::string> path;  // sample index -> relative path
  void Add(const client::Batch& b) {
    const int64_t* indices = b.indices().data<int64_t>();
    for (uint32_t i = 0; i < b.size(); ++i) {
      const uint64_t epoch = b.position().epoch, index = static_cast<uint64_t>(indices[i]);
      ++times[epoch][index];
      digest[epoch][index] = Digest(b, i);
      path[index] = std::string(b.relative_path(i));
    }
  }
};

// The ranks of one data-parallel job, each a stream of its own.
class Job {
 public:
  // A fresh job, or one continuing `state` (any rank's, or a job's from CombineStates).
  Job(const DaemonFixture& daemon, uint32_t world, uint32_t batch, bool drop_last,
      const std::string& state = "")
      : client_(daemon.endpoint()) {
    for (uint32_t r = 0; r < world; ++r) {
      client::StreamOptions o = Options(r, world, batch, drop_last);
      if (!state.empty()) {
        client::Continuation c = client::ContinueState(client::ParseState(state), o);
        if (!c.warning.empty()) warnings.push_back(c.warning);
        o = c.options;
      }
      ranks_.push_back(client_.Open(o));
    }
  }
  // Every rank takes up to `batches` batches (lockstep), or all it has left when 0.
  void Take(Served& served, uint64_t batches = 0) {
    for (auto& rank : ranks_) {
      for (uint64_t k = 0; batches == 0 || k < batches; ++k) {
        std::optional<client::Batch> b = rank->Next();
        if (!b) break;
        served.Add(*b);
      }
    }
  }
  std::string State(uint32_t rank) const { return ranks_.at(rank)->State(); }
  std::vector<std::string> States() const {
    std::vector<std::string> states;
    for (const auto& rank : ranks_) states.push_back(rank->State());
    return states;
  }
  uint64_t batches_per_epoch() const { return ranks_.front()->batches_per_epoch(); }
  std::vector<std::string> warnings;

 private:
  client::Client client_;
  std::vector<std::unique_ptr<client::Stream>> ranks_;
};

// Each epoch of `served` holds every sample of `good` with the reference's bytes: exactly once,
// but for at most `max_repeats` repeats (padding) and `max_missing` missing (drop_last).
void CheckExactlyOnce(const Served& served, const Served& reference, const std::set<uint64_t>& good,
                      uint64_t max_repeats, uint64_t max_missing) {
  REQUIRE(served.times.size() == kEpochs);
  for (const auto& [epoch, times] : served.times) {
    INFO("epoch " << epoch);
    uint64_t repeats = 0, missing = 0;
    for (const uint64_t index : good) {
      const auto it = times.find(index);
      if (it == times.end()) {
        ++missing;
        continue;
      }
      repeats += it->second - 1;
      INFO("sample " << index);
      CHECK(served.digest.at(epoch).at(index) == reference.digest.at(epoch).at(index));
    }
    for (const auto& [index, n] : times) CHECK(good.count(index) == 1);  // no bad one served
    CHECK(repeats <= max_repeats);
    CHECK(missing <= max_missing);
  }
}

struct Fixture {
  Fixture() : daemon(Opts()) {
    REQUIRE(daemon.Start());
    Job(daemon, 1, 4, false).Take(reference);
    for (uint64_t i = 0; i < kImages; ++i) all.insert(i);
    REQUIRE(reference.times.size() == kEpochs);
    REQUIRE(reference.times.at(0).size() == kImages);
  }
  static DaemonFixtureOptions Opts() {
    DaemonFixtureOptions o;
    o.images = kImages;
    return o;
  }
  DaemonFixture daemon;
  Served reference;
  std::set<uint64_t> all;
};

TEST_CASE("30: world 2 -> 3 -> 1 within one epoch reads every sample once, across a daemon kill",
          "[integration][elastic]") {
  Fixture f;
  Served served;
  Job two(f.daemon, 2, 4, false);
  two.Take(served, 3);
  Job three(f.daemon, 3, 4, false, two.State(1));  // one rank's state of a lockstep job
  CHECK(three.warnings.empty());
  three.Take(served, 1);
  // The daemon dies under the resumed streams: they reopen in the same resumed epoch.
  REQUIRE(kill(f.daemon.ServingPid(), SIGKILL) == 0);
  f.daemon.process().Wait();
  REQUIRE(f.daemon.Start());
  three.Take(served, 1);
  Job one(f.daemon, 1, 4, false, three.State(2));
  one.Take(served);
  CheckExactlyOnce(served, f.reference, f.all, /*max_repeats=*/0, /*max_missing=*/0);
}

TEST_CASE("30: world 4 -> 2 with a doubled per-rank batch size", "[integration][elastic]") {
  Fixture f;
  Served served;
  Job four(f.daemon, 4, 2, false);
  four.Take(served, 3);
  Job two(f.daemon, 2, 4, false, four.State(3));
  two.Take(served);
  CheckExactlyOnce(served, f.reference, f.all, /*max_repeats=*/1, 0);
}

TEST_CASE("30: a resize right before and right after an epoch boundary", "[integration][elastic]") {
  Fixture f;
  for (const bool after : {false, true}) {
    INFO((after ? "after" : "before") << " the boundary");
    Served served;
    Job two(f.daemon, 2, 4, false);
    const uint64_t per_epoch = two.batches_per_epoch();  // 31 samples a rank: 8 batches
    REQUIRE(per_epoch == 8);
    two.Take(served, after ? per_epoch : per_epoch - 1);
    const client::ResumeState saved = client::ParseState(two.State(0));
    CHECK(saved.options.start.epoch == (after ? 1u : 0u));
    Job three(f.daemon, 3, 4, false, two.State(0));
    three.Take(served);
    CheckExactlyOnce(served, f.reference, f.all, /*max_repeats=*/2, 0);
  }
}

TEST_CASE("30: drop_last on and off across a resize", "[integration][elastic]") {
  Fixture f;
  for (const bool drop_last : {false, true}) {
    INFO("drop_last " << drop_last);
    Served served;
    Job three(f.daemon, 3, 4, drop_last);
    three.Take(served, 2);
    Job two(f.daemon, 2, 4, drop_last, three.State(1));
    two.Take(served);
    if (drop_last) {
      // Nothing repeats; what drop_last drops is less than a batch a rank (plus the truncation).
      CheckExactlyOnce(served, f.reference, f.all, 0, /*max_missing=*/2 * 4 + 1);
    } else {
      CheckExactlyOnce(served, f.reference, f.all, /*max_repeats=*/1, 0);
    }
  }
}

TEST_CASE("30: a corrupt sample skipped on one rank: all ranks' states resume exactly, one rank's "
          "says what may repeat",
          "[integration][elastic]") {
  Fixture f;
  // Rank 0 of world 2 reads epoch 0's positions 0, 2, 4, ...: break the first two it reads.
  client::Client c(f.daemon.endpoint());
  auto world1 = c.Open(Options(0, 1, kImages, false));
  std::optional<client::Batch> first = world1->Next();  // epoch 0's order, in one batch
  REQUIRE(first);
  const int64_t* indices = first->indices().data<int64_t>();
  std::set<uint64_t> good = f.all;
  for (const uint32_t position : {0u, 2u}) {
    const uint64_t index = static_cast<uint64_t>(indices[position]);
    WriteFile(f.daemon.dataset_root() + "/" + f.reference.path.at(index), "not a jpeg");
    good.erase(index);
  }
  first.reset();
  world1.reset();

  Served served;
  Job two(f.daemon, 2, 4, false);
  two.Take(served, 3);
  const std::vector<std::string> states = two.States();
  CHECK(client::ParseState(states[0]).options.start.cursor == 14);  // 12 + the 2 skipped
  CHECK(client::ParseState(states[1]).options.start.cursor == 12);
  // Rank 0's state alone cannot know rank 1's skips: the resume says what it may cost.
  const client::Continuation alone =
      client::ContinueState(client::ParseState(states[0]), Options(0, 3, 4, false));
  CHECK_THAT(alone.warning, Catch::Contains("skipped 2 bad sample(s)"));
  // Each new rank loading some old rank's state (rank r' loads r' % 2): the ranks' shares
  // still fit together; what rank 0 skipped over is read again, nothing is missed.
  {
    Served mixed = served;
    for (uint32_t r = 0; r < 3; ++r) {
      client::Client c1(f.daemon.endpoint());
      const client::Continuation cont =
          client::ContinueState(client::ParseState(states[r % 2]), Options(r, 3, 4, false));
      auto stream = c1.Open(cont.options);
      while (std::optional<client::Batch> b = stream->Next()) mixed.Add(*b);
    }
    CheckExactlyOnce(mixed, f.reference, good, /*max_repeats=*/2 + 2, /*max_missing=*/0);
  }
  // All ranks' states together are exact.
  Job three(f.daemon, 3, 4, false, client::CombineStates(states));
  CHECK(three.warnings.empty());
  three.Take(served);
  CheckExactlyOnce(served, f.reference, good, /*max_repeats=*/2, 0);
}

std::vector<std::string> ConsumeArgs(const DaemonFixture& d, uint32_t rank, uint32_t world,
                                     const std::string& state, const std::string& samples_out) {
  return {CtlPath(), "--endpoint", d.endpoint(), "consume", "--dataset", "synth", "--epochs",
          "1", "--batch-size", "4", "--image-size", "16", "--seed", "3", "--rank",
          std::to_string(rank), "--world-size", std::to_string(world), "--state", state,
          "--samples-out", samples_out};
}

TEST_CASE("30: ringloaderctl consume --state continues at another --world-size and --rank",
          "[integration][elastic][ctl]") {
  Fixture f;
  const std::string dir = f.daemon.dir();
  std::map<uint64_t, int> times;  // epoch 0: sample index -> times
  const auto tally = [&](const std::string& samples_out) {
    for (const SampleLine& line : ReadSamplesOut(samples_out)) {
      CHECK(line.epoch == 0);
      ++times[line.sample_index];
    }
  };
  for (uint32_t r = 0; r < 2; ++r) {
    std::vector<std::string> args = ConsumeArgs(f.daemon, r, 2, dir + "/old" + std::to_string(r),
                                                dir + "/old" + std::to_string(r) + ".tsv");
    args.insert(args.end(), {"--max-batches", "3"});
    const CommandResult run = RunCommand(args);
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    tally(dir + "/old" + std::to_string(r) + ".tsv");
  }
  for (uint32_t r = 0; r < 3; ++r) {
    // Each new rank starts from a copy of old rank 1's state file.
    const std::string state = dir + "/new" + std::to_string(r);
    std::filesystem::copy_file(dir + "/old1", state);
    const CommandResult run =
        RunCommand(ConsumeArgs(f.daemon, r, 3, state, state + ".tsv"));
    INFO(run.output);
    REQUIRE(run.exit_code == 0);
    tally(state + ".tsv");
  }
  CHECK(times.size() == kImages);
  uint64_t repeats = 0;
  for (const auto& [index, n] : times) repeats += n - 1;
  CHECK(repeats <= 2);  // the new world's padding
  // Another seed is refused naming the flag.
  std::vector<std::string> args = ConsumeArgs(f.daemon, 0, 3, dir + "/old0", dir + "/x.tsv");
  args[std::find(args.begin(), args.end(), "--seed") - args.begin() + 1] = "4";
  const CommandResult refused = RunCommand(args);
  CHECK(refused.exit_code != 0);
  CHECK_THAT(refused.output, Catch::Contains("--seed is 4"));
}

TEST_CASE("30: the daemon refuses a saved world that does not fit the dataset, naming it",
          "[integration][elastic]") {
  Fixture f;
  client::Client c(f.daemon.endpoint());
  client::StreamOptions o = Options(0, 2, 4, false);
  o.saved_world.world_size = 2;
  o.saved_world.cursors = {40, 3};  // a 31-sample shard cannot be at 40
  try {
    c.Open(o);
    FAIL("opened");
  } catch (const client::Error& e) {
    CHECK(e.code() == client::ErrorCode::kInvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("saved_world.cursors[0]: 40 is past"));
  }
  o.saved_world = {};
  o.start_progress = client::EpochProgress{10, {12, 11}};
  try {
    c.Open(o);
    FAIL("opened");
  } catch (const client::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("start_progress.beyond: positions must ascend"));
  }
  o.start_progress = client::EpochProgress{10, {}};
  for (uint64_t p = 11; p < 11 + 60'000; ++p) o.start_progress.beyond.push_back(p);
  try {
    c.Open(o);  // more positions than the dataset has: refused before any is looked at
    FAIL("opened");
  } catch (const client::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("start_progress.beyond: 60000 positions, but only 52"));
  }
  o.start_progress = client::EpochProgress{63, {}};
  try {
    c.Open(o);
    FAIL("opened");
  } catch (const client::Error& e) {
    CHECK_THAT(e.what(), Catch::Contains("start_progress.prefix: must be <= the dataset's 62"));
  }
}

// Peak resident memory of process `pid` (VmHWM), in bytes.
uint64_t PeakRss(pid_t pid) {
  const std::string status = ReadFile("/proc/" + std::to_string(pid) + "/status");
  const size_t at = status.find("VmHWM:");
  REQUIRE(at != std::string::npos);
  return std::stoull(status.substr(at + 6)) * 1024;
}

TEST_CASE("30: a saved world whose ranks lie far apart is refused naming the limit, before the "
          "daemon builds what it would carry", "[integration][elastic]") {
  // An arrays dataset of 2^23 one-byte rows: a saved world of 2 has 4,194,304-sample shards.
  constexpr uint64_t kRows = uint64_t{1} << 23;
  TempDir data;
  std::filesystem::create_directories(data.Join("big"));
  std::string dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (" +
                     std::to_string(kRows) + ",), }";
  dict.append(64 - (10 + dict.size() + 1) % 64, ' ');
  dict += '\n';
  std::string npy = std::string("\x93NUMPY\x01\x00", 8) + static_cast<char>(dict.size() & 0xff) +
                    static_cast<char>(dict.size() >> 8) + dict;
  npy.append(kRows, '\x01');
  WriteFile(data.Join("big/x.npy"), npy);
  DaemonFixtureOptions options;
  options.images = 8;
  options.config_extra = "[[datasets]]\nname = \"big\"\nformat = \"arrays\"\npath = \"" +
                         data.Join("big") + "\"\n";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const uint64_t peak_before = PeakRss(daemon.ServingPid());

  // Rank 0 took nothing, rank 1 its whole shard: the rest of the epoch would carry 4,194,304
  // consumed positions past the first one not consumed (32 MiB in the daemon, more than the
  // client may receive).
  client::Client c(daemon.endpoint());
  client::StreamOptions o = Options(0, 2, 4, false);
  o.dataset = "big";
  o.saved_world.world_size = 2;
  o.saved_world.cursors = {0, client::SavedWorld::kWholeShard};
  try {
    c.Open(o);
    FAIL("opened");
  } catch (const client::Error& e) {
    CHECK(e.code() == client::ErrorCode::kInvalidArgument);
    CHECK_THAT(e.what(), Catch::Contains("saved_world.cursors: rank 0 at 0 and rank 1 at 4194304 "
                                         "leave 4194304 consumed positions past the first one "
                                         "not consumed; a resume carries at most 65536"));
  }
  // Counted, not built: the daemon's peak memory did not grow by the list's 32 MiB.
  CHECK(PeakRss(daemon.ServingPid()) - peak_before < (16u << 20));

  // At the limit the stream opens, continuing after what the saved world consumed.
  o.saved_world.cursors = {0, 65536};
  std::unique_ptr<client::Stream> stream = c.Open(o);
  CHECK(stream->start_progress().prefix == 0);
  CHECK(stream->start_progress().beyond.size() == 65536);
}

}  // namespace
}  // namespace ringloader::testing
