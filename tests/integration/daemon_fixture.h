// SPDX-License-Identifier: Apache-2.0
#pragma once
// A real ringloaderd on a temp Unix socket, over a real synthetic JPEG dataset, for integration
// tests. Everything lives in one TempDir (socket, state dir, config, dataset, logs).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "proto/ringloader.pb.h"
#include "tests/support/test_support.h"

namespace ringloader::testing {

struct DaemonFixtureOptions {
  uint32_t images = 120;
  uint32_t classes = 4;
  uint64_t dataset_seed = 7;
  uint32_t decode_threads = 2;
  std::string memory_limit = "1GiB";
  std::string on_error = "skip";
  // Extra TOML appended to [server] (e.g. "stream_idle_timeout_ms = 500").
  std::string server_extra;
  // Extra top-level TOML (e.g. a [failpoints] table).
  std::string config_extra;
  bool supervise = false;
  // Listen on TCP 127.0.0.1 at a free port instead of the Unix socket in the temp dir (with
  // server.insecure_tcp = true unless config_extra has a [tls] table).
  bool tcp = false;
  std::map<std::string, std::string> env;
  // The environment of Ctl()'s ringloaderctl (e.g. RINGLOADER_TLS_* for a TLS daemon).
  std::map<std::string, std::string> ctl_env;
  // Runs the daemon through this command (it must exec it: the pid stays), e.g.
  // {"prlimit", "--nofile=1024:1024", "--"} for a host's open-file limit.
  std::vector<std::string> command_prefix;
};

class DaemonFixture {
 public:
  explicit DaemonFixture(DaemonFixtureOptions options = {});
  ~DaemonFixture();  // SIGTERM, then SIGKILL if it does not stop

  // Starts ringloaderd (again) and waits until health says SERVING. Returns false on timeout.
  bool Start();
  // Starts it without waiting for anything.
  void Launch();
  // Sets an environment variable for the next Start()/Launch().
  void SetEnv(const std::string& name, const std::string& value) { options_.env[name] = value; }
  // SIGTERM; returns the exit code.
  int Stop();
  Subprocess& process() { return *process_; }
  // The serving daemon's pid (the supervisor's child when supervised).
  pid_t ServingPid();
  // Waits up to 30 s for the supervisor's child to be another than `old_pid` (a restart after
  // a kill); its pid, or -1.
  pid_t WaitForNewServingPid(pid_t old_pid);

  const std::string& endpoint() const { return endpoint_; }
  const std::string& dir() const { return dir_.path(); }
  std::string dataset_root() const { return dir_.Join("data"); }
  std::string state_dir() const { return dir_.Join("state"); }
  std::string config_path() const { return dir_.Join("ringloaderd.toml"); }
  std::string log_path() const { return dir_.Join("ringloaderd.log"); }
  std::string Log() const { return ReadFile(log_path()); }

  // ringloaderctl with --endpoint prepended.
  CommandResult Ctl(std::vector<std::string> args,
                    std::chrono::milliseconds timeout = std::chrono::seconds(120)) const;

  // The class folder name of each sample path ("class_02/img_000017.jpg" -> 2).
  static int64_t LabelOfPath(const std::string& relative_path);

 private:
  DaemonFixtureOptions options_;
  TempDir dir_;
  std::string endpoint_;
  std::unique_ptr<Subprocess> process_;
};

// One line of `ringloaderctl consume --samples-out`.
struct SampleLine {
  uint64_t epoch;
  uint64_t sequence;
  uint64_t sample_index;
  int64_t label;
  std::string path;
  std::string digest;
};
std::vector<SampleLine> ReadSamplesOut(const std::string& path);

std::string CtlPath();

// GetStats from the daemon at `endpoint`, straight over gRPC (10 s deadline). Throws
// std::runtime_error with gRPC's message when the call fails (the test fails with it).
v1::GetStatsResponse Stats(const std::string& endpoint);

// A TCP port on 127.0.0.1 that nobody listens on right now (the kernel's pick for port 0).
int FreeTcpPort();
// A TCP connection to 127.0.0.1:`port` that sends `bytes` (maybe nothing) and is left open, as
// an idle or slow client; -1 when the connection is refused.
int OpenIdleTcp(int port, const std::string& bytes);
std::string DaemonPath();

}  // namespace ringloader::testing
