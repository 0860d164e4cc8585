// SPDX-License-Identifier: Apache-2.0
#pragma once
// Threads that only read: they open samples' files and read their bytes ahead of the decode
// threads (ReadAhead), so that a slow filesystem (a network mount: NFS, Lustre, s3fs, gcsfuse
// cost milliseconds per open) has many reads in flight instead of one per decode thread.
//
// Up to `depth` reads run at once, in submission order (streams' reads interleave as they come).
// A read stuck on a dead mount keeps its thread; once its sample's consumer has given up on it
// (its decode deadline), WriteOff() lets one more thread run, so the pool keeps `depth` reads
// moving. At most kMaxWrittenOff threads are ever written off. Nothing waits for a busy thread:
// Shutdown() (and the destructor) drop what is queued and leave busy threads to the kernel.
//
// Thread-safety: every method may be called from any thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>

namespace ringloader::pipeline {

class ReadPool {
 public:
  static constexpr uint64_t kMaxWrittenOff = 1024;

  // REQUIRES: depth >= 1.
  explicit ReadPool(uint32_t depth);
  ~ReadPool();
  ReadPool(const ReadPool&) = delete;
  ReadPool& operator=(const ReadPool&) = delete;

  uint32_t depth() const;
  // Queues `read`; a pool thread runs it. False (and `read` dropped) after Shutdown().
  // `read` must not throw.
  bool Submit(std::function<void()> read);
  // A read its consumer gave up on (it may be stuck for good): one more thread may run.
  void WriteOff();
  uint64_t written_off() const;
  // Reads running now (stuck ones included) and queued.
  uint64_t running() const;
  uint64_t queued() const;
  // Drops queued reads; threads exit as they finish. Irreversible.
  void Shutdown();
  // Waits up to `timeout` until no read runs; false when some still do (stuck, or slow).
  bool WaitIdle(std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace ringloader::pipeline
