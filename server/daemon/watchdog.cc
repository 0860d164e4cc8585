// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/watchdog.h"

#include <algorithm>

#include "spdlog/spdlog.h"

namespace ringloader::server {
namespace {

// How long systemd may wait beyond now while start-up indexing reports progress.
constexpr std::chrono::seconds kStartExtension{90};

}  // namespace

Watchdog::Watchdog(HostNotifier& notifier, const ProgressWatch& progress, WatchdogHooks hooks)
    : notifier_(notifier), progress_(progress), hooks_(std::move(hooks)) {}

Watchdog::~Watchdog() { Stop(); }

void Watchdog::Start() { thread_ = std::thread([this] { Loop(); }); }

void Watchdog::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::Tick(std::string* last_status, bool* was_stuck) {
  const bool ready = hooks_.ready();
  const std::optional<StuckSample> stuck =
      ready ? progress_.Stuck(std::chrono::steady_clock::now()) : std::nullopt;
  const std::string status = hooks_.status(stuck);
  if (stuck && !*was_stuck) {
    SPDLOG_ERROR("no progress: {}; watchdog pings stopped, so the daemon will be killed "
                 "(SIGABRT) and restarted, and the sample struck",
                 status);
  } else if (!stuck && *was_stuck) {
    SPDLOG_WARN("progress again: watchdog pings resumed");
  }
  *was_stuck = stuck.has_value();
  if (status != *last_status) {
    notifier_.Status(status);
    // Start-up that moves on is not a hang: give it more time (a stuck walk stops extending).
    if (!ready) notifier_.ExtendStartTimeout(kStartExtension);
    *last_status = status;
  }
  if (ready && !stuck) notifier_.Ping();
}

void Watchdog::Loop() {
  std::chrono::milliseconds tick{1000};
  if (notifier_.ping_interval().count() > 0) tick = std::min(tick, notifier_.ping_interval());
  std::string last_status;
  bool was_stuck = false;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    lock.unlock();
    Tick(&last_status, &was_stuck);
    lock.lock();
    cv_.wait_for(lock, tick, [this] { return stop_; });
  }
}

}  // namespace ringloader::server
