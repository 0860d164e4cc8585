// SPDX-License-Identifier: Apache-2.0
// Issue 40 item 1, the feeder's side: a ringloaderd with server.feeder_listen decodes the samples
// a host asks for, over mutual TLS, and they are byte for byte what the host's own streams
// deliver for the same (dataset, seed, epoch, sample); a bad sample is reported, not sent; a
// host whose dataset differs, a malformed request, and a host without a trusted certificate get
// nothing, and are told why.

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/channel.h"
#include "client/client.h"
#include "proto/ringloader.grpc.pb.h"
#include "server/daemon/feed_socket.h"
#include "server/daemon/feed_socket_server.h"
#include "server/pipeline/batch_filler.h"
#include "shm/base/x509.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/support/test_pki.h"
#include "tests/support/test_support.h"

namespace ringloader::testing {
namespace {

struct Fed {
  grpc::Status status;
  v1::FeedHeader header;
  std::string payload;
};

// One FeedSamples call to `address` as this process' RINGLOADER_TLS_* say.
Fed Feed(const std::string& address, const v1::FeedRequest& request) {
  Fed fed;
  absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = client::MakeChannel(address);
  REQUIRE(channel.ok());
  auto stub = v1::Feeder::NewStub(*channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto reader = stub->FeedSamples(&context, request);
  v1::FeedFrame frame;
  bool first = true;
  while (reader->Read(&frame)) {
    if (first) {
      REQUIRE(frame.has_header());
      fed.header = frame.header();
      first = false;
    } else {
      REQUIRE(frame.part_case() == v1::FeedFrame::kPayload);
      CHECK(frame.payload().size() <= (1u << 20));
      fed.payload += frame.payload();
    }
  }
  fed.status = reader->Finish();
  return fed;
}

void SetTlsEnv(const std::map<std::string, std::string>& env) {
  for (const char* name : {"RINGLOADER_TLS_CA", "RINGLOADER_TLS_CERT", "RINGLOADER_TLS_KEY"}) {
    auto it = env.find(name);
    if (it == env.end()) {
      ::unsetenv(name);
    } else {
      ::setenv(name, it->second.c_str(), 1);
    }
  }
}

// A feeder on `address` with 48 images, its certificate "feeder", letting in hosts "host-*".
// What every feeder test starts from: CA "ca", the feeder's certificate (for 127.0.0.1) and
// host-1's.
void IssueFeederAndHost(TestPki& pki) {
  pki.MakeCa("ca", "ringloader test CA");
  pki.Issue("feeder", "ca", "feeder-1", "IP:127.0.0.1", 30);
  pki.Issue("host", "ca", "host-1", "DNS:host-1", 30);
}

// Its data plane (server.feeder_data_listen) on `data_port` of the same IP; 0 = none.
DaemonFixtureOptions FeederOptions(const TestPki& pki, const std::string& address,
                                   int data_port = FreeTcpPort()) {
  DaemonFixtureOptions options;
  options.images = 48;
  options.server_extra = "feeder_listen = \"" + address + "\"";
  if (data_port != 0) {
    options.server_extra += "\nfeeder_data_listen = \"" +
                            address.substr(0, address.rfind(':')) + ":" +
                            std::to_string(data_port) + "\"";
  }
  options.config_extra = pki.TlsTable("feeder", "allowed_clients = [\"DNS:host-*\"]\n");
  return options;
}

// The fingerprint of `daemon`'s dataset "synth", as a stream of it reports it.
uint64_t FingerprintOf(DaemonFixture& daemon) {
  client::Client c(daemon.endpoint());
  client::StreamOptions o;
  o.dataset = "synth";
  o.batch_size = 8;
  o.image_size = 32;
  return c.Open(o)->dataset_fingerprint();
}

// Points `daemon`'s dataset at the files under `root` (another fixture's: the same fingerprint).
void UseFilesOf(DaemonFixture& daemon, const std::string& root) {
  std::string config = ReadFile(daemon.config_path());
  const std::string own = "path = \"" + daemon.dataset_root() + "\"";
  REQUIRE(config.find(own) != std::string::npos);
  config.replace(config.find(own), own.size(), "path = \"" + root + "\"");
  WriteFile(daemon.config_path(), config);
}

}  // namespace

TEST_CASE("a feeder decodes what a host asks for byte for byte as the host's streams do, over "
          "mutual TLS, and refuses what it must, saying why",
          "[feeder][tls]") {
  TestPki pki;
  IssueFeederAndHost(pki);
  pki.MakeCa("other", "Other CA");
  pki.Issue("stranger", "other", "host-2", "DNS:host-2", 30);
  const std::string feeder_address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  const DaemonFixtureOptions options = FeederOptions(pki, feeder_address);
  DaemonFixture daemon(options);
  // One bad sample among the good ones.
  WriteFile(daemon.dataset_root() + "/class_00/zz_bad.jpg", "\xff\xd8\xff not a JPEG at all");
  if (!daemon.Start()) FAIL(daemon.Log());
  INFO(daemon.Log());
  CHECK_THAT(daemon.Log(), Catch::Contains("feeding other hosts on " + feeder_address +
                                           " (mutual TLS)"));

  // What the daemon's own stream delivers: epoch 0 of seed 5, 32 px, train augmentation.
  const std::string samples = daemon.dir() + "/samples.tsv";
  const CommandResult consumed =
      daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "8", "--image-size", "32",
                  "--seed", "5", "--epochs", "1", "--samples-out", samples});
  REQUIRE(consumed.exit_code == 0);
  std::map<uint64_t, SampleLine> delivered;
  for (const SampleLine& line : ReadSamplesOut(samples)) delivered[line.sample_index] = line;
  REQUIRE(delivered.size() == 48);
  uint64_t bad_index = 0;
  while (delivered.count(bad_index) != 0) ++bad_index;
  REQUIRE(bad_index < 49);
  const uint64_t fingerprint = FingerprintOf(daemon);

  v1::FeedRequest request;
  request.set_dataset("synth");
  request.set_dataset_fingerprint(fingerprint);
  request.mutable_spec()->set_image_size(32);
  request.mutable_spec()->set_seed(5);
  request.mutable_spec()->set_batch_size(8);
  request.set_epoch(0);
  std::vector<uint64_t> good;
  for (const auto& [index, line] : delivered) {
    if (good.size() == 20) break;
    good.push_back(index);
  }
  for (size_t i = 0; i < good.size(); ++i) {
    if (i == 3) request.add_indices(static_cast<uint32_t>(bad_index));
    request.add_indices(static_cast<uint32_t>(good[i]));
  }

  SetTlsEnv(pki.ClientEnv("ca", "host"));
  const Fed fed = Feed(feeder_address, request);
  INFO(fed.status.error_message());
  REQUIRE(fed.status.ok());
  CHECK(fed.header.count() == 20);
  REQUIRE(fed.header.failed_size() == 1);
  CHECK(fed.header.failed(0).path() == "class_00/zz_bad.jpg");
  CHECK_FALSE(fed.header.failed(0).reason().empty());
  REQUIRE(fed.payload.size() == fed.header.payload_bytes());
  CHECK(XXH64(fed.payload.data(), fed.payload.size(), 0) == fed.header.payload_xxh64());
  CHECK_FALSE(fed.header.has_payload_xxh3());  // a host that does not ask for XXH3 gets XXH64
  {
    v1::FeedRequest xxh3_request = request;
    xxh3_request.set_payload_xxh3(true);
    const Fed fed3 = Feed(feeder_address, xxh3_request);
    REQUIRE(fed3.status.ok());
    REQUIRE(fed3.header.has_payload_xxh3());
    CHECK(fed3.header.payload_xxh3() == XXH3_64bits(fed3.payload.data(), fed3.payload.size()));
    CHECK(fed3.header.payload_xxh64() == 0);
    CHECK(fed3.payload == fed.payload);
  }
  image::TransformSpec transform;
  transform.image_size = 32;
  const pipeline::BatchLayout layout = pipeline::ComputeBatchLayout(21, transform);
  REQUIRE(fed.payload.size() == layout.total_bytes);
  const uint64_t image_bytes = layout.images_bytes / 21;
  for (size_t i = 0; i < good.size(); ++i) {
    INFO("sample " << good[i]);
    const char* image = fed.payload.data() + layout.images_offset + i * image_bytes;
    CHECK(absl::StrFormat("%016x", XXH64(image, image_bytes, 0)) == delivered[good[i]].digest);
    int64_t index = -1, label = -2;
    std::memcpy(&index, fed.payload.data() + layout.indices_offset + i * 8, 8);
    std::memcpy(&label, fed.payload.data() + layout.labels_offset + i * 8, 8);
    CHECK(index == static_cast<int64_t>(good[i]));
    CHECK(label == delivered[good[i]].label);
  }

  // Refused, each with its reason.
  v1::FeedRequest wrong = request;
  wrong.set_dataset_fingerprint(fingerprint ^ 1);
  Fed refused = Feed(feeder_address, wrong);
  CHECK(refused.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(refused.status.error_message(),
             Catch::Contains(absl::StrFormat("this feeder's fingerprint is %016x, the host's %016x",
                                             fingerprint, fingerprint ^ 1)));
  wrong = request;
  wrong.set_label_source("tfrecord feature image/class/label offset -1");
  refused = Feed(feeder_address, wrong);
  CHECK(refused.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK_THAT(refused.status.error_message(),
             Catch::Contains("this feeder's labels come from imagefolder, the host's from "
                             "tfrecord feature image/class/label offset -1"));
  // A hostile label source (a request's worth of bytes, control characters) is cut and escaped.
  wrong = request;
  wrong.set_label_source(std::string("\x1b[2J") + std::string(512 << 10, 'x'));
  refused = Feed(feeder_address, wrong);
  CHECK(refused.status.error_code() == grpc::StatusCode::FAILED_PRECONDITION);
  CHECK(refused.status.error_message().size() < 1024);
  CHECK_THAT(refused.status.error_message(), Catch::Contains("the host's from \\x1b[2Jxxx"));
  CHECK_THAT(refused.status.error_message(), Catch::Contains("xxx...: the same samples"));
  wrong = request;
  wrong.set_dataset("nope");
  refused = Feed(feeder_address, wrong);
  CHECK(refused.status.error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK_THAT(refused.status.error_message(), Catch::Contains("it serves: synth"));
  wrong = request;
  wrong.add_indices(1'000'000);
  refused = Feed(feeder_address, wrong);
  CHECK(refused.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(refused.status.error_message(), Catch::Contains("1000000 is past dataset"));
  wrong = request;
  for (int i = 0; i < 300; ++i) wrong.add_indices(0);
  refused = Feed(feeder_address, wrong);
  CHECK(refused.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(refused.status.error_message(), Catch::Contains("must hold 1 to 256 samples"));
  // 48 float32 images of 1024 px (576 MiB) are past a quarter of the 1 GiB memory_limit:
  // refused at once, nothing allocated.
  wrong = request;
  wrong.mutable_spec()->set_image_size(1024);
  wrong.mutable_spec()->set_dtype(v1::DTYPE_FLOAT32);
  wrong.clear_indices();
  for (const auto& [index, line] : delivered) wrong.add_indices(static_cast<uint32_t>(index));
  refused = Feed(feeder_address, wrong);
  CHECK(refused.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED);
  CHECK_THAT(refused.status.error_message(), Catch::Contains("a quarter of memory_limit"));
  wrong = request;
  wrong.add_indices(request.indices(0));
  refused = Feed(feeder_address, wrong);
  CHECK(refused.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(refused.status.error_message(), Catch::Contains("each sample at most once"));
  wrong = request;
  wrong.mutable_spec()->set_image_size(100000);
  refused = Feed(feeder_address, wrong);
  CHECK(refused.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
  CHECK_THAT(refused.status.error_message(), Catch::Contains("spec.image_size"));
  CHECK(refused.payload.empty());

  // A host whose certificate another CA signed gets nothing, and reads why.
  SetTlsEnv(pki.ClientEnv("ca", "stranger"));
  refused = Feed(feeder_address, request);
  CHECK(refused.status.error_code() == grpc::StatusCode::UNAUTHENTICATED);
  CHECK_THAT(refused.status.error_message(), Catch::Contains("is not signed by the configured CA"));
  CHECK(refused.payload.empty());
  // Nor does a host without any: the feeder's port speaks TLS only.
  SetTlsEnv({});
  refused = Feed(feeder_address, request);
  CHECK_FALSE(refused.status.ok());
  CHECK(refused.payload.empty());
  SetTlsEnv(pki.ClientEnv("ca", "host"));
  CHECK(Feed(feeder_address, request).status.ok());  // and the feeder still serves
  SetTlsEnv({});
}


// ---------------------------------------------------------------------------------------------
// Issue 40 item 1, the host's side: a host with [[feeders]] leases part of each round to them and
// delivers exactly what it delivers alone, whatever the feeders do.

namespace {

// A daemon serving the dataset at `dataset_root` (another fixture's files) and drawing from
// `feeder` over mutual TLS with certificate `cert` of `pki`.
struct HostOptions {
  std::string dataset_root;
  std::string feeder;
  std::string cert = "host";
  bool local_decode = true;
  uint32_t lease_ms = 1500;
  std::string server_extra{};  // more of [server]
  std::string memory_limit{};  // empty: the fixture's
};

std::unique_ptr<DaemonFixture> MakeHost(const TestPki& pki, const HostOptions& h,
                                        uint64_t dataset_seed = 7) {
  DaemonFixtureOptions options;
  options.images = 48;
  options.dataset_seed = dataset_seed;
  options.server_extra = absl::StrFormat("local_decode = %s\nfeeder_lease_ms = %d\n%s",
                                         h.local_decode ? "true" : "false", h.lease_ms,
                                         h.server_extra);
  if (!h.memory_limit.empty()) options.memory_limit = h.memory_limit;
  options.config_extra =
      pki.TlsTable(h.cert) + "[[feeders]]\naddress = \"" + h.feeder + "\"\n";
  auto host = std::make_unique<DaemonFixture>(options);
  if (!h.dataset_root.empty()) UseFilesOf(*host, h.dataset_root);
  return host;
}

// Two epochs of seed 5 at 32 px, batch 8, as `daemon` delivers them.
std::vector<SampleLine> Delivered(DaemonFixture& daemon, const std::string& name) {
  const std::string out = daemon.dir() + "/" + name + ".tsv";
  const CommandResult consumed =
      daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "8", "--image-size", "32",
                  "--seed", "5", "--epochs", "2", "--samples-out", out});
  INFO(consumed.output);
  REQUIRE(consumed.exit_code == 0);
  return ReadSamplesOut(out);
}

// Same samples, same order, same bytes.
void CheckSame(const std::vector<SampleLine>& got, const std::vector<SampleLine>& want) {
  REQUIRE(got.size() == want.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].epoch != want[i].epoch || got[i].sequence != want[i].sequence ||
        got[i].sample_index != want[i].sample_index || got[i].label != want[i].label ||
        got[i].digest != want[i].digest) {
      ++differ;
    }
  }
  CHECK(differ == 0);
}

}  // namespace

TEST_CASE("a host with a feeder delivers exactly what it delivers alone: all leased, half "
          "leased, the feeder stopped, killed, or serving other files",
          "[feeder][tls]") {
  TestPki pki;
  IssueFeederAndHost(pki);
  const std::string feeder_address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  const DaemonFixtureOptions options = FeederOptions(pki, feeder_address);
  DaemonFixture feeder(options);
  WriteFile(feeder.dataset_root() + "/class_00/zz_bad.jpg", "\xff\xd8\xff not a JPEG at all");
  if (!feeder.Start()) FAIL(feeder.Log());
  // What one host alone delivers (the feeder's own streams decode locally).
  const std::vector<SampleLine> alone = Delivered(feeder, "alone");
  REQUIRE(alone.size() == 96);

  SECTION("local_decode = false: every good sample comes from the feeder, the bad one is judged "
          "here, and the feeder's pauses and death cost nothing but time") {
    auto host = MakeHost(pki, {feeder.dataset_root(), feeder_address, "host", false, 1500});
    if (!host->Start()) FAIL(host->Log());
    INFO(host->Log());
    CheckSame(Delivered(*host, "leased"), alone);
    v1::GetStatsResponse stats = Stats(host->endpoint());
    REQUIRE(stats.feeders_size() == 1);
    CHECK(stats.feeders(0).address() == feeder_address);
    CHECK(stats.feeders(0).state() == "up");
    CHECK(stats.feeders(0).samples() == 96);
    CHECK(stats.feeders(0).lease_failures() == 0);
    CHECK(stats.feeder_fallback_samples() == 0);
    // The first answer came over gRPC and told the data port; the rest came there.
    CHECK(stats.feeders(0).transport() == "tls socket");
    const CommandResult text = host->Ctl({"stats"});
    CHECK_THAT(text.output, Catch::Contains("feeder") && Catch::Contains(feeder_address + " (" +
                                                                         feeder_address + "): up"));

    // Stopped: each lease runs out (1.5 s), its samples are decoded here, the feeder is paused.
    feeder.process().Kill(SIGSTOP);
    CheckSame(Delivered(*host, "stopped"), alone);
    stats = Stats(host->endpoint());
    CHECK(stats.feeders(0).lease_failures() >= 1);
    CHECK_THAT(stats.feeders(0).last_error(), Catch::Contains("no answer within"));
    CHECK(stats.feeder_fallback_samples() > 0);
    CHECK_THAT(host->Log(), Catch::Contains("feeder " + feeder_address + ": no answer within"));
    feeder.process().Kill(SIGCONT);

    // Killed: refused connections, decoded here.
    feeder.process().Kill(SIGKILL);
    feeder.process().Wait();
    CheckSame(Delivered(*host, "killed"), alone);
  }

  SECTION("a stream closed, and the host stopped, while a feeder sits on a 60 s lease wait for "
          "neither the lease nor the feeder") {
    auto host = MakeHost(pki, {feeder.dataset_root(), feeder_address, "host", false, 60'000});
    if (!host->Start()) FAIL(host->Log());
    feeder.process().Kill(SIGSTOP);
    {
      client::Client c(host->endpoint());
      client::StreamOptions o;
      o.dataset = "synth";
      o.batch_size = 8;
      o.image_size = 32;
      auto stream = c.Open(o);
      CHECK_THROWS_AS(stream->Next(std::chrono::milliseconds(1500)), client::Error);
      const auto closing = std::chrono::steady_clock::now();
      stream.reset();  // CloseStream: the producer is waiting on the stopped feeder
      CHECK(std::chrono::steady_clock::now() - closing < std::chrono::seconds(8));
    }
    const auto stopping = std::chrono::steady_clock::now();
    CHECK(host->Stop() == 0);
    CHECK(std::chrono::steady_clock::now() - stopping < std::chrono::seconds(8));
    feeder.process().Kill(SIGCONT);
  }

  SECTION("a feeder without server.feeder_data_listen: every answer comes over gRPC") {
    const std::string grpc_only = "127.0.0.1:" + std::to_string(FreeTcpPort());
    DaemonFixture plain(FeederOptions(pki, grpc_only, /*data_port=*/0));
    UseFilesOf(plain, feeder.dataset_root());
    if (!plain.Start()) FAIL(plain.Log());
    auto host = MakeHost(pki, {feeder.dataset_root(), grpc_only, "host", false, 1500});
    if (!host->Start()) FAIL(host->Log());
    INFO(host->Log());
    const v1::GetStatsResponse before = Stats(host->endpoint());
    CheckSame(Delivered(*host, "grpc"), alone);
    const v1::GetStatsResponse stats = Stats(host->endpoint());
    REQUIRE(stats.feeders_size() == 1);
    CHECK(stats.feeders(0).samples() == 96);
    CHECK(stats.feeders(0).transport() == "grpc");
    CHECK(before.feeders(0).transport().empty());
  }

  SECTION("local_decode = true: the round is shared between this host's threads and the "
          "feeder") {
    auto host = MakeHost(pki, {feeder.dataset_root(), feeder_address, "host", true, 5000});
    if (!host->Start()) FAIL(host->Log());
    INFO(host->Log());
    CheckSame(Delivered(*host, "shared"), alone);
    const v1::GetStatsResponse stats = Stats(host->endpoint());
    REQUIRE(stats.feeders_size() == 1);
    CHECK(stats.feeders(0).samples() > 0);
    CHECK(stats.feeders(0).samples() < 96);
    CHECK(stats.local_decode_rate() > 0);
    const CommandResult doctor = host->Ctl({"doctor", "--live"});
    CHECK_THAT(doctor.output, Catch::Contains("feeder " + feeder_address + " (" + feeder_address +
                                              "): up"));
  }

  SECTION("a feeder whose files differ is refused naming both fingerprints, and the host "
          "decodes alone") {
    // The host's own files (another dataset seed): not the feeder's.
    auto host = MakeHost(pki, {"", feeder_address, "host", false, 1500}, /*dataset_seed=*/8);
    if (!host->Start()) FAIL(host->Log());
    INFO(host->Log());
    const std::vector<SampleLine> own = Delivered(*host, "own");
    CHECK(own.size() == 96);
    const v1::GetStatsResponse stats = Stats(host->endpoint());
    REQUIRE(stats.feeders_size() == 1);
    CHECK(stats.feeders(0).samples() == 0);
    REQUIRE(stats.feeders(0).refused_datasets_size() == 1);
    CHECK_THAT(stats.feeders(0).refused_datasets(0),
               Catch::Contains("synth: ") && Catch::Contains("fingerprint is") &&
                   Catch::Contains("the host's"));
    CHECK_THAT(host->Log(), Catch::Contains("refused dataset \"synth\""));
    const CommandResult doctor = host->Ctl({"doctor", "--live"});
    CHECK(doctor.exit_code != 0);
    CHECK_THAT(doctor.output, Catch::Contains("feeder " + feeder_address) &&
                                  Catch::Contains("refused: synth: "));
  }

  SECTION("a feeder that lies (checksum, an index not asked for, a wrong label, a short payload, "
          "too slow) is caught: its samples are decoded here and the trainer sees the same "
          "batches") {
    for (const std::string lie : {"checksum", "index", "label", "short", "slow"}) {
      INFO("feed_lie = " << lie);
      DaemonFixtureOptions liar_options = options;
      const std::string liar_address = "127.0.0.1:" + std::to_string(FreeTcpPort());
      liar_options.server_extra = "feeder_listen = \"" + liar_address + "\"";
      liar_options.config_extra += "[failpoints]\nfeed_lie = \"" + lie + "\"\n";
      DaemonFixture liar(liar_options);
      UseFilesOf(liar, feeder.dataset_root());
      if (!liar.Start()) FAIL(liar.Log());
      auto host = MakeHost(pki, {feeder.dataset_root(), liar_address, "host", false, 1500});
      if (!host->Start()) FAIL(host->Log());
      INFO(host->Log());
      CheckSame(Delivered(*host, "lied"), alone);
      const v1::GetStatsResponse stats = Stats(host->endpoint());
      REQUIRE(stats.feeders_size() == 1);
      CHECK(stats.feeders(0).samples() == 0);
      CHECK(stats.feeders(0).lease_failures() >= 1);
      CHECK_FALSE(stats.feeders(0).last_error().empty());
    }
  }

  SECTION("local_decode = true with a feeder whose answers are late (feed_lie = slow): while a "
          "round waits for them, the host decodes the next rounds' samples, and the trainer sees "
          "the same batches") {
    DaemonFixtureOptions late_options = options;
    const std::string late_address = "127.0.0.1:" + std::to_string(FreeTcpPort());
    late_options.server_extra = "feeder_listen = \"" + late_address + "\"";
    late_options.config_extra += "[failpoints]\nfeed_lie = \"slow\"\n";
    DaemonFixture late(late_options);
    UseFilesOf(late, feeder.dataset_root());
    if (!late.Start()) FAIL(late.Log());
    auto host = MakeHost(pki, {feeder.dataset_root(), late_address, "host", true, 1500});
    if (!host->Start()) FAIL(host->Log());
    INFO(host->Log());
    CheckSame(Delivered(*host, "ahead"), alone);
    const v1::GetStatsResponse stats = Stats(host->endpoint());
    CHECK(stats.samples_decoded_ahead() > 0);
    const CommandResult text = host->Ctl({"stats"});
    CHECK_THAT(text.output, Catch::Contains("ahead while feeders were late"));
  }

  SECTION("a feeder that does not allow the host's certificate gives nothing, and the host "
          "says why") {
    // Signed by the CA both trust, but not a name the feeder's allowed_clients lists.
    pki.Issue("intruder", "ca", "intruder", "DNS:intruder", 30);
    auto host = MakeHost(pki, {feeder.dataset_root(), feeder_address, "intruder", false, 1500});
    if (!host->Start()) FAIL(host->Log());
    INFO(host->Log());
    CheckSame(Delivered(*host, "untrusted"), alone);
    const v1::GetStatsResponse stats = Stats(host->endpoint());
    REQUIRE(stats.feeders_size() == 1);
    CHECK(stats.feeders(0).samples() == 0);
    CHECK(stats.feeders(0).lease_failures() >= 1);
    CHECK_THAT(stats.feeders(0).last_error(), Catch::Contains("refused this client"));
  }

  SECTION("SIGHUP re-reads the host's client certificate for its feeders (a rotation to one the "
          "feeder does not allow gets nothing from then on), and the feeder's certificate "
          "days are in stats and doctor") {
    pki.Issue("rotating", "ca", "host-r", "DNS:host-r", 30);
    auto host = MakeHost(pki, {feeder.dataset_root(), feeder_address, "rotating", false, 1500});
    if (!host->Start()) FAIL(host->Log());
    INFO(host->Log());
    CheckSame(Delivered(*host, "before"), alone);
    v1::FeederStatus f = Stats(host->endpoint()).feeders(0);
    const uint64_t before = f.samples();
    CHECK(before > 0);
    REQUIRE(f.has_cert_days_left());
    CHECK(f.cert_days_left() > 29);
    CHECK(f.cert_days_left() <= 30);
    CHECK(f.cert_subject() == "CN=feeder-1");
    CHECK_THAT(host->Ctl({"stats"}).output,
               Catch::Contains("certificate CN=feeder-1, 30 days left"));
    const CommandResult doctor = host->Ctl({"doctor", "--live"});
    CHECK_THAT(doctor.output, Catch::Contains("certificate CN=feeder-1, 30 days left"));

    // The files change under the host: nothing happens until it is told.
    pki.Issue("rotating", "ca", "intruder", "DNS:intruder", 30);
    CheckSame(Delivered(*host, "unsent"), alone);
    const uint64_t unsent = Stats(host->endpoint()).feeders(0).samples();
    CHECK(unsent > before);

    host->process().Kill(SIGHUP);
    REQUIRE(WaitFor([&] { return host->Log().find("certificate for [[feeders]]") !=
                                 std::string::npos; },
                    std::chrono::seconds(10)));
    CheckSame(Delivered(*host, "after"), alone);  // decoded here: the feeder refuses it now
    f = Stats(host->endpoint()).feeders(0);
    CHECK(f.samples() == unsent);
    CHECK_THAT(f.last_error(), Catch::Contains("refused this client"));
  }
}

namespace {

// `trainers` trainers (seeds 5, 6, ...) reading `options`' epochs at once: a line per sample,
// its trainer, position, index, label and the XXH64 of its pixels; trainer by trainer.
std::vector<std::string> ReadTrainers(const std::string& endpoint, int trainers,
                                      const client::StreamOptions& options) {
  std::vector<std::vector<std::string>> lines(static_cast<size_t>(trainers));
  std::vector<std::thread> threads;
  for (int t = 0; t < trainers; ++t) {
    threads.emplace_back([&, t] {
      client::Client c(endpoint);
      client::StreamOptions o = options;
      o.seed = 5 + static_cast<uint64_t>(t);
      auto stream = c.Open(o);
      uint64_t position = 0;
      while (std::optional<client::Batch> b = stream->Next()) {
        for (uint32_t i = 0; i < b->size(); ++i, ++position) {
          lines[static_cast<size_t>(t)].push_back(absl::StrFormat(
              "%d %d %d %d %016x", t, position, b->indices().data<int64_t>()[i],
              b->labels().data<int64_t>()[i],
              XXH64(b->sample_image(i), b->sample_image_bytes(), 0)));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<std::string> all;
  for (const std::vector<std::string>& one : lines) all.insert(all.end(), one.begin(), one.end());
  return all;
}

}  // namespace

TEST_CASE("at the shape users run: float32 batches of 256 at 224 px (154 MB each, rings of 462 "
          "MB), two trainers at once, all through a feeder: the same bytes as a host alone",
          "[feeder][tls][shape]") {
  TestPki pki;
  IssueFeederAndHost(pki);
  const std::string feeder_address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions feeder_options = FeederOptions(pki, feeder_address);
  feeder_options.images = 512;
  feeder_options.memory_limit = "3GiB";  // its feeds hold up to a quarter: 4 answers of 154 MB
  DaemonFixture feeder(feeder_options);
  if (!feeder.Start()) FAIL(feeder.Log());

  client::StreamOptions o;
  o.dataset = "synth";
  o.batch_size = 256;
  o.image_size = 224;
  o.dtype = client::DType::kFloat32;
  o.end_epoch = 1;
  const auto read = [&](const std::string& endpoint) { return ReadTrainers(endpoint, 2, o); };
  const std::vector<std::string> alone = read(feeder.endpoint());  // decoded locally
  REQUIRE(alone.size() == 2 * 512);

  // Rings of 462 MB, two of them, and the answers in flight: 3 GiB.
  const std::unique_ptr<DaemonFixture> host =
      MakeHost(pki, {.dataset_root = feeder.dataset_root(), .feeder = feeder_address,
                     .local_decode = false, .lease_ms = 60'000, .memory_limit = "3GiB"});
  if (!host->Start()) FAIL(host->Log());
  INFO(host->Log());
  CHECK(read(host->endpoint()) == alone);
  const v1::GetStatsResponse stats = Stats(host->endpoint());
  REQUIRE(stats.feeders_size() == 1);
  // Most through the feeder (one busy with the other trainer's answers may send some back here).
  CHECK(stats.feeders(0).samples() >= 512);
}

TEST_CASE("eight trainers on one host sharing a feeder, half their rounds leased: each reads the "
          "bytes of a host alone, and the feeder decodes a part of every stream's epoch",
          "[feeder][tls][shape]") {
  TestPki pki;
  IssueFeederAndHost(pki);
  const std::string feeder_address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions feeder_options = FeederOptions(pki, feeder_address);
  feeder_options.images = 256;
  DaemonFixture feeder(feeder_options);
  if (!feeder.Start()) FAIL(feeder.Log());
  client::StreamOptions o;
  o.dataset = "synth";
  o.batch_size = 32;
  o.image_size = 64;
  o.end_epoch = 2;
  constexpr int kTrainers = 8;
  const std::vector<std::string> alone = ReadTrainers(feeder.endpoint(), kTrainers, o);
  REQUIRE(alone.size() == kTrainers * 2 * 256);

  const std::unique_ptr<DaemonFixture> host =
      MakeHost(pki, {.dataset_root = feeder.dataset_root(), .feeder = feeder_address,
                     .lease_ms = 60'000, .server_extra = "max_streams = 16"});
  if (!host->Start()) FAIL(host->Log());
  INFO(host->Log());
  CHECK(ReadTrainers(host->endpoint(), kTrainers, o) == alone);
  const v1::GetStatsResponse stats = Stats(host->endpoint());
  REQUIRE(stats.feeders_size() == 1);
  CHECK(stats.feeders(0).samples() > 0);
  CHECK(stats.feeders(0).samples() < kTrainers * 2 * 256);  // this host decoded the rest
}

namespace {

// A data plane client's TLS context: certificate `name` of `pki`, trusting CA `ca`.
std::shared_ptr<SSL_CTX> DataContext(const TestPki& pki, const std::string& name,
                                     const std::string& ca = "ca") {
  base::TlsPaths paths{pki.Pem(ca), pki.Pem(name), pki.Key(name)};
  paths.check_chain = false;  // the feeder is to judge it
  absl::StatusOr<base::TlsIdentity> identity = base::LoadTlsIdentity(paths, std::time(nullptr));
  REQUIRE(identity.ok());
  absl::StatusOr<std::shared_ptr<SSL_CTX>> context =
      server::MakeFeedTlsContext(*identity, /*server=*/false);
  REQUIRE(context.ok());
  return *context;
}

server::FeedDeadline InSeconds(int s) {
  return std::chrono::steady_clock::now() + std::chrono::seconds(s);
}

// One call on `c`: the header (or the error), and the payload.
struct DataAnswer {
  uint32_t type = 0;
  v1::FeedHeader header;
  v1::FeedError error;
  std::string payload;
};
DataAnswer DataCall(server::FeedConnection& c, const v1::FeedRequest& request) {
  DataAnswer answer;
  REQUIRE(c.WriteFrame(server::kFeedFrameRequest, request, InSeconds(30)).ok());
  absl::StatusOr<server::FeedConnection::Frame> frame = c.ReadFrame(InSeconds(30));
  INFO(frame.status().ToString());
  REQUIRE(frame.ok());
  answer.type = frame->type;
  if (frame->type == server::kFeedFrameError) {
    REQUIRE(answer.error.ParseFromString(frame->bytes));
    return answer;
  }
  REQUIRE(frame->type == server::kFeedFrameHeader);
  REQUIRE(answer.header.ParseFromString(frame->bytes));
  answer.payload.resize(answer.header.payload_bytes());
  REQUIRE(c.Read({reinterpret_cast<uint8_t*>(answer.payload.data()), answer.payload.size()},
                 InSeconds(30))
              .ok());
  return answer;
}

}  // namespace

TEST_CASE("the data plane (server.feeder_data_listen) answers what the gRPC port answers, byte "
          "for byte, and refuses a stranger, an expired or disallowed certificate, a plaintext "
          "client and a malformed frame, saying why on both sides",
          "[feeder][tls]") {
  signal(SIGPIPE, SIG_IGN);  // writes to a connection the feeder closed fail, as in the daemon
  TestPki pki;
  IssueFeederAndHost(pki);
  pki.MakeCa("other", "Other CA");
  pki.Issue("stranger", "other", "host-2", "DNS:host-2", 30);
  pki.Issue("mallory", "ca", "mallory", "DNS:mallory", 30);
  pki.Issue("expired", "ca", "host-3", "DNS:host-3", -1);
  const std::string feeder_address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  const int data_port = FreeTcpPort();
  const std::string data = std::to_string(data_port);
  DaemonFixture daemon(FeederOptions(pki, feeder_address, data_port));
  if (!daemon.Start()) FAIL(daemon.Log());
  INFO(daemon.Log());
  CHECK_THAT(daemon.Log(), Catch::Contains("feeding other hosts' data plane on 127.0.0.1:" +
                                           data + " (mutual TLS)"));
  const uint64_t fingerprint = FingerprintOf(daemon);
  v1::FeedRequest request;
  request.set_dataset("synth");
  request.set_dataset_fingerprint(fingerprint);
  request.mutable_spec()->set_image_size(32);
  request.mutable_spec()->set_seed(5);
  request.set_epoch(1);
  request.set_payload_xxh3(true);
  for (uint32_t i : {3u, 17u, 0u, 41u, 9u}) request.add_indices(i);

  // Over gRPC: the answer tells the data port.
  SetTlsEnv(pki.ClientEnv("ca", "host"));
  const Fed fed = Feed(feeder_address, request);
  REQUIRE(fed.status.ok());
  CHECK(fed.header.data_port() == static_cast<uint32_t>(data_port));

  SECTION("a trusted host gets the gRPC answer's bytes, call after call on one connection") {
    absl::StatusOr<std::unique_ptr<server::FeedConnection>> c = server::FeedConnection::Dial(
        "127.0.0.1", data, "127.0.0.1", DataContext(pki, "host").get(), InSeconds(10));
    INFO(c.status().ToString());
    REQUIRE(c.ok());
    for (int call = 0; call < 3; ++call) {
      const DataAnswer answer = DataCall(**c, request);
      REQUIRE(answer.type == server::kFeedFrameHeader);
      CHECK(answer.header.count() == 5);
      CHECK(answer.header.data_port() == static_cast<uint32_t>(data_port));
      CHECK(answer.header.payload_xxh3() == fed.header.payload_xxh3());
      CHECK(answer.payload == fed.payload);
    }
    // The feeder's refusals come as the call's status: another fingerprint.
    v1::FeedRequest other = request;
    other.set_dataset_fingerprint(fingerprint + 1);
    const DataAnswer refused = DataCall(**c, other);
    REQUIRE(refused.type == server::kFeedFrameError);
    CHECK(refused.error.code() == static_cast<int>(grpc::StatusCode::FAILED_PRECONDITION));
    CHECK_THAT(refused.error.message(), Catch::Contains("do not see the same files"));
    // ... and the connection serves on.
    CHECK(DataCall(**c, request).payload == fed.payload);
    // A buffer kept from a larger answer, where this one's gaps (between its tensors) held
    // samples: those are zeroed, so the bytes and checksum are the same still.
    v1::FeedRequest larger = request;
    for (uint32_t i : {1u, 2u, 4u, 5u, 6u, 7u, 8u}) larger.add_indices(i);
    REQUIRE(DataCall(**c, larger).header.count() == 12);
    const DataAnswer again = DataCall(**c, request);
    CHECK(again.header.payload_xxh3() == fed.header.payload_xxh3());
    CHECK(again.payload == fed.payload);
  }

  SECTION("a client certificate the feeder does not trust gets an error saying why, and nothing "
          "else") {
    const std::map<std::string, std::string> why = {
        {"stranger", "is not signed by the configured CA"},
        {"mallory", "has no allowed name"},
        {"expired", "has expired"}};
    for (const auto& [name, reason] : why) {
      INFO(name);
      absl::StatusOr<std::unique_ptr<server::FeedConnection>> c = server::FeedConnection::Dial(
          "127.0.0.1", data, "127.0.0.1", DataContext(pki, name).get(), InSeconds(10));
      REQUIRE(c.ok());  // the handshake asks for a certificate; the check comes after it
      (void)(*c)->WriteFrame(server::kFeedFrameRequest, request, InSeconds(10));
      absl::StatusOr<server::FeedConnection::Frame> frame = (*c)->ReadFrame(InSeconds(10));
      REQUIRE(frame.ok());
      REQUIRE(frame->type == server::kFeedFrameError);
      v1::FeedError error;
      REQUIRE(error.ParseFromString(frame->bytes));
      CHECK(error.code() == static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));
      CHECK_THAT(error.message(), Catch::Contains("ringloaderd refused this client") &&
                                      Catch::Contains(reason));
      CHECK_FALSE((*c)->ReadFrame(InSeconds(10)).ok());  // then the connection ends
      CHECK_THAT(daemon.Log(), Catch::Contains("TLS: refused a client") && Catch::Contains(reason));
    }
    // Counted as the gRPC port's refusals are (the map's last: "stranger").
    const v1::GetStatsResponse stats = Stats(daemon.endpoint());
    CHECK(stats.tls().clients_refused() == 3);
    CHECK_THAT(stats.tls().last_refusal(), Catch::Contains("is not signed by the configured CA"));
  }

  SECTION("a plaintext client, and a client without a certificate, fail the handshake: the "
          "feeder's log says which address and why") {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(data_port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) == 0);
    const std::string hello = "GET / HTTP/1.1\r\nHost: feeder\r\n\r\n";
    REQUIRE(write(fd, hello.data(), hello.size()) == static_cast<ssize_t>(hello.size()));
    std::string got;
    char buffer[4096];
    for (ssize_t n; (n = read(fd, buffer, sizeof(buffer))) > 0;) got.append(buffer, n);
    close(fd);
    CHECK(got.find("RLF") == std::string::npos);  // no frame: at most a TLS alert
    REQUIRE(WaitFor([&] { return daemon.Log().find("the TLS handshake with ipv4:127.0.0.1") !=
                                 std::string::npos; }, std::chrono::seconds(10)));
    CHECK_THAT(daemon.Log(), Catch::Contains("feeder data port " + data + ": the TLS handshake"));

    // A TLS client without a certificate: the handshake fails on both ends.
    std::shared_ptr<SSL_CTX> anonymous(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
    SSL_CTX_set_verify(anonymous.get(), SSL_VERIFY_NONE, nullptr);
    const std::string alpn = std::string(1, static_cast<char>(std::strlen(server::kFeedAlpn))) +
                             server::kFeedAlpn;
    SSL_CTX_set_alpn_protos(anonymous.get(), reinterpret_cast<const unsigned char*>(alpn.data()),
                            static_cast<unsigned int>(alpn.size()));
    absl::StatusOr<std::unique_ptr<server::FeedConnection>> c = server::FeedConnection::Dial(
        "127.0.0.1", data, "127.0.0.1", anonymous.get(), InSeconds(10));
    if (c.ok()) {  // TLS 1.3: the client learns of the refusal at its first read
      (void)(*c)->WriteFrame(server::kFeedFrameRequest, request, InSeconds(10));
      absl::StatusOr<server::FeedConnection::Frame> frame = (*c)->ReadFrame(InSeconds(10));
      REQUIRE_FALSE(frame.ok());
      CHECK_THAT(std::string(frame.status().message()), Catch::Contains("certificate"));
    } else {
      CHECK_THAT(std::string(c.status().message()), Catch::Contains("certificate"));
    }
    REQUIRE(WaitFor([&] {
      return daemon.Log().find("peer did not return a certificate") != std::string::npos;
    }, std::chrono::seconds(10)));
  }

  SECTION("the host checks the feeder's certificate: its name, and its CA") {
    absl::StatusOr<std::unique_ptr<server::FeedConnection>> wrong_name =
        server::FeedConnection::Dial("127.0.0.1", data, "10.1.2.3", DataContext(pki, "host").get(),
                                     InSeconds(10));
    REQUIRE_FALSE(wrong_name.ok());
    CHECK_THAT(std::string(wrong_name.status().message()),
               Catch::Contains("the feeder's certificate for 10.1.2.3: IP address mismatch"));
    absl::StatusOr<std::unique_ptr<server::FeedConnection>> wrong_ca =
        server::FeedConnection::Dial("127.0.0.1", data, "127.0.0.1",
                                     DataContext(pki, "stranger", "other").get(), InSeconds(10));
    REQUIRE_FALSE(wrong_ca.ok());
    // ("self-signed certificate in certificate chain": it sends its CA along)
    CHECK_THAT(std::string(wrong_ca.status().message()),
               Catch::Contains("the TLS handshake: the feeder's certificate for 127.0.0.1: "));
  }

  SECTION("a connection open before a SIGHUP that stops allowing its certificate is refused at "
          "its next call") {
    absl::StatusOr<std::unique_ptr<server::FeedConnection>> c = server::FeedConnection::Dial(
        "127.0.0.1", data, "127.0.0.1", DataContext(pki, "host").get(), InSeconds(10));
    REQUIRE(c.ok());
    CHECK(DataCall(**c, request).payload == fed.payload);
    std::string config = ReadFile(daemon.config_path());
    const std::string allowed = "allowed_clients = [\"DNS:host-*\"]";
    REQUIRE(config.find(allowed) != std::string::npos);
    config.replace(config.find(allowed), allowed.size(), "allowed_clients = [\"DNS:trainer-*\"]");
    WriteFile(daemon.config_path(), config);
    daemon.process().Kill(SIGHUP);
    REQUIRE(WaitFor([&] { return daemon.Log().find("TLS: reloaded") != std::string::npos; },
                    std::chrono::seconds(10)));
    const DataAnswer refused = DataCall(**c, request);
    REQUIRE(refused.type == server::kFeedFrameError);
    CHECK(refused.error.code() == static_cast<int>(grpc::StatusCode::UNAUTHENTICATED));
    CHECK_THAT(refused.error.message(), Catch::Contains("has no allowed name"));
  }

  SECTION("one address holds at most 32 connections: the next is closed, logged, and one closed "
          "makes room") {
    const auto host = DataContext(pki, "host");
    std::vector<std::unique_ptr<server::FeedConnection>> held;
    for (int i = 0; i < server::kMaxFeedConnectionsPerHost; ++i) {
      auto c = server::FeedConnection::Dial("127.0.0.1", data, "127.0.0.1", host.get(),
                                            InSeconds(10));
      REQUIRE(c.ok());
      held.push_back(*std::move(c));
    }
    CHECK_FALSE(server::FeedConnection::Dial("127.0.0.1", data, "127.0.0.1", host.get(),
                                             InSeconds(10))
                    .ok());
    // (Logged as the feeder closes it: the client may see the close first.)
    CHECK(WaitFor([&] {
      return daemon.Log().find("a connection from ipv4:127.0.0.1 refused: it has 32 open "
                               "already") != std::string::npos;
    }, std::chrono::seconds(10)));
    held.pop_back();  // its thread ends as the feeder reads the close
    bool dialled = false;
    REQUIRE(WaitFor([&] {
      dialled = server::FeedConnection::Dial("127.0.0.1", data, "127.0.0.1", host.get(),
                                             InSeconds(10))
                    .ok();
      return dialled;
    }, std::chrono::seconds(10)));
  }

  SECTION("a frame that is not a request, or longer than 1 MiB, ends the connection") {
    const auto host = DataContext(pki, "host");
    {
      auto c = server::FeedConnection::Dial("127.0.0.1", data, "127.0.0.1", host.get(),
                                            InSeconds(10));
      REQUIRE(c.ok());
      REQUIRE((*c)->WriteFrame(0x12345678, request, InSeconds(10)).ok());
      absl::StatusOr<server::FeedConnection::Frame> frame = (*c)->ReadFrame(InSeconds(10));
      REQUIRE(frame.ok());
      REQUIRE(frame->type == server::kFeedFrameError);
      v1::FeedError error;
      REQUIRE(error.ParseFromString(frame->bytes));
      CHECK(error.code() == static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
      CHECK(error.message() == "not a FeedRequest frame");
      CHECK_FALSE((*c)->ReadFrame(InSeconds(10)).ok());
    }
    {
      auto c = server::FeedConnection::Dial("127.0.0.1", data, "127.0.0.1", host.get(),
                                            InSeconds(10));
      REQUIRE(c.ok());
      const uint8_t huge[8] = {0x52, 0x4c, 0x46, 0x51, 0, 0, 0x20, 0};  // a request of 2 MiB
      REQUIRE((*c)->Write(huge, InSeconds(10)).ok());
      CHECK_FALSE((*c)->ReadFrame(InSeconds(10)).ok());  // closed without reading 2 MiB
    }
    // The feeder serves on.
    auto c = server::FeedConnection::Dial("127.0.0.1", data, "127.0.0.1", host.get(),
                                          InSeconds(10));
    REQUIRE(c.ok());
    CHECK(DataCall(**c, request).payload == fed.payload);
  }
}

}  // namespace ringloader::testing
