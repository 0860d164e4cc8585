// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/sample_task.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace ringloader::pipeline {
namespace {

// How much of a file is read to find its header before the rest (JPEG headers with EXIF, ICC
// and thumbnails usually end well before this).
constexpr uint64_t kHeaderPeekBytes = 64 << 10;

// Every sample error names its file: observers may return statuses that do not.
absl::Status NamingPath(const absl::Status& status, const std::string& path) {
  if (absl::StartsWith(status.message(), path)) return status;
  absl::Status named(status.code(), absl::StrCat(path, ": ", status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { named.SetPayload(url, payload); });
  return named;
}

// A step called in a state it does not belong to: a bug in Fill, not in the data.
void Expect(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

std::string_view SampleTaskStateName(SampleTask::State state) {
  switch (state) {
    case SampleTask::State::kReading:
      return "reading";
    case SampleTask::State::kFailed:
      return "failed";
    case SampleTask::State::kRead:
      return "read";
    case SampleTask::State::kCommitted:
      return "committed";
    case SampleTask::State::kDone:
      return "done";
    case SampleTask::State::kAbandoned:
      return "abandoned";
  }
  return "unknown";
}

SampleTask::SampleTask(SampleJob job, TaskGate& gate)
    : job_(std::move(job)), gate_(gate), where_(job_.dataset->AbsolutePath(job_.index)) {
  gate_.Checkpoint();  // from here on only our copies are touched until the commit
}

SampleTask::~SampleTask() { GiveBackReadAhead(); }

SampleTask::State SampleTask::Run(const SampleOutput& out, const Worker& worker) {
  // What the decode thread waited for I/O: the open (or the read ahead) and the image's bytes,
  // not the memory wait between them (doctor must not blame the storage for memory_limit).
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  if (Open()) {
    std::chrono::nanoseconds waited = Clock::now() - started;
    if (DrawMemory()) {
      const auto reading = Clock::now();
      if (ReadBytes() && job_.observer != nullptr) {
        waited += Clock::now() - reading;
        job_.observer->AfterRead(*job_.dataset, job_.index, waited);
      }
    }
  }
  if (state_ == State::kAbandoned || !Commit()) return state_;
  Complete(out, worker);
  return state_;
}

bool SampleTask::CheckNotAbandoned() {
  if (!gate_.Abandoned()) return true;
  state_ = State::kAbandoned;
  return false;
}

bool SampleTask::Fail(absl::Status status) {
  if (!CheckNotAbandoned()) return false;
  status_ = NamingPath(status, where_);
  state_ = State::kFailed;
  return false;
}

bool SampleTask::Open() {
  Expect(state_ == State::kReading && !reader_);
  if (job_.prefetched != nullptr) {
    // Read ahead maybe before the sample was quarantined: asked again at its turn, so a
    // quarantined sample whose read hangs is not waited for again.
    if (job_.observer != nullptr) {
      if (absl::Status refused = job_.observer->Refused(*job_.dataset, job_.index); !refused.ok()) {
        return Fail(std::move(refused));
      }
    }
    // A read still queued (behind other streams' reads) is not waited for: the deadline is for
    // reading. One that has started is: a read stuck on a dead mount is this sample's deadline.
    PrefetchedSample& read = *job_.prefetched;
    if (read.index() == job_.index && !read.TryCancel()) {
      const bool done = read.WaitDone([&] { return gate_.Abandoned(); });
      if (!CheckNotAbandoned()) return false;
      if (done) {
        if (!read.status().ok()) return Fail(read.status());
        std::optional<SampleReader> reader = read.TakeReader();
        if (!reader) return Fail(absl::InternalError("read ahead: taken twice"));  // a bug
        reader_.emplace(*std::move(reader));
        // The bytes, unless memory was short or a decode took them back: read below then.
        if (std::optional<PrefetchedSample::Bytes> bytes = read.TakeBytes()) {
          image_ = std::move(bytes->image);
          rest_.emplace(std::move(bytes->rest));
          read_ahead_hold_ = bytes->hold;
        }
        return true;
      }
    }
    // Never started: read it here.
  }
  if (job_.observer != nullptr) {
    if (absl::Status refused = job_.observer->BeforeRead(*job_.dataset, job_.index);
        !refused.ok()) {
      return Fail(std::move(refused));
    }
  }
  if (!CheckNotAbandoned()) return false;
  absl::StatusOr<SampleReader> reader =
      SampleReader::Open(*job_.dataset, job_.index, job_.limits.max_file_bytes, job_.io_retry);
  if (!CheckNotAbandoned()) return false;
  if (!reader.ok()) return Fail(reader.status());
  reader_.emplace(*std::move(reader));
  return true;
}

bool SampleTask::DrawMemory() {
  Expect(state_ == State::kReading && reader_);
  if (job_.memory == nullptr) return true;
  const Dataset& dataset = *job_.dataset;
  const bool decodes = dataset.has_images() && !job_.cached;
  // The label and tensors, unless read ahead, are read into the task's own buffers (the batch is
  // written only after the commit).
  uint64_t need = rest_ ? 0 : RestBytes(dataset);
  image::DecodePlan plan;
  if (decodes) {
    bool whole = false;
    std::span<const uint8_t> head;
    absl::StatusOr<std::vector<uint8_t>> peeked;
    if (image_) {
      // Read ahead (its bytes are held already): the very peek ReadImageHead would have made,
      // the image's part of its record's first kHeaderPeekBytes, so that the plan (and whether
      // the sample is too large) never depends on whether memory allowed the read-ahead.
      const uint64_t offset = image_->offset;
      const uint64_t size = image_->size;
      head = offset >= kHeaderPeekBytes
                 ? std::span<const uint8_t>()
                 : image_->image().first(std::min<uint64_t>(size, kHeaderPeekBytes - offset));
      whole = offset + size <= kHeaderPeekBytes;
    } else {
      peeked = reader_->ReadImageHead(kHeaderPeekBytes, &whole);
      if (!CheckNotAbandoned()) return false;
      if (!peeked.ok()) return Fail(peeked.status());
      head = *peeked;
    }
    absl::StatusOr<image::DecodePlan> planned =
        head.empty()
            ? image::SampleDecoder::WorstCasePlan(job_.limits, job_.transform)
            : image::SampleDecoder::PlanFromHeader(head, where_, job_.limits, job_.transform);
    if (!planned.ok()) {
      // Only a header cut off by the end of the peek (huge metadata) earns the benefit of the
      // doubt: assume the worst it may hold. Any other header error is final.
      if (whole || image::ErrorReason(planned.status()) != "truncated") {
        return Fail(planned.status());
      }
      planned = image::SampleDecoder::WorstCasePlan(job_.limits, job_.transform);
    }
    plan = *planned;
    need += (image_ ? 0 : reader_->read_bytes()) + plan.bytes();
  }
  if (need == 0) return true;
  if (!gate_.BeginWait()) {
    state_ = State::kAbandoned;
    return false;
  }
  const auto waited_from = std::chrono::steady_clock::now();
  absl::Status granted;
  bool drawn_at_once = false;
  if (read_ahead_hold_ != 0) {
    drawn_at_once = job_.memory->TryAcquire(need);
    if (!drawn_at_once) {
      // Waiting with bytes pinned could wait for ever: with every decode thread waiting so,
      // each holding bytes nobody may evict, no draw ever ends. They go back, and are waited
      // for with the rest (and read again below, from the open file).
      if (image_ && decodes) need += reader_->read_bytes();
      if (rest_) need += RestBytes(dataset);
      image_.reset();
      rest_.reset();
      GiveBackReadAhead();
    }
  }
  if (!drawn_at_once) granted = job_.memory->Acquire(need);
  if (granted.ok()) {
    gate_.SetDrawn(need);  // whoever abandons us gives it back
    drawn_ = need;
    libjpeg_cap_ = plan.libjpeg_bytes;
  }
  gate_.EndWait();
  memory_wait_ns_ = (std::chrono::steady_clock::now() - waited_from).count();
  if (!granted.ok()) return Fail(image::WithReason(std::move(granted), "too_large"));
  return true;
}

bool SampleTask::ReadBytes() {
  Expect(state_ == State::kReading && reader_);
  const Dataset& dataset = *job_.dataset;
  // Abandoned while reading: the draw is the abandoner's to give back, so it is forgotten.
  const auto abandoned = [&] {
    if (!gate_.Abandoned()) return false;
    drawn_ = 0;
    state_ = State::kAbandoned;
    return true;
  };
  const auto failed = [&](const absl::Status& status) {
    status_ = NamingPath(status, where_);
    state_ = State::kFailed;
    return false;
  };
  if (dataset.has_images() && !job_.cached && !image_) {
    absl::StatusOr<ImageBytes> image = reader_->ReadImage();
    if (abandoned()) return false;
    if (!image.ok()) return failed(image.status());
    image_.emplace(*std::move(image));
  }
  if (HasRest(dataset) && !rest_) {
    absl::StatusOr<SampleRest> rest = reader_->ReadRest();
    if (abandoned()) return false;
    if (!rest.ok()) return failed(rest.status());
    rest_.emplace(*std::move(rest));
  }
  state_ = State::kRead;
  return true;
}

bool SampleTask::Commit() {
  Expect(state_ == State::kRead || state_ == State::kFailed);
  if (!gate_.Commit()) {
    drawn_ = 0;  // the abandoner gives it back
    state_ = State::kAbandoned;
    return false;
  }
  state_ = State::kCommitted;
  return true;
}

void SampleTask::Complete(const SampleOutput& out, const Worker& worker) {
  Expect(state_ == State::kCommitted);
  absl::Status status = status_;
  if (status.ok()) status = Decode(out, worker);
  image_.reset();  // the file's bytes go before the draw
  rest_.reset();
  GiveBackReadAhead();
  GiveBackMemory();
  if (!status.ok()) *out.status = NamingPath(status, where_);
  status_ = std::move(status);
  state_ = State::kDone;
}

absl::Status SampleTask::Decode(const SampleOutput& out, const Worker& worker) {
  const Dataset& dataset = *job_.dataset;
  // The observer watches everything after the commit: no deadline can abandon the task any
  // more. Nothing is read here (the label and tensors were, before the commit).
  absl::Status status;
  const bool observed = job_.observer != nullptr;
  if (observed) status = job_.observer->BeforeDecode(dataset, job_.index, worker.id);
  if (status.ok() && rest_) {
    if (dataset.has_labels()) *out.label = rest_->label;
    for (uint32_t t = 0; t < out.tensors.size(); ++t) {
      const std::span<const uint8_t> tensor = rest_->tensor(dataset, t);
      std::copy(tensor.begin(), tensor.end(), out.tensors[t].begin());
      out.rows[t] = rest_->rows[t];
    }
  }
  if (status.ok() && job_.cached) {
    if (!job_.cache->Lookup(job_.cache_key, job_.index, out.image)) {  // never evicted
      status = absl::InternalError("sample cache: an entry it held is gone");
    }
  } else if (status.ok() && dataset.has_images()) {
    image::SampleDecoder& decoder = worker.decoder;
    decoder.set_limits(job_.limits);
    decoder.set_memory_cap(libjpeg_cap_);
    decoder.set_deadline(job_.decode_deadline.count() > 0
                             ? std::chrono::steady_clock::now() + job_.decode_deadline
                             : std::chrono::steady_clock::time_point::max());
    image::SampleRng rng(job_.seed, job_.epoch, job_.index);
    status = decoder.DecodeInto(image_->image(), where_, job_.transform, rng, out.image);
    if (status.ok() && job_.cache != nullptr) {
      job_.cache->Insert(job_.cache_key, job_.index, out.image);
    }
  }
  if (observed) job_.observer->AfterDecode(dataset, job_.index, worker.id);
  return status;
}

void SampleTask::GiveBackReadAhead() {
  if (read_ahead_hold_ != 0) job_.memory->ReleaseReadAhead(read_ahead_hold_);
  read_ahead_hold_ = 0;
}

void SampleTask::GiveBackMemory() {
  if (drawn_ > 0) job_.memory->Release(drawn_);
  drawn_ = 0;
}

}  // namespace ringloader::pipeline
