#pragma once
// The daemon's whole life, in order: load config, set up logging, remove stale segments, open
// datasets, read the crash journal (strikes, quarantine), start decode workers, start gRPC, wait
// for SIGTERM/SIGINT, then shut down in reverse order (segments unlinked, journal cleared).

#include <string>

namespace ringloader::server {

struct DaemonOptions {
  std::string config_path;
  std::string listen_override;  // --listen; empty = the config's server.listen
};

// Returns the process exit code: 0 after a clean shutdown, 1 when start-up failed (the reason is
// logged: bad config, socket in use, ...).
int RunDaemon(const DaemonOptions& options);

}  // namespace ringloader::server
