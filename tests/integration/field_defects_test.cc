// SPDX-License-Identifier: Apache-2.0
// Issue 9: what a hostile or unlucky host did to the daemon, each through the real ringloaderd,
// ringloaderctl and C++ client, over a real socket and real shared memory.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "client/channel.h"
#include "client/client.h"
#include "proto/ringloader.grpc.pb.h"
#include "server/image/synthetic.h"
#include "tests/integration/daemon_fixture.h"

namespace ringloader::testing {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;
using std::chrono::seconds;

std::string Replace(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

bool LogHas(const DaemonFixture& daemon, const std::string& needle) {
  return daemon.Log().find(needle) != std::string::npos;
}

// Consumes one whole epoch of "synth" (no shuffle) and returns the samples-out lines.
std::vector<SampleLine> ConsumeEpoch(DaemonFixture& daemon, const std::string& dataset = "synth",
                                     std::vector<std::string> extra = {}) {
  const std::string out = daemon.dir() + "/samples-" + UniqueName("e") + ".tsv";
  std::vector<std::string> args = {"consume", "--dataset", dataset, "--batch-size", "8",
                                   "--image-size", "32", "--no-shuffle", "--samples-out", out,
                                   "--reconnect-deadline-s", "20"};
  args.insert(args.end(), extra.begin(), extra.end());
  CommandResult r = daemon.Ctl(args);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return ReadSamplesOut(out);
}

std::vector<std::string> SegmentsIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("ringloader.", 0) == 0 && name.find(".lock") == std::string::npos) {
      names.push_back(name);
    }
  }
  return names;
}

bool HaveUnshare() {
  return RunningAsRoot() &&
         RunCommand({"/usr/bin/unshare", "--pid", "--fork", "--mount", "/bin/true"}).exit_code == 0;
}

// ---------------------------------------------------------------------------------------------
// Process, socket and signals

TEST_CASE("defect 1: a refused second start removes nothing it did not create",
          "[integration][defects]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  const std::string socket = daemon.endpoint().substr(5);
  for (int attempt = 0; attempt < 2; ++attempt) {
    CommandResult second = RunCommand({DaemonPath(), "--config", daemon.config_path()});
    INFO(second.output);
    CHECK(second.exit_code == 1);
    CHECK_THAT(second.output, Catch::Contains("another ringloaderd is already serving"));
    CHECK(fs::exists(socket));
    CHECK(daemon.Ctl({"health"}).exit_code == 0);
  }

  // A regular file where the socket should go is refused and left as it was.
  const std::string regular = daemon.dir() + "/not-a-socket";
  WriteFile(regular, "precious");
  CommandResult refused =
      RunCommand({DaemonPath(), "--config", daemon.config_path(), "--listen", "unix:" + regular});
  INFO(refused.output);
  CHECK(refused.exit_code == 1);
  CHECK_THAT(refused.output, Catch::Contains("refusing to replace it"));
  CHECK(ReadFile(regular) == "precious");
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("defect 2: SIGHUP reloads log_level and new datasets, names what needs a restart, and "
          "never kills",
          "[integration][defects]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  image::SyntheticDatasetOptions more;
  more.out_dir = daemon.dir() + "/more";
  more.count = 24;
  more.classes = 2;
  more.seed = 5;
  REQUIRE(image::WriteSyntheticDataset(more).ok());

  std::string config = ReadFile(daemon.config_path());
  config = Replace(config, "log_level = \"info\"", "log_level = \"debug\"");
  config = Replace(config, "decode_threads = 2", "decode_threads = 3");
  config += "\n[[datasets]]\nname = \"more\"\nformat = \"imagefolder\"\npath = \"" +
            more.out_dir + "\"\n";
  WriteFile(daemon.config_path(), config);
  daemon.process().Kill(SIGHUP);
  REQUIRE(WaitFor([&] { return LogHas(daemon, "reload: applied"); }, seconds(20)));
  CHECK(daemon.process().Running());
  CHECK(LogHas(daemon, "server.log_level = \"debug\""));
  CHECK(LogHas(daemon, "new dataset more"));
  CHECK(LogHas(daemon, "need a restart to apply: server.decode_threads"));
  // The new dataset serves, and debug lines now appear.
  CHECK(ConsumeEpoch(daemon, "more").size() == 24);
  CHECK(LogHas(daemon, "[debug]"));

  // A config that does not load changes nothing and stops nothing.
  WriteFile(daemon.config_path(), config + "\nthis is not toml\n");
  daemon.process().Kill(SIGHUP);
  REQUIRE(WaitFor([&] { return LogHas(daemon, "keeping the running one"); }, seconds(20)));
  CHECK(daemon.process().Running());
  CHECK(daemon.Ctl({"health"}).exit_code == 0);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("defects 2 and 3: the supervisor forwards SIGHUP, and its child is named ringloaderd",
          "[integration][defects]") {
  DaemonFixtureOptions options;
  options.supervise = true;
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const pid_t child = daemon.ServingPid();
  REQUIRE(child > 0);
  CHECK(ReadFile("/proc/" + std::to_string(child) + "/comm") == "ringloaderd\n");
  const std::string cmdline = ReadFile("/proc/" + std::to_string(child) + "/cmdline");
  const std::string argv0 = cmdline.substr(0, cmdline.find('\0'));
  CHECK_THAT(argv0, Catch::EndsWith("/ringloaderd"));
  CommandResult pgrep = RunCommand({"/usr/bin/pgrep", "-x", "ringloaderd"});
  CHECK_THAT(pgrep.output, Catch::Contains(std::to_string(child)));

  daemon.process().Kill(SIGHUP);
  REQUIRE(WaitFor([&] { return LogHas(daemon, "reload: applied"); }, seconds(20)));
  CHECK(LogHas(daemon, "SIGHUP: forwarded to ringloaderd"));
  CHECK(daemon.process().Running());
  CHECK(daemon.ServingPid() == child);  // reloaded, not restarted
  CHECK(daemon.Ctl({"health"}).exit_code == 0);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("defect 4: a daemon in another pid namespace never deletes a live daemon's ring, and a "
          "dead incarnation's are reclaimed whatever its pid",
          "[integration][defects]") {
  if (!HaveUnshare()) RINGLOADER_SKIP("needs root and unshare --pid to start a daemon in a new pid namespace");
  TempDir shm;
  DaemonFixtureOptions options;
  options.server_extra = "shm_dir = \"" + shm.path() + "\"";
  DaemonFixture a(options);
  // A dead incarnation whose pid is alive (1) and equal across namespaces: only its unheld lock
  // tells it is dead.
  WriteFile(shm.Join("ringloader.1.abc.lock"), "");
  WriteFile(shm.Join("ringloader.1.abc.7"), "old ring");
  REQUIRE(a.Start());
  CHECK_FALSE(fs::exists(shm.Join("ringloader.1.abc.7")));
  CHECK_FALSE(fs::exists(shm.Join("ringloader.1.abc.lock")));

  client::Client trainer(a.endpoint());
  client::StreamOptions so;
  so.dataset = "synth";
  so.batch_size = 8;
  so.image_size = 32;
  auto stream = trainer.Open(so);
  REQUIRE(stream->Next().has_value());
  const std::vector<std::string> rings = SegmentsIn(shm.path());
  REQUIRE(rings.size() == 1);

  // Daemon B: same shm_dir, own socket and state, pid 1 of a new pid namespace (a container).
  std::string config_b = ReadFile(a.config_path());
  config_b = Replace(config_b, a.endpoint(), "unix:" + a.dir() + "/b.sock");
  config_b = Replace(config_b, a.state_dir(), a.dir() + "/state-b");
  WriteFile(a.dir() + "/b.toml", config_b);
  Subprocess b({"/usr/bin/unshare", "--pid", "--fork", "--kill-child=SIGTERM", DaemonPath(),
                "--config", a.dir() + "/b.toml"},
               {}, a.dir() + "/b.log");
  REQUIRE(WaitFor(
      [&] {
        return RunCommand({CtlPath(), "--endpoint", "unix:" + a.dir() + "/b.sock", "health"})
                   .exit_code == 0;
      },
      seconds(30)));
  CHECK(fs::exists(shm.Join(rings[0])));
  for (int i = 0; i < 20; ++i) REQUIRE(stream->Next().has_value());
  CHECK(fs::exists(shm.Join(rings[0])));
  // B is pid 1 of its namespace, as in a container: a SIGTERM from outside (docker stop) must
  // still stop it cleanly. (unshare itself ignores SIGTERM; signal its child.)
  CommandResult child = RunCommand({"/usr/bin/pgrep", "-P", std::to_string(b.pid())});
  REQUIRE(child.exit_code == 0);
  ::kill(static_cast<pid_t>(std::stol(child.output)), SIGTERM);
  CHECK(b.WaitExitCode(seconds(20)) == 0);
  CHECK(WaitFor([&] { return !fs::exists(a.dir() + "/b.sock"); }, seconds(10)));
  CHECK_THAT(ReadFile(a.dir() + "/b.log"), Catch::Contains("ringloaderd stopped cleanly"));
}

// ---------------------------------------------------------------------------------------------
// Data the daemon reads

TEST_CASE("defect 5: a file name that is not UTF-8 is a valid sample path end to end",
          "[integration][defects]") {
  DaemonFixture daemon;
  const std::string latin1 = "class_00/caf\xe9.jpg";
  fs::copy_file(daemon.dataset_root() + "/class_00/img_000000.jpg",
                daemon.dataset_root() + "/" + latin1);
  WriteFile(daemon.dataset_root() + "/class_01/bad\xff\n.jpg", "not a jpeg");
  REQUIRE(daemon.Start());
  std::vector<SampleLine> lines = ConsumeEpoch(daemon);
  CHECK(lines.size() == 121);
  std::set<std::string> paths;
  for (const SampleLine& l : lines) paths.insert(l.path);
  CHECK(paths.count("class_00/caf\\xe9.jpg") == 1);

  CommandResult stats = daemon.Ctl({"stats"});
  INFO(stats.output);
  CHECK(stats.exit_code == 0);
  CHECK_THAT(stats.output, Catch::Contains("class_01/bad\\xff\\n.jpg: not_image"));
  CHECK(LogHas(daemon, "class_01/bad\\xff\\n.jpg"));

  CommandResult validate = daemon.Ctl({"validate", "--path", daemon.dataset_root()});
  CHECK(validate.exit_code == 1);
  CHECK_THAT(validate.output, Catch::Contains("BAD class_01/bad\\xff\\n.jpg: not_image"));
  CHECK_THAT(validate.output, !Catch::Contains("caf"));  // read fine
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("defect 6: a FIFO is refused unread, a read stuck past decode_deadline_ms is abandoned, "
          "other streams flow and SIGTERM still stops the daemon",
          "[integration][defects]") {
  DaemonFixtureOptions options;
  options.server_extra = "decode_deadline_ms = 1500";
  options.env["RINGLOADER_FAILPOINTS"] = "action=hang;crash_on_path=class_02/img_000002.jpg";
  DaemonFixture daemon(options);
  REQUIRE(mkfifo((daemon.dataset_root() + "/class_01/pipe.jpg").c_str(), 0644) == 0);
  REQUIRE(daemon.Start());

  const auto start = std::chrono::steady_clock::now();
  std::vector<SampleLine> lines = ConsumeEpoch(daemon);
  // 120 images + the FIFO; the FIFO and the hung file are reported, everything else delivered.
  CHECK(lines.size() == 119);
  CHECK(std::chrono::steady_clock::now() - start < seconds(60));
  v1::GetStatsResponse stats = Stats(daemon.endpoint());
  CHECK(stats.decode_errors_by_reason().at("not_regular_file") == 1);
  CHECK(stats.decode_errors_by_reason().at("deadline_exceeded") == 1);
  // The read hung on the dataset's read lane, never on a decode thread; the lane judged it
  // poison (a probe of the storage answered meanwhile), not the storage stalled.
  CHECK(stats.decode_threads_abandoned() == 0);
  REQUIRE(stats.datasets_size() == 1);
  CHECK(stats.datasets(0).reads_stuck() == 1);
  CHECK(stats.datasets(0).storage_stalls() == 0);
  CHECK(LogHas(daemon, "class_01/pipe.jpg"));
  // The lane runs another thread in the stuck read's place: another epoch flows (and the hung
  // file is given up again, leaving a second read stuck).
  CHECK(ConsumeEpoch(daemon, "synth", {"--seed", "1"}).size() == 119);

  const auto stopping = std::chrono::steady_clock::now();
  CHECK(daemon.Stop() == 0);
  CHECK(std::chrono::steady_clock::now() - stopping < seconds(10));
}

TEST_CASE("defect 7: symlinked class folders and image files are followed like torchvision",
          "[integration][defects]") {
  DaemonFixture daemon;
  TempDir elsewhere;
  image::SyntheticDatasetOptions extra;
  extra.out_dir = elsewhere.path();
  extra.count = 6;
  extra.classes = 1;
  extra.seed = 11;
  REQUIRE(image::WriteSyntheticDataset(extra).ok());
  // "class_05" is a symlink to a folder outside the root; "class_00/linked.jpg" a file symlink.
  fs::create_directory_symlink(elsewhere.Join("class_00"), daemon.dataset_root() + "/class_05");
  fs::create_symlink(daemon.dataset_root() + "/class_01/img_000001.jpg",
                     daemon.dataset_root() + "/class_00/linked.jpg");
  REQUIRE(daemon.Start());
  std::vector<SampleLine> lines = ConsumeEpoch(daemon);
  CHECK(lines.size() == 120 + 6 + 1);
  int in_linked_class = 0;
  for (const SampleLine& l : lines) {
    if (l.path.rfind("class_05/", 0) == 0) {
      ++in_linked_class;
      CHECK(l.label == 4);  // the fifth class in sorted order (class_00..03, then class_05)
    }
    if (l.path == "class_00/linked.jpg") CHECK(l.label == 0);
  }
  CHECK(in_linked_class == 6);
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("defect 8: resuming after the dataset changed is refused, or restarts the epoch on "
          "request",
          "[integration][defects]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  const std::string state = daemon.dir() + "/state.txt";
  const std::vector<std::string> run = {"consume", "--dataset", "synth", "--batch-size", "8",
                                        "--image-size", "32", "--state", state};
  std::vector<std::string> first = run;
  first.insert(first.end(), {"--max-batches", "3"});
  REQUIRE(daemon.Ctl(first).exit_code == 0);
  CHECK_THAT(ReadFile(state), Catch::Contains("fingerprint="));
  CHECK(daemon.Stop() == 0);

  image::SyntheticDatasetOptions more;
  more.out_dir = daemon.dir() + "/extra";
  more.count = 40;
  more.classes = 4;
  more.seed = 99;
  REQUIRE(image::WriteSyntheticDataset(more).ok());
  for (int c = 0; c < 4; ++c) {
    const std::string cls = "class_0" + std::to_string(c);
    for (const auto& e : fs::directory_iterator(more.out_dir + "/" + cls)) {
      fs::copy_file(e.path(), daemon.dataset_root() + "/" + cls + "/new_" +
                                  e.path().filename().string());
    }
  }
  REQUIRE(daemon.Start());
  CommandResult refused = daemon.Ctl(run);
  INFO(refused.output);
  CHECK(refused.exit_code == 1);
  CHECK_THAT(refused.output, Catch::Contains("dataset \"synth\" changed since the position"));

  std::vector<std::string> restart = run;
  restart.push_back("--restart-epoch-if-changed");
  CommandResult restarted = daemon.Ctl(restart);
  INFO(restarted.output);
  CHECK(restarted.exit_code == 0);
  CHECK_THAT(restarted.output, Catch::Contains("consumed 160 samples"));
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("defect 9: validate --config --dataset uses exactly the daemon's limits, with one set of "
          "defaults",
          "[integration][defects]") {
  DaemonFixtureOptions options;
  options.config_extra = "";
  DaemonFixture daemon(options);
  // The fixture's dataset has max_pixels = 20000000; lower it so some synthetic images exceed it.
  std::string config = ReadFile(daemon.config_path());
  config = Replace(config, "max_pixels = 20000000", "max_pixels = 4000");
  WriteFile(daemon.config_path(), config);
  CommandResult with_config =
      daemon.Ctl({"validate", "--config", daemon.config_path(), "--dataset", "synth"});
  INFO(with_config.output);
  CHECK(with_config.exit_code == 1);
  CHECK_THAT(with_config.output, Catch::Contains("too_large") &&
                                     Catch::Contains("above max_pixels 4000"));
  CommandResult defaults = daemon.Ctl({"validate", "--path", daemon.dataset_root()});
  CHECK(defaults.exit_code == 0);
  CommandResult help = daemon.Ctl({"validate", "--help"});
  CHECK_THAT(help.output, Catch::Contains("40000000"));
  CommandResult unknown =
      daemon.Ctl({"validate", "--config", daemon.config_path(), "--dataset", "nope"});
  CHECK(unknown.exit_code == 2);
  CHECK_THAT(unknown.output, Catch::Contains("no dataset \"nope\" (configured: synth)"));
}

// ---------------------------------------------------------------------------------------------
// Memory and shared memory

TEST_CASE("defect 10: 128 decode threads start and serve under the default memory_limit, and "
          "reserved memory stays near the real peak",
          "[integration][defects]") {
  DaemonFixtureOptions options;
  options.decode_threads = 128;
  options.memory_limit = "4GiB";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  CHECK(ConsumeEpoch(daemon).size() == 120);
  v1::GetStatsResponse stats = Stats(daemon.endpoint());
  INFO("reserved peak " << stats.memory_reserved_peak_bytes() << ", rss peak "
                        << stats.rss_peak_bytes());
  CHECK(stats.memory_reserved_peak_bytes() > 0);
  CHECK(stats.rss_peak_bytes() > 0);
  CHECK(stats.memory_reserved_peak_bytes() < 4 * stats.rss_peak_bytes());
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("defect 11: a shm_dir other than /dev/shm works, and a ring the client cannot map is "
          "reported at once and closed",
          "[integration][defects]") {
  TempDir shm;
  DaemonFixtureOptions options;
  options.server_extra = "shm_dir = \"" + shm.path() + "\"";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  CHECK(ConsumeEpoch(daemon).size() == 120);

  if (!HaveUnshare()) RINGLOADER_SKIP("needs root and unshare --mount to hide shm_dir from a client");
  // A trainer that does not see the daemon's shm_dir (a container without the mount).
  const auto start = std::chrono::steady_clock::now();
  CommandResult hidden = RunCommand(
      {"/usr/bin/unshare", "--mount", "/bin/sh", "-c",
       "mount -t tmpfs none '" + shm.path() + "' && exec '" + CtlPath() + "' --endpoint '" +
           daemon.endpoint() + "' consume --dataset synth --batch-size 8 --image-size 32"});
  INFO(hidden.output);
  CHECK(hidden.exit_code == 1);
  CHECK_THAT(hidden.output, Catch::Contains("cannot map the stream's ring " + shm.path()) &&
                                Catch::Contains("must see the daemon's shm_dir"));
  CHECK(std::chrono::steady_clock::now() - start < seconds(10));
  CHECK(WaitFor([&] { return Stats(daemon.endpoint()).streams_open() == 0; }, seconds(5)));
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("defect 12: a killed trainer's stream is closed at once, so its restart is served "
          "within seconds under a tight max_streams",
          "[integration][defects]") {
  DaemonFixtureOptions options;
  options.images = 400;
  options.server_extra = "max_streams = 1\nstream_idle_timeout_ms = 600000";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const std::string state = daemon.dir() + "/state.txt";
  const std::vector<std::string> run = {daemon.endpoint(), "consume", "--dataset", "synth",
                                        "--batch-size", "4", "--image-size", "32", "--state",
                                        state, "--epochs", "3"};
  for (int signal : {SIGKILL, SIGTERM, SIGINT}) {
    INFO("signal " << signal);
    std::vector<std::string> argv = {CtlPath(), "--endpoint"};
    argv.insert(argv.end(), run.begin(), run.end());
    Subprocess trainer(argv, {}, daemon.dir() + "/trainer.log");
    REQUIRE(WaitFor([&] { return Stats(daemon.endpoint()).streams_open() == 1; }, seconds(30)));
    trainer.Kill(signal);
    trainer.Wait(seconds(10));
    const auto killed = std::chrono::steady_clock::now();
    REQUIRE(WaitFor([&] { return Stats(daemon.endpoint()).streams_open() == 0; }, seconds(10)));
    CHECK(std::chrono::steady_clock::now() - killed < seconds(5));
  }
  // The restarted trainer gets its stream back (max_streams = 1) and finishes the run.
  std::vector<std::string> rest(run.begin() + 1, run.end());
  CommandResult finished = daemon.Ctl(rest);
  INFO(finished.output);
  CHECK(finished.exit_code == 0);
  CHECK(daemon.Stop() == 0);
}

// ---------------------------------------------------------------------------------------------
// Clients that are not who they say

TEST_CASE("defect 13: another process cannot take a stream's batches without its token",
          "[integration][defects]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  client::Client owner(daemon.endpoint());
  client::StreamOptions so;
  so.dataset = "synth";
  so.batch_size = 8;
  so.image_size = 32;
  so.shuffle = false;
  so.end_epoch = 1;
  auto stream = owner.Open(so);
  REQUIRE(stream->Next().has_value());

  // The thief reads the stream's id and incarnation from stats, as anyone can.
  v1::GetStatsResponse stats = Stats(daemon.endpoint());
  REQUIRE(stats.streams_size() == 1);
  auto stub = v1::Loader::NewStub(*client::MakeChannel(*client::GrpcTarget(daemon.endpoint())));
  for (const std::string& token : {std::string(), std::string(16, 'x')}) {
    v1::NextBatchRequest steal;
    steal.set_stream_id(stats.streams(0).stream_id());
    steal.set_incarnation(stats.incarnation());
    steal.set_stream_token(token);
    grpc::ClientContext context;
    v1::NextBatchResponse response;
    grpc::Status s = stub->NextBatch(&context, steal, &response);
    CHECK(s.error_code() == grpc::StatusCode::PERMISSION_DENIED);
    CHECK_THAT(s.error_message(), Catch::Contains("wrong stream_token"));
    CHECK_FALSE(response.has_batch());
  }
  // The owner still gets every sample: 1 batch read + 14 more = 120 samples.
  uint64_t samples = 8;
  while (auto batch = stream->Next()) samples += batch->size();
  CHECK(samples == 120);
}

TEST_CASE("defect 14: control characters a client sends are escaped in the log",
          "[integration][defects]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  client::Client c(daemon.endpoint());
  client::StreamOptions so;
  so.dataset = "synth";
  so.batch_size = 8;
  so.image_size = 32;
  so.client_name = "evil\n2026-01-01 [error] forged\x1b[31m";
  auto stream = c.Open(so);
  REQUIRE(stream->Next().has_value());
  const std::string log = daemon.Log();
  CHECK_THAT(log, Catch::Contains("client=\"evil\\n2026-01-01 [error] forged\\x1b[31m\""));
  CHECK_THAT(log, !Catch::Contains("\n2026-01-01 [error] forged"));
  CHECK_THAT(log, !Catch::Contains("\x1b"));
  CommandResult stats = daemon.Ctl({"stats"});
  CHECK_THAT(stats.output, !Catch::Contains("\x1b"));
}

// ---------------------------------------------------------------------------------------------
// Smaller

TEST_CASE("defect 15: an out-of-range port and an unknown size unit are config errors",
          "[integration][defects]") {
  DaemonFixture daemon;
  CommandResult port =
      RunCommand({DaemonPath(), "--config", daemon.config_path(), "--listen", "127.0.0.1:99999"});
  CHECK(port.exit_code == 1);
  CHECK_THAT(port.output, Catch::Contains("--listen: port must be a number in [1, 65535]"));
  WriteFile(daemon.config_path(),
            Replace(ReadFile(daemon.config_path()), "memory_limit = \"1GiB\"",
                    "memory_limit = \"512Mb\""));
  CommandResult unit = RunCommand({DaemonPath(), "--config", daemon.config_path()});
  CHECK(unit.exit_code == 1);
  CHECK_THAT(unit.output, Catch::Contains("server.memory_limit: must be a size such as") &&
                              Catch::Contains("(got \"512Mb\")"));
}

TEST_CASE("defect 16: a request over a limit names the config key", "[integration][defects]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  CommandResult r = daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "5000"});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, Catch::Contains("batch_size: must be in [1, server.max_batch_size = 4096]"));
}

TEST_CASE("defect 17: a resumed consume may write the rest of the run into a new samples file",
          "[integration][defects]") {
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  const std::string state = daemon.dir() + "/state.txt";
  const std::string a = daemon.dir() + "/a.tsv", b = daemon.dir() + "/b.tsv";
  const std::vector<std::string> run = {"consume", "--dataset", "synth", "--batch-size", "8",
                                        "--image-size", "32", "--state", state};
  std::vector<std::string> first = run;
  first.insert(first.end(), {"--samples-out", a, "--max-batches", "5"});
  REQUIRE(daemon.Ctl(first).exit_code == 0);
  std::vector<std::string> second = run;
  second.insert(second.end(), {"--samples-out", b});
  CommandResult r = daemon.Ctl(second);
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  std::vector<SampleLine> lines = ReadSamplesOut(a);
  CHECK(lines.size() == 40);
  for (const SampleLine& l : ReadSamplesOut(b)) lines.push_back(l);
  std::set<uint64_t> indices;
  for (const SampleLine& l : lines) indices.insert(l.sample_index);
  CHECK(lines.size() == 120);
  CHECK(indices.size() == 120);
}

TEST_CASE("defect 18: a client without permission on the socket is told so, and which group may "
          "connect",
          "[integration][defects]") {
  if (!RunningAsRoot()) RINGLOADER_SKIP("needs root to run a client as another user");
  DaemonFixture daemon;
  REQUIRE(daemon.Start());
  // The temp dir must be traversable for the other user; the socket itself stays 0660.
  ::chmod(daemon.dir().c_str(), 0755);
  const std::vector<std::string> as_nobody = {"/usr/bin/setpriv", "--reuid=65534", "--regid=65534",
                                              "--clear-groups", CtlPath(), "--endpoint",
                                              daemon.endpoint()};
  std::vector<std::string> health = as_nobody;
  health.push_back("health");
  CommandResult h = RunCommand(health);
  INFO(h.output);
  CHECK(h.exit_code == 2);
  CHECK_THAT(h.output, Catch::Contains("permission denied connecting to") &&
                           Catch::Contains("only members of group 'root'"));
  std::vector<std::string> consume = as_nobody;
  consume.insert(consume.end(), {"consume", "--dataset", "synth", "--reconnect-deadline-s", "1"});
  CommandResult c = RunCommand(consume);
  INFO(c.output);
  CHECK(c.exit_code != 0);
  CHECK_THAT(c.output, Catch::Contains("permission denied connecting to"));
}

}  // namespace
}  // namespace ringloader::testing
