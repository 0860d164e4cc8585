// SPDX-License-Identifier: Apache-2.0
#include "server/daemon/stream.h"

#include <pthread.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/wire_text.h"
#include "server/daemon/feeder_pool.h"
#include "server/pipeline/sampler.h"
#include "server/daemon/status_text.h"
#include "spdlog/spdlog.h"
#include "shm/base/clock.h"

namespace ringloader::server {
namespace {

v1::Position MakePosition(uint64_t epoch, uint64_t sequence, uint64_t cursor) {
  v1::Position p;
  p.set_epoch(epoch);
  p.set_sequence(sequence);
  p.set_cursor(cursor);
  return p;
}

}  // namespace

Stream::Stream(StreamSetup setup, std::unique_ptr<shm::ProducerRing> ring, Reservation reservation,
               StreamDeps deps)
    : setup_(std::move(setup)),
      ring_(std::move(ring)),
      reservation_(std::move(reservation)),
      deps_(deps),
      read_ahead_(deps.read_pool == nullptr
                      ? nullptr
                      // As many outstanding as the lane runs at once, or the stream's share of
                      // the open files: each holds one.
                      : std::make_unique<pipeline::ReadAhead>(
                            *deps.read_pool,
                            deps.read_window != 0 ? deps.read_window : deps.read_pool->depth(),
                            deps.memory, deps.observer, deps.io_retry, deps.files,
                            deps.max_files)),
      remote_(deps.feeders == nullptr
                  ? nullptr
                  : deps.feeders->ForStream(setup_.spec.dataset(), *setup_.dataset, setup_.spec,
                                            setup_.limits)),
      schedule_(setup_.id, *ring_, setup_.start),
      last_activity_ns_(base::SteadyNowNs()) {}

Stream::~Stream() { Stop(); }

void Stream::Start() {
  producer_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "rl-producer");  // else the gRPC thread's name
    ProducerLoop();
  });
}

void Stream::Stop() {
  schedule_.Stop();
  if (producer_.joinable()) {
    producer_.join();
    SayUnlogged();  // the producer is gone: its counts are ours
  }
}

std::chrono::steady_clock::time_point Stream::last_activity() const {
  if (in_next_.load(std::memory_order_relaxed)) return std::chrono::steady_clock::now();
  return std::chrono::steady_clock::time_point(
      std::chrono::nanoseconds(last_activity_ns_.load(std::memory_order_relaxed)));
}

void Stream::Touch() { last_activity_ns_.store(base::SteadyNowNs(), std::memory_order_relaxed); }

void Stream::ProducerLoop() {
  const v1::StreamSpec& spec = setup_.spec;
  ProducerCursor cursor;
  cursor.next = setup_.start;
  cursor.epoch_from_start = setup_.start.cursor() == 0 && setup_.start_progress.consumed() == 0;
  while (true) {
    if (!cursor.look_ahead) {  // decided without a slot: the stream's or the epoch's end
      if (spec.end_epoch() != 0 && cursor.next.epoch() >= spec.end_epoch()) {
        schedule_.End(absl::OkStatus());
      } else if (cursor.next.cursor() >= ShardOf(cursor, cursor.next.epoch()).size()) {
        if (FinishEpoch(cursor)) continue;  // else it ended the stream
      }
    }
    const BatchSchedule::Step step = schedule_.AwaitSlot();
    switch (step.kind) {
      case BatchSchedule::Step::kStop:
        return;
      case BatchSchedule::Step::kReleaseLookAhead:
        PublishFilled(cursor, *cursor.look_ahead, /*last=*/false, /*look_ahead=*/true);
        break;
      case BatchSchedule::Step::kFill:
        FillStep(cursor, step);
        break;
      case BatchSchedule::Step::kNotYet:
        break;  // AwaitSlot() without a deadline never says so
    }
  }
}

void Stream::FillStep(ProducerCursor& cursor, const BatchSchedule::Step& step) {
  // Where the step's time goes, for the trainer's figure: what Fill says, the rest is delivery.
  struct Account {
    TrainerClock& clock;
    const int64_t started = base::SteadyNowNs();
    int64_t accounted = 0;
    void Add(ProducerPhase phase, int64_t ns) {
      clock.AddProducerTime(phase, ns, base::SteadyNowNs());
      accounted += ns;
    }
    ~Account() {
      const int64_t now = base::SteadyNowNs();
      clock.AddProducerTime(ProducerPhase::kDelivery,
                            std::max<int64_t>(0, now - started - accounted), now);
    }
  } account{trainer_clock_};
  const v1::StreamSpec& spec = setup_.spec;
  Filled f;
  f.slot = step.slot;
  f.seq = step.sequence;
  f.pos = cursor.next;
  const pipeline::EpochShard& shard = ShardOf(cursor, f.pos.epoch());
  pipeline::FillRequest request;
  request.dataset = setup_.dataset;
  request.shard = &shard;
  request.cursor = f.pos.cursor();
  request.batch_size = spec.batch_size();
  request.transform = setup_.transform;
  request.on_error = setup_.on_error;
  request.limits = setup_.limits;
  request.seed = spec.seed();
  request.epoch = f.pos.epoch();
  request.read_ahead = read_ahead_.get();
  request.remote = remote_.get();
  request.end_epoch = spec.end_epoch();
  request.stop = [this] { return schedule_.stopped(); };
  if (!setup_.cache_key.empty()) {
    request.cache = deps_.cache;
    request.cache_key = setup_.cache_key;
  }
  absl::StatusOr<pipeline::FilledBatch> filled =
      deps_.filler->Fill(request, ring_->Payload(f.slot), deps_.observer);
  if (!filled.ok()) {
    // The batches before the failure are delivered first.
    if (cursor.look_ahead) PublishFilled(cursor, *cursor.look_ahead, false, true);
    if (!schedule_.stopped()) {  // else it is closing, and Fill stopped waiting for that
      SPDLOG_WARN("stream {} ended: {}", setup_.id, wire::EscapeBytes(Text(filled.status())));
    }
    schedule_.End(filled.status());
    return;
  }
  if (read_ahead_ != nullptr) {
    const uint64_t read_ns = read_ahead_->read_ns();
    trainer_clock_.AddReadAheadTime(static_cast<int64_t>(read_ns - read_ahead_ns_seen_),
                                    base::SteadyNowNs());
    read_ahead_ns_seen_ = read_ns;
  }
  account.Add(ProducerPhase::kRead, filled->read_wait_ns);
  account.Add(ProducerPhase::kMemory, filled->memory_wait_ns);
  account.Add(ProducerPhase::kDecode, filled->decode_ns);
  samples_skipped_.fetch_add(filled->skipped(), std::memory_order_relaxed);
  RecordSkipped(*filled, f.pos.epoch());
  deps_.stats->images_decoded.fetch_add(filled->count, std::memory_order_relaxed);
  const uint64_t batch_size = spec.batch_size();
  const bool dropped = spec.drop_last() && filled->count < batch_size;
  if (filled->count == 0 || dropped) {  // the rest of this epoch's shard yields no full batch
    if (cursor.look_ahead) {
      PublishFilled(cursor, *cursor.look_ahead, /*last=*/true, /*look_ahead=*/true);
      schedule_.Abandon();
    } else {
      schedule_.Abandon();
      if (filled->count > 0) ++cursor.batches_this_epoch;  // a dropped partial batch decoded
      FinishEpoch(cursor);
    }
    return;
  }
  if (cursor.look_ahead) PublishFilled(cursor, *cursor.look_ahead, false, true);
  f.batch = *std::move(filled);
  // What the rest of the shard can still yield decides whether this batch is the last.
  const uint64_t rest = shard.size() - f.batch.next_cursor;
  if (rest == 0 || (spec.drop_last() && rest < batch_size)) {
    PublishFilled(cursor, f, /*last=*/true, /*look_ahead=*/false);  // certainly the last
  } else if (rest < 2 * batch_size) {
    // The next batch may come out empty or short: keep this one until it is filled.
    schedule_.KeepAsLookAhead();
    cursor.next = MakePosition(f.pos.epoch(), f.pos.sequence() + 1, f.batch.next_cursor);
    cursor.look_ahead = std::move(f);
  } else {
    PublishFilled(cursor, f, /*last=*/false, /*look_ahead=*/false);
  }
}

v1::BatchHandle Stream::HandleOf(const Filled& f, bool last) const {
  const v1::Position next =
      last ? MakePosition(f.pos.epoch() + 1, 0, 0)
           : MakePosition(f.pos.epoch(), f.pos.sequence() + 1, f.batch.next_cursor);
  return MakeHandle(f.slot, f.seq, f.pos, next, f.batch, last, ring_->Payload(f.slot));
}

void Stream::PublishFilled(ProducerCursor& cursor, Filled& f, bool last, bool look_ahead) {
  v1::BatchHandle handle = HandleOf(f, last);
  cursor.next = handle.next();
  if (look_ahead) {
    schedule_.PublishLookAhead(std::move(handle), setup_.layout.total_bytes);
  } else {
    schedule_.Publish(std::move(handle), setup_.layout.total_bytes);
  }
  if (last) {
    cursor.epoch_from_start = true;
    cursor.batches_this_epoch = 0;
  } else {
    ++cursor.batches_this_epoch;
  }
  SPDLOG_DEBUG("stream {} published epoch={} sequence={} slot={} samples={}{}", setup_.id,
               f.pos.epoch(), f.pos.sequence(), f.slot, f.batch.count, last ? " (last)" : "");
  const uint64_t published = deps_.stats->batches_published.fetch_add(1) + 1;
  if (deps_.failpoints->enabled()) deps_.failpoints->OnBatchPublished(published);
  if (look_ahead) cursor.look_ahead.reset();  // `f` is the look-ahead: last use above
}

const pipeline::EpochShard& Stream::ShardOf(ProducerCursor& cursor, uint64_t epoch) const {
  if (!cursor.shard || cursor.shard->spec().epoch != epoch) {
    const v1::StreamSpec& spec = setup_.spec;
    pipeline::ShardSpec shard_spec;
    shard_spec.seed = spec.seed();
    shard_spec.epoch = epoch;
    shard_spec.rank = spec.rank();
    shard_spec.world_size = spec.world_size();
    shard_spec.shuffle = spec.shuffle();
    shard_spec.drop_last = spec.drop_last();
    if (epoch == setup_.start.epoch() && setup_.start_progress.consumed() != 0) {
      cursor.shard = std::make_unique<pipeline::EpochShard>(
          pipeline::ResumedShard(setup_.dataset->size(), shard_spec, setup_.start_progress));
    } else {
      cursor.shard = std::make_unique<pipeline::EpochShard>(setup_.dataset->size(), shard_spec);
    }
  }
  return *cursor.shard;
}

bool Stream::FinishEpoch(ProducerCursor& cursor) {
  if (cursor.epoch_from_start && cursor.batches_this_epoch == 0) {
    schedule_.End(absl::DataLossError(absl::StrCat(
        "dataset ", setup_.dataset->name(), ": no sample of rank ", setup_.spec.rank(),
        "'s shard of epoch ", cursor.next.epoch(),
        " could be decoded (or all are quarantined); see `ringloaderctl stats`")));
    return false;
  }
  cursor.next = MakePosition(cursor.next.epoch() + 1, 0, 0);
  cursor.epoch_from_start = true;
  cursor.batches_this_epoch = 0;
  return true;
}

void Stream::RecordSkipped(const pipeline::FilledBatch& filled, uint64_t epoch) {
  if (epoch != unlogged_epoch_) SayUnlogged();
  unlogged_epoch_ = epoch;
  std::map<std::string, uint64_t> kept;  // by reason
  for (const pipeline::SampleError& e : filled.errors) {
    ++kept[e.reason];
    BadFileRecord record{setup_.dataset->name(), e.relative_path, e.reason, e.message};
    switch (deps_.stats->RecordBadFile(e.sample_index, std::move(record))) {
      case DaemonStats::BadFileNews::kFirstTime:
        SPDLOG_WARN("dataset {}: skipping sample {} ({}): {}", setup_.dataset->name(),
                    e.sample_index, e.reason, wire::EscapeBytes(e.message));
        break;
      case DaemonStats::BadFileNews::kSeenBefore:
        break;
      case DaemonStats::BadFileNews::kNotRemembered:
        ++unlogged_[e.reason];
        break;
    }
  }
  for (const auto& [reason, count] : filled.skipped_by_reason) {
    const uint64_t rest = count - std::min(count, kept[reason]);
    deps_.stats->CountBadFiles(reason, rest);
    if (rest > 0) unlogged_[reason] += rest;
  }
}

void Stream::SayUnlogged() {
  if (unlogged_.empty()) return;
  uint64_t total = 0;
  std::string by_reason;
  for (const auto& [reason, count] : unlogged_) {
    total += count;
    absl::StrAppend(&by_reason, by_reason.empty() ? "" : ", ", reason, " ", count);
  }
  SPDLOG_WARN("dataset {}: stream {} skipped {} more bad samples in epoch {} without a line each "
              "({}; each batch's first {} and the daemon's first {} bad files are logged one by "
              "one; `ringloaderctl stats` counts them all)",
              setup_.dataset->name(), setup_.id, total, unlogged_epoch_, by_reason,
              pipeline::FilledBatch::kMaxErrorsKept, DaemonStats::kMaxRememberedBadFiles);
  unlogged_.clear();
}

namespace {

v1::DType WireDType(pipeline::NpyType type) {
  switch (type) {
    case pipeline::NpyType::kBool: return v1::DTYPE_BOOL;
    case pipeline::NpyType::kUint8: return v1::DTYPE_UINT8;
    case pipeline::NpyType::kInt8: return v1::DTYPE_INT8;
    case pipeline::NpyType::kInt16: return v1::DTYPE_INT16;
    case pipeline::NpyType::kUint16: return v1::DTYPE_UINT16;
    case pipeline::NpyType::kInt32: return v1::DTYPE_INT32;
    case pipeline::NpyType::kUint32: return v1::DTYPE_UINT32;
    case pipeline::NpyType::kInt64: return v1::DTYPE_INT64;
    case pipeline::NpyType::kUint64: return v1::DTYPE_UINT64;
    case pipeline::NpyType::kFloat16: return v1::DTYPE_FLOAT16;
    case pipeline::NpyType::kFloat32: return v1::DTYPE_FLOAT32;
    case pipeline::NpyType::kFloat64: return v1::DTYPE_FLOAT64;
  }
  return v1::DTYPE_UNSPECIFIED;
}

}  // namespace

v1::BatchHandle Stream::MakeHandle(uint32_t slot, uint64_t ring_sequence,
                                   const v1::Position& position, const v1::Position& next,
                                   const pipeline::FilledBatch& filled, bool last_in_epoch,
                                   std::span<const uint8_t> payload) const {
  v1::BatchHandle h;
  h.set_stream_id(setup_.id);
  h.set_incarnation(setup_.incarnation);
  h.set_slot(slot);
  h.set_ring_sequence(ring_sequence);
  *h.mutable_position() = position;
  *h.mutable_next() = next;
  h.set_sample_count(filled.count);
  h.set_last_in_epoch(last_in_epoch);
  const uint64_t n = filled.count;
  for (const pipeline::TensorPlacement& t : setup_.layout.tensors) {
    v1::TensorView* view = h.add_tensors();
    view->set_name(t.name);
    view->set_offset(t.offset);
    view->add_shape(n);
    for (uint64_t d : t.sample_shape) view->add_shape(d);
    view->set_dtype(WireDType(t.type));
    view->set_bytes(n * t.sample_bytes);
    if (t.name == "images") *h.mutable_images() = *view;
    if (t.name == "labels") *h.mutable_labels() = *view;
    if (t.name == "indices") *h.mutable_indices() = *view;
  }
  const auto* index_array =
      reinterpret_cast<const int64_t*>(payload.data() + setup_.layout.indices_offset);
  for (uint64_t i = 0; i < n; ++i) {
    h.add_relative_paths(std::string(setup_.dataset->relative_path(index_array[i])));
  }
  return h;
}

absl::Status Stream::Next(absl::Duration wait, v1::NextBatchResponse* out,
                          const std::function<bool()>& cancelled, const TrainerReport* trainer) {
  Touch();
  trainer_clock_.CallStarted(trainer, base::SteadyNowNs());
  if (const TrainerFigure figure = trainer_clock_.Read(base::SteadyNowNs()); figure.known) {
    out->set_input_bound(figure.input_bound);
  }
  in_next_.store(true, std::memory_order_relaxed);
  // Capped so that an infinite `wait` cannot overflow the time point (a year is forever here).
  const auto deadline = std::chrono::steady_clock::now() +
                        absl::ToChronoNanoseconds(std::min(wait, absl::Hours(24 * 365)));
  absl::Status status = schedule_.Next(deadline, out, cancelled);
  trainer_clock_.CallEnded(base::SteadyNowNs());
  Touch();  // the idle time starts when the answer leaves
  in_next_.store(false, std::memory_order_relaxed);
  if (status.ok() && out->has_batch()) {
    samples_served_.fetch_add(out->batch().sample_count(), std::memory_order_relaxed);
    deps_.stats->batches_served.fetch_add(1, std::memory_order_relaxed);
    deps_.stats->bytes_served.fetch_add(setup_.layout.total_bytes, std::memory_order_relaxed);
  }
  return status;
}

absl::Status Stream::Release(uint32_t slot, uint64_t ring_sequence, bool copied_out) {
  Touch();
  absl::Status status = schedule_.Release(slot, ring_sequence, copied_out);
  if (status.ok() && copied_out) {
    deps_.stats->batches_copied_out.fetch_add(1, std::memory_order_relaxed);
  }
  return status;
}

void Stream::FillStats(v1::StreamStats* out) const {
  out->set_stream_id(setup_.id);
  out->set_dataset(setup_.dataset->name());
  out->set_client_name(setup_.client_name);
  out->set_rank(setup_.spec.rank());
  out->set_world_size(setup_.spec.world_size());
  out->set_batch_size(setup_.spec.batch_size());
  const uint32_t slots = ring_->slot_count();
  out->set_slots_total(slots);
  out->set_ring_bytes(ring_->segment_bytes());
  uint32_t ready = 0, leased = 0, filling = 0;
  for (uint32_t s = 0; s < slots; ++s) {
    switch (ring_->Slot(s).state) {
      case shm::SlotState::kReady: ++ready; break;
      case shm::SlotState::kLeased: ++leased; break;
      case shm::SlotState::kFilling: ++filling; break;
      default: break;
    }
  }
  out->set_slots_ready(ready);
  out->set_slots_leased(leased);
  out->set_slots_filling(filling);
  out->set_batches_served(schedule_.batches_served());
  out->set_batches_copied_out(schedule_.batches_copied_out());
  *out->mutable_position() = schedule_.published_next();
  out->set_samples_served(samples_served_.load(std::memory_order_relaxed));
  out->set_samples_skipped(samples_skipped_.load(std::memory_order_relaxed));
  const TrainerFigure figure = trainer_clock_.Read(base::SteadyNowNs());
  out->set_input_bound(figure.known ? figure.input_bound : -1);
  out->set_input_bound_words(std::string(InputBoundWords(figure)));
  out->set_input_window_seconds(figure.window_seconds);
  out->set_trainer_wait_seconds(figure.wait_seconds_total);
  out->set_trainer_step_seconds(figure.step_seconds_total);
  out->set_trainer_steps(figure.steps);
  using P = ProducerPhase;
  const auto on = [&](P phase) { return figure.wait_on_seconds[static_cast<size_t>(phase)]; };
  out->set_wait_on_read_seconds(on(P::kRead));
  out->set_wait_on_decode_seconds(on(P::kDecode));
  out->set_wait_on_memory_seconds(on(P::kMemory));
  out->set_wait_on_delivery_seconds(on(P::kDelivery));
  out->set_read_ahead_seconds(figure.read_ahead_seconds);
}

}  // namespace ringloader::server
