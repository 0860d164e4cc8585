// SPDX-License-Identifier: Apache-2.0
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
    case v1::DTYPE_UINT8: return DType::kUint8;
    case v1::DTYPE_FLOAT32: return DType::kFloat32;
    case v1::DTYPE_INT64: return DType::kInt64;
    case v1::DTYPE_INT8: return DType::kInt8;
    case v1::DTYPE_INT16: return DType::kInt16;
    case v1::DTYPE_UINT16: return DType::kUint16;
    case v1::DTYPE_INT32: return DType::kInt32;
    case v1::DTYPE_UINT32: return DType::kUint32;
    case v1::DTYPE_UINT64: return DType::kUint64;
    case v1::DTYPE_FLOAT16: return DType::kFloat16;
    case v1::DTYPE_FLOAT64: return DType::kFloat64;
    case v1::DTYPE_BOOL: return DType::kBool;
    default: return std::nullopt;
  }
}

// Checks one tensor: dtype, shape, bytes = product(shape) x dtype size, and [offset, offset+bytes)
// inside the slot's payload. Builds its view on success.
// `expected_dtype` unset: any known dtype; `expected_shape` empty: any shape whose first
// dimension is `n` (a dataset's extra tensors).
absl::StatusOr<TensorView> MakeView(absl::string_view name, const v1::TensorView& wire,
                                    std::optional<DType> expected_dtype,
                                    const std::vector<uint64_t>& expected_shape, uint64_t n,
                                    std::span<const uint8_t> payload) {
  const std::optional<DType> dtype = FromWire(wire.dtype());
  if (!dtype || (expected_dtype && *dtype != *expected_dtype)) {
    return Bad(name, absl::StrCat("dtype ", static_cast<int>(wire.dtype()), ", expected ",
                                  expected_dtype ? DTypeName(*expected_dtype) : "a known one"));
  }
  if (expected_shape.empty() ? wire.shape_size() < 1
                             : static_cast<size_t>(wire.shape_size()) != expected_shape.size()) {
    return Bad(name,
               absl::StrCat("rank ", wire.shape_size(), ", expected ", expected_shape.size()));
  }
  uint64_t elements = 1;
  std::vector<int64_t> shape;
  for (int i = 0; i < wire.shape_size(); ++i) {
    const uint64_t want = expected_shape.empty() ? (i == 0 ? n : wire.shape(i))
                                                 : expected_shape[i];
    if (wire.shape(i) != want) {
      const uint64_t expected = want;
      return Bad(name, absl::StrCat("shape[", i, "] = ", wire.shape(i), ", expected ", expected));
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
  return TensorView(payload.data() + wire.offset(), std::move(shape), *dtype, bytes,
                    std::string(name));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Batch::Impl>> MakeBatchImpl(const v1::BatchHandle& handle,
                                                           const StreamOptions& options,
                                                           bool decoded_images,
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
  // A daemon without the tensor list (older than 0.11) sends the three fixed tensors only.
  std::vector<v1::TensorView> wire(handle.tensors().begin(), handle.tensors().end());
  if (wire.empty()) {
    const std::pair<const char*, const v1::TensorView*> fixed[] = {
        {"images", &handle.images()}, {"labels", &handle.labels()}, {"indices", &handle.indices()}};
    for (const auto& [name, view] : fixed) {
      wire.push_back(*view);
      wire.back().set_name(name);
    }
  }
  for (const v1::TensorView& t : wire) {
    const std::string& name = t.name();
    if (name.empty() || name.size() > 256) return Bad("tensors", "a tensor without a valid name");
    for (const TensorView& seen : impl->tensors) {
      if (seen.name() == name) return Bad("tensors", absl::StrCat("'", name, "' twice"));
    }
    absl::StatusOr<TensorView> view =
        name == "images" && decoded_images
            ? MakeView(name, t, options.dtype, image_shape, n, payload)
        : name == "labels" || name == "indices" ? MakeView(name, t, DType::kInt64, {n}, n, payload)
                                                : MakeView(name, t, std::nullopt, {}, n, payload);
    if (!view.ok()) return view.status();
    if (name == "images" && decoded_images) impl->images = *view;
    if (name == "labels") impl->labels = *view;
    if (name == "indices") impl->indices = *view;
    impl->used_bytes = std::max(impl->used_bytes, t.offset() + t.bytes());
    impl->tensors.push_back(*std::move(view));
  }
  if (impl->labels.name().empty() || impl->indices.name().empty()) {
    return Bad("tensors", "no labels or indices");
  }
  impl->size = static_cast<uint32_t>(n);
  impl->sample_image_bytes = impl->images.bytes() / n;  // 0 without images
  impl->position = {handle.position().epoch(), handle.position().sequence(),
                    handle.position().cursor()};
  impl->next = {handle.next().epoch(), handle.next().sequence(), handle.next().cursor()};
  impl->last_in_epoch = handle.last_in_epoch();
  impl->incarnation = handle.incarnation();
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
const std::vector<TensorView>& Batch::tensors() const { return impl().tensors; }

const TensorView& Batch::tensor(std::string_view name) const {
  std::string names;
  for (const TensorView& t : impl().tensors) {
    if (t.name() == name) return t;
    absl::StrAppend(&names, names.empty() ? "" : ", ", t.name());
  }
  throw Error(ErrorCode::kNotFound,
              absl::StrCat("the batch has no tensor '", std::string(name), "' (it has: ",
                           names.empty() ? "none" : names, ")"));
}
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
