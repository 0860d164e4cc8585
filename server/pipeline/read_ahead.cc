// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/read_ahead.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <vector>

#include "server/image/sample_decoder.h"
#include "server/image/splitmix64.h"
#include "server/pipeline/remote_decode.h"
#include "shm/base/clock.h"

namespace ringloader::pipeline {
namespace {

// Whether a read's outcome is the storage's answer: a success or the sample's own error (not
// found, corrupt, too large); not a transient error (EIO: the storage failing), nor retries of
// them that ran out (io_error).
bool StorageAnswered(const absl::Status& status) {
  return status.ok() || (!image::IsTransient(status) && image::ErrorReason(status) != "io_error");
}

}  // namespace

PrefetchedSample::~PrefetchedSample() {
  std::optional<Bytes> bytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bytes.swap(bytes_);
  }
  if (bytes && bytes->hold != 0) memory_->ReleaseReadAhead(bytes->hold);
  ReleaseFile();  // its reader (and file) went with it, or to its task's end
}

void PrefetchedSample::ReleaseFile() {
  if (FileBudget* file = file_.exchange(nullptr)) {
    file->Give();
    if (stream_files_ != nullptr) stream_files_->fetch_sub(1);
  }
}

PrefetchedSample::State PrefetchedSample::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_;
}

void PrefetchedSample::SetStarted(int64_t ns) {
  std::lock_guard<std::mutex> lock(mu_);
  started_ns_ = ns;
}

int64_t PrefetchedSample::started_ns() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_ns_;
}

bool PrefetchedSample::WaitSettledUntil(std::chrono::steady_clock::time_point until) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_until(lock, until, [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return state_ == State::kDone || state_ == State::kCancelled;
  });
}

std::optional<PrefetchedSample::Bytes> PrefetchedSample::TakeBytes() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!bytes_) return std::nullopt;
  if (bytes_->hold != 0 && !memory_->Pin(bytes_->hold)) return std::nullopt;  // being evicted
  std::optional<Bytes> bytes;
  bytes.swap(bytes_);
  return bytes;
}

bool PrefetchedSample::HoldsBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return state_ == State::kDone && bytes_.has_value();
}

void PrefetchedSample::Evict() {
  std::lock_guard<std::mutex> lock(mu_);
  bytes_.reset();  // the evictor gives the bytes back
}

bool PrefetchedSample::TryCancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kQueued) return state_ == State::kCancelled;
    state_ = State::kCancelled;
  }
  cv_.notify_all();
  return true;
}

bool PrefetchedSample::WaitDone(const std::function<bool()>& give_up) {
  std::unique_lock<std::mutex> lock(mu_);
  while (state_ == State::kQueued || state_ == State::kRunning) {
    if (give_up()) return false;
    cv_.wait_for(lock, std::chrono::milliseconds(10));
  }
  return state_ == State::kDone;
}

ReadPool::Answer PrefetchedSample::Read(SampleObserver* observer, uint64_t max_file_bytes,
                                        std::chrono::milliseconds io_retry, Memory memory,
                                        std::function<bool(int64_t since_ns)> witness) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_ != State::kQueued) return ReadPool::Answer::kNone;  // cancelled
    state_ = State::kRunning;
    started_ns_ = base::SteadyNowNs();
  }
  absl::Status status;
  if (observer != nullptr) status = observer->BeforeRead(dataset_, index_);
  // Refused unread (quarantined): no answer from the storage, so no witness that it answers.
  bool asked_storage = false;
  if (status.ok()) {
    absl::StatusOr<SampleReader> reader = SampleReader::Open(
        dataset_, index_, max_file_bytes, io_retry, std::move(witness), &asked_storage);
    if (reader.ok()) {
      reader_.emplace(*std::move(reader));
    } else {
      status = reader.status();
    }
  }
  if (status.ok() && memory_ != nullptr) status = ReadBytes(memory);
  if (reader_ && reader_->asked_storage()) asked_storage = true;  // an arrays column's open
  if (!status.ok()) reader_.reset();
  ReadPool::Answer answer = ReadPool::Answer::kNone;
  if (asked_storage && StorageAnswered(status)) {
    answer = ReadPool::Answer::kAnswered;
  } else if (status.ok()) {
    answer = ReadPool::Answer::kUnconfirmed;
  }
  if (read_ns_ != nullptr) {
    read_ns_->fetch_add(static_cast<uint64_t>(std::max<int64_t>(0, base::SteadyNowNs() - started_ns())));
  }
  status_ = std::move(status);
  {
    std::lock_guard<std::mutex> lock(mu_);
    state_ = State::kDone;
  }
  cv_.notify_all();
  return answer;
}

absl::Status PrefetchedSample::ReadBytes(Memory memory) {
  // The bytes only with memory to spare (never what a decode waits for, and evicted when one
  // would wait); otherwise the open file alone is what the task saves. A re-read waits for it.
  const uint64_t need = (dataset_.has_images() ? reader_->read_bytes() : 0) + RestBytes(dataset_);
  Bytes bytes;
  if (need != 0) {
    if (memory == Memory::kWaitFor) {
      // Waiting for memory is not reading: Judge must not take it for a read that hangs.
      SetStarted(0);
      bytes.hold = memory_->AcquireReadAhead(need);
      SetStarted(base::SteadyNowNs());
      if (bytes.hold == 0) return absl::OkStatus();  // above memory_limit: the task says so
    } else if ((bytes.hold = memory_->TryAcquireReadAhead(need)) == 0) {
      return absl::OkStatus();
    }
  }
  absl::Status status;
  if (dataset_.has_images()) {
    absl::StatusOr<ImageBytes> image = reader_->ReadImage();
    if (image.ok()) {
      bytes.image.emplace(*std::move(image));
    } else {
      status = image.status();  // the sample's error, as the task's own read would have given
    }
  }
  if (status.ok() && HasRest(dataset_)) {
    absl::StatusOr<SampleRest> rest = reader_->ReadRest();
    if (rest.ok()) {
      bytes.rest = *std::move(rest);
    } else {
      status = rest.status();
    }
  }
  if (!status.ok()) {
    if (bytes.hold != 0) memory_->ReleaseReadAhead(bytes.hold);
    return status;
  }
  const uint64_t hold = bytes.hold;
  {
    std::lock_guard<std::mutex> lock(mu_);
    bytes_.emplace(std::move(bytes));
  }
  // A re-read's bytes too may be evicted for a decode that waits (the batch's next wave may be
  // that decode's; kept, they could wait for each other for ever): its task then reads them on
  // its decode thread, and if that meets the deadline again while the storage is stalled, the
  // sample is read again on the lane (BatchFiller), not struck.
  if (hold != 0) {
    memory_->ArmEviction(hold, [weak = weak_from_this()] {
      if (std::shared_ptr<PrefetchedSample> self = weak.lock()) self->Evict();
    });
  }
  return absl::OkStatus();
}

std::function<bool(uint64_t attempt)> SampleProbe(const Dataset& dataset) {
  return [ds = &dataset](uint64_t attempt) {
    if (ds->size() == 0) return false;
    // Spread over the dataset: a probe after one that met a failing file is unlikely to meet
    // that file's neighbours (a bad directory, a bad shard's range).
    const uint64_t index = image::SplitMix64Mix(attempt + 1) % ds->size();
    // The file a fresh open of which asks the storage: a shard or column file ("FILE#MEMBER")
    // is kept open by the dataset, so opening the sample through it may ask nothing. No retries,
    // no blocking on a FIFO: the answer is what counts, and a bad file is an answer too, an EIO
    // (or running out of descriptors) is not.
    std::string path = ds->AbsolutePath(index);
    if (ds->spec().format != DatasetFormat::kImageFolder &&
        ds->spec().format != DatasetFormat::kManifest) {
      path.resize(std::min(path.size(), path.find('#')));
    }
    const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
      ::close(fd);
      return true;
    }
    return !image::IsTransientErrno(errno);
  };
}

ReadAhead::ReadAhead(ReadPool& pool, uint64_t window, DecodeMemory* memory,
                     SampleObserver* observer, std::chrono::milliseconds io_retry,
                     FileBudget* files, uint64_t max_files)
    : pool_(pool),
      window_(std::max<uint64_t>(window, 1)),
      memory_(memory),
      observer_(observer),
      io_retry_(io_retry),
      files_(files),
      max_files_(max_files) {}

ReadAhead::~ReadAhead() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, read] : reads_) read->Cancel();
  reads_.clear();
}

void ReadAhead::DropBefore(Key key) {
  while (!reads_.empty() && reads_.begin()->first < key) {
    reads_.begin()->second->Cancel();
    reads_.erase(reads_.begin());
  }
}

void ReadAhead::Advance(const Dataset& dataset, const EpochShard& shard, uint64_t epoch,
                        uint64_t cursor, uint64_t end_epoch, uint64_t max_file_bytes,
                        SampleCache* cache, const std::string& cache_key) {
  std::lock_guard<std::mutex> lock(mu_);
  dataset_ = &dataset;  // (a stream reads one dataset)
  // The stream's own shard of `epoch` from now on; one built here for it already gave the same
  // order (the reads started from it stand).
  if (next_shard_ != nullptr && next_shard_->spec().epoch <= epoch) next_shard_.reset();
  shard_ = &shard;
  epoch_ = epoch;
  end_epoch_ = end_epoch;
  max_file_bytes_ = max_file_bytes;
  cache_ = cache;
  cache_key_ = cache_key;
  const Key at{epoch, cursor};
  cursor_ = at;
  DropBefore(at);  // positions the stream went past (skipped, or it reopened elsewhere)
  if (next_ < at) next_ = at;
  StartMore();
}

void ReadAhead::ExpectElsewhere(uint64_t round_size, uint64_t tail) {
  std::lock_guard<std::mutex> lock(mu_);
  round_size_ = round_size;
  elsewhere_tail_ = std::min(tail, round_size);
}

bool ReadAhead::LikelyElsewhere(Key key) const {
  if (round_size_ == 0 || elsewhere_tail_ == 0) return false;
  const uint64_t first = key.first == cursor_.first ? cursor_.second : 0;
  if (key.second < first) return false;
  // All of a round elsewhere (server.local_decode = false): nothing read. Else a margin of
  // positions next to the local part is read anyway.
  const uint64_t margin =
      elsewhere_tail_ == round_size_ ? 0 : std::max<uint64_t>(2, round_size_ / 16);
  if (elsewhere_tail_ <= margin) return false;
  return (key.second - first) % round_size_ >= round_size_ - (elsewhere_tail_ - margin);
}

uint64_t ReadAhead::PastCursor(Key key) {
  if (key.first == cursor_.first) {
    return key.second >= cursor_.second ? key.second - cursor_.second : 0;
  }
  const EpochShard* shard = ShardOf(cursor_.first);
  if (key.first != cursor_.first + 1 || shard == nullptr) return UINT64_MAX;
  return shard->size() - std::min<uint64_t>(cursor_.second, shard->size()) + key.second;
}

std::shared_ptr<PrefetchedSample> ReadAhead::Take(uint64_t epoch, uint64_t pos) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reads_.find({epoch, pos});
  if (it == reads_.end()) return nullptr;
  std::shared_ptr<PrefetchedSample> read = std::move(it->second);
  reads_.erase(it);
  if (shard_ != nullptr) StartMore();
  return read;
}

std::shared_ptr<PrefetchedSample> ReadAhead::TakeIfDone(uint64_t epoch, uint64_t pos) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = reads_.find({epoch, pos});
    if (it == reads_.end() || !it->second->HoldsBytes()) return nullptr;
  }
  return Take(epoch, pos);  // (only this stream's producer takes: it is still there)
}

std::optional<uint64_t> ReadAhead::IndexAt(uint64_t epoch, uint64_t pos) {
  std::lock_guard<std::mutex> lock(mu_);
  const EpochShard* shard = shard_ != nullptr ? ShardOf(epoch) : nullptr;
  if (shard == nullptr || pos >= shard->size()) return std::nullopt;
  return shard->at(pos);
}

void ReadAhead::WriteOff(PrefetchedSample& sample) {
  if (!sample.running()) return;
  pool_.WriteOff(sample.read_id());
  sample.ReleaseFile();
}

ReadPool::Verdict ReadAhead::Judge(const PrefetchedSample& sample,
                                   std::chrono::milliseconds deadline) {
  const int64_t started = sample.started_ns();
  if (started == 0 || !sample.running()) return ReadPool::Verdict::kWait;
  return pool_.Judge(started, deadline);
}

std::shared_ptr<PrefetchedSample> ReadAhead::StartNow(uint64_t index,
                                                      PrefetchedSample::Memory memory) {
  std::lock_guard<std::mutex> lock(mu_);
  if (dataset_ == nullptr || index >= dataset_->size()) return nullptr;
  std::shared_ptr<PrefetchedSample> read = Submit(index, memory);
  if (read != nullptr) ++started_;
  return read;
}

std::shared_ptr<PrefetchedSample> ReadAhead::Submit(uint64_t index,
                                                    PrefetchedSample::Memory memory) {
  if (files_ != nullptr) {
    if (max_files_ != 0 && files_held_->load() >= max_files_) return nullptr;
    if (!files_->TryTake()) return nullptr;
    files_held_->fetch_add(1);
  }
  // It gives the file back at its end (also when not submitted).
  auto read = std::make_shared<PrefetchedSample>(*dataset_, index, memory_, files_,
                                                 files_ != nullptr ? files_held_ : nullptr,
                                                 read_ns_);
  // The lane's thread holds the read alive; the task may have taken and dropped it already.
  const uint64_t id = pool_.Submit(
      [read, observer = observer_, max = max_file_bytes_, io_retry = io_retry_, memory,
       witness = pool_.Witness()] { return read->Read(observer, max, io_retry, memory, witness); });
  if (id == 0) return nullptr;
  read->set_read_id(id);
  return read;
}

uint64_t ReadAhead::started() const {
  std::lock_guard<std::mutex> lock(mu_);
  return started_;
}

const EpochShard* ReadAhead::ShardOf(uint64_t epoch) {
  if (epoch == epoch_) return shard_;
  if (epoch != epoch_ + 1 || (end_epoch_ != 0 && epoch >= end_epoch_)) return nullptr;
  if (next_shard_ == nullptr) {
    ShardSpec spec = shard_->spec();
    spec.epoch = epoch;
    next_shard_ = std::make_unique<EpochShard>(dataset_->size(), spec);
  }
  return next_shard_.get();
}

void ReadAhead::StartMore() {
  const bool images = dataset_->has_images();
  // Guessed-away positions are passed for good: not further past the cursor than the reads
  // ahead reach, so that when the guess changes (the feeders failed) they pick up from there.
  // That is a window; or, when rounds have a local part, as far as the filler decodes those
  // ahead while its feeders are late, if further (with only a window, a host waiting for a
  // late answer ran out of samples read and idled, 4-10% of its core).
  const bool decodes_ahead = elsewhere_tail_ < round_size_;
  const uint64_t reach =
      decodes_ahead ? std::max<uint64_t>(window_, (kDecodeAheadRounds + 1) * round_size_)
                    : window_;
  // Positions looked at per call, read or not (cached samples are skipped): bounded work.
  for (uint64_t looked = 0; reads_.size() < window_ && looked < 4 * window_; ++looked) {
    const EpochShard* shard = ShardOf(next_.first);
    if (shard == nullptr) return;  // the stream's end, or more than an epoch ahead
    if (next_.second >= shard->size()) {
      next_ = {next_.first + 1, 0};
      continue;
    }
    const Key key = next_;
    const uint64_t index = shard->at(key.second);
    const bool elsewhere = LikelyElsewhere(key);
    if (elsewhere && PastCursor(key) >= reach) return;
    if (index >= dataset_->size() || elsewhere ||  // Fill refuses the batch itself
        (cache_ != nullptr && images && cache_->Holds(cache_key_, index))) {
      ++next_.second;
      continue;
    }
    // No file left: this position is tried again on the next Advance or Take.
    std::shared_ptr<PrefetchedSample> read = Submit(index, PrefetchedSample::Memory::kSpare);
    if (read == nullptr) return;
    ++next_.second;
    reads_.emplace(key, std::move(read));
    ++started_;
  }
}

}  // namespace ringloader::pipeline
