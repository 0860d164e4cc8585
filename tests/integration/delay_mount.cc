// SPDX-License-Identifier: Apache-2.0
#include "tests/integration/delay_mount.h"

#include <signal.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace ringloader::testing {
namespace {

constexpr long kFuseSuperMagic = 0x65735546;

bool IsFuseMount(const std::string& path) {
  struct statfs fs {};
  return statfs(path.c_str(), &fs) == 0 && fs.f_type == kFuseSuperMagic;
}

std::string DelayFsPath() { return BuiltBinary("delayfs"); }

}  // namespace

std::string DelayMount::Unavailable() {
  static const std::string reason = [] {
    if (access("/dev/fuse", R_OK | W_OK) != 0) return std::string("no usable /dev/fuse");
    if (access(DelayFsPath().c_str(), X_OK) != 0) {
      return std::string("delayfs was not built (libfuse3-dev missing: scripts/setup installs it)");
    }
    TempDir dir;
    std::filesystem::create_directories(dir.Join("src"));
    std::filesystem::create_directories(dir.Join("mnt"));
    Subprocess fs({DelayFsPath(), dir.Join("src"), dir.Join("mnt")}, {},
                  dir.Join("delayfs.log"));
    const bool mounted = WaitFor([&] { return IsFuseMount(dir.Join("mnt")) || !fs.Running(); },
                                 std::chrono::seconds(10)) &&
                         IsFuseMount(dir.Join("mnt"));
    const std::string log = ReadFile(dir.Join("delayfs.log"));
    fs.Kill(SIGTERM);
    fs.Wait(std::chrono::seconds(10));
    if (!mounted) return "a FUSE mount cannot be made here: " + log;
    return std::string();
  }();
  return reason;
}

DelayMount::DelayMount(const std::string& source, const std::string& parent,
                       std::chrono::milliseconds open_delay, const std::string& hang_glob,
                       bool stall_with_eio, uint64_t stall_after_reads) {
  if (!Unavailable().empty()) std::abort();
  mountpoint_ = parent + "/" + UniqueName("delay-mount");
  std::filesystem::create_directories(mountpoint_);
  std::vector<std::string> argv = {DelayFsPath(), source,          mountpoint_,
                                   "--open-delay-ms", std::to_string(open_delay.count()),
                                   "--stats",         mountpoint_ + ".stats",
                                   "--held",          mountpoint_ + ".held"};
  if (!hang_glob.empty()) argv.insert(argv.end(), {"--hang", hang_glob});
  if (stall_with_eio) argv.push_back("--stop-with-eio");
  if (stall_after_reads > 0) {
    argv.insert(argv.end(), {"--stop-after-reads", std::to_string(stall_after_reads)});
  }
  delayfs_ = std::make_unique<Subprocess>(argv, std::map<std::string, std::string>{},
                                          mountpoint_ + ".log");
  if (!WaitFor([&] { return IsFuseMount(mountpoint_); }, std::chrono::seconds(10))) {
    std::fprintf(stderr, "delayfs did not mount %s: %s\n", mountpoint_.c_str(),
                 ReadFile(mountpoint_ + ".log").c_str());
    std::abort();
  }
}

void DelayMount::Stall() { delayfs_->Kill(SIGUSR1); }

void DelayMount::Answer() { delayfs_->Kill(SIGUSR2); }

int DelayMount::Held() const {
  int n = 0;
  std::sscanf(ReadFile(mountpoint_ + ".held").c_str(), "%d", &n);
  return n;
}

bool DelayMount::AwaitHeld(int n, std::chrono::milliseconds timeout) const {
  return WaitFor([&] { return Held() >= n; }, timeout);
}

DelayMount::Peaks DelayMount::Unmount() {
  delayfs_->Kill(SIGTERM);
  if (delayfs_->Wait(std::chrono::seconds(10)) == -1) delayfs_->Kill(SIGKILL);
  Peaks peaks;
  std::sscanf(ReadFile(mountpoint_ + ".stats").c_str(), "files %d dirs %d", &peaks.files,
              &peaks.dirs);
  return peaks;
}

DelayMount::~DelayMount() {
  Unmount();
  // A delayfs killed without unmounting leaves a dead mount: detach it.
  if (IsFuseMount(mountpoint_)) RunCommand({"umount", "-l", mountpoint_});
  std::error_code ec;
  std::filesystem::remove(mountpoint_, ec);
}

}  // namespace ringloader::testing
