// SPDX-License-Identifier: Apache-2.0
#pragma once
// ReadAhead: one stream's reads, started ahead of its decodes (issue 29: data on a network mount).
//
// A stream's future order is known (its shard is a pure function of seed and epoch), so while its
// samples are decoded, the next ones are opened and read on the ReadPool, in that order and on
// across epoch boundaries: up to `window` reads outstanding (started, not yet taken). A sample's
// SampleTask then finds its file open and (memory permitting) its bytes in memory (Take): its
// image, label and extra tensors, instead of paying the mount's latency on a decode thread.
//
// Memory: the bytes a read holds are drawn from DecodeMemory::TryAcquire, which grants them only
// while no decode waits and some of memory_limit stays free for decodes; refused, the read keeps
// just the open file and the task reads the bytes itself. So read-ahead shrinks under memory
// pressure and never takes memory a decode needs. The bytes go back when the sample is done.
//
// Guarantees are the task's: what a sample reads, when it fails and why is decided exactly as
// without read-ahead (the same SampleReader calls, the observer's BeforeRead first). The batch
// waits for its reads on the filling thread, never on a decode thread; it gives one up only
// when the lane judges it poison (Judge: the storage answers others while it hangs), and
// WriteOff() then gives the lane another thread. Nothing here decides which samples a batch has.
//
// Thread-safety: Advance, Take, TakeIfDone and StartNow from the stream's producer; the rest from
// anywhere.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "server/image/sample_decoder.h"
#include "server/pipeline/batch_filler.h"
#include "server/pipeline/dataset.h"
#include "server/pipeline/file_budget.h"
#include "server/pipeline/read_pool.h"
#include "server/pipeline/sample_reader.h"
#include "server/pipeline/sampler.h"

namespace ringloader::pipeline {

// One sample read ahead. Written once by a ReadPool thread, then read by the one task that took
// it. Gives its memory back when the last reference goes.
//
//   kQueued ─Read starts─► kRunning ─its read ends─► kDone
//   kQueued ─TryCancel / Cancel─► kCancelled   (never runs; WaitDone returns false)
class PrefetchedSample : public std::enable_shared_from_this<PrefetchedSample> {
 public:
  enum class State { kQueued, kRunning, kDone, kCancelled };

  // `file`: the FileBudget it took a file from, given back at its end (null: none taken), and
  // `stream_files` the count of its stream's files, taken off then too (may be null).
  // `read_ns` (may be null): where the time its reading took is added, its stream's.
  PrefetchedSample(const Dataset& dataset, uint64_t index, DecodeMemory* memory,
                   FileBudget* file = nullptr,
                   std::shared_ptr<std::atomic<uint64_t>> stream_files = nullptr,
                   std::shared_ptr<std::atomic<uint64_t>> read_ns = nullptr)
      : dataset_(dataset),
        index_(index),
        memory_(memory),
        file_(file),
        stream_files_(std::move(stream_files)),
        read_ns_(std::move(read_ns)) {}
  ~PrefetchedSample();
  PrefetchedSample(const PrefetchedSample&) = delete;
  PrefetchedSample& operator=(const PrefetchedSample&) = delete;

  const Dataset& dataset() const { return dataset_; }
  uint64_t index() const { return index_; }
  State state() const;

  // kQueued -> kCancelled: true when it had not started (it never will). A task does this
  // rather than wait for a read still queued behind other streams' reads: its deadline is for
  // reading, not for queueing.
  bool TryCancel();
  // The same, for a read nobody will take (the stream moved past it); one running goes on.
  void Cancel() { TryCancel(); }
  // Waits until the read is done (true), `give_up()` (polled every few ms) says stop, or it was
  // cancelled (false).
  bool WaitDone(const std::function<bool()>& give_up);
  // Waits until the read is done or cancelled (true), or `until` passes (false).
  bool WaitSettledUntil(std::chrono::steady_clock::time_point until);
  bool done() const { return state() == State::kDone; }
  // Done, and its bytes still in memory (read, not evicted since): its task reads nothing.
  bool HoldsBytes() const;
  // Started and not finished: its thread may be stuck (see ReadAhead::WriteOff).
  bool running() const { return state() == State::kRunning; }
  // When it started running (base::SteadyNowNs); 0 before, and while it waits for memory.
  int64_t started_ns() const;
  // Gives its file back now (once): a read written off (maybe stuck for good) must not keep one.
  void ReleaseFile();
  // Its lane's id (ReadPool::Submit), for WriteOff.
  uint64_t read_id() const { return read_id_.load(); }
  void set_read_id(uint64_t id) { read_id_.store(id); }

  // After WaitDone: the read's result. OK with TakeReader() set (and the image when the bytes
  // were read), or the error the sample fails with.
  const absl::Status& status() const { return status_; }
  std::optional<SampleReader> TakeReader() { return std::move(reader_); }
  // The sample's bytes (its image and its rest: label, tensors), if they were read and not
  // evicted since (memory a decode needed), with the memory hold that counts them (0: none, for
  // a sample of no bytes): the caller's from then on, given back with
  // DecodeMemory::ReleaseReadAhead(hold) when it lets go of the bytes. Empty: the caller reads
  // them itself.
  struct Bytes {
    std::optional<ImageBytes> image;  // empty for a dataset without images
    SampleRest rest;
    uint64_t hold = 0;
  };
  std::optional<Bytes> TakeBytes();

  // How a read gets memory for the sample's bytes.
  enum class Memory {
    kSpare,    // only memory to spare (TryAcquireReadAhead): else the open file alone
    kWaitFor,  // waits for it as a decode does (AcquireReadAhead): a sample read again after its
               // task met its deadline on a decode thread, whose bytes must come from the lane
  };
  // The reading, on a ReadPool thread: BeforeRead, open, memory, the sample's bytes (image,
  // label, tensors). kNone when it got no answer from the storage (cancelled before it began,
  // refused unread, or transient errors to the end: an EIO is the storage failing, not
  // answering); kUnconfirmed for a success through a shard kept open (SampleReader::
  // asked_storage). `witness`: the lane's (ReadPool::Witness), for its retries.
  ReadPool::Answer Read(SampleObserver* observer, uint64_t max_file_bytes,
                        std::chrono::milliseconds io_retry, Memory memory = Memory::kSpare,
                        std::function<bool(int64_t since_ns)> witness = {});

 private:
  void Evict();  // DecodeMemory's eviction: drops the bytes (they are the budget's again)
  // The sample's bytes into bytes_, with their memory hold; the sample's error otherwise.
  absl::Status ReadBytes(Memory memory);
  void SetStarted(int64_t ns);

  const Dataset& dataset_;
  const uint64_t index_;
  DecodeMemory* const memory_;
  std::atomic<FileBudget*> file_;
  const std::shared_ptr<std::atomic<uint64_t>> stream_files_;
  const std::shared_ptr<std::atomic<uint64_t>> read_ns_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ ABSL_GUARDED_BY(mu_) = State::kQueued;
  int64_t started_ns_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> read_id_{0};  // set once, by ReadAhead right after it submits the read
  // Written by the reading thread before kDone; read by the taker after it.
  absl::Status status_;
  std::optional<SampleReader> reader_;
  std::optional<Bytes> bytes_ ABSL_GUARDED_BY(mu_);  // also cleared by Evict
};

// A read lane's probe (LaneOptions::probe) for `dataset`: opens one of its samples, spread over
// the dataset by `attempt` (so a probe stuck on one bad file is followed by one elsewhere).
// An open is a request the storage answers, except on a mount that opens from its attribute
// cache (NFS with `nocto`): there an outage can look like a bad file.
// REQUIRES: `dataset` outlives every probe.
std::function<bool(uint64_t attempt)> SampleProbe(const Dataset& dataset);

class ReadAhead {
 public:
  // `window`: reads started and not yet taken, at most (each holds an open file). `memory` may
  // be null (unaccounted: the bytes are never read ahead, only the files opened). `files` may be
  // null (no limit); else each read takes a file from it first, and is not started without one,
  // nor while this stream holds `max_files` (0 = no cap of its own: its share, so that streams
  // whose storage stalls cannot take every other stream's files).
  ReadAhead(ReadPool& pool, uint64_t window, DecodeMemory* memory, SampleObserver* observer,
            std::chrono::milliseconds io_retry, FileBudget* files = nullptr,
            uint64_t max_files = 0);
  // Queued reads are cancelled; reads in flight finish on their own, never waited for (one may
  // be stuck on a dead mount). REQUIRES: the dataset, observer and memory outlive them.
  ~ReadAhead();

  // The stream fills from shard position `cursor` of `shard` (epoch `epoch`) now: reads before
  // it are dropped, and reads are started in order from there, on into the following epochs'
  // shards (built here from `shard`'s spec, as the stream builds them) but not to `end_epoch`
  // (0 = never). `cache`/`cache_key`: samples the eval cache holds are not read. `shard` must
  // stay alive until the next Advance or the ReadAhead's end.
  void Advance(const Dataset& dataset, const EpochShard& shard, uint64_t epoch, uint64_t cursor,
               uint64_t end_epoch, uint64_t max_file_bytes, SampleCache* cache,
               const std::string& cache_key);
  // Of each round of `round_size` shard positions (from the latest Advance's cursor; in a later
  // epoch, from its start), the last `tail` are likely decoded elsewhere (leased to feeders:
  // remote_decode.h) and are not read ahead, but for a few next to the round's local part (the
  // share moves a little from round to round: max(2, round_size / 16)). A guess: a position
  // read after all (its call failed) is started at its turn (StartNow); positions are passed
  // over at most a window past the cursor (or, when rounds keep a local part, which the filler
  // decodes ahead while its feeders are late, kDecodeAheadRounds + 1 rounds, if further), so a
  // changed guess holds from there.
  // Without it every position was read, and a host with feeders read every file of the dataset.
  void ExpectElsewhere(uint64_t round_size, uint64_t tail);
  // The read of shard position `pos` of `epoch`, if one was started (then it is the caller's,
  // and another read may start); nullptr otherwise.
  std::shared_ptr<PrefetchedSample> Take(uint64_t epoch, uint64_t pos);
  // The same, only when that read is done and holds the sample's bytes (else it is left for the
  // position's turn): for a sample decoded ahead of its round, which must not touch storage.
  std::shared_ptr<PrefetchedSample> TakeIfDone(uint64_t epoch, uint64_t pos);
  // The dataset index at shard position `pos` of `epoch`: of the stream's shard, or the next
  // epoch's (built here, as for its reads); nullopt past either's end or the stream's.
  // REQUIRES: Advance was called.
  std::optional<uint64_t> IndexAt(uint64_t epoch, uint64_t pos);
  // A read of sample `index` outside the window (the batch needs it now and none was started, or
  // its task met its deadline reading on a decode thread: `memory` kWaitFor), submitted at once.
  // Null when no file is left (FileBudget: try again as others end) or the lane is shut down.
  // REQUIRES: Advance was called.
  std::shared_ptr<PrefetchedSample> StartNow(
      uint64_t index, PrefetchedSample::Memory memory = PrefetchedSample::Memory::kSpare);
  // The taker gave up on `sample` (its deadline), or was refused while it ran: a read that is
  // still running may be stuck, and another thread takes its place (and its file is given back).
  void WriteOff(PrefetchedSample& sample);
  // Whether the lane's storage is stalled now (ReadPool::health).
  bool StorageStalled() const { return pool_.health().stalled; }
  // Whether a taker waiting for `sample` should give up on it (poison) or wait (ReadPool::Judge;
  // kWait for a read still queued: the deadline is for reading, not for queueing).
  ReadPool::Verdict Judge(const PrefetchedSample& sample, std::chrono::milliseconds deadline);

  uint64_t started() const;  // reads started so far
  // The time this stream's reads have taken on the lane so far (done ahead of their decodes,
  // or waited for: FilledBatch::read_wait_ns says how long the batches waited).
  uint64_t read_ns() const { return read_ns_->load(); }

 private:
  using Key = std::pair<uint64_t, uint64_t>;  // (epoch, shard position)
  // Starts reads while fewer than `window_` are outstanding.
  void StartMore() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The shard of epoch `epoch` (the stream's, or the next one built here); null past the end.
  const EpochShard* ShardOf(uint64_t epoch) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropBefore(Key key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // ExpectElsewhere's guess for `key`.
  bool LikelyElsewhere(Key key) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Positions from the latest Advance's cursor to `key` (into the next epoch; UINT64_MAX past).
  uint64_t PastCursor(Key key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Submits the read of `index` to the lane; null when no file is left or it is shut down.
  std::shared_ptr<PrefetchedSample> Submit(uint64_t index, PrefetchedSample::Memory memory)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ReadPool& pool_;
  const uint64_t window_;
  DecodeMemory* const memory_;
  SampleObserver* const observer_;
  const std::chrono::milliseconds io_retry_;
  FileBudget* const files_;
  const uint64_t max_files_;
  const std::shared_ptr<std::atomic<uint64_t>> files_held_ =
      std::make_shared<std::atomic<uint64_t>>(0);  // this stream's, from files_
  const std::shared_ptr<std::atomic<uint64_t>> read_ns_ =
      std::make_shared<std::atomic<uint64_t>>(0);  // read_ns(), added to by its reads
  mutable std::mutex mu_;
  const Dataset* dataset_ ABSL_GUARDED_BY(mu_) = nullptr;
  const EpochShard* shard_ ABSL_GUARDED_BY(mu_) = nullptr;  // the stream's, of epoch_
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::unique_ptr<EpochShard> next_shard_ ABSL_GUARDED_BY(mu_);  // of epoch_ + 1, built here
  uint64_t end_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t max_file_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  SampleCache* cache_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::string cache_key_ ABSL_GUARDED_BY(mu_);
  Key next_ ABSL_GUARDED_BY(mu_){0, 0};    // the next position to start
  Key cursor_ ABSL_GUARDED_BY(mu_){0, 0};  // the latest Advance's: where rounds begin
  uint64_t round_size_ ABSL_GUARDED_BY(mu_) = 0;      // ExpectElsewhere's
  uint64_t elsewhere_tail_ ABSL_GUARDED_BY(mu_) = 0;  // ExpectElsewhere's
  std::map<Key, std::shared_ptr<PrefetchedSample>> reads_ ABSL_GUARDED_BY(mu_);
  uint64_t started_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace ringloader::pipeline
