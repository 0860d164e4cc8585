// SPDX-License-Identifier: Apache-2.0
#pragma once
// Hermetic test helpers: temp dirs, unique shm names, real child processes.
// Tests only; nothing here is linked into the product.

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace ringloader::testing {

// A fresh directory under $TMPDIR (or /tmp), removed recursively on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string Join(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// A name unique to this process and call, e.g. "rltest-4711-3-<tag>", usable as a shm name stem.
std::string UniqueName(const std::string& tag);

// Absolute path of a built executable, e.g. BuiltBinary("server/ringloaderd").
std::string BuiltBinary(const std::string& relative_to_build_dir);

// Writes `contents` to `path`, replacing it. Aborts the test process on failure.
void WriteFile(const std::string& path, const std::string& contents);
std::string ReadFile(const std::string& path);

// Polls `pred` every few ms until it is true or `timeout` passes; returns its last value.
bool WaitFor(const std::function<bool()>& pred, std::chrono::milliseconds timeout);

// A real child process (fork + execv). On destruction, if still running: SIGTERM, then SIGKILL
// after 5 s.
class Subprocess {
 public:
  // `env` entries are added to (or override) the parent's environment.
  // stdout/stderr go to `output_path` if non-empty, else are inherited.
  Subprocess(std::vector<std::string> argv, std::map<std::string, std::string> env = {},
             std::string output_path = "");
  ~Subprocess();
  Subprocess(const Subprocess&) = delete;
  Subprocess& operator=(const Subprocess&) = delete;

  pid_t pid() const { return pid_; }
  bool Running();
  void Kill(int signal);
  // Waits for exit; returns the raw wait status, or -1 on timeout.
  int Wait(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Exit code if exited normally, 128+signal if killed, -1 if still running after timeout.
  int WaitExitCode(std::chrono::milliseconds timeout = std::chrono::seconds(60));

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
  int status_ = 0;
};

// Runs a command to completion and returns {exit code (128+signal when killed), stdout+stderr}.
struct CommandResult {
  int exit_code;
  std::string output;
};
CommandResult RunCommand(const std::vector<std::string>& argv,
                         std::map<std::string, std::string> env = {},
                         std::chrono::milliseconds timeout = std::chrono::seconds(120));

// A test that cannot run on this machine (no root, no unshare, ...) says so and returns: CTest
// reports it as skipped, never as passed (tests/CMakeLists.txt matches the marker this prints
// with SKIP_REGULAR_EXPRESSION).
void ReportSkip(const std::string& reason);
#define RINGLOADER_SKIP(reason)                  \
  do {                                           \
    ::ringloader::testing::ReportSkip(reason);   \
    return;                                      \
  } while (false)
bool RunningAsRoot();

}  // namespace ringloader::testing
