// SPDX-License-Identifier: Apache-2.0
// Issue 38, items 2 and 3: what a stream may take is bounded by the host's limits, not by the
// load or the data. Through the real daemon run under `prlimit --nofile=1024:1024` (a
// container's usual limit): eight streams with io_depth 256 (2,048 reads ahead wanted) and a
// scraper leaving hundreds of /metrics connections open lose no sample, and the daemon says at
// start how it shares the limit. Bad samples in bulk: each bad file is logged once at most, the
// rest summed in one line per epoch, and every one counted; a WebDataset shard of 50,000 empty
// members in a 100 MiB memory cgroup costs counts, not memory. The heap stays in 2 arenas.
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "shm/base/cgroup.h"
#include "tests/integration/daemon_fixture.h"
#include "tests/integration/memory_cgroup.h"
#include "tests/integration/storage_data.h"

namespace ringloader::testing {
namespace {

TEST_CASE("38.2: with an open-file limit of 1,024, eight streams reading 256 ahead and 300 idle "
          "/metrics connections lose no sample, and the daemon says how it shares the limit",
          "[integration][limits]") {
  if (::access("/usr/bin/prlimit", X_OK) != 0) RINGLOADER_SKIP("no /usr/bin/prlimit");
  const int metrics_port = FreeTcpPort();
  DaemonFixtureOptions options;
  options.images = 600;  // more than a window per stream: every stream's window fills
  options.server_extra = "max_streams = 8\nio_depth = 256\nmetrics_listen = \"127.0.0.1:" +
                         std::to_string(metrics_port) + "\"";
  options.command_prefix = {"/usr/bin/prlimit", "--nofile=1024:1024", "--"};
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  const std::string log = daemon.Log();
  CHECK_THAT(log, Catch::Contains("open files: limit 1024: ") &&
                      Catch::Contains("max_streams x io_depth would want 2048: reads ahead "
                                      "shrink to fit"));
  // A scraper that leaves its connections open: they take /metrics' share, not the reads'.
  std::vector<int> idle;
  for (int i = 0; i < 300; ++i) idle.push_back(OpenIdleTcp(metrics_port, ""));
  std::atomic<int> short_epochs{0};
  std::vector<std::thread> trainers;
  for (int t = 0; t < 8; ++t) {
    trainers.emplace_back([&, t] {
      client::Client c(daemon.endpoint());
      client::StreamOptions o = Options("synth", 2);
      o.seed = 100 + t;
      if (Lines(*c.Open(o)).size() != 1200) ++short_epochs;
    });
  }
  for (std::thread& t : trainers) t.join();
  CHECK(short_epochs.load() == 0);
  const v1::GetStatsResponse stats = Stats(daemon.endpoint());
  CHECK(stats.decode_errors() == 0);
  CHECK(stats.open_files_limit() == 1024);
  CHECK(stats.read_files_limit() > 0);
  CHECK(stats.read_files_limit() < 1024);
  CHECK(stats.read_files_peak() <= stats.read_files_limit());
  CHECK_THAT(daemon.Ctl({"stats"}).output, Catch::Contains("open files"));
  CHECK_THAT(daemon.Log(), !Catch::Contains("Too many open files"));
  for (int fd : idle) {
    if (fd >= 0) ::close(fd);
  }
  CHECK(daemon.Stop() == 0);
}

// Reads allocate a file's bytes on the lane's threads and decodes free them: with an arena per
// thread (glibc's default, up to 8 per core) each arena keeps what it freed and the heap grew
// epoch after epoch. The daemon caps them (server/daemon/heap.h); the operator's MALLOC_ARENA_MAX
// wins. Shape: eight streams, io_depth 16 (dozens of threads that allocate).
TEST_CASE("38.2: eight streams keep the daemon's heap in 2 arenas (MALLOC_ARENA_MAX wins), and "
          "stats, ctl and /metrics say what the heap holds",
          "[integration][limits]") {
#ifdef RINGLOADER_SANITIZER_BUILD
  RINGLOADER_SKIP("the sanitizer's allocator replaces glibc malloc: no arenas to count");
#endif
  const bool from_environment = GENERATE(false, true);
  CAPTURE(from_environment);
  const int metrics_port = FreeTcpPort();
  DaemonFixtureOptions options;
  options.images = 64;
  options.server_extra = "max_streams = 8\nio_depth = 16\nmetrics_listen = \"127.0.0.1:" +
                         std::to_string(metrics_port) + "\"";
  if (from_environment) options.command_prefix = {"/usr/bin/env", "MALLOC_ARENA_MAX=3"};
  DaemonFixture daemon(options);
  REQUIRE(daemon.Start());
  std::atomic<int> short_runs{0};
  std::vector<std::thread> trainers;
  for (int t = 0; t < 8; ++t) {
    trainers.emplace_back([&, t] {
      client::Client c(daemon.endpoint());
      client::StreamOptions o = Options("synth", 3);
      o.seed = 200 + t;
      if (Lines(*c.Open(o)).size() != 3 * 64) ++short_runs;
    });
  }
  for (std::thread& t : trainers) t.join();
  CHECK(short_runs.load() == 0);
  const v1::GetStatsResponse stats = Stats(daemon.endpoint());
  // Dozens of threads allocated: without the cap each would have had an arena (16 here).
  if (from_environment) {
    CHECK(stats.heap_arenas() == 3);
  } else {
    CHECK(stats.heap_arenas() >= 1);
    CHECK(stats.heap_arenas() <= 2);
  }
  CHECK(stats.heap_bytes() > 0);
  CHECK(stats.heap_free_bytes() < stats.heap_bytes());
  CHECK(stats.heap_bytes() < stats.rss_bytes() + (64u << 20));
  CHECK_THAT(daemon.Ctl({"stats"}).output,
             Catch::Contains("heap") && Catch::Contains(std::to_string(stats.heap_arenas()) +
                                                        " arenas"));
  const CommandResult scrape =
      RunCommand({"/usr/bin/curl", "--silent", "--show-error", "--max-time", "10",
                  "http://127.0.0.1:" + std::to_string(metrics_port) + "/metrics"});
  CHECK_THAT(scrape.output, Catch::Contains("\nringloader_heap_bytes ") &&
                                Catch::Contains("\nringloader_heap_free_bytes "));
  CHECK(daemon.Stop() == 0);
}

TEST_CASE("38.3: a dataset with 500 empty files among 8 good logs each bad file once at most, "
          "sums the rest in one line per epoch and counts every one",
          "[integration][limits]") {
  DaemonFixtureOptions options;
  options.images = 8;
  DaemonFixture daemon(options);
  for (int i = 0; i < 500; ++i) {
    std::ofstream(daemon.dataset_root() + "/class_00/empty_" + std::to_string(i) + ".jpg");
  }
  REQUIRE(daemon.Start());
  const CommandResult r = daemon.Ctl({"consume", "--dataset", "synth", "--batch-size", "4",
                                      "--image-size", "32", "--epochs", "2"});
  INFO(r.output);
  REQUIRE(r.exit_code == 0);
  const v1::GetStatsResponse stats = Stats(daemon.endpoint());
  CHECK(stats.decode_errors() == 1000);  // every one, both epochs
  CHECK(stats.decode_errors_by_reason().at("empty") == 1000);
  // Lines: no file twice; far fewer than the bad samples (a batch keeps its first 64 whole).
  std::map<std::string, int> logged;
  std::istringstream log(daemon.Log());
  int summaries = 0;
  for (std::string line; std::getline(log, line);) {
    if (const size_t at = line.find("skipping sample "); at != std::string::npos) {
      ++logged[line.substr(at, line.find(' ', at + 16) - at)];
    }
    if (line.find("more bad samples in epoch") != std::string::npos) ++summaries;
  }
  for (const auto& [what, times] : logged) {
    INFO(what);
    CHECK(times == 1);
  }
  CHECK(logged.size() < 500);
  CHECK(summaries >= 1);
  CHECK(summaries <= 2);  // one per epoch at most, for one stream
  CHECK_THAT(daemon.Log(), Catch::Contains("without a line each (empty "));
  CHECK(daemon.Stop() == 0);
}

// The report: a WebDataset shard with 50,000 empty members between 4 good samples, deep
// in a tree, under memory_limit = "32MiB" in a 100 MiB memory cgroup, got the daemon OOM-killed
// 7-10 times a minute and the trainer never got a batch (every skipped sample's path and message
// were kept while the batch filled). Now: every epoch delivers the 4, nobody is killed, every
// skip is counted, and RSS does not grow from one run of epochs to the next.
TEST_CASE("38.3: a WebDataset shard with 50,000 empty members among 4 good, memory_limit 32MiB in "
          "a 100 MiB memory cgroup: every epoch delivers the 4, no OOM kill, RSS flat",
          "[integration][limits][memory]") {
#ifdef RINGLOADER_SANITIZER_BUILD
  RINGLOADER_SKIP("sanitizer shadow memory does not fit a 100 MiB cgroup");
#endif
  if (!RunningAsRoot()) RINGLOADER_SKIP("needs root to make a memory cgroup");
  MemoryCgroup cgroup(100ull << 20);
  if (!cgroup.ok()) RINGLOADER_SKIP("no writable cgroup v1 memory hierarchy here");
  constexpr int kEmpty = 50000;
  constexpr int kGood = 4;
  DaemonFixtureOptions options;
  options.images = kGood;
  options.memory_limit = "32MiB";
  DaemonFixture daemon(options);
  // The shard's members: s000000.jpg .. s050003.jpg, the good ones spread among the empty.
  const std::string tree = daemon.dir() + "/members";
  const std::string deep = "deep/in/a/tree";
  std::filesystem::create_directories(tree + "/" + deep);
  std::vector<std::string> good_files;
  for (const auto& e : std::filesystem::recursive_directory_iterator(daemon.dataset_root())) {
    if (e.is_regular_file()) good_files.push_back(e.path().string());
  }
  REQUIRE(good_files.size() == kGood);
  std::set<std::string> good_keys;
  for (int i = 0, next_good = 0; i < kEmpty + kGood; ++i) {
    char name[32];
    std::snprintf(name, sizeof name, "s%06d", i);
    const std::string path = tree + "/" + deep + "/" + name + ".jpg";
    if (i % ((kEmpty + kGood) / kGood) == 0 && next_good < kGood) {
      std::filesystem::copy_file(good_files[static_cast<size_t>(next_good++)], path);
      good_keys.insert(deep + "/" + name);
    } else {
      std::ofstream touch(path);
    }
  }
  REQUIRE(good_keys.size() == kGood);
  const std::string shard = daemon.dir() + "/shards/deep/tree/shard-000000.tar";
  std::filesystem::create_directories(std::filesystem::path(shard).parent_path());
  REQUIRE(RunCommand({"/usr/bin/tar", "--sort=name", "-cf", shard, "-C", tree, "deep"}).exit_code ==
          0);
  std::filesystem::remove_all(tree);
  std::string config = ReadFile(daemon.config_path());
  config += "\n[[datasets]]\nname = \"wds\"\nformat = \"webdataset\"\nlabel_key = \"\"\npath = \"" +
            shard + "\"\n";
  WriteFile(daemon.config_path(), config);
  // The supervisor and its daemon live in the cgroup, as under a container's limit.
  Subprocess supervisor(cgroup.SuperviseInside(DaemonPath(), daemon.config_path()),
                        {}, daemon.log_path());
  REQUIRE(WaitFor([&] { return daemon.Ctl({"health", "--timeout", "1"}).exit_code == 0; },
                  std::chrono::seconds(60)));
  std::vector<uint64_t> rss_after_run;
  for (int run = 0; run < 3; ++run) {
    const std::string out = daemon.dir() + "/run" + std::to_string(run) + ".tsv";
    const CommandResult r = daemon.Ctl({"consume", "--dataset", "wds", "--batch-size", "4",
                                        "--epochs", "2", "--image-size", "32", "--samples-out",
                                        out},
                                       std::chrono::seconds(240));
    INFO(r.output);
    if (r.exit_code != 0) {
      UNSCOPED_INFO(daemon.Ctl({"stats"}).output << daemon.Log().substr(0, 4000));
    }
    REQUIRE(r.exit_code == 0);
    std::map<std::string, int> seen;
    for (const SampleLine& l : ReadSamplesOut(out)) ++seen[l.path.substr(l.path.find('#') + 1)];
    CHECK(seen.size() == kGood);
    for (const std::string& key : good_keys) CHECK(seen[key] == 2);
    const v1::GetStatsResponse stats = Stats(daemon.endpoint());
    rss_after_run.push_back(stats.rss_bytes());
    CHECK(stats.decode_errors_by_reason().at("empty") == uint64_t{2} * kEmpty * (run + 1));
    CHECK(stats.daemon_restarts() == 0);
  }
  const std::string log = daemon.Log();
  CHECK(cgroup.oom_kills() == 0);
  CHECK(log.find("died while serving") == std::string::npos);
  // Runs of epochs after the first cost no more memory (RSS within 8 MiB of the first run's).
  INFO("RSS after each run: " << rss_after_run[0] << ", " << rss_after_run[1] << ", "
                              << rss_after_run[2]);
  CHECK(rss_after_run[2] < rss_after_run[0] + (8u << 20));
  supervisor.Kill(SIGTERM);
  CHECK(supervisor.WaitExitCode(std::chrono::seconds(30)) == 0);
}

// decode_threads = 0 meant std::thread::hardware_concurrency(): the machine's cores, not the
// daemon's. Pinned to one core (taskset, CPUAffinity=, a cpuset) or held to one core's time by a
// CPU quota (a container's --cpus, a Kubernetes limit), it ran a decode thread per machine core,
// all taking turns on one.

// A child of this process's own cpu cgroup (v1) with a quota, removed when done; !ok() where
// there is none to be made (cgroup v2, not root).
class CpuCgroup {
 public:
  explicit CpuCgroup(double cores) {
    const std::string self = ReadFile("/proc/self/cgroup");
    for (const char* line : {":cpu,cpuacct:", ":cpu:"}) {
      const size_t at = self.find(line);
      if (at == std::string::npos) continue;
      const size_t from = at + std::strlen(line);
      std::string own = self.substr(from, self.find('\n', at) - from);
      if (own == "/") own.clear();
      for (const char* root : {"/sys/fs/cgroup/cpu,cpuacct", "/sys/fs/cgroup/cpu"}) {
        if (!std::filesystem::exists(std::string(root) + own + "/cpu.cfs_quota_us")) continue;
        path_ = std::string(root) + own + "/rl-test-cpu-" + std::to_string(::getpid());
        break;
      }
      break;
    }
    std::error_code ec;
    if (path_.empty() || !std::filesystem::create_directory(path_, ec) || ec) {
      path_.clear();
      return;
    }
    const std::string quota = std::to_string(static_cast<int64_t>(cores * 100000));
    WriteFile(path_ + "/cpu.cfs_period_us", "100000");
    WriteFile(path_ + "/cpu.cfs_quota_us", quota);
    // The kernel refuses a quota its parent's forbids: then there is none to test with.
    if (ReadFile(path_ + "/cpu.cfs_quota_us").find(quota) != 0) {
      ::rmdir(path_.c_str());
      path_.clear();
    }
  }
  ~CpuCgroup() {
    if (!path_.empty()) ::rmdir(path_.c_str());
  }
  CpuCgroup(const CpuCgroup&) = delete;
  CpuCgroup& operator=(const CpuCgroup&) = delete;
  bool ok() const { return !path_.empty(); }
  const std::string& path() const { return path_; }
  // What runs a command inside it: the shell joins it, then execs the rest.
  std::vector<std::string> Prefix() const {
    return {"/bin/sh", "-c", "echo $$ > \"$0\"/cgroup.procs && exec \"$@\"", path_};
  }

 private:
  std::string path_;
};

TEST_CASE("decode_threads = 0 counts the cores the daemon may use: as many as this test may, 1 "
          "pinned to one of them, 1 in a cgroup with a CPU quota of one core",
          "[integration][limits]") {
  std::string why;
  const uint32_t usable = base::UsableCores("self", &why);  // the daemon inherits them
  DaemonFixtureOptions options;
  options.decode_threads = 0;
  const auto threads_of = [](DaemonFixture& daemon) {
    REQUIRE(daemon.Start());
    const uint32_t threads = Stats(daemon.endpoint()).decode_threads();
    client::Client c(daemon.endpoint());
    CHECK(Lines(*c.Open(Options("synth", 1))).size() == 120);  // and it decodes with them
    return threads;
  };
  SECTION("as this test") {
    DaemonFixture daemon(options);
    CHECK(threads_of(daemon) == usable);
    CHECK_THAT(daemon.Log(), Catch::Contains(absl::StrCat("decode_threads = 0: ", usable,
                                                          " decode threads, as this process may "
                                                          "use ", why)));
    CHECK(daemon.Stop() == 0);
  }
  if (usable < 2) RINGLOADER_SKIP("one usable core here: nothing to tell apart");
  SECTION("taskset to one core") {
    if (::access("/usr/bin/taskset", X_OK) != 0) RINGLOADER_SKIP("no /usr/bin/taskset");
    cpu_set_t set;
    CPU_ZERO(&set);
    REQUIRE(::sched_getaffinity(0, sizeof(set), &set) == 0);
    int first = 0;
    while (!CPU_ISSET(first, &set)) ++first;  // one this test may run on
    options.command_prefix = {"/usr/bin/taskset", "-c", std::to_string(first)};
    DaemonFixture daemon(options);
    CHECK(threads_of(daemon) == 1);
    CHECK_THAT(daemon.Log(), Catch::Contains("1 decode threads, as this process may use 1 of ") &&
                                 Catch::Contains(" cores in its CPU affinity"));
    CHECK(daemon.Stop() == 0);
  }
  SECTION("a cgroup (v1) with a CPU quota of one core") {
    const CpuCgroup cgroup(1.0);
    if (!cgroup.ok()) RINGLOADER_SKIP("no cgroup v1 cpu hierarchy to make a child in (not root?)");
    options.command_prefix = cgroup.Prefix();
    DaemonFixture daemon(options);
    CHECK(threads_of(daemon) == 1);
    CHECK_THAT(daemon.Log(), Catch::Contains("1 decode threads, as this process may use a CPU "
                                             "quota of 1.00 cores (") &&
                                 Catch::Contains(cgroup.path().substr(cgroup.path().rfind('/')) +
                                                 "/cpu.cfs_quota_us)"));
    CHECK(daemon.Stop() == 0);
  }
}

}  // namespace
}  // namespace ringloader::testing
