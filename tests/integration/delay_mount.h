// SPDX-License-Identifier: Apache-2.0
#pragma once
// A FUSE delay mount for tests: delayfs (tests/support/delayfs.cc) passing a directory through
// with a delay on every file open, as a network mount costs per file. Unmounted (and delayfs
// stopped) when destroyed.

#include <chrono>
#include <memory>
#include <string>

#include "tests/support/test_support.h"

namespace ringloader::testing {

class DelayMount {
 public:
  // Why a delay mount cannot be made here (no /dev/fuse, no delayfs built, mount refused), or
  // "" when it can. Tests skip visibly with this reason.
  static std::string Unavailable();

  // Mounts `source` at a new directory under `parent` (see path()). `hang_glob`: opening a
  // matching file (relative path) never answers until the mount goes. `stall_with_eio`: Stall()
  // fails every request at once with EIO instead (a soft NFS mount). `stall_after_reads` (> 0):
  // the mount stalls by itself at the read of file data after that many (mid-file, for tests
  // whose outage must meet a read in progress). REQUIRES: Unavailable() is "" (aborts the test
  // otherwise).
  DelayMount(const std::string& source, const std::string& parent,
             std::chrono::milliseconds open_delay, const std::string& hang_glob = "",
             bool stall_with_eio = false, uint64_t stall_after_reads = 0);
  ~DelayMount();
  const std::string& path() const { return mountpoint_; }
  // The whole mount stops answering (every open, listing and read that reaches delayfs waits),
  // as an NFS server that goes away; Answer() answers them all and goes on.
  void Stall();
  void Answer();
  // Requests waiting unanswered now (while stalled; with stall_with_eio, failed so far);
  // AwaitHeld waits until at least `n` do.
  int Held() const;
  bool AwaitHeld(int n, std::chrono::milliseconds timeout) const;
  // Unmounts, and says how many opens of files and of directories waited at once at most.
  struct Peaks {
    int files = 0;
    int dirs = 0;
  };
  Peaks Unmount();

 private:
  std::string mountpoint_;
  std::unique_ptr<Subprocess> delayfs_;
};

}  // namespace ringloader::testing
