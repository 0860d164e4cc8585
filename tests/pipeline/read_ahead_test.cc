// ReadPool and ReadAhead (issue 29): reads run ahead of the decodes, many at once, and change
// nothing a sample's task decides. Interleavings are forced with latches, never sleeps.
#include "server/pipeline/read_ahead.h"

#include <catch2/catch.hpp>

#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>

#include "server/image/synthetic.h"
#include "server/pipeline/sample_task.h"
#include "tests/support/test_support.h"

namespace ringloader::pipeline {
namespace {

namespace fs = std::filesystem;

// A gate that opens once: threads wait at it until the test lets them through.
class Latch {
 public:
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    ++waiting_;
    cv_.notify_all();
    cv_.wait(lock, [&] { return open_; });
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  // Blocks until `n` threads wait at the latch.
  void AwaitWaiting(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return waiting_ >= n; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
  int waiting_ = 0;
};

// At the end of a test, before the pool and the fixture go: every read has finished and let go
// of its sample (reads in flight outlive a ReadAhead; the daemon's datasets outlive them).
struct WaitIdle {
  ReadPool& pool;
  ~WaitIdle() {
    testing::WaitFor([&] { return pool.running() == 0 && pool.queued() == 0; },
                     std::chrono::seconds(30));
  }
};

// memory_limit in miniature, with read-ahead holds that the test evicts by hand.
struct Memory : DecodeMemory {
  absl::Status Acquire(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu);
    held += bytes;
    return absl::OkStatus();
  }
  void Release(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu);
    held -= bytes;
  }
  uint64_t TryAcquireReadAhead(uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu);
    if (!grant_read_ahead) return 0;
    held += bytes;
    holds[next] = {bytes, nullptr};
    return next++;
  }
  void ArmEviction(uint64_t id, std::function<void()> evict) override {
    std::lock_guard<std::mutex> lock(mu);
    if (holds.count(id)) holds[id].second = std::move(evict);
  }
  bool Pin(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu);
    if (!holds.count(id)) return false;
    holds[id].second = nullptr;
    return true;
  }
  void ReleaseReadAhead(uint64_t id) override {
    std::lock_guard<std::mutex> lock(mu);
    if (!holds.count(id)) return;
    held -= holds[id].first;
    holds.erase(id);
  }
  // What MemoryBudget does for a decode that would wait: every armed hold is taken back.
  int EvictAll() {
    std::vector<std::pair<uint64_t, std::function<void()>>> victims;
    {
      std::lock_guard<std::mutex> lock(mu);
      for (auto it = holds.begin(); it != holds.end();) {
        if (it->second.second) {
          victims.emplace_back(it->second.first, std::move(it->second.second));
          it = holds.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& [bytes, evict] : victims) {
      evict();
      std::lock_guard<std::mutex> lock(mu);
      held -= bytes;
    }
    return static_cast<int>(victims.size());
  }
  std::mutex mu;
  bool grant_read_ahead = true;
  uint64_t held = 0;
  uint64_t next = 1;
  std::map<uint64_t, std::pair<uint64_t, std::function<void()>>> holds;
};

struct Observer : SampleObserver {
  absl::Status BeforeRead(const Dataset&, uint64_t index) override {
    {
      std::lock_guard<std::mutex> lock(mu);
      ++reads[index];
    }
    if (index == stuck_index) stuck.Wait();
    return absl::OkStatus();
  }
  absl::Status BeforeDecode(const Dataset&, uint64_t, uint32_t) override {
    return absl::OkStatus();
  }
  void AfterDecode(const Dataset&, uint64_t, uint32_t) override {}
  int ReadsOf(uint64_t index) {
    std::lock_guard<std::mutex> lock(mu);
    return reads[index];
  }
  std::mutex mu;
  std::map<uint64_t, int> reads;
  uint64_t stuck_index = ~uint64_t{0};  // BeforeRead of this sample waits at `stuck`
  Latch stuck;
};

// A gate the test abandons by hand.
struct Gate : TaskGate {
  void Checkpoint() override {}
  bool Commit() override { return !abandoned.load(); }
  bool BeginWait() override { return !abandoned.load(); }
  void EndWait() override {}
  bool Abandoned() const override { return abandoned.load(); }
  void SetDrawn(uint64_t bytes) override { drawn = bytes; }
  std::atomic<bool> abandoned{false};
  uint64_t drawn = 0;
};

struct Fixture {
  Fixture() {
    image::SyntheticDatasetOptions ds;
    ds.out_dir = dir.Join("data");
    ds.count = 12;
    ds.classes = 2;
    ds.large_fraction = 0;
    REQUIRE(image::WriteSyntheticDataset(ds).ok());
    DatasetSpec spec;
    spec.name = std::string("read-ahead");
    spec.root = dir.Join("data");
    auto opened = Dataset::Open(spec);
    REQUIRE(opened.ok());
    dataset = *std::move(opened);
    transform.image_size = 16;
    transform.augment = image::Augment::kEval;
  }
  SampleJob Job(uint64_t index) {
    SampleJob job;
    job.dataset = dataset.get();
    job.index = index;
    job.transform = transform;
    job.memory = &memory;
    job.observer = &observer;
    job.io_retry = std::chrono::milliseconds(0);
    return job;
  }
  // Runs a task for `job`; returns the sample's pixels (empty when it did not complete).
  std::vector<uint8_t> Run(SampleJob job, Gate& gate) {
    std::vector<uint8_t> pixels(transform.SampleBytes(), 0);
    absl::Status status;
    int64_t label = -1;
    SampleOutput out;
    out.status = &status;
    out.label = &label;
    out.image = pixels;
    SampleTask task(std::move(job), gate);
    if (task.Run(out, Worker{0, decoder}) != SampleTask::State::kDone || !status.ok()) return {};
    return pixels;
  }
  testing::TempDir dir;
  std::unique_ptr<Dataset> dataset;
  image::TransformSpec transform;
  Memory memory;
  Observer observer;
  image::SampleDecoder decoder{image::DecodeLimits{}};
};

TEST_CASE("ReadPool: runs depth reads at once, and a written-off read lets another run",
          "[pipeline][read_ahead]") {
  ReadPool pool(2);
  Latch hold;
  std::atomic<int> done{0};
  for (int i = 0; i < 3; ++i) {
    REQUIRE(pool.Submit([&] {
      hold.Wait();
      ++done;
    }));
  }
  hold.AwaitWaiting(2);
  CHECK(pool.running() == 2);
  CHECK(pool.queued() == 1);  // the third waits for a thread
  pool.WriteOff();            // one of the two may be stuck for good: a third thread runs
  hold.AwaitWaiting(3);
  CHECK(pool.running() == 3);
  CHECK(pool.written_off() == 1);
  hold.Open();
  CHECK(testing::WaitFor([&] { return done.load() == 3; }, std::chrono::seconds(10)));
  pool.Shutdown();
  CHECK_FALSE(pool.Submit([] {}));
}

TEST_CASE("ReadAhead: a sample read ahead decodes to the same bytes, read once, its file bytes "
          "held by the read",
          "[pipeline][read_ahead]") {
  Fixture f;
  ReadPool pool(4);
  WaitIdle idle{pool};
  ReadAhead ahead(pool, 4, &f.memory, &f.observer, std::chrono::milliseconds(0));
  const EpochShard shard(f.dataset->size(), ShardSpec{});
  ahead.Advance(*f.dataset, shard, 0, 0, 0, 1 << 30, nullptr, "");
  CHECK(ahead.started() == 4);  // the window
  std::shared_ptr<PrefetchedSample> read = ahead.Take(0, 0);
  REQUIRE(read != nullptr);
  REQUIRE(read->WaitDone([] { return false; }));
  CHECK(read->status().ok());
  CHECK(ahead.started() == 5);  // the window moved past the taken position
  CHECK(ahead.Take(0, 0) == nullptr);  // taken once

  const uint64_t index = shard.at(0);
  Gate plain;
  const std::vector<uint8_t> reference = f.Run(f.Job(index), plain);
  REQUIRE_FALSE(reference.empty());
  SampleJob job = f.Job(index);
  job.prefetched = read;
  Gate gate;
  CHECK(f.Run(std::move(job), gate) == reference);
  CHECK(f.observer.ReadsOf(index) == 2);  // the read ahead's and the plain run's: one each
  read.reset();
  // The decode's draw and this read's hold went back: what is held is the other reads' holds.
  CHECK(testing::WaitFor([&] { return f.memory.held == [&] {
                                 std::lock_guard<std::mutex> lock(f.memory.mu);
                                 uint64_t n = 0;
                                 for (auto& [id, h] : f.memory.holds) n += h.first;
                                 return n;
                               }(); },
                         std::chrono::seconds(5)));
}

TEST_CASE("ReadAhead: evicted bytes, or none granted, leave the task to read them itself",
          "[pipeline][read_ahead]") {
  Fixture f;
  ReadPool pool(2);
  WaitIdle idle{pool};
  const EpochShard shard(f.dataset->size(), ShardSpec{});
  for (const bool granted : {true, false}) {
    INFO("read-ahead memory granted: " << granted);
    f.memory.grant_read_ahead = granted;
    ReadAhead ahead(pool, 2, &f.memory, &f.observer, std::chrono::milliseconds(0));
    ahead.Advance(*f.dataset, shard, 0, 0, 0, 1 << 30, nullptr, "");
    std::shared_ptr<PrefetchedSample> read = ahead.Take(0, 0);
    REQUIRE(read->WaitDone([] { return false; }));
    // This read is armed by the time it is done (others may be too, by then).
    const int evicted = f.memory.EvictAll();
    CHECK((granted ? evicted >= 1 : evicted == 0));
    CHECK(read->status().ok());
    Gate plain, gate;
    const std::vector<uint8_t> reference = f.Run(f.Job(shard.at(0)), plain);
    SampleJob job = f.Job(shard.at(0));
    job.prefetched = read;
    CHECK(f.Run(std::move(job), gate) == reference);
  }
  f.memory.grant_read_ahead = true;
}

TEST_CASE("ReadAhead: a task waiting on a read stuck on a dead mount is abandoned by its gate",
          "[pipeline][read_ahead]") {
  Fixture f;
  ReadPool pool(2);
  WaitIdle idle{pool};
  const EpochShard shard(f.dataset->size(), ShardSpec{});
  f.observer.stuck_index = shard.at(0);
  ReadAhead ahead(pool, 1, &f.memory, &f.observer, std::chrono::milliseconds(0));
  ahead.Advance(*f.dataset, shard, 0, 0, 0, 1 << 30, nullptr, "");
  std::shared_ptr<PrefetchedSample> read = ahead.Take(0, 0);
  f.observer.stuck.AwaitWaiting(1);  // the read is in BeforeRead, stuck
  SampleJob job = f.Job(shard.at(0));
  job.prefetched = read;
  Gate gate;
  SampleTask task(std::move(job), gate);
  std::thread abandoner([&] { gate.abandoned = true; });  // the deadline, from another thread
  CHECK_FALSE(task.Open());
  abandoner.join();
  CHECK(task.state() == SampleTask::State::kAbandoned);
  ahead.WriteOff(*read);
  CHECK(pool.written_off() == 1);
  f.observer.stuck.Open();
  CHECK(read->WaitDone([] { return false; }));
}

TEST_CASE("ReadAhead: a task never waits for a read still queued: it cancels it and reads itself",
          "[pipeline][read_ahead]") {
  Fixture f;
  ReadPool pool(1);
  WaitIdle idle{pool};
  const EpochShard shard(f.dataset->size(), ShardSpec{});
  f.observer.stuck_index = shard.at(0);  // the pool's one thread is held by position 0's read
  ReadAhead ahead(pool, 2, &f.memory, &f.observer, std::chrono::milliseconds(0));
  ahead.Advance(*f.dataset, shard, 0, 0, 0, 1 << 30, nullptr, "");
  f.observer.stuck.AwaitWaiting(1);
  std::shared_ptr<PrefetchedSample> queued = ahead.Take(0, 1);
  REQUIRE(queued != nullptr);
  CHECK(queued->state() == PrefetchedSample::State::kQueued);
  Gate plain, gate;
  const std::vector<uint8_t> reference = f.Run(f.Job(shard.at(1)), plain);
  SampleJob job = f.Job(shard.at(1));
  job.prefetched = queued;
  CHECK(f.Run(std::move(job), gate) == reference);  // read here, at once
  CHECK(queued->state() == PrefetchedSample::State::kCancelled);
  ahead.WriteOff(*queued);
  CHECK(pool.written_off() == 0);  // a read that never ran is no stuck thread
  f.observer.stuck.Open();
}

TEST_CASE("ReadAhead: reads run on into the next epoch but not past the stream's end, skip "
          "what the cache holds, and follow a jump",
          "[pipeline][read_ahead]") {
  Fixture f;
  ReadPool pool(2);
  WaitIdle idle{pool};
  struct Cache : SampleCache {
    bool Contains(const std::string&, uint64_t) override { return false; }
    bool Holds(const std::string&, uint64_t index) const override { return index % 2 == 0; }
    bool Lookup(const std::string&, uint64_t, std::span<uint8_t>) override { return false; }
    void Insert(const std::string&, uint64_t, std::span<const uint8_t>) override {}
  } cache;
  const uint64_t n = f.dataset->size();  // 12
  const EpochShard epoch0(n, ShardSpec{});
  ShardSpec spec1;
  spec1.epoch = 1;
  const EpochShard epoch1(n, spec1);
  {
    // A stream that ends after epoch 0, with half its samples cached: those 6 are all it reads.
    ReadAhead ahead(pool, 8, &f.memory, &f.observer, std::chrono::milliseconds(0));
    ahead.Advance(*f.dataset, epoch0, 0, 0, /*end_epoch=*/1, 1 << 30, &cache, "k");
    CHECK(ahead.started() == n / 2);
    for (uint64_t pos = 0; pos < n; ++pos) {
      CHECK((ahead.Take(0, pos) == nullptr) == cache.Holds("k", epoch0.at(pos)));
    }
    CHECK(ahead.Take(1, 0) == nullptr);
  }
  ReadAhead ahead(pool, 16, &f.memory, &f.observer, std::chrono::milliseconds(0));
  ahead.Advance(*f.dataset, epoch0, 0, 0, /*end_epoch=*/0, 1 << 30, nullptr, "");
  CHECK(ahead.started() == 16);  // all of epoch 0, then epoch 1's first 4
  std::shared_ptr<PrefetchedSample> next_epoch = ahead.Take(1, 0);
  REQUIRE(next_epoch != nullptr);
  CHECK(next_epoch->index() == epoch1.at(0));  // the order the stream's own shard has
  // The stream reaches epoch 1: epoch 0's reads go, epoch 1's stay.
  ahead.Advance(*f.dataset, epoch1, 1, 1, 0, 1 << 30, nullptr, "");
  CHECK(ahead.Take(0, 11) == nullptr);
  std::shared_ptr<PrefetchedSample> second = ahead.Take(1, 1);
  REQUIRE(second != nullptr);
  CHECK(second->index() == epoch1.at(1));
  // A jump (a reopened stream) drops what it passed.
  ahead.Advance(*f.dataset, epoch1, 1, 9, 0, 1 << 30, nullptr, "");
  CHECK(ahead.Take(1, 3) == nullptr);
  CHECK(ahead.Take(1, 9) != nullptr);
  next_epoch->WaitDone([] { return false; });
  second->WaitDone([] { return false; });
}

}  // namespace
}  // namespace ringloader::pipeline
