// SPDX-License-Identifier: Apache-2.0
// Issue 38: a mount that stops answering is an outage, not poison, and it stays in its lane.
// Through the real daemon reading a real FUSE mount (delayfs) that stops answering every
// request, as an NFS server that goes away: the mounted dataset's stream waits and loses
// nothing, the daemon says its storage is stalled, a local dataset's streams flow meanwhile, the
// stream goes on exactly when the mount answers, and SIGTERM during the outage is prompt (also
// while a reload or the start-up indexes the dead mount); a daemon started during the outage
// serves its other datasets; doctor and validate answer within their timeouts. A mount that
// fails every request with EIO (a soft NFS mount's outage) is waited out the same way. Skipped,
// saying why, where no FUSE mount can be made.
#include <signal.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "client/client.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/delay_mount.h"
#include "tests/integration/storage_data.h"

namespace ringloader::testing {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

v1::DatasetStats DatasetStatsOf(const std::string& endpoint, const std::string& name) {
  const v1::GetStatsResponse stats = Stats(endpoint);
  for (const v1::DatasetStats& d : stats.datasets()) {
    if (d.name() == name) return d;
  }
  FAIL("no dataset " << name << " in the stats");
  return {};
}

// SIGTERM stops the daemon cleanly within seconds, however many of its reads hang.
void StopsPromptly(DaemonFixture& daemon) {
  const auto stopping = std::chrono::steady_clock::now();
  CHECK(daemon.Stop() == 0);
  CHECK(std::chrono::steady_clock::now() - stopping < seconds(8));
}

int ThreadsOf(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

// A stream read to its end on a thread of its own: its lines, or the error that ended it.
// `unblock` runs before a join the test did not wait for (a failed REQUIRE with the mount
// stopped): the mount answers, so the stream ends and the test fails instead of hanging.
class Consumer {
 public:
  Consumer(std::function<std::vector<std::string>()> read, std::function<void()> unblock)
      : unblock_(std::move(unblock)),
        thread_([this, read = std::move(read)] {
          try {
            lines_ = read();
          } catch (const std::exception& e) {
            error_ = e.what();
          }
        }) {}
  ~Consumer() {
    if (!thread_.joinable()) return;
    unblock_();
    thread_.join();
  }
  // Waits for the stream's end: every line, in delivery order; error() says why it ended early.
  const std::vector<std::string>& Lines() {
    if (thread_.joinable()) thread_.join();
    return lines_;
  }
  const std::string& error() const { return error_; }

 private:
  std::vector<std::string> lines_;
  std::string error_;
  std::function<void()> unblock_;
  std::thread thread_;  // last: it starts once the rest is built
};

TEST_CASE("38.1: the whole mount not answering is an outage: its stream waits and loses "
          "nothing, the storage is said stalled, a local dataset flows meanwhile, the stream goes "
          "on exactly when it answers, and SIGTERM during the outage is prompt",
          "[integration][storage]") {
  if (!DelayMount::Unavailable().empty()) RINGLOADER_SKIP(DelayMount::Unavailable());
  TempDir data;
  WriteDataset(data.Join("images"), 120);
  DelayMount mount(data.Join("images"), data.path(), milliseconds(5));
  DaemonFixtureOptions options;
  options.images = 120;  // "synth": local
  // The outage below lasts several deadlines: a read that waits for it is not poison.
  options.server_extra = "decode_deadline_ms = 1000\nio_depth = 16";
  // "direct": the very files, not through the mount (the reference).
  options.config_extra =
      DatasetTable("mounted", mount.path()) + DatasetTable("direct", data.Join("images"));
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  client::Client c(daemon.endpoint());
  const std::vector<std::string> reference = Lines(*c.Open(Options("direct", 2)));
  REQUIRE(reference.size() == 240);

  // The mount stops answering after the stream's third batch.
  std::atomic<int> batches{0};
  Consumer consumer([&] {
    return Lines(*c.Open(Options("mounted", 2)), [&] {
      if (++batches == 3) mount.Stall();
    });
  }, [&] { mount.Answer(); });
  REQUIRE(mount.AwaitHeld(1, seconds(30)));
  CHECK(WaitFor([&] { return DatasetStatsOf(daemon.endpoint(), "mounted").storage_stalled(); },
                seconds(30)));
  // Its stall stays in its lane: a local dataset streams a whole epoch meanwhile.
  CHECK(Lines(*c.Open(Options("synth", 1))).size() == 120);
  const CommandResult stats = daemon.Ctl({"stats"});
  CHECK_THAT(stats.output, Catch::Contains("dataset mounted") &&
                               Catch::Contains("STORAGE STALLED"));
  // It lasts several deadlines; the daemon's threads do not grow meanwhile.
  REQUIRE(WaitFor(
      [&] { return DatasetStatsOf(daemon.endpoint(), "mounted").storage_stalled_ms() >= 3000; },
      seconds(60)));
  const int threads = ThreadsOf(daemon.ServingPid());
  REQUIRE(WaitFor(
      [&] { return DatasetStatsOf(daemon.endpoint(), "mounted").storage_stalled_ms() >= 5000; },
      seconds(60)));
  const int threads_later = ThreadsOf(daemon.ServingPid());
  INFO("threads " << threads << " then " << threads_later);
  // At most a few more probes of the storage (ReadPool::kMaxProbes), not a thread per deadline.
  CHECK(threads_later <= threads + 4);
  CHECK(threads_later < 150);  // 2 decode + 3 lanes x 16 reads + gRPC's
  CHECK(batches.load() < 30);  // it did wait (30 batches is the whole run)

  mount.Answer();
  CHECK(consumer.Lines() == reference);  // every sample, once, byte for byte: nothing skipped
  CHECK(consumer.error() == "");
  const v1::GetStatsResponse after = Stats(daemon.endpoint());
  CHECK(after.decode_errors() == 0);
  CHECK(after.quarantines() == 0);
  CHECK(after.decode_threads_abandoned() == 0);
  const v1::DatasetStats mounted = DatasetStatsOf(daemon.endpoint(), "mounted");
  CHECK_FALSE(mounted.storage_stalled());
  CHECK(mounted.storage_stalls() == 1);
  CHECK(mounted.reads_stuck() == 0);
  CHECK(DatasetStatsOf(daemon.endpoint(), "synth").storage_stalls() == 0);
  const std::string log = daemon.Log();
  CHECK_THAT(log, Catch::Contains("dataset mounted: storage stalled") &&
                      Catch::Contains("dataset mounted: storage answers again after"));
  CHECK_THAT(log, !Catch::Contains("strike"));

  // SIGTERM while the mount is gone again, with a stream's reads waiting on it: prompt.
  mount.Stall();
  std::unique_ptr<client::Stream> waiting = c.Open(Options("mounted", 1));
  REQUIRE(mount.AwaitHeld(1, seconds(30)));
  StopsPromptly(daemon);
  mount.Answer();
}

// A soft NFS mount whose server is gone does not hang: it fails every request with EIO. Each
// read's retries (io_retry_ms) would run out and its sample be skipped as io_error: the outage
// is the storage's, so it is waited out the same way, and the stream goes on exactly.
TEST_CASE("38.1: a mount that fails every request with EIO (a soft mount's outage) is an outage "
          "too: the stream waits past io_retry_ms and its deadlines, skips and strikes nothing, "
          "and goes on exactly",
          "[integration][storage]") {
  if (!DelayMount::Unavailable().empty()) RINGLOADER_SKIP(DelayMount::Unavailable());
  // WebDataset: its shards stay open, so only a fresh open of one asks the storage (the probe).
  const std::string format = GENERATE(as<std::string>(), "imagefolder", "webdataset");
  CAPTURE(format);
  TempDir data;
  WriteDataset(data.Join("images"), 120);
  std::string source = data.Join("images");
  if (format == "webdataset") {
    source = data.Join("shards");
    const CommandResult converted =
        RunCommand({CtlPath(), "convert", "--from", "imagefolder", "--to", "webdataset", "--path",
                    data.Join("images"), "--out", source, "--shard-size", "16"});
    INFO(converted.output);
    REQUIRE(converted.exit_code == 0);
  }
  DelayMount mount(source, data.path(), milliseconds(5), "", /*stall_with_eio=*/true);
  DaemonFixtureOptions options;
  options.images = 8;
  options.server_extra = "decode_deadline_ms = 1000\nio_retry_ms = 300\nio_depth = 16";
  const auto table = [&](const std::string& name, const std::string& path) {
    return format == "webdataset"
               ? "[[datasets]]\nname = \"" + name + "\"\nformat = \"webdataset\"\npath = \"" +
                     path + "\"\n"
               : DatasetTable(name, path);
  };
  options.config_extra = table("mounted", mount.path()) + table("direct", source);
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  client::Client c(daemon.endpoint());
  const std::vector<std::string> reference = Lines(*c.Open(Options("direct", 2)));
  REQUIRE(reference.size() == 240);

  std::atomic<int> batches{0};
  Consumer consumer([&] {
    return Lines(*c.Open(Options("mounted", 2)), [&] {
      if (++batches == 3) mount.Stall();
    });
  }, [&] { mount.Answer(); });
  REQUIRE(mount.AwaitHeld(1, seconds(30)));  // reads met EIO
  CHECK(WaitFor([&] { return DatasetStatsOf(daemon.endpoint(), "mounted").storage_stalled(); },
                seconds(30)));
  // Ten times io_retry_ms and three deadlines of EIO.
  std::this_thread::sleep_for(seconds(3));
  const int batches_during = batches.load();
  CHECK(batches_during < 30);
  CHECK(DatasetStatsOf(daemon.endpoint(), "mounted").storage_stalled());
  mount.Answer();
  CHECK(consumer.Lines() == reference);
  CHECK(consumer.error() == "");
  const v1::GetStatsResponse after = Stats(daemon.endpoint());
  INFO(daemon.Ctl({"stats"}).output);
  CHECK(after.decode_errors() == 0);
  CHECK(after.quarantines() == 0);
  const v1::DatasetStats mounted = DatasetStatsOf(daemon.endpoint(), "mounted");
  CHECK_FALSE(mounted.storage_stalled());
  CHECK(mounted.storage_stalls() >= 1);
  const std::string log = daemon.Log();
  CHECK_THAT(log, Catch::Contains("dataset mounted: storage stalled") &&
                      Catch::Contains("dataset mounted: storage answers again after"));
  CHECK_THAT(log, !Catch::Contains("strike") && !Catch::Contains("io_error"));
}

// With memory too short to hold a file's bytes ahead, the lane opens the file and the decode
// thread reads its bytes: an outage that begins there meets the decode deadline. The sample is
// then read again through its lane (where the outage is waited out), not struck and skipped.
// Forced: every read of file data comes from a decode thread here (an open reads nothing), and
// delayfs stops answering by itself in the middle of one (--stop-after-reads).
TEST_CASE("38.1: with memory too short to read ahead, an outage that begins in a decode thread's "
          "read is waited out on the lane: nothing skipped or struck, the same bytes",
          "[integration][storage]") {
  if (!DelayMount::Unavailable().empty()) RINGLOADER_SKIP(DelayMount::Unavailable());
  TempDir data;
  constexpr uint32_t kImages = 32;
  WriteDataset(data.Join("images"), kImages);
  // 9 MiB after each JPEG's end (decoders stop at its end marker): read-ahead may hold at most
  // half of memory_limit (16 MiB, the least there is), so no file's bytes are ever read ahead.
  const std::string padding(9u << 20, '\0');
  for (const auto& e : std::filesystem::recursive_directory_iterator(data.Join("images"))) {
    if (e.is_regular_file()) std::ofstream(e.path(), std::ios::app | std::ios::binary) << padding;
  }
  // About 72 reads of file data a file (128 KiB each): the mount stops in the 14th file or so.
  DelayMount mount(data.Join("images"), data.path(), milliseconds(1), "", false,
                   /*stall_after_reads=*/1000);
  DaemonFixtureOptions options;
  options.images = 8;
  options.memory_limit = "16MiB";
  options.server_extra = "decode_deadline_ms = 1000\nio_depth = 4";
  options.config_extra =
      DatasetTable("mounted", mount.path()) + DatasetTable("direct", data.Join("images"));
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  client::Client c(daemon.endpoint());
  client::StreamOptions direct = Options("direct", 1);
  direct.ring_slots = 2;
  const std::vector<std::string> reference = Lines(*c.Open(direct));
  REQUIRE(reference.size() == kImages);

  Consumer consumer([&] {
    client::StreamOptions o = Options("mounted", 1);
    o.ring_slots = 2;
    return Lines(*c.Open(o));
  }, [&] { mount.Answer(); });
  REQUIRE(mount.AwaitHeld(1, seconds(60)));
  // A decode thread met the outage past its deadline, and the storage is said stalled.
  CHECK(WaitFor([&] { return Stats(daemon.endpoint()).decode_threads_abandoned() >= 1; },
                seconds(30)));
  CHECK(WaitFor(
      [&] { return DatasetStatsOf(daemon.endpoint(), "mounted").storage_stalled_ms() >= 3000; },
      seconds(30)));
  mount.Answer();
  CHECK(consumer.Lines() == reference);
  CHECK(consumer.error() == "");
  const v1::GetStatsResponse after = Stats(daemon.endpoint());
  INFO(daemon.Ctl({"stats"}).output);
  CHECK(after.decode_errors() == 0);
  CHECK(after.quarantines() == 0);
  // Read ahead, none (above half of memory_limit); read again on the lane, waiting for memory.
  CHECK(after.read_ahead_peak_bytes() > (8u << 20));
  const std::string log = daemon.Log();
  CHECK_THAT(log, !Catch::Contains("strike") && !Catch::Contains("abandoned past"));
}

// One line per sample of an arrays dataset: epoch, index, label and a digest of its rows.
std::vector<std::string> ArrayLines(client::Stream& stream, const std::function<void()>& each) {
  std::vector<std::string> lines;
  while (std::optional<client::Batch> b = stream.Next()) {
    for (uint32_t i = 0; i < b->size(); ++i) {
      std::string line = std::to_string(b->position().epoch) + " " +
                         std::to_string(b->indices().data<int64_t>()[i]) + " " +
                         std::to_string(b->labels().data<int64_t>()[i]);
      for (const client::TensorView& t : b->tensors()) {
        if (t.name() == "labels" || t.name() == "indices") continue;
        const size_t row = t.bytes() / b->size();
        line += " " + std::to_string(std::hash<std::string_view>{}(std::string_view(
                          reinterpret_cast<const char*>(t.data<uint8_t>()) + i * row, row)));
      }
      lines.push_back(std::move(line));
    }
    if (each) each();
  }
  return lines;
}

// A sample's label and tensors are read before its commit, with its image: on the lane when
// read ahead, where an outage is waited out. Before, they were read after the commit on a decode
// thread, where no deadline reaches: an outage there stopped the watchdog's pings, the daemon was
// killed and restarted, and the sample struck (twice: quarantined). An arrays dataset's rows are
// all its bytes; rows of 192 KiB keep the kernel from having read the next ones already.
TEST_CASE("38.1: an outage while an arrays dataset's rows are read is waited out on the lane: "
          "no restart, nothing struck or skipped, the same bytes",
          "[integration][storage]") {
  if (!DelayMount::Unavailable().empty()) RINGLOADER_SKIP(DelayMount::Unavailable());
  TempDir data;
  constexpr uint32_t kSamples = 48;
  const CommandResult made = RunCommand(
      {CtlPath(), "make-dataset", "--out", data.Join("arrays"), "--count",
       std::to_string(kSamples), "--classes", "4", "--seed", "11", "--format", "arrays",
       "--image-size", "256"});
  INFO(made.output);
  REQUIRE(made.exit_code == 0);
  DelayMount mount(data.Join("arrays"), data.path(), milliseconds(5));
  DaemonFixtureOptions options;
  options.images = 8;
  options.supervise = true;
  options.server_extra = "decode_deadline_ms = 1000\nwatchdog_ms = 1500\nio_depth = 4";
  const auto table = [](const std::string& name, const std::string& path) {
    return "[[datasets]]\nname = \"" + name + "\"\nformat = \"arrays\"\npath = \"" + path +
           "\"\nlabel = \"labels\"\n";
  };
  options.config_extra = table("mounted", mount.path()) + table("direct", data.Join("arrays"));
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const pid_t serving = daemon.ServingPid();
  client::Client c(daemon.endpoint());
  const std::vector<std::string> reference = ArrayLines(*c.Open(Options("direct", 2)), {});
  REQUIRE(reference.size() == 2 * kSamples);

  std::atomic<int> batches{0};
  Consumer consumer([&] {
    return ArrayLines(*c.Open(Options("mounted", 2)), [&] {
      if (++batches == 2) mount.Stall();
    });
  }, [&] { mount.Answer(); });
  REQUIRE(mount.AwaitHeld(1, seconds(30)));
  // Four deadlines and more than two watchdog intervals.
  CHECK(WaitFor(
      [&] { return DatasetStatsOf(daemon.endpoint(), "mounted").storage_stalled_ms() >= 4000; },
      seconds(30)));
  mount.Answer();
  CHECK(consumer.Lines() == reference);
  CHECK(consumer.error() == "");
  const v1::GetStatsResponse after = Stats(daemon.endpoint());
  INFO(daemon.Ctl({"stats"}).output);
  CHECK(daemon.ServingPid() == serving);
  CHECK(after.daemon_restarts() == 0);
  CHECK(after.decode_errors() == 0);
  CHECK(after.quarantines() == 0);
  const std::string log = daemon.Log();
  CHECK_THAT(log, Catch::Contains("dataset mounted: storage stalled") &&
                      !Catch::Contains("strike"));
}

TEST_CASE("38.1: doctor says a daemon that does not answer and a dataset whose mount does not "
          "answer, within its timeouts, and validate gives a hung file up at --deadline-ms",
          "[integration][storage][doctor]") {
  if (!DelayMount::Unavailable().empty()) RINGLOADER_SKIP(DelayMount::Unavailable());
  TempDir data;
  WriteDataset(data.Join("images"), 40);
  DelayMount mount(data.Join("images"), data.path(), milliseconds(5), "class_01/img_000005.jpg");

  // validate: the hung file is BAD once the storage answered other reads past its deadline.
  const auto validating = std::chrono::steady_clock::now();
  const CommandResult validated = RunCommand(
      {CtlPath(), "validate", "--path", mount.path(), "--jobs", "2", "--deadline-ms", "1000"});
  INFO(validated.output);
  CHECK(validated.exit_code == 1);
  CHECK_THAT(validated.output,
             Catch::Contains("BAD class_01/img_000005.jpg: deadline_exceeded") &&
                 Catch::Contains("checked 40 files: 39 good, 1 bad"));
  CHECK(std::chrono::steady_clock::now() - validating < seconds(30));

  DaemonFixtureOptions options;
  options.images = 8;
  options.config_extra = DatasetTable("mounted", mount.path());
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  // The mount answers nothing: the dataset's check says so after its timeout; the rest go on.
  mount.Stall();
  auto started = std::chrono::steady_clock::now();
  const CommandResult stalled = RunCommand({CtlPath(), "doctor", "--config",
                                            daemon.config_path(), "--dataset-timeout-s", "2"});
  INFO(stalled.output);
  CHECK(stalled.exit_code == 1);
  CHECK_THAT(stalled.output,
             Catch::Contains("problem: dataset mounted (imagefolder " + mount.path() +
                             "): indexing did not finish in 2 s") &&
                 Catch::Contains("ok: dataset synth") && Catch::Contains("ok: daemon: "));
  CHECK(std::chrono::steady_clock::now() - started < seconds(20));
  mount.Answer();

  // A daemon that does not answer (stopped) is a problem, not "all checks passed".
  const pid_t pid = daemon.ServingPid();
  REQUIRE(kill(pid, SIGSTOP) == 0);
  started = std::chrono::steady_clock::now();
  const CommandResult stopped = RunCommand(
      {CtlPath(), "doctor", "--config", daemon.config_path(), "--daemon-timeout-s", "2"});
  REQUIRE(kill(pid, SIGCONT) == 0);
  INFO(stopped.output);
  CHECK(stopped.exit_code == 1);
  CHECK_THAT(stopped.output,
             Catch::Contains("problem: daemon: ringloaderd pid " + std::to_string(pid) +
                             " listens on ") &&
                 Catch::Contains("but does not answer in 2 s"));
  CHECK_THAT(stopped.output, !Catch::Contains("all checks passed"));
  CHECK(std::chrono::steady_clock::now() - started < seconds(30));
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("38.1: SIGTERM while a reload or the start-up indexes a dataset on a mount that does "
          "not answer stops the daemon within seconds",
          "[integration][storage]") {
  if (!DelayMount::Unavailable().empty()) RINGLOADER_SKIP(DelayMount::Unavailable());
  TempDir data;
  WriteDataset(data.Join("images"), 20);
  {
    DelayMount mount(data.Join("images"), data.path(), milliseconds(5));
    DaemonFixtureOptions options;
    options.images = 8;
    DaemonFixture daemon(options);
    REQUIRE(daemon.Start());
    mount.Stall();
    {
      std::ofstream config(daemon.config_path(), std::ios::app);
      config << "\n" << DatasetTable("mounted", mount.path());
    }
    REQUIRE(kill(daemon.ServingPid(), SIGHUP) == 0);
    REQUIRE(mount.AwaitHeld(1, seconds(30)));  // the reload's walk waits on the mount
    // The daemon still answers meanwhile.
    CHECK(daemon.Ctl({"health"}).exit_code == 0);
    StopsPromptly(daemon);
    CHECK_THAT(daemon.Log(), Catch::Contains("shutting down without waiting for it"));
    mount.Answer();
  }
  {
    DelayMount mount(data.Join("images"), data.path(), milliseconds(5));
    mount.Stall();
    DaemonFixtureOptions options;
    options.images = 8;
    options.config_extra = DatasetTable("mounted", mount.path());
    DaemonFixture daemon(options);
    daemon.Launch();
    REQUIRE(mount.AwaitHeld(1, seconds(30)));  // the start-up walk waits on the mount
    StopsPromptly(daemon);
    mount.Answer();
  }
}

TEST_CASE("38.1: a daemon started while one dataset's mount does not answer serves the others, "
          "and that dataset once the mount answers",
          "[integration][storage]") {
  if (!DelayMount::Unavailable().empty()) RINGLOADER_SKIP(DelayMount::Unavailable());
  TempDir data;
  WriteDataset(data.Join("images"), 20);
  DelayMount mount(data.Join("images"), data.path(), milliseconds(5));
  mount.Stall();
  DaemonFixtureOptions options;
  options.images = 8;
  options.config_extra = DatasetTable("mounted", mount.path());
  DaemonFixture daemon(options);
  daemon.Launch();
  REQUIRE(mount.AwaitHeld(1, seconds(30)));  // its index waits on the mount
  REQUIRE(WaitFor([&] { return daemon.Ctl({"health"}).exit_code == 0; }, seconds(60)));
  client::Client c(daemon.endpoint());
  CHECK(Lines(*c.Open(Options("synth", 1))).size() == 8);
  client::StreamOptions not_yet = Options("mounted", 1);
  not_yet.reconnect_deadline = seconds(1);
  CHECK_THROWS_WITH(c.Open(not_yet), Catch::Contains("still being indexed"));
  CHECK_THAT(daemon.Log(), Catch::Contains("serving without dataset mounted"));
  mount.Answer();
  REQUIRE(WaitFor(
      [&] {
        return daemon.Log().find("dataset mounted: indexed after the daemon started serving") !=
               std::string::npos;
      },
      seconds(30)));
  CHECK(Lines(*c.Open(Options("mounted", 1))).size() == 20);
  CHECK(daemon.Stop() == 0);
}

}  // namespace
}  // namespace ringloader::testing
