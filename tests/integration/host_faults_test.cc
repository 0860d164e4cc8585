// SPDX-License-Identifier: Apache-2.0
// Issue 15: running on real hosts. Item 3: an OOM kill is a crash like any other. Item 4:
// memory_limit is a promise. Item 5: a transient I/O error is not bad data. Item 6: health answers before the index is built. Item 7:
// state files survive any name and any crash.
#include <catch2/catch.hpp>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "server/image/synthetic.h"
#include "server/pipeline/index_cache.h"
#include "tests/support/libjpeg_encode.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/memory_cgroup.h"

namespace ringloader::testing {
namespace {

namespace fs = std::filesystem;

TEST_CASE("15.7: a damaged quarantine file and an index cache that cannot be written never stop "
          "the daemon, and both are logged with the path and why",
          "[integration][state]") {
  DaemonFixtureOptions options;
  options.images = 30;
  DaemonFixture daemon(options);
  fs::create_directories(daemon.state_dir());
  WriteFile(daemon.state_dir() + "/quarantine.tsv", "synth\tnot-a-number\n");
  // Old enough for the cache to be written; then a directory stands where the file would go.
  const auto old = fs::file_time_type::clock::now() - std::chrono::hours(1);
  for (const auto& e : fs::recursive_directory_iterator(daemon.dataset_root())) {
    fs::last_write_time(e, old);
  }
  fs::last_write_time(daemon.dataset_root(), old);
  const std::string cache =
      pipeline::IndexCachePath(daemon.state_dir(), "imagefolder", daemon.dataset_root());
  fs::create_directories(cache);

  const bool started = daemon.Start();
  const std::string log = daemon.Log();
  INFO(log);
  REQUIRE(started);
  CHECK_THAT(log, Catch::Contains("quarantine.tsv:1: expected dataset<TAB>index") &&
                      Catch::Contains("moved to " + daemon.state_dir() + "/quarantine.tsv.damaged"));
  CHECK_THAT(log, Catch::Contains(cache + ": cannot write") && Catch::Contains("Is a directory"));
  CHECK(fs::exists(daemon.state_dir() + "/quarantine.tsv.damaged"));
  const CommandResult r = daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "8",
                                      "--epochs", "1", "--image-size", "32"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("consumed 30 samples"));
}

TEST_CASE("15.7: a file whose name holds a newline and crashes the decoder is quarantined, and "
          "every later start reads the quarantine back",
          "[integration][state][poison]") {
  DaemonFixtureOptions options;
  options.images = 40;
  options.supervise = true;
  // TOML's "\n" is a newline: the failpoint matches the file's real name.
  options.config_extra = "[failpoints]\naction = \"segfault\"\ncrash_on_path = \"*new\\nline*\"\n";
  DaemonFixture daemon(options);
  const std::string poison = "class_01/new\nline.jpg";
  fs::copy_file(daemon.dataset_root() + "/class_01/img_000001.jpg",
                daemon.dataset_root() + "/" + poison);
  REQUIRE(daemon.Start());
  const std::string out = daemon.dir() + "/poison.tsv";
  const CommandResult r = daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "8",
                                      "--epochs", "1", "--image-size", "32", "--samples-out",
                                      out});
  INFO(r.output);
  INFO(daemon.Log());
  REQUIRE(r.exit_code == 0);
  std::set<std::string> paths;
  for (const SampleLine& l : ReadSamplesOut(out)) CHECK(paths.insert(l.path).second);
  CHECK(paths.size() == 40);  // all but the poison sample
  CHECK(paths.count("class_01/new\\nline.jpg") == 0);
  CHECK_THAT(daemon.Ctl({"quarantine", "list"}).output, Catch::Contains("new\\nline.jpg"));
  // A restart reads the quarantine file back (the name is stored escaped, one line).
  daemon.Stop();
  REQUIRE(daemon.Start());
  CHECK_THAT(daemon.Ctl({"quarantine", "list"}).output, Catch::Contains("new\\nline.jpg"));
  CHECK(daemon.Log().find("quarantine.tsv.damaged") == std::string::npos);
}

TEST_CASE("15.6: health answers NOT_SERVING while the datasets are indexed, stats show the "
          "progress, and a trainer that opens meanwhile waits instead of failing",
          "[integration][startup]") {
  DaemonFixtureOptions options;
  options.images = 24;
  // A slow mount: indexing the dataset takes 4 s.
  options.config_extra = "[failpoints]\nindex_delay_ms = 4000\n";
  DaemonFixture daemon(options);
  const auto launched = std::chrono::steady_clock::now();
  daemon.Launch();
  CommandResult health{2, ""};
  REQUIRE(WaitFor(
      [&] {
        health = daemon.Ctl({"health", "--timeout", "1"});
        return health.exit_code != 2;  // 2 = nothing answers
      },
      std::chrono::seconds(10)));
  const auto answered = std::chrono::steady_clock::now() - launched;
  INFO(health.output);
  CHECK(health.exit_code == 1);  // answering, not serving yet
  CHECK_THAT(health.output, Catch::Contains("NOT_SERVING"));
  CHECK(answered < std::chrono::milliseconds(3500));  // long before the index is done
  const CommandResult stats = daemon.Ctl({"stats"});
  CHECK_THAT(stats.output, Catch::Contains("starting") && Catch::Contains("indexing"));

  // A trainer started now waits for the index within its deadline, then reads its epoch.
  const CommandResult r = daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "8",
                                      "--epochs", "1", "--image-size", "32"});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, Catch::Contains("consumed 24 samples"));
  CHECK(daemon.Ctl({"health"}).exit_code == 0);
  CHECK_THAT(daemon.Log(), Catch::Contains("listening on") && Catch::Contains("serving on"));
}

TEST_CASE("15.6: SIGTERM during a long start-up index stops the daemon promptly and cleanly",
          "[integration][startup]") {
  DaemonFixtureOptions options;
  options.images = 4;
  options.config_extra = "[failpoints]\nindex_delay_ms = 60000\n";
  DaemonFixture daemon(options);
  daemon.Launch();
  REQUIRE(WaitFor([&] { return daemon.Ctl({"health", "--timeout", "1"}).exit_code == 1; },
                  std::chrono::seconds(10)));
  const auto stop = std::chrono::steady_clock::now();
  CHECK(daemon.Stop() == 0);
  CHECK(std::chrono::steady_clock::now() - stop < std::chrono::seconds(10));
  CHECK_THAT(daemon.Log(), Catch::Contains("stopping start-up indexing") &&
                               !Catch::Contains("start-up failed"));
}

TEST_CASE("15.6: a dataset that fails to index in the background still fails the start, naming "
          "it", "[integration][startup]") {
  DaemonFixtureOptions options;
  options.images = 4;
  DaemonFixture daemon(options);
  // An existing folder without images: only the walk, in the background, can tell.
  fs::create_directories(daemon.dir() + "/empty");
  WriteFile(daemon.config_path(), ReadFile(daemon.config_path()) +
                                      "[[datasets]]\nname = \"empty\"\nformat = "
                                      "\"imagefolder\"\npath = \"" +
                                      daemon.dir() + "/empty\"\n");
  daemon.Launch();
  const int code = daemon.process().WaitExitCode(std::chrono::seconds(30));
  CHECK(code == 1);
  CHECK_THAT(daemon.Log(), Catch::Contains("start-up failed") && Catch::Contains("datasets[1]"));
}

std::vector<SampleLine> ConsumeEval(const DaemonFixture& daemon, const std::string& name) {
  const std::string out = daemon.dir() + "/" + name + ".tsv";
  const CommandResult r = daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "8",
                                      "--epochs", "1", "--image-size", "32", "--augment", "eval",
                                      "--samples-out", out});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  return ReadSamplesOut(out);
}

bool SameLines(const std::vector<SampleLine>& a, const std::vector<SampleLine>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].sample_index != b[i].sample_index || a[i].path != b[i].path ||
        a[i].digest != b[i].digest || a[i].sequence != b[i].sequence) {
      return false;
    }
  }
  return true;
}

TEST_CASE("15.5: reads that fail with EIO, EMFILE or ENOMEM and then succeed cost nothing: the "
          "epoch is byte-identical to an undisturbed one",
          "[integration][io]") {
  DaemonFixtureOptions options;
  options.images = 40;  // 4 classes of 10
  std::vector<SampleLine> reference;
  {
    DaemonFixture daemon(options);
    REQUIRE(daemon.Start());
    reference = ConsumeEval(daemon, "reference");
    REQUIRE(reference.size() == 40);
  }
  for (const auto& [err, times] : std::vector<std::pair<std::string, int>>{
           {"EIO", 2}, {"EMFILE", 2}, {"ENOMEM", 1}}) {
    INFO(err << " x" << times);
    DaemonFixtureOptions faulty = options;
    faulty.config_extra = "[failpoints]\nio_fault_path = \"*/class_01/*\"\nio_fault_errno = \"" +
                          err + "\"\nio_fault_times = " + std::to_string(times) + "\n";
    DaemonFixture daemon(faulty);
    REQUIRE(daemon.Start());
    const std::vector<SampleLine> lines = ConsumeEval(daemon, "faulty");
    CHECK(lines.size() == 40);
    CHECK(SameLines(lines, reference));
    const CommandResult stats = daemon.Ctl({"stats", "--json"});
    CHECK(stats.output.find("io_error") == std::string::npos);
    CHECK(stats.output.find("read_error") == std::string::npos);
  }
}

TEST_CASE("15.5: an I/O error that outlasts io_retry_ms fails its samples as io_error, counted "
          "apart from bad data, and the rest of the epoch is delivered",
          "[integration][io]") {
  DaemonFixtureOptions options;
  options.images = 40;
  options.server_extra = "io_retry_ms = 300";
  options.config_extra =
      "[failpoints]\nio_fault_path = \"*/class_01/*\"\nio_fault_errno = \"EIO\"\n"
      "io_fault_times = 1000000\n";
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const std::vector<SampleLine> lines = ConsumeEval(daemon, "lost");
  CHECK(lines.size() == 30);
  for (const SampleLine& l : lines) CHECK(l.path.rfind("class_01/", 0) != 0);
  const CommandResult stats = daemon.Ctl({"stats"});
  INFO(stats.output);
  CHECK_THAT(stats.output, Catch::Contains("io_error") && Catch::Contains("still failing after"));
  CHECK_THAT(stats.output, Catch::Contains("server.io_retry_ms = 300"));
  const CommandResult json = daemon.Ctl({"stats", "--json"});
  CHECK_THAT(json.output, Catch::Contains("\"io_error\": \"10\""));
}

TEST_CASE("15.3: in a memory cgroup, a sample that gets the decoder OOM-killed is struck and "
          "quarantined, and the epoch completes without it",
          "[integration][oom]") {
#ifdef RINGLOADER_SANITIZER_BUILD
  RINGLOADER_SKIP("sanitizer shadow memory does not fit a 384 MiB cgroup");
#endif
  if (!RunningAsRoot()) RINGLOADER_SKIP("needs root to make a memory cgroup");
  MemoryCgroup cgroup(384ull << 20);
  if (!cgroup.ok()) RINGLOADER_SKIP("no writable cgroup v1 memory hierarchy here");
  DaemonFixtureOptions options;
  options.images = 40;
  options.memory_limit = "256MiB";
  options.env["RINGLOADER_FAILPOINTS"] = "action=oom;crash_on_path=class_02/img_000022.jpg";
  DaemonFixture daemon(options);
  // The supervisor and its daemon live in the cgroup, as under systemd's MemoryMax=.
  Subprocess supervisor(cgroup.SuperviseInside(DaemonPath(), daemon.config_path()),
                        options.env, daemon.log_path());
  REQUIRE(WaitFor([&] { return daemon.Ctl({"health", "--timeout", "1"}).exit_code == 0; },
                  std::chrono::seconds(30)));
  const std::string out = daemon.dir() + "/oom.tsv";
  const CommandResult r = daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "4",
                                      "--epochs", "1", "--image-size", "32", "--samples-out",
                                      out});
  const std::string log = daemon.Log();
  INFO(r.output);
  INFO(log);
  REQUIRE(r.exit_code == 0);
  std::set<std::string> paths;
  for (const SampleLine& l : ReadSamplesOut(out)) CHECK(paths.insert(l.path).second);
  CHECK(paths.size() == 39);
  CHECK(paths.count("class_02/img_000022.jpg") == 0);
  // Real OOM kills, told apart from other SIGKILLs by the cgroup's count.
  CHECK_THAT(log, Catch::Contains("killed by the OOM killer (cgroup oom_kill"));
  CHECK_THAT(daemon.Ctl({"quarantine", "list"}).output,
             Catch::Contains("class_02/img_000022.jpg"));
  supervisor.Kill(SIGTERM);
  CHECK(supervisor.WaitExitCode(std::chrono::seconds(30)) == 0);
}

TEST_CASE("15.3: a SIGKILL from anyone else strikes nothing", "[integration][oom]") {
  DaemonFixtureOptions options;
  options.images = 40;
  options.supervise = true;
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  // Kill the serving daemon while it decodes, a few times over.
  for (int i = 0; i < 2; ++i) {
    const pid_t serving = daemon.ServingPid();
    REQUIRE(serving > 0);
    Subprocess reader({CtlPath(), "--endpoint", daemon.endpoint(), "consume", "--dataset",
                       "synth", "--batch-size", "4", "--epochs", "2", "--image-size", "32"});
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    ::kill(serving, SIGKILL);
    REQUIRE(WaitFor([&] { return daemon.ServingPid() > 0 && daemon.ServingPid() != serving &&
                                 daemon.Ctl({"health", "--timeout", "1"}).exit_code == 0; },
                    std::chrono::seconds(30)));
    CHECK(reader.WaitExitCode(std::chrono::seconds(60)) == 0);
  }
  CHECK(daemon.Ctl({"quarantine", "list"}).output.find("synth") == std::string::npos);
  CHECK(daemon.Log().find("killed by the OOM killer") == std::string::npos);
}

TEST_CASE("15.4: 38-megapixel progressive CMYK, progressive 4:4:4 and baseline JPEGs decode on 4 "
          "threads within memory_limit = 384MiB plus 128 MiB: no OOM kill, every sample served",
          "[integration][memory]") {
#ifdef RINGLOADER_SANITIZER_BUILD
  RINGLOADER_SKIP("sanitizer shadow memory does not fit the cgroup");
#endif
  if (!RunningAsRoot()) RINGLOADER_SKIP("needs root to make a memory cgroup");
  MemoryCgroup cgroup((384ull + 128) << 20);
  if (!cgroup.ok()) RINGLOADER_SKIP("no writable cgroup v1 memory hierarchy here");
  DaemonFixtureOptions options;
  options.images = 4;
  options.decode_threads = 4;
  options.memory_limit = "384MiB";
  options.supervise = true;
  DaemonFixture daemon(options);
  // Replace the small synthetic images with huge ones (under max_pixels = 40 MP).
  constexpr int kWidth = 7200, kHeight = 5300;  // 38.2 MP
  fs::remove_all(daemon.dataset_root());
  fs::create_directories(daemon.dataset_root() + "/big");
  for (int i = 0; i < 2; ++i) {
    image::SyntheticImageOptions o;
    o.width = kWidth;
    o.height = kHeight;
    o.seed = static_cast<uint64_t>(i);
    o.cmyk = true;
    o.progressive = true;
    auto cmyk = image::MakeSyntheticJpeg(o);
    REQUIRE(cmyk.ok());
    WriteFile(daemon.dataset_root() + "/big/cmyk_" + std::to_string(i) + ".jpg",
              std::string(cmyk->begin(), cmyk->end()));
    o.cmyk = false;
    o.progressive = false;
    auto baseline = image::MakeSyntheticJpeg(o);
    REQUIRE(baseline.ok());
    WriteFile(daemon.dataset_root() + "/big/baseline_" + std::to_string(i) + ".jpg",
              std::string(baseline->begin(), baseline->end()));
    std::vector<uint8_t> rgb(static_cast<size_t>(kWidth) * kHeight * 3);
    for (size_t p = 0; p < rgb.size(); ++p) rgb[p] = static_cast<uint8_t>((p * 7 + i) ^ (p >> 11));
    const std::vector<uint8_t> p444 =
        EncodeWithLibjpeg(rgb, kWidth, kHeight, 3, [](jpeg_compress_struct& c) {
          for (int k = 0; k < c.num_components; ++k) {
            c.comp_info[k].h_samp_factor = 1;
            c.comp_info[k].v_samp_factor = 1;
          }
          jpeg_simple_progression(&c);
        });
    WriteFile(daemon.dataset_root() + "/big/p444_" + std::to_string(i) + ".jpg",
              std::string(p444.begin(), p444.end()));
  }
  // The daemon's default limits (the fixture's are smaller): everything max_pixels admits.
  std::string config = ReadFile(daemon.config_path());
  config.replace(config.find("max_pixels = 20000000"), 21, "max_pixels = 40000000");
  config.replace(config.find("max_file_bytes = \"16MiB\""), 24, "max_file_bytes = \"64MiB\"");
  WriteFile(daemon.config_path(), config);
  Subprocess supervisor(cgroup.SuperviseInside(DaemonPath(), daemon.config_path()),
                        {}, daemon.log_path());
  REQUIRE(WaitFor([&] { return daemon.Ctl({"health", "--timeout", "1"}).exit_code == 0; },
                  std::chrono::seconds(60)));
  const uint64_t oom_before = cgroup.oom_kills();
  const std::string out = daemon.dir() + "/big.tsv";
  const CommandResult r =
      daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "2", "--epochs", "1",
                  "--image-size", "64", "--samples-out", out},
                 std::chrono::seconds(240));
  const std::string log = daemon.Log();
  INFO(r.output);
  INFO(log);
  REQUIRE(r.exit_code == 0);
  CHECK(ReadSamplesOut(out).size() == 6);
  CHECK(cgroup.oom_kills() == oom_before);
  CHECK(log.find("died while serving") == std::string::npos);
  // The real peak, measured by the kernel for the process, within the promise.
  const CommandResult stats = daemon.Ctl({"stats", "--json"});
  INFO(stats.output);
  const std::string key = "\"rss_peak_bytes\": \"";
  const size_t at = stats.output.find(key);
  REQUIRE(at != std::string::npos);
  const uint64_t rss_peak = std::stoull(stats.output.substr(at + key.size()));
  CHECK(rss_peak <= (384ull + 128) << 20);
  supervisor.Kill(SIGTERM);
  CHECK(supervisor.WaitExitCode(std::chrono::seconds(30)) == 0);
}

}  // namespace
}  // namespace ringloader::testing
