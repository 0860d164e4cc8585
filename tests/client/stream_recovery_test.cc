// SPDX-License-Identifier: Apache-2.0
// Stream::Next()'s recovery logic against a fake in-process Loader service that serves batches
// from a real shm ring. The fake exists only to reach what the real daemon cannot be made to do
// on cue: refuse a stream as stale, fail N opens, send a malformed handle. The real daemon's
// behaviour (and SIGKILL recovery) is covered by tests/integration.
#include <catch2/catch.hpp>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "client/client.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "proto/ringloader.grpc.pb.h"
#include "shm/ring.h"
#include "tests/support/test_support.h"

namespace ringloader::client {
namespace {

constexpr uint32_t kImage = 4;  // 4x4x3 uint8 images
constexpr uint32_t kBatch = 2;
constexpr uint64_t kBatchesPerEpoch = 3;
constexpr uint64_t kImageBytes = kImage * kImage * 3;

// Serves epoch e, batch s as samples {e*100 + s*2 + i}; each image is filled with that value.
class FakeLoader final : public v1::Loader::Service {
 public:
  grpc::Status OpenStream(grpc::ServerContext*, const v1::OpenStreamRequest* request,
                          v1::OpenStreamResponse* response) override {
    std::lock_guard lock(mu_);
    opens_.push_back(request->start());
    if (fail_opens_ > 0) {
      --fail_opens_;
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "fake: starting up");
    }
    if (request->spec().dataset() != "fake") {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "unknown dataset '" + request->spec().dataset() + "'");
    }
    shm::RingOptions options;
    options.name = "/" + testing::UniqueName("client-fake");
    options.slot_count = 4;
    options.slot_bytes = 4096;
    options.incarnation = incarnation_;
    auto ring = shm::ProducerRing::Create(options);
    if (!ring.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, ring.status().ToString());
    ring_ = *std::move(ring);  // the previous ring (if any) is unmapped and unlinked here
    end_epoch_ = request->spec().end_epoch();
    position_ = request->start();
    stream_id_ = ++last_stream_id_;
    response->set_stream_id(stream_id_);
    response->set_incarnation(incarnation_);
    response->set_segment_name(options.name);
    response->set_slot_count(options.slot_count);
    response->set_slot_bytes(ring_->slot_bytes());
    return grpc::Status::OK;
  }

  grpc::Status NextBatch(grpc::ServerContext*, const v1::NextBatchRequest* request,
                         v1::NextBatchResponse* response) override {
    std::lock_guard lock(mu_);
    if (request->incarnation() != incarnation_ || request->stream_id() != stream_id_) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "fake: stale stream");
    }
    if (skip_next_batch_) {  // as if another process had taken one batch of this stream
      skip_next_batch_ = false;
      position_.set_sequence(position_.sequence() + 1);
      position_.set_cursor(position_.cursor() + kBatch);
    }
    for (const v1::Release& r : request->releases()) {
      released_.push_back(r.ring_sequence());
      if (!ring_->Release(r.slot(), r.ring_sequence()).ok()) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "fake: bad release");
      }
    }
    if (end_epoch_ != 0 && position_.epoch() >= end_epoch_) {
      response->set_end_of_stream(true);
      return grpc::Status::OK;
    }
    const uint32_t slot = static_cast<uint32_t>(ring_sequence_ % ring_->slot_count());
    if (!ring_->BeginFill(slot).ok()) {  // the client holds every slot
      response->set_pending(true);
      return grpc::Status::OK;
    }
    std::span<uint8_t> payload = ring_->Payload(slot);
    v1::BatchHandle* h = response->mutable_batch();
    const uint64_t first = position_.epoch() * 100 + position_.sequence() * kBatch;
    for (uint32_t i = 0; i < kBatch; ++i) {
      std::memset(payload.data() + i * kImageBytes, static_cast<int>(first + i), kImageBytes);
      const int64_t index = static_cast<int64_t>(first + i), label = index % 10;
      std::memcpy(payload.data() + 1024 + i * 8, &label, 8);
      std::memcpy(payload.data() + 2048 + i * 8, &index, 8);
      h->add_relative_paths("img_" + std::to_string(index) + ".jpg");
    }
    const uint64_t seq = ++ring_sequence_;
    if (!ring_->Publish(slot, seq, 4096).ok() || !ring_->Lease(slot, seq).ok()) {
      return grpc::Status(grpc::StatusCode::INTERNAL, "fake: ring");
    }
    h->set_stream_id(stream_id_);
    h->set_incarnation(incarnation_);
    h->set_slot(slot);
    h->set_ring_sequence(seq);
    *h->mutable_position() = position_;
    h->set_sample_count(kBatch);
    auto view = [](v1::TensorView* v, uint64_t offset, std::vector<uint64_t> shape, v1::DType t,
                   uint64_t bytes) {
      v->set_offset(offset);
      for (uint64_t d : shape) v->add_shape(d);
      v->set_dtype(t);
      v->set_bytes(bytes);
    };
    view(h->mutable_images(), corrupt_offset_ ? 4050 : 0, {kBatch, kImage, kImage, 3},
         v1::DTYPE_UINT8, kBatch * kImageBytes);
    view(h->mutable_labels(), 1024, {kBatch}, v1::DTYPE_INT64, kBatch * 8);
    view(h->mutable_indices(), 2048, {kBatch}, v1::DTYPE_INT64, kBatch * 8);
    h->set_payload_checksum(ring_->Slot(slot).checksum);
    v1::Position next = position_;
    next.set_sequence(next.sequence() + 1);
    next.set_cursor(next.cursor() + kBatch);
    if (next.sequence() == kBatchesPerEpoch) {
      h->set_last_in_epoch(true);
      next.set_epoch(next.epoch() + 1);
      next.set_sequence(0);
      next.set_cursor(0);
    }
    *h->mutable_next() = next;
    position_ = next;
    return grpc::Status::OK;
  }

  grpc::Status CloseStream(grpc::ServerContext*, const v1::CloseStreamRequest*,
                           v1::CloseStreamResponse*) override {
    return grpc::Status::OK;
  }

  // A daemon restart: a new incarnation that knows no streams, and the old ring is gone.
  void Restart() {
    std::lock_guard lock(mu_);
    ++incarnation_;
    stream_id_ = 0;
    ring_.reset();
  }

  std::mutex mu_;
  std::unique_ptr<shm::ProducerRing> ring_;
  uint64_t incarnation_ = 0x1000;
  uint64_t stream_id_ = 0, last_stream_id_ = 0, ring_sequence_ = 0, end_epoch_ = 0;
  v1::Position position_;
  std::vector<v1::Position> opens_;
  std::vector<uint64_t> released_;
  int fail_opens_ = 0;
  bool corrupt_offset_ = false;
  bool skip_next_batch_ = false;
};

struct FakeServer {
  FakeServer() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort(endpoint, grpc::InsecureServerCredentials());
    builder.RegisterService(&service);
    server = builder.BuildAndStart();
    REQUIRE(server != nullptr);
  }
  ~FakeServer() { server->Shutdown(); }
  testing::TempDir dir;
  std::string endpoint = "unix:" + dir.Join("fake.sock");
  FakeLoader service;
  std::unique_ptr<grpc::Server> server;
};

StreamOptions Options() {
  StreamOptions o;
  o.dataset = "fake";
  o.batch_size = kBatch;
  o.image_size = kImage;
  o.reconnect_deadline = std::chrono::seconds(10);
  o.verify_checksums = true;
  return o;
}

int64_t FirstIndex(const Batch& b) { return b.indices().data<int64_t>()[0]; }

TEST_CASE("Stream: a stale stream is reopened at the client's position, held batches survive",
          "[client][recovery]") {
  FakeServer fake;
  Client client(fake.endpoint);
  auto stream = client.Open(Options());
  std::optional<Batch> held = stream->Next();
  REQUIRE(held);
  CHECK(FirstIndex(*held) == 0);
  CHECK(held->relative_path(1) == "img_1.jpg");
  CHECK(held->labels().data<int64_t>()[1] == 1);
  REQUIRE(stream->Next());  // (0, 1), destroyed at once: its release is queued
  CHECK(stream->position() == Position{0, 2, 4});

  fake.service.Restart();  // the old ring is unlinked and unmapped by the "daemon"
  std::optional<Batch> after = stream->Next();
  REQUIRE(after);
  CHECK(after->position() == Position{0, 2, 4});
  CHECK(FirstIndex(*after) == 4);
  CHECK(after->incarnation() == 0x1001);
  CHECK(stream->reconnects() == 1);
  {
    std::lock_guard lock(fake.service.mu_);
    REQUIRE(fake.service.opens_.size() == 2);
    CHECK(fake.service.opens_[1].sequence() == 2);
    CHECK(fake.service.opens_[1].cursor() == 4);
  }
  // The batch from the dead incarnation is still mapped and intact.
  CHECK(held->sample_image(0)[0] == 0);
  CHECK(held->sample_image(1)[kImageBytes - 1] == 1);

  held.reset();  // a release for the old incarnation: must never reach the new stream
  after.reset();
  REQUIRE(stream->Next());
  std::lock_guard lock(fake.service.mu_);
  CHECK(fake.service.released_ == std::vector<uint64_t>{3});  // only the new stream's lease
}

TEST_CASE("Stream: a batch missing from the sequence fails loudly instead of training on a hole",
          "[client][recovery]") {
  FakeServer fake;
  Client client(fake.endpoint);
  auto stream = client.Open(Options());
  REQUIRE(stream->Next());  // (0, 0)
  {
    std::lock_guard lock(fake.service.mu_);
    fake.service.skip_next_batch_ = true;  // (0, 1) goes elsewhere
  }
  try {
    stream->Next();
    FAIL("a gap went unnoticed");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kDataLoss);
    CHECK_THAT(e.what(), Catch::Contains("batch gap: expected epoch 0 sequence 1") &&
                             Catch::Contains("sent epoch 0 sequence 2"));
  }
}

TEST_CASE("Stream: runs to end_epoch and resumes from State() at the next batch",
          "[client][recovery]") {
  FakeServer fake;
  Client client(fake.endpoint);
  StreamOptions o = Options();
  o.end_epoch = 2;
  auto stream = client.Open(o);
  std::vector<int64_t> seen;
  std::string state;
  while (auto batch = stream->Next()) {
    seen.push_back(FirstIndex(*batch));
    if (seen.size() == 4) state = stream->State();
  }
  CHECK(seen == std::vector<int64_t>{0, 2, 4, 100, 102, 104});
  CHECK_FALSE(stream->Next());
  CHECK_THAT(state, Catch::Contains("epoch=1 sequence=1 cursor=2"));

  auto resumed = client.Resume(state);
  std::vector<int64_t> rest;
  while (auto batch = resumed->Next()) rest.push_back(FirstIndex(*batch));
  CHECK(rest == std::vector<int64_t>{102, 104});
}

TEST_CASE("Client::Open: retries UNAVAILABLE, fails at once on an unknown dataset",
          "[client][recovery]") {
  FakeServer fake;
  fake.service.fail_opens_ = 3;
  Client client(fake.endpoint);
  auto stream = client.Open(Options());
  CHECK(stream->reconnects() == 0);
  REQUIRE(stream->Next());

  StreamOptions o = Options();
  o.dataset = "nope";
  try {
    client.Open(o);
    FAIL("opened an unknown dataset");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kNotFound);
    CHECK(std::string(e.what()) == "unknown dataset 'nope'");
  }
}

TEST_CASE("Stream: a handle pointing outside its slot is refused", "[client][recovery]") {
  FakeServer fake;
  fake.service.corrupt_offset_ = true;
  Client client(fake.endpoint);
  auto stream = client.Open(Options());
  try {
    stream->Next();
    FAIL("accepted an out-of-bounds handle");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kInternal);
    CHECK_THAT(e.what(), Catch::Contains("images") && Catch::Contains("outside the slot"));
  }
}

}  // namespace
}  // namespace ringloader::client
