// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/host_notify.h"

#include <fcntl.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace ringloader::server {

HostNotifier::HostNotifier(std::chrono::milliseconds supervisor_watchdog) {
  const char* socket = std::getenv("NOTIFY_SOCKET");
  systemd_ = socket != nullptr && *socket != '\0';
  std::chrono::milliseconds shortest{0};
  uint64_t usec = 0;
  // > 0 only when WATCHDOG_USEC is set and WATCHDOG_PID (if set) is this process.
  if (systemd_ && sd_watchdog_enabled(0, &usec) > 0 && usec > 0) {
    shortest = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::microseconds(usec));
  }
  if (const char* fd_text = std::getenv(kReadyFdEnv); fd_text != nullptr) {
    int fd = -1;
    if (absl::SimpleAtoi(fd_text, &fd) && fd > 2 && fcntl(fd, F_GETFD) >= 0) {
      pipe_fd_ = fd;
      fcntl(fd, F_SETFD, FD_CLOEXEC);
      // A supervisor that stops reading must never block the daemon: messages are dropped then.
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    }
    unsetenv(kReadyFdEnv);
  }
  if (pipe_fd_ >= 0 && supervisor_watchdog.count() > 0) {
    supervisor_watchdog_ = supervisor_watchdog;
    shortest = shortest.count() > 0 ? std::min(shortest, supervisor_watchdog) : supervisor_watchdog;
  }
  ping_interval_ = shortest / 2;
  if (shortest.count() > 0 && ping_interval_.count() == 0) ping_interval_ = std::chrono::milliseconds(1);
}

HostNotifier::~HostNotifier() {
  if (pipe_fd_ >= 0) ::close(pipe_fd_);
}

void HostNotifier::Send(std::string_view message) {
  if (systemd_) {
    const std::string text(message);
    if (int r = sd_notify(0, text.c_str()); r < 0) {
      SPDLOG_DEBUG("sd_notify: {}", std::strerror(-r));
    }
  }
  SendToSupervisor(message);
}

void HostNotifier::SendToSupervisor(std::string_view message) {
  if (pipe_fd_ < 0) return;
  // One write per message, below PIPE_BUF: never interleaved with another thread's.
  std::string line(message);
  line += '\n';
  if (::write(pipe_fd_, line.data(), line.size()) < 0 && errno != EAGAIN) {
    SPDLOG_DEBUG("supervisor pipe: {}", std::strerror(errno));
  }
}

void HostNotifier::Ready() {
  Send("READY=1");
  if (supervisor_watchdog_.count() > 0) {
    // The supervisor's own watchdog interval (systemd's comes from the unit).
    SendToSupervisor(absl::StrCat("WATCHDOG_USEC=",
                                  std::chrono::microseconds(supervisor_watchdog_).count()));
  }
}

void HostNotifier::Status(std::string_view text) {
  // One line: a newline would end the message early for the supervisor.
  std::string line(text.substr(0, 400));
  std::replace(line.begin(), line.end(), '\n', ' ');
  Send("STATUS=" + line);
}

void HostNotifier::ExtendStartTimeout(std::chrono::microseconds more) {
  if (!systemd_) return;
  const std::string text = absl::StrCat("EXTEND_TIMEOUT_USEC=", more.count());
  sd_notify(0, text.c_str());
}

void HostNotifier::Ping() { Send("WATCHDOG=1"); }

void HostNotifier::Stopping() { Send("STOPPING=1"); }

}  // namespace ringloader::server
