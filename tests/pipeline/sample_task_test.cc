// SPDX-License-Identifier: Apache-2.0
// SampleTask: each transition of one sample's fill, one step at a time, on real JPEG files, with
// a gate that abandons the task exactly where a test says (what the WorkerPool's deadline does
// at an unknown moment), drawing from the daemon's real MemoryBudget (whose Acquire blocks while
// memory_limit is short).
#include "server/pipeline/sample_task.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "server/daemon/memory_budget.h"
#include "server/image/synthetic.h"
#include "tests/support/test_support.h"

namespace ringloader::pipeline {
namespace {
namespace fs = std::filesystem;
using State = SampleTask::State;

// A TaskGate whose answers the test sets between steps.
struct ScriptedGate : TaskGate {
  void Checkpoint() override { ++checkpoints; }
  bool Commit() override {
    if (refuse_commit) abandoned = true;
    return !abandoned;
  }
  bool BeginWait() override {
    if (refuse_wait) abandoned = true;
    if (!abandoned) waiting = true;
    return !abandoned;
  }
  void EndWait() override { waiting = false; }
  bool Abandoned() const override { return abandoned; }
  void SetDrawn(uint64_t bytes) override { handed_over = bytes; }

  int checkpoints = 0;
  bool abandoned = false;
  bool refuse_wait = false;    // abandoned as the memory wait begins
  bool refuse_commit = false;  // abandoned just before the commit
  bool waiting = false;
  uint64_t handed_over = 0;  // what an abandoner would give back
};

struct RecordingObserver : SampleObserver {
  absl::Status BeforeRead(const Dataset&, uint64_t index) override {
    calls.push_back("read " + std::to_string(index));
    return absl::OkStatus();
  }
  absl::Status BeforeDecode(const Dataset&, uint64_t index, uint32_t worker) override {
    calls.push_back("decode " + std::to_string(index) + " on " + std::to_string(worker));
    return refuse;
  }
  void AfterDecode(const Dataset&, uint64_t index, uint32_t) override {
    calls.push_back("after " + std::to_string(index));
  }
  std::vector<std::string> calls;
  absl::Status refuse;
};

struct FakeCache : SampleCache {
  bool Contains(const std::string&, uint64_t) override { return true; }
  bool Holds(const std::string&, uint64_t) const override { return true; }
  bool Lookup(const std::string&, uint64_t, std::span<uint8_t> out) override {
    std::fill(out.begin(), out.end(), uint8_t{77});
    return true;
  }
  void Insert(const std::string&, uint64_t, std::span<const uint8_t>) override { ++inserts; }
  int inserts = 0;
};

struct Fixture {
  Fixture() {
    for (int i = 0; i < 2; ++i) {
      image::SyntheticImageOptions o;
      o.width = 96;
      o.height = 64;
      o.seed = static_cast<uint64_t>(i) + 1;
      auto jpeg = image::MakeSyntheticJpeg(o);
      REQUIRE(jpeg.ok());
      const std::string cls = dir.Join("data/class_" + std::to_string(i));
      fs::create_directories(cls);
      testing::WriteFile(cls + "/a.jpg", std::string(jpeg->begin(), jpeg->end()));
    }
    DatasetSpec spec;
    spec.name = "t";
    spec.root = dir.Join("data");
    auto opened = Dataset::Open(spec);
    REQUIRE(opened.ok());
    dataset = *std::move(opened);
    transform.image_size = 16;
    transform.augment = image::Augment::kEval;
    image.assign(transform.SampleBytes(), 0);
  }

  SampleJob Job(uint64_t index = 1) {
    SampleJob job;
    job.dataset = dataset.get();
    job.index = index;
    job.transform = transform;
    job.memory = &memory;
    job.observer = &observer;
    job.io_retry = std::chrono::milliseconds(0);
    return job;
  }

  // A job of a stream whose samples may come from `cache` (`cached`: this one does).
  SampleJob CacheJob(SampleCache& cache, bool cached) {
    SampleJob job = Job();
    job.cache = &cache;
    job.cache_key = "k";
    job.cached = cached;
    return job;
  }

  SampleOutput Output() {
    SampleOutput out;
    out.status = &status;
    out.label = &label;
    out.image = image;
    return out;
  }

  bool ImageUntouched() const {
    return std::all_of(image.begin(), image.end(), [](uint8_t b) { return b == 0; });
  }

  testing::TempDir dir;
  std::unique_ptr<Dataset> dataset;
  image::TransformSpec transform;
  server::MemoryBudget memory{uint64_t{1} << 30};  // the daemon's memory_limit accounting
  RecordingObserver observer;
  ScriptedGate gate;
  image::SampleDecoder decoder{image::DecodeLimits{}};
  absl::Status status;
  int64_t label = -1;
  std::vector<uint8_t> image;
};

TEST_CASE("SampleTask: a good sample reads, draws, commits and completes into its place",
          "[pipeline][sample_task]") {
  Fixture f;
  SampleTask task(f.Job(), f.gate);
  CHECK(f.gate.checkpoints == 1);  // abandonable from the constructor on
  CHECK(task.state() == State::kReading);
  REQUIRE(task.Open());
  REQUIRE(task.DrawMemory());
  CHECK(task.drawn() > 0);
  CHECK(f.memory.decoding() == task.drawn());
  CHECK(f.gate.handed_over == task.drawn());
  REQUIRE(task.ReadBytes());
  CHECK(task.state() == State::kRead);
  CHECK(f.ImageUntouched());  // nothing of the caller's before the commit
  REQUIRE(task.Commit());
  CHECK(task.state() == State::kCommitted);
  task.Complete(f.Output(), Worker{3, f.decoder});
  CHECK(task.state() == State::kDone);
  CHECK(f.status.ok());
  CHECK(f.label == 1);
  CHECK_FALSE(f.ImageUntouched());
  CHECK(f.memory.decoding() == 0);  // given back
  CHECK(f.observer.calls == std::vector<std::string>{"read 1", "decode 1 on 3", "after 1"});
}

TEST_CASE("SampleTask: Run does every step and gives the same bytes", "[pipeline][sample_task]") {
  Fixture f;
  SampleTask stepwise(f.Job(0), f.gate);
  REQUIRE((stepwise.Open() && stepwise.DrawMemory() && stepwise.ReadBytes() && stepwise.Commit()));
  stepwise.Complete(f.Output(), Worker{0, f.decoder});
  const std::vector<uint8_t> expected = f.image;
  std::fill(f.image.begin(), f.image.end(), 0);
  SampleTask task(f.Job(0), f.gate);
  CHECK(task.Run(f.Output(), Worker{0, f.decoder}) == State::kDone);
  CHECK(f.image == expected);
}

TEST_CASE(
    "SampleTask: abandoned at any step before the commit, it touches nothing of the "
    "caller's and leaves its memory to the abandoner",
    "[pipeline][sample_task]") {
  Fixture f;
  SampleTask task(f.Job(), f.gate);
  SECTION("before the open") {
    f.gate.abandoned = true;
    CHECK_FALSE(task.Open());
    CHECK(f.memory.decoding() == 0);
  }
  SECTION("as the memory wait begins") {
    REQUIRE(task.Open());
    f.gate.refuse_wait = true;
    CHECK_FALSE(task.DrawMemory());
    CHECK(f.memory.decoding() == 0);  // nothing was drawn
  }
  SECTION("while reading the image, after the draw") {
    REQUIRE(task.Open());
    REQUIRE(task.DrawMemory());
    const uint64_t drawn = task.drawn();
    f.gate.abandoned = true;
    CHECK_FALSE(task.ReadBytes());
    CHECK(task.drawn() == 0);
    CHECK(f.gate.handed_over == drawn);  // on_abandoned gives these back, not the task
    CHECK(f.memory.decoding() == drawn);
  }
  SECTION("at the commit") {
    REQUIRE((task.Open() && task.DrawMemory() && task.ReadBytes()));
    f.gate.refuse_commit = true;
    CHECK_FALSE(task.Commit());
    CHECK(f.memory.decoding() == f.gate.handed_over);
  }
  CHECK(task.state() == State::kAbandoned);
  CHECK(f.ImageUntouched());
  CHECK(f.status.ok());
  CHECK(f.label == -1);
  CHECK(std::count(f.observer.calls.begin(), f.observer.calls.end(), "after 1") == 0);
}

TEST_CASE(
    "SampleTask: a draw memory_limit cannot give yet waits in DrawMemory, its deadline paused "
    "and nothing drawn or written, and goes on when another decode gives its bytes back",
    "[pipeline][sample_task]") {
  Fixture f;
  // What this sample's decode draws, and its pixels: a run on the roomy budget tells.
  uint64_t need = 0;
  {
    ScriptedGate gate;
    SampleTask probe(f.Job(), gate);
    REQUIRE(probe.Run(f.Output(), Worker{0, f.decoder}) == State::kDone);
    need = gate.handed_over;
  }
  REQUIRE(need > 0);
  const std::vector<uint8_t> reference = f.image;
  std::fill(f.image.begin(), f.image.end(), 0);

  server::MemoryBudget budget(need);   // room for this one decode, no more
  REQUIRE(budget.Acquire(need).ok());  // which another sample's decode holds
  SampleJob job = f.Job();
  job.memory = &budget;
  SampleTask task(std::move(job), f.gate);
  REQUIRE(task.Open());
  bool drew = false;
  std::thread drawing([&] { drew = task.DrawMemory(); });
  // Only a DrawMemory that really waits is in the budget's queue (it takes the budget's lock to
  // get there, so what it did before is visible here).
  CHECK(testing::WaitFor([&] { return budget.waiting() == 1; }, std::chrono::seconds(30)));
  CHECK(f.gate.waiting);  // the deadline is paused: the pool does not abandon a memory wait
  CHECK(f.gate.handed_over == 0);  // nothing for an abandoner to give back
  CHECK(task.drawn() == 0);
  CHECK(budget.decoding() == need);  // the other decode's only
  CHECK(task.state() == State::kReading);
  budget.Release(need);  // the other decode is done: the waiting draw gets the bytes
  drawing.join();
  CHECK(drew);
  CHECK_FALSE(f.gate.waiting);
  CHECK(f.gate.handed_over == need);
  CHECK(task.drawn() == need);
  CHECK(budget.decoding() == need);  // the task's now
  REQUIRE(task.ReadBytes());
  REQUIRE(task.Commit());
  CHECK(f.ImageUntouched());  // nothing of the caller's before the commit
  task.Complete(f.Output(), Worker{0, f.decoder});
  CHECK(f.status.ok());
  CHECK(f.image == reference);
  CHECK(budget.decoding() == 0);  // given back
}

TEST_CASE("SampleTask: a failed step is committed and written as the sample's error",
          "[pipeline][sample_task]") {
  Fixture f;
  SECTION("the file vanished") {
    fs::remove(f.dir.Join("data/class_1/a.jpg"));
    SampleTask task(f.Job(), f.gate);
    CHECK_FALSE(task.Open());
    CHECK(task.state() == State::kFailed);
    REQUIRE(task.Commit());
    task.Complete(f.Output(), Worker{0, f.decoder});
  }
  SECTION("memory_limit can never hold its decode") {
    server::MemoryBudget small(100);
    SampleJob job = f.Job();
    job.memory = &small;
    SampleTask task(std::move(job), f.gate);
    REQUIRE(task.Open());
    CHECK_FALSE(task.DrawMemory());
    CHECK(task.state() == State::kFailed);
    REQUIRE(task.Commit());
    task.Complete(f.Output(), Worker{0, f.decoder});
    CHECK(image::ErrorReason(f.status) == "too_large");
  }
  SECTION("the header is not an image's") {
    testing::WriteFile(f.dir.Join("data/class_1/a.jpg"), "not a jpeg at all");
    SampleTask task(f.Job(), f.gate);
    REQUIRE(task.Open());
    CHECK_FALSE(task.DrawMemory());
    CHECK(task.state() == State::kFailed);
    REQUIRE(task.Commit());
    task.Complete(f.Output(), Worker{0, f.decoder});
  }
  CHECK_FALSE(f.status.ok());
  CHECK_THAT(std::string(f.status.message()), Catch::Contains("class_1/a.jpg"));
  CHECK(f.ImageUntouched());
  CHECK(f.memory.decoding() == 0);
  CHECK(std::count(f.observer.calls.begin(), f.observer.calls.end(), "after 1") == 0);
}

TEST_CASE(
    "SampleTask: the observer's refusal after the commit fails the sample and still ends "
    "its watch",
    "[pipeline][sample_task]") {
  Fixture f;
  f.observer.refuse = absl::FailedPreconditionError("quarantined");
  SampleTask task(f.Job(), f.gate);
  CHECK(task.Run(f.Output(), Worker{1, f.decoder}) == State::kDone);
  CHECK_THAT(std::string(f.status.message()), Catch::Contains("quarantined"));
  CHECK(f.observer.calls.back() == "after 1");
  CHECK(f.memory.decoding() == 0);
}

TEST_CASE("SampleTask: a cached sample draws nothing and is copied from the cache",
          "[pipeline][sample_task]") {
  Fixture f;
  FakeCache cache;
  SampleTask task(f.CacheJob(cache, /*cached=*/true), f.gate);
  REQUIRE(task.Open());
  REQUIRE(task.DrawMemory());
  CHECK(task.drawn() == 0);
  REQUIRE(task.ReadBytes());
  REQUIRE(task.Commit());
  task.Complete(f.Output(), Worker{0, f.decoder});
  CHECK(f.status.ok());
  CHECK(std::all_of(f.image.begin(), f.image.end(), [](uint8_t b) { return b == 77; }));
  CHECK(cache.inserts == 0);
}

TEST_CASE("SampleTask: an uncached sample of a cached stream is offered to the cache",
          "[pipeline][sample_task]") {
  Fixture f;
  FakeCache cache;
  SampleTask task(f.CacheJob(cache, /*cached=*/false), f.gate);
  CHECK(task.Run(f.Output(), Worker{0, f.decoder}) == State::kDone);
  CHECK(cache.inserts == 1);
  CHECK(f.status.ok());
}

}  // namespace
}  // namespace ringloader::pipeline
