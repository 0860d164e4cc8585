// SPDX-License-Identifier: Apache-2.0
#pragma once
// A read lane: the threads that only read one dataset's storage. They open samples' files and
// read their bytes ahead of the decode threads (ReadAhead), so that a slow filesystem (a network
// mount: NFS, Lustre, s3fs, gcsfuse cost milliseconds per open) has many reads in flight instead
// of one per decode thread. The daemon gives each dataset a lane of its own: a mount that stops
// answering holds its lane's threads, never the decode threads nor another dataset's reads.
//
// Up to `depth` reads run at once, in submission order (streams' reads interleave as they come).
// A read its consumer judged poison (below) keeps its thread; WriteOff() lets one more thread run
// until it ends, so the lane keeps `depth` reads moving. At most kMaxStuck reads are written off
// at once (past that a stuck read keeps its place). Nothing waits for a busy thread: Shutdown()
// (and the destructor) drop what is queued and leave busy threads to the kernel.
//
// Poison or outage (Judge): a read running past its deadline is either poison (that one file
// hangs: strike it, skip it) or the storage is not answering at all (an outage: wait, strike
// nothing). The lane tells them apart by a witness: the overdue read is poison only when an
// operation that *started after it became overdue* got an answer from the storage (another read,
// or a probe the lane starts for the purpose: LaneOptions::probe). Until then it waits; when the
// probe itself goes unanswered for the probe timeout, the lane is *stalled*. The first answer
// after a stall resumes it, and every read in flight then counts its deadline afresh from that
// moment (the outage was not their fault). A storage that answers every request with an error
// (EIO) answers nothing either: only a success or a sample's own error (not found, corrupt, ...)
// is an answer, and a read retrying such errors waits the outage out (Witness()). Nor does a
// read that asked the storage nothing it had to answer itself: one served through a shard kept
// open may have come from the kernel's page cache while the mount is gone (Answer::kUnconfirmed).
//
// Thread-safety: every method may be called from any thread.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace ringloader::pipeline {

struct LaneOptions {
  // Touches the storage the way a read does (opens one of the dataset's samples; `attempt`
  // picks which, so a probe stuck on one bad file is followed by one on another), on a thread of
  // its own; returns whether it got an answer from the storage (false: it could not ask).
  // Null: no probes (an overdue read is poison only when another read witnesses; reads through
  // files kept open never do, nor end a stall). The daemon's is SampleProbe.
  std::function<bool(uint64_t attempt)> probe;
  // The lane became stalled (true) or answers again (false; `stalled_for` how long it did not).
  // Called without the lane's lock, from the thread that saw the change.
  std::function<void(bool stalled, std::chrono::milliseconds stalled_for)> on_stall_change;
};

class ReadPool {
 public:
  // Reads written off (judged poison, maybe stuck for good) at once, at most.
  static constexpr uint64_t kMaxStuck = 1024;
  // Probes left unanswered at once, at most (each holds a thread).
  static constexpr uint32_t kMaxProbes = 4;

  // REQUIRES: depth >= 1.
  explicit ReadPool(uint32_t depth, LaneOptions options = {});
  ~ReadPool();
  ReadPool(const ReadPool&) = delete;
  ReadPool& operator=(const ReadPool&) = delete;

  uint32_t depth() const;
  // What a read learnt of the storage.
  enum class Answer {
    kNone,      // nothing: it did not ask (cancelled, refused), or met transient errors (EIO)
    kAnswered,  // the storage answered a request (an open): a success or the sample's own error
    // A success that needed no request the storage had to answer (every byte through a file
    // kept open, maybe the kernel's cached pages): no witness, though it may have been one (its
    // pages were not all cached). On a stalled lane it starts a probe (one a second while
    // probes go unanswered), so that the storage's return is seen without waiting for a Judge.
    kUnconfirmed,
  };
  // Queues `read`; a lane thread runs it. Returns the read's id (never 0), or 0 (and `read`
  // dropped) after Shutdown(). `read` must not throw.
  uint64_t Submit(std::function<Answer()> read);
  // Read `id` was given up on by its consumer (it may be stuck for good): while it runs, one more
  // thread may run. Nothing for a read that is not running.
  void WriteOff(uint64_t id);
  // Reads written off and still running now.
  uint64_t written_off() const;
  // Reads running now (stuck ones included) and queued.
  uint64_t running() const;
  uint64_t queued() const;
  // Drops queued reads; threads exit as they finish. Irreversible.
  void Shutdown();
  // Waits up to `timeout` until no read or probe runs; false when some still do.
  bool WaitIdle(std::chrono::milliseconds timeout);

  // ---- poison or outage ----
  enum class Verdict { kWait, kPoison };
  // A consumer waits for a read that started at `started_ns` (base::SteadyNowNs) and is still
  // running; `deadline` is how long a read may take. kPoison once the read is overdue and the
  // storage answered something that started after that; kWait otherwise (not overdue yet, or no
  // witness: a probe is started). Cheap: call it as often as the wait polls.
  Verdict Judge(int64_t started_ns, std::chrono::milliseconds deadline);
  // How long an unanswered probe takes to make the lane stalled: `deadline`, at most 2 s.
  static std::chrono::milliseconds ProbeTimeout(std::chrono::milliseconds deadline);

  // For a read that keeps failing with a transient error (EIO, ESTALE: a soft mount whose
  // server is gone answers every request so): did the storage answer an operation that started
  // at or after `since_ns` (when the read's previous attempt began)? When not, the failure is the
  // storage's, not the sample's (IoRetryBudget does not count it against the sample), and a
  // probe is started unless one is running, so that a file failing alone on a working storage
  // is told apart even when nothing else reads: its next failure has the probe's answer as a
  // witness. The function holds the lane weakly (true once it is gone).
  std::function<bool(int64_t since_ns)> Witness() const;

  struct Health {
    bool stalled = false;
    std::chrono::milliseconds stalled_for{0};  // of the current stall
    uint64_t stalls = 0;                       // stalls so far (a counter: only grows)
    uint64_t running = 0;                      // reads running now (while stalled: waiting)
    uint64_t stuck = 0;                        // written off and running now
  };
  Health health() const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace ringloader::pipeline
