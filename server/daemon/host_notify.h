// SPDX-License-Identifier: Apache-2.0
#pragma once
// Tells whoever runs the daemon how it is doing, in sd_notify(3)'s words ("READY=1", "STATUS=...",
// "WATCHDOG=1", "STOPPING=1"), to each of:
//   - systemd (Type=notify): the socket in NOTIFY_SOCKET, through libsystemd; its watchdog
//     interval comes from WATCHDOG_USEC (the unit's WatchdogSec=);
//   - the `--supervise` supervisor: the pipe in RINGLOADER_READY_FD, one message per line; its
//     watchdog is server.watchdog_ms, announced together with READY=1 as "WATCHDOG_USEC=N".
// Without either, every call does nothing.
//
// Thread-safety: thread-safe (each message is one write or one datagram).

#include <chrono>
#include <string>
#include <string_view>

namespace ringloader::server {

// Environment variable naming a file descriptor on which the daemon writes its notifications
// (set by `ringloaderd --supervise`).
inline constexpr char kReadyFdEnv[] = "RINGLOADER_READY_FD";

class HostNotifier {
 public:
  // Reads the environment and removes RINGLOADER_READY_FD from it (children must not inherit
  // it). `supervisor_watchdog` 0: the supervisor's watchdog stays off.
  explicit HostNotifier(std::chrono::milliseconds supervisor_watchdog);
  ~HostNotifier();
  HostNotifier(const HostNotifier&) = delete;
  HostNotifier& operator=(const HostNotifier&) = delete;

  void Ready();
  void Status(std::string_view text);
  // systemd only: start-up may take `more` beyond now (indexing a large dataset is not a hang).
  void ExtendStartTimeout(std::chrono::microseconds more);
  void Ping();  // WATCHDOG=1: call only while the daemon makes progress
  void Stopping();

  // How often Ping() must be called to feed every watchdog (half the shortest interval), or zero
  // when none watches.
  std::chrono::milliseconds ping_interval() const { return ping_interval_; }
  bool systemd() const { return systemd_; }
  bool supervised() const { return pipe_fd_ >= 0; }

 private:
  void Send(std::string_view message);  // to systemd and the supervisor
  void SendToSupervisor(std::string_view message);

  bool systemd_ = false;
  int pipe_fd_ = -1;
  std::chrono::milliseconds supervisor_watchdog_{0};
  std::chrono::milliseconds ping_interval_{0};
};

}  // namespace ringloader::server
