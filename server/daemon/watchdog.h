// SPDX-License-Identifier: Apache-2.0
#pragma once
// The daemon's side of the watchdogs. About once a second (more often when a watchdog interval
// asks for it) it tells the host (HostNotifier) what the daemon is doing (STATUS=) and, while it
// serves and no decode is stuck (ProgressWatch), that it makes progress (WATCHDOG=1). Once a
// decode is stuck the pings stop: systemd (WatchdogSec=) or the supervisor (server.watchdog_ms)
// then kills the daemon with SIGABRT, the crash journal strikes what was in flight, and the
// restarted daemon decodes that sample alone; a sample that hangs twice is quarantined.
// While starting, a start-up that shows progress extends systemd's start timeout.
//
// Thread-safety: Start/Stop from one thread; the hooks are called on the watchdog's own thread.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "server/daemon/host_notify.h"
#include "server/daemon/progress_watch.h"

namespace ringloader::server {

struct WatchdogHooks {
  std::function<bool()> ready;  // serving (after READY=1)
  // The STATUS= text: what the daemon does, or, given a stuck sample, what holds it.
  std::function<std::string(const std::optional<StuckSample>& stuck)> status;
};

class Watchdog {
 public:
  Watchdog(HostNotifier& notifier, const ProgressWatch& progress, WatchdogHooks hooks);
  ~Watchdog();  // Stop()
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void Start();
  void Stop();  // idempotent

 private:
  void Loop();
  void Tick(std::string* last_status, bool* was_stuck);

  HostNotifier& notifier_;
  const ProgressWatch& progress_;
  const WatchdogHooks hooks_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace ringloader::server
