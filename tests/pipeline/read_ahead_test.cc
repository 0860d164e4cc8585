// SPDX-License-Identifier: Apache-2.0
// ReadPool and ReadAhead (issue 29): reads run ahead of the decodes, many at once, and change
// nothing a sample's task decides; their bytes come from the daemon's real MemoryBudget, whose
// decodes block while memory_limit is short. Interleavings are forced with latches and the
// budget's own queue, never sleeps.
#include "server/pipeline/read_ahead.h"

#include <catch2/catch.hpp>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "server/daemon/memory_budget.h"
#include "server/image/sample_file.h"
#include "server/image/synthetic.h"
#include "server/pipeline/sample_task.h"
#include "server/pipeline/tar_shard.h"
#include "tests/support/latch.h"
#include "tests/support/test_support.h"

namespace ringloader::pipeline {
namespace {

namespace fs = std::filesystem;

using testing::Latch;

// At the end of a test, before the pool and the fixture go: every read has finished and let go
// of its sample (reads in flight outlive a ReadAhead; the daemon's datasets outlive them).
struct WaitIdle {
  ReadPool& pool;
  ~WaitIdle() {
    testing::WaitFor([&] { return pool.running() == 0 && pool.queued() == 0; },
                     std::chrono::seconds(30));
  }
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
  bool BeginWait() override {
    waiting = !abandoned.load();
    return waiting.load();
  }
  void EndWait() override { waiting = false; }
  bool Abandoned() const override { return abandoned.load(); }
  void SetDrawn(uint64_t bytes) override { drawn = bytes; }
  std::atomic<bool> abandoned{false};
  std::atomic<bool> waiting{false};  // between BeginWait and EndWait: the task waits for memory
  std::atomic<uint64_t> drawn{0};
};

constexpr uint64_t kMiB = uint64_t{1} << 20;

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
    SampleTask task(std::move(job), gate);
    return Finish(task, /*run=*/true);
  }
  // Commits and completes `task`, which has read its image (or, `run`, does every step).
  std::vector<uint8_t> Finish(SampleTask& task, bool run = false) {
    std::vector<uint8_t> pixels(transform.SampleBytes(), 0);
    absl::Status status;
    int64_t label = -1;
    SampleOutput out;
    out.status = &status;
    out.label = &label;
    out.image = pixels;
    if (run) {
      if (task.Run(out, Worker{0, decoder}) != SampleTask::State::kDone) return {};
    } else {
      if (!task.Commit()) return {};
      task.Complete(out, Worker{0, decoder});
    }
    if (!status.ok()) return {};
    return pixels;
  }
  // Bytes of the decodes' draws, now (the budget counts the reads' holds among its decoding).
  uint64_t Drawn() const { return memory.decoding() - memory.read_ahead(); }

  testing::TempDir dir;
  std::unique_ptr<Dataset> dataset;
  image::TransformSpec transform;
  server::MemoryBudget memory{64 * kMiB};  // memory_limit: read-ahead may hold up to half
  Observer observer;
  image::SampleDecoder decoder{image::DecodeLimits{}};
};

TEST_CASE("ReadPool: runs depth reads at once, and a written-off read lets another run",
          "[pipeline][read_ahead]") {
  ReadPool pool(2);
  Latch hold;
  std::atomic<int> done{0};
  std::vector<uint64_t> ids;
  for (int i = 0; i < 3; ++i) {
    ids.push_back(pool.Submit([&] {
      hold.Wait();
      ++done;
      return ReadPool::Answer::kAnswered;
    }));
    REQUIRE(ids.back() != 0);
  }
  hold.AwaitWaiting(2);
  CHECK(pool.running() == 2);
  CHECK(pool.queued() == 1);  // the third waits for a thread
  pool.WriteOff(ids[2]);      // not running: nothing to write off
  CHECK(pool.written_off() == 0);
  pool.WriteOff(ids[0]);      // may be stuck for good: a third thread runs
  pool.WriteOff(ids[0]);      // once
  hold.AwaitWaiting(3);
  CHECK(pool.running() == 3);
  CHECK(pool.written_off() == 1);
  hold.Open();
  CHECK(testing::WaitFor([&] { return done.load() == 3; }, std::chrono::seconds(10)));
  // What is stuck now, not in the lane's life: the written-off read ended.
  CHECK(testing::WaitFor([&] { return pool.written_off() == 0; }, std::chrono::seconds(10)));
  pool.Shutdown();
  CHECK(pool.Submit([] { return ReadPool::Answer::kAnswered; }) == 0);
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
  // The decodes' draws went back: what the budget counts is the other reads' holds.
  CHECK(testing::WaitFor([&] { return f.Drawn() == 0; }, std::chrono::seconds(5)));
}

TEST_CASE("ReadAhead: while a decode waits for memory_limit, reads take none of it and keep just "
          "their files open, and the task reads the bytes itself",
          "[pipeline][read_ahead]") {
  Fixture f;
  ReadPool pool(2);
  WaitIdle idle{pool};
  const EpochShard shard(f.dataset->size(), ShardSpec{});
  Gate plain;
  const std::vector<uint8_t> reference = f.Run(f.Job(shard.at(0)), plain);
  REQUIRE_FALSE(reference.empty());
  // One decode holds all but 1 MiB; another waits for 2 MiB. A read's bytes (a few KiB) would
  // fit, and read-ahead holds nothing yet: only the waiting decode refuses them.
  const uint64_t first = f.memory.limit() - kMiB;
  REQUIRE(f.memory.Acquire(first).ok());
  bool second_granted = false;
  std::thread second([&] { second_granted = f.memory.Acquire(2 * kMiB).ok(); });
  CHECK(testing::WaitFor([&] { return f.memory.waiting() == 1; }, std::chrono::seconds(30)));
  {
    ReadAhead ahead(pool, 2, &f.memory, &f.observer, std::chrono::milliseconds(0));
    ahead.Advance(*f.dataset, shard, 0, 0, 0, 1 << 30, nullptr, "");
    std::shared_ptr<PrefetchedSample> read = ahead.Take(0, 0);
    REQUIRE(read != nullptr);
    REQUIRE(read->WaitDone([] { return false; }));
    CHECK(read->status().ok());  // its file is open
    CHECK(f.memory.peak_read_ahead() == 0);
    CHECK(f.memory.waiting() == 1);  // still waiting: nothing was taken from it
    f.memory.Release(first);  // the first decode is done: the second gets its bytes
    second.join();
    CHECK(second_granted);
    f.memory.Release(2 * kMiB);
    Gate gate;
    SampleJob job = f.Job(shard.at(0));
    job.prefetched = read;
    CHECK(f.Run(std::move(job), gate) == reference);  // the bytes read here, from the open file
    CHECK(gate.drawn > 0);
    CHECK(f.observer.ReadsOf(shard.at(0)) == 2);  // the reference's and the read ahead's
  }
  CHECK(testing::WaitFor([&] { return f.memory.decoding() == 0; }, std::chrono::seconds(10)));
}

TEST_CASE("ReadAhead: a decode short of memory takes bytes read ahead back instead of waiting, "
          "never those a task took, and a task that must wait gives its own back first",
          "[pipeline][read_ahead]") {
  Fixture f;
  ReadPool pool(2);
  WaitIdle idle{pool};
  const EpochShard shard(f.dataset->size(), ShardSpec{});
  std::vector<std::vector<uint8_t>> reference;
  for (uint64_t pos : {0, 1}) {
    Gate plain;
    reference.push_back(f.Run(f.Job(shard.at(pos)), plain));
    REQUIRE_FALSE(reference.back().empty());
  }
  {
    ReadAhead ahead(pool, 2, &f.memory, &f.observer, std::chrono::milliseconds(0));
    ahead.Advance(*f.dataset, shard, 0, 0, 0, 1 << 30, nullptr, "");
    std::shared_ptr<PrefetchedSample> read0 = ahead.Take(0, 0);
    std::shared_ptr<PrefetchedSample> read1 = ahead.Take(0, 1);
    REQUIRE((read0 != nullptr && read1 != nullptr));
    // Done: each holds its bytes, armed for eviction (memory was plentiful).
    REQUIRE((read0->WaitDone([] { return false; }) && read1->WaitDone([] { return false; })));
    const uint64_t file0 = fs::file_size(f.dataset->AbsolutePath(shard.at(0)));
    Gate gate;
    SampleJob job = f.Job(shard.at(0));
    job.prefetched = read0;
    SampleTask task(std::move(job), gate);
    REQUIRE(task.Open());  // read 0's bytes are the task's now (pinned)
    // Another decode needs all of memory_limit but those bytes: every other read's bytes go
    // back (read 1's, and any the window started since), and it does not wait.
    const uint64_t other = f.memory.limit() - file0;
    REQUIRE(f.memory.Acquire(other).ok());
    CHECK(f.memory.read_ahead() == file0);
    CHECK_FALSE(read1->TakeBytes().has_value());  // evicted: its task will read them itself
    // The task's own draw finds nothing left to take back: it must wait, and gives its bytes
    // back first (a wait never pins memory), to read them again from its open file.
    bool drew = false;
    std::thread drawing([&] { drew = task.DrawMemory(); });
    CHECK(testing::WaitFor([&] { return f.memory.waiting() == 1; }, std::chrono::seconds(30)));
    CHECK(gate.waiting);
    CHECK(f.memory.read_ahead() == 0);
    CHECK(f.memory.decoding() == other);
    f.memory.Release(other);
    drawing.join();
    CHECK(drew);
    CHECK_FALSE(gate.waiting);
    REQUIRE(task.ReadBytes());
    CHECK(f.Finish(task) == reference[0]);
    Gate gate1;
    SampleJob job1 = f.Job(shard.at(1));
    job1.prefetched = read1;
    CHECK(f.Run(std::move(job1), gate1) == reference[1]);
    CHECK(f.observer.ReadsOf(shard.at(0)) == 2);  // the reference's and the read ahead's
    CHECK(f.observer.ReadsOf(shard.at(1)) == 2);  // the evicted read's file stayed open
  }
  // Every draw and every hold went back.
  CHECK(testing::WaitFor([&] { return f.memory.decoding() == 0; }, std::chrono::seconds(10)));
  CHECK(f.memory.read_ahead() == 0);
}

TEST_CASE("ReadAhead: decodes that each hold bytes read ahead and all wait for memory never "
          "wait for ever",
          "[pipeline][read_ahead]") {
  // Issue 38.2: two tasks each took their sample's bytes read ahead (pinned: not evictable), and
  // memory_limit has room for either's decode only once the other's bytes are back. Each waiting
  // with its bytes pinned, neither draw could ever be granted.
  Fixture f;
  ReadPool pool(2);
  WaitIdle idle{pool};
  const EpochShard shard(f.dataset->size(), ShardSpec{.shuffle = false});
  const auto plan_of = [&](uint64_t index) {
    const std::string path = f.dataset->AbsolutePath(index);
    std::ifstream in(path, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    auto plan = image::SampleDecoder::PlanFromHeader(bytes, path, image::DecodeLimits{},
                                                     f.transform);
    REQUIRE(plan.ok());
    return std::make_pair(uint64_t{bytes.size()}, plan->bytes());
  };
  // Two samples and a room X for decodes such that neither plan fits in X (both pinned) but
  // each fits once both gave their bytes back: max(p0 - h1, p1 - h0) <= X < min(p0, p1).
  const auto [h0, p0] = plan_of(shard.at(0));
  const auto [h1, p1] = plan_of(shard.at(1));
  const uint64_t low = std::max({p0 > h1 ? p0 - h1 : 0, p1 > h0 ? p1 - h0 : 0, uint64_t{0}});
  INFO("h0 " << h0 << " p0 " << p0 << " h1 " << h1 << " p1 " << p1);
  REQUIRE(low < std::min(p0, p1));
  const uint64_t room = low;
  std::vector<std::vector<uint8_t>> reference;
  for (uint64_t pos : {0, 1}) {
    Gate plain;
    reference.push_back(f.Run(f.Job(shard.at(pos)), plain));
    REQUIRE_FALSE(reference.back().empty());
  }
  {
    ReadAhead ahead(pool, 2, &f.memory, &f.observer, std::chrono::milliseconds(0));
    ahead.Advance(*f.dataset, shard, 0, 0, 1, 1 << 30, nullptr, "");
    std::vector<std::unique_ptr<Gate>> gates;
    std::vector<std::unique_ptr<SampleTask>> tasks;
    for (uint64_t pos : {0, 1}) {
      std::shared_ptr<PrefetchedSample> read = ahead.Take(0, pos);
      REQUIRE(read != nullptr);
      REQUIRE(read->WaitDone([] { return false; }));
      SampleJob job = f.Job(shard.at(pos));
      job.prefetched = read;
      gates.push_back(std::make_unique<Gate>());
      tasks.push_back(std::make_unique<SampleTask>(std::move(job), *gates.back()));
      REQUIRE(tasks.back()->Open());  // its bytes pinned
    }
    REQUIRE(f.memory.read_ahead() >= h0 + h1);
    // Rings and indexes take the rest: what is left beside the pinned bytes is `room`.
    const uint64_t evictable = f.memory.read_ahead() - h0 - h1;  // reads the window started
    auto fixed = f.memory.Reserve(f.memory.limit() - f.memory.decoding() + evictable - room, "rings");
    REQUIRE(fixed.ok());
    std::atomic<bool> drew[2] = {false, false};
    std::vector<std::thread> drawing;
    for (size_t i = 0; i < tasks.size(); ++i) {
      drawing.emplace_back([&, i] {
        if (tasks[i]->DrawMemory() && tasks[i]->ReadBytes()) drew[i] = true;
      });
    }
    // One draw is granted; its decode gives it back, and the other's is granted then.
    const bool one = testing::WaitFor([&] { return drew[0] || drew[1]; }, std::chrono::seconds(30));
    CHECK(one);
    if (!one) *fixed = server::Reservation();  // deadlocked: its bytes back, to let the test end
    bool finished[2] = {false, false};
    for (size_t i = 0; i < 2; ++i) {
      if (!drew[i]) continue;
      CHECK(f.Finish(*tasks[i]) == reference[i]);
      finished[i] = true;
    }
    for (std::thread& t : drawing) t.join();
    CHECK((drew[0] && drew[1]));
    for (size_t i = 0; i < 2; ++i) {
      if (drew[i] && !finished[i]) CHECK(f.Finish(*tasks[i]) == reference[i]);
    }
  }
  CHECK(testing::WaitFor([&] { return f.memory.decoding() == 0; }, std::chrono::seconds(10)));
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

TEST_CASE("ReadAhead: TakeIfDone takes a read only once it is done: one running or queued stays "
          "for its position's turn",
          "[pipeline][read_ahead]") {
  Fixture f;
  ReadPool pool(1);
  WaitIdle idle{pool};
  const EpochShard shard(f.dataset->size(), ShardSpec{});
  f.observer.stuck_index = shard.at(0);  // the pool's one thread is held by position 0's read
  ReadAhead ahead(pool, 2, &f.memory, &f.observer, std::chrono::milliseconds(0));
  ahead.Advance(*f.dataset, shard, 0, 0, 0, 1 << 30, nullptr, "");
  f.observer.stuck.AwaitWaiting(1);
  CHECK(ahead.TakeIfDone(0, 0) == nullptr);  // running
  CHECK(ahead.TakeIfDone(0, 1) == nullptr);  // queued
  CHECK(ahead.TakeIfDone(0, 5) == nullptr);  // never started
  f.observer.stuck.Open();
  testing::WaitFor([&] { return pool.running() == 0 && pool.queued() == 0; },
                   std::chrono::seconds(30));
  std::shared_ptr<PrefetchedSample> first = ahead.TakeIfDone(0, 0);
  REQUIRE(first != nullptr);
  CHECK(first->done());
  CHECK(first->index() == shard.at(0));
  CHECK(ahead.Take(0, 0) == nullptr);  // the caller's now
  std::shared_ptr<PrefetchedSample> second = ahead.Take(0, 1);  // left there for its turn
  REQUIRE(second != nullptr);
  CHECK(second->index() == shard.at(1));
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
    CHECK(ahead.IndexAt(1, 0) == std::nullopt);  // past the stream's end
  }
  ReadAhead ahead(pool, 16, &f.memory, &f.observer, std::chrono::milliseconds(0));
  ahead.Advance(*f.dataset, epoch0, 0, 0, /*end_epoch=*/0, 1 << 30, nullptr, "");
  CHECK(ahead.started() == 16);  // all of epoch 0, then epoch 1's first 4
  // Where a round leases ahead from: the stream's shard, then the next epoch's, as built here.
  for (uint64_t pos = 0; pos < n; ++pos) {
    CHECK(ahead.IndexAt(0, pos) == epoch0.at(pos));
    CHECK(ahead.IndexAt(1, pos) == epoch1.at(pos));
  }
  CHECK(ahead.IndexAt(0, n) == std::nullopt);
  CHECK(ahead.IndexAt(2, 0) == std::nullopt);  // more than an epoch ahead
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

TEST_CASE("ReadAhead: the tails of rounds likely decoded elsewhere (leased to feeders) are not "
          "read ahead, but for a margin next to the local part, and a round all elsewhere reads "
          "nothing",
          "[pipeline][read_ahead]") {
  Fixture f;
  ReadPool pool(2);
  WaitIdle idle{pool};
  const uint64_t n = f.dataset->size();  // 12
  const EpochShard epoch0(n, ShardSpec{});
  const auto read = [&](ReadAhead& ahead, uint64_t epoch, uint64_t pos) {
    std::shared_ptr<PrefetchedSample> r = ahead.Take(epoch, pos);
    if (r != nullptr) r->WaitDone([] { return false; });
    return r != nullptr;
  };
  {
    // Rounds of 6 from cursor 0, their last 5 leased: 2 of those are read anyway (the margin),
    // so positions 0-2 and 6-8 are read, 3-5 and 9-11 are not.
    ReadAhead ahead(pool, 16, &f.memory, &f.observer, std::chrono::milliseconds(0));
    ahead.ExpectElsewhere(6, 5);
    ahead.Advance(*f.dataset, epoch0, 0, 0, /*end_epoch=*/1, 1 << 30, nullptr, "");
    CHECK(ahead.started() == 6);
    for (uint64_t pos = 0; pos < n; ++pos) {
      INFO(pos);
      CHECK(read(ahead, 0, pos) == (pos % 6 < 3));
    }
  }
  {
    // Rounds counted from the cursor: from 1, positions 1-3 and 7-9 are read.
    ReadAhead ahead(pool, 16, &f.memory, &f.observer, std::chrono::milliseconds(0));
    ahead.ExpectElsewhere(6, 5);
    ahead.Advance(*f.dataset, epoch0, 0, 1, /*end_epoch=*/1, 1 << 30, nullptr, "");
    for (uint64_t pos = 1; pos < n; ++pos) {
      INFO(pos);
      CHECK(read(ahead, 0, pos) == ((pos - 1) % 6 < 3));
    }
  }
  {
    // server.local_decode = false: every round elsewhere, nothing read; and positions are
    // passed over only a window (4) past the cursor (no local part is decoded ahead), so that
    // when the feeders fail (the share falls to 0) the reads ahead start right after: before,
    // they ran on to the stream's end.
    ReadAhead ahead(pool, 4, &f.memory, &f.observer, std::chrono::milliseconds(0));
    ahead.ExpectElsewhere(6, 6);
    ahead.Advance(*f.dataset, epoch0, 0, 0, /*end_epoch=*/1, 1 << 30, nullptr, "");
    CHECK(ahead.started() == 0);
    ahead.ExpectElsewhere(6, 0);
    ahead.Advance(*f.dataset, epoch0, 0, 0, /*end_epoch=*/1, 1 << 30, nullptr, "");
    CHECK(ahead.started() == 4);
    for (uint64_t pos = 4; pos < n; ++pos) {
      INFO(pos);
      CHECK(read(ahead, 0, pos));
    }
  }
  {
    // A window (2) smaller than a round: the next round's local part is read all the same once
    // this one's is taken, for the filler decodes it ahead while its feeders are late (with
    // only the window, it ran out of samples read and idled).
    ReadAhead ahead(pool, 2, &f.memory, &f.observer, std::chrono::milliseconds(0));
    ahead.ExpectElsewhere(6, 5);
    ahead.Advance(*f.dataset, epoch0, 0, 0, /*end_epoch=*/1, 1 << 30, nullptr, "");
    for (uint64_t pos = 0; pos < n; ++pos) {
      INFO(pos);
      CHECK(read(ahead, 0, pos) == (pos % 6 < 3));
    }
  }
  {
    // A new guess holds from where the reads have got to: the share gone (its feeders failed),
    // the positions not passed yet are read, the tails too.
    ReadAhead ahead(pool, 2, &f.memory, &f.observer, std::chrono::milliseconds(0));
    ahead.ExpectElsewhere(6, 5);
    ahead.Advance(*f.dataset, epoch0, 0, 0, /*end_epoch=*/1, 1 << 30, nullptr, "");
    CHECK(ahead.started() == 2);  // the window: positions 0 and 1
    ahead.ExpectElsewhere(6, 0);
    for (uint64_t pos = 0; pos < n; ++pos) {
      INFO(pos);
      CHECK(read(ahead, 0, pos));
    }
  }
}

// The storage as the next test has it: while `g_outage`, every open fails with EIO (the mount
// is gone), and the first waits at `*g_first_failure` (when set). Reads through a shard already
// open are not opens: they stand for the pages the kernel kept.
std::atomic<bool> g_outage{false};
std::atomic<int> g_failed_opens{0};
Latch* g_first_failure = nullptr;
int OutageInjector(const std::string&) {
  if (!g_outage.load()) return 0;
  if (g_failed_opens.fetch_add(1) == 0 && g_first_failure != nullptr) g_first_failure->Wait();
  return EIO;
}

// CI's flake of storage_outage_test (38.1): a soft mount failing every request, and samples of
// shards not open yet skipped as io_error, because reads through shards kept open succeeded
// from the page cache and the lane took them as the storage's answers.
TEST_CASE("ReadAhead: a read through a shard kept open is no sign that the storage answers: a "
          "read failing meanwhile waits the outage out instead of ending in io_error",
          "[pipeline][read_ahead]") {
  Fixture f;
  // The fixture's JPEGs as two WebDataset shards of 6, in order.
  const std::string wds_dir = f.dir.Join("wds");
  fs::create_directories(wds_dir);
  for (uint64_t first : {0, 6}) {
    std::string tar;
    for (uint64_t i = first; i < first + 6; ++i) {
      const std::string key = "s" + std::to_string(i);
      AppendTarMember(key + ".jpg", testing::ReadFile(f.dataset->AbsolutePath(i)), tar);
      AppendTarMember(key + ".cls", std::to_string(f.dataset->label(i)), tar);
    }
    AppendTarEnd(tar);
    testing::WriteFile(wds_dir + "/shard-" + std::to_string(first / 6) + ".tar", tar);
  }
  DatasetSpec spec;
  spec.name = "wds";
  spec.format = DatasetFormat::kWebDataset;
  spec.root = wds_dir;
  auto opened = Dataset::Open(spec);
  REQUIRE(opened.ok());
  const std::unique_ptr<Dataset> wds = *std::move(opened);
  REQUIRE(wds->size() == 12);

  Latch first_failure;
  LaneOptions lane_options;
  lane_options.probe = [](uint64_t) { return !g_outage.load(); };  // EIO too, while it lasts
  ReadPool pool(4, std::move(lane_options));
  WaitIdle idle{pool};
  // A budget of 1 ms: one failure counted against the sample ends it in io_error.
  ReadAhead ahead(pool, /*window=*/0, &f.memory, &f.observer, std::chrono::milliseconds(1));
  // First to go, however the test ends: the outage, so that every read ends before the lane.
  struct OutageOver {
    Latch& latch;
    ~OutageOver() {
      g_outage = false;
      latch.Open();
      image::SetReadFaultInjector(nullptr);
      g_first_failure = nullptr;  // a read past its check still holds the latch: it outlives it
    }
  } outage_over{first_failure};
  const EpochShard shard(wds->size(), ShardSpec{.shuffle = false});
  ahead.Advance(*wds, shard, 0, 0, 0, 1 << 30, nullptr, "");
  const auto wait_done = [](PrefetchedSample& read) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    return read.WaitDone([&] { return std::chrono::steady_clock::now() > until; });
  };
  std::shared_ptr<PrefetchedSample> warm = ahead.StartNow(shard.at(0));  // shard-0 stays open
  REQUIRE(warm != nullptr);
  REQUIRE(wait_done(*warm));
  REQUIRE(warm->status().ok());

  image::SetReadFaultInjector(OutageInjector);
  g_first_failure = &first_failure;
  g_failed_opens = 0;
  g_outage = true;
  // X opens shard-1: its first attempt fails, once the test has let it.
  std::shared_ptr<PrefetchedSample> x = ahead.StartNow(shard.at(6));
  REQUIRE(x != nullptr);
  REQUIRE(testing::WaitFor([&] { return first_failure.waiting() == 1; },
                           std::chrono::seconds(30)));
  // Meanwhile Y, of shard-0, succeeds through the open shard: it asked the storage nothing.
  std::shared_ptr<PrefetchedSample> y = ahead.StartNow(shard.at(1));
  REQUIRE(y != nullptr);
  REQUIRE(wait_done(*y));
  CHECK(y->status().ok());
  first_failure.Open();
  // X's failure is the outage's, not its own: it retries (the probes it starts fail too).
  CHECK(testing::WaitFor([&] { return g_failed_opens.load() >= 3 || x->state() ==
                                          PrefetchedSample::State::kDone; },
                         std::chrono::seconds(30)));
  INFO(x->status().ToString());
  CHECK(x->state() != PrefetchedSample::State::kDone);
  g_outage = false;  // the mount is back
  REQUIRE(wait_done(*x));
  CHECK(x->status().ok());
}

}  // namespace
}  // namespace ringloader::pipeline
