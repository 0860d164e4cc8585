// Batch: views into a mapped ring slot, built from a handle that is checked field by field.
#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/internal.h"

namespace ringloader::client {
namespace {

absl::Status Bad(absl::string_view field, absl::string_view why) {
  return absl::InternalError(
      absl::StrCat("daemon sent an invalid batch handle: ", field, ": ", why));
}

std::optional<DType> FromWire(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_UINT8:
      return DType::kUint8;
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DTYPE_INT64:
      return DType::kInt64;
    default:
      return std::nullopt;
  }
}

// Checks one tensor: dtype, shape, bytes = product(shape) x dtype size, and [offset, offset+bytes)
// inside the slot's payload. Builds its view on success.
absl::StatusOr<TensorView> MakeView(absl::string_view name, const v1::TensorView& wire,
                                    DType expected_dtype,
                                    const std::vector<uint64_t>& expected_shape,
                                    std::span<const uint8_t> payload) {
  const std::optional<DType> dtype = FromWire(wire.dtype());
  if (!dtype || *dtype != expected_dtype) {
    return Bad(name, absl::StrCat("dtype ", static_cast<int>(wire.dtype()), ", expected ",
                                  DTypeName(expected_dtype)));
  }
  if (static_cast<size_t>(wire.shape_size()) != expected_shape.size()) {
    return Bad(name,
               absl::StrCat("rank ", wire.shape_size(), ", expected ", expected_shape.size()));
  }
  uint64_t elements = 1;
  std::vector<int64_t> shape;
  for (int i = 0; i < wire.shape_size(); ++i) {
    if (wire.shape(i) != expected_shape[i]) {
      return Bad(
          name, absl::StrCat("shape[", i, "] = ", wire.shape(i), ", expected ", expected_shape[i]));
    }
    if (__builtin_mul_overflow(elements, wire.shape(i), &elements)) {
      return Bad(name, "shape overflows 64 bits");
    }
    shape.push_back(static_cast<int64_t>(wire.shape(i)));
  }
  uint64_t bytes = 0;
  if (__builtin_mul_overflow(elements, uint64_t{DTypeSize(*dtype)}, &bytes)) {
    return Bad(name, "shape overflows 64 bits");
  }
  if (wire.bytes() != bytes) {
    return Bad(name, absl::StrCat("bytes ", wire.bytes(), ", shape says ", bytes));
  }
  if (wire.offset() > payload.size() || bytes > payload.size() - wire.offset()) {
    return Bad(name, absl::StrCat("[", wire.offset(), ", +", bytes, ") outside the slot's ",
                                  payload.size(), " bytes"));
  }
  if (wire.offset() % DTypeSize(*dtype) != 0) {
    return Bad(name,
               absl::StrCat("offset ", wire.offset(), " not aligned for ", DTypeName(*dtype)));
  }
  return TensorView(payload.data() + wire.offset(), std::move(shape), *dtype, bytes);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Batch::Impl>> MakeBatchImpl(const v1::BatchHandle& handle,
                                                           const StreamOptions& options,
                                                           uint32_t slot_count,
                                                           std::span<const uint8_t> payload) {
  if (handle.slot() >= slot_count) {
    return Bad("slot", absl::StrCat(handle.slot(), " >= slot_count ", slot_count));
  }
  const uint64_t n = handle.sample_count();
  if (n == 0 || n > options.batch_size) {
    return Bad("sample_count", absl::StrCat(n, " not in 1..", options.batch_size));
  }
  if (handle.relative_paths_size() != 0 &&
      static_cast<uint64_t>(handle.relative_paths_size()) != n) {
    return Bad("relative_paths",
               absl::StrCat(handle.relative_paths_size(), " paths for ", n, " samples"));
  }
  const uint64_t s = options.image_size;
  const std::vector<uint64_t> image_shape = options.layout == Layout::kNCHW
                                                ? std::vector<uint64_t>{n, 3, s, s}
                                                : std::vector<uint64_t>{n, s, s, 3};
  auto impl = std::make_unique<Batch::Impl>();
  auto images = MakeView("images", handle.images(), options.dtype, image_shape, payload);
  if (!images.ok()) return images.status();
  auto labels = MakeView("labels", handle.labels(), DType::kInt64, {n}, payload);
  if (!labels.ok()) return labels.status();
  auto indices = MakeView("indices", handle.indices(), DType::kInt64, {n}, payload);
  if (!indices.ok()) return indices.status();
  impl->images = *std::move(images);
  impl->labels = *std::move(labels);
  impl->indices = *std::move(indices);
  impl->size = static_cast<uint32_t>(n);
  impl->sample_image_bytes = impl->images.bytes() / n;
  impl->position = {handle.position().epoch(), handle.position().sequence(),
                    handle.position().cursor()};
  impl->next = {handle.next().epoch(), handle.next().sequence(), handle.next().cursor()};
  impl->last_in_epoch = handle.last_in_epoch();
  impl->incarnation = handle.incarnation();
  impl->used_bytes = std::max({handle.images().offset() + handle.images().bytes(),
                               handle.labels().offset() + handle.labels().bytes(),
                               handle.indices().offset() + handle.indices().bytes()});
  impl->relative_paths.assign(handle.relative_paths().begin(), handle.relative_paths().end());
  return impl;
}

Batch::Batch(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Batch::~Batch() = default;
Batch::Batch(Batch&&) noexcept = default;
Batch& Batch::operator=(Batch&&) noexcept = default;

// A moved-from Batch has no impl_: its accessors answer as an empty batch (no crash).
namespace {
const Batch::Impl& Empty() {
  static const Batch::Impl* empty = new Batch::Impl();
  return *empty;
}
}  // namespace

const Batch::Impl& Batch::impl() const { return impl_ ? *impl_ : Empty(); }

const TensorView& Batch::images() const { return impl().images; }
const TensorView& Batch::labels() const { return impl().labels; }
const TensorView& Batch::indices() const { return impl().indices; }
uint32_t Batch::size() const { return impl().size; }

void Batch::Detach() {
  if (!impl_ || !impl_->held) return;
  absl::StatusOr<bool> copied = impl_->held->CopyOut();
  if (!copied.ok()) {
    throw Error(ErrorCode::kResourceExhausted,
                absl::StrCat("cannot copy the batch out of the ring: ", copied.status().message()));
  }
}
const Position& Batch::position() const { return impl().position; }
const Position& Batch::next() const { return impl().next; }
bool Batch::last_in_epoch() const { return impl().last_in_epoch; }
uint64_t Batch::incarnation() const { return impl().incarnation; }
const uint8_t* Batch::sample_image(uint32_t i) const {
  if (i >= impl().size) return nullptr;
  return impl().images.data<uint8_t>() + i * impl().sample_image_bytes;
}
uint64_t Batch::sample_image_bytes() const { return impl().sample_image_bytes; }
std::string_view Batch::relative_path(uint32_t i) const {
  return i < impl().relative_paths.size() ? std::string_view(impl().relative_paths[i])
                                          : std::string_view();
}

}  // namespace ringloader::client
