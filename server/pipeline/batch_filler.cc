// SPDX-License-Identifier: Apache-2.0
#include "server/pipeline/batch_filler.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <string_view>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/pipeline/read_ahead.h"
#include "server/pipeline/sample_task.h"

namespace ringloader::pipeline {
namespace {

// kLeaseAheadRounds, kDecodeAheadRounds: remote_decode.h. Decoding ahead within the rounds
// leased ahead alone, a feeder late by more than their heads idled this host: in feeder_bench a
// wait of 40-75 ms about once an epoch, 3-7% of its core.
static_assert(kLeaseAheadRounds <= kDecodeAheadRounds);

uint64_t AlignUp(uint64_t v) { return (v + kTensorAlign - 1) / kTensorAlign * kTensorAlign; }

// dest is only byte-aligned as far as we know, so int64 entries are written with memcpy.
void PutI64(uint8_t* base, uint64_t i, int64_t v) { std::memcpy(base + i * 8, &v, 8); }

// A sample given up at its deadline (`while_`: why it was judged so).
absl::Status DeadlineError(const Dataset& dataset, uint64_t index,
                           std::chrono::milliseconds deadline, const char* while_) {
  return image::WithReason(
      absl::DeadlineExceededError(absl::StrCat(dataset.AbsolutePath(index),
                                               ": reading the file took longer than ",
                                               deadline.count(),
                                               " ms (server.decode_deadline_ms)", while_,
                                               "; abandoned")),
      "deadline_exceeded");
}

// Samples of a round to come, decoded on this host while an earlier round waited for its calls:
// kept (RemoteDecode::Keep) and collected by their round as a call answered at once. Its bytes are
// a read-ahead hold of memory_limit (DecodeMemory::TryAcquireReadAhead): taken only while no
// decode waits, and taken back by a decode that would otherwise wait (its samples are then
// decoded in their round), so samples decoded ahead never keep a decode waiting.
class DecodedAhead final : public RemoteCall {
 public:
  // `hold`: its bytes' hold on `memory` (0: unaccounted).
  DecodedAhead(std::vector<uint64_t> indices, uint64_t bytes, DecodeMemory* memory, uint64_t hold)
      : indices_(std::move(indices)), state_(std::make_shared<State>()), size_(bytes),
        memory_(memory), hold_(hold) {
    state_->bytes.reset(new uint8_t[bytes]);
    if (hold_ != 0) {
      memory_->ArmEviction(hold_, [weak = std::weak_ptr<State>(state_)] {
        if (std::shared_ptr<State> state = weak.lock()) state->Evict();
      });
    }
  }
  ~DecodedAhead() override {
    if (hold_ != 0) memory_->ReleaseReadAhead(hold_);
  }
  const std::vector<uint64_t>& indices() const override { return indices_; }
  // Its bytes are pinned from here on (a decode can no longer take them back), or were taken.
  std::optional<absl::Status> Wait(std::chrono::milliseconds) override {
    if (hold_ != 0 && !memory_->Pin(hold_)) {
      return absl::UnavailableError("its memory was taken back for a decode");
    }
    return absl::OkStatus();
  }
  bool Answered() const override { return true; }
  bool DecodedHere() const override { return true; }
  uint32_t count() const override { return count_; }
  AnswerView payload() const override {
    return AnswerView(std::span<const uint8_t>(state_->bytes.get(), size_));
  }
  void Accept(uint32_t) override {}
  void Reject(const absl::Status&) override {}

  // Written by the filler before it is kept: its first `count_` samples are good (the layout's
  // unwritten bytes are never read).
  std::span<uint8_t> mutable_payload() { return {state_->bytes.get(), size_}; }
  void set_count(uint32_t count) { count_ = count; }
  // Once filled: false when its bytes were taken back meanwhile (then freed here).
  bool Filled() { return state_->Filled(); }

 private:
  struct State {
    std::mutex mu;
    std::unique_ptr<uint8_t[]> bytes;  // left uninitialised: only good samples are read
    bool filling = true;               // its tasks write into `bytes`: freed once they are done
    bool evicted = false;
    void Evict() {
      std::lock_guard<std::mutex> lock(mu);
      evicted = true;
      if (!filling) bytes.reset();
    }
    bool Filled() {
      std::lock_guard<std::mutex> lock(mu);
      filling = false;
      if (evicted) bytes.reset();
      return !evicted;
    }
  };
  const std::vector<uint64_t> indices_;
  const std::shared_ptr<State> state_;  // shared with the eviction, which may outlive the call
  const uint64_t size_;
  DecodeMemory* const memory_;
  const uint64_t hold_;
  uint32_t count_ = 0;
};

// Whether `index` may be decoded elsewhere or ahead of its round: not refused here (quarantined:
// refused as here, in its round), not in the eval cache (copied, not decoded).
bool Leasable(const FillRequest& request, SampleObserver* observer, uint64_t index) {
  return (observer == nullptr || observer->Refused(*request.dataset, index).ok()) &&
         !(request.dataset->has_images() && request.cache != nullptr &&
           request.cache->Holds(request.cache_key, index));
}

}  // namespace

uint64_t FilledBatch::skipped() const {
  uint64_t n = 0;
  for (const auto& [reason, count] : skipped_by_reason) n += count;
  return n;
}

const TensorPlacement* BatchLayout::Find(std::string_view name) const {
  for (const TensorPlacement& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

BatchLayout ComputeBatchLayout(uint32_t batch_size, const image::TransformSpec& spec,
                               const Dataset* dataset) {
  BatchLayout layout;
  uint64_t end = 0;
  const auto add = [&](std::string name, NpyType type, std::vector<uint64_t> shape) {
    TensorPlacement t;
    t.name = std::move(name);
    t.type = type;
    t.sample_bytes = NpyTypeBytes(type);
    for (uint64_t d : shape) t.sample_bytes *= d;
    t.sample_shape = std::move(shape);
    t.offset = AlignUp(end);
    t.bytes = uint64_t{batch_size} * t.sample_bytes;
    end = t.offset + t.bytes;
    layout.tensors.push_back(std::move(t));
    return layout.tensors.back().offset;
  };
  if (dataset == nullptr || dataset->has_images()) {
    const uint64_t s = spec.image_size;
    const bool f32 = spec.dtype == image::DType::kFloat32;
    layout.images_offset =
        add("images", f32 ? NpyType::kFloat32 : NpyType::kUint8,
            spec.layout == image::Layout::kNCHW ? std::vector<uint64_t>{3, s, s}
                                                : std::vector<uint64_t>{s, s, 3});
    layout.images_bytes = layout.tensors.back().bytes;
  }
  layout.labels_offset = add("labels", NpyType::kInt64, {});
  layout.indices_offset = add("indices", NpyType::kInt64, {});
  if (dataset != nullptr) {
    for (const TensorSchema& t : dataset->tensors()) add(t.name, t.type, t.shape);
    for (const TensorSchema& t : dataset->tensors()) {
      if (t.ragged) add(t.name + "_lengths", NpyType::kInt64, {});
    }
  }
  layout.total_bytes = AlignUp(end);
  return layout;
}

BatchFiller::BatchFiller(WorkerPool& pool, image::DecodeLimits limits, FillerOptions options)
    : pool_(pool), default_limits_(limits), options_(options) {
  decoders_.reserve(pool.size());
  for (uint32_t i = 0; i < pool.size(); ++i) {
    decoders_.push_back(std::make_unique<image::SampleDecoder>(limits));
  }
}

BatchFiller::~BatchFiller() = default;

// Where each tensor of the batch lives in the destination, and what one round of samples leaves
// for the compaction: the batch as Fill assembles it.
struct BatchFiller::Assembly {
  Assembly(const FillRequest& r, const BatchLayout& l, std::span<uint8_t> d)
      : request(r), dataset(*r.dataset), shard(*r.shard), layout(l), dest(d),
        sample_bytes(dataset.has_images() ? r.transform.SampleBytes() : 0) {
    for (const TensorSchema& t : dataset.tensors()) {
      extras.push_back(layout.Find(t.name));
      lengths.push_back(t.ragged ? layout.Find(t.name + "_lengths") : nullptr);
    }
  }
  uint8_t* At(const TensorPlacement& t, uint64_t slot) const {
    return dest.data() + t.offset + slot * t.sample_bytes;
  }
  std::span<uint8_t> Image(uint64_t slot) const {
    if (sample_bytes == 0) return {};
    return {dest.data() + layout.images_offset + slot * sample_bytes, sample_bytes};
  }

  const FillRequest& request;
  const Dataset& dataset;
  const EpochShard& shard;
  const BatchLayout& layout;
  const std::span<uint8_t> dest;
  const uint64_t sample_bytes;  // of one image; 0 without images
  std::vector<const TensorPlacement*> extras;   // dataset.tensors() order
  std::vector<const TensorPlacement*> lengths;  // null for a tensor that is not ragged
  // The current round: samples shard[pos + i] for i < k, decoded into slots first_slot + i.
  uint64_t first_slot = 0, pos = 0, k = 0;
  std::vector<absl::Status> statuses;
  std::vector<std::shared_ptr<PrefetchedSample>> prefetched;  // ReadAhead's, or null
  // Samples whose task was abandoned at its deadline while it read on a decode thread (its bytes
  // were not read ahead: memory was short): read again through the lane, once each (reread_once).
  std::vector<uint64_t> reread;
  std::vector<bool> reread_once;
  std::vector<int64_t> labels;
  std::vector<uint64_t> rows;  // [i * extras.size() + t]
  // Where the time went (FilledBatch's), and the round's committed tasks' time and memory waits.
  int64_t read_wait_ns = 0, memory_wait_ns = 0, decode_ns = 0, remote_wait_ns = 0;
  uint32_t remote_samples = 0, ahead_samples = 0;
  uint64_t share = 0;  // the current round's samples to decode elsewhere (RemoteDecode::Share)
  std::atomic<int64_t> tasks_ns{0}, tasks_memory_ns{0};
};

absl::StatusOr<FilledBatch> BatchFiller::Fill(const FillRequest& request, std::span<uint8_t> dest,
                                              SampleObserver* observer) {
  if (request.dataset == nullptr || request.shard == nullptr) {
    return absl::InvalidArgumentError("Fill: dataset and shard are required");
  }
  const Dataset& dataset = *request.dataset;
  if (request.batch_size == 0 || (dataset.has_images() && request.transform.image_size == 0)) {
    return absl::InvalidArgumentError("Fill: batch_size and image_size must be > 0");
  }
  const EpochShard& shard = *request.shard;
  const BatchLayout layout = ComputeBatchLayout(request.batch_size, request.transform, &dataset);
  if (dest.size() < layout.total_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("Fill: destination holds ", dest.size(),
                                                   " bytes, the batch needs ", layout.total_bytes));
  }
  if (request.cursor > shard.size()) {
    return absl::OutOfRangeError(
        absl::StrCat("Fill: cursor ", request.cursor, " is past the shard's end ", shard.size()));
  }

  Assembly batch(request, layout, dest);
  FilledBatch filled;
  batch.pos = request.cursor;
  if (request.read_ahead != nullptr) {
    const image::DecodeLimits& limits = request.limits ? *request.limits : default_limits_;
    request.read_ahead->Advance(dataset, shard, request.epoch, request.cursor, request.end_epoch,
                                limits.max_file_bytes, request.cache, request.cache_key);
  }
  // Rounds: read exactly the number of slots still empty, from the next shard positions, each
  // straight into its slot; then compact the good ones down in shard order. All good: one round.
  while (filled.count < request.batch_size && batch.pos < shard.size()) {
    batch.first_slot = filled.count;
    batch.k = std::min<uint64_t>(request.batch_size - filled.count, shard.size() - batch.pos);
    for (uint64_t i = 0; i < batch.k; ++i) {
      if (shard.at(batch.pos + i) >= dataset.size()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "Fill: shard index ", shard.at(batch.pos + i), " >= dataset size ", dataset.size()));
      }
    }
    if (absl::Status s = DecodeRound(batch, observer); !s.ok()) return s;
    if (absl::Status s = CompactRound(batch, filled); !s.ok()) return s;
    batch.pos += batch.k;
  }
  filled.next_cursor = batch.pos;
  filled.read_wait_ns = batch.read_wait_ns;
  filled.memory_wait_ns = batch.memory_wait_ns;
  filled.decode_ns = batch.decode_ns;
  filled.remote_samples = batch.remote_samples;
  filled.remote_wait_ns = batch.remote_wait_ns;
  filled.ahead_samples = batch.ahead_samples;

  // A short batch (end of shard) zeroes its unused tail so the whole buffer is deterministic too.
  if (filled.count < request.batch_size) {
    for (const TensorPlacement& t : layout.tensors) {
      std::memset(batch.At(t, filled.count), 0,
                  (request.batch_size - filled.count) * t.sample_bytes);
    }
  }
  return filled;
}

absl::Status BatchFiller::DecodeRound(Assembly& batch, SampleObserver* observer) {
  const FillRequest& request = batch.request;
  const size_t tensors = batch.extras.size();
  batch.statuses.assign(batch.k, absl::OkStatus());
  batch.labels.assign(batch.k, -1);
  batch.rows.assign(batch.k * tensors, 0);
  batch.prefetched.assign(batch.k, nullptr);
  batch.reread.clear();
  batch.reread_once.assign(batch.k, false);
  std::vector<bool> leased(batch.k, false);
  std::vector<std::unique_ptr<RemoteCall>> calls;
  if (request.remote != nullptr) calls = StartRemote(batch, observer, leased);
  std::vector<uint64_t> local;
  for (uint64_t i = 0; i < batch.k; ++i) {
    if (!leased[i]) local.push_back(i);
  }
  const auto local_started = std::chrono::steady_clock::now();
  if (absl::Status s = LocalWaves(batch, local, observer); !s.ok()) return s;
  const std::chrono::nanoseconds local_took = std::chrono::steady_clock::now() - local_started;
  if (request.remote != nullptr && !local.empty()) {
    request.remote->LocalDone(local.size(), local_took);
  }
  // Every round tells the steering how it went, a round that leased nothing too (else a share
  // steered down to none would stay there).
  if (calls.empty()) {
    if (request.remote != nullptr) request.remote->RoundEnded(batch.k, local.size(), {});
    return absl::OkStatus();
  }
  // A shared round whose calls are late decodes samples of the rounds to come meanwhile.
  if (batch.share > 0 && batch.share < batch.k) {
    if (absl::Status s = DecodeAhead(batch, calls, observer); !s.ok()) return s;
  }
  const auto waited_from = std::chrono::steady_clock::now();
  std::chrono::nanoseconds waited{0};
  absl::StatusOr<std::vector<uint64_t>> redo = CollectRemote(batch, calls, leased, waited);
  batch.remote_wait_ns += (std::chrono::steady_clock::now() - waited_from).count();
  if (!redo.ok()) return redo.status();
  request.remote->RoundEnded(batch.k, local.size(), waited);
  // The answers' memory goes back before the samples they did not answer are decoded here.
  calls.clear();
  return redo->empty() ? absl::OkStatus() : LocalWaves(batch, *redo, observer);
}

std::vector<std::unique_ptr<RemoteCall>> BatchFiller::StartRemote(Assembly& batch,
                                                                  SampleObserver* observer,
                                                                  std::vector<bool>& leased) {
  const FillRequest& request = batch.request;
  // A sample asked for twice in a round (a padded shard) is decoded here: a feeder answers each
  // index once.
  std::map<uint64_t, uint64_t> position_of;  // dataset index -> round position
  std::map<uint64_t, int> seen;
  std::vector<uint64_t> round;
  for (uint64_t i = 0; i < batch.k; ++i) {
    const uint64_t index = batch.shard.at(batch.pos + i);
    ++seen[index];
    position_of[index] = i;
    round.push_back(index);
  }
  const auto leasable = [&](uint64_t index) { return Leasable(request, observer, index); };
  // The calls started ahead for this round's samples come first, and those decoded here ahead.
  std::vector<std::unique_ptr<RemoteCall>> calls =
      request.remote->Claim(request.epoch, round, /*batch_begins=*/batch.pos == request.cursor);
  uint64_t claimed = 0;  // of the share: samples calls started ahead hold
  for (const auto& call : calls) {
    for (uint64_t index : call->indices()) {
      const auto it = position_of.find(index);
      if (it == position_of.end() || seen[index] > 1 || leased[it->second] || !leasable(index)) {
        continue;  // (quarantined since it was started ahead: decoded here, refused as here)
      }
      leased[it->second] = true;
      if (!call->DecodedHere()) ++claimed;
    }
  }
  const uint64_t share = std::min(request.remote->Share(batch.k), batch.k);
  batch.share = share;
  // Then the round's tail up to its share: the local threads start at its head, so whichever
  // side is late, the other has done what comes first. Not in a shared round that claimed calls
  // started ahead (its share grew since): a feeder fills a host's calls in the order they came,
  // so a call of the round's own would wait behind the next rounds' (in feeder_bench such
  // rounds waited 20-40 ms, most of a round); these few are decoded here.
  const bool shared = share < batch.k;
  const uint64_t lease_to = shared && claimed > 0 ? 0 : share;
  std::vector<uint64_t> indices;
  for (uint64_t i = batch.k; i-- > 0 && claimed + indices.size() < lease_to;) {
    const uint64_t index = batch.shard.at(batch.pos + i);
    if (leased[i] || seen[index] > 1 || !leasable(index)) continue;
    indices.push_back(index);
  }
  std::reverse(indices.begin(), indices.end());
  for (auto& call : request.remote->Start(request.epoch, indices)) {
    for (uint64_t index : call->indices()) leased[position_of.at(index)] = true;
    calls.push_back(std::move(call));
  }
  // And ahead: the next kLeaseAheadRounds rounds' tails, the same share of each, into the next
  // epoch (its shard as the read-ahead builds it). Two rounds: the other side always has the next
  // call queued when it ends one (with one, it idled from its answer until the next round began,
  // a fifth of its time, and every epoch's first round waited for a lease of its own).
  const uint64_t round_size = request.batch_size;
  // (A refill's or an epoch's last round is shorter: what a whole one would lease.)
  uint64_t tail = share;
  if (batch.k != round_size) tail = std::min(request.remote->Share(round_size), round_size);
  // The rounds to come lease their tails too: the read-ahead leaves them to their feeders.
  if (request.read_ahead != nullptr) request.read_ahead->ExpectElsewhere(round_size, tail);
  if (share > 0) {
    for (const RoundAhead& next : NextRounds(batch, round_size, kLeaseAheadRounds)) {
      if (tail == 0) break;
      std::set<uint64_t> ahead_seen;
      std::vector<uint64_t> ahead;
      for (auto it = next.indices.rbegin(); it != next.indices.rend() && ahead.size() < tail;
           ++it) {
        const uint64_t index = *it;
        if (index >= batch.dataset.size() || !ahead_seen.insert(index).second) continue;
        if ((next.epoch == request.epoch && position_of.count(index) != 0) || !leasable(index)) {
          continue;
        }
        ahead.push_back(index);
      }
      std::reverse(ahead.begin(), ahead.end());
      if (!ahead.empty()) request.remote->Ahead(next.epoch, ahead);
    }
  }
  // A read ahead of a leased sample is left to the read-ahead: taken if the sample is decoded
  // here after all, else dropped by the next batch's Advance.
  return calls;
}

std::vector<BatchFiller::RoundAhead> BatchFiller::NextRounds(const Assembly& batch,
                                                             uint64_t round_size,
                                                             int rounds) const {
  const FillRequest& request = batch.request;
  uint64_t epoch = request.epoch;
  const auto index_at = [&](uint64_t p) -> std::optional<uint64_t> {
    if (epoch == request.epoch) {
      if (p < batch.shard.size()) return batch.shard.at(p);
      return std::nullopt;
    }
    if (request.read_ahead == nullptr) return std::nullopt;
    return request.read_ahead->IndexAt(epoch, p);
  };
  std::vector<RoundAhead> next;
  uint64_t first = batch.pos + batch.k;  // the next round's first shard position
  for (int r = 0; r < rounds; ++r) {
    std::optional<uint64_t> index = index_at(first);
    if (!index) {  // past this epoch's shard: the next one's first round
      ++epoch;
      first = 0;
      if (epoch == request.epoch + 2 || !(index = index_at(first))) break;
    }
    RoundAhead round{epoch, first, {}};
    for (uint64_t p = first; index && p < first + round_size; index = index_at(++p)) {
      round.indices.push_back(*index);
    }
    first += round.indices.size();
    next.push_back(std::move(round));
  }
  return next;
}

absl::Status BatchFiller::DecodeAhead(Assembly& batch,
                                      const std::vector<std::unique_ptr<RemoteCall>>& calls,
                                      SampleObserver* observer) {
  const FillRequest& request = batch.request;
  const auto late = [&] {
    return std::any_of(calls.begin(), calls.end(), [](const auto& c) { return !c->Answered(); });
  };
  // Without read-ahead each sample would be read on a decode thread: not ahead of its round.
  if (request.read_ahead == nullptr || !late()) return absl::OkStatus();
  // What is left to decode of the next rounds, their heads first (their tails are the calls
  // started ahead, or will be): each (epoch, index) once, none of this round's.
  struct Todo {
    uint64_t epoch, pos, index;
    size_t round;  // of NextRounds: a few holds one round's samples (its round claims it whole)
  };
  std::vector<Todo> todo;
  std::set<uint64_t> in_round;
  for (uint64_t i = 0; i < batch.k; ++i) in_round.insert(batch.shard.at(batch.pos + i));
  std::set<std::pair<uint64_t, uint64_t>> seen;
  const std::vector<RoundAhead> rounds =
      NextRounds(batch, request.batch_size, kDecodeAheadRounds);
  // A round past those leased ahead keeps its tail, the share a feeder will be leased.
  const uint64_t tail = request.remote->Share(request.batch_size);
  for (size_t r = 0; r < rounds.size(); ++r) {
    const RoundAhead& next = rounds[r];
    const std::vector<uint64_t> unheld = request.remote->Unheld(next.epoch, next.indices);
    const std::set<uint64_t> free(unheld.begin(), unheld.end());
    const size_t head = r < kLeaseAheadRounds
                            ? next.indices.size()
                            : next.indices.size() - std::min<size_t>(tail, next.indices.size());
    for (size_t j = 0; j < head; ++j) {
      const uint64_t index = next.indices[j];
      if (index >= batch.dataset.size() || free.count(index) == 0 ||
          !seen.emplace(next.epoch, index).second ||
          (next.epoch == request.epoch && in_round.count(index) != 0) ||
          !Leasable(request, observer, index)) {
        continue;
      }
      todo.push_back(Todo{next.epoch, next.first + j, index, r});
    }
  }
  // A few at a time (one per decode thread), so that the answers, once in, wait little.
  const uint32_t most = std::max<uint32_t>(1, pool_.size());
  const uint64_t bytes = ComputeBatchLayout(most, request.transform, &batch.dataset).total_bytes;
  size_t next = 0;
  while (next < todo.size() && late()) {
    if (request.stop && request.stop()) {
      return absl::CancelledError("the batch was decoding ahead when its stream stopped");
    }
    // Only while no decode waits for memory, and within read-ahead's part of it.
    uint64_t hold = 0;
    if (options_.memory != nullptr && (hold = options_.memory->TryAcquireReadAhead(bytes)) == 0) {
      break;
    }
    std::vector<uint32_t> indices;
    std::vector<std::shared_ptr<PrefetchedSample>> reads;
    const Todo& first = todo[next];
    const uint64_t epoch = first.epoch;
    const size_t round = first.round;
    for (; next < todo.size() && todo[next].round == round && indices.size() < most; ++next) {
      std::shared_ptr<PrefetchedSample> read = request.read_ahead->TakeIfDone(epoch, todo[next].pos);
      if (read == nullptr) continue;  // not read yet: decoded in its round
      indices.push_back(static_cast<uint32_t>(todo[next].index));
      reads.push_back(std::move(read));
    }
    if (indices.empty()) {
      if (hold != 0) options_.memory->ReleaseReadAhead(hold);
      continue;
    }
    const uint32_t n = static_cast<uint32_t>(indices.size());
    const BatchLayout layout = ComputeBatchLayout(n, request.transform, &batch.dataset);
    auto call = std::make_unique<DecodedAhead>(
        std::vector<uint64_t>(indices.begin(), indices.end()), layout.total_bytes,
        options_.memory, hold);
    ShardSpec spec;
    spec.seed = request.seed;
    spec.epoch = epoch;
    const EpochShard shard(spec, std::move(indices));
    FillRequest few = request;
    few.shard = &shard;
    few.cursor = 0;
    few.batch_size = n;
    few.on_error = OnError::kSkip;  // a failure is decoded again in its round, and judged there
    few.epoch = epoch;
    few.remote = nullptr;
    few.cache = nullptr;  // (cached samples are not decoded ahead)
    Assembly ahead(few, layout, call->mutable_payload());
    ahead.k = n;
    ahead.statuses.assign(n, absl::OkStatus());
    ahead.labels.assign(n, -1);
    ahead.rows.assign(n * ahead.extras.size(), 0);
    ahead.prefetched = std::move(reads);
    ahead.reread_once.assign(n, false);
    std::vector<uint64_t> all(n);
    for (uint32_t i = 0; i < n; ++i) all[i] = i;
    const auto few_started = std::chrono::steady_clock::now();
    RunTasks(ahead, all, observer);
    // A task past its deadline would be read again on the lane: here it is only left out.
    for (uint64_t i : ahead.reread) {
      ahead.statuses[i] = DeadlineError(batch.dataset, shard.at(i), options_.deadline, "");
    }
    for (const auto& read : ahead.prefetched) {
      if (read != nullptr) request.read_ahead->WriteOff(*read);
    }
    FilledBatch filled;
    if (absl::Status s = CompactRound(ahead, filled); !s.ok()) return s;
    call->set_count(filled.count);
    request.remote->LocalDone(n, std::chrono::steady_clock::now() - few_started);
    batch.decode_ns += ahead.decode_ns;
    batch.memory_wait_ns += ahead.memory_wait_ns;
    if (call->Filled()) request.remote->Keep(epoch, std::move(call));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<uint64_t>> BatchFiller::CollectRemote(Assembly& batch,
                                                 std::vector<std::unique_ptr<RemoteCall>>& calls,
                                                 const std::vector<bool>& leased,
                                                 std::chrono::nanoseconds& waited) {
  const FillRequest& request = batch.request;
  const size_t tensors = batch.extras.size();
  std::map<uint64_t, uint64_t> position_of;  // dataset index -> round position
  for (uint64_t i = 0; i < batch.k; ++i) position_of[batch.shard.at(batch.pos + i)] = i;
  // Which call each leased sample of the round went to (StartRemote's rule: a sample of the
  // round once, to the first call holding it).
  std::map<uint64_t, const RemoteCall*> leased_to;
  for (const auto& call : calls) {
    for (uint64_t index : call->indices()) {
      const auto it = position_of.find(index);
      if (it != position_of.end() && leased[it->second]) leased_to.emplace(index, call.get());
    }
  }
  std::vector<uint64_t> redo;
  for (const auto& call : calls) {
    const std::vector<uint64_t>& asked = call->indices();
    std::vector<bool> answered(asked.size(), false);
    // In slices: a stream that stops (closed, the daemon shutting down) does not wait out a
    // stalled feeder's lease.
    std::optional<absl::Status> ended;
    const auto wait_from = std::chrono::steady_clock::now();
    while (!(ended = call->Wait(std::chrono::milliseconds(50)))) {
      if (request.stop && request.stop()) {
        return absl::CancelledError("the batch was waiting for a feeder when its stream stopped");
      }
    }
    waited += std::chrono::steady_clock::now() - wait_from;
    absl::Status status = *std::move(ended);
    // The call's own failures are the pool's to count; only what is found here is rejected.
    const bool call_failed = !status.ok();
    const BatchLayout layout = ComputeBatchLayout(static_cast<uint32_t>(asked.size()),
                                                  request.transform, &batch.dataset);
    const AnswerView payload = status.ok() ? call->payload() : AnswerView();
    if (status.ok() && (payload.size() != layout.total_bytes || call->count() > asked.size())) {
      status = absl::DataLossError(absl::StrCat("an answer of ", payload.size(), " bytes and ",
                                                call->count(), " samples for ", asked.size(),
                                                " samples laid out in ", layout.total_bytes));
    }
    // The answer's samples, checked before any is copied: each one asked for, once.
    // (answer j, round position) of the answer's samples this round leased to the call.
    std::vector<std::pair<uint32_t, uint64_t>> taken;
    for (uint32_t j = 0; status.ok() && j < call->count(); ++j) {
      const int64_t index = payload.Int64At(layout.indices_offset + j * 8);
      const auto asked_at = std::find(asked.begin(), asked.end(), static_cast<uint64_t>(index));
      if (index < 0 || asked_at == asked.end() || answered[asked_at - asked.begin()]) {
        status = absl::DataLossError(
            absl::StrCat("its answer's sample ", j, " is index ", index, ", not one asked for"));
        break;
      }
      answered[asked_at - asked.begin()] = true;
      // A label this host knows without reading the sample (imagefolder, manifest; none at all:
      // -1) must be the one sent. Labels read with the sample (records, members) cannot be.
      const int64_t label = payload.Int64At(layout.labels_offset + j * 8);
      const int64_t known =
          batch.dataset.has_labels() ? batch.dataset.label(static_cast<uint64_t>(index)) : -1;
      if ((known >= 0 || !batch.dataset.has_labels()) && label != known) {
        status = absl::DataLossError(absl::StrCat("its answer's sample ", j, " (index ", index,
                                                  ") has label ", label, ", not ", known));
        break;
      }
      for (size_t t = 0; t < tensors && status.ok(); ++t) {
        if (batch.lengths[t] == nullptr) continue;
        const TensorPlacement* rows = layout.Find(batch.extras[t]->name + "_lengths");
        const int64_t n = payload.Int64At(rows->offset + j * 8);
        const TensorPlacement& tensor = *batch.extras[t];
        const uint64_t most = tensor.sample_shape.empty() ? 0 : tensor.sample_shape[0];
        if (n < 0 || static_cast<uint64_t>(n) > most) {
          status = absl::DataLossError(absl::StrCat("its answer's sample ", j, " has ", n,
                                                    " rows of ", tensor.name, ", past ", most));
        }
      }
      if (!status.ok()) break;
      const auto mine = leased_to.find(static_cast<uint64_t>(index));
      if (mine != leased_to.end() && mine->second == call.get()) {
        taken.emplace_back(j, position_of.at(mine->first));
      }
    }
    if (!status.ok()) {
      if (!call_failed) call->Reject(status);
      for (uint64_t index : asked) {
        const auto mine = leased_to.find(index);
        if (mine != leased_to.end() && mine->second == call.get()) {
          redo.push_back(position_of.at(index));
        }
      }
      continue;
    }
    for (const auto& [j, i] : taken) {
      const uint64_t slot = batch.first_slot + i;
      if (batch.sample_bytes > 0) {
        payload.Copy(layout.images_offset + j * batch.sample_bytes, batch.Image(slot));
      }
      batch.labels[i] = payload.Int64At(layout.labels_offset + j * 8);
      for (size_t t = 0; t < tensors; ++t) {
        const TensorPlacement& mine = *batch.extras[t];
        const TensorPlacement* theirs = layout.Find(mine.name);
        payload.Copy(theirs->offset + j * theirs->sample_bytes,
                     {batch.At(mine, slot), mine.sample_bytes});
        if (batch.lengths[t] != nullptr) {
          const TensorPlacement* rows = layout.Find(mine.name + "_lengths");
          const int64_t n = payload.Int64At(rows->offset + j * 8);
          batch.rows[i * tensors + t] = static_cast<uint64_t>(std::max<int64_t>(0, n));
        }
      }
      batch.statuses[i] = absl::OkStatus();
      ++(call->DecodedHere() ? batch.ahead_samples : batch.remote_samples);
    }
    call->Accept(static_cast<uint32_t>(taken.size()));
    // What the feeder could not decode is decoded here: the verdict on a file is this host's.
    for (size_t a = 0; a < asked.size(); ++a) {
      const auto mine = leased_to.find(asked[a]);
      if (!answered[a] && mine != leased_to.end() && mine->second == call.get()) {
        redo.push_back(position_of.at(asked[a]));
      }
    }
  }
  std::sort(redo.begin(), redo.end());
  return redo;
}

absl::Status BatchFiller::LocalWaves(Assembly& batch, const std::vector<uint64_t>& which,
                                     SampleObserver* observer) {
  const FillRequest& request = batch.request;
  // unstarted: reads not started yet for want of a file (FileBudget); waiting: reads running.
  std::vector<uint64_t> unstarted, waiting, ready;
  ReadAhead* const ahead = request.read_ahead;
  for (uint64_t i : which) {
    const uint64_t index = batch.shard.at(batch.pos + i);
    // A quarantined sample is refused at once by its task, whatever its read does; a cached one
    // is not read.
    const bool refused = observer != nullptr && !observer->Refused(batch.dataset, index).ok();
    const bool cached = batch.dataset.has_images() && request.cache != nullptr &&
                        request.cache->Holds(request.cache_key, index);
    if (ahead != nullptr) batch.prefetched[i] = ahead->Take(request.epoch, batch.pos + i);
    if (ahead != nullptr && batch.prefetched[i] == nullptr && !cached && !refused) {
      unstarted.push_back(i);  // started below (a read the window did not reach)
    } else {
      (batch.prefetched[i] != nullptr && !refused ? waiting : ready).push_back(i);
    }
  }
  // Waves: the samples whose reads are done go to the decode threads while the others read on.
  while (true) {
    std::vector<uint64_t> still;
    for (uint64_t i : unstarted) {  // (again when no file was left: others give theirs back)
      // A re-read (its task met its deadline on a decode thread) reads the bytes on the lane
      // whatever memory is spare: its task must not read from the storage again.
      batch.prefetched[i] = ahead->StartNow(batch.shard.at(batch.pos + i),
                                            batch.reread_once[i]
                                                ? PrefetchedSample::Memory::kWaitFor
                                                : PrefetchedSample::Memory::kSpare);
      (batch.prefetched[i] != nullptr ? waiting : still).push_back(i);
    }
    unstarted.swap(still);
    still.clear();
    for (uint64_t i : waiting) {
      const PrefetchedSample& read = *batch.prefetched[i];
      const PrefetchedSample::State state = read.state();
      if (state == PrefetchedSample::State::kDone ||
          state == PrefetchedSample::State::kCancelled) {
        ready.push_back(i);
      } else if (options_.deadline.count() > 0 &&
                 ahead->Judge(read, options_.deadline) == ReadPool::Verdict::kPoison) {
        GiveUpRead(batch, i, observer);
      } else {
        still.push_back(i);
      }
    }
    waiting.swap(still);
    if (!ready.empty()) {
      RunTasks(batch, ready, observer);
      // Done with their files: given back now, for the rest of the batch (a read its task did
      // not wait for, refused meanwhile, may be stuck: another reader takes its place).
      for (uint64_t i : ready) {
        if (batch.prefetched[i] == nullptr) continue;
        ahead->WriteOff(*batch.prefetched[i]);
        batch.prefetched[i] = nullptr;
      }
      ready.clear();
      // Read again on the lane, where an outage is waited out without a decode thread.
      unstarted.insert(unstarted.end(), batch.reread.begin(), batch.reread.end());
      batch.reread.clear();
      continue;
    }
    if (waiting.empty() && unstarted.empty()) break;
    if (request.stop && request.stop()) {
      return absl::CancelledError("the batch was waiting for its reads when its stream stopped");
    }
    const auto waited_from = std::chrono::steady_clock::now();
    const auto until = waited_from + std::chrono::milliseconds(10);
    if (!waiting.empty()) {
      batch.prefetched[waiting.front()]->WaitSettledUntil(until);
    } else {
      std::this_thread::sleep_until(until);  // for a file (other streams' samples end)
    }
    batch.read_wait_ns += (std::chrono::steady_clock::now() - waited_from).count();
  }
  return absl::OkStatus();
}

void BatchFiller::GiveUpRead(Assembly& batch, uint64_t i, SampleObserver* observer) {
  const uint64_t index = batch.shard.at(batch.pos + i);
  batch.request.read_ahead->WriteOff(*batch.prefetched[i]);
  batch.prefetched[i] = nullptr;  // written off once
  if (observer != nullptr) observer->OnAbandoned(batch.dataset, index);
  batch.statuses[i] = DeadlineError(batch.dataset, index, options_.deadline,
                                    " while the storage answered other reads");
}

void BatchFiller::RunTasks(Assembly& batch, const std::vector<uint64_t>& which,
                           SampleObserver* observer) {
  const FillRequest& request = batch.request;
  const size_t tensors = batch.extras.size();
  const auto started = std::chrono::steady_clock::now();
  batch.tasks_ns = 0;
  batch.tasks_memory_ns = 0;
  // Each sample is a SampleTask: everything it reads with is copied into its SampleJob before
  // it may be abandoned; it writes into the batch (SampleOutput) only once it has committed.
  pool_.ParallelForWithDeadline(
      which.size(), options_.deadline,
      [&](uint64_t j, uint32_t worker_id, TaskControl& control) {
        const uint64_t i = which[j];
        SampleJob job;
        job.dataset = &batch.dataset;
        job.index = batch.shard.at(batch.pos + i);
        job.limits = request.limits ? *request.limits : default_limits_;
        job.transform = request.transform;
        job.seed = request.seed;
        job.epoch = request.epoch;
        job.memory = options_.memory;
        job.observer = observer;
        job.io_retry = options_.io_retry;
        job.decode_deadline = options_.deadline;
        job.prefetched = batch.prefetched[i];
        if (batch.dataset.has_images() && request.cache != nullptr) {
          job.cache = request.cache;
          job.cache_key = request.cache_key;
          job.cached = job.cache->Contains(job.cache_key, job.index);
        }
        const uint64_t slot = batch.first_slot + i;
        SampleOutput out;
        out.status = &batch.statuses[i];
        out.label = &batch.labels[i];
        out.rows = std::span<uint64_t>(batch.rows.data() + i * tensors, tensors);
        out.image = batch.Image(slot);
        for (const TensorPlacement* t : batch.extras) {
          out.tensors.emplace_back(batch.At(*t, slot), t->sample_bytes);
        }
        const auto task_started = std::chrono::steady_clock::now();
        SampleTask task(std::move(job), control);
        // Only a task that completed may touch the batch (an abandoned one outlives the call).
        if (task.Run(out, Worker{worker_id, *decoders_[worker_id]}) == SampleTask::State::kDone) {
          batch.tasks_ns += (std::chrono::steady_clock::now() - task_started).count();
          batch.tasks_memory_ns += task.memory_wait_ns();
        }
      },
      [&](uint64_t j, uint64_t drawn, WorkerPool::Abandoned why) {
        const uint64_t i = which[j];
        if (drawn > 0) options_.memory->Release(drawn);
        if (batch.prefetched[i] != nullptr) {
          request.read_ahead->WriteOff(*batch.prefetched[i]);
          batch.prefetched[i] = nullptr;  // written off once
        }
        // A task that reached its deadline read on its decode thread (its bytes were not read
        // ahead); the storage may be out, not the file bad: the first time, and again whenever
        // the lane says its storage is stalled, the sample is read again through its lane, which
        // tells the two apart (ReadPool::Judge), and nothing is struck. Its stuck thread was
        // replaced already.
        if (why == WorkerPool::Abandoned::kPastDeadline && request.read_ahead != nullptr &&
            (!batch.reread_once[i] || request.read_ahead->StorageStalled())) {
          batch.reread_once[i] = true;
          batch.reread.push_back(i);
          return;
        }
        // Only a sample stuck past its own deadline is suspect; a shutdown abandons bystanders.
        if (observer != nullptr && why == WorkerPool::Abandoned::kPastDeadline) {
          observer->OnAbandoned(batch.dataset, batch.shard.at(batch.pos + i));
        }
        batch.statuses[i] =
            DeadlineError(batch.dataset, batch.shard.at(batch.pos + i), options_.deadline, "");
      });
  // The round's time, split as its tasks' time was between memory waits and the rest.
  const int64_t round = (std::chrono::steady_clock::now() - started).count();
  const int64_t tasks = batch.tasks_ns.load();
  const int64_t memory =
      tasks > 0 ? static_cast<int64_t>(static_cast<double>(round) *
                                       std::min(1.0, static_cast<double>(batch.tasks_memory_ns) /
                                                         static_cast<double>(tasks)))
                : 0;
  batch.memory_wait_ns += memory;
  batch.decode_ns += round - memory;
}

absl::Status BatchFiller::CompactRound(Assembly& batch, FilledBatch& filled) {
  const Dataset& dataset = batch.dataset;
  uint8_t* const labels = batch.dest.data() + batch.layout.labels_offset;
  uint8_t* const indices = batch.dest.data() + batch.layout.indices_offset;
  const size_t tensors = batch.extras.size();
  uint64_t write = batch.first_slot;
  for (uint64_t i = 0; i < batch.k; ++i) {
    const uint64_t index = batch.shard.at(batch.pos + i);
    const uint64_t slot = batch.first_slot + i;
    const absl::Status& status = batch.statuses[i];
    if (!status.ok()) {
      if (batch.request.on_error == OnError::kFail) {
        return image::WithReason(absl::DataLossError(status.message()),
                                 image::ErrorReason(status));
      }
      const std::string reason(image::ErrorReason(status));
      ++filled.skipped_by_reason[reason];
      if (filled.errors.size() < FilledBatch::kMaxErrorsKept) {
        filled.errors.push_back(SampleError{index, std::string(dataset.relative_path(index)),
                                            reason, std::string(status.message())});
      }
      continue;
    }
    if (write != slot) {
      if (batch.sample_bytes > 0) {
        std::memmove(batch.Image(write).data(), batch.Image(slot).data(), batch.sample_bytes);
      }
      for (const TensorPlacement* t : batch.extras) {
        std::memmove(batch.At(*t, write), batch.At(*t, slot), t->sample_bytes);
      }
    }
    PutI64(labels, write, batch.labels[i]);
    PutI64(indices, write, static_cast<int64_t>(index));
    for (size_t t = 0; t < tensors; ++t) {
      if (batch.lengths[t] != nullptr) {
        PutI64(batch.dest.data() + batch.lengths[t]->offset, write,
               static_cast<int64_t>(batch.rows[i * tensors + t]));
      }
    }
    ++write;
  }
  filled.count = static_cast<uint32_t>(write);
  return absl::OkStatus();
}

}  // namespace ringloader::pipeline
