// SPDX-License-Identifier: Apache-2.0
#pragma once
// Fills one batch of a stream straight into its destination buffer (a ring slot's payload).
//
// A batch is the first `batch_size` *good* samples of the rank's shard starting at `cursor`, in
// shard order. Samples are decoded in parallel on the WorkerPool, each directly into its place;
// when a sample fails (on_error = skip) the good ones after it are moved down and the next samples
// of the shard fill the tail. Which samples fail depends only on the files, so the result is a pure
// function of (dataset, spec, seed, epoch, rank, cursor) whatever the thread count.
//
// Payload layout of a batch: a list of named tensors, each starting 256-byte aligned (what
// TensorFlow and SIMD code want), in this order:
//   images  : batch_size x SampleBytes()   (NHWC uint8 / NCHW float32 ...; absent for arrays)
//   labels  : int64[batch_size]            (-1 for a dataset without labels)
//   indices : int64[batch_size]            (dataset sample indices)
//   NAME    : batch_size x the dataset's extra tensor NAME (Dataset::tensors(), by name)
//   NAME_lengths : int64[batch_size]       (each ragged tensor's rows per sample)
// Only the first `count` entries of each are meaningful; the rest are zero.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/image/sample_decoder.h"
#include "server/image/transform.h"
#include "server/pipeline/dataset.h"
#include "server/pipeline/remote_decode.h"
#include "server/pipeline/sampler.h"
#include "server/pipeline/worker_pool.h"

namespace ringloader::pipeline {

// One tensor of a batch.
struct TensorPlacement {
  std::string name;
  NpyType type = NpyType::kUint8;
  std::vector<uint64_t> sample_shape;  // one sample's; the batch's is [batch_size] + this
  uint64_t sample_bytes = 0;
  uint64_t offset = 0;  // in the payload; a multiple of kTensorAlign
  uint64_t bytes = 0;   // batch_size * sample_bytes
};

inline constexpr uint64_t kTensorAlign = 256;

struct BatchLayout {
  std::vector<TensorPlacement> tensors;  // in payload order (see the top of this file)
  // Shortcuts into `tensors` (images_bytes 0 when the dataset has no images).
  uint64_t images_offset = 0;
  uint64_t images_bytes = 0;  // for batch_size samples
  uint64_t labels_offset = 0;
  uint64_t indices_offset = 0;
  uint64_t total_bytes = 0;  // what a slot must hold
  const TensorPlacement* Find(std::string_view name) const;
};
// `dataset` null: images, labels and indices only (an image dataset without extra tensors).
BatchLayout ComputeBatchLayout(uint32_t batch_size, const image::TransformSpec& spec,
                               const Dataset* dataset = nullptr);

enum class OnError { kSkip, kFail };

struct SampleError {
  uint64_t sample_index;
  std::string relative_path;
  std::string reason;   // image::ErrorReason
  std::string message;  // full message, starting with the path
};

struct FilledBatch {
  // Skipped samples kept whole (path and message) per batch: a shard of 50,000 empty members
  // between two good samples costs counts, not 50,000 messages outside memory_limit.
  static constexpr size_t kMaxErrorsKept = 64;

  uint32_t count = 0;        // good samples written (< batch_size only at the end of the shard)
  uint64_t next_cursor = 0;  // shard position after the last sample consumed (good or bad)
  // The first kMaxErrorsKept samples skipped in this batch, in shard order.
  std::vector<SampleError> errors;
  // Every sample skipped in this batch, counted by reason (`errors` among them).
  std::map<std::string, uint64_t> skipped_by_reason;
  uint64_t skipped() const;
  // Where the fill's time went, on its own thread: waiting for reads not done yet (read-ahead
  // that did not keep up), and running the decode threads' tasks, split into their waits for
  // memory_limit and the rest (reads on decode threads, decode and augmentation).
  int64_t read_wait_ns = 0;
  int64_t memory_wait_ns = 0;
  int64_t decode_ns = 0;
  // Samples of the batch decoded elsewhere (FillRequest::remote), and how long this thread
  // waited for their calls once its own decodes were done.
  uint32_t remote_samples = 0;
  int64_t remote_wait_ns = 0;
  // Samples of the batch decoded here ahead of their round, while an earlier round waited for
  // its calls (not in remote_samples).
  uint32_t ahead_samples = 0;
};

// Hooks the daemon uses around each decode (in-flight records for crash strikes, quarantine,
// failpoints). Called on worker threads; must be thread-safe and must not throw.
class SampleObserver {
 public:
  virtual ~SampleObserver() = default;
  // Before the file is opened: a non-OK status fails the sample unread (quarantined: a sample
  // whose read hangs must not be read again). Failpoints that stand in for a stuck read act here.
  // Default: read it.
  virtual absl::Status BeforeRead(const Dataset& dataset, uint64_t sample_index) {
    (void)dataset;
    (void)sample_index;
    return absl::OkStatus();
  }
  // Whether the sample is refused now (quarantined), without reading or blocking: a task whose
  // read was started ahead asks again at its turn (the quarantine may have grown meanwhile).
  // Default: never.
  virtual absl::Status Refused(const Dataset& dataset, uint64_t sample_index) {
    (void)dataset;
    (void)sample_index;
    return absl::OkStatus();
  }
  // The sample's reading is done (its file open, its image in memory): `waited` is how long its
  // decode thread spent on it, waiting for I/O (near 0 when the read-ahead kept up).
  virtual void AfterRead(const Dataset& dataset, uint64_t sample_index,
                         std::chrono::nanoseconds waited) {
    (void)dataset;
    (void)sample_index;
    (void)waited;
  }
  // After the image is read (the task committed), before its label, extra tensors and decode.
  // A non-OK status skips the sample with that error (e.g. quarantined).
  virtual absl::Status BeforeDecode(const Dataset& dataset, uint64_t sample_index,
                                    uint32_t worker_id) = 0;
  // After the sample is done, whatever the outcome; called exactly when BeforeDecode was.
  virtual void AfterDecode(const Dataset& dataset, uint64_t sample_index, uint32_t worker_id) = 0;
  // The decode deadline abandoned the sample (its read or decode stuck past it), from the
  // thread that fills the batch. Default: nothing.
  virtual void OnAbandoned(const Dataset& dataset, uint64_t sample_index) {
    (void)dataset;
    (void)sample_index;
  }
};

// Where the memory a sample decode needs comes from (the daemon's memory_limit). Thread-safe.
class DecodeMemory {
 public:
  virtual ~DecodeMemory() = default;
  // Blocks until `bytes` are granted; ResourceExhausted (naming the sizes) when they never can be.
  virtual absl::Status Acquire(uint64_t bytes) = 0;
  // `bytes` at once (evicting read-ahead bytes if that makes room) or not at all: false when
  // they would wait. Default: never at once.
  virtual bool TryAcquire(uint64_t bytes) {
    (void)bytes;
    return false;
  }
  virtual void Release(uint64_t bytes) = 0;
  // Bytes read ahead (ReadAhead), outside the decodes' queue: a hold granted at once or not
  // at all (id 0), and only while no Acquire waits. Default: never (the rest is then unused).
  virtual uint64_t TryAcquireReadAhead(uint64_t bytes) {
    (void)bytes;
    return 0;
  }
  // The same, waiting for the bytes in the decodes' queue as Acquire does (a sample read again
  // because its read on a decode thread met the deadline: its bytes must be read on the lane),
  // and not bound to half the limit; 0 when they never fit. Default: never.
  virtual uint64_t AcquireReadAhead(uint64_t bytes) {
    (void)bytes;
    return 0;
  }
  // From now on an Acquire that would otherwise wait may take hold `id` back, calling `evict`
  // (on its own thread, no lock held) to free its bytes: read-ahead never keeps a decode waiting.
  virtual void ArmEviction(uint64_t id, std::function<void()> evict) {
    (void)id;
    (void)evict;
  }
  // Hold `id` can no longer be evicted (a decode uses its bytes); false when it was already
  // (its `evict` runs or ran).
  virtual bool Pin(uint64_t id) {
    (void)id;
    return false;
  }
  // Gives hold `id` back, unless it was evicted.
  virtual void ReleaseReadAhead(uint64_t id) { (void)id; }
};

// Outputs of deterministic transforms (eval: resize + center crop) kept across epochs and
// streams: a sample's image bytes depend only on (dataset, sample, transform), so a later epoch,
// or another stream with the same options, copies them instead of reading and decoding again.
// Entries are never evicted (a full cache keeps what it holds and takes no more), so an entry
// Contains() reports stays there. Thread-safe.
class SampleCache {
 public:
  virtual ~SampleCache() = default;
  // Whether the sample is cached, counted as the sample's hit or miss.
  virtual bool Contains(const std::string& key, uint64_t sample_index) = 0;
  // The same, not counted (the read-ahead's look ahead of the sample's turn).
  virtual bool Holds(const std::string& key, uint64_t sample_index) const = 0;
  // Copies the cached image bytes into `out`; false when not cached (or of another size).
  virtual bool Lookup(const std::string& key, uint64_t sample_index, std::span<uint8_t> out) = 0;
  // Offers a freshly decoded sample; kept if it fits the cache's share of memory_limit.
  virtual void Insert(const std::string& key, uint64_t sample_index,
                      std::span<const uint8_t> image) = 0;
};

class ReadAhead;

struct FillRequest {
  const Dataset* dataset = nullptr;
  const EpochShard* shard = nullptr;
  uint64_t cursor = 0;  // shard position to start at
  uint32_t batch_size = 0;
  image::TransformSpec transform;
  OnError on_error = OnError::kSkip;
  uint64_t seed = 0;  // per-sample randomness is SampleRng(seed, epoch, sample_index)
  uint64_t epoch = 0;
  // Decode limits of this dataset (max_pixels, max_file_bytes, warnings, scans); unset = the
  // limits the BatchFiller was built with.
  std::optional<image::DecodeLimits> limits;
  // Set for streams whose samples may come from (and go to) a cache: eval transforms of a
  // dataset with cache = "memory". `cache_key` names the dataset and every transform setting.
  SampleCache* cache = nullptr;
  std::string cache_key;
  // The stream's reads ahead (read_ahead.h); null = each sample is read by its decode thread.
  ReadAhead* read_ahead = nullptr;
  uint64_t end_epoch = 0;  // the stream's: reads ahead stop before it (0 = never ends)
  // Polled while the batch waits for its reads (a stalled storage may keep it waiting for
  // ever): once true, Fill returns Cancelled. Empty = never.
  std::function<bool()> stop;
  // Where some of each round's samples may be decoded instead (remote_decode.h); null = here.
  RemoteDecode* remote = nullptr;
};

// How a BatchFiller reads and decodes, beyond the per-dataset limits.
struct FillerOptions {
  // Each sample draws its file bytes plus its decode plan (from its header) from here before it
  // reads the file, and gives them back after decoding. nullptr = unaccounted.
  DecodeMemory* memory = nullptr;
  // A sample whose read takes longer than this is abandoned (a read ahead: only while the
  // storage answers other reads, see ReadPool::Judge; one on a decode thread: its thread is
  // replaced), one whose decode does is stopped; either fails with reason "deadline_exceeded".
  // 0 = no deadline.
  std::chrono::milliseconds deadline{0};
  // How long a read that fails with an I/O error that may pass (EIO, EMFILE, ENOMEM, ...) is
  // retried before the sample fails as "io_error" (server.io_retry_ms). See SampleReader.
  std::chrono::milliseconds io_retry{30'000};
};

// One per daemon: owns the per-worker SampleDecoders.
class BatchFiller {
 public:
  BatchFiller(WorkerPool& pool, image::DecodeLimits limits, FillerOptions options = {});
  ~BatchFiller();

  // Writes the batch into `dest` (REQUIRES: dest.size() >= ComputeBatchLayout(batch_size,
  // transform, dataset).total_bytes).
  // With on_error = kFail the first failure (in shard order) is returned as DataLoss naming the
  // file (its image::ErrorReason kept). `observer` may be null. Thread-safe: many streams may fill
  // concurrently.
  // Details: each round decodes only the samples still missing, so next_cursor is exact (with
  // `remote`, a round whose calls are late may decode samples of the rounds to come: kept for
  // them, they change nothing a batch holds); a short batch (end of shard) has the unused tail of its images, labels
  // and indices zeroed, so the whole buffer is deterministic; cursor == shard size gives count 0.
  // Errors: InvalidArgument for a null dataset/shard, batch_size or image_size 0, a too small
  // `dest` or a shard built for a bigger dataset; OutOfRange for cursor > shard size.
  // REQUIRES: not called from a WorkerPool task.
  absl::StatusOr<FilledBatch> Fill(const FillRequest& request, std::span<uint8_t> dest,
                                   SampleObserver* observer);

 private:
  struct Assembly;
  // One round: each sample still missing is a pipeline::SampleTask (sample_task.h) on the pool,
  // decoding straight into its slot; statuses, labels and row counts go into `batch`. With
  // read-ahead, this thread waits for the samples' reads (their lane judges a read overdue as
  // poison or as the storage's outage) and hands the decode threads only samples already read,
  // in waves as their reads end. Cancelled when request.stop says so while it waits.
  absl::Status DecodeRound(Assembly& batch, SampleObserver* observer);
  // The round's samples `which` (round positions), decoded on this host: in waves as their reads
  // end with read-ahead, else all at once.
  absl::Status LocalWaves(Assembly& batch, const std::vector<uint64_t>& which,
                          SampleObserver* observer);
  // Claims the calls started ahead for the round's samples, leases the rest of its share from the
  // round's tail (never a refused, cached or repeated sample), and starts the next round's tail
  // ahead; `leased[i]` says which of the round's samples went out.
  std::vector<std::unique_ptr<RemoteCall>> StartRemote(Assembly& batch, SampleObserver* observer,
                                                       std::vector<bool>& leased);
  // A round to come, as it would be if no sample failed: its shard positions from `first`.
  struct RoundAhead {
    uint64_t epoch;
    uint64_t first;
    std::vector<uint64_t> indices;  // dataset indices at first, first + 1, ...
  };
  // The `rounds` rounds after this one, of `round_size` samples each, on into the next epoch (its
  // shard as the read-ahead builds it).
  std::vector<RoundAhead> NextRounds(const Assembly& batch, uint64_t round_size, int rounds) const;
  // While some of `calls` are not answered, decodes samples of the rounds to come that no call
  // holds, a few at a time, and hands each few to the stream's RemoteDecode::Keep for their
  // round: this host's threads do not idle while a feeder is late. Only samples whose bytes are
  // read already (nothing here touches storage; without read-ahead, none), each few's buffer a
  // read-ahead hold of memory_limit (taken back by a decode that would wait).
  absl::Status DecodeAhead(
      Assembly& batch, const std::vector<std::unique_ptr<RemoteCall>>& calls,
      SampleObserver* observer);
  // Waits for the calls and copies each good sample they answered into its slot; returns the
  // round positions still to decode here (failed calls, samples not answered as good).
  // Cancelled when request.stop says so while it waits. `waited`: the time it waited for answers.
  absl::StatusOr<std::vector<uint64_t>> CollectRemote(Assembly& batch,
                                      std::vector<std::unique_ptr<RemoteCall>>& calls,
                                      const std::vector<bool>& leased,
                                      std::chrono::nanoseconds& waited);
  // The tasks of samples `which` (round positions), on the pool; returns when all are done.
  // Its time goes into the batch's decode_ns and memory_wait_ns.
  void RunTasks(Assembly& batch, const std::vector<uint64_t>& which, SampleObserver* observer);
  // Sample `i`'s read was judged poison: the sample fails as past its deadline, struck.
  void GiveUpRead(Assembly& batch, uint64_t i, SampleObserver* observer);
  // Moves the round's good samples down in shard order and writes their labels, indices and
  // lengths; records the bad ones (DataLoss for the first with on_error = fail).
  absl::Status CompactRound(Assembly& batch, FilledBatch& filled);

  WorkerPool& pool_;
  const image::DecodeLimits default_limits_;
  const FillerOptions options_;
  std::vector<std::unique_ptr<image::SampleDecoder>> decoders_;  // one per worker id
};

}  // namespace ringloader::pipeline
