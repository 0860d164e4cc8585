#include "server/daemon/stream.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "proto/wire_text.h"
#include "server/pipeline/sampler.h"
#include "server/daemon/status_text.h"
#include "spdlog/spdlog.h"
#include "shm/base/clock.h"

namespace ringloader::server {
namespace {

// A ring transition that can only fail if this class broke its own invariant: stop loudly.
void CheckRing(const absl::Status& status, uint64_t stream_id) {
  if (status.ok()) return;
  SPDLOG_CRITICAL("stream {}: ring invariant broken: {}", stream_id, status.ToString());
  std::abort();
}

v1::Position MakePosition(uint64_t epoch, uint64_t sequence, uint64_t cursor) {
  v1::Position p;
  p.set_epoch(epoch);
  p.set_sequence(sequence);
  p.set_cursor(cursor);
  return p;
}

// How often a waiting NextBatch looks whether its call was cancelled.
constexpr std::chrono::milliseconds kCancelCheck{50};

}  // namespace

Stream::Stream(StreamSetup setup, std::unique_ptr<shm::ProducerRing> ring, Reservation reservation,
               StreamDeps deps)
    : setup_(std::move(setup)),
      ring_(std::move(ring)),
      reservation_(std::move(reservation)),
      deps_(deps),
      slots_(ring_->slot_count()),
      last_activity_ns_(base::SteadyNowNs()) {
  std::lock_guard<std::mutex> lock(mu_);
  produce_pos_ = setup_.start;
  handles_.resize(slots_);
}

Stream::~Stream() { Stop(); }

void Stream::Start() { producer_ = std::thread([this] { ProducerLoop(); }); }

void Stream::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  if (producer_.joinable()) producer_.join();
}

std::chrono::steady_clock::time_point Stream::last_activity() const {
  if (in_next_.load(std::memory_order_relaxed)) return std::chrono::steady_clock::now();
  return std::chrono::steady_clock::time_point(
      std::chrono::nanoseconds(last_activity_ns_.load(std::memory_order_relaxed)));
}

void Stream::Touch() { last_activity_ns_.store(base::SteadyNowNs(), std::memory_order_relaxed); }

void Stream::ProducerLoop() {
  const v1::StreamSpec& spec = setup_.spec;
  std::unique_ptr<pipeline::EpochShard> shard;
  // An epoch that starts at cursor 0 and yields no batch at all means no sample of the shard
  // decodes: end the stream with that error instead of decoding failures forever.
  bool epoch_from_start = setup_.start.cursor() == 0;
  uint64_t batches_this_epoch = 0;
  auto next_epoch = [&](const v1::Position& pos) {
    std::lock_guard<std::mutex> lock(mu_);
    if (epoch_from_start && batches_this_epoch == 0) {
      error_ = absl::DataLossError(absl::StrCat(
          "dataset ", setup_.dataset->name(), ": no sample of rank ", spec.rank(), "'s shard of epoch ",
          pos.epoch(), " could be decoded (or all are quarantined); see `ringloaderctl stats`"));
      ended_ = true;
      cv_.notify_all();
      return;
    }
    produce_pos_ = MakePosition(pos.epoch() + 1, 0, 0);
    epoch_from_start = true;
    batches_this_epoch = 0;
  };
  // Publishes a filled batch. `last`: nothing of its epoch follows, so its `next` is the next
  // epoch's start and it carries last_in_epoch.
  auto publish = [&](Filled& f, bool last) {
    const v1::Position next =
        last ? MakePosition(f.pos.epoch() + 1, 0, 0)
             : MakePosition(f.pos.epoch(), f.pos.sequence() + 1, f.batch.next_cursor);
    v1::BatchHandle handle =
        MakeHandle(f.slot, f.seq, f.pos, next, f.batch, last, ring_->Payload(f.slot));
    CheckRing(ring_->Publish(f.slot, f.seq, setup_.layout.total_bytes), setup_.id);
    {
      std::lock_guard<std::mutex> lock(mu_);
      handle.set_payload_checksum(ring_->Slot(f.slot).checksum);
      handles_[f.slot] = std::move(handle);
      ready_slots_.push_back(f.slot);
      produce_seq_ = f.seq + 1;
      produce_pos_ = next;
      if (last) {
        epoch_from_start = true;
        batches_this_epoch = 0;
      } else {
        ++batches_this_epoch;
      }
      cv_.notify_all();
    }
    SPDLOG_DEBUG("stream {} published epoch={} sequence={} slot={} samples={}{}", setup_.id,
                 f.pos.epoch(), f.pos.sequence(), f.slot, f.batch.count, last ? " (last)" : "");
    uint64_t published = deps_.stats->batches_published.fetch_add(1) + 1;
    if (deps_.failpoints->enabled()) deps_.failpoints->OnBatchPublished(published);
  };
  // A filled batch near the end of its epoch is held back until the next one is filled (the
  // look-ahead): only then is it known whether it is the epoch's last. See stream.h.
  std::optional<Filled> held;
  std::optional<uint32_t> fill_slot;  // the free slot the next batch goes into
  uint64_t fill_seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fill_seq = produce_seq_;
  }
  while (true) {
    v1::Position pos;
    {
      std::unique_lock<std::mutex> lock(mu_);
      pos = held ? MakePosition(held->pos.epoch(), held->pos.sequence() + 1,
                                held->batch.next_cursor)
                 : produce_pos_;
      // The client waits for the held batch and keeps the look-ahead's slot: waiting on would
      // deadlock, so the held batch goes out unmarked (its epoch's end then shows only as the
      // next epoch's first batch).
      const auto client_waits_for_held = [&] {
        return held && next_busy_ && lease_seq_ == held->seq;
      };
      while (!stop_ && (ended_ || !FreeSlot()) && !client_waits_for_held()) {
        cv_.wait(lock);
      }
      if (stop_) return;
      fill_slot = FreeSlot();
      if (fill_slot) next_free_hint_ = (*fill_slot + 1) % slots_;
      if (client_waits_for_held() && !fill_slot) {
        lock.unlock();
        publish(*held, false);
        held.reset();
        continue;
      }
    }
    if (!held && spec.end_epoch() != 0 && pos.epoch() >= spec.end_epoch()) {
      std::lock_guard<std::mutex> lock(mu_);
      ended_ = true;
      cv_.notify_all();
      continue;
    }
    if (!shard || shard->spec().epoch != pos.epoch()) {
      pipeline::ShardSpec shard_spec;
      shard_spec.seed = spec.seed();
      shard_spec.epoch = pos.epoch();
      shard_spec.rank = spec.rank();
      shard_spec.world_size = spec.world_size();
      shard_spec.shuffle = spec.shuffle();
      shard_spec.drop_last = spec.drop_last();
      shard = std::make_unique<pipeline::EpochShard>(setup_.dataset->size(), shard_spec);
    }
    if (pos.cursor() >= shard->size()) {
      if (held) {
        publish(*held, true);
        held.reset();
      } else {
        next_epoch(pos);
      }
      continue;
    }

    Filled f;
    f.slot = *fill_slot;
    f.seq = fill_seq;
    f.pos = pos;
    CheckRing(ring_->BeginFill(f.slot), setup_.id);
    pipeline::FillRequest request;
    request.dataset = setup_.dataset;
    request.shard = shard.get();
    request.cursor = pos.cursor();
    request.batch_size = spec.batch_size();
    request.transform = setup_.transform;
    request.on_error = setup_.on_error;
    request.limits = setup_.limits;
    request.seed = spec.seed();
    request.epoch = pos.epoch();
    if (!setup_.cache_key.empty()) {
      request.cache = deps_.cache;
      request.cache_key = setup_.cache_key;
    }
    absl::StatusOr<pipeline::FilledBatch> filled =
        deps_.filler->Fill(request, ring_->Payload(f.slot), deps_.observer);
    if (!filled.ok()) {
      CheckRing(ring_->Abandon(f.slot), setup_.id);
      if (held) {  // the batches before the failure are delivered first
        publish(*held, false);
        held.reset();
      }
      SPDLOG_WARN("stream {} ended: {}", setup_.id, wire::EscapeBytes(Text(filled.status())));
      std::lock_guard<std::mutex> lock(mu_);
      error_ = filled.status();
      ended_ = true;
      cv_.notify_all();
      continue;
    }
    RecordSkipped(*filled);
    deps_.stats->images_decoded.fetch_add(filled->count, std::memory_order_relaxed);
    const bool dropped = spec.drop_last() && filled->count < spec.batch_size();
    if (filled->count == 0 || dropped) {  // the rest of this epoch's shard yields no full batch
      CheckRing(ring_->Abandon(f.slot), setup_.id);
      if (held) {
        publish(*held, true);  // the look-ahead found nothing after it
        held.reset();
      } else {
        if (filled->count > 0) {
          std::lock_guard<std::mutex> lock(mu_);
          ++batches_this_epoch;  // a dropped partial batch still decoded
        }
        next_epoch(pos);
      }
      continue;
    }
    ++fill_seq;
    if (held) {
      publish(*held, false);
      held.reset();
    }
    f.batch = *std::move(filled);
    // What the rest of the shard can still yield decides whether this batch is the last.
    const uint64_t rest = shard->size() - f.batch.next_cursor;
    const uint64_t batch_size = spec.batch_size();
    if (rest == 0 || (spec.drop_last() && rest < batch_size)) {
      publish(f, true);  // certainly the last
    } else if (rest < 2 * batch_size) {
      held = std::move(f);  // the next batch may come out empty or short: look ahead
    } else {
      publish(f, false);
    }
  }
}

void Stream::RecordSkipped(const pipeline::FilledBatch& filled) {
  for (const pipeline::SampleError& e : filled.errors) {
    BadFileRecord record{setup_.dataset->name(), e.relative_path, e.reason, e.message};
    if (deps_.stats->RecordBadFile(e.sample_index, std::move(record))) {
      SPDLOG_WARN("dataset {}: skipping sample {} ({}): {}", setup_.dataset->name(),
                  e.sample_index, e.reason, wire::EscapeBytes(e.message));
    }
  }
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
                          const std::function<bool()>& cancelled) {
  Touch();
  std::unique_lock<std::mutex> lock(mu_);
  if (next_busy_) {
    return absl::FailedPreconditionError(
        absl::StrCat("stream ", setup_.id, ": another NextBatch call is already waiting"));
  }
  next_busy_ = true;
  in_next_.store(true, std::memory_order_relaxed);
  struct Done {
    Stream* self;
    ~Done() {
      self->next_busy_ = false;
      self->Touch();  // the idle time starts when the answer leaves
      self->in_next_.store(false, std::memory_order_relaxed);
    }
  } done{this};
  // Capped so that an infinite `wait` cannot overflow the time point (a year is forever here).
  const auto deadline = std::chrono::steady_clock::now() +
                        absl::ToChronoNanoseconds(std::min(wait, absl::Hours(24 * 365)));
  while (true) {
    if (stop_) {
      return absl::UnavailableError(absl::StrCat("stream ", setup_.id, " is closing"));
    }
    if (!ready_slots_.empty()) {
      const uint32_t slot = ready_slots_.front();
      if (absl::Status s = ring_->Lease(slot, lease_seq_); !s.ok()) {
        return absl::InternalError(absl::StrCat("stream ", setup_.id, ": ", s.message()));
      }
      ready_slots_.pop_front();
      *out->mutable_batch() = handles_[slot];
      ++lease_seq_;
      ++batches_served_;
      deps_.stats->batches_served.fetch_add(1, std::memory_order_relaxed);
      deps_.stats->bytes_served.fetch_add(setup_.layout.total_bytes, std::memory_order_relaxed);
      return absl::OkStatus();
    }
    if (ended_) {
      if (!error_.ok()) return error_;
      out->set_end_of_stream(true);
      return absl::OkStatus();
    }
    if (AllSlotsLeased()) {
      // Only a client that does not copy held batches out (an old one, or a hand-written one)
      // gets here: ours never holds every slot.
      return absl::ResourceExhaustedError(absl::StrCat(
          "stream ", setup_.id, ": the client holds all ", slots_,
          " ring slots; release batches before asking for more, or open the stream with more "
          "ring_slots"));
    }
    // In short steps, so a call its client cancelled (or whose deadline passed) frees its
    // handler at once instead of holding a server thread for the whole wait.
    const auto step = std::min(deadline, std::chrono::steady_clock::now() + kCancelCheck);
    if (cv_.wait_until(lock, step) == std::cv_status::timeout) {
      if (cancelled && cancelled()) {
        return absl::CancelledError(absl::StrCat("stream ", setup_.id, ": the call was cancelled"));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        out->set_pending(true);
        return absl::OkStatus();
      }
    }
  }
}

std::optional<uint32_t> Stream::FreeSlot() const {
  // Round robin from the slot after the last one filled, so every slot gets used.
  for (uint32_t i = 0; i < slots_; ++i) {
    const uint32_t slot = (next_free_hint_ + i) % slots_;
    if (ring_->Slot(slot).state == shm::SlotState::kFree) return slot;
  }
  return std::nullopt;
}

bool Stream::AllSlotsLeased() const {
  for (uint32_t slot = 0; slot < slots_; ++slot) {
    if (ring_->Slot(slot).state != shm::SlotState::kLeased) return false;
  }
  return true;
}

absl::Status Stream::Release(uint32_t slot, uint64_t ring_sequence, bool copied_out) {
  Touch();
  if (slot >= slots_) {
    return absl::InvalidArgumentError(absl::StrCat("stream ", setup_.id, ": slot ", slot,
                                                   " out of range (ring has ", slots_, ")"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status s = ring_->Release(slot, ring_sequence);
  if (!s.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("stream ", setup_.id, ": release of slot ",
                                                      slot, " sequence ", ring_sequence, ": ",
                                                      s.message()));
  }
  if (copied_out) {
    ++batches_copied_out_;
    deps_.stats->batches_copied_out.fetch_add(1, std::memory_order_relaxed);
  }
  cv_.notify_all();
  return absl::OkStatus();
}

void Stream::FillStats(v1::StreamStats* out) const {
  out->set_stream_id(setup_.id);
  out->set_dataset(setup_.dataset->name());
  out->set_client_name(setup_.client_name);
  out->set_rank(setup_.spec.rank());
  out->set_world_size(setup_.spec.world_size());
  out->set_batch_size(setup_.spec.batch_size());
  out->set_slots_total(slots_);
  out->set_ring_bytes(ring_->segment_bytes());
  uint32_t ready = 0, leased = 0, filling = 0;
  for (uint32_t s = 0; s < slots_; ++s) {
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
  std::lock_guard<std::mutex> lock(mu_);
  out->set_batches_served(batches_served_);
  out->set_batches_copied_out(batches_copied_out_);
  *out->mutable_position() = produce_pos_;
}

}  // namespace ringloader::server
