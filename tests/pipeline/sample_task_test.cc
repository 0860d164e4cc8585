// SampleTask: each transition of one sample's fill, one step at a time, on real JPEG files, with
// a gate that abandons the task exactly where a test says (what the WorkerPool's deadline does
// at an unknown moment).
#include "server/pipeline/sample_task.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

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

// memory_limit in miniature: grants while it fits, refuses what never can.
struct CountingMemory : DecodeMemory {
  absl::Status Acquire(uint64_t bytes) override {
    if (bytes > capacity) return absl::ResourceExhaustedError("needs more than the limit");
    held += bytes;
    return absl::OkStatus();
  }
  void Release(uint64_t bytes) override { held -= bytes; }
  uint64_t capacity = uint64_t{1} << 30;
  uint64_t held = 0;
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
  CountingMemory memory;
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
  CHECK(f.memory.held == task.drawn());
  CHECK(f.gate.handed_over == task.drawn());
  REQUIRE(task.ReadImage());
  CHECK(task.state() == State::kRead);
  CHECK(f.ImageUntouched());  // nothing of the caller's before the commit
  REQUIRE(task.Commit());
  CHECK(task.state() == State::kCommitted);
  task.Complete(f.Output(), Worker{3, f.decoder});
  CHECK(task.state() == State::kDone);
  CHECK(f.status.ok());
  CHECK(f.label == 1);
  CHECK_FALSE(f.ImageUntouched());
  CHECK(f.memory.held == 0);  // given back
  CHECK(f.observer.calls == std::vector<std::string>{"read 1", "decode 1 on 3", "after 1"});
}

TEST_CASE("SampleTask: Run does every step and gives the same bytes", "[pipeline][sample_task]") {
  Fixture f;
  SampleTask stepwise(f.Job(0), f.gate);
  REQUIRE((stepwise.Open() && stepwise.DrawMemory() && stepwise.ReadImage() && stepwise.Commit()));
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
    CHECK(f.memory.held == 0);
  }
  SECTION("as the memory wait begins") {
    REQUIRE(task.Open());
    f.gate.refuse_wait = true;
    CHECK_FALSE(task.DrawMemory());
    CHECK(f.memory.held == 0);  // nothing was drawn
  }
  SECTION("while reading the image, after the draw") {
    REQUIRE(task.Open());
    REQUIRE(task.DrawMemory());
    const uint64_t drawn = task.drawn();
    f.gate.abandoned = true;
    CHECK_FALSE(task.ReadImage());
    CHECK(task.drawn() == 0);
    CHECK(f.gate.handed_over == drawn);  // on_abandoned gives these back, not the task
    CHECK(f.memory.held == drawn);
  }
  SECTION("at the commit") {
    REQUIRE((task.Open() && task.DrawMemory() && task.ReadImage()));
    f.gate.refuse_commit = true;
    CHECK_FALSE(task.Commit());
    CHECK(f.memory.held == f.gate.handed_over);
  }
  CHECK(task.state() == State::kAbandoned);
  CHECK(f.ImageUntouched());
  CHECK(f.status.ok());
  CHECK(f.label == -1);
  CHECK(std::count(f.observer.calls.begin(), f.observer.calls.end(), "after 1") == 0);
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
    f.memory.capacity = 100;
    SampleTask task(f.Job(), f.gate);
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
  CHECK(f.memory.held == 0);
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
  CHECK(f.memory.held == 0);
}

TEST_CASE("SampleTask: a cached sample draws nothing and is copied from the cache",
          "[pipeline][sample_task]") {
  Fixture f;
  FakeCache cache;
  SampleTask task(f.CacheJob(cache, /*cached=*/true), f.gate);
  REQUIRE(task.Open());
  REQUIRE(task.DrawMemory());
  CHECK(task.drawn() == 0);
  REQUIRE(task.ReadImage());
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
