// SPDX-License-Identifier: Apache-2.0
// Issue 40 item 1, the feeder's side: a ringloaderd with server.feeder_listen decodes the samples
// a host asks for, over mutual TLS, and they are byte for byte what the host's own streams
// deliver for the same (dataset, seed, epoch, sample); a bad sample is reported, not sent; a
// host whose dataset differs, a malformed request, and a host without a trusted certificate get
// nothing, and are told why.

#include <xxhash.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/channel.h"
#include "client/client.h"
#include "proto/ringloader.grpc.pb.h"
#include "server/pipeline/batch_filler.h"
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

}  // namespace

TEST_CASE("a feeder decodes what a host asks for byte for byte as the host's streams do, over "
          "mutual TLS, and refuses what it must, saying why",
          "[feeder][tls]") {
  TestPki pki;
  pki.MakeCa("ca", "ringloader test CA");
  pki.MakeCa("other", "Other CA");
  pki.Issue("feeder", "ca", "feeder-1", "IP:127.0.0.1", 30);
  pki.Issue("host", "ca", "host-1", "DNS:host-1", 30);
  pki.Issue("stranger", "other", "host-2", "DNS:host-2", 30);
  const std::string feeder_address = "127.0.0.1:" + std::to_string(FreeTcpPort());
  DaemonFixtureOptions options;
  options.images = 48;
  options.server_extra = "feeder_listen = \"" + feeder_address + "\"";
  options.config_extra = "[tls]\nca = \"" + pki.Pem("ca") + "\"\ncert = \"" + pki.Pem("feeder") +
                         "\"\nkey = \"" + pki.Key("feeder") +
                         "\"\nallowed_clients = [\"DNS:host-*\"]\n";
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
  uint64_t fingerprint = 0;
  {
    client::Client c(daemon.endpoint());
    client::StreamOptions o;
    o.dataset = "synth";
    o.batch_size = 8;
    o.image_size = 32;
    fingerprint = c.Open(o)->dataset_fingerprint();
  }

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

}  // namespace ringloader::testing
