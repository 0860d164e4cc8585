#include "server/pipeline/batch_filler.h"

#include <algorithm>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/pipeline/sample_reader.h"

namespace ringloader::pipeline {
namespace {

// How much of a file is read to find its header before the rest (JPEG headers with EXIF, ICC
// and thumbnails usually end well before this).
constexpr uint64_t kHeaderPeekBytes = 64 << 10;

uint64_t AlignUp(uint64_t v) { return (v + kTensorAlign - 1) / kTensorAlign * kTensorAlign; }

// dest is only byte-aligned as far as we know, so int64 entries are written with memcpy.
void PutI64(uint8_t* base, uint64_t i, int64_t v) { std::memcpy(base + i * 8, &v, 8); }

// Every sample error names its file: observers may return statuses that do not.
absl::Status NamingPath(const absl::Status& status, const std::string& path) {
  if (absl::StartsWith(status.message(), path)) return status;
  absl::Status named(status.code(), absl::StrCat(path, ": ", status.message()));
  status.ForEachPayload(
      [&](absl::string_view url, const absl::Cord& payload) { named.SetPayload(url, payload); });
  return named;
}

}  // namespace

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

absl::StatusOr<FilledBatch> BatchFiller::Fill(const FillRequest& request, std::span<uint8_t> dest,
                                              SampleObserver* observer) {
  if (request.dataset == nullptr || request.shard == nullptr) {
    return absl::InvalidArgumentError("Fill: dataset and shard are required");
  }
  const Dataset& dataset = *request.dataset;
  const bool has_images = dataset.has_images();
  if (request.batch_size == 0 || (has_images && request.transform.image_size == 0)) {
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

  const uint64_t sample_bytes = has_images ? request.transform.SampleBytes() : 0;
  uint8_t* const images = dest.data() + layout.images_offset;
  uint8_t* const labels = dest.data() + layout.labels_offset;
  uint8_t* const indices = dest.data() + layout.indices_offset;
  // The dataset's extra tensors, in dataset.tensors() order, and the row counts of ragged ones.
  const std::vector<TensorSchema>& schemas = dataset.tensors();
  std::vector<const TensorPlacement*> extras;
  std::vector<const TensorPlacement*> lengths;  // null for a tensor that is not ragged
  for (const TensorSchema& t : schemas) {
    extras.push_back(layout.Find(t.name));
    lengths.push_back(t.ragged ? layout.Find(t.name + "_lengths") : nullptr);
  }
  const auto tensor_at = [&](const TensorPlacement& t, uint64_t slot) {
    return dest.data() + t.offset + slot * t.sample_bytes;
  };

  FilledBatch batch;
  uint64_t pos = request.cursor;  // next shard position to consume
  std::vector<absl::Status> statuses;
  std::vector<int64_t> sample_labels;
  std::vector<uint64_t> sample_rows;  // [i * schemas.size() + k]: rows of tensor k
  // Rounds: read exactly the number of slots still empty, from the next shard positions, each
  // straight into its slot; then compact the good ones down in shard order. All good -> one round.
  while (batch.count < request.batch_size && pos < shard.size()) {
    const uint64_t first_slot = batch.count;
    const uint64_t k = std::min<uint64_t>(request.batch_size - batch.count, shard.size() - pos);
    for (uint64_t i = 0; i < k; ++i) {
      if (shard.at(pos + i) >= dataset.size()) {
        return absl::InvalidArgumentError(absl::StrCat("Fill: shard index ", shard.at(pos + i),
                                                       " >= dataset size ", dataset.size()));
      }
    }
    statuses.assign(k, absl::OkStatus());
    sample_labels.assign(k, -1);
    sample_rows.assign(k * schemas.size(), 0);
    // Per sample: open, peek at the image's header, draw the memory its decode needs, read the
    // image (all abandonable past the deadline: see WorkerPool), then commit; then the label and
    // the extra tensors (straight into their places), and the decode into its place.
    // An abandoned task's thread may wake up any time later, after this call has returned and
    // its captures are gone: so everything the blocking steps need is copied first, and after
    // each blocking step only the gates (BeginWait, Commit, Abandoned) are consulted before
    // anything captured is touched. Its memory draw is given back by on_abandoned.
    pool_.ParallelForWithDeadline(
        k, options_.deadline,
        [&](uint64_t i, uint32_t worker_id, TaskControl& control) {
          const uint64_t index = shard.at(pos + i);
          const image::DecodeLimits limits = request.limits ? *request.limits : default_limits_;
          const image::TransformSpec transform = request.transform;
          DecodeMemory* const memory = options_.memory;
          const std::chrono::milliseconds io_retry = options_.io_retry;
          SampleObserver* const sample_observer = observer;
          const Dataset* const sample_dataset = &dataset;
          // A cached image is neither read nor decoded: copied into its place after the commit.
          SampleCache* const cache = has_images ? request.cache : nullptr;
          const bool cached = cache != nullptr && cache->Contains(request.cache_key, index);
          const std::string where = sample_dataset->AbsolutePath(index);
          uint64_t drawn = 0;
          uint64_t libjpeg_cap = 0;  // given to the decoder once committed
          bool committed = false;
          // Ends the task with `status`; false (and nothing written) if it was abandoned.
          const auto finish = [&](absl::Status status) {
            if (!committed && !control.Commit()) return false;
            committed = true;
            if (!status.ok()) statuses[i] = NamingPath(status, where);
            return true;
          };
          const auto give_back = [&] {
            if (drawn > 0) memory->Release(drawn);
            drawn = 0;
          };
          control.Checkpoint();  // from here: only locals until the commit (see above)
          if (sample_observer != nullptr) sample_observer->BeforeRead(*sample_dataset, index);
          if (control.Abandoned()) return;
          absl::StatusOr<SampleReader> reader =
              SampleReader::Open(*sample_dataset, index, limits.max_file_bytes, io_retry);
          if (control.Abandoned()) return;
          if (!reader.ok()) {
            finish(reader.status());
            return;
          }
          absl::StatusOr<ImageBytes> image;
          if (has_images && memory != nullptr && !cached) {
            bool whole = false;
            absl::StatusOr<std::vector<uint8_t>> head =
                reader->ReadImageHead(kHeaderPeekBytes, &whole);
            if (control.Abandoned()) return;
            if (!head.ok()) {
              finish(head.status());
              return;
            }
            absl::StatusOr<image::DecodePlan> plan =
                head->empty() ? image::SampleDecoder::WorstCasePlan(limits, transform)
                              : image::SampleDecoder::PlanFromHeader(*head, where, limits, transform);
            if (!plan.ok()) {
              // Only a header cut off by the end of the peek (huge metadata) earns the benefit of
              // the doubt: assume the worst it may hold. Any other header error is final.
              if (whole || image::ErrorReason(plan.status()) != "truncated") {
                finish(plan.status());
                return;
              }
              plan = image::SampleDecoder::WorstCasePlan(limits, transform);
            }
            const uint64_t need = reader->read_bytes() + plan->bytes();
            if (!control.BeginWait()) return;
            absl::Status granted = memory->Acquire(need);
            if (granted.ok()) control.SetDrawn(need);  // whoever abandons us gives it back
            control.EndWait();
            if (!granted.ok()) {
              finish(image::WithReason(std::move(granted), "too_large"));
              return;
            }
            drawn = need;
            libjpeg_cap = plan->libjpeg_bytes;
          }
          if (has_images && !cached) image = reader->ReadImage();
          if (!finish(absl::OkStatus())) return;  // abandoned while reading: the draw went back
          absl::Status status = has_images && !cached ? image.status() : absl::OkStatus();
          const uint64_t slot = first_slot + i;
          // The observer watches everything after the commit (labels and extra tensors are read
          // here too): no deadline can abandon the task any more.
          const bool observed = status.ok() && observer != nullptr;
          if (observed) status = observer->BeforeDecode(dataset, index, worker_id);
          if (status.ok() && dataset.has_labels()) {
            absl::StatusOr<int64_t> label = reader->ReadLabel();
            if (label.ok()) sample_labels[i] = *label;
            status = label.status();
          }
          for (uint32_t t = 0; status.ok() && t < schemas.size(); ++t) {
            absl::StatusOr<uint64_t> rows = reader->ReadTensor(
                t, std::span<uint8_t>(tensor_at(*extras[t], slot), extras[t]->sample_bytes));
            if (rows.ok()) sample_rows[i * schemas.size() + t] = *rows;
            status = rows.status();
          }
          if (status.ok() && cached) {
            std::span<uint8_t> out(images + slot * sample_bytes, sample_bytes);
            if (!cache->Lookup(request.cache_key, index, out)) {  // never evicted: cannot happen
              status = absl::InternalError("sample cache: an entry it held is gone");
            }
          } else if (status.ok() && has_images) {
            image::SampleDecoder& decoder = *decoders_[worker_id];
            decoder.set_limits(limits);
            decoder.set_memory_cap(libjpeg_cap);
            decoder.set_deadline(options_.deadline.count() > 0
                                     ? std::chrono::steady_clock::now() + options_.deadline
                                     : std::chrono::steady_clock::time_point::max());
            image::SampleRng rng(request.seed, request.epoch, index);
            std::span<uint8_t> out(images + slot * sample_bytes, sample_bytes);
            status = decoder.DecodeInto(image->image(), where, request.transform, rng, out);
            if (status.ok() && cache != nullptr) cache->Insert(request.cache_key, index, out);
          }
          if (observed) observer->AfterDecode(dataset, index, worker_id);
          image = absl::StatusOr<ImageBytes>();  // the file's bytes go before the draw
          give_back();
          if (!status.ok()) statuses[i] = NamingPath(status, where);
        },
        [&](uint64_t i, uint64_t drawn) {
          if (drawn > 0) options_.memory->Release(drawn);
          statuses[i] = image::WithReason(
              absl::DeadlineExceededError(absl::StrCat(
                  dataset.AbsolutePath(shard.at(pos + i)), ": reading the file took longer than ",
                  options_.deadline.count(), " ms (server.decode_deadline_ms); abandoned")),
              "deadline_exceeded");
        });

    uint64_t write = first_slot;
    for (uint64_t i = 0; i < k; ++i) {
      const uint64_t index = shard.at(pos + i);
      if (!statuses[i].ok()) {
        if (request.on_error == OnError::kFail) {
          return image::WithReason(absl::DataLossError(statuses[i].message()),
                                   image::ErrorReason(statuses[i]));
        }
        batch.errors.push_back(SampleError{index, std::string(dataset.relative_path(index)),
                                           std::string(image::ErrorReason(statuses[i])),
                                           std::string(statuses[i].message())});
        continue;
      }
      if (write != first_slot + i) {
        if (has_images) {
          std::memmove(images + write * sample_bytes, images + (first_slot + i) * sample_bytes,
                       sample_bytes);
        }
        for (const TensorPlacement* t : extras) {
          std::memmove(tensor_at(*t, write), tensor_at(*t, first_slot + i), t->sample_bytes);
        }
      }
      PutI64(labels, write, sample_labels[i]);
      PutI64(indices, write, static_cast<int64_t>(index));
      for (size_t t = 0; t < lengths.size(); ++t) {
        if (lengths[t] != nullptr) {
          PutI64(dest.data() + lengths[t]->offset, write,
                 static_cast<int64_t>(sample_rows[i * schemas.size() + t]));
        }
      }
      ++write;
    }
    batch.count = static_cast<uint32_t>(write);
    pos += k;
  }
  batch.next_cursor = pos;

  // A short batch (end of shard) zeroes its unused tail so the whole buffer is deterministic too.
  if (batch.count < request.batch_size) {
    for (const TensorPlacement& t : layout.tensors) {
      std::memset(tensor_at(t, batch.count), 0, (request.batch_size - batch.count) * t.sample_bytes);
    }
  }
  return batch;
}

}  // namespace ringloader::pipeline
