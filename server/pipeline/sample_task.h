// SPDX-License-Identifier: Apache-2.0
#pragma once
// SampleTask: one sample of a batch being filled (BatchFiller::Fill), on a WorkerPool thread, as
// the state machine it is.
//
// Its first part, reading (everything the sample needs from storage: image, label, tensors),
// may be abandoned at the decode deadline (a read stuck on a dead mount)
// while the Fill call goes on without it, and its thread may wake up any time later, after Fill
// has returned: so it runs on copies only (SampleJob) and never touches the caller's data. Its
// second part, writing into the batch, runs only once it has committed (TaskGate::Commit), after
// which nothing abandons it.
//
//   kReading ─Open, DrawMemory, ReadBytes─► kRead ─Commit─► kCommitted ─Complete─► kDone
//   kReading ─DrawMemory waits for memory_limit (the deadline paused meanwhile; bytes read ahead
//             are given back first and read again after: a wait never pins memory)─► kReading
//   kReading ─a step fails (the file, its header, memory refused)─► kFailed
//   kFailed ─Commit─► kCommitted ─Complete (writes the error only)─► kDone
//   kReading, kFailed, kRead ─the gate says abandoned─► kAbandoned: return at once
//
// Memory drawn for the decode is handed to the gate (SetDrawn) while it may still be abandoned,
// so whoever abandons the task gives it back; a task that completes gives it back itself.
//
// Thread-safety: one thread runs a task; a task is not shared.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/image/sample_decoder.h"
#include "server/image/transform.h"
#include "server/pipeline/batch_filler.h"
#include "server/pipeline/dataset.h"
#include "server/pipeline/read_ahead.h"
#include "server/pipeline/sample_reader.h"
#include "server/pipeline/worker_pool.h"

namespace ringloader::pipeline {

// What a task reads with, copied from its Fill call (which may be gone by the time it wakes up).
struct SampleJob {
  const Dataset* dataset = nullptr;  // outlives every task (the daemon owns it)
  uint64_t index = 0;
  image::DecodeLimits limits;
  image::TransformSpec transform;
  uint64_t seed = 0;
  uint64_t epoch = 0;
  DecodeMemory* memory = nullptr;      // null = unaccounted; outlives every task
  SampleObserver* observer = nullptr;  // may be null; outlives every task
  std::chrono::milliseconds io_retry{30'000};
  std::chrono::milliseconds decode_deadline{0};  // 0 = none
  SampleCache* cache = nullptr;  // set when the image may come from (and go to) the eval cache
  std::string cache_key;
  bool cached = false;  // the cache holds this sample: it is neither read nor decoded
  // The stream's read of this sample, started ahead (ReadAhead::Take); null = read it here.
  std::shared_ptr<PrefetchedSample> prefetched;
};

// Where a committed task writes: the caller's memory, valid until its Fill call returns, so
// touched only after Commit().
struct SampleOutput {
  absl::Status* status = nullptr;           // left OK for a good sample
  int64_t* label = nullptr;                 // -1 stays for a dataset without labels
  std::span<uint64_t> rows;                 // one per dataset tensor: its first-dimension length
  std::span<uint8_t> image;                 // empty for a dataset without images
  std::vector<std::span<uint8_t>> tensors;  // one per dataset tensor
};

// The worker thread a task runs on: its id and its decoder (used only after the commit).
struct Worker {
  uint32_t id = 0;
  image::SampleDecoder& decoder;
};

class SampleTask {
 public:
  enum class State { kReading, kFailed, kRead, kCommitted, kDone, kAbandoned };

  // Takes its copies and tells the gate (Checkpoint) that it may be abandoned from now on.
  SampleTask(SampleJob job, TaskGate& gate);
  ~SampleTask();  // gives back bytes it took from a read ahead (also when abandoned)

  // Every step in order; returns kDone or kAbandoned.
  State Run(const SampleOutput& out, const Worker& worker);

  // ---- the steps (Run calls them; tests call them one at a time) ----
  // kReading: the observer's BeforeRead, then the sample's file (or record) opened; or, with a
  // read started ahead (job.prefetched), its result taken once done (its wait is abandonable
  // like the read). False when it ended the reading (kFailed or kAbandoned).
  bool Open();
  // kReading: peeks at the image's header and draws what its decode needs from job.memory
  // (with the bytes of its label and tensors unless read ahead), waiting for it with the
  // deadline paused. Nothing to do without accounting. False when it ended the reading.
  bool DrawMemory();
  // kReading -> kRead: the image's bytes (none for a dataset without images or a cached
  // sample), its label and its tensors, unless read ahead. A failed read still goes to kFailed
  // and is committed.
  bool ReadBytes();
  // kRead or kFailed -> kCommitted; kAbandoned when the gate says the caller gave up.
  bool Commit();
  // kCommitted -> kDone: the label, the extra tensors, the image (decoded or from the cache)
  // into `out`, or the error into *out.status; gives back the memory drawn. Reads nothing.
  void Complete(const SampleOutput& out, const Worker& worker);

  State state() const { return state_; }
  uint64_t drawn() const { return drawn_; }
  // How long DrawMemory waited for memory_limit.
  int64_t memory_wait_ns() const { return memory_wait_ns_; }
  const absl::Status& status() const { return status_; }

 private:
  // Ends the reading with `status` (kFailed), or in kAbandoned when the gate says so first.
  bool Fail(absl::Status status);
  bool CheckNotAbandoned();
  void GiveBackMemory();
  void GiveBackReadAhead();
  absl::Status Decode(const SampleOutput& out, const Worker& worker);

  const SampleJob job_;
  TaskGate& gate_;
  const std::string where_;  // the sample's path, as its errors start
  State state_ = State::kReading;
  absl::Status status_;  // why it failed (kFailed, and after Complete)
  std::optional<SampleReader> reader_;
  std::optional<ImageBytes> image_;
  std::optional<SampleRest> rest_;
  uint64_t drawn_ = 0;        // bytes of job.memory this task holds
  int64_t memory_wait_ns_ = 0;
  uint64_t libjpeg_cap_ = 0;  // of the plan: given to the decoder once committed
  // job.memory's read-ahead hold for image_ and rest_, when they came from a read ahead; 0 = none.
  uint64_t read_ahead_hold_ = 0;
};

std::string_view SampleTaskStateName(SampleTask::State state);

}  // namespace ringloader::pipeline
