// SPDX-License-Identifier: Apache-2.0
#pragma once
// One open stream: its shared-memory ring and the producer thread that fills it.
//
// The producer fills batches ring_sequence = 0, 1, 2, ... each into whichever slot is FREE
// (round robin among them), so it decodes ahead exactly as far as the ring allows (backpressure:
// a slow reader costs its ring and nothing more), and a slot the client holds never makes it
// wait while another is free. Next() leases batches in sequence order. A client that would hold
// too many slots copies batches out of the ring (client/held_batches.h) and releases them.
// Positions advance batch by batch: (epoch, sequence, cursor) -> the handle's `next`.
//
// End of epoch: exactly one batch per epoch carries last_in_epoch, and its `next` is the next
// epoch's start. When the rest of the shard after a batch cannot make another one (nothing left,
// or with drop_last fewer than batch_size samples) it is marked at once. When the rest is short
// (under two batches) but might still yield one, the batch is kept unpublished as the look-ahead
// until the next one is filled (near the end of an epoch only): an empty or dropped next batch
// makes it the last. Only if the client waits for the look-ahead while holding every other slot
// does it go out unmarked (no deadlock); the epoch's end then shows as the next epoch's first
// batch. The hand-over and its states are BatchSchedule's (batch_schedule.h).
//
// Thread-safety: thread-safe. One NextBatch call at a time per stream (a second concurrent call
// is refused with FailedPrecondition).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "proto/ringloader.pb.h"
#include "server/daemon/batch_schedule.h"
#include "server/daemon/daemon_stats.h"
#include "server/daemon/memory_budget.h"
#include "server/daemon/sample_gate.h"
#include "server/daemon/trainer_clock.h"
#include "server/image/transform.h"
#include "server/pipeline/batch_filler.h"
#include "server/pipeline/remote_decode.h"
#include "server/pipeline/dataset.h"
#include "server/pipeline/epoch_progress.h"
#include "server/pipeline/read_ahead.h"
#include "shm/ring.h"

namespace ringloader::server {

class FeederPool;

struct StreamSetup {
  uint64_t id = 0;
  uint64_t incarnation = 0;
  std::string client_name;
  std::string client_key;  // ClientKeyOfPeer() of the opening call; empty = not counted per client
  std::string session_id;  // the client's session (StreamManager); empty = none
  std::string token;       // OpenStreamResponse.stream_token: every call must carry it
  std::string open_id;     // OpenStreamRequest.open_id; empty = unnamed
  v1::StreamSpec spec;  // validated and normalised (world_size >= 1, ring_slots set, ...)
  const pipeline::Dataset* dataset = nullptr;
  pipeline::OnError on_error = pipeline::OnError::kSkip;
  image::DecodeLimits limits;  // the dataset's max_pixels, max_file_bytes, warnings, scans
  image::TransformSpec transform;
  // Set when the stream's samples may come from the eval cache (an eval stream of a dataset with
  // cache = "memory"): the cache's key for (dataset, transform). Empty = no cache.
  std::string cache_key;
  pipeline::BatchLayout layout;
  v1::Position start;
  // The progress the epoch start.epoch continues after (resume_position.h); empty = all of it.
  pipeline::EpochProgress start_progress;
};

// What the stream needs from the daemon; all outlive the stream.
struct StreamDeps {
  pipeline::BatchFiller* filler;
  pipeline::SampleObserver* observer;
  DaemonStats* stats;
  const Failpoints* failpoints;
  pipeline::SampleCache* cache = nullptr;  // used when setup.cache_key is set
  // Reads ahead of the decodes (server.io_depth); null = none. With it, what read-ahead bytes
  // are drawn from, and how long a read's transient errors are retried.
  pipeline::ReadPool* read_pool = nullptr;
  pipeline::DecodeMemory* memory = nullptr;
  std::chrono::milliseconds io_retry{30'000};
  // The files reads ahead may hold, shared by all streams (null: no limit), and this stream's
  // window (reads started ahead, not yet taken; 0 = the lane's depth).
  pipeline::FileBudget* files = nullptr;
  uint64_t read_window = 0;
  uint64_t max_files = 0;  // of `files`, what this stream may hold (0 = no cap of its own)
  FeederPool* feeders = nullptr;  // [[feeders]]: part of each round decoded there; null = none
};

class Stream {
 public:
  Stream(StreamSetup setup, std::unique_ptr<shm::ProducerRing> ring, Reservation reservation,
         StreamDeps deps);
  ~Stream();  // Stop()
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void Start();
  // Stops the producer (after the batch it is filling) and wakes waiters. Idempotent.
  void Stop();

  // Leases the next batch into out->batch, or sets out->pending (nothing within `wait`) or
  // out->end_of_stream. DataLoss when on_error = "fail" and a sample failed (after the batches
  // before it were delivered). ResourceExhausted when the client holds every slot.
  // `cancelled` (may be empty) is polled while waiting: once true, the call ends at once
  // (Cancelled), so an abandoned call frees its handler.
  // `trainer`: the time the client reports with the call (TrainerClock); null = none.
  absl::Status Next(absl::Duration wait, v1::NextBatchResponse* out,
                    const std::function<bool()>& cancelled = {},
                    const TrainerReport* trainer = nullptr);
  // LEASED -> FREE for a handle of this stream. FailedPrecondition for a double or stale release.
  // `copied_out`: the client keeps the batch in private memory (counted in stats).
  absl::Status Release(uint32_t slot, uint64_t ring_sequence, bool copied_out = false);

  uint64_t id() const { return setup_.id; }
  const std::string& segment_name() const { return ring_->name(); }
  const shm::ProducerRing& ring() const { return *ring_; }
  // The producer's state machine (tests force interleavings through it).
  const BatchSchedule& schedule() const { return schedule_; }
  const StreamSetup& setup() const { return setup_; }
  // Time of the last request naming this stream (for the idle reaper); now while a NextBatch call
  // is waiting, so a client is never reaped in the middle of its own request.
  std::chrono::steady_clock::time_point last_activity() const;
  void Touch();
  void FillStats(v1::StreamStats* out) const;

 private:
  // A filled, not yet published batch.
  struct Filled {
    uint32_t slot = 0;
    uint64_t seq = 0;
    v1::Position pos;
    pipeline::FilledBatch batch;
  };
  // The producer thread's own bookkeeping (never shared with other threads).
  struct ProducerCursor {
    v1::Position next;  // where the next batch to fill starts
    // The epoch began at cursor 0 in this stream and has yielded this many batches (published or
    // dropped). An epoch from its start that yields none means no sample of the shard decodes.
    bool epoch_from_start = false;
    uint64_t batches_this_epoch = 0;
    std::unique_ptr<pipeline::EpochShard> shard;  // of the epoch last filled
    std::optional<Filled> look_ahead;  // kept unpublished by BatchSchedule's look-ahead rule
  };
  void ProducerLoop();
  // The fill of one batch into the slot `step` gave, and what follows from it.
  void FillStep(ProducerCursor& cursor, const BatchSchedule::Step& step);
  // What a filled batch's `next` is: the next epoch's start for the epoch's last batch.
  v1::BatchHandle HandleOf(const Filled& f, bool last) const;
  // Publishes `f` (BatchSchedule::PublishLookAhead when it is cursor.look_ahead, which it then
  // clears; else Publish) and moves the cursor's epoch accounting on.
  void PublishFilled(ProducerCursor& cursor, Filled& f, bool last, bool look_ahead);
  // The shard of epoch `epoch`, made when the epoch changes.
  const pipeline::EpochShard& ShardOf(ProducerCursor& cursor, uint64_t epoch) const;
  // The rest of cursor.next's epoch yields nothing: on to the next epoch's start (true), or End()
  // the stream when the whole epoch yielded no batch (false).
  bool FinishEpoch(ProducerCursor& cursor);
  // Counts the batch's skipped samples and logs each bad file once; those not logged one by one
  // (past a batch's kept errors or the daemon's remembered files) are summed per epoch and said
  // in one line when the epoch changes (and when the stream stops).
  void RecordSkipped(const pipeline::FilledBatch& filled, uint64_t epoch);
  void SayUnlogged();
  v1::BatchHandle MakeHandle(uint32_t slot, uint64_t ring_sequence, const v1::Position& position,
                             const v1::Position& next, const pipeline::FilledBatch& filled,
                             bool last_in_epoch, std::span<const uint8_t> payload) const;

  const StreamSetup setup_;
  const std::unique_ptr<shm::ProducerRing> ring_;
  const Reservation reservation_;
  const StreamDeps deps_;
  // This stream's reads ahead (null without a read pool); used by the producer's fills only.
  const std::unique_ptr<pipeline::ReadAhead> read_ahead_;
  const std::unique_ptr<pipeline::RemoteDecode> remote_;  // null without feeders
  BatchSchedule schedule_;  // the producer's state and the hand-over to NextBatch
  std::thread producer_;
  // Bad samples skipped without a line each (RecordSkipped), by reason, in epoch
  // unlogged_epoch_; the producer's only.
  std::map<std::string, uint64_t> unlogged_;
  uint64_t unlogged_epoch_ = 0;
  std::atomic<int64_t> last_activity_ns_;
  std::atomic<bool> in_next_{false};  // a NextBatch call is in progress
  // Whether its trainer is input-bound: the client's reports and the producer's busy time.
  TrainerClock trainer_clock_;
  std::atomic<uint64_t> samples_served_{0};
  std::atomic<uint64_t> samples_skipped_{0};
  uint64_t read_ahead_ns_seen_ = 0;  // read_ahead_->read_ns() at the last fill (the producer's)
};

}  // namespace ringloader::server
