// SPDX-License-Identifier: Apache-2.0
// ringloaderd: parse flags, then run the daemon (or its supervisor).
#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "ringloader_version.h"
#include "server/daemon/config.h"
#include "server/daemon/daemon.h"
#include "server/daemon/heap.h"
#include "server/daemon/supervisor.h"

// Before main() and this binary's other static initializers (priority 101 runs first; shared
// libraries' own initializers run before it): from here on a SIGHUP or SIGTERM waits, pending,
// for the daemon or the supervisor to take it (see HoldStopSignals). Only the dynamic loader's
// work before this is exposed; a launcher that must signal a process that instant blocks the
// signals before it execs us.
__attribute__((constructor(101))) static void HoldSignalsFirst() {
  ringloader::server::HoldStopSignals();
}

int main(int argc, char** argv) {
  ringloader::server::LimitHeapArenas();  // before any thread starts: see heap.h
  ringloader::server::DaemonOptions options;
  bool supervise = false;
  pid_t parent_pid = 0;
  CLI::App app{
      "ringloaderd: decodes and batches training images into shared memory.\n"
      "SIGTERM/SIGINT stop it cleanly; SIGHUP re-reads the config (log_level and new [[datasets]]\n"
      "apply at once, other changes are logged as needing a restart). Clients hold a session for\n"
      "their life: a dead trainer's streams are closed at once. See config/ringloaderd.toml."};
  app.add_option("--config", options.config_path, "TOML config file")->required();
  app.add_option("--listen", options.listen_override, "unix:PATH or HOST:PORT (overrides config)");
  app.add_flag("--supervise", supervise, "run the daemon as a child and restart it when it dies");
  app.add_option("--parent-pid", parent_pid,
                 "stop (as on SIGTERM) when process PID, which started this one, exits")
      ->check(CLI::PositiveNumber);
  bool check_config = false;
  app.add_flag("--check-config", check_config,
               "load and validate the config (every key and rule), print \"ok\" or the error, "
               "and exit 0 or 1 without starting");
  app.set_version_flag("--version", "ringloaderd " RINGLOADER_VERSION);
  CLI11_PARSE(app, argc, argv);
  if (check_config) {
    const absl::StatusOr<ringloader::server::DaemonConfig> config =
        ringloader::server::LoadConfig(options.config_path);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", std::string(config.status().message()).c_str());
      return 1;
    }
    std::printf("%s: ok (%zu datasets)\n", options.config_path.c_str(), config->datasets.size());
    return 0;
  }
  if (parent_pid != 0) {
    // A private daemon (the Python package's rl.Daemon) must not outlive its notebook, even one
    // that is SIGKILLed. The check after prctl covers a parent that died before it.
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != parent_pid) {
      std::fprintf(stderr, "ringloaderd: parent process %d is gone; not starting\n",
                   static_cast<int>(parent_pid));
      return 1;
    }
  }
  if (!supervise) return ringloader::server::RunDaemon(options);

  ringloader::server::SupervisorOptions supervisor;
  // argv[0] of the child: this binary's path, so ps and systemctl status read "ringloaderd ...".
  std::error_code ec;
  std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
  if (ec || self.empty()) self = argv[0];
  supervisor.child_argv = {self, "--config", options.config_path};
  if (!options.listen_override.empty()) {
    supervisor.child_argv.insert(supervisor.child_argv.end(), {"--listen", options.listen_override});
  }
  return ringloader::server::RunSupervisor(supervisor);
}
