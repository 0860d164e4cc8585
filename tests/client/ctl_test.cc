// SPDX-License-Identifier: Apache-2.0
// ringloaderctl without a daemon: exit codes, state files, make-dataset and validate.
#include "client/ctl/ctl.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "client/ctl/consume_state.h"
#include "tests/support/test_support.h"

namespace ringloader::ctl {
namespace {

using testing::BuiltBinary;
using testing::RunCommand;
using testing::TempDir;

const std::string kCtl = BuiltBinary("client/ctl/ringloaderctl");

int Lines(const std::string& text) {
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

TEST_CASE("ringloaderctl health: no daemon exits 2 with one line", "[ctl]") {
  TempDir dir;
  auto r = RunCommand({kCtl, "--endpoint", "unix:" + dir.Join("none.sock"), "health"});
  CHECK(r.exit_code == 2);
  CHECK(Lines(r.output) == 1);
  CHECK_THAT(r.output, Catch::StartsWith("unreachable: unix:" + dir.Join("none.sock")));
}

TEST_CASE("ringloaderctl health: the endpoint defaults to $RINGLOADER_ENDPOINT", "[ctl]") {
  TempDir dir;
  auto r = RunCommand({kCtl, "health", "--timeout", "0.5"},
                      {{"RINGLOADER_ENDPOINT", "unix:" + dir.Join("env.sock")}});
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::Contains(dir.Join("env.sock")));
}

TEST_CASE("ringloaderctl stats and quarantine: no daemon exits 2", "[ctl]") {
  TempDir dir;
  const std::string endpoint = "unix:" + dir.Join("none.sock");
  CHECK(RunCommand({kCtl, "--endpoint", endpoint, "stats"}).exit_code == 2);
  CHECK(RunCommand({kCtl, "--endpoint", endpoint, "stats", "--json"}).exit_code == 2);
  CHECK(RunCommand({kCtl, "--endpoint", endpoint, "quarantine", "list"}).exit_code == 2);
}

TEST_CASE("ringloaderctl: usage errors exit 2", "[ctl]") {
  CHECK(RunCommand({kCtl}).exit_code == 2);
  CHECK(RunCommand({kCtl, "consume"}).exit_code == 2);  // --dataset is required
  CHECK(RunCommand({kCtl, "consume", "--dataset", "d", "--dtype", "int8"}).exit_code == 2);
  CHECK(RunCommand({kCtl, "--help"}).exit_code == 0);
}

TEST_CASE("ringloaderctl consume: no daemon past the deadline exits 2 saying so", "[ctl]") {
  TempDir dir;
  auto r = RunCommand({kCtl, "--endpoint", "unix:" + dir.Join("none.sock"), "consume", "--dataset",
                       "d", "--reconnect-deadline-s", "0.2"});
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.output, Catch::StartsWith("ringloaderctl consume: ringloaderd at unix:") &&
                           Catch::Contains("unreachable for 0.2 s (reconnect_deadline 0.2 s): UNAVAILABLE"));
}

TEST_CASE("Client::Open: no daemon throws kUnavailable after reconnect_deadline", "[client]") {
  TempDir dir;
  client::Client client("unix:" + dir.Join("none.sock"));
  client::StreamOptions options;
  options.dataset = "d";
  options.reconnect_deadline = std::chrono::milliseconds(100);
  try {
    client.Open(options);
    FAIL("opened a stream without a daemon");
  } catch (const client::Error& e) {
    CHECK(e.code() == client::ErrorCode::kUnavailable);
    CHECK_THAT(e.what(), Catch::Contains("unreachable for 0.1 s"));
  }
}

TEST_CASE("Consume state: round-trips and rejects a mismatched run naming the flag", "[ctl]") {
  client::StreamOptions o;
  o.dataset = "train";
  o.seed = 5;
  o.end_epoch = 3;
  // A path with a tab, a newline and a byte that is not UTF-8 survives the round trip.
  const std::string samples_path = std::string("/tmp/odd\tname\n\xe9.tsv");
  const std::string text =
      FormatConsumeState(client::FormatState(o, {1, 4, 256}), 98765, samples_path);
  auto parsed = ParseConsumeState(text);
  REQUIRE(parsed.ok());
  CHECK(parsed->samples_out_bytes == 98765);
  CHECK(parsed->samples_out_path == samples_path);
  CHECK(parsed->options.start == client::Position{1, 4, 256});
  CHECK(CheckSameRun(parsed->options, o).ok());

  client::StreamOptions other = o;
  other.seed = 6;
  CHECK_THAT(std::string(CheckSameRun(parsed->options, other).message()),
             Catch::Contains("--seed is 6") && Catch::Contains("saved with 5"));
  other = o;
  other.end_epoch = 4;
  CHECK_THAT(std::string(CheckSameRun(parsed->options, other).message()),
             Catch::Contains("--epochs"));

  CHECK_FALSE(ParseConsumeState("ringloader-state v1").ok());
  auto bad = ParseConsumeState(client::FormatState(o, {}) + "\nsamples_out_bytes=x\n");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("line 2"));
}

TEST_CASE("ReadFileIfExists: an absent file is no error", "[ctl]") {
  TempDir dir;
  auto read = ReadFileIfExists(dir.Join("absent"), kMaxConsumeStateBytes);
  REQUIRE(read.ok());
  CHECK_FALSE(read->has_value());
}

TEST_CASE("ringloaderctl consume --state: a state of another run is refused before connecting",
          "[ctl]") {
  TempDir dir;
  client::StreamOptions o;
  o.dataset = "train";
  o.end_epoch = 1;
  o.seed = 1;
  testing::WriteFile(dir.Join("state"), FormatConsumeState(client::FormatState(o, {0, 3, 192}), 0, ""));
  auto r = RunCommand({kCtl, "--endpoint", "unix:" + dir.Join("none.sock"), "consume", "--dataset",
                       "train", "--seed", "2", "--state", dir.Join("state")});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("--seed is 2 but the state file was saved with 1"));

  testing::WriteFile(dir.Join("state"), "ringloader-state v1 dataset=train\nsamples_out_bytes=0\n");
  r = RunCommand({kCtl, "--endpoint", "unix:" + dir.Join("none.sock"), "consume", "--dataset",
                  "train", "--state", dir.Join("state")});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("field 'batch_size': missing"));
}

TEST_CASE("ringloaderctl consume --state: a FIFO, a device or an oversized file is refused "
          "before it is read, naming why and the limit", "[ctl]") {
  TempDir dir;
  REQUIRE(::mkfifo(dir.Join("fifo").c_str(), 0600) == 0);  // no writer: reading it would block
  testing::WriteFile(dir.Join("big"), std::string(kMaxConsumeStateBytes + 1, 'x'));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {dir.Join("fifo"), " is not a regular file (a FIFO)"},
      {"/dev/zero", " is not a regular file (a character device)"},  // never ends
      {dir.Join("big"), absl::StrCat(" has ", kMaxConsumeStateBytes + 1,
                                     " bytes or more, more than the ", kMaxConsumeStateBytes,
                                     " a state file can have")},
  };
  for (const auto& [path, why] : cases) {
    INFO(path);
    auto read = ReadFileIfExists(path, kMaxConsumeStateBytes);
    REQUIRE_FALSE(read.ok());
    CHECK_THAT(std::string(read.status().message()), Catch::Contains(path + why));
    auto r = RunCommand({kCtl, "--endpoint", "unix:" + dir.Join("none.sock"), "consume",
                         "--dataset", "train", "--state", path},
                        {}, std::chrono::seconds(20));
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, Catch::Contains(path + why));
  }
  // A regular file at the limit is read whole.
  testing::WriteFile(dir.Join("big"), std::string(kMaxConsumeStateBytes, 'x'));
  auto read = ReadFileIfExists(dir.Join("big"), kMaxConsumeStateBytes);
  REQUIRE(read.ok());
  CHECK((*read)->size() == kMaxConsumeStateBytes);
}

TEST_CASE("ringloaderctl make-dataset then validate: all good, exit 0", "[ctl][validate]") {
  TempDir dir;
  auto made = RunCommand({kCtl, "make-dataset", "--out", dir.Join("ds"), "--count", "24",
                          "--classes", "3", "--seed", "1"});
  REQUIRE(made.exit_code == 0);
  CHECK(made.output == "wrote 24 images in 3 classes to " + dir.Join("ds") + "\n");
  auto r = RunCommand(
      {kCtl, "validate", "--format", "imagefolder", "--path", dir.Join("ds"), "--jobs", "2"});
  CHECK(r.exit_code == 0);
  CHECK(r.output == "checked 24 files: 24 good, 0 bad\nformats: jpeg 24\n");
}

TEST_CASE("11: make-dataset and convert write shards, and refuse what would mix datasets",
          "[ctl][formats]") {
  TempDir dir;
  REQUIRE(RunCommand({kCtl, "make-dataset", "--out", dir.Join("ds"), "--count", "10",
                      "--classes", "2"})
              .exit_code == 0);
  auto converted = RunCommand({kCtl, "convert", "--to", "tfrecord", "--path", dir.Join("ds"),
                               "--out", dir.Join("tfr"), "--shard-size", "4"});
  CHECK(converted.exit_code == 0);
  CHECK(converted.output == "converted 10 samples from " + dir.Join("ds") + " to " +
                                dir.Join("tfr") + " as tfrecord (3 shards)\n");
  auto v = RunCommand({kCtl, "validate", "--format", "tfrecord", "--path", dir.Join("tfr")});
  CHECK(v.exit_code == 0);
  CHECK(v.output == "checked 10 samples: 10 good, 0 bad\nformats: jpeg 10\n");
  // Shards already there: a second run would leave old ones mixed with new ones.
  auto again = RunCommand({kCtl, "convert", "--to", "tfrecord", "--path", dir.Join("ds"),
                           "--out", dir.Join("tfr"), "--shard-size", "5"});
  CHECK(again.exit_code == 2);
  CHECK_THAT(again.output, Catch::Contains("shard-000000.tfrecord"));
  CHECK(RunCommand({kCtl, "convert", "--from", "tfrecord", "--to", "webdataset", "--path",
                    dir.Join("tfr"), "--out", dir.Join("x")})
            .exit_code == 2);
  CHECK(RunCommand({kCtl, "make-dataset", "--out", dir.Join("w"), "--format", "webdataset",
                    "--label-base", "1"})
            .exit_code == 2);
  CHECK(RunCommand({kCtl, "make-dataset", "--out", dir.Join("few"), "--count", "6"}).exit_code ==
        2);  // 10 classes for 6 images: empty class folders
  auto arrays = RunCommand({kCtl, "make-dataset", "--out", dir.Join("a"), "--count", "6",
                            "--classes", "3", "--format", "arrays", "--image-size", "8"});
  CHECK(arrays.exit_code == 0);
  v = RunCommand({kCtl, "validate", "--format", "arrays", "--path", dir.Join("a"), "--label",
                  "labels"});
  CHECK(v.exit_code == 0);
  CHECK(v.output == "checked 6 samples: 6 good, 0 bad\n");
  // Without --label, labels.npy is the label column (as make-dataset means it).
  v = RunCommand({kCtl, "validate", "--format", "arrays", "--path", dir.Join("a")});
  CHECK(v.exit_code == 0);
  CHECK(v.output == "checked 6 samples: 6 good, 0 bad\n");
  // With another label column, labels.npy would be a second "labels" tensor: refused, naming the
  // file and the fix.
  std::filesystem::copy_file(dir.Join("a/labels.npy"), dir.Join("y.npy"));
  std::filesystem::rename(dir.Join("y.npy"), dir.Join("a/y.npy"));
  v = RunCommand({kCtl, "validate", "--format", "arrays", "--path", dir.Join("a"), "--label", "y"});
  CHECK(v.exit_code == 2);
  CHECK_THAT(v.output, Catch::Contains("labels.npy") && Catch::Contains("set label = \"labels\""));
  std::filesystem::remove(dir.Join("a/y.npy"));
  // Nothing left behind but the dataset (no temporaries).
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir.Join("a"))) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"depth.npy", "images.npy", "labels.npy"});
}

TEST_CASE("ringloaderctl validate: a corrupted file exits 1 and is named", "[ctl][validate]") {
  TempDir dir;
  REQUIRE(
      RunCommand({kCtl, "make-dataset", "--out", dir.Join("ds"), "--count", "12", "--classes", "2"})
          .exit_code == 0);
  // Truncate one image to a third of its size and replace another with text.
  std::vector<std::filesystem::path> files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.Join("ds"))) {
    if (e.is_regular_file() && e.path().extension() == ".jpg") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  REQUIRE(files.size() == 12);
  const std::string truncated = files[3].string();
  std::filesystem::resize_file(truncated, std::filesystem::file_size(truncated) / 3);
  testing::WriteFile(files[8].string(), "this is not a jpeg");
  const std::string root = dir.Join("ds") + "/";

  auto r = RunCommand({kCtl, "validate", "--path", dir.Join("ds")});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("BAD " + truncated.substr(root.size()) + ": "));
  CHECK_THAT(r.output,
             Catch::Contains("BAD " + files[8].string().substr(root.size()) + ": not_image: "));
  CHECK_THAT(r.output, Catch::Contains("checked 12 files: 10 good, 2 bad ("));

  CHECK(RunCommand({kCtl, "validate", "--path", dir.Join("missing")}).exit_code == 2);
}

}  // namespace
}  // namespace ringloader::ctl
