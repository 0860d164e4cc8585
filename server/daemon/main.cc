// ringloaderd: parse flags, then run the daemon (or its supervisor).
#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "server/daemon/daemon.h"
#include "server/daemon/supervisor.h"

int main(int argc, char** argv) {
  ringloader::server::DaemonOptions options;
  bool supervise = false;
  CLI::App app{
      "ringloaderd: decodes and batches training images into shared memory.\n"
      "SIGTERM/SIGINT stop it cleanly; SIGHUP re-reads the config (log_level and new [[datasets]]\n"
      "apply at once, other changes are logged as needing a restart). Clients hold a session for\n"
      "their life: a dead trainer's streams are closed at once. See config/ringloaderd.toml."};
  app.add_option("--config", options.config_path, "TOML config file")->required();
  app.add_option("--listen", options.listen_override, "unix:PATH or HOST:PORT (overrides config)");
  app.add_flag("--supervise", supervise, "run the daemon as a child and restart it when it dies");
  app.set_version_flag("--version", "ringloaderd 0.1.0");
  CLI11_PARSE(app, argc, argv);
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
