// SPDX-License-Identifier: Apache-2.0
// Issue 6, "Hostile and broken clients" and "Hard limits": raw gRPC calls a well-behaved client
// would never make, against a real ringloaderd. Each gets INVALID_ARGUMENT / NOT_FOUND /
// FAILED_PRECONDITION / RESOURCE_EXHAUSTED with a message, and after each, a stream opened before
// (read through the real C++ client) keeps delivering the same bytes it would have delivered
// anyway, and health stays SERVING.
//
// Negative values: every count in the protocol is a proto3 uint32/uint64, so a client cannot send
// a negative number as such; a client that encodes int32 -1 (a 10-byte varint) into such a field
// is read as 4294967295 (uint32) or 2^64-1 (uint64) -- too large, and refused as such. The tests
// send exactly those bytes.
#include <catch2/catch.hpp>
#include <fcntl.h>
#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <array>
#include <cmath>
#include <map>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <functional>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "client/client.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "proto/health.grpc.pb.h"
#include "proto/ringloader.grpc.pb.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

using grpc::StatusCode;

constexpr char kLoader[] = "/ringloader.v1.Loader/";

// ---- wire helpers ----------------------------------------------------------------------------

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}
// A varint field as a client that encodes int32 -1 would write it.
std::string MinusOne(uint32_t field) {
  return Varint(uint64_t{field} << 3) + Varint(static_cast<uint64_t>(int64_t{-1}));
}
std::string Bytes(uint32_t field, const std::string& bytes) {
  return Varint(uint64_t{field} << 3 | 2) + Varint(bytes.size()) + bytes;
}

// A channel with its own connection (gRPC shares connections to one address between channels
// by default; after a daemon restart the shared one would be the dead daemon's).
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& endpoint) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(endpoint, grpc::InsecureChannelCredentials(), args);
}

// Raw access to the daemon: typed stubs, and bytes-level calls through a generic stub.
class Raw {
 public:
  explicit Raw(const std::string& endpoint)
      : channel_(OwnChannel(endpoint)),
        loader_(v1::Loader::NewStub(channel_)),
        health_(grpc::health::v1::Health::NewStub(channel_)),
        generic_(channel_) {}

  // Sends `payload` as the request of `method` ("/pkg.Service/Method").
  grpc::Status Call(const std::string& method, const std::string& payload,
                    std::string* response = nullptr) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::CompletionQueue cq;
    grpc::Slice slice(payload);
    grpc::ByteBuffer request(&slice, 1);
    grpc::ByteBuffer reply;
    grpc::Status status;
    auto call = generic_.PrepareUnaryCall(&context, method, request, &cq);
    call->StartCall();
    call->Finish(&reply, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    REQUIRE(cq.Next(&tag, &ok));
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    if (response != nullptr && status.ok()) {
      std::vector<grpc::Slice> slices;
      REQUIRE(reply.Dump(&slices).ok());
      response->clear();
      for (const grpc::Slice& s : slices) {
        response->append(reinterpret_cast<const char*>(s.begin()), s.size());
      }
    }
    return status;
  }

  // Requests on a stream this client opened carry its token unless they set one themselves.
  grpc::Status Open(const v1::OpenStreamRequest& request, v1::OpenStreamResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    grpc::Status s = loader_->OpenStream(&context, request, response);
    if (s.ok()) tokens_[response->stream_id()] = response->stream_token();
    return s;
  }
  std::string Token(uint64_t stream_id) { return tokens_[stream_id]; }
  grpc::Status Next(v1::NextBatchRequest request, v1::NextBatchResponse* response) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (request.stream_token().empty()) request.set_stream_token(Token(request.stream_id()));
    return loader_->NextBatch(&context, request, response);
  }
  grpc::Status Release(v1::ReleaseBatchesRequest request) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    if (request.stream_token().empty()) request.set_stream_token(Token(request.stream_id()));
    v1::ReleaseBatchesResponse response;
    return loader_->ReleaseBatches(&context, request, &response);
  }
  grpc::Status Close(uint64_t stream_id, uint64_t incarnation) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::CloseStreamRequest request;
    request.set_stream_id(stream_id);
    request.set_incarnation(incarnation);
    request.set_stream_token(Token(stream_id));
    v1::CloseStreamResponse response;
    return loader_->CloseStream(&context, request, &response);
  }
  v1::GetStatsResponse Stats() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::GetStatsResponse response;
    grpc::Status s = loader_->GetStats(&context, v1::GetStatsRequest(), &response);
    REQUIRE(s.ok());
    return response;
  }
  bool Serving() {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status s = health_->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
    return s.ok() && response.status() == grpc::health::v1::HealthCheckResponse::SERVING;
  }

  // Leases the next batch of a stream, waiting through `pending` answers.
  v1::BatchHandle Lease(const v1::OpenStreamResponse& stream) {
    for (int attempt = 0; attempt < 50; ++attempt) {
      v1::NextBatchRequest request;
      request.set_stream_id(stream.stream_id());
      request.set_incarnation(stream.incarnation());
      request.set_wait_ms(1000);
      v1::NextBatchResponse response;
      grpc::Status s = Next(request, &response);
      INFO(s.error_message());
      REQUIRE(s.ok());
      REQUIRE_FALSE(response.end_of_stream());
      if (response.has_batch()) return response.batch();
    }
    FAIL("no batch within 50 waits");
    return {};
  }
  grpc::Status ReleaseOne(uint64_t stream_id, uint64_t incarnation, uint32_t slot,
                          uint64_t ring_sequence) {
    v1::ReleaseBatchesRequest request;
    request.set_stream_id(stream_id);
    request.set_incarnation(incarnation);
    v1::Release* r = request.add_releases();
    r->set_slot(slot);
    r->set_ring_sequence(ring_sequence);
    return Release(request);
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::map<uint64_t, std::string> tokens_;
  std::unique_ptr<v1::Loader::Stub> loader_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  grpc::GenericStub generic_;
};

void ExpectError(const grpc::Status& s, StatusCode code, const std::string& fragment) {
  INFO("got code " << s.error_code() << ": \"" << s.error_message() << "\"; want code " << code
                   << " with \"" << fragment << "\"");
  CHECK(s.error_code() == code);
  CHECK_FALSE(s.error_message().empty());
  CHECK_THAT(s.error_message(), Catch::Contains(fragment));
}

v1::StreamSpec GoodSpec() {
  v1::StreamSpec spec;
  spec.set_dataset("synth");
  spec.set_batch_size(16);
  spec.set_image_size(48);
  spec.set_seed(3);
  spec.set_shuffle(true);
  return spec;
}
v1::OpenStreamRequest OpenRequest(const v1::StreamSpec& spec) {
  v1::OpenStreamRequest request;
  *request.mutable_spec() = spec;
  request.set_client_name("hostile_client_test");
  return request;
}

// ---- the well-behaved bystander ---------------------------------------------------------------

client::StreamOptions BystanderOptions() {
  client::StreamOptions o;
  o.dataset = "synth";
  o.batch_size = 16;
  o.image_size = 48;
  o.seed = 77;
  o.end_epoch = 0;  // never ends
  o.client_name = "bystander";
  o.verify_checksums = true;
  return o;
}

struct Sample {
  uint64_t epoch;
  int64_t index;
  uint64_t digest;
  bool operator==(const Sample&) const = default;
};

// A stream opened before the hostile calls. Check() reads its next batch and verifies it (labels
// from the fixture's class layout, positions contiguous, no repeat within an epoch) and health.
// At the end, Compare() reads the same number of batches from a fresh stream with the same options
// and requires the same bytes: the hostile calls changed nothing it received.
class Bystander {
 public:
  explicit Bystander(const std::string& endpoint)
      : endpoint_(endpoint), client_(endpoint), stream_(client_.Open(BystanderOptions())),
        raw_(endpoint) {}

  void Check() {
    std::optional<client::Batch> batch = stream_->Next();
    REQUIRE(batch.has_value());
    Record(*batch, &samples_);
    CHECK(batch->position() == expected_);
    expected_ = batch->next();
    ++batches_;
    CHECK(raw_.Serving());
  }

  void Compare() {
    client::Client c(endpoint_);
    auto fresh = c.Open(BystanderOptions());
    std::vector<Sample> reference;
    for (int i = 0; i < batches_; ++i) {
      std::optional<client::Batch> batch = fresh->Next();
      REQUIRE(batch.has_value());
      Record(*batch, &reference);
    }
    CHECK(reference == samples_);
  }
  int batches() const { return batches_; }

 private:
  static void Record(const client::Batch& batch, std::vector<Sample>* out) {
    const int64_t* labels = batch.labels().data<int64_t>();
    const int64_t* indices = batch.indices().data<int64_t>();
    for (uint32_t i = 0; i < batch.size(); ++i) {
      CHECK(labels[i] == indices[i] / 30);  // the fixture's 120 images in 4 classes of 30
      out->push_back({batch.position().epoch, indices[i],
                      XXH64(batch.sample_image(i), batch.sample_image_bytes(), 0)});
    }
  }

  std::string endpoint_;
  client::Client client_;
  std::unique_ptr<client::Stream> stream_;
  Raw raw_;
  std::vector<Sample> samples_;
  client::Position expected_;
  int batches_ = 0;
};

}  // namespace

// What rings and indexes hold (memory_reserved_bytes less the decodes in flight, which come and
// go while streams fill).
uint64_t FixedBytes(const v1::GetStatsResponse& stats) {
  return stats.memory_reserved_bytes() - stats.memory_decoding_bytes();
}

TEST_CASE("hostile OpenStream requests: bad sizes, ranks, enums, negative values, unknown "
          "datasets are refused with a message, others keep being served",
          "[integration][hostile]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  Bystander bystander(daemon.endpoint());
  bystander.Check();
  Raw raw(daemon.endpoint());
  const uint64_t rejected_before = raw.Stats().requests_rejected();

  struct Case {
    std::string what;
    std::function<void(v1::OpenStreamRequest&)> mutate;
    StatusCode code;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"batch size 0", [](auto& r) { r.mutable_spec()->set_batch_size(0); },
       StatusCode::INVALID_ARGUMENT, "batch_size: must be in [1, server.max_batch_size = 4096] (got 0)"},
      {"batch size 10^9", [](auto& r) { r.mutable_spec()->set_batch_size(1'000'000'000); },
       StatusCode::INVALID_ARGUMENT, "batch_size: must be in [1, server.max_batch_size = 4096] (got 1000000000)"},
      {"image size 0", [](auto& r) { r.mutable_spec()->set_image_size(0); },
       StatusCode::INVALID_ARGUMENT, "image_size: must be in [1, server.max_image_size = 1024] (got 0)"},
      {"image size 100000", [](auto& r) { r.mutable_spec()->set_image_size(100000); },
       StatusCode::INVALID_ARGUMENT, "image_size: must be in [1, server.max_image_size = 1024] (got 100000)"},
      {"rank == world size",
       [](auto& r) {
         r.mutable_spec()->set_rank(4);
         r.mutable_spec()->set_world_size(4);
       },
       StatusCode::INVALID_ARGUMENT, "rank: must be < world_size (got rank 4, world_size 4)"},
      {"rank 1 of world size 0 (= 1)", [](auto& r) { r.mutable_spec()->set_rank(1); },
       StatusCode::INVALID_ARGUMENT, "rank: must be < world_size"},
      {"world size 2^20", [](auto& r) { r.mutable_spec()->set_world_size(1u << 20); },
       StatusCode::INVALID_ARGUMENT, "world_size: must be in [1, 65536]"},
      {"ring slots 1", [](auto& r) { r.mutable_spec()->set_ring_slots(1); },
       StatusCode::INVALID_ARGUMENT, "ring_slots: must be 0 (the server's default) or in [2, server.max_ring_slots = 32]"},
      {"ring slots 10^6", [](auto& r) { r.mutable_spec()->set_ring_slots(1'000'000); },
       StatusCode::INVALID_ARGUMENT, "ring_slots"},
      {"unknown augmentation",
       [](auto& r) { r.mutable_spec()->set_augmentation(static_cast<v1::Augmentation>(99)); },
       StatusCode::INVALID_ARGUMENT, "augmentation: unknown value 99"},
      {"int64 images", [](auto& r) { r.mutable_spec()->set_dtype(v1::DTYPE_INT64); },
       StatusCode::INVALID_ARGUMENT, "dtype"},
      {"unknown layout", [](auto& r) { r.mutable_spec()->set_layout(static_cast<v1::Layout>(7)); },
       StatusCode::INVALID_ARGUMENT, "layout: unknown value 7"},
      {"mean with uint8", [](auto& r) { r.mutable_spec()->add_mean(0.5f); },
       StatusCode::INVALID_ARGUMENT, "mean/std"},
      {"std 0",
       [](auto& r) {
         r.mutable_spec()->set_dtype(v1::DTYPE_FLOAT32);
         for (int i = 0; i < 3; ++i) r.mutable_spec()->add_std(0.0f);
       },
       StatusCode::INVALID_ARGUMENT, "std: values must be in [1e-06, 1e+06]"},
      {"NaN mean",
       [](auto& r) {
         r.mutable_spec()->set_dtype(v1::DTYPE_FLOAT32);
         for (int i = 0; i < 3; ++i) r.mutable_spec()->add_mean(std::nanf(""));
       },
       StatusCode::INVALID_ARGUMENT, "mean: values must be finite"},
      {"start beyond the shard", [](auto& r) { r.mutable_start()->set_cursor(121); },
       StatusCode::INVALID_ARGUMENT, "start.cursor: must be <= the shard size 120 (got 121)"},
      {"unknown dataset", [](auto& r) { r.mutable_spec()->set_dataset("imagenet"); },
       StatusCode::NOT_FOUND, "unknown dataset \"imagenet\"; configured: synth"},
      {"empty dataset", [](auto& r) { r.mutable_spec()->set_dataset(""); }, StatusCode::NOT_FOUND,
       "unknown dataset \"\""},
      {"a path as dataset", [](auto& r) { r.mutable_spec()->set_dataset("/etc/../etc"); },
       StatusCode::NOT_FOUND, "unknown dataset \"/etc/../etc\""},
      {"a 2 MiB client name",
       [](auto& r) { r.set_client_name(std::string(2 << 20, 'x')); },
       StatusCode::RESOURCE_EXHAUSTED, "larger than max"},
  };
  for (const Case& c : cases) {
    INFO(c.what);
    v1::OpenStreamRequest request = OpenRequest(GoodSpec());
    c.mutate(request);
    v1::OpenStreamResponse response;
    ExpectError(raw.Open(request, &response), c.code, c.fragment);
    bystander.Check();
  }

  // Negative values, as the bytes a client encoding int32 -1 sends.
  struct Negative {
    uint32_t field;
    std::string fragment;
  };
  const std::vector<Negative> negatives = {
      {2, "batch_size: must be in [1, server.max_batch_size = 4096] (got 4294967295)"},
      {4, "rank: must be < world_size (got rank 4294967295"},
      {5, "world_size: must be in [1, 65536] (got 4294967295)"},
      {6, "image_size: must be in [1, server.max_image_size = 1024] (got 4294967295)"},
      {7, "augmentation: unknown value -1"},
      {15, "ring_slots: must be 0 (the server's default) or in [2, server.max_ring_slots = 32] (got 4294967295)"},
  };
  const std::string good_spec = GoodSpec().SerializeAsString();
  for (const Negative& n : negatives) {
    INFO("field " << n.field << " = -1");
    // Later fields win in protobuf: the good spec, then the field again with -1.
    const std::string request = Bytes(1, good_spec + MinusOne(n.field));
    ExpectError(raw.Call(std::string(kLoader) + "OpenStream", request),
                StatusCode::INVALID_ARGUMENT, n.fragment);
    bystander.Check();
  }
  {
    INFO("start.cursor = -1 (uint64)");
    const std::string request = Bytes(1, good_spec) + Bytes(2, MinusOne(3));
    ExpectError(raw.Call(std::string(kLoader) + "OpenStream", request),
                StatusCode::INVALID_ARGUMENT, "start.cursor: must be <= the shard size 120");
    bystander.Check();
  }

  v1::GetStatsResponse stats = raw.Stats();
  // Every refusal above was counted (the 2 MiB message never reached the service).
  CHECK(stats.requests_rejected() - rejected_before == cases.size() - 1 + negatives.size() + 1);
  CHECK(stats.streams_open() == 1);  // only the bystander
  bystander.Compare();
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("hostile handle use: unknown streams, double and foreign releases, too many held "
          "handles, use after close",
          "[integration][hostile]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  Bystander bystander(daemon.endpoint());
  bystander.Check();
  Raw raw(daemon.endpoint());

  v1::OpenStreamResponse a, b, c;
  v1::StreamSpec spec = GoodSpec();
  spec.set_ring_slots(4);
  REQUIRE(raw.Open(OpenRequest(spec), &a).ok());
  REQUIRE(raw.Open(OpenRequest(spec), &b).ok());
  REQUIRE(raw.Open(OpenRequest(spec), &c).ok());
  REQUIRE(a.stream_id() != b.stream_id());
  REQUIRE(a.incarnation() == b.incarnation());
  const uint64_t inc = a.incarnation();

  {
    INFO("invalid stream ids");
    for (uint64_t id : {uint64_t{0}, uint64_t{999'999}, ~uint64_t{0}}) {
      v1::NextBatchRequest next;
      next.set_stream_id(id);
      next.set_incarnation(inc);
      v1::NextBatchResponse response;
      ExpectError(raw.Next(next, &response), StatusCode::NOT_FOUND,
                  "stream " + std::to_string(id) + " not found");
      ExpectError(raw.ReleaseOne(id, inc, 0, 0), StatusCode::NOT_FOUND, "not found");
      ExpectError(raw.Close(id, inc), StatusCode::NOT_FOUND, "not found");
      bystander.Check();
    }
  }
  {
    INFO("a stream of a wrong incarnation");
    v1::NextBatchRequest next;
    next.set_stream_id(a.stream_id());
    next.set_incarnation(inc + 1);
    v1::NextBatchResponse response;
    ExpectError(raw.Next(next, &response), StatusCode::FAILED_PRECONDITION,
                "belongs to daemon incarnation");
    ExpectError(raw.ReleaseOne(a.stream_id(), 0, 0, 0), StatusCode::FAILED_PRECONDITION,
                "incarnation");
    ExpectError(raw.Close(a.stream_id(), 0), StatusCode::FAILED_PRECONDITION, "incarnation");
    bystander.Check();
  }
  {
    INFO("a handle released twice, and one never leased");
    v1::BatchHandle h = raw.Lease(a);
    CHECK(raw.ReleaseOne(a.stream_id(), inc, h.slot(), h.ring_sequence()).ok());
    ExpectError(raw.ReleaseOne(a.stream_id(), inc, h.slot(), h.ring_sequence()),
                StatusCode::FAILED_PRECONDITION, "release of slot");
    bystander.Check();
    ExpectError(raw.ReleaseOne(a.stream_id(), inc, h.slot(), h.ring_sequence() + 1000),
                StatusCode::FAILED_PRECONDITION, "release of slot");
    ExpectError(raw.ReleaseOne(a.stream_id(), inc, 99, 0), StatusCode::INVALID_ARGUMENT,
                "slot 99 out of range (ring has 4)");
    // -1 as a slot: read as 4294967295.
    const std::string release = Varint(1 << 3) + Varint(a.stream_id()) + Varint(2 << 3) +
                                Varint(inc) + Bytes(3, MinusOne(1)) +
                                Bytes(4, raw.Token(a.stream_id()));
    ExpectError(raw.Call(std::string(kLoader) + "ReleaseBatches", release),
                StatusCode::INVALID_ARGUMENT, "slot 4294967295 out of range");
    bystander.Check();
    // A bad release piggybacked on NextBatch does not withhold the batch; it is counted.
    const uint64_t rejected = raw.Stats().requests_rejected();
    v1::NextBatchRequest next;
    next.set_stream_id(a.stream_id());
    next.set_incarnation(inc);
    next.set_wait_ms(2000);
    v1::Release* r = next.add_releases();
    r->set_slot(h.slot());
    r->set_ring_sequence(h.ring_sequence());
    v1::NextBatchResponse response;
    CHECK(raw.Next(next, &response).ok());
    CHECK(raw.Stats().requests_rejected() == rejected + 1);
    bystander.Check();
  }
  {
    INFO("a handle of another stream");
    v1::BatchHandle hb = raw.Lease(b);
    REQUIRE(hb.stream_id() == b.stream_id());
    // Stream c holds nothing: b's handle means nothing to it. (A release names its stream in the
    // request; a handle that happens to match a lease of the named stream releases that lease.)
    ExpectError(raw.ReleaseOne(c.stream_id(), inc, hb.slot(), hb.ring_sequence()),
                StatusCode::FAILED_PRECONDITION, "release of slot");
    bystander.Check();
    // b's handle is still leased to b and releases normally there.
    CHECK(raw.ReleaseOne(b.stream_id(), inc, hb.slot(), hb.ring_sequence()).ok());
  }
  {
    INFO("a handle and the id of a closed stream");
    v1::BatchHandle hc = raw.Lease(c);
    CHECK(raw.Close(c.stream_id(), inc).ok());
    ExpectError(raw.ReleaseOne(c.stream_id(), inc, hc.slot(), hc.ring_sequence()),
                StatusCode::NOT_FOUND, "not found");
    ExpectError(raw.Close(c.stream_id(), inc), StatusCode::NOT_FOUND, "not found");
    v1::NextBatchRequest next;
    next.set_stream_id(c.stream_id());
    next.set_incarnation(inc);
    v1::NextBatchResponse response;
    ExpectError(raw.Next(next, &response), StatusCode::NOT_FOUND, "not found");
    bystander.Check();
  }
  {
    INFO("holding every slot is bounded: the next request is RESOURCE_EXHAUSTED");
    for (int i = 0; i < 4; ++i) raw.Lease(b);
    v1::NextBatchRequest next;
    next.set_stream_id(b.stream_id());
    next.set_incarnation(inc);
    next.set_wait_ms(100);
    v1::NextBatchResponse response;
    ExpectError(raw.Next(next, &response), StatusCode::RESOURCE_EXHAUSTED,
                "the client holds all 4 ring slots");
    bystander.Check();
    // Other streams are unaffected.
    raw.Lease(a);
    v1::GetStatsResponse stats = raw.Stats();
    bool seen = false;
    for (const v1::StreamStats& s : stats.streams()) {
      if (s.stream_id() != b.stream_id()) continue;
      seen = true;
      CHECK(s.slots_leased() == 4);
      CHECK(s.batches_served() == 5);
    }
    CHECK(seen);
  }
  bystander.Compare();
}

// Issue 39: the trainer's time a client reports with NextBatch is untrusted. Absurd totals,
// totals that go backwards and zeros can only misstate the lying stream's own figure, bounded by
// the time the daemon saw pass; the figure stays within 0..1 and nobody else's moves.
TEST_CASE("hostile trainer reports: absurd, backwards and huge times misstate only the liar's "
          "own input-bound, bounded by the daemon's clock",
          "[integration][hostile]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  Bystander bystander(daemon.endpoint());
  bystander.Check();
  Raw raw(daemon.endpoint());
  v1::OpenStreamResponse liar;
  REQUIRE(raw.Open(OpenRequest(GoodSpec()), &liar).ok());
  const auto started = std::chrono::steady_clock::now();
  const uint64_t huge = ~uint64_t{0};
  const std::vector<std::array<uint64_t, 3>> reports = {
      {0, 0, 0},          {huge, huge, huge}, {huge / 2, 0, 1},  {1, 1, 1},
      {huge, 0, huge},    {0, huge, 0},       {1ull << 62, 1, 2}, {0, 0, 0}};
  for (const auto& [wait, step, steps] : reports) {
    v1::NextBatchRequest next;
    next.set_stream_id(liar.stream_id());
    next.set_incarnation(liar.incarnation());
    next.set_wait_ms(50);
    next.mutable_trainer()->set_wait_ns(wait);
    next.mutable_trainer()->set_step_ns(step);
    next.mutable_trainer()->set_steps(steps);
    v1::NextBatchResponse response;
    REQUIRE(raw.Next(next, &response).ok());
    if (response.has_input_bound()) {
      CHECK(response.input_bound() >= 0);
      CHECK(response.input_bound() <= 1);
    }
    if (response.has_batch()) {
      v1::ReleaseBatchesRequest release;
      release.set_stream_id(liar.stream_id());
      release.set_incarnation(liar.incarnation());
      v1::Release* r = release.add_releases();
      r->set_slot(response.batch().slot());
      r->set_ring_sequence(response.batch().ring_sequence());
      REQUIRE(raw.Release(release).ok());
    }
    bystander.Check();
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const v1::GetStatsResponse stats = raw.Stats();
  for (const v1::StreamStats& st : stats.streams()) {
    INFO("stream " << st.stream_id());
    CHECK(st.input_bound() <= 1);
    CHECK(std::isfinite(st.input_bound()));
    if (st.stream_id() != liar.stream_id()) continue;
    CHECK(st.trainer_wait_seconds() + st.trainer_step_seconds() <= elapsed + 0.1);
    CHECK(st.trainer_steps() <= reports.size());
  }
  CHECK(raw.Serving());
}

TEST_CASE("handles and stream ids of an old incarnation are refused after a restart, never "
          "confused with the new daemon's",
          "[integration][hostile]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  Raw raw(daemon.endpoint());
  v1::OpenStreamResponse old;
  REQUIRE(raw.Open(OpenRequest(GoodSpec()), &old).ok());
  const v1::BatchHandle held = raw.Lease(old);
  struct stat st;
  REQUIRE(stat(("/dev/shm" + old.segment_name()).c_str(), &st) == 0);

  REQUIRE(daemon.Stop() == 0);
  CHECK(stat(("/dev/shm" + old.segment_name()).c_str(), &st) != 0);  // unlinked
  REQUIRE(daemon.Start());
  // The new daemon numbers its streams from 1 again: open one so that the old id exists anew.
  v1::OpenStreamResponse fresh;
  Raw raw2(daemon.endpoint());
  grpc::Status opened = raw2.Open(OpenRequest(GoodSpec()), &fresh);
  INFO(opened.error_message());
  REQUIRE(opened.ok());
  REQUIRE(fresh.incarnation() != old.incarnation());
  REQUIRE(fresh.stream_id() == old.stream_id());

  v1::NextBatchRequest next;
  next.set_stream_id(old.stream_id());
  next.set_incarnation(old.incarnation());
  v1::NextBatchResponse response;
  ExpectError(raw2.Next(next, &response), StatusCode::FAILED_PRECONDITION,
              "(it restarted): reopen the stream");
  ExpectError(raw2.ReleaseOne(old.stream_id(), old.incarnation(), held.slot(),
                              held.ring_sequence()),
              StatusCode::FAILED_PRECONDITION, "belongs to daemon incarnation");
  ExpectError(raw2.Close(old.stream_id(), old.incarnation()), StatusCode::FAILED_PRECONDITION,
              "incarnation");
  // The new stream of the same id was not touched by any of that.
  v1::GetStatsResponse stats = raw2.Stats();
  REQUIRE(stats.streams_size() == 1);
  CHECK(stats.streams(0).slots_leased() == 0);
  CHECK(stats.streams(0).batches_served() == 0);
  const v1::BatchHandle first = raw2.Lease(fresh);
  CHECK(first.position().epoch() == 0);
  CHECK(first.position().sequence() == 0);
  CHECK(raw2.Serving());
}

TEST_CASE("random bytes sent to every RPC are INVALID_ARGUMENT with a message, the daemon keeps "
          "serving",
          "[integration][hostile]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  Bystander bystander(daemon.endpoint());
  bystander.Check();
  Raw raw(daemon.endpoint());

  const std::vector<std::string> methods = {
      std::string(kLoader) + "OpenStream",      std::string(kLoader) + "NextBatch",
      std::string(kLoader) + "ReleaseBatches",  std::string(kLoader) + "CloseStream",
      std::string(kLoader) + "GetStats",        std::string(kLoader) + "ListQuarantine",
      std::string(kLoader) + "ClearQuarantine", "/grpc.health.v1.Health/Check",
      "/grpc.health.v1.Health/Watch"};
  std::mt19937_64 rng(20240601);
  for (const std::string& method : methods) {
    for (size_t size : {1, 7, 100, 4096}) {
      // Random bytes that no protobuf parser accepts: the first tag has wire type 7 (there is
      // none), with a random nonzero field number; the rest is random.
      std::string payload(size, '\0');
      for (char& c : payload) c = static_cast<char>(rng());
      payload[0] = static_cast<char>(0x07 | (8 + rng() % 15) << 3);
      INFO(method << " with " << size << " random bytes");
      // grpc.health.v1 is the daemon's own synchronous service too: the same answer.
      ExpectError(raw.Call(method, payload), StatusCode::INVALID_ARGUMENT,
                  method + ": the request is not a valid protobuf message");
      bystander.Check();
    }
    // Random bytes as they come: whatever they parse to, the answer is OK or a refusal.
    for (int i = 0; i < 4; ++i) {
      std::string payload(64, '\0');
      for (char& c : payload) c = static_cast<char>(rng());
      if (method.find("Watch") != std::string::npos) continue;  // a parsed Watch streams forever
      INFO(method << " with random bytes #" << i);
      grpc::Status s = raw.Call(method, payload);
      if (!s.ok()) {
        CHECK(s.error_code() != StatusCode::INTERNAL);
        CHECK(s.error_code() != StatusCode::UNKNOWN);
        CHECK_FALSE(s.error_message().empty());
      }
    }
    bystander.Check();
  }
  // An unknown method is UNIMPLEMENTED (gRPC's own answer).
  CHECK(raw.Call(std::string(kLoader) + "DropTables", "x").error_code() ==
        StatusCode::UNIMPLEMENTED);
  bystander.Check();
  bystander.Compare();
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("a trainer killed with SIGKILL while holding handles: its stream is closed and its "
          "slots and memory reclaimed, another stream is unaffected",
          "[integration][hostile]") {
  DaemonFixtureOptions options;
  // Far beyond this test's patience: only the client's session ending can close its stream.
  options.server_extra = "stream_idle_timeout_ms = 600000";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  Bystander bystander(daemon.endpoint());
  bystander.Check();
  Raw raw(daemon.endpoint());
  // Rings and indexes only: decodes in flight (the bystander's) come and go.
  const auto fixed = [](const v1::GetStatsResponse& s) {
    return s.memory_reserved_bytes() - s.memory_decoding_bytes();
  };
  const uint64_t reserved_before = fixed(raw.Stats());

  const std::string out = daemon.dir() + "/hold.out";
  Subprocess holder({BuiltBinary("tests/integration/hold_handles"), daemon.endpoint(), "synth", "3"},
                    {}, out);
  REQUIRE(WaitFor([&] { return ReadFile(out).find("holding 3") != std::string::npos; },
                  std::chrono::seconds(20)));
  v1::GetStatsResponse stats = raw.Stats();
  REQUIRE(stats.streams_open() == 2);
  uint64_t held_stream = 0;
  for (const v1::StreamStats& s : stats.streams()) {
    if (s.client_name() == "hold_handles") {
      held_stream = s.stream_id();
      CHECK(s.slots_leased() == 3);
    }
  }
  REQUIRE(held_stream != 0);
  CHECK(fixed(stats) > reserved_before);

  holder.Kill(SIGKILL);
  const auto killed = std::chrono::steady_clock::now();
  CHECK(holder.WaitExitCode(std::chrono::seconds(10)) == 128 + SIGKILL);
  // The bystander keeps reading (and so stays active) while the holder's stream times out.
  bool reclaimed = false;
  for (int i = 0; i < 100 && !reclaimed; ++i) {
    bystander.Check();
    stats = raw.Stats();
    reclaimed = stats.streams_open() == 1 && fixed(stats) == reserved_before;
    if (!reclaimed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  CHECK(reclaimed);
  CHECK(std::chrono::steady_clock::now() - killed < std::chrono::seconds(5));
  REQUIRE(stats.streams_size() == 1);
  CHECK(stats.streams(0).client_name() == "bystander");
  CHECK_THAT(daemon.Log(), Catch::Contains("stream " + std::to_string(held_stream) +
                                           " closed: its client (\"hold_handles\") is gone"));
  bystander.Check();
  bystander.Compare();
}

TEST_CASE("a client that stops reading back-pressures only its own stream",
          "[integration][hostile]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  Raw raw(daemon.endpoint());
  v1::OpenStreamResponse idle;
  v1::StreamSpec spec = GoodSpec();
  spec.set_ring_slots(3);
  REQUIRE(raw.Open(OpenRequest(spec), &idle).ok());

  // The other stream reads two whole epochs meanwhile.
  client::Client c(daemon.endpoint());
  client::StreamOptions o = BystanderOptions();
  o.end_epoch = 2;
  auto active = c.Open(o);
  uint64_t samples = 0;
  while (std::optional<client::Batch> batch = active->Next()) samples += batch->size();
  CHECK(samples == 240);

  v1::GetStatsResponse stats = raw.Stats();
  bool seen = false;
  for (const v1::StreamStats& s : stats.streams()) {
    if (s.stream_id() != idle.stream_id()) continue;
    seen = true;
    CHECK(s.slots_total() == 3);
    CHECK(s.batches_served() == 0);
    CHECK(s.slots_ready() + s.slots_filling() <= s.slots_total());
    CHECK(s.position().epoch() == 0);
    CHECK(s.position().sequence() <= 3);  // it produced at most one ring's worth
  }
  CHECK(seen);
  // Decoding beyond the idle stream's ring never happened: 240 for the reader, <= 3 x 16 for it.
  CHECK(stats.images_decoded() <= 240 + 3 * 16);
  // And it still works once its reader comes back.
  const v1::BatchHandle h = raw.Lease(idle);
  CHECK(h.position().sequence() == 0);
}

TEST_CASE("the socket is 0660 and each ring segment 0640 (read-only for the daemon's group), "
          "another user can connect to neither",
          "[integration][hostile]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  const std::string socket_path = daemon.dir() + "/rl.sock";
  struct stat st;
  REQUIRE(stat(socket_path.c_str(), &st) == 0);
  CHECK(S_ISSOCK(st.st_mode));
  CHECK((st.st_mode & 07777) == 0660);

  Raw raw(daemon.endpoint());
  v1::OpenStreamResponse a, b;
  REQUIRE(raw.Open(OpenRequest(GoodSpec()), &a).ok());
  REQUIRE(raw.Open(OpenRequest(GoodSpec()), &b).ok());
  for (const std::string& name : {a.segment_name(), b.segment_name()}) {
    INFO(name);
    REQUIRE(stat(("/dev/shm" + name).c_str(), &st) == 0);
    CHECK(S_ISREG(st.st_mode));
    CHECK((st.st_mode & 07777) == 0640);
    CHECK(st.st_uid == geteuid());
    CHECK(st.st_gid == getegid());
  }

  if (geteuid() != 0) {
    RINGLOADER_SKIP("not root: the other-user checks need to switch to uid 65534");
  }
  // As another user in another group (nobody:nogroup): opening the segment and connecting to the
  // socket are refused by the modes alone (the socket's directory is made traversable for the
  // check).
  REQUIRE(chmod(daemon.dir().c_str(), 0711) == 0);
  const std::string segment = "/dev/shm" + a.segment_name();
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    if (setgroups(0, nullptr) != 0 || setgid(65534) != 0 || setuid(65534) != 0) _exit(10);
    int fd = ::open(segment.c_str(), O_RDONLY);
    if (fd >= 0 || errno != EACCES) _exit(11);
    int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
    if (::connect(s, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 || errno != EACCES) {
      _exit(12);
    }
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // 10: cannot become nobody, 11: segment, 12: socket
  CHECK(raw.Serving());
}

TEST_CASE("memory_limit: a stream whose ring does not fit is RESOURCE_EXHAUSTED with the numbers, "
          "closing streams returns their reservation",
          "[integration][hostile][limits]") {
  DaemonFixtureOptions options;
  options.memory_limit = "200MiB";
  options.server_extra = "max_streams = 3";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  Raw raw(daemon.endpoint());
  const v1::GetStatsResponse before = raw.Stats();
  REQUIRE(before.memory_limit_bytes() == 200ull << 20);
  const uint64_t baseline = FixedBytes(before);
  REQUIRE(baseline < before.memory_limit_bytes());
  const uint64_t free_bytes = before.memory_limit_bytes() - baseline;

  // Way too big: 4096 x 1024 x 1024 x 3 bytes a slot.
  v1::StreamSpec huge = GoodSpec();
  huge.set_batch_size(4096);
  huge.set_image_size(1024);
  v1::OpenStreamResponse response;
  grpc::Status s = raw.Open(OpenRequest(huge), &response);
  // 3 slots: the default for batches over 8 MiB.
  ExpectError(s, StatusCode::RESOURCE_EXHAUSTED, "a stream of dataset \"synth\" (ring of 3 slots x ");
  CHECK_THAT(s.error_message(), Catch::Contains("GiB) needs ") &&
                                    Catch::Contains("; memory_limit 200 MiB has ") &&
                                    Catch::Contains(" free (") && Catch::Contains(" reserved)"));

  // A stream taking ~60% of what is free fits once, not twice; closing it makes room again.
  v1::StreamSpec big = GoodSpec();
  big.set_ring_slots(2);
  big.set_image_size(224);
  const uint64_t sample = 224 * 224 * 3;
  big.set_batch_size(static_cast<uint32_t>(free_bytes * 6 / 10 / 2 / sample));
  REQUIRE(big.batch_size() > 16);
  v1::OpenStreamResponse first;
  REQUIRE(raw.Open(OpenRequest(big), &first).ok());
  const uint64_t one_stream = FixedBytes(raw.Stats()) - baseline;
  CHECK(one_stream >= 2 * big.batch_size() * sample);
  v1::OpenStreamResponse second;
  s = raw.Open(OpenRequest(big), &second);
  ExpectError(s, StatusCode::RESOURCE_EXHAUSTED, "needs ");
  CHECK_THAT(s.error_message(), Catch::Contains("memory_limit 200 MiB"));
  CHECK(FixedBytes(raw.Stats()) == baseline + one_stream);  // a refusal costs nothing

  REQUIRE(raw.Close(first.stream_id(), first.incarnation()).ok());
  CHECK(FixedBytes(raw.Stats()) == baseline);
  REQUIRE(raw.Open(OpenRequest(big), &second).ok());
  CHECK(raw.Lease(second).sample_count() == std::min<uint32_t>(big.batch_size(), 120));
  REQUIRE(raw.Close(second.stream_id(), second.incarnation()).ok());
  CHECK(FixedBytes(raw.Stats()) == baseline);

  // The total stream count is bounded too.
  std::vector<v1::OpenStreamResponse> small(3);
  for (auto& r : small) REQUIRE(raw.Open(OpenRequest(GoodSpec()), &r).ok());
  ExpectError(raw.Open(OpenRequest(GoodSpec()), &response), StatusCode::RESOURCE_EXHAUSTED,
              "too many open streams (server.max_streams = 3)");
  for (auto& r : small) REQUIRE(raw.Close(r.stream_id(), r.incarnation()).ok());
  CHECK(FixedBytes(raw.Stats()) == baseline);
  CHECK(raw.Serving());
}

}  // namespace ringloader::testing

namespace ringloader::testing {

TEST_CASE("max_streams_per_client bounds the streams of one TCP client host",
          "[integration][hostile][limits]") {
  DaemonFixtureOptions options;
  options.tcp = true;
  options.server_extra = "max_streams_per_client = 2\nmax_streams = 10";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  // Separate channels are separate connections (other ports) of the same host.
  Raw first(daemon.endpoint()), second(daemon.endpoint());
  v1::OpenStreamResponse a, b, c;
  REQUIRE(first.Open(OpenRequest(GoodSpec()), &a).ok());
  REQUIRE(second.Open(OpenRequest(GoodSpec()), &b).ok());
  ExpectError(second.Open(OpenRequest(GoodSpec()), &c), StatusCode::RESOURCE_EXHAUSTED,
              "too many open streams from ipv4:127.0.0.1 (server.max_streams_per_client = 2)");
  ExpectError(first.Open(OpenRequest(GoodSpec()), &c), StatusCode::RESOURCE_EXHAUSTED,
              "server.max_streams_per_client");
  CHECK(first.Stats().streams_open() == 2);
  REQUIRE(first.Close(a.stream_id(), a.incarnation()).ok());
  CHECK(second.Open(OpenRequest(GoodSpec()), &c).ok());
  CHECK(first.Serving());
}

client::StreamOptions SmallStream() {
  client::StreamOptions o;
  o.dataset = "synth";
  o.batch_size = 4;
  o.image_size = 32;
  return o;
}

TEST_CASE("a client the daemon refuses to attach asks again with growing pauses, never in a loop",
          "[integration][hostile][limits]") {
  DaemonFixtureOptions options;
  options.server_extra = "max_streams = 1";  // so at most 2 attached clients
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const client::StreamOptions stream = SmallStream();
  client::Client first(daemon.endpoint()), second(daemon.endpoint()), third(daemon.endpoint());
  auto a = first.Open(stream);  // session 1 and the one stream
  CHECK_THROWS_AS(second.Open(stream), client::Error);  // session 2; no stream left
  // The third client's session is refused (RESOURCE_EXHAUSTED), and so is its stream.
  CHECK_THROWS_AS(third.Open(stream), client::Error);
  Raw raw(daemon.endpoint());
  const uint64_t before = raw.Stats().requests_rejected();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const uint64_t during = raw.Stats().requests_rejected() - before;
  INFO("refusals in 1.5 s: " << during);
  CHECK(during >= 1);  // it does ask again
  CHECK(during <= 8);  // 50, 100, 200, 400, 800 ms apart, not thousands
  CHECK(raw.Serving());
}

TEST_CASE("a client whose daemon died is destroyed without waiting for it while it looks for it, and "
          "finds a new one on the same socket",
          "[integration][hostile]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  client::StreamOptions stream_options = SmallStream();
  stream_options.reconnect_deadline = std::chrono::seconds(30);
  {
    auto c = std::make_unique<client::Client>(daemon.endpoint());
    auto stream = c->Open(stream_options);
    REQUIRE(stream->Next().has_value());
    daemon.process().Kill(SIGKILL);
    daemon.process().Wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(400));  // it probes the socket now
    const auto started = std::chrono::steady_clock::now();
    stream.reset();
    c.reset();
    // Not a timing goal: a destructor that waited for the daemon would take reconnect_deadline.
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(5));
  }
  // A client that is still there reattaches to the next daemon (its session, then its stream).
  REQUIRE(daemon.Start());
  auto c = std::make_unique<client::Client>(daemon.endpoint());
  auto stream = c->Open(stream_options);
  REQUIRE(stream->Next().has_value());
  daemon.process().Kill(SIGKILL);
  daemon.process().Wait();
  REQUIRE(daemon.Start());
  CHECK(stream->Next().has_value());
  CHECK(stream->reconnects() == 1);
  Raw raw(daemon.endpoint());
  REQUIRE(WaitFor([&] { return raw.Stats().streams_open() == 1; }, std::chrono::seconds(10)));
  stream.reset();
  c.reset();
}

}  // namespace ringloader::testing
