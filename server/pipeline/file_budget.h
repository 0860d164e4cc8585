// SPDX-License-Identifier: Apache-2.0
#pragma once
// FileBudget: how many files the reads ahead of every dataset may hold open at once, so that
// read-ahead (max_streams x io_depth files when every stream reads ahead) never runs the
// process into RLIMIT_NOFILE: there EMFILE would fail reads (retried, then skipped as io_error)
// and refuse clients' connections. The daemon sizes it from the limit, after a reserve for
// everything else (server/daemon/open_files.h).
//
// A read ahead takes a file before it starts and gives it back when its sample is done with the
// file (PrefetchedSample's end). One started for the window (TryTake) is not started when none is
// left: the window shrinks and the batch starts the read when it needs it (TryTake again, in its
// wait loop, as other samples give theirs back).
//
// Thread-safety: thread-safe (atomics).

#include <atomic>
#include <cstdint>

namespace ringloader::pipeline {

class FileBudget {
 public:
  // REQUIRES: files >= 1.
  explicit FileBudget(uint64_t files) : limit_(files) {}
  FileBudget(const FileBudget&) = delete;
  FileBudget& operator=(const FileBudget&) = delete;

  // One file, if one is left.
  bool TryTake();
  void Give();

  uint64_t limit() const { return limit_; }
  uint64_t held() const { return held_.load(); }
  uint64_t peak() const { return peak_.load(); }
  uint64_t refused() const { return refused_.load(); }  // TryTakes that found none left

 private:
  const uint64_t limit_;
  std::atomic<uint64_t> held_{0};
  std::atomic<uint64_t> peak_{0};
  std::atomic<uint64_t> refused_{0};
};

}  // namespace ringloader::pipeline
