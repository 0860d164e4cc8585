// SPDX-License-Identifier: Apache-2.0
// server/daemon/stream_manager without gRPC: a real synthetic dataset, a real WorkerPool and
// BatchFiller, real shared-memory rings, and the requests a hostile or broken client could send.
#include "server/daemon/stream_manager.h"

#include <catch2/catch.hpp>
#include <sys/stat.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

#include "server/daemon/sample_gate.h"
#include "server/image/synthetic.h"
#include "server/pipeline/worker_pool.h"
#include "tests/support/test_support.h"

namespace ringloader::server {
namespace {

constexpr uint64_t kIncarnation = 0xfeed;
constexpr uint32_t kImages = 40;

// Everything a StreamManager needs, owned in the order the daemon owns it.
struct Harness {
  explicit Harness(const std::function<void(DaemonConfig&)>& configure = {},
                   const std::string& bad_file = "",
                   pipeline::SampleObserver* observer = nullptr) {
    image::SyntheticDatasetOptions ds;
    ds.out_dir = dir.Join("data");
    ds.count = kImages;
    ds.classes = 2;
    ds.seed = 3;
    REQUIRE(image::WriteSyntheticDataset(ds).ok());
    if (!bad_file.empty()) testing::WriteFile(dir.Join("data/" + bad_file), "not a jpeg");

    DatasetConfig dc;
    dc.name = "synth";
    dc.path = dir.Join("data");
    config.source = "test.toml";
    config.server.state_dir = dir.Join("state");
    config.server.memory_limit_bytes = 256ull << 20;
    config.server.max_wait_ms = 2000;
    config.datasets.push_back(dc);
    if (configure) configure(config);

    pipeline::DatasetSpec spec;
    spec.name = "synth";
    spec.root = dc.path;
    absl::StatusOr<std::unique_ptr<pipeline::Dataset>> opened = pipeline::Dataset::Open(spec);
    REQUIRE(opened.ok());
    datasets.Add(config.datasets[0], std::move(*opened));
    budget = std::make_unique<MemoryBudget>(config.server.memory_limit_bytes);
    quarantine = *Quarantine::Load(dir.path());
    failpoints = std::make_unique<Failpoints>(FailpointConfig{});
    pool = std::make_unique<pipeline::WorkerPool>(2);
    filler = std::make_unique<pipeline::BatchFiller>(*pool, image::DecodeLimits{});
    StreamManagerDeps deps{&config,       &datasets,        filler.get(),
                           observer,      &stats,           budget.get(),
                           quarantine.get(), failpoints.get(), kIncarnation,
                           std::chrono::steady_clock::now()};
    manager = std::make_unique<StreamManager>(deps);
  }
  ~Harness() { manager->Shutdown(); }

  v1::OpenStreamResponse MustOpen(const v1::OpenStreamRequest& request,
                                  const std::string& peer = "") {
    v1::OpenStreamResponse response;
    absl::Status s = manager->Open(request, &response, peer);
    INFO(s.ToString());
    REQUIRE(s.ok());
    tokens[response.stream_id()] = response.stream_token();
    return response;
  }
  // Next until a batch, end of stream or an error.
  absl::Status NextBatch(const v1::OpenStreamResponse& stream, v1::NextBatchResponse* out,
                         std::vector<v1::Release> releases = {}) {
    for (int i = 0; i < 50; ++i) {
      v1::NextBatchRequest request;
      request.set_stream_id(stream.stream_id());
      request.set_incarnation(stream.incarnation());
      request.set_stream_token(stream.stream_token());
      request.set_wait_ms(500);
      for (const v1::Release& r : releases) *request.add_releases() = r;
      releases.clear();
      out->Clear();
      absl::Status s = manager->Next(request, out);
      if (!s.ok() || !out->pending()) return s;
    }
    return absl::DeadlineExceededError("no batch");
  }
  absl::Status Release(const v1::OpenStreamResponse& stream, uint32_t slot, uint64_t seq,
                       uint64_t incarnation = kIncarnation) {
    v1::ReleaseBatchesRequest request;
    request.set_stream_id(stream.stream_id());
    request.set_incarnation(incarnation);
    request.set_stream_token(stream.stream_token());
    v1::Release* r = request.add_releases();
    r->set_slot(slot);
    r->set_ring_sequence(seq);
    return manager->Release(request);
  }
  absl::Status Close(uint64_t id, uint64_t incarnation = kIncarnation) {
    v1::CloseStreamRequest request;
    request.set_stream_id(id);
    request.set_incarnation(incarnation);
    request.set_stream_token(tokens[id]);
    return manager->Close(request);
  }
  std::map<uint64_t, std::string> tokens;  // stream id -> its token, from MustOpen

  testing::TempDir dir;
  DaemonConfig config;
  DatasetRegistry datasets;
  std::unique_ptr<MemoryBudget> budget;
  std::unique_ptr<Quarantine> quarantine;
  std::unique_ptr<Failpoints> failpoints;
  DaemonStats stats;
  std::unique_ptr<pipeline::WorkerPool> pool;
  std::unique_ptr<pipeline::BatchFiller> filler;
  std::unique_ptr<StreamManager> manager;
};

v1::OpenStreamRequest Request(uint32_t batch = 8, uint64_t end_epoch = 0) {
  v1::OpenStreamRequest r;
  v1::StreamSpec* s = r.mutable_spec();
  s->set_dataset("synth");
  s->set_batch_size(batch);
  s->set_image_size(32);
  s->set_seed(1);
  s->set_shuffle(true);
  s->set_end_epoch(end_epoch);
  r.set_client_name("unit");
  return r;
}

void ExpectStatus(const absl::Status& s, absl::StatusCode code, const std::string& fragment) {
  INFO(s.ToString());
  CHECK(s.code() == code);
  CHECK_THAT(std::string(s.message()), Catch::Contains(fragment));
}

bool SegmentExists(const std::string& name) {
  struct stat st;
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

}  // namespace

TEST_CASE("13.4: ring_slots = 0 gives four slots, three for batches over 8 MiB, and a number in "
          "the config or the request wins",
          "[daemon][streams]") {
  const auto big = [] {  // 48 x 256 x 256 x 3 uint8: 9 MiB
    v1::OpenStreamRequest r = Request(48);
    r.mutable_spec()->set_image_size(256);
    return r;
  };
  {
    Harness h;
    CHECK(h.MustOpen(Request()).slot_count() == 4);
    v1::OpenStreamRequest under = Request(40);  // 40 x 256 x 256 x 3: 7.5 MiB
    under.mutable_spec()->set_image_size(256);
    CHECK(h.MustOpen(under).slot_count() == 4);
    CHECK(h.MustOpen(big()).slot_count() == 3);
    v1::OpenStreamRequest asked = big();
    asked.mutable_spec()->set_ring_slots(5);
    CHECK(h.MustOpen(asked).slot_count() == 5);
  }
  Harness configured([](DaemonConfig& c) { c.server.ring_slots = 6; });
  CHECK(configured.MustOpen(big()).slot_count() == 6);
  CHECK(configured.MustOpen(Request()).slot_count() == 6);
}

TEST_CASE("StreamManager: open, lease, release, close", "[daemon][streams]") {
  Harness h;
  const uint64_t fixed = h.budget->reserved();
  v1::OpenStreamResponse open = h.MustOpen(Request());
  CHECK(open.stream_id() == 1);
  CHECK(open.incarnation() == kIncarnation);
  CHECK(open.slot_count() == 4);
  CHECK(open.dataset_size() == kImages);
  CHECK(open.samples_per_epoch() == kImages);
  CHECK(open.batches_per_epoch() == 5);
  CHECK(SegmentExists(open.segment_name()));
  CHECK(h.budget->reserved() > fixed + 4 * 8 * 32 * 32 * 3);
  CHECK(h.manager->open_streams() == 1);

  v1::NextBatchResponse next;
  REQUIRE(h.NextBatch(open, &next).ok());
  REQUIRE(next.has_batch());
  const v1::BatchHandle first = next.batch();
  CHECK(first.stream_id() == open.stream_id());
  CHECK(first.sample_count() == 8);
  CHECK(first.position().sequence() == 0);
  CHECK(first.next().sequence() == 1);
  CHECK(first.relative_paths_size() == 8);

  CHECK(h.Release(open, first.slot(), first.ring_sequence()).ok());
  // Released twice.
  ExpectStatus(h.Release(open, first.slot(), first.ring_sequence()),
               absl::StatusCode::kFailedPrecondition, "release of slot");
  // A slot the ring does not have.
  ExpectStatus(h.Release(open, 4, 0), absl::StatusCode::kInvalidArgument,
               "slot 4 out of range (ring has 4)");
  // A sequence that was never leased.
  ExpectStatus(h.Release(open, 1, 77), absl::StatusCode::kFailedPrecondition, "release of slot");

  // Releases piggybacked on Next are applied first; a bad one is counted, the batch still comes.
  v1::NextBatchResponse second;
  REQUIRE(h.NextBatch(open, &second).ok());
  v1::Release r;
  r.set_slot(second.batch().slot());
  r.set_ring_sequence(second.batch().ring_sequence());
  v1::Release bogus;
  bogus.set_slot(3);
  bogus.set_ring_sequence(999);
  const uint64_t rejected = h.stats.requests_rejected.load();
  v1::NextBatchResponse third;
  REQUIRE(h.NextBatch(open, &third, {r, bogus}).ok());
  CHECK(third.batch().position().sequence() == 2);
  CHECK(h.stats.requests_rejected.load() == rejected + 1);

  v1::GetStatsResponse stats;
  h.manager->Stats(&stats);
  CHECK(stats.streams_open() == 1);
  REQUIRE(stats.streams_size() == 1);
  CHECK(stats.streams(0).batches_served() == 3);
  CHECK(stats.streams(0).slots_leased() == 1);
  CHECK(stats.streams(0).client_name() == "unit");
  CHECK(stats.memory_reserved_bytes() == h.budget->reserved());

  REQUIRE(h.Close(open.stream_id()).ok());
  CHECK_FALSE(SegmentExists(open.segment_name()));
  CHECK(h.budget->reserved() == fixed);
  CHECK(h.manager->open_streams() == 0);
  ExpectStatus(h.Close(open.stream_id()), absl::StatusCode::kNotFound, "not found");
  v1::NextBatchResponse after;
  ExpectStatus(h.NextBatch(open, &after), absl::StatusCode::kNotFound,
               "stream 1 not found (closed, or idle past the timeout)");
  ExpectStatus(h.Release(open, 0, 0), absl::StatusCode::kNotFound, "not found");
}

TEST_CASE("StreamManager: one epoch delivers each sample once, then end of stream",
          "[daemon][streams]") {
  Harness h;
  v1::OpenStreamResponse open = h.MustOpen(Request(16, 1));
  std::multiset<std::string> paths;
  std::vector<v1::Release> releases;
  while (true) {
    v1::NextBatchResponse next;
    REQUIRE(h.NextBatch(open, &next, releases).ok());
    releases.clear();
    if (next.end_of_stream()) break;
    REQUIRE(next.has_batch());
    for (const std::string& p : next.batch().relative_paths()) paths.insert(p);
    v1::Release r;
    r.set_slot(next.batch().slot());
    r.set_ring_sequence(next.batch().ring_sequence());
    releases.push_back(r);
  }
  CHECK(paths.size() == kImages);
  CHECK(std::set<std::string>(paths.begin(), paths.end()).size() == kImages);
  v1::NextBatchResponse again;  // still the end
  REQUIRE(h.NextBatch(open, &again).ok());
  CHECK(again.end_of_stream());
}

TEST_CASE("StreamManager: invalid requests are refused naming the field, and counted",
          "[daemon][streams]") {
  Harness h;
  auto refused = [&](const std::function<void(v1::OpenStreamRequest&)>& mutate,
                     absl::StatusCode code, const std::string& fragment) {
    v1::OpenStreamRequest r = Request();
    mutate(r);
    v1::OpenStreamResponse response;
    ExpectStatus(h.manager->Open(r, &response), code, fragment);
  };
  using C = absl::StatusCode;
  refused([](auto& r) { r.mutable_spec()->set_batch_size(0); }, C::kInvalidArgument,
          "batch_size: must be in [1, server.max_batch_size = 4096] (got 0)");
  refused([](auto& r) { r.mutable_spec()->set_batch_size(1'000'000'000); }, C::kInvalidArgument,
          "batch_size");
  refused([](auto& r) { r.mutable_spec()->set_image_size(0); }, C::kInvalidArgument,
          "image_size: must be in [1, server.max_image_size = 1024] (got 0)");
  refused([](auto& r) { r.mutable_spec()->set_image_size(100000); }, C::kInvalidArgument,
          "image_size");
  refused(
      [](auto& r) {
        r.mutable_spec()->set_rank(2);
        r.mutable_spec()->set_world_size(2);
      },
      C::kInvalidArgument, "rank: must be < world_size (got rank 2, world_size 2)");
  refused([](auto& r) { r.mutable_spec()->set_rank(0xFFFFFFFFu); }, C::kInvalidArgument, "rank");
  refused([](auto& r) { r.mutable_spec()->set_ring_slots(1); }, C::kInvalidArgument, "ring_slots");
  refused([](auto& r) { r.mutable_spec()->set_dtype(v1::DTYPE_INT64); }, C::kInvalidArgument,
          "dtype");
  refused([](auto& r) { r.mutable_start()->set_cursor(kImages + 1); }, C::kInvalidArgument,
          "start.cursor");
  refused([](auto& r) { r.mutable_spec()->set_dataset("../etc"); }, C::kNotFound,
          "unknown dataset \"../etc\"; configured: synth");
  CHECK(h.stats.requests_rejected.load() == 10);
  CHECK(h.manager->open_streams() == 0);
  CHECK(h.budget->reserved() == 0);
}

TEST_CASE("StreamManager: another incarnation's stream or handle is FAILED_PRECONDITION",
          "[daemon][streams]") {
  Harness h;
  v1::OpenStreamResponse open = h.MustOpen(Request());
  v1::NextBatchResponse next;
  REQUIRE(h.NextBatch(open, &next).ok());
  v1::OpenStreamResponse stale = open;
  stale.set_incarnation(kIncarnation + 1);
  v1::NextBatchResponse response;
  ExpectStatus(h.NextBatch(stale, &response), absl::StatusCode::kFailedPrecondition,
               "stream 1 belongs to daemon incarnation 65262; this daemon is incarnation 65261");
  ExpectStatus(h.Release(open, next.batch().slot(), next.batch().ring_sequence(), 0),
               absl::StatusCode::kFailedPrecondition, "reopen the stream");
  ExpectStatus(h.Close(open.stream_id(), 7), absl::StatusCode::kFailedPrecondition, "incarnation");
  // The stream itself is untouched: its handle is still leased and releases normally.
  CHECK(h.Release(open, next.batch().slot(), next.batch().ring_sequence()).ok());
}

TEST_CASE("StreamManager: a client holding every slot gets RESOURCE_EXHAUSTED",
          "[daemon][streams]") {
  Harness h;
  v1::OpenStreamRequest r = Request();
  r.mutable_spec()->set_ring_slots(2);
  v1::OpenStreamResponse open = h.MustOpen(r);
  v1::NextBatchResponse a, b, c;
  REQUIRE(h.NextBatch(open, &a).ok());
  REQUIRE(h.NextBatch(open, &b).ok());
  ExpectStatus(h.NextBatch(open, &c), absl::StatusCode::kResourceExhausted,
               "the client holds all 2 ring slots");
  REQUIRE(h.Release(open, a.batch().slot(), a.batch().ring_sequence()).ok());
  REQUIRE(h.NextBatch(open, &c).ok());
  CHECK(c.batch().position().sequence() == 2);
}

// Issue 26: with 2 slots, a client that keeps its previous batch while it asks for the next
// waits for the look-ahead (the batch kept unpublished near the epoch's end) while holding the
// other slot. The producer was asleep waiting for a slot and Next() never woke it: a hang.
TEST_CASE("StreamManager: a 2-slot ring whose client keeps its previous batch never hangs at the "
          "epoch's look-ahead",
          "[daemon][streams]") {
  Harness h;
  v1::OpenStreamRequest r = Request(/*batch=*/8, /*end_epoch=*/2);
  r.mutable_spec()->set_ring_slots(2);
  const v1::OpenStreamResponse open = h.MustOpen(r);
  std::shared_ptr<const Stream> stream = h.manager->FindStream(open.stream_id());
  REQUIRE(stream != nullptr);
  // 40 samples in batches of 8: after batch 3 only 8 remain (< 2 batches), so batch 3 is kept as
  // the look-ahead until batch 4 is filled.
  v1::NextBatchResponse previous;
  REQUIRE(h.NextBatch(open, &previous).ok());
  std::vector<v1::Position> seen{previous.batch().position()};
  for (int taken = 1; taken < 4; ++taken) {
    if (taken == 3) {
      // The producer keeps batch 3 and sleeps for a slot; only then does the client ask.
      REQUIRE(stream->schedule().AwaitState(ProducerState::kAwaitingSlotBehindLookAhead,
                                            std::chrono::seconds(10)));
      REQUIRE(stream->schedule().AwaitProducerWaiting(std::chrono::seconds(10)));
    }
    v1::Release keep_previous_until_now;  // released with the request after the next one
    keep_previous_until_now.set_slot(previous.batch().slot());
    keep_previous_until_now.set_ring_sequence(previous.batch().ring_sequence());
    // `previous` stays leased during the wait. One call with a long wait: a retry loop would
    // hide the hang (each ended call wakes the producer, which may then see the next one).
    v1::NextBatchRequest request;
    request.set_stream_id(open.stream_id());
    request.set_incarnation(open.incarnation());
    request.set_stream_token(open.stream_token());
    request.set_wait_ms(10'000);
    v1::NextBatchResponse next;
    REQUIRE(h.manager->Next(request, &next).ok());
    REQUIRE(next.has_batch());
    seen.push_back(next.batch().position());
    REQUIRE(h.Release(open, keep_previous_until_now.slot(),
                      keep_previous_until_now.ring_sequence()).ok());
    previous = next;
  }
  CHECK(seen[3].sequence() == 3);
  // Batch 3 went out unmarked (its client waited for it), so the epoch's end shows as the next
  // epoch's first batch; every batch still comes, in order.
  for (int i = 0; i < 20; ++i) {
    v1::NextBatchResponse next;
    REQUIRE(h.NextBatch(open, &next).ok());
    if (next.end_of_stream()) break;
    REQUIRE(next.has_batch());
    REQUIRE(h.Release(open, next.batch().slot(), next.batch().ring_sequence()).ok());
    seen.push_back(next.batch().position());
  }
  CHECK(seen.size() == 10);  // 5 batches in each of 2 epochs
  CHECK(seen.back().epoch() == 1);
}

TEST_CASE("StreamManager: a held slot never stops the producer: it fills the others as they "
          "come free, and counts batches the client copied out",
          "[daemon][streams]") {
  Harness h;
  v1::OpenStreamRequest r = Request(4);
  r.mutable_spec()->set_ring_slots(4);
  v1::OpenStreamResponse open = h.MustOpen(r);
  v1::NextBatchResponse kept;
  REQUIRE(h.NextBatch(open, &kept).ok());  // held for the whole test
  // Six more batches, each released before the next: the ring cycles through the 3 other slots
  // (with slots taken in sequence order, batch 4 would wait for the held slot 0 for ever).
  for (uint64_t seq = 1; seq <= 6; ++seq) {
    v1::NextBatchResponse b;
    REQUIRE(h.NextBatch(open, &b).ok());
    CHECK(b.batch().position().sequence() == seq);
    CHECK(b.batch().slot() != kept.batch().slot());
    REQUIRE(h.Release(open, b.batch().slot(), b.batch().ring_sequence()).ok());
  }
  // ...and all three are filled ahead while the client still holds the first.
  auto ready = [&] {
    v1::GetStatsResponse stats;
    h.manager->Stats(&stats);
    return stats.streams(0).slots_ready();
  };
  REQUIRE(testing::WaitFor([&] { return ready() == 3; }, std::chrono::seconds(10)));
  // A copy-out release frees the slot and is counted.
  v1::ReleaseBatchesRequest release;
  release.set_stream_id(open.stream_id());
  release.set_incarnation(open.incarnation());
  release.set_stream_token(open.stream_token());
  v1::Release* rel = release.add_releases();
  rel->set_slot(kept.batch().slot());
  rel->set_ring_sequence(kept.batch().ring_sequence());
  rel->set_copied_out(true);
  REQUIRE(h.manager->Release(release).ok());
  v1::GetStatsResponse stats;
  h.manager->Stats(&stats);
  CHECK(stats.batches_copied_out() == 1);
  CHECK(stats.streams(0).batches_copied_out() == 1);
}

TEST_CASE("StreamManager: memory_limit refuses a ring that does not fit, with the numbers",
          "[daemon][streams][limits]") {
  Harness h([](DaemonConfig& c) { c.server.memory_limit_bytes = 4ull << 20; });
  v1::OpenStreamRequest big = Request(64);
  big.mutable_spec()->set_image_size(128);  // 64 x 48 KiB = 3 MiB a slot, 4 slots
  v1::OpenStreamResponse response;
  ExpectStatus(h.manager->Open(big, &response), absl::StatusCode::kResourceExhausted,
               "a stream of dataset \"synth\" (ring of 4 slots x 3.0 MiB) needs 12.1 MiB; "
               "memory_limit 4 MiB has 4 MiB free (0 B reserved)");
  // Two small streams fit; the third does not; closing one makes room.
  v1::OpenStreamRequest small = Request(8);
  small.mutable_spec()->set_image_size(128);  // 384 KiB a slot, ~1.6 MiB a stream
  v1::OpenStreamResponse s1 = h.MustOpen(small);
  v1::OpenStreamResponse s2 = h.MustOpen(small);
  const uint64_t two = h.budget->reserved();
  ExpectStatus(h.manager->Open(small, &response), absl::StatusCode::kResourceExhausted,
               "memory_limit 4 MiB");
  CHECK(h.budget->reserved() == two);
  REQUIRE(h.Close(s1.stream_id()).ok());
  v1::OpenStreamResponse s3 = h.MustOpen(small);
  REQUIRE(h.Close(s2.stream_id()).ok());
  REQUIRE(h.Close(s3.stream_id()).ok());
  CHECK(h.budget->reserved() == 0);
}

TEST_CASE("StreamManager: max_streams in total and max_streams_per_client per TCP host",
          "[daemon][streams][limits]") {
  Harness h([](DaemonConfig& c) {
    c.server.max_streams = 4;
    c.server.max_streams_per_client = 2;
  });
  v1::OpenStreamResponse a = h.MustOpen(Request(), "ipv4:10.0.0.1:4000");
  h.MustOpen(Request(), "ipv4:10.0.0.1:4001");  // another connection of the same host
  v1::OpenStreamResponse response;
  ExpectStatus(h.manager->Open(Request(), &response, "ipv4:10.0.0.1:4002"),
               absl::StatusCode::kResourceExhausted,
               "too many open streams from ipv4:10.0.0.1 (server.max_streams_per_client = 2)");
  h.MustOpen(Request(), "ipv6:[::1]:4000");  // another host
  // Unix-socket peers are not told apart: only the total applies to them.
  h.MustOpen(Request(), "unix:");
  ExpectStatus(h.manager->Open(Request(), &response, "unix:"),
               absl::StatusCode::kResourceExhausted,
               "too many open streams (server.max_streams = 4)");
  REQUIRE(h.Close(a.stream_id()).ok());
  h.MustOpen(Request(), "ipv4:10.0.0.1:4003");
  CHECK(h.manager->open_streams() == 4);
}

TEST_CASE("ClientKeyOfPeer: the TCP host, nothing for Unix sockets", "[daemon][streams]") {
  CHECK(ClientKeyOfPeer("ipv4:127.0.0.1:5000") == "ipv4:127.0.0.1");
  CHECK(ClientKeyOfPeer("ipv6:[::1]:5000") == "ipv6:[::1]");
  CHECK(ClientKeyOfPeer("ipv6:[fe80::1%eth0]:1") == "ipv6:[fe80::1%eth0]");
  CHECK(ClientKeyOfPeer("ipv4:10.1.2.3") == "ipv4:10.1.2.3");
  CHECK(ClientKeyOfPeer("unix:") == "");
  CHECK(ClientKeyOfPeer("unix:/run/x.sock") == "");
  CHECK(ClientKeyOfPeer("") == "");
  CHECK(ClientKeyOfPeer("unix-abstract:foo") == "");
}

TEST_CASE("StreamManager: the reaper closes an idle stream and returns its memory",
          "[daemon][streams]") {
  Harness h([](DaemonConfig& c) { c.server.stream_idle_timeout_ms = 300; });
  h.manager->StartReaper();
  v1::OpenStreamResponse idle = h.MustOpen(Request());
  v1::OpenStreamResponse busy = h.MustOpen(Request());
  v1::NextBatchResponse held;
  REQUIRE(h.NextBatch(idle, &held).ok());  // a lease the client never gives back
  const uint64_t one = h.budget->reserved() / 2;
  // `busy` keeps asking; `idle` goes quiet.
  std::vector<v1::Release> releases;
  REQUIRE(testing::WaitFor(
      [&] {
        v1::NextBatchResponse next;
        REQUIRE(h.NextBatch(busy, &next, releases).ok());
        releases.clear();
        if (next.has_batch()) {
          v1::Release r;
          r.set_slot(next.batch().slot());
          r.set_ring_sequence(next.batch().ring_sequence());
          releases.push_back(r);
        }
        // The effects themselves, not a proxy: the stream leaves the table before it is stopped,
        // and its segment and memory go only when it is.
        return h.manager->open_streams() == 1 && !SegmentExists(idle.segment_name()) &&
               h.budget->reserved() == one;
      },
      std::chrono::seconds(8)));
  CHECK_FALSE(SegmentExists(idle.segment_name()));
  CHECK(SegmentExists(busy.segment_name()));
  CHECK(h.budget->reserved() == one);
  v1::NextBatchResponse gone;
  ExpectStatus(h.NextBatch(idle, &gone), absl::StatusCode::kNotFound, "idle past the timeout");
}

TEST_CASE("StreamManager: on_error = fail ends the stream with DATA_LOSS naming the file",
          "[daemon][streams]") {
  Harness h([](DaemonConfig& c) { c.datasets[0].on_error = pipeline::OnError::kFail; },
            "class_00/zz_broken.jpg");
  v1::OpenStreamResponse open = h.MustOpen(Request(8, 1));
  absl::Status end;
  std::vector<v1::Release> releases;
  for (int i = 0; i < 10 && end.ok(); ++i) {
    v1::NextBatchResponse next;
    end = h.NextBatch(open, &next, releases);
    releases.clear();
    if (end.ok() && next.has_batch()) {
      v1::Release r;
      r.set_slot(next.batch().slot());
      r.set_ring_sequence(next.batch().ring_sequence());
      releases.push_back(r);
    }
    if (end.ok() && next.end_of_stream()) FAIL("ended without an error");
  }
  ExpectStatus(end, absl::StatusCode::kDataLoss, "class_00/zz_broken.jpg");
  CHECK(h.stats.requests_rejected.load() == 0);  // a data error is not the client's fault
}

}  // namespace ringloader::server

namespace ringloader::server {
namespace {

// Holds every decode until released: the producer is stuck, so a NextBatch waits its full time.
class StallingObserver : public pipeline::SampleObserver {
 public:
  absl::Status BeforeDecode(const pipeline::Dataset&, uint64_t, uint32_t) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
    return absl::OkStatus();
  }
  void AfterDecode(const pipeline::Dataset&, uint64_t, uint32_t) override {}
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace

TEST_CASE("StreamManager: a client waiting in NextBatch longer than the idle timeout is not "
          "reaped",
          "[daemon][streams]") {
  StallingObserver stall;
  Harness h(
      [](DaemonConfig& c) {
        c.server.stream_idle_timeout_ms = 300;
        c.server.max_wait_ms = 1500;
      },
      "", &stall);
  h.manager->StartReaper();
  v1::OpenStreamResponse open = h.MustOpen(Request());
  v1::NextBatchRequest request;
  request.set_stream_id(open.stream_id());
  request.set_incarnation(open.incarnation());
  request.set_stream_token(open.stream_token());
  request.set_wait_ms(1500);
  v1::NextBatchResponse response;
  absl::Status waited = h.manager->Next(request, &response);  // 1.5 s with nothing to lease
  INFO(waited.ToString());
  CHECK(waited.ok());
  CHECK(response.pending());
  CHECK(h.manager->open_streams() == 1);
  stall.Open();
  v1::NextBatchResponse batch;
  CHECK(h.NextBatch(open, &batch).ok());
  CHECK(batch.has_batch());
}

}  // namespace ringloader::server

namespace ringloader::server {

TEST_CASE("StreamManager: concurrent opens never exceed max_streams", "[daemon][streams][limits]") {
  Harness h([](DaemonConfig& c) { c.server.max_streams = 3; });
  std::atomic<int> opened{0}, refused{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      v1::OpenStreamResponse response;
      absl::Status s = h.manager->Open(Request(), &response);
      if (s.ok()) {
        ++opened;
      } else if (s.code() == absl::StatusCode::kResourceExhausted) {
        ++refused;
      }
    });
  }
  for (auto& t : threads) t.join();
  CHECK(opened == 3);
  CHECK(refused == 5);
  CHECK(h.manager->open_streams() == 3);
}

}  // namespace ringloader::server
